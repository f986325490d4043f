//! transcribe jobs as the pipeline runs them: read each audio input as one
//! item, decode the recordings and shrink the reservation to their real
//! length, transcribe them on the model's thread, write the transcripts.

use std::time::Instant;

use opentelemetry::KeyValue;
use sluice_schemas::{ErrorCode, InputFormat, Item, Output, Task, Usage};

use super::TranscribeEngine;
use crate::error::JobError;
use crate::fetch::{FetchedItems, InputBody};
use crate::task::engine::{JobRun, Ran, TaskEngine};

impl TaskEngine for TranscribeEngine {
    fn task(&self) -> Task {
        Task::Transcribe
    }

    fn forward(&self) -> &'static str {
        "whisper"
    }

    /// A recording takes seconds to minutes: a cancel drops it before its
    /// next window.
    fn cancellable(&self) -> bool {
        true
    }

    /// An audio object is one item, its bytes as they came; inline items are
    /// `{"audio_base64": ...}`.
    fn read_input(
        &self,
        index: usize,
        input: InputBody<'_>,
        out: &mut FetchedItems,
        max_items: u64,
    ) -> Result<(), JobError> {
        match input {
            InputBody::Object(object) if object.format == InputFormat::Audio => {
                out.items.push(Item::Audio(object.bytes));
                crate::fetch::check_count(out, max_items)
            }
            other => crate::fetch::read_input(Task::Transcribe, index, other, out, max_items),
        }
    }

    fn run<'a>(&'a self, run: JobRun<'a>, items: Vec<Item>) -> Ran<'a> {
        Box::pin(async move {
            let job = run.job;
            let options = self.options(&job.parameters.transcribe)?;
            let started = Instant::now();
            let mut recordings = Vec::with_capacity(items.len());
            for (i, item) in items.into_iter().enumerate() {
                let Item::Audio(bytes) = item else {
                    return Err(JobError::new(
                        ErrorCode::Internal,
                        "bug: a transcribe item that is not audio",
                    ));
                };
                recordings.push(self.prepare(i, bytes).await?);
            }
            let seconds: f64 = recordings.iter().map(|r| r.seconds).sum();
            let n = recordings.len() as u64;
            // The real length is known now: give back the rest of the worst case.
            run.reservation
                .shrink_to(run.cost.actual_bytes(n, seconds.ceil() as u64));
            run.timings.tokenize = Some(started.elapsed().as_secs_f64() * 1e3);
            run.trace.stage_with(
                "decode",
                started,
                Instant::now(),
                vec![
                    KeyValue::new("sluice.items", n as i64),
                    KeyValue::new("sluice.audio_seconds", seconds),
                ],
            );

            let started = Instant::now();
            let (transcripts, windows) = self.transcribe(recordings, &options).await?;
            run.timings.inference = Some(started.elapsed().as_secs_f64() * 1e3);
            run.trace.stage_with(
                "inference",
                started,
                Instant::now(),
                vec![
                    KeyValue::new("sluice.recordings", n as i64),
                    KeyValue::new("sluice.windows", windows as i64),
                ],
            );
            run.stats
                .add_tenant_tokens(run.tenant, seconds.ceil() as u64);
            let usage = Usage {
                items: n,
                tokens: 0,
                truncated_items: 0,
                completion_tokens: transcripts
                    .iter()
                    .flat_map(|t| &t.segments)
                    .map(|s| s.tokens.len() as u64)
                    .sum(),
                item_tokens: Vec::new(),
                audio_ms: (seconds * 1000.0).round() as u64,
            };
            let started = Instant::now();
            let output = run
                .outputs
                .put_lines(
                    run.of,
                    transcripts,
                    "a transcript",
                    Output::transcripts,
                    &job.output,
                )
                .await?;
            let mut run = run;
            run.written(started, &output);
            Ok((output, usage))
        })
    }
}
