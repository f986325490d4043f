//! A streaming generate job's text on NATS: each prompt's new text, as the
//! generation thread reports it, becomes one [`StreamChunk`] on the job's
//! stream subject (core NATS, fire and forget: the result, published after,
//! holds the whole text).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use sluice_schemas::{StreamChunk, StreamUsage, VERSION};
use tokio::sync::mpsc;

use super::executor::StreamEvent;
use crate::telemetry::Stats;

/// Where one job's stream goes and what its messages carry.
pub struct JobStream {
    pub nats: async_nats::Client,
    pub subject: String,
    pub job_id: String,
    pub attempt: u32,
    /// The job's queue wait, on each prompt's first message.
    pub queue_ms: Option<f64>,
    pub stats: Arc<Stats>,
}

impl JobStream {
    /// Publishes `events` as they come until the channel closes (every
    /// prompt ended or left), numbering each prompt's messages from 0. A
    /// publish that fails is logged once and the rest still tried: the
    /// stream is a view of the job, its result is the record.
    pub async fn forward(self, mut events: mpsc::UnboundedReceiver<StreamEvent>) {
        let mut next_seq: Vec<u64> = Vec::new();
        let mut warned = false;
        while let Some(event) = events.recv().await {
            let (item, text, logprobs, end) = match event {
                StreamEvent::Text {
                    item,
                    text,
                    logprobs,
                } => (item, text, logprobs, None),
                StreamEvent::Finished {
                    item,
                    text,
                    logprobs,
                    finish_reason,
                    prompt_tokens,
                    completion_tokens,
                } => (
                    item,
                    text,
                    logprobs,
                    Some((
                        finish_reason,
                        StreamUsage {
                            prompt_tokens: prompt_tokens as u64,
                            completion_tokens: completion_tokens as u64,
                        },
                    )),
                ),
            };
            if next_seq.len() <= item {
                next_seq.resize(item + 1, 0);
            }
            let seq = next_seq[item];
            next_seq[item] += 1;
            let chunk = StreamChunk {
                version: VERSION,
                job_id: self.job_id.clone(),
                item: item as u32,
                attempt: self.attempt,
                seq,
                text,
                logprobs,
                queue_ms: if seq == 0 { self.queue_ms } else { None },
                finish_reason: end.map(|(reason, _)| reason),
                usage: end.map(|(_, usage)| usage),
            };
            match self
                .nats
                .publish(self.subject.clone(), chunk.to_bytes().into())
                .await
            {
                Ok(()) => {
                    self.stats.stream_messages.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) if !warned => {
                    warned = true;
                    tracing::warn!(job = %self.job_id, subject = %self.subject, error = %e, "cannot publish a stream message; the result will still hold the whole text");
                }
                Err(_) => {}
            }
        }
    }
}
