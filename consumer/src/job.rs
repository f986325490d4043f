//! One job from pull to ack: decode, fetch, tokenize, hand items to the
//! batcher, gather vectors, write the output, answer, ack. Every way out goes
//! through [`settle`], the one place that turns an outcome into an ack decision.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, AckKind};
use base64::Engine as _;
use sluice_schemas::names::headers;
use sluice_schemas::{
    DeadLetter, ErrorCode, Item, JobResult, JobState, Outcome, Output, StatusRecord, Task, Timings,
    Usage, VERSION, ValidJob,
};
use time::OffsetDateTime;
use tokio::sync::{mpsc, watch};

use crate::batcher::{BatchItem, ItemOutcome};
use crate::budget::Reservation;
use crate::error::JobError;
use crate::generate::GenerateEngine;
use crate::model::{TokenizeError, TokenizedItem};
use crate::service::{EmbedEngine, Engine, Shared};
use crate::telemetry::TokensInFlight;
use crate::trace::JobTrace;
use opentelemetry::KeyValue;
use std::sync::atomic::Ordering;

/// What a successful job produced.
struct Done {
    output: Output,
    usage: Usage,
}

/// How processing ended when it did not fail.
enum Finished {
    Done(Done),
    /// A redelivery (or a re-submit) of a job whose status is already final:
    /// it was answered before; only the ack was lost.
    AlreadyFinal(JobState),
}

/// What we know of a delivery before and after decoding it.
struct Delivery {
    attempt: u32,
    stream_sequence: u64,
    published: OffsetDateTime,
    subject: String,
    traceparent: Option<String>,
    reply_to: Option<String>,
    job_id: Option<String>,
    task: Option<Task>,
    /// Replays recorded in the job's status, carried into every status write.
    replays: u32,
    /// The job's trace id, for log lines ("-" when tracing is off).
    trace_id: String,
}

/// Handles one delivered job message; `reservation` is the budget it was
/// admitted under (from `asked_at` on) and is released when this returns.
/// When `abort` turns true (the drain deadline passed) the job stops where it
/// is and is Nak'ed.
pub async fn handle(
    shared: Arc<Shared>,
    msg: jetstream::Message,
    mut reservation: Reservation,
    asked_at: Instant,
    mut abort: watch::Receiver<bool>,
) {
    let pulled_at = Instant::now();
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
        },
        Err(e) => {
            tracing::error!(error = %e, subject = %msg.subject, "bug: a pulled message has no JetStream metadata; leaving it to redelivery");
            return;
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
    let keepalive = KeepAlive::start(&shared, &msg);
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
            return;
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
    settle(&shared, msg, delivery, outcome, timings, trace).await;
}

/// The `id` of a job message that may be invalid otherwise, if it is a valid id.
fn peek_job_id(payload: &[u8]) -> Option<String> {
    let value: serde_json::Value = serde_json::from_slice(payload).ok()?;
    let id = value.get("id")?.as_str()?;
    sluice_schemas::names::is_valid_job_id(id).then(|| id.to_string())
}

/// Resolves once `abort` turns true; never if its sender goes away.
async fn aborted(abort: &mut watch::Receiver<bool>) {
    loop {
        if *abort.borrow_and_update() {
            return;
        }
        if abort.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

fn header(msg: &jetstream::Message, name: &str) -> Option<String> {
    msg.headers
        .as_ref()
        .and_then(|h| h.get(name))
        .map(|v| v.as_str().to_string())
}

fn ms_between(a: OffsetDateTime, b: OffsetDateTime) -> f64 {
    ((b - a).as_seconds_f64() * 1e3).max(0.0)
}

/// Sends progress acks while the job waits or runs, so its ack deadline does
/// not pass; stops when dropped.
struct KeepAlive(Option<tokio::task::JoinHandle<()>>);

impl KeepAlive {
    fn start(shared: &Shared, msg: &jetstream::Message) -> KeepAlive {
        let acker = jetstream::message::Acker::new(shared.js.clone(), msg.reply.clone());
        let every = shared.progress_interval;
        KeepAlive(Some(tokio::spawn(async move {
            let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
            loop {
                tick.tick().await;
                if let Err(e) = acker.ack_with(AckKind::Progress).await {
                    tracing::debug!(error = %e, "progress ack failed");
                }
            }
        })))
    }
}

impl KeepAlive {
    /// Stops it and waits until it has stopped, so that no progress ack of
    /// this delivery can follow the ack decision.
    async fn stop(mut self) {
        if let Some(task) = self.0.take() {
            task.abort();
            let _ = task.await;
        }
    }
}

impl Drop for KeepAlive {
    fn drop(&mut self) {
        if let Some(task) = self.0.take() {
            task.abort();
        }
    }
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
    if msg.payload.len() as u64 > limits.max_input_bytes {
        return Err(JobError::new(
            ErrorCode::InputTooLarge,
            format!(
                "the job message is {} bytes; this consumer accepts at most {} (max_input_bytes): put large inputs behind a URL",
                msg.payload.len(),
                limits.max_input_bytes
            ),
        ));
    }
    // Even a job that fails to decode is answered on its id if one can be read.
    delivery.job_id = peek_job_id(&msg.payload);
    let ValidJob { task, job } = sluice_schemas::Job::decode(&msg.payload)?;
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
        return Err(JobError::new(
            ErrorCode::UnknownModel,
            format!(
                "unknown model {:?}; this consumer serves {:?}",
                job.model, shared.model_name
            ),
        ));
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
    // Mark it running unless it is already final: a compare-and-swap, so a
    // stale redelivery can never turn a finished job back into a running one.
    let running = status(&job.id, JobState::Running, delivery);
    let began = shared
        .sink
        .swap_status(&job.id, |current| match current {
            Some(r) if r.state.is_final() => None,
            Some(r) => Some(StatusRecord {
                replays: r.replays,
                ..running.clone()
            }),
            None => Some(running.clone()),
        })
        .await;
    match began {
        Ok((None, Some(record))) if record.state == JobState::Cancelled => {
            return Err(JobError::new(
                ErrorCode::Cancelled,
                "the job was cancelled before it ran",
            ));
        }
        Ok((None, Some(record))) => return Ok(Finished::AlreadyFinal(record.state)),
        Ok((Some(written), _)) => delivery.replays = written.replays,
        Ok((None, None)) => {}
        Err(e) => {
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
        Engine::Embed(engine) => {
            run_embed(
                shared,
                engine,
                &job,
                fetched.items,
                reservation,
                timings,
                trace,
            )
            .await?
        }
        Engine::Generate(engine) => {
            run_generate(
                shared,
                engine,
                &job,
                fetched.items,
                reservation,
                timings,
                trace,
            )
            .await?
        }
    };
    Ok(Finished::Done(Done { output, usage }))
}

/// embed: tokenize, batch, gather vectors, write the output.
async fn run_embed(
    shared: &Shared,
    engine: &EmbedEngine,
    job: &sluice_schemas::Job,
    items: Vec<Item>,
    reservation: &mut Reservation,
    timings: &mut Timings,
    trace: &JobTrace,
) -> Result<(Output, Usage), JobError> {
    let started = Instant::now();
    let texts = items
        .into_iter()
        .map(|item| match item {
            Item::Text(t) => Ok(t),
            Item::Prompt(_) => Err(JobError::new(
                ErrorCode::Internal,
                "bug: an embed job's input was read as prompts",
            )),
        })
        .collect::<Result<Vec<String>, JobError>>()?;
    let tokenizer = Arc::clone(&engine.tokenizer);
    let truncate = job.parameters.truncate();
    let tokenized = tokio::task::spawn_blocking(move || tokenizer.encode(texts, truncate))
        .await
        .map_err(|e| JobError::new(ErrorCode::Internal, format!("tokenizer task failed: {e}")))?
        .map_err(|e| match e {
            TokenizeError::TooLong { .. } => JobError::new(
                ErrorCode::ItemTooLong,
                format!("{e}; set parameters.truncate=true to cut it, or split the text"),
            ),
            TokenizeError::Failed(m) => JobError::new(ErrorCode::InputInvalid, m),
        })?;
    timings.tokenize = Some(started.elapsed().as_secs_f64() * 1e3);
    let usage = Usage {
        items: tokenized.len() as u64,
        tokens: tokenized.iter().map(|t| t.ids.len() as u64).sum(),
        truncated_items: tokenized.iter().filter(|t| t.truncated).count() as u64,
        completion_tokens: 0,
    };
    trace.stage_with(
        "tokenize",
        started,
        Instant::now(),
        vec![
            KeyValue::new("sluice.items", usage.items as i64),
            KeyValue::new("sluice.tokens", usage.tokens as i64),
        ],
    );
    let _in_flight = TokensInFlight::add(&shared.stats, usage.tokens);
    // The real cost is known now: give back the rest of the worst case.
    reservation.shrink_to(shared.cost.actual_bytes(usage.items, usage.tokens));

    let vectors = embed(engine, tokenized, timings, trace).await?;
    let vectors = if job.parameters.normalize() {
        vectors.into_iter().map(l2_normalize).collect()
    } else {
        vectors
    };
    let started = Instant::now();
    let output = shared
        .sink
        .store_embeddings(&job.id, vectors, engine.dim, job.output.presign_get_secs)
        .await?;
    record_write(timings, trace, started, &output);
    Ok((output, usage))
}

/// generate: tokenize and check the prompts, reserve their KV caches (the
/// reservation shrinks from the worst case to them), generate, write.
async fn run_generate(
    shared: &Shared,
    engine: &GenerateEngine,
    job: &sluice_schemas::Job,
    items: Vec<Item>,
    reservation: &mut Reservation,
    timings: &mut Timings,
    trace: &JobTrace,
) -> Result<(Output, Usage), JobError> {
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
    let _in_flight = TokensInFlight::add(&shared.stats, prompt_tokens);
    reservation.shrink_to(shared.cost.actual_bytes(items, sequence_tokens));

    let started = Instant::now();
    let generations = engine.generate(prepared).await?;
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
    };
    let started = Instant::now();
    let output = shared
        .sink
        .store_generations(&job.id, generations, job.output.presign_get_secs)
        .await?;
    record_write(timings, trace, started, &output);
    Ok((output, usage))
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

/// Hands the items to the batcher and gathers one vector per item.
async fn embed(
    engine: &EmbedEngine,
    tokenized: Vec<TokenizedItem>,
    timings: &mut Timings,
    trace: &JobTrace,
) -> Result<Vec<Vec<f32>>, JobError> {
    let n = tokenized.len();
    let span = trace.span_context();
    let (tx, mut rx) = mpsc::unbounded_channel();
    let mut ready_at = Instant::now();
    for (index, item) in tokenized.into_iter().enumerate() {
        ready_at = Instant::now();
        let item = BatchItem {
            ids: item.ids,
            index,
            job: tx.clone(),
            ready_at,
            trace: span.clone(),
        };
        engine.batcher.send(item).await.map_err(|_| {
            JobError::new(
                ErrorCode::Internal,
                "the batcher has stopped (shutting down)",
            )
        })?;
    }
    drop(tx);
    let mut vectors: Vec<Option<Vec<f32>>> = vec![None; n];
    let mut batches = HashSet::new();
    let mut inference_ms = 0.0;
    let mut last_start = ready_at;
    let mut first_start: Option<Instant> = None;
    let mut last_end = ready_at;
    for _ in 0..n {
        match rx.recv().await {
            Some(ItemOutcome::Done {
                index,
                vector,
                batch,
            }) => {
                if batches.insert(batch.id) {
                    inference_ms += batch.model_ms;
                }
                last_start = last_start.max(batch.started);
                first_start = Some(first_start.map_or(batch.started, |f| f.min(batch.started)));
                last_end =
                    last_end.max(batch.started + Duration::from_secs_f64(batch.model_ms / 1e3));
                if let Some(slot) = vectors.get_mut(index) {
                    *slot = Some(vector);
                }
            }
            Some(ItemOutcome::Failed { error, .. }) => return Err(error),
            None => {
                return Err(JobError::new(
                    ErrorCode::Internal,
                    "the executor stopped before the job's items were done",
                ));
            }
        }
    }
    timings.batch_wait = Some(last_start.saturating_duration_since(ready_at).as_secs_f64() * 1e3);
    timings.inference = Some(inference_ms);
    trace.stage("batch_wait", ready_at, last_start.max(ready_at));
    trace.stage_with(
        "inference",
        first_start.unwrap_or(ready_at),
        last_end,
        vec![
            KeyValue::new("sluice.batches", batches.len() as i64),
            KeyValue::new("sluice.model_ms", inference_ms),
        ],
    );
    vectors
        .into_iter()
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| JobError::new(ErrorCode::Internal, "bug: an item got no vector"))
}

/// Scales `v` to unit length (sentence-transformers' `normalize_embeddings`).
pub fn l2_normalize(mut v: Vec<f32>) -> Vec<f32> {
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt().max(1e-12);
    v.iter_mut().for_each(|x| *x /= norm);
    v
}

fn status(job_id: &str, state: JobState, d: &Delivery) -> StatusRecord {
    StatusRecord {
        version: VERSION,
        job_id: job_id.to_string(),
        state,
        updated_at: OffsetDateTime::now_utc(),
        attempts: d.attempt,
        stream_sequence: Some(d.stream_sequence),
        output: None,
        error: None,
        replays: d.replays,
    }
}

/// The ack decision, in one place: success is answered and double-acked; a
/// retryable failure with attempts left is Nak'ed with a backoff; anything else
/// is answered, dead-lettered and Term'ed. A step that cannot complete (NATS or
/// storage down) leaves the message to be redelivered: nothing is lost.
async fn settle(
    shared: &Shared,
    msg: jetstream::Message,
    d: Delivery,
    outcome: Result<Finished, JobError>,
    timings: Timings,
    trace: JobTrace,
) {
    let finished_at = OffsetDateTime::now_utc();
    shared.stats.record_timings(&timings);
    match outcome {
        Ok(Finished::AlreadyFinal(state)) => {
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
        Ok(Finished::Done(done)) => {
            let Some(job_id) = d.job_id.clone() else {
                tracing::error!("bug: a finished job has no id");
                return;
            };
            let result = JobResult {
                version: VERSION,
                job_id: job_id.clone(),
                outcome: Outcome::Ok {
                    output: done.output.clone(),
                },
                usage: done.usage.clone(),
                timings_ms: timings.clone(),
                attempt: d.attempt,
                finished_at,
            };
            let mut record = status(&job_id, JobState::Done, &d);
            if let Output::S3(s3) = &done.output {
                record.output = Some(s3.clone());
            }
            let reply_to = d
                .reply_to
                .clone()
                .unwrap_or_else(|| shared.topology.result_subject(&job_id));
            // Status first: it is durable (a JetStream write), and a redelivery
            // that finds it final only acks, so a result is never published twice.
            let publish_started = Instant::now();
            match shared.sink.finish_status(&record).await {
                // The outcome is durable: count it before anyone can read the
                // result, so a client that has its answer sees it in /metrics.
                Ok(true) => shared
                    .stats
                    .record_job_ok(done.usage.items, done.usage.tokens),
                Ok(false) => {
                    tracing::info!(job = %job_id, trace_id = %d.trace_id, attempt = d.attempt, "another delivery finished the job first; not answering twice");
                    if let Err(e) = msg.double_ack().await {
                        tracing::warn!(error = %e, "double ack failed");
                    }
                    trace.end("already_answered", None);
                    return;
                }
                Err(e) => {
                    tracing::warn!(job = %job_id, trace_id = %d.trace_id, error = %e, "cannot record a finished job; it will be redelivered");
                    nak(&msg, retry_delay(shared, &d)).await;
                    trace.end("retry", Some(ErrorCode::StorageUnavailable.as_str()));
                    return;
                }
            }
            if let Err(e) = shared
                .sink
                .publish_result(&reply_to, &result, d.traceparent.as_deref())
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
        Err(error) if error.is_retryable() && i64::from(d.attempt) < shared.max_deliver => {
            let delay = retry_delay(shared, &d);
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
            nak(&msg, delay).await;
        }
        Err(error) => {
            let code = error.code.as_str();
            fail(shared, msg, d, error, timings, finished_at).await;
            trace.end("failed", Some(code));
        }
    }
}

/// A final failure: dead letter, error result, status, then Term.
async fn fail(
    shared: &Shared,
    msg: jetstream::Message,
    d: Delivery,
    error: JobError,
    timings: Timings,
    finished_at: OffsetDateTime,
) {
    if let Err(e) = give_up(
        shared,
        &d,
        msg.headers.as_ref(),
        &msg.payload,
        &error,
        timings,
        finished_at,
    )
    .await
    {
        tracing::warn!(error = %e, seq = d.stream_sequence, "cannot dead-letter; the job will be redelivered");
        nak(&msg, retry_delay(shared, &d)).await;
        return;
    }
    if let Err(e) = msg.ack_with(AckKind::Term).await {
        tracing::warn!(error = %e, "term failed; a redelivery will be dead-lettered again under the same id");
    }
}

/// Everything a final failure does before the message leaves the stream:
/// the dead letter (awaited; an error here means the message must stay), then
/// the error result and the failed status (best effort: the dead letter holds
/// the job). A cancelled job is answered but not dead-lettered.
async fn give_up(
    shared: &Shared,
    d: &Delivery,
    headers: Option<&async_nats::HeaderMap>,
    payload: &[u8],
    error: &JobError,
    timings: Timings,
    finished_at: OffsetDateTime,
) -> Result<(), JobError> {
    let job_id = d.job_id.clone();
    let timings_total = timings.total.unwrap_or(0.0);
    let dead_letter = error.code != ErrorCode::Cancelled;
    if let Some(id) = &job_id
        && dead_letter
        && let Ok(Some(record)) = shared.sink.get_status(id).await
        && record.state.is_final()
    {
        // Another delivery already answered this job: this failure is stale.
        tracing::info!(job = %id, state = ?record.state, "job already answered; dropping a stale failure");
        return Ok(());
    }
    if dead_letter {
        let letter = DeadLetter {
            version: VERSION,
            job_id: job_id.clone(),
            error: error.info(),
            attempts: d.attempt,
            original_subject: d.subject.clone(),
            stream_sequence: d.stream_sequence,
            dead_lettered_at: finished_at,
            headers: headers
                .map(|h| {
                    h.iter()
                        .map(|(k, vs)| {
                            (
                                k.to_string(),
                                vs.iter().map(|v| v.as_str().to_string()).collect(),
                            )
                        })
                        .collect::<BTreeMap<_, _>>()
                })
                .unwrap_or_default(),
            payload_base64: base64::engine::general_purpose::STANDARD.encode(payload),
        };
        let task = d.task.map(Task::as_str).unwrap_or("unknown");
        shared
            .sink
            .dead_letter(shared.topology.dlq_subject(task), &letter)
            .await?;
    }
    if let Some(job_id) = &job_id
        && dead_letter
    {
        let mut record = status(job_id, JobState::Failed, d);
        record.error = Some(error.info());
        match shared.sink.finish_status(&record).await {
            Ok(true) => {}
            Ok(false) => return Ok(()),
            Err(e) => {
                tracing::warn!(job = %job_id, error = %e, "cannot record the failure (it is in the dead-letter stream)")
            }
        }
    }
    // Counted before the error result goes out, as ok jobs are.
    shared.stats.record_job_failed(error.code);
    if dead_letter {
        shared.stats.dead_lettered.fetch_add(1, Ordering::Relaxed);
    }
    if let Some(job_id) = &job_id {
        let result = JobResult {
            version: VERSION,
            job_id: job_id.clone(),
            outcome: Outcome::Error {
                error: error.info(),
            },
            usage: Usage::default(),
            timings_ms: timings,
            attempt: d.attempt,
            finished_at,
        };
        let reply_to = d
            .reply_to
            .clone()
            .unwrap_or_else(|| shared.topology.result_subject(job_id));
        if let Err(e) = shared
            .sink
            .publish_result(&reply_to, &result, d.traceparent.as_deref())
            .await
        {
            tracing::warn!(job = %job_id, error = %e, "cannot publish the error result (it is in the dead-letter stream)");
        }
    }
    tracing::info!(
        job = job_id.as_deref().unwrap_or("?"),
        trace_id = %d.trace_id,
        outcome = "failed",
        code = %error.code,
        attempt = d.attempt,
        seq = d.stream_sequence,
        total_ms = timings_total,
        error = %error.message,
        "job failed"
    );
    Ok(())
}

/// The backstop for jobs that ran out of deliveries without the consumer
/// seeing the last one (a crash, or a timeout on the final delivery): the
/// server's MAX_DELIVERIES advisory names the stream sequence; the message is
/// read back, dead-lettered and then deleted from the work queue.
pub async fn dead_letter_exhausted(
    shared: &Shared,
    stream: &jetstream::stream::Stream,
    sequence: u64,
    deliveries: u32,
) -> Result<(), JobError> {
    let msg = match stream.get_raw_message(sequence).await {
        Ok(m) => m,
        Err(e) => {
            // Already gone (acked or dead-lettered elsewhere): nothing to do.
            tracing::debug!(seq = sequence, error = %e, "exhausted message no longer in the stream");
            return Ok(());
        }
    };
    let decoded = sluice_schemas::Job::decode(&msg.payload).ok();
    let get = |name: &str| msg.headers.get(name).map(|v| v.as_str().to_string());
    let d = Delivery {
        attempt: deliveries,
        stream_sequence: sequence,
        published: msg.time,
        subject: msg.subject.to_string(),
        traceparent: get(headers::TRACEPARENT),
        reply_to: get(headers::REPLY_TO),
        job_id: decoded.as_ref().map(|v| v.job.id.clone()),
        task: decoded.as_ref().map(|v| v.task),
        replays: 0,
        trace_id: "-".into(),
    };
    let error = JobError::new(
        ErrorCode::MaxDeliveriesExceeded,
        format!(
            "the job was delivered {deliveries} times without an answer (the consumer crashed or timed out each time)"
        ),
    );
    give_up(
        shared,
        &d,
        Some(&msg.headers),
        &msg.payload,
        &error,
        Timings::default(),
        OffsetDateTime::now_utc(),
    )
    .await?;
    if let Err(e) = stream.delete_message(sequence).await {
        tracing::warn!(seq = sequence, error = %e, "cannot delete the dead-lettered message from the job stream");
    }
    Ok(())
}

/// Gives a message back for immediate redelivery (drain, or a delivery that
/// was never admitted).
pub async fn nak_now(msg: &jetstream::Message) {
    if let Err(e) = msg.ack_with(AckKind::Nak(None)).await {
        tracing::warn!(error = %e, "nak failed; the job will be redelivered after ack_wait");
    }
}

async fn nak(msg: &jetstream::Message, delay: Duration) {
    if let Err(e) = msg.ack_with(AckKind::Nak(Some(delay))).await {
        tracing::warn!(error = %e, "nak failed; the job will be redelivered after ack_wait");
    }
}

/// Exponential backoff with jitter, capped.
fn retry_delay(shared: &Shared, d: &Delivery) -> Duration {
    let base = shared.retry_base.as_millis() as u64;
    let cap = shared.retry_max.as_millis() as u64;
    let exp = base.saturating_mul(1u64 << d.attempt.saturating_sub(1).min(20));
    let capped = exp.min(cap);
    // Jitter in [50%, 100%], from bits that differ per message and attempt.
    let seed = d
        .stream_sequence
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add(u64::from(d.attempt).wrapping_mul(0xBF58_476D_1CE4_E5B9))
        ^ u64::from(OffsetDateTime::now_utc().nanosecond());
    let frac = 0.5 + (seed % 1000) as f64 / 2000.0;
    Duration::from_millis((capped as f64 * frac) as u64)
}
