//! What leaves the consumer on NATS: each job's result on its reply
//! subject (core NATS, with the trace context) and dead letters on the
//! dead-letter stream (JetStream, awaited until stored).

use async_nats::HeaderMap;
use async_nats::jetstream;
use sluice_schemas::names::headers;
use sluice_schemas::{DeadLetter, ErrorCode, JobResult, Outcome};

use crate::error::JobError;

/// Result, status and dead-letter writes go to NATS; a failure there is
/// retried like storage.
fn queue(what: &str, e: impl std::fmt::Display) -> JobError {
    JobError::new(ErrorCode::StorageUnavailable, format!("{what}: {e}"))
}

pub struct ResultPublisher {
    pub nats: async_nats::Client,
}

impl ResultPublisher {
    /// Publishes the result (core NATS) to `reply_to`, with the trace context.
    pub async fn publish(
        &self,
        reply_to: &str,
        result: &JobResult,
        traceparent: Option<&str>,
    ) -> Result<(), JobError> {
        let mut h = HeaderMap::new();
        if let Some(id) = &result.job_id {
            h.insert(headers::JOB_ID, id.as_str());
        }
        let outcome = match &result.outcome {
            Outcome::Ok { .. } => "ok",
            Outcome::Error { error } => error.code.as_str(),
        };
        h.insert(headers::OUTCOME, outcome);
        if let Some(tp) = traceparent {
            h.insert(headers::TRACEPARENT, tp);
        }
        let payload = serde_json::to_vec(result).map_err(|e| queue("encoding the result", e))?;
        self.nats
            .publish_with_headers(reply_to.to_string(), h, payload.into())
            .await
            .map_err(|e| queue("publishing the result", e))?;
        Ok(())
    }
}

pub struct DeadLetters {
    pub js: jetstream::Context,
    /// The server's max payload: a dead letter must fit in one message.
    pub max_payload: usize,
}

/// Room a dead letter's headers take beside its payload, with margin.
const HEADER_ROOM: usize = 1024;

impl DeadLetters {
    /// Whether `letter`, as it stands, fits in one message: a job near the
    /// server's max payload does not once its payload is base64 (4/3 the
    /// bytes), and is then kept by reference (`payload_object`).
    pub fn fits(&self, letter: &DeadLetter) -> bool {
        serde_json::to_vec(letter).is_ok_and(|bytes| bytes.len() + HEADER_ROOM <= self.max_payload)
    }

    /// Publishes a dead letter and waits for the stream to store it. The
    /// message id (the job message's stream sequence: one message is given
    /// up on once) makes a retry idempotent, a redelivery's included, within
    /// the dead-letter stream's duplicate window.
    pub async fn publish(&self, subject: String, letter: &DeadLetter) -> Result<(), JobError> {
        let mut h = HeaderMap::new();
        h.insert(
            headers::MSG_ID,
            format!("dlq-{}", letter.stream_sequence).as_str(),
        );
        if let Some(id) = &letter.job_id {
            h.insert(headers::JOB_ID, id.as_str());
        }
        let payload =
            serde_json::to_vec(letter).map_err(|e| queue("encoding the dead letter", e))?;
        self.js
            .publish_with_headers(subject, h, payload.into())
            .await
            .map_err(|e| queue("publishing the dead letter", e))?
            .await
            .map_err(|e| queue("storing the dead letter", e))?;
        Ok(())
    }
}
