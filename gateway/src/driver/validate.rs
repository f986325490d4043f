//! `validating`: one pass over the input file gathers the runnable lines
//! into chunk jobs and collects what is wrong; then the batch either fails
//! (with its errors, and no job published) or its chunks are published and
//! it moves to `in_progress`.

use std::collections::HashSet;
use std::time::SystemTime;

use anyhow::{Context, Result};
use opentelemetry::KeyValue;

use super::chunks::{CHUNK_BYTES, ChunkLimits, Chunker, ErrorLog};
use super::input::{InputLines, read_request};
use super::lease::{Renewal, lease};
use super::publish::{publish, write_chunk};
use super::trace;
use crate::batch_record::{BatchRecord, BatchStatus, Chunk, ChunkState, Counts};
use crate::objects::{self, Line as RawLine};
use crate::openai::Line;
use crate::state::{AppState, now};

/// The statuses validation works in (a cancel may come in meanwhile).
const VALIDATING: &[BatchStatus] = &[BatchStatus::Validating, BatchStatus::Cancelling];

pub async fn validate(state: &AppState, batch: BatchRecord) -> Result<()> {
    if !lease(state, &batch.id, &[BatchStatus::Validating]).await? {
        return Ok(());
    }
    let began = SystemTime::now();
    let mut renewal = Renewal::new();
    let read = read_input(state, &batch, &mut renewal).await?;
    if read.errors.is_empty() {
        start(state, &batch, read, began, &mut renewal).await
    } else {
        fail(state, &batch, read, began).await
    }
}

/// What one pass over the input file found.
struct Read {
    errors: ErrorLog,
    /// The chunks written to S3 (none after the first error).
    chunks: Vec<Chunk>,
    /// Request lines, and those that cannot run (kept for the error file).
    total: u64,
    failed: u64,
}

async fn read_input(state: &AppState, batch: &BatchRecord, renewal: &mut Renewal) -> Result<Read> {
    let config = &state.config;
    let mut input = InputLines::open(state, batch).await?;
    let mut errors = ErrorLog::default();
    let mut seen: HashSet<String> = HashSet::new();
    let mut chunker = Chunker::new(ChunkLimits {
        lines: config.chunk_lines as u64,
        texts: config.chunk_texts,
        prompts: config.chunk_prompts,
        bytes: CHUNK_BYTES,
    });
    let mut chunks = Vec::new();
    let (mut total, mut failed) = (0u64, 0u64);
    while let Some((line_no, raw)) = input.next().await? {
        renewal.keep(state, &batch.id, VALIDATING).await?;
        let text = match raw {
            RawLine::TooLong(n) => {
                let message = format!(
                    "This line is {n} bytes; a request line may be at most {} bytes.",
                    config.max_line_bytes
                );
                errors.push("request_too_large", message, None, line_no);
                continue;
            }
            RawLine::Text(t) if t.iter().all(u8::is_ascii_whitespace) => continue,
            RawLine::Text(t) => t,
        };
        total += 1;
        if total > config.max_batch_lines {
            let message = format!(
                "The file holds more than {} requests, the most one batch may hold.",
                config.max_batch_lines
            );
            errors.push("too_many_requests", message, None, line_no);
            break;
        }
        let line = match read_request(state, &text) {
            Ok(line) => line,
            Err(e) => {
                errors.push(e.code, e.message, e.param, line_no);
                continue;
            }
        };
        if !seen.insert(line.custom_id().to_string()) {
            let message = format!(
                "The custom_id {:?} is used on an earlier line; each must be unique.",
                line.custom_id()
            );
            errors.push("duplicate_custom_id", message, Some("custom_id"), line_no);
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
        if let Some(full) = chunker.add(line_no, &request) {
            chunks.push(write_chunk(state, &batch.id, chunks.len(), full).await?);
        }
    }
    if total == 0 && errors.is_empty() {
        errors.push("empty_file", "The file holds no requests.".into(), None, 1);
    }
    if errors.is_empty()
        && let Some(last) = chunker.finish()
    {
        chunks.push(write_chunk(state, &batch.id, chunks.len(), last).await?);
    }
    Ok(Read {
        errors,
        chunks,
        total,
        failed,
    })
}

/// The batch fails validation: the chunk inputs written go, the errors are
/// recorded, nothing was published.
async fn fail(state: &AppState, batch: &BatchRecord, read: Read, began: SystemTime) -> Result<()> {
    let at = now();
    let count = read.errors.count;
    tracing::info!(batch = batch.id, errors = count, "batch failed validation");
    for c in &read.chunks {
        let _ = objects::delete(&state.s3, state.bucket(), &state.chunk_key(&c.job_id)).await;
    }
    let ended = state
        .records
        .update::<BatchRecord, _>(&BatchRecord::key(&batch.id), |b| {
            VALIDATING.contains(&b.status).then(|| BatchRecord {
                status: BatchStatus::Failed,
                failed_at: Some(at),
                errors: read.errors.kept.clone(),
                lease: None,
                ..b.clone()
            })
        })
        .await?;
    if let Some(ended) = ended {
        let errors = KeyValue::new("sluice.openai_batch.errors", count as i64);
        trace::step(
            state,
            &ended,
            "sluice.openai_batch.validate",
            began,
            vec![errors],
        );
        trace::end(state, &ended);
    }
    state
        .records
        .delete(&BatchRecord::active_key(&batch.id))
        .await
}

/// The batch is valid: its chunks are published (none when a cancel came
/// in meanwhile) and it moves to `in_progress` (or stays `cancelling`).
async fn start(
    state: &AppState,
    batch: &BatchRecord,
    read: Read,
    began: SystemTime,
    renewal: &mut Renewal,
) -> Result<()> {
    let Read {
        mut chunks,
        total,
        failed,
        ..
    } = read;
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
            publish(state, batch, chunk, &chunk.job_id).await?;
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
        let attributes = vec![
            KeyValue::new("sluice.openai_batch.requests", total as i64),
            KeyValue::new("sluice.openai_batch.chunks", chunks.len() as i64),
            KeyValue::new("sluice.openai_batch.failed", failed as i64),
        ];
        trace::step(
            state,
            &moved,
            "sluice.openai_batch.validate",
            began,
            attributes,
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
