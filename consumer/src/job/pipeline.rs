//! One job from pull to settle: decode, check, mark it running, fetch its
//! inputs, prepare and run its items on the engine, write the output, then
//! settle (answer, ack or retry or dead-letter).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use async_nats::jetstream;
use opentelemetry::KeyValue;
use sluice_schemas::names::headers;
use sluice_schemas::{ErrorCode, Item, JobState, Output, StatusRecord, Timings, Usage, ValidJob};
use sluice_status::Start;
use time::OffsetDateTime;
use tokio::sync::{mpsc, watch};

use super::cancel::CancelWatch;
use super::delivery::{
    Delivery, KeepAlive, aborted, header, job_id_of, ms_between, nak_now, route, status,
};
use super::settle::{Done, Finished, settle};
use crate::budget::Reservation;
use crate::engine::Engine;
use crate::engine::encoder::{EncoderEngine, EncoderInputs, Prepared, l2_normalize};
use crate::engine::generate::GenerateEngine;
use crate::error::JobError;
use crate::output::JobStream;
use crate::output::store::OutputOf;
use crate::shared::{ModelRoute, Shared};
use crate::telemetry::JobTrace;

/// Handles one delivered job message; `reservation` is the budget it was
/// admitted under (from `asked_at` on) and is released when this returns.
/// When `abort` turns true (the drain deadline passed) the job stops where it
/// is and is Nak'ed. Returns the tokens the job used (0 unless it ran), which
/// admission charges to its priority level.
pub async fn handle(
    shared: Arc<Shared>,
    msg: jetstream::Message,
    mut reservation: Reservation,
    asked_at: Instant,
    mut abort: watch::Receiver<bool>,
) -> u64 {
    let pulled_at = Instant::now();
    let (priority, tenant) = route(
        &shared.topology,
        &msg.subject,
        header(&msg, headers::TENANT),
    );
    let mut delivery = match msg.info() {
        Ok(info) => Delivery {
            attempt: u32::try_from(info.delivered).unwrap_or(u32::MAX),
            stream_sequence: info.stream_sequence,
            published: info.published,
            subject: msg.subject.to_string(),
            traceparent: header(&msg, headers::TRACEPARENT),
            reply_to: header(&msg, headers::REPLY_TO),
            job_id: None,
            task: None,
            replays: 0,
            trace_id: "-".into(),
            priority,
            tenant,
        },
        Err(e) => {
            tracing::error!(error = %e, subject = %msg.subject, "bug: a pulled message has no JetStream metadata; leaving it to redelivery");
            return 0;
        }
    };
    let trace = shared
        .tracing
        .job(delivery.traceparent.as_deref(), asked_at);
    if let Some(id) = trace.trace_id() {
        delivery.trace_id = id;
    }
    trace.stage_with(
        "admission",
        asked_at,
        pulled_at,
        vec![KeyValue::new(
            "sluice.reserved_bytes",
            reservation.bytes() as i64,
        )],
    );
    if delivery.attempt > 1 {
        shared.stats.redeliveries.fetch_add(1, Ordering::Relaxed);
    }
    let keepalive = KeepAlive::start(&shared.js, &msg, shared.progress_interval);
    let mut timings = Timings {
        queue: Some(ms_between(delivery.published, OffsetDateTime::now_utc())),
        ..Timings::default()
    };
    let outcome = tokio::select! {
        outcome = process(&shared, &msg, &mut delivery, &mut reservation, &mut timings, &trace) => outcome,
        () = aborted(&mut abort) => {
            tracing::info!(job = delivery.job_id.as_deref().unwrap_or("?"), trace_id = %delivery.trace_id, "drain deadline: Nak'ing the job for redelivery");
            nak_now(&msg).await;
            trace.end("requeued", None);
            return 0;
        }
    };
    keepalive.stop().await;
    timings.total = Some(pulled_at.elapsed().as_secs_f64() * 1e3);
    trace.set_attributes(vec![
        KeyValue::new("messaging.system", "nats"),
        KeyValue::new("messaging.destination.name", delivery.subject.clone()),
        KeyValue::new("sluice.job.id", delivery.job_id.clone().unwrap_or_default()),
        KeyValue::new("sluice.attempt", i64::from(delivery.attempt)),
        KeyValue::new("sluice.stream_sequence", delivery.stream_sequence as i64),
    ]);
    let tokens = match &outcome {
        Ok(Finished::Done(done)) => done.usage.tokens + done.usage.completion_tokens,
        _ => 0,
    };
    shared
        .stats
        .record_queue_wait(delivery.priority, timings.queue.unwrap_or(0.0) / 1e3);
    if let Engine::Generate(_) = &shared.engine {
        // (embed counts its tokens item by item as the batches finish)
        shared.stats.add_tenant_tokens(&delivery.tenant, tokens);
    }
    settle(&shared, msg, delivery, outcome, timings, trace).await;
    tokens
}

async fn process(
    shared: &Shared,
    msg: &jetstream::Message,
    delivery: &mut Delivery,
    reservation: &mut Reservation,
    timings: &mut Timings,
    trace: &JobTrace,
) -> Result<Finished, JobError> {
    let limits = &shared.limits;
    // A message that is too large or fails to decode is still answered
    // under an id when the body or its Nats-Msg-Id holds one. Read only on
    // those paths: a valid job's id comes from its decode (one JSON parse).
    let bad_message_id = || job_id_of(&msg.payload, header(msg, headers::MSG_ID).as_deref());
    if msg.payload.len() as u64 > limits.max_input_bytes {
        delivery.job_id = bad_message_id();
        return Err(JobError::new(
            ErrorCode::InputTooLarge,
            format!(
                "the job message is {} bytes; this consumer accepts at most {} (max_input_bytes): put large inputs behind a URL",
                msg.payload.len(),
                limits.max_input_bytes
            ),
        ));
    }
    let ValidJob { task, job } = match sluice_schemas::Job::decode(&msg.payload) {
        Ok(valid) => valid,
        Err(e) => {
            delivery.job_id = bad_message_id();
            return Err(e.into());
        }
    };
    delivery.job_id = Some(job.id.clone());
    delivery.task = Some(task);
    let serves = shared.engine.task();
    if task != serves {
        return Err(JobError::new(
            ErrorCode::UnknownTask,
            format!(
                "this consumer serves the {} task, not {task}: publish {task} jobs to {}, where {task} consumers take them",
                serves,
                shared.topology.job_subject(task.as_str())
            ),
        ));
    }
    if job.model != shared.model_name {
        return Err(wrong_model(&job.model, shared, &delivery.subject));
    }
    if let Some(deadline) = job.deadline {
        let now = OffsetDateTime::now_utc();
        if deadline <= now {
            return Err(JobError::new(
                ErrorCode::DeadlineExceeded,
                format!(
                    "the job's deadline passed {:.1} s before it could run",
                    (now - deadline).as_seconds_f64()
                ),
            ));
        }
    }
    // A generate job watches for a cancel from before it is marked running,
    // so one stored after that is seen (embed jobs are short: they finish).
    let mut cancel = match &shared.engine {
        Engine::Generate(_) => CancelWatch::subscribe(shared, &job.id).await,
        Engine::Encoder(_) => CancelWatch::none(),
    };
    // Mark it running unless it is already final: a compare-and-swap, so a
    // stale redelivery can never turn a finished job back into a running one.
    let running = StatusRecord {
        deadline: job.deadline,
        ..status(&job.id, JobState::Running, delivery)
    };
    match shared.status.start(&running).await {
        Ok(Start::Final(record)) if record.state == JobState::Cancelled => {
            return Err(JobError::new(
                ErrorCode::Cancelled,
                "the job was cancelled before it ran",
            ));
        }
        Ok(Start::Final(record)) => return Ok(Finished::AlreadyFinal(record.state)),
        Ok(Start::Running(written)) => delivery.replays = written.replays,
        Err(e) => {
            let e = JobError::from(e);
            tracing::warn!(job = %job.id, error = %e, "cannot record the running state");
        }
    }

    let started = Instant::now();
    let fetched = shared
        .fetcher
        .items(task, &job.inputs, limits.max_items_per_job)
        .await?;
    timings.fetch = Some(started.elapsed().as_secs_f64() * 1e3);
    trace.stage_with(
        "fetch",
        started,
        Instant::now(),
        vec![KeyValue::new("sluice.inputs", job.inputs.len() as i64)],
    );
    if fetched.items.is_empty() {
        return Err(JobError::new(
            ErrorCode::InputInvalid,
            "the job's inputs hold no items",
        ));
    }

    let (output, usage) = match &shared.engine {
        Engine::Encoder(engine) => {
            run_encoder(
                shared,
                engine,
                &job,
                fetched.items,
                reservation,
                timings,
                trace,
                delivery,
            )
            .await?
        }
        Engine::Generate(engine) => {
            let generate = run_generate(
                shared,
                engine,
                &job,
                fetched.items,
                reservation,
                timings,
                trace,
                delivery,
            );
            tokio::select! {
                biased;
                () = cancel.cancelled() => {
                    // Dropping the generation frees its sequences before the
                    // generation thread's next step; nothing is written.
                    return Err(JobError::new(
                        ErrorCode::Cancelled,
                        "the job was cancelled while it ran; its generation stopped",
                    ));
                }
                generated = generate => generated?,
            }
        }
    };
    Ok(Finished::Done(Box::new(Done { output, usage })))
}

/// embed or rerank: tokenize, batch, gather vectors (rerank: scores),
/// write the output.
#[allow(clippy::too_many_arguments)]
async fn run_encoder(
    shared: &Shared,
    engine: &EncoderEngine,
    job: &sluice_schemas::Job,
    items: Vec<Item>,
    reservation: &mut Reservation,
    timings: &mut Timings,
    trace: &JobTrace,
    delivery: &Delivery,
) -> Result<(Output, Usage), JobError> {
    let of = output_of(job, delivery);
    let started = Instant::now();
    let Prepared {
        items: tokenized,
        mut usage,
    } = engine
        .prepare(
            items,
            job.parameters.truncate(),
            job.parameters.prompt_name.as_deref(),
        )
        .await?;
    if !job.output.item_tokens() {
        usage.item_tokens = Vec::new();
    }
    timings.tokenize = Some(started.elapsed().as_secs_f64() * 1e3);
    trace.stage_with(
        "tokenize",
        started,
        Instant::now(),
        vec![
            KeyValue::new("sluice.items", usage.items as i64),
            KeyValue::new("sluice.tokens", usage.tokens as i64),
        ],
    );
    let _in_flight = shared.in_flight.tokenized(usage.tokens);
    // The real cost is known now: give back the rest of the worst case.
    reservation.shrink_to(shared.cost.actual_bytes(usage.items, usage.tokens));

    let served = |tokens| shared.stats.add_tenant_tokens(&delivery.tenant, tokens);
    let vectors = engine.run(tokenized, timings, trace, served).await?;
    let started = Instant::now();
    let output = match engine.inputs {
        EncoderInputs::Texts { normalize, .. } => {
            let vectors = if job.parameters.normalize.unwrap_or(normalize) {
                vectors.into_iter().map(l2_normalize).collect()
            } else {
                vectors
            };
            shared
                .outputs
                .store_embeddings(of, vectors, engine.dim, &job.output)
                .await?
        }
        EncoderInputs::Pairs => {
            let scores = vectors
                .iter()
                .map(|v| v.first().copied())
                .collect::<Option<Vec<f32>>>()
                .ok_or_else(|| JobError::new(ErrorCode::Internal, "bug: a pair got no score"))?;
            shared.outputs.store_scores(of, scores, &job.output).await?
        }
    };
    record_write(timings, trace, started, &output);
    Ok((output, usage))
}

/// generate: tokenize and check the prompts, reserve their KV caches (the
/// reservation shrinks from the worst case to them), generate (a job that
/// set `output.stream` publishes its text meanwhile), write.
#[allow(clippy::too_many_arguments)]
async fn run_generate(
    shared: &Shared,
    engine: &GenerateEngine,
    job: &sluice_schemas::Job,
    items: Vec<Item>,
    reservation: &mut Reservation,
    timings: &mut Timings,
    trace: &JobTrace,
    delivery: &Delivery,
) -> Result<(Output, Usage), JobError> {
    let of = output_of(job, delivery);
    let started = Instant::now();
    let prepared = engine.prepare(items, &job.parameters).await?;
    timings.tokenize = Some(started.elapsed().as_secs_f64() * 1e3);
    let prompt_tokens: u64 = prepared.iter().map(|(ids, _)| ids.len() as u64).sum();
    let sequence_tokens: u64 = prepared
        .iter()
        .map(|(ids, p)| (ids.len() + p.max_new_tokens) as u64)
        .sum();
    let items = prepared.len() as u64;
    trace.stage_with(
        "tokenize",
        started,
        Instant::now(),
        vec![
            KeyValue::new("sluice.items", items as i64),
            KeyValue::new("sluice.tokens", prompt_tokens as i64),
        ],
    );
    let _in_flight = shared.in_flight.tokenized(prompt_tokens);
    reservation.shrink_to(shared.cost.actual_bytes(items, sequence_tokens));

    let started = Instant::now();
    let generations = if job.output.stream() {
        let (events, received) = mpsc::unbounded_channel();
        let stream = JobStream {
            nats: shared.js.client(),
            subject: shared.topology.stream_subject(&job.id),
            job_id: job.id.clone(),
            attempt: delivery.attempt,
            queue_ms: timings.queue,
            stats: Arc::clone(&shared.stats),
        };
        // The stream's last messages go out before the result does.
        let (generated, ()) = tokio::join!(
            engine.generate(prepared, Some(events)),
            stream.forward(received)
        );
        generated?
    } else {
        engine.generate(prepared, None).await?
    };
    timings.inference = Some(started.elapsed().as_secs_f64() * 1e3);
    trace.stage_with(
        "inference",
        started,
        Instant::now(),
        vec![KeyValue::new("sluice.sequences", items as i64)],
    );
    let usage = Usage {
        items,
        tokens: prompt_tokens,
        truncated_items: 0,
        completion_tokens: generations.iter().map(|g| g.completion_tokens).sum(),
        item_tokens: if job.output.item_tokens() {
            generations.iter().map(|g| g.prompt_tokens).collect()
        } else {
            Vec::new()
        },
    };
    let started = Instant::now();
    let output = shared
        .outputs
        .store_generations(of, generations, &job.output)
        .await?;
    record_write(timings, trace, started, &output);
    Ok((output, usage))
}

/// The delivery this output belongs to (it names the object).
fn output_of<'a>(job: &'a sluice_schemas::Job, delivery: &Delivery) -> OutputOf<'a> {
    OutputOf {
        job_id: &job.id,
        stream_sequence: delivery.stream_sequence,
        attempt: delivery.attempt,
    }
}

fn record_write(timings: &mut Timings, trace: &JobTrace, started: Instant, output: &Output) {
    timings.write = Some(started.elapsed().as_secs_f64() * 1e3);
    trace.stage_with(
        "write",
        started,
        Instant::now(),
        vec![KeyValue::new(
            "sluice.output",
            match output {
                Output::S3(_) => "s3",
                Output::Inline { .. } => "inline",
            },
        )],
    );
}

/// A job that names another model than the one its subject carries: on a
/// routed task, the body and the subject disagree (a publisher's bug, the
/// schema's class of error); on an unrouted one, the model is not this
/// deployment's.
fn wrong_model(model: &str, shared: &Shared, subject: &str) -> JobError {
    match shared.model_route {
        ModelRoute::Unrouted => JobError::new(
            ErrorCode::UnknownModel,
            format!(
                "unknown model {model:?}; this consumer serves {:?}",
                shared.model_name
            ),
        ),
        ModelRoute::Default | ModelRoute::Own(_) => JobError::new(
            ErrorCode::SchemaViolation,
            format!(
                "the job names model {model:?}, but {subject} carries the jobs of {:?}: a job's `model` must be its subject's (publish it through the sluice library or CLI, which route by model)",
                shared.model_name
            ),
        ),
    }
}
