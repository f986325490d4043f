//! The batch driver: every gateway runs one. It moves each unfinished batch
//! (an `active.<id>` marker in the gateway bucket) forward:
//!
//! 1. `validating` ([`validate`]): read the input file once, line by line; a
//!    line that is not a request fails the batch (with its line number), a
//!    request that cannot run is kept for the error file, and runnable lines
//!    are grouped into chunk jobs ([`chunks`]: consecutive lines of one
//!    model) whose inputs go to S3. The chunks are published as ordinary
//!    jobs, each id (`<batch>-e<n>` for embeddings, `-g<n>` for generations)
//!    also its `Nats-Msg-Id`, and a chunk that already has a status record
//!    is not published again: re-driving a batch after a crash never
//!    doubles work.
//! 2. `in_progress` / `cancelling` ([`progress`]): read the chunks' status
//!    records. A chunk that failed as a whole is split into one job per
//!    line, so a bad line fails alone. Cancelling cancels the chunks still
//!    queued (running ones finish); the window's end cancels every
//!    unfinished chunk.
//! 3. `finalizing` ([`finalize`]): read the input file again and write the
//!    output and error files in input order, one chunk's output in memory
//!    at a time.
//!
//! Validating and finalizing are claimed with a lease on the record
//! ([`lease`], renewed while working), so one gateway does them while
//! others skip; every other change is a compare-and-swap that is right
//! whoever makes it first.

mod chunks;
mod finalize;
mod input;
mod lease;
mod progress;
mod publish;
pub use publish::PRESIGN_PAST_DEADLINE;
pub mod sweep;
mod trace;
mod validate;

pub use chunks::line_job;

use anyhow::Result;

use crate::batch_record::{BatchRecord, BatchStatus};
use crate::state::AppState;

/// How long an `active.<id>` marker without its batch record is taken for a
/// read that missed the record, before the marker is removed as an orphan.
const ORPHAN_AFTER: std::time::Duration = std::time::Duration::from_secs(120);

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
        // The record is written just after its marker, but a read may miss
        // it: the bucket's reads are served by any replica, and one that
        // has just restarted may not have caught up (the fault soak found a
        // batch left `validating` forever this way). Only a marker alone
        // for ORPHAN_AFTER is an orphan (its creator died between the two
        // writes).
        let marker = BatchRecord::active_key(id);
        if state
            .records
            .age(&marker)
            .await?
            .is_some_and(|age| age < ORPHAN_AFTER)
        {
            return Ok(());
        }
        return state.records.delete(&marker).await;
    };
    match batch.status {
        s if s.is_final() => state.records.delete(&BatchRecord::active_key(id)).await,
        BatchStatus::Validating => validate::validate(state, batch).await,
        BatchStatus::InProgress | BatchStatus::Cancelling => progress::progress(state, batch).await,
        BatchStatus::Finalizing => finalize::finalize(state, batch).await,
        _ => Ok(()),
    }
}
