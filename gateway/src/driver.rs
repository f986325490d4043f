//! The batch driver: every gateway runs one. It moves each unfinished batch
//! (an `active.<id>` marker in the gateway bucket) forward:
//!
//! 1. `validating`: read the input file once, line by line; a line that is
//!    not a request fails the batch (with its line number), a request that
//!    cannot run is kept for the error file, and runnable lines are grouped
//!    into chunk jobs (consecutive lines of one model) whose inputs go to S3.
//!    The chunks are published as ordinary jobs, each id (`<batch>-e<n>` for
//!    embeddings, `-g<n>` for generations) also its `Nats-Msg-Id`, and a chunk that already has a status record is not
//!    published again: re-driving a batch after a crash never doubles work.
//! 2. `in_progress` / `cancelling`: read the chunks' status records. A chunk
//!    that failed as a whole is split into one job per line, so a bad line
//!    fails alone. Cancelling cancels the chunks still queued (running ones
//!    finish); the window's end cancels every unfinished chunk.
//! 3. `finalizing`: read the input file again and write the output and error
//!    files in input order, one chunk's output in memory at a time.
//!
//! Validating and finalizing are claimed with a lease on the record (renewed
//! while working), so one gateway does them while others skip; every other
//! change is a compare-and-swap that is right whoever makes it first.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, Result, bail};
use aws_sdk_s3::presigning::PresigningConfig;
use opentelemetry::KeyValue;
use serde_json::Value;
use sluice_schemas::{
    ErrorCode, Generation, Input, InputFormat, Job, JobState, ObjectRef, OutputOptions,
    StatusRecord, Task, VERSION,
};

use crate::batch_record::{BatchError, BatchRecord, BatchStatus, Chunk, ChunkState, Counts, Lease};
use crate::files::FileRecord;
use crate::objects::{self, Line as RawLine, ObjectWriter, next_line};
use crate::openai::{self, Line, Request, RequestError};
use crate::state::{AppState, now};
use crate::traces::at_unix;

/// Most validation errors kept on a failed batch.
const MAX_ERRORS: usize = 100;
/// Largest chunk input, under the consumers' default --max-input-bytes (8 MiB).
const CHUNK_BYTES: usize = 4 << 20;

/// Runs the driver until the process ends.
pub fn spawn(state: AppState) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(state.config.driver_interval());
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let ids = match state.records.ids("active.").await {
                Ok(ids) => ids,
                Err(e) => {
                    tracing::warn!(error = format!("{e:#}"), "cannot list the active batches");
                    continue;
                }
            };
            for id in ids {
                let state = state.clone();
                tokio::spawn(async move { advance_logged(&state, &id).await });
            }
        }
    })
}

/// Advances one batch now, in the background (after a create or cancel).
pub fn kick(state: &AppState, id: &str) {
    let state = state.clone();
    let id = id.to_string();
    tokio::spawn(async move { advance_logged(&state, &id).await });
}

async fn advance_logged(state: &AppState, id: &str) {
    let Some(_guard) = state.busy.claim(id) else {
        return;
    };
    if let Err(e) = advance(state, id).await {
        tracing::warn!(
            batch = id,
            error = format!("{e:#}"),
            "batch not advanced; will retry"
        );
    }
}

async fn advance(state: &AppState, id: &str) -> Result<()> {
    let Some(batch) = state
        .records
        .get::<BatchRecord>(&BatchRecord::key(id))
        .await?
    else {
        return state.records.delete(&BatchRecord::active_key(id)).await;
    };
    match batch.status {
        s if s.is_final() => state.records.delete(&BatchRecord::active_key(id)).await,
        BatchStatus::Validating => validate(state, batch).await,
        BatchStatus::InProgress | BatchStatus::Cancelling => progress(state, batch).await,
        BatchStatus::Finalizing => finalize(state, batch).await,
        _ => Ok(()),
    }
}

/// Takes (or renews) the batch's lease while it is in `status`; false when
/// another gateway holds it or the batch moved on.
async fn lease(state: &AppState, id: &str, statuses: &[BatchStatus]) -> Result<bool> {
    let t = now();
    let until = t + state.config.lease_secs as i64;
    let taken = state
        .records
        .update::<BatchRecord, _>(&BatchRecord::key(id), |b| {
            let free = match &b.lease {
                None => true,
                Some(l) => l.owner == state.owner || l.until < t,
            };
            (free && statuses.contains(&b.status)).then(|| BatchRecord {
                lease: Some(Lease {
                    owner: state.owner.clone(),
                    until,
                }),
                ..b.clone()
            })
        })
        .await?;
    Ok(taken.is_some())
}

/// Renews the lease at most every few seconds of work; errors when lost.
struct Renewal {
    last: Instant,
}

impl Renewal {
    fn new() -> Renewal {
        Renewal {
            last: Instant::now(),
        }
    }

    async fn keep(&mut self, state: &AppState, id: &str, statuses: &[BatchStatus]) -> Result<()> {
        let every = Duration::from_secs((state.config.lease_secs / 3).max(1));
        if self.last.elapsed() >= every {
            if !lease(state, id, statuses).await? {
                bail!("lost the lease on batch {id}");
            }
            self.last = Instant::now();
        }
        Ok(())
    }
}

/// A batch's input file, read a line at a time, numbered from 1.
struct InputLines<R> {
    reader: R,
    line_no: u64,
    max_line_bytes: usize,
}

impl InputLines<()> {
    async fn open(
        state: &AppState,
        batch: &BatchRecord,
    ) -> Result<InputLines<impl tokio::io::AsyncBufRead + Unpin + use<>>> {
        let key = state.file_key(&batch.input_file_id);
        Ok(InputLines {
            reader: objects::open(&state.s3, state.bucket(), &key).await?,
            line_no: 0,
            max_line_bytes: state.config.max_line_bytes,
        })
    }
}

impl<R: tokio::io::AsyncBufRead + Unpin> InputLines<R> {
    async fn next(&mut self) -> Result<Option<(u64, RawLine)>> {
        let line = next_line(&mut self.reader, self.max_line_bytes).await?;
        Ok(line.map(|l| {
            self.line_no += 1;
            (self.line_no, l)
        }))
    }
}

/// One line read as a request against the models this deployment serves.
fn read_request(state: &AppState, text: &[u8]) -> Result<Line, openai::LineError> {
    openai::read_line(text, &|task, model| state.serves(task, model))
}

/// A chunk being gathered during validation.
struct OpenChunk {
    task: Task,
    model: String,
    first_line: u64,
    last_line: u64,
    lines: u64,
    items: usize,
    body: Vec<u8>,
}

async fn validate(state: &AppState, batch: BatchRecord) -> Result<()> {
    const VALIDATING: &[BatchStatus] = &[BatchStatus::Validating, BatchStatus::Cancelling];
    if !lease(state, &batch.id, &[BatchStatus::Validating]).await? {
        return Ok(());
    }
    let began = SystemTime::now();
    let mut renewal = Renewal::new();
    let mut input = InputLines::open(state, &batch).await?;
    let mut errors: Vec<BatchError> = Vec::new();
    let mut error_count = 0usize;
    let mut seen: HashSet<String> = HashSet::new();
    let mut chunks: Vec<Chunk> = Vec::new();
    let mut open: Option<OpenChunk> = None;
    let (mut total, mut failed) = (0u64, 0u64);
    let mut error = |errors: &mut Vec<BatchError>,
                     code: &str,
                     message: String,
                     param: Option<&str>,
                     line: u64| {
        error_count += 1;
        if errors.len() < MAX_ERRORS {
            errors.push(BatchError {
                code: code.into(),
                message,
                param: param.map(str::to_string),
                line: Some(line),
            });
        }
    };
    while let Some((line_no, raw)) = input.next().await? {
        renewal.keep(state, &batch.id, VALIDATING).await?;
        let text = match raw {
            RawLine::TooLong(n) => {
                let message = format!(
                    "This line is {n} bytes; a request line may be at most {} bytes.",
                    state.config.max_line_bytes
                );
                error(&mut errors, "request_too_large", message, None, line_no);
                continue;
            }
            RawLine::Text(t) if t.iter().all(u8::is_ascii_whitespace) => continue,
            RawLine::Text(t) => t,
        };
        total += 1;
        if total > state.config.max_batch_lines {
            let message = format!(
                "The file holds more than {} requests, the most one batch may hold.",
                state.config.max_batch_lines
            );
            error(&mut errors, "too_many_requests", message, None, line_no);
            break;
        }
        let line = match read_request(state, &text) {
            Ok(line) => line,
            Err(e) => {
                error(&mut errors, e.code, e.message, e.param, line_no);
                continue;
            }
        };
        if !seen.insert(line.custom_id().to_string()) {
            let message = format!(
                "The custom_id {:?} is used on an earlier line; each must be unique.",
                line.custom_id()
            );
            error(
                &mut errors,
                "duplicate_custom_id",
                message,
                Some("custom_id"),
                line_no,
            );
            continue;
        }
        let request = match line {
            Line::Fail { .. } => {
                failed += 1;
                continue;
            }
            Line::Run { request, .. } => request,
        };
        if !errors.is_empty() {
            continue; // the batch fails: no need to write chunks
        }
        let task = request.endpoint.task();
        let most_items = match task {
            Task::Embed => state.config.chunk_texts,
            Task::Generate => state.config.chunk_prompts,
        };
        let fits = open.as_ref().is_some_and(|c| {
            c.task == task
                && c.model == request.model
                && c.lines < state.config.chunk_lines as u64
                && c.items + request.items.len() <= most_items.max(request.items.len())
                && c.body.len() < CHUNK_BYTES
        });
        if !fits && let Some(full) = open.take() {
            chunks.push(write_chunk(state, &batch.id, chunks.len(), full).await?);
        }
        let chunk = open.get_or_insert_with(|| OpenChunk {
            task,
            model: request.model.clone(),
            first_line: line_no,
            last_line: line_no,
            lines: 0,
            items: 0,
            body: Vec::new(),
        });
        chunk.last_line = line_no;
        chunk.lines += 1;
        chunk.items += request.items.len();
        for item in &request.items {
            serde_json::to_writer(&mut chunk.body, item)?;
            chunk.body.push(b'\n');
        }
    }
    if total == 0 && errors.is_empty() {
        error(
            &mut errors,
            "empty_file",
            "The file holds no requests.".into(),
            None,
            1,
        );
    }
    if !errors.is_empty() {
        let at = now();
        tracing::info!(
            batch = batch.id,
            errors = error_count,
            "batch failed validation"
        );
        for c in &chunks {
            let _ = objects::delete(&state.s3, state.bucket(), &state.chunk_key(&c.job_id)).await;
        }
        let ended = state
            .records
            .update::<BatchRecord, _>(&BatchRecord::key(&batch.id), |b| {
                VALIDATING.contains(&b.status).then(|| BatchRecord {
                    status: BatchStatus::Failed,
                    failed_at: Some(at),
                    errors: errors.clone(),
                    lease: None,
                    ..b.clone()
                })
            })
            .await?;
        if let Some(ended) = ended {
            trace_step(
                state,
                &ended,
                "sluice.openai_batch.validate",
                began,
                vec![KeyValue::new(
                    "sluice.openai_batch.errors",
                    error_count as i64,
                )],
            );
            trace_end(state, &ended);
        }
        return state
            .records
            .delete(&BatchRecord::active_key(&batch.id))
            .await;
    }
    if let Some(last) = open.take() {
        chunks.push(write_chunk(state, &batch.id, chunks.len(), last).await?);
    }
    // A cancel that came in while validating: publish nothing.
    let current = state
        .records
        .get::<BatchRecord>(&BatchRecord::key(&batch.id))
        .await?
        .context("the batch record vanished")?;
    let cancelled = current.status == BatchStatus::Cancelling;
    for chunk in &mut chunks {
        if cancelled {
            chunk.state = ChunkState::NotRun;
        } else {
            renewal.keep(state, &batch.id, VALIDATING).await?;
            publish(state, &batch, chunk, &chunk.job_id).await?;
        }
    }
    let at = now();
    let counts = Counts {
        total,
        completed: 0,
        failed,
    };
    let moved = state
        .records
        .update::<BatchRecord, _>(&BatchRecord::key(&batch.id), |b| {
            VALIDATING.contains(&b.status).then(|| BatchRecord {
                status: if b.status == BatchStatus::Validating {
                    BatchStatus::InProgress
                } else {
                    b.status
                },
                in_progress_at: Some(at),
                request_counts: counts.clone(),
                failed_at_validation: failed,
                chunks: chunks.clone(),
                lease: None,
                ..b.clone()
            })
        })
        .await?;
    if let Some(moved) = moved {
        trace_step(
            state,
            &moved,
            "sluice.openai_batch.validate",
            began,
            vec![
                KeyValue::new("sluice.openai_batch.requests", total as i64),
                KeyValue::new("sluice.openai_batch.chunks", chunks.len() as i64),
                KeyValue::new("sluice.openai_batch.failed", failed as i64),
            ],
        );
    }
    tracing::info!(
        batch = batch.id,
        requests = total,
        chunks = chunks.len(),
        failed,
        "batch in progress"
    );
    Ok(())
}

/// Records one of the driver's steps, from `began` to now, in the batch's trace.
fn trace_step(
    state: &AppState,
    batch: &BatchRecord,
    name: &'static str,
    began: SystemTime,
    mut attributes: Vec<KeyValue>,
) {
    attributes.push(KeyValue::new("sluice.openai_batch.id", batch.id.clone()));
    state.traces.batch_step(
        batch.traceparent.as_deref(),
        name,
        began,
        SystemTime::now(),
        attributes,
    );
}

/// Records the batch's own span, from its creation to now, once it has ended.
fn trace_end(state: &AppState, batch: &BatchRecord) {
    let counts = &batch.request_counts;
    trace_step(
        state,
        batch,
        "sluice.openai_batch",
        at_unix(batch.created_at),
        vec![
            KeyValue::new("sluice.tenant", batch.tenant.clone()),
            KeyValue::new("sluice.openai_batch.endpoint", batch.endpoint.clone()),
            KeyValue::new("sluice.openai_batch.status", batch.status.as_str()),
            KeyValue::new("sluice.openai_batch.total", counts.total as i64),
            KeyValue::new("sluice.openai_batch.completed", counts.completed as i64),
            KeyValue::new("sluice.openai_batch.failed", counts.failed as i64),
        ],
    );
}

/// Chunk job ids end in `-e<n>` (embed) or `-g<n>` (generate).
fn chunk_task(job_id: &str) -> Task {
    let tail = job_id.rsplit('-').next().unwrap_or_default();
    if tail.starts_with('g') {
        Task::Generate
    } else {
        Task::Embed
    }
}

async fn write_chunk(
    state: &AppState,
    batch_id: &str,
    index: usize,
    chunk: OpenChunk,
) -> Result<Chunk> {
    let kind = match chunk.task {
        Task::Embed => 'e',
        Task::Generate => 'g',
    };
    let job_id = format!("{batch_id}-{kind}{index}");
    let key = state.chunk_key(&job_id);
    let mut writer = ObjectWriter::new(&state.s3, state.bucket(), &key);
    writer.write(&chunk.body).await?;
    writer.finish().await?;
    Ok(Chunk {
        job_id,
        model: chunk.model,
        first_line: chunk.first_line,
        last_line: chunk.last_line,
        lines: chunk.lines,
        state: ChunkState::Pending,
    })
}

/// Publishes the job `job_id` (the chunk's own, or one of its lines' after
/// a split) unless it already has a status record.
async fn publish(state: &AppState, batch: &BatchRecord, chunk: &Chunk, job_id: &str) -> Result<()> {
    if state.statuses.get(job_id).await?.is_some() {
        return Ok(());
    }
    let task = chunk_task(&chunk.job_id);
    let key = state.chunk_key(job_id);
    let presigned = state
        .s3
        .get_object()
        .bucket(state.bucket())
        .key(&key)
        .presigned(PresigningConfig::expires_in(Duration::from_secs(
            state.config.presign_secs,
        ))?)
        .await
        .with_context(|| format!("presigning {key}"))?;
    let deadline = time::OffsetDateTime::from_unix_timestamp(batch.expires_at).ok();
    if deadline.is_some_and(|d| d <= time::OffsetDateTime::now_utc()) {
        // The window ended: the job would only expire in the queue. Without
        // a record, `progress` stops it and counts its lines as not run.
        return Ok(());
    }
    let job = Job {
        version: VERSION,
        id: job_id.to_string(),
        task: task.as_str().into(),
        model: chunk.model.clone(),
        inputs: vec![Input::Url {
            url: presigned.uri().to_string(),
            format: InputFormat::Jsonl,
            object: Some(ObjectRef {
                bucket: state.bucket().to_string(),
                key,
            }),
        }],
        parameters: Default::default(),
        token_estimate: None,
        deadline,
        submitted_at: Some(time::OffsetDateTime::now_utc()),
        output: OutputOptions {
            presign_get_secs: None,
            always_s3: Some(true),
            item_tokens: Some(true),
            stream: None,
        },
    };
    let reply_to = state.topology.result_subject(job_id);
    sluice_producer::publish(
        &state.js,
        &state.topology,
        &state.statuses,
        &job,
        // A batch is throughput work with hours to finish: it yields to
        // normal and high jobs but keeps its guaranteed share.
        sluice_schemas::Priority::Low,
        // As the API key's tenant: tenants share the consumers' tokens.
        Some(&batch.tenant),
        &reply_to,
        batch.traceparent.as_deref(),
    )
    .await?;
    Ok(())
}

/// The job ids of a split chunk's lines.
fn line_job(chunk_job: &str, line: u64) -> String {
    format!("{chunk_job}-l{line}")
}

/// Re-reads the input file's lines `first..=last`: the runnable ones.
async fn runnable_lines(
    state: &AppState,
    batch: &BatchRecord,
    first: u64,
    last: u64,
) -> Result<Vec<(u64, String, Request)>> {
    let mut input = InputLines::open(state, batch).await?;
    let mut out = Vec::new();
    while let Some((line_no, raw)) = input.next().await? {
        if line_no < first {
            continue;
        }
        if line_no > last {
            break;
        }
        if let RawLine::Text(t) = raw
            && let Ok(Line::Run { custom_id, request }) = read_request(state, &t)
        {
            out.push((line_no, custom_id, request));
        }
    }
    Ok(out)
}

/// Runs a failed chunk again as one job per line.
async fn split(state: &AppState, batch: &BatchRecord, chunk: &Chunk) -> Result<()> {
    for (line, _, request) in
        runnable_lines(state, batch, chunk.first_line, chunk.last_line).await?
    {
        let job_id = line_job(&chunk.job_id, line);
        if state.statuses.get(&job_id).await?.is_some() {
            continue;
        }
        let mut body = Vec::new();
        for item in &request.items {
            serde_json::to_writer(&mut body, item)?;
            body.push(b'\n');
        }
        let mut writer = ObjectWriter::new(&state.s3, state.bucket(), &state.chunk_key(&job_id));
        writer.write(&body).await?;
        writer.finish().await?;
        publish(state, batch, chunk, &job_id).await?;
    }
    Ok(())
}

/// Whether a failure is the request's own (so splitting the chunk helps).
fn is_line_failure(record: &StatusRecord) -> bool {
    !matches!(
        record.error.as_ref().map(|e| e.code),
        Some(ErrorCode::DeadlineExceeded | ErrorCode::Cancelled)
    )
}

/// Stops a job that has not finished: any such job once the window ended,
/// only a queued one on cancel (a running one finishes). Whether it stopped.
async fn stop(state: &AppState, job_id: &str, expired: bool, cancelling: bool) -> Result<bool> {
    Ok(if expired {
        state.statuses.cancel(job_id).await?
    } else if cancelling {
        state.statuses.cancel_queued(job_id).await?
    } else {
        false
    })
}

async fn progress(state: &AppState, batch: BatchRecord) -> Result<()> {
    let expired = batch.status == BatchStatus::InProgress && now() >= batch.expires_at;
    let cancelling = batch.status == BatchStatus::Cancelling;
    let mut chunks = batch.chunks.clone();
    let mut all_final = true;
    let (mut completed, mut failed) = (0u64, batch.failed_at_validation);
    for chunk in &mut chunks {
        if chunk.state == ChunkState::Pending {
            let record = state.statuses.view(&chunk.job_id).await?;
            chunk.state = match record.as_ref().map(|r| r.state) {
                Some(JobState::Done) => ChunkState::Done,
                Some(JobState::Failed)
                    if chunk.lines > 1 && record.as_ref().is_some_and(is_line_failure) =>
                {
                    split(state, &batch, chunk).await?;
                    ChunkState::Split
                }
                Some(JobState::Failed) => ChunkState::Failed,
                // Its deadline (the batch's window) passed in the queue.
                Some(JobState::Cancelled | JobState::Expired) => ChunkState::NotRun,
                Some(JobState::Queued | JobState::Running) | None => {
                    if record.is_none() && !cancelling && !expired {
                        // Its publish was lost (a crash between writing and
                        // publishing): publish it again.
                        publish(state, &batch, chunk, &chunk.job_id).await?;
                    }
                    if stop(state, &chunk.job_id, expired, cancelling).await? {
                        ChunkState::NotRun
                    } else {
                        ChunkState::Pending
                    }
                }
            };
        }
        match chunk.state {
            ChunkState::Pending => all_final = false,
            ChunkState::Done => completed += chunk.lines,
            ChunkState::Failed => failed += chunk.lines,
            ChunkState::NotRun => {}
            ChunkState::Split => {
                for (line, _, _) in
                    runnable_lines(state, &batch, chunk.first_line, chunk.last_line).await?
                {
                    let job_id = line_job(&chunk.job_id, line);
                    let mut record = state.statuses.view(&job_id).await?;
                    if record.as_ref().is_none_or(|r| !r.state.is_final())
                        && stop(state, &job_id, expired, cancelling).await?
                    {
                        record = state.statuses.view(&job_id).await?;
                    }
                    match record.map(|r| r.state) {
                        Some(JobState::Done) => completed += 1,
                        Some(JobState::Failed) => failed += 1,
                        Some(JobState::Cancelled | JobState::Expired) => {}
                        _ => all_final = false,
                    }
                }
            }
        }
    }
    let at = now();
    let counts = Counts {
        total: batch.request_counts.total,
        completed,
        failed,
    };
    let moved = state
        .records
        .update::<BatchRecord, _>(&BatchRecord::key(&batch.id), |b| {
            if !matches!(b.status, BatchStatus::InProgress | BatchStatus::Cancelling) {
                return None;
            }
            let mut next = BatchRecord {
                chunks: chunks.clone(),
                request_counts: counts.clone(),
                ..b.clone()
            };
            if all_final {
                next.status = BatchStatus::Finalizing;
                next.finalizing_at = Some(at);
                next.lease = None;
                // Where it ends: remembered in the errors' place until then.
                next.expired_at = expired.then_some(at);
            }
            (next != *b).then_some(next)
        })
        .await?;
    if let Some(b) = moved
        && b.status == BatchStatus::Finalizing
    {
        return finalize(state, b).await;
    }
    Ok(())
}

/// The outputs of a done job, read back from S3.
/// A done job's output, read back: the vectors (row-major, `dim` wide,
/// with each item's tokens when the job listed them) or the generations.
pub(crate) enum Outputs {
    Vectors {
        dim: usize,
        values: Vec<f32>,
        tokens: Vec<u64>,
    },
    Generations(Vec<Generation>),
}

async fn outputs(state: &AppState, record: &StatusRecord) -> Result<Outputs> {
    let output = record
        .output
        .as_ref()
        .context("a done chunk has no output object")?;
    let tokens = record
        .usage
        .as_ref()
        .map(|u| u.item_tokens.clone())
        .unwrap_or_default();
    read_output(state, output, tokens).await
}

/// Reads an output object from S3: `npy` vectors or `jsonl` generations.
pub(crate) async fn read_output(
    state: &AppState,
    output: &sluice_schemas::S3Output,
    tokens: Vec<u64>,
) -> Result<Outputs> {
    let body = objects::read_all(&state.s3, &output.bucket, &output.key).await?;
    match output.format.as_str() {
        "npy" => {
            let (_, dim, values) =
                sluice_schemas::npy::decode_f32(&body).map_err(anyhow::Error::msg)?;
            Ok(Outputs::Vectors {
                dim,
                values,
                tokens,
            })
        }
        "jsonl" => Ok(Outputs::Generations(
            body.split(|b| *b == b'\n')
                .filter(|l| !l.is_empty())
                .map(serde_json::from_slice)
                .collect::<Result<_, _>>()
                .context("reading a generation")?,
        )),
        other => bail!("unknown output format {other}"),
    }
}

/// A done job's answers, handed out request by request.
struct Answers {
    outputs: Outputs,
    next: usize,
}

impl Answers {
    fn body(
        &mut self,
        state_model: &str,
        request: &Request,
        id: &str,
        created: i64,
    ) -> Result<Value> {
        let n = request.items.len();
        let first = self.next;
        self.next += n;
        match &self.outputs {
            Outputs::Vectors {
                dim,
                values,
                tokens,
            } => {
                let rows: Vec<&[f32]> = (first..first + n)
                    .map(|i| {
                        values
                            .get(i * dim..(i + 1) * dim)
                            .context("fewer vectors than texts")
                    })
                    .collect::<Result<_>>()?;
                let used: u64 = tokens.get(first..first + n).map_or(0, |t| t.iter().sum());
                Ok(openai::embeddings_body(
                    state_model,
                    &rows,
                    used,
                    request.base64,
                ))
            }
            Outputs::Generations(all) => {
                let gens = all
                    .get(first..first + n)
                    .context("fewer generations than prompts")?;
                Ok(openai::generation_body(
                    request.endpoint,
                    id,
                    created,
                    state_model,
                    gens,
                ))
            }
        }
    }
}

/// The HTTP status OpenAI would answer a request that failed with `code`.
pub(crate) fn http_status(code: ErrorCode) -> u16 {
    match code {
        ErrorCode::InputFetchFailed
        | ErrorCode::StorageUnavailable
        | ErrorCode::DeviceOutOfMemory
        | ErrorCode::MaxDeliveriesExceeded
        | ErrorCode::Internal => 500,
        _ => 400,
    }
}

async fn finalize(state: &AppState, batch: BatchRecord) -> Result<()> {
    const FINALIZING: &[BatchStatus] = &[BatchStatus::Finalizing];
    if !lease(state, &batch.id, FINALIZING).await? {
        return Ok(());
    }
    let started = Instant::now();
    let began = SystemTime::now();
    let mut renewal = Renewal::new();
    let ending = if batch.cancelling_at.is_some() {
        BatchStatus::Cancelled
    } else if batch.expired_at.is_some() {
        BatchStatus::Expired
    } else {
        BatchStatus::Completed
    };
    let (unrun_code, unrun_message) = match ending {
        BatchStatus::Cancelled => (
            "batch_cancelled",
            "This request was not run: the batch was cancelled.",
        ),
        _ => (
            "batch_expired",
            "This request was not run: the batch's completion window ended first.",
        ),
    };
    let hex = batch.id.trim_start_matches("batch_");
    let output_id = format!("file-{hex}-output");
    let error_id = format!("file-{hex}-errors");
    let mut output = ObjectWriter::new(&state.s3, state.bucket(), &state.file_key(&output_id));
    let mut errors = ObjectWriter::new(&state.s3, state.bucket(), &state.file_key(&error_id));
    let (mut completed, mut failed) = (0u64, 0u64);
    let mut input = InputLines::open(state, &batch).await?;
    let mut chunk_index = 0usize;
    let mut answers: Option<(String, Answers)> = None;
    let created = now();
    let mut statuses: HashMap<String, Option<StatusRecord>> = HashMap::new();
    while let Some((line_no, raw)) = input.next().await? {
        renewal.keep(state, &batch.id, FINALIZING).await?;
        let RawLine::Text(text) = raw else { continue };
        let Ok(line) = read_request(state, &text) else {
            continue;
        };
        let request_id = format!("batch_req_{hex}_{line_no}");
        let (custom_id, request) = match line {
            Line::Fail { custom_id, error } => {
                write_line(
                    &mut errors,
                    &openai::output_line(&request_id, &custom_id, error.status, error.body()),
                )
                .await?;
                failed += 1;
                continue;
            }
            Line::Run { custom_id, request } => (custom_id, request),
        };
        while batch
            .chunks
            .get(chunk_index)
            .is_some_and(|c| c.last_line < line_no)
        {
            chunk_index += 1;
        }
        let Some(chunk) = batch
            .chunks
            .get(chunk_index)
            .filter(|c| c.first_line <= line_no)
        else {
            bail!("line {line_no} of batch {} is in no chunk", batch.id);
        };
        // The job that answered this line: the chunk's, or its own after a split.
        let job_id = match chunk.state {
            ChunkState::Split => line_job(&chunk.job_id, line_no),
            _ => chunk.job_id.clone(),
        };
        if !statuses.contains_key(&job_id) {
            if chunk.state != ChunkState::Split {
                statuses.clear();
            }
            statuses.insert(job_id.clone(), state.statuses.view(&job_id).await?);
        }
        let record = statuses.get(&job_id).cloned().flatten();
        match record.as_ref().map(|r| r.state) {
            Some(JobState::Done) => {
                let record = record.as_ref().context("checked")?;
                if answers.as_ref().is_none_or(|(id, _)| *id != job_id) {
                    answers = Some((
                        job_id.clone(),
                        Answers {
                            outputs: outputs(state, record).await?,
                            next: 0,
                        },
                    ));
                }
                let (_, a) = answers.as_mut().context("loaded")?;
                let body = a.body(&request.model, &request, &request_id, created)?;
                write_line(
                    &mut output,
                    &openai::output_line(&request_id, &custom_id, 200, body),
                )
                .await?;
                completed += 1;
            }
            Some(JobState::Failed) => {
                let info = record.and_then(|r| r.error);
                let (code, message) = info
                    .map_or((ErrorCode::Internal, "the job failed".to_string()), |e| {
                        (e.code, e.message)
                    });
                let error = RequestError {
                    status: http_status(code),
                    code: code.as_str(),
                    message,
                    param: None,
                };
                write_line(
                    &mut errors,
                    &openai::output_line(&request_id, &custom_id, error.status, error.body()),
                )
                .await?;
                failed += 1;
            }
            _ => {
                write_line(
                    &mut errors,
                    &openai::unrun_line(&request_id, &custom_id, unrun_code, unrun_message),
                )
                .await?;
                failed += 1;
            }
        }
    }
    let mut file_ids = Vec::new();
    for (writer, id, name) in [
        (output, &output_id, "output"),
        (errors, &error_id, "errors"),
    ] {
        if writer.is_empty() {
            writer.abort().await;
            file_ids.push(None);
            continue;
        }
        let bytes = writer.finish().await?;
        let file = FileRecord {
            id: id.clone(),
            tenant: batch.tenant.clone(),
            filename: format!("{}_{name}.jsonl", batch.id),
            purpose: "batch_output".into(),
            bytes,
            created_at: now(),
        };
        state.records.put(&FileRecord::key(id), &file).await?;
        file_ids.push(Some(id.clone()));
    }
    let at = now();
    let finished = state
        .records
        .update::<BatchRecord, _>(&BatchRecord::key(&batch.id), |b| {
            (b.status == BatchStatus::Finalizing).then(|| {
                let mut next = BatchRecord {
                    status: ending,
                    output_file_id: file_ids[0].clone(),
                    error_file_id: file_ids[1].clone(),
                    request_counts: Counts {
                        total: b.request_counts.total,
                        completed,
                        failed,
                    },
                    lease: None,
                    ..b.clone()
                };
                match ending {
                    BatchStatus::Cancelled => next.cancelled_at = Some(at),
                    BatchStatus::Expired => next.expired_at = Some(at),
                    _ => next.completed_at = Some(at),
                }
                next
            })
        })
        .await?;
    if let Some(finished) = finished {
        state
            .metrics
            .batch_ended(ending, completed, failed, Some(started.elapsed()));
        trace_step(
            state,
            &finished,
            "sluice.openai_batch.finalize",
            began,
            Vec::new(),
        );
        trace_end(state, &finished);
        tracing::info!(batch = batch.id, status = ?ending, completed, failed, "batch finalized");
        state
            .records
            .delete(&BatchRecord::active_key(&batch.id))
            .await?;
    }
    Ok(())
}

async fn write_line(writer: &mut ObjectWriter, line: &Value) -> Result<()> {
    let mut bytes = serde_json::to_vec(line)?;
    bytes.push(b'\n');
    writer.write(&bytes).await
}
