//! generate jobs as the pipeline runs them: tokenize and check the
//! prompts, reserve their KV caches (the reservation shrinks from the
//! worst case to them), generate (a job that set `output.stream` publishes
//! its text meanwhile), write.

use std::sync::Arc;
use std::time::Instant;

use opentelemetry::KeyValue;
use sluice_schemas::{Item, Output, Task, Usage};
use tokio::sync::mpsc;

use super::GenerateEngine;
use super::stream::JobStream;
use crate::task::engine::{JobRun, Ran, TaskEngine};

impl TaskEngine for GenerateEngine {
    fn task(&self) -> Task {
        Task::Generate
    }

    fn forward(&self) -> &'static str {
        self.forward
    }

    /// Dropping a generation frees its sequences before the generation
    /// thread's next step.
    fn cancellable(&self) -> bool {
        true
    }

    fn run<'a>(&'a self, mut run: JobRun<'a>, items: Vec<Item>) -> Ran<'a> {
        Box::pin(async move {
            let job = run.job;
            let started = Instant::now();
            let prepared = self.prepare(items, &job.parameters).await?;
            let prompt_tokens: u64 = prepared.iter().map(|(ids, _)| ids.len() as u64).sum();
            let sequence_tokens: u64 = prepared
                .iter()
                .map(|(ids, p)| (ids.len() + p.max_new_tokens) as u64)
                .sum();
            let items = prepared.len() as u64;
            run.tokenized(started, items, prompt_tokens);
            let _in_flight = run.in_flight.tokenized(prompt_tokens);
            run.reservation
                .shrink_to(run.cost.actual_bytes(items, sequence_tokens));

            let started = Instant::now();
            let generations = if job.output.stream() {
                let (events, received) = mpsc::unbounded_channel();
                let stream = JobStream {
                    nats: run.nats.clone(),
                    subject: run.topology.stream_subject_of(&job.id, run.reply_to),
                    job_id: job.id.clone(),
                    attempt: run.of.attempt,
                    queue_ms: run.timings.queue,
                    stats: Arc::clone(run.stats),
                };
                // The stream's last messages go out before the result does.
                let (generated, ()) = tokio::join!(
                    self.generate(prepared, Some(events)),
                    stream.forward(received)
                );
                generated?
            } else {
                self.generate(prepared, None).await?
            };
            run.timings.inference = Some(started.elapsed().as_secs_f64() * 1e3);
            run.trace.stage_with(
                "inference",
                started,
                Instant::now(),
                vec![KeyValue::new("sluice.sequences", items as i64)],
            );
            let usage = Usage {
                items,
                tokens: prompt_tokens,
                truncated_items: 0,
                audio_ms: 0,
                completion_tokens: generations.iter().map(|g| g.completion_tokens).sum(),
                item_tokens: if job.output.item_tokens() {
                    generations.iter().map(|g| g.prompt_tokens).collect()
                } else {
                    Vec::new()
                },
            };
            let started = Instant::now();
            let output = run
                .outputs
                .put_lines(
                    run.of,
                    generations,
                    "a generation",
                    Output::generations,
                    &job.output,
                )
                .await?;
            run.written(started, &output);
            // A job's tokens count to its tenant once it is done.
            run.stats
                .add_tenant_tokens(run.tenant, usage.tokens + usage.completion_tokens);
            Ok((output, usage))
        })
    }
}
