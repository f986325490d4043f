//! One job from pull to settle: decode, check, mark it running, fetch its
//! inputs, run its items on the task's engine (which writes the output), then
//! settle (answer, ack or retry or dead-letter).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use async_nats::jetstream;
use opentelemetry::KeyValue;
use sluice_schemas::names::headers;
use sluice_schemas::{ErrorCode, JobState, StatusRecord, Timings, ValidJob};
use sluice_status::Start;
use time::OffsetDateTime;
use tokio::sync::watch;

use super::cancel::CancelWatch;
use super::delivery::{
    Delivery, KeepAlive, aborted, header, job_id_of, ms_between, nak_now, route, status,
    status_scope,
};
use super::settle::{Done, Finished, settle};
use crate::budget::Reservation;
use crate::error::JobError;
use crate::output::store::OutputOf;
use crate::shared::{ModelRoute, Shared};
use crate::task::engine::JobRun;
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
            status_scope: status_scope(&shared.topology, &msg.subject),
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
    // A job of a task that runs long watches for a cancel from before it is
    // marked running, so one stored after that is seen.
    let mut cancel = if shared.engine.cancellable() {
        CancelWatch::subscribe(shared, &delivery.statuses(&shared.status), &job.id).await
    } else {
        CancelWatch::none()
    };
    // Mark it running unless it is already final: a compare-and-swap, so a
    // stale redelivery can never turn a finished job back into a running one.
    let running = StatusRecord {
        deadline: job.deadline,
        ..status(&job.id, JobState::Running, delivery)
    };
    match delivery.statuses(&shared.status).start(&running).await {
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
        .read(&job.inputs, |i, input, out| {
            shared
                .engine
                .read_input(i, input, out, limits.max_items_per_job)
        })
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

    let nats = shared.js.client();
    let run = JobRun {
        job: &job,
        of: OutputOf {
            job_id: &job.id,
            stream_sequence: delivery.stream_sequence,
            attempt: delivery.attempt,
        },
        tenant: &delivery.tenant,
        reservation,
        timings,
        trace,
        cost: &shared.cost,
        outputs: &shared.outputs,
        in_flight: &shared.in_flight,
        stats: &shared.stats,
        nats: &nats,
        reply_to: delivery.reply_to.as_deref(),
        topology: &shared.topology,
    };
    let ran = shared.engine.run(run, fetched.items);
    let (output, usage) = tokio::select! {
        biased;
        () = cancel.cancelled() => {
            // Dropping the run frees what the job holds (the task's
            // `cancellable` promises it); nothing is written.
            return Err(JobError::new(
                ErrorCode::Cancelled,
                "the job was cancelled while it ran; its generation stopped",
            ));
        }
        ran = ran => ran?,
    };
    Ok(Finished::Done(Box::new(Done { output, usage })))
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
