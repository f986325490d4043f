//! embed, rerank and classify jobs as the pipeline runs them: tokenize,
//! shrink the reservation to the real cost, batch and run, then write the
//! vectors (embed: L2-normalized where the job or the model says), the
//! scores, or each text's labels (the model's activation applied unless
//! the job asks for raw scores, best first, cut at its `top_k`).

use std::time::Instant;

use sluice_schemas::task::classify;
use sluice_schemas::{ErrorCode, Item, Output, Task};

use super::output::{store_embeddings, store_scores};
use super::{EncoderEngine, EncoderInputs, Prepared, l2_normalize};
use crate::error::JobError;
use crate::task::engine::{JobRun, Ran, TaskEngine};

impl TaskEngine for EncoderEngine {
    fn task(&self) -> Task {
        self.inputs.task()
    }

    fn forward(&self) -> &'static str {
        self.forward
    }

    /// Encoder jobs are short: they finish.
    fn cancellable(&self) -> bool {
        false
    }

    fn run<'a>(&'a self, mut run: JobRun<'a>, items: Vec<Item>) -> Ran<'a> {
        Box::pin(async move {
            let job = run.job;
            let started = Instant::now();
            let Prepared {
                items: tokenized,
                mut usage,
            } = self
                .prepare(
                    items,
                    job.parameters.truncate(),
                    job.parameters.embed.prompt_name.as_deref(),
                )
                .await?;
            if !job.output.item_tokens() {
                usage.item_tokens = Vec::new();
            }
            run.tokenized(started, usage.items, usage.tokens);
            let _in_flight = run.in_flight.tokenized(usage.tokens);
            // The real cost is known now: give back the rest of the worst case.
            run.reservation
                .shrink_to(run.cost.actual_bytes(usage.items, usage.tokens));

            // Each item's tokens count to the tenant as its batch finishes.
            let (stats, tenant) = (run.stats, run.tenant);
            let served = |tokens| stats.add_tenant_tokens(tenant, tokens);
            let vectors = self.run(tokenized, run.timings, run.trace, served).await?;
            let started = Instant::now();
            let output = match &self.inputs {
                EncoderInputs::Texts { normalize, .. } => {
                    let vectors = if job.parameters.embed.normalize.unwrap_or(*normalize) {
                        vectors.into_iter().map(l2_normalize).collect()
                    } else {
                        vectors
                    };
                    store_embeddings(run.outputs, run.of, vectors, self.dim, &job.output).await?
                }
                EncoderInputs::Pairs => {
                    let scores = vectors
                        .iter()
                        .map(|v| v.first().copied())
                        .collect::<Option<Vec<f32>>>()
                        .ok_or_else(|| {
                            JobError::new(ErrorCode::Internal, "bug: a pair got no score")
                        })?;
                    store_scores(run.outputs, run.of, scores, &job.output).await?
                }
                EncoderInputs::Labels { labels, activation } => {
                    let parameters = &job.parameters.classify;
                    let classifications = vectors
                        .into_iter()
                        .map(|mut logits| {
                            if !parameters.raw_scores.unwrap_or(false) {
                                activation.apply(&mut logits);
                            }
                            classify::ranked(labels, &logits, parameters.top_k)
                        })
                        .collect();
                    run.outputs
                        .put_lines(
                            run.of,
                            classifications,
                            "a text's labels",
                            Output::classifications,
                            &job.output,
                        )
                        .await?
                }
            };
            run.written(started, &output);
            Ok((output, usage))
        })
    }
}
