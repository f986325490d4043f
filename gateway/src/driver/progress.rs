//! `in_progress` / `cancelling`: follow the chunks' status records, split a
//! chunk that failed as a whole into one job per line, stop what must stop,
//! and move the batch to `finalizing` once every job is final.

use anyhow::Result;
use sluice_schemas::{ErrorCode, JobState, StatusRecord};

use super::chunks::line_job;
use super::finalize::finalize;
use super::input::runnable_lines;
use super::publish::{publish, split};
use crate::batch_record::{BatchRecord, BatchStatus, Chunk, ChunkState, Counts};
use crate::state::{AppState, now};

/// Why unfinished jobs stop: the window ended, or the batch is cancelling.
#[derive(Clone, Copy)]
struct Stopping {
    expired: bool,
    cancelling: bool,
}

/// The lines' outcomes so far.
struct Tally {
    completed: u64,
    failed: u64,
    all_final: bool,
}

pub async fn progress(state: &AppState, batch: BatchRecord) -> Result<()> {
    let stopping = Stopping {
        expired: batch.status == BatchStatus::InProgress && now() >= batch.expires_at,
        cancelling: batch.status == BatchStatus::Cancelling,
    };
    let mut chunks = batch.chunks.clone();
    let mut tally = Tally {
        completed: 0,
        failed: batch.failed_at_validation,
        all_final: true,
    };
    for chunk in &mut chunks {
        if chunk.state == ChunkState::Pending {
            chunk.state = follow(state, &batch, chunk, stopping).await?;
        }
        match chunk.state {
            ChunkState::Pending => tally.all_final = false,
            ChunkState::Done => tally.completed += chunk.lines,
            ChunkState::Failed => tally.failed += chunk.lines,
            ChunkState::NotRun => {}
            ChunkState::Split => follow_lines(state, &batch, chunk, stopping, &mut tally).await?,
        }
    }
    let at = now();
    let counts = Counts {
        total: batch.request_counts.total,
        completed: tally.completed,
        failed: tally.failed,
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
            if tally.all_final {
                next.status = BatchStatus::Finalizing;
                next.finalizing_at = Some(at);
                next.lease = None;
                // Where it ends: remembered in the errors' place until then.
                next.expired_at = stopping.expired.then_some(at);
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

/// A pending chunk's state from its job's status record.
async fn follow(
    state: &AppState,
    batch: &BatchRecord,
    chunk: &Chunk,
    stopping: Stopping,
) -> Result<ChunkState> {
    let record = state.statuses_of(&batch.tenant).view(&chunk.job_id).await?;
    Ok(match record.as_ref().map(|r| r.state) {
        Some(JobState::Done) => ChunkState::Done,
        Some(JobState::Failed)
            if chunk.lines > 1 && record.as_ref().is_some_and(is_line_failure) =>
        {
            split(state, batch, chunk).await?;
            ChunkState::Split
        }
        Some(JobState::Failed) => ChunkState::Failed,
        // Its deadline (the batch's window) passed in the queue.
        Some(JobState::Cancelled | JobState::Expired) => ChunkState::NotRun,
        Some(JobState::Queued | JobState::Running) | None => {
            if record.is_none() && !stopping.cancelling && !stopping.expired {
                // Its publish was lost (a crash between writing and
                // publishing): publish it again.
                publish(state, batch, chunk, &chunk.job_id).await?;
            }
            if stop(state, batch, &chunk.job_id, stopping).await? {
                ChunkState::NotRun
            } else {
                ChunkState::Pending
            }
        }
    })
}

/// A split chunk: each line's own job, counted.
async fn follow_lines(
    state: &AppState,
    batch: &BatchRecord,
    chunk: &Chunk,
    stopping: Stopping,
    tally: &mut Tally,
) -> Result<()> {
    for (line, _, _) in runnable_lines(state, batch, chunk.first_line, chunk.last_line).await? {
        let job_id = line_job(&chunk.job_id, line);
        let mut record = state.statuses_of(&batch.tenant).view(&job_id).await?;
        if record.as_ref().is_none_or(|r| !r.state.is_final())
            && stop(state, batch, &job_id, stopping).await?
        {
            record = state.statuses_of(&batch.tenant).view(&job_id).await?;
        }
        match record.map(|r| r.state) {
            Some(JobState::Done) => tally.completed += 1,
            Some(JobState::Failed) => tally.failed += 1,
            Some(JobState::Cancelled | JobState::Expired) => {}
            _ => tally.all_final = false,
        }
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
async fn stop(
    state: &AppState,
    batch: &BatchRecord,
    job_id: &str,
    stopping: Stopping,
) -> Result<bool> {
    let statuses = state.statuses_of(&batch.tenant);
    Ok(if stopping.expired {
        statuses.cancel(job_id).await?
    } else if stopping.cancelling {
        statuses.cancel_queued(job_id).await?
    } else {
        false
    })
}
