//! Settling a delivery: the ack decision of [`super::disposition`],
//! applied. Every way out of a job ends here, once.

use std::time::{Duration, Instant};

use async_nats::jetstream::{self, AckKind};
use sluice_schemas::{ErrorCode, JobResult, JobState, Outcome, Output, Timings, Usage, VERSION};
use time::OffsetDateTime;

use super::dead_letter::{Original, give_up};
use super::delivery::{Delivery, nak, status};
use super::disposition::{Backoff, Disposition, Ended, decide};
use crate::error::JobError;
use crate::shared::Shared;
use crate::telemetry::JobTrace;

/// What a successful job produced.
pub struct Done {
    pub output: Output,
    pub usage: Usage,
}

/// How processing ended when it did not fail.
pub enum Finished {
    Done(Box<Done>),
    /// A redelivery (or a re-submit) of a job whose status is already final:
    /// it was answered before; only the ack was lost.
    AlreadyFinal(JobState),
}

/// Applies the ack decision ([`decide`]): success is answered and
/// double-acked; a retryable failure with attempts left is Nak'ed with a
/// backoff; anything else is answered, dead-lettered and Term'ed. A step that
/// cannot complete (NATS or storage down) leaves the message to be
/// redelivered: nothing is lost.
pub async fn settle(
    shared: &Shared,
    msg: jetstream::Message,
    d: Delivery,
    outcome: Result<Finished, JobError>,
    timings: Timings,
    trace: JobTrace,
) {
    let finished_at = OffsetDateTime::now_utc();
    shared.stats.record_timings(&timings);
    let ended = match &outcome {
        Ok(Finished::Done(_)) => Ended::Done,
        Ok(Finished::AlreadyFinal(_)) => Ended::AlreadyAnswered,
        Err(error) => Ended::Failed(error),
    };
    let disposition = decide(
        ended,
        d.attempt,
        shared.max_deliver,
        &backoff(shared),
        jitter_seed(&d),
    );
    match (disposition, outcome) {
        (Disposition::AckDuplicate, Ok(Finished::AlreadyFinal(state))) => {
            trace.end("already_answered", None);
            tracing::info!(
                job = d.job_id.as_deref().unwrap_or("?"),
                trace_id = %d.trace_id,
                ?state,
                attempt = d.attempt,
                "job already answered; acking the redelivery"
            );
            shared
                .stats
                .jobs_already_final
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            if let Err(e) = msg.double_ack().await {
                tracing::warn!(error = %e, "double ack failed");
            }
        }
        (Disposition::AnswerThenAck, Ok(Finished::Done(done))) => {
            let Some(job_id) = d.job_id.clone() else {
                tracing::error!("bug: a finished job has no id");
                return;
            };
            let result = JobResult {
                version: VERSION,
                job_id: Some(job_id.clone()),
                outcome: Outcome::Ok {
                    output: done.output.clone(),
                },
                usage: done.usage.clone(),
                timings_ms: timings.clone(),
                attempt: d.attempt,
                served_by: Some(shared.served_by()),
                finished_at,
            };
            let mut record = status(&job_id, JobState::Done, &d);
            if let Output::S3(s3) = &done.output {
                record.output = Some(s3.clone());
            }
            record.usage = Some(done.usage.clone());
            let reply_to = d
                .reply_to
                .clone()
                .unwrap_or_else(|| shared.topology.result_subject(&job_id));
            // Status first: it is durable (a JetStream write), and a redelivery
            // that finds it final only acks, so a result is never published twice.
            let publish_started = Instant::now();
            match d.statuses(&shared.status).finish(&record).await {
                // The outcome is durable: count it before anyone can read the
                // result, so a client that has its answer sees it in /metrics.
                Ok(true) => shared
                    .stats
                    .record_job_ok(done.usage.items, done.usage.tokens),
                Ok(false) => {
                    // A cancel that landed while the job ran: the job is
                    // answered as cancelled (by one delivery: give_up claims
                    // the answer); its output is not delivered. Otherwise
                    // another delivery finished it and answered.
                    let now = d.statuses(&shared.status).get(&job_id).await;
                    // This delivery's object is not the answered one: it
                    // goes (the record names another delivery's, or none).
                    if let Output::S3(ours) = &done.output {
                        let named = match &now {
                            Ok(Some(r)) => r.output.as_ref().is_some_and(|o| o.key == ours.key),
                            // Unknown: leave it rather than risk the answer's.
                            _ => true,
                        };
                        if !named {
                            shared.outputs.discard(&ours.key).await;
                        }
                    }
                    match now {
                        Ok(Some(r)) if r.state == JobState::Cancelled => {
                            let error = JobError::new(
                                ErrorCode::Cancelled,
                                "the job was cancelled while it ran; its output was discarded",
                            );
                            let original = Original {
                                headers: msg.headers.as_ref(),
                                payload: &msg.payload,
                            };
                            if let Err(e) =
                                give_up(shared, &d, original, &error, false, timings, finished_at)
                                    .await
                            {
                                tracing::warn!(job = %job_id, error = %e, "cannot answer a job cancelled while it ran; it will be redelivered");
                                nak(&msg, retry_delay(shared, &d)).await;
                                trace.end("retry", Some(e.code.as_str()));
                                return;
                            }
                            trace.end("cancelled", Some(ErrorCode::Cancelled.as_str()));
                        }
                        _ => {
                            tracing::info!(job = %job_id, trace_id = %d.trace_id, attempt = d.attempt, "another delivery finished the job first; not answering twice");
                            shared
                                .stats
                                .jobs_already_final
                                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            trace.end("already_answered", None);
                        }
                    }
                    if let Err(e) = msg.double_ack().await {
                        tracing::warn!(error = %e, "double ack failed");
                    }
                    return;
                }
                Err(e) => {
                    let e = JobError::from(e);
                    tracing::warn!(job = %job_id, trace_id = %d.trace_id, error = %e, "cannot record a finished job; it will be redelivered");
                    nak(&msg, retry_delay(shared, &d)).await;
                    trace.end("retry", Some(ErrorCode::StorageUnavailable.as_str()));
                    return;
                }
            }
            if let Err(e) = shared
                .results
                .publish(&reply_to, &result, d.traceparent.as_deref())
                .await
            {
                tracing::warn!(job = %job_id, error = %e, "cannot publish the result; the status record holds the outcome");
            }
            if let Err(e) = msg.double_ack().await {
                tracing::warn!(job = %job_id, error = %e, "double ack failed; a redelivery will find the job done");
            }
            trace.stage("publish", publish_started, Instant::now());
            trace.end("ok", None);
            tracing::info!(
                job = %job_id,
                trace_id = %d.trace_id,
                outcome = "ok",
                attempt = d.attempt,
                items = done.usage.items,
                tokens = done.usage.tokens,
                queue_ms = timings.queue.unwrap_or(0.0),
                fetch_ms = timings.fetch.unwrap_or(0.0),
                batch_wait_ms = timings.batch_wait.unwrap_or(0.0),
                inference_ms = timings.inference.unwrap_or(0.0),
                write_ms = timings.write.unwrap_or(0.0),
                total_ms = timings.total.unwrap_or(0.0),
                "job done"
            );
        }
        (Disposition::Nak(delay), Err(error)) => {
            trace.end("retry", Some(error.code.as_str()));
            tracing::warn!(
                job = d.job_id.as_deref().unwrap_or("?"),
                trace_id = %d.trace_id,
                code = %error.code,
                attempt = d.attempt,
                retry_in_ms = delay.as_millis() as u64,
                error = %error.message,
                "job failed; will retry"
            );
            shared.stats.record_job_retried(error.code);
            // Waiting for its redelivery, it is queued again: if its deadline
            // passes first, the stream drops it and it reads `expired`
            // (a `running` record would say so forever).
            if let Some(job_id) = &d.job_id
                && let Err(e) = d
                    .statuses(&shared.status)
                    .requeue(job_id, d.stream_sequence, d.attempt)
                    .await
            {
                tracing::warn!(job = %job_id, error = %e, "cannot record the job as queued again; it reads running until its redelivery");
            }
            nak(&msg, delay).await;
        }
        (
            disposition @ (Disposition::DeadLetterThenTerm | Disposition::AnswerThenTerm),
            Err(error),
        ) => {
            let code = error.code.as_str();
            let dead_letter = disposition == Disposition::DeadLetterThenTerm;
            fail(shared, msg, d, error, dead_letter, timings, finished_at).await;
            trace.end("failed", Some(code));
        }
        (disposition, outcome) => {
            // decide() maps each outcome kind to its own dispositions only.
            tracing::error!(
                ?disposition,
                ok = outcome.is_ok(),
                "bug: a disposition that does not fit the outcome; leaving the job to redelivery"
            );
            trace.end("retry", None);
        }
    }
}

/// A final failure: dead letter, error result, status, then Term.
async fn fail(
    shared: &Shared,
    msg: jetstream::Message,
    d: Delivery,
    error: JobError,
    dead_letter: bool,
    timings: Timings,
    finished_at: OffsetDateTime,
) {
    if let Err(e) = give_up(
        shared,
        &d,
        Original {
            headers: msg.headers.as_ref(),
            payload: &msg.payload,
        },
        &error,
        dead_letter,
        timings,
        finished_at,
    )
    .await
    {
        tracing::warn!(error = %e, seq = d.stream_sequence, "cannot dead-letter the job or record its failure; it will be redelivered");
        nak(&msg, retry_delay(shared, &d)).await;
        return;
    }
    if let Err(e) = msg.ack_with(AckKind::Term).await {
        tracing::warn!(error = %e, "term failed; a redelivery will be dead-lettered again under the same id");
    }
}

fn backoff(shared: &Shared) -> Backoff {
    Backoff {
        base: shared.retry_base,
        max: shared.retry_max,
    }
}

/// Bits that differ per message and attempt, for the backoff's jitter.
fn jitter_seed(d: &Delivery) -> u64 {
    d.stream_sequence
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add(u64::from(d.attempt).wrapping_mul(0xBF58_476D_1CE4_E5B9))
        ^ u64::from(OffsetDateTime::now_utc().nanosecond())
}

/// The delay before the next delivery, when a step of answering failed.
fn retry_delay(shared: &Shared, d: &Delivery) -> Duration {
    backoff(shared).delay(d.attempt, jitter_seed(d))
}
