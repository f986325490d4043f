//! The sweeper every gateway runs: it removes the files whose expiry has
//! passed and the batch records past their retention, as
//! [`lifecycle::plan`] decides, and an ended batch's chunk objects.

use std::time::Duration;

use anyhow::Result;

use super::chunks::line_job;
use crate::batch_record::{BatchRecord, ChunkState};
use crate::file_record::FileRecord;
use crate::lifecycle::{self, Sweep};
use crate::objects;
use crate::state::{AppState, now};

/// Whether the file `id` is the input of a batch that has not ended.
pub async fn in_use_by(state: &AppState, file_id: &str) -> Result<Option<String>> {
    for id in state.records.ids("active.").await? {
        if let Some(batch) = state
            .records
            .get::<BatchRecord>(&BatchRecord::key(&id))
            .await?
            && !batch.status.is_final()
            && batch.input_file_id == file_id
        {
            return Ok(Some(batch.id));
        }
    }
    Ok(None)
}

/// Runs the sweeper every `--sweep-interval-secs` until the process ends.
pub fn spawn(state: AppState) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(state.config.sweep_interval_secs));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if let Err(e) = sweep(&state).await {
                tracing::warn!(error = format!("{e:#}"), "sweep failed; will retry");
            }
        }
    })
}

/// One sweep: reads every file and batch record, removes what [`lifecycle::plan`]
/// says.
pub async fn sweep(state: &AppState) -> Result<Sweep> {
    let mut files = Vec::new();
    for id in state.records.ids("file.").await? {
        if let Some(f) = state
            .records
            .get::<FileRecord>(&FileRecord::key(&id))
            .await?
        {
            files.push(f);
        }
    }
    let mut batches = Vec::new();
    for id in state.records.ids("batch.").await? {
        if let Some(b) = state
            .records
            .get::<BatchRecord>(&BatchRecord::key(&id))
            .await?
        {
            batches.push(b);
        }
    }
    let config = &state.config;
    let sweep = lifecycle::plan(
        now(),
        &files,
        &batches,
        config.expiry_grace_secs as i64,
        config.retention_days,
    );
    for id in &sweep.files {
        objects::delete(&state.s3, state.bucket(), &state.file_key(id)).await?;
        state.records.delete(&FileRecord::key(id)).await?;
        tracing::info!(file = id, "expired file removed");
    }
    for id in &sweep.batches {
        if let Some(batch) = batches.iter().find(|b| &b.id == id) {
            remove_chunk_objects(state, batch).await?;
        }
        state.records.delete(&BatchRecord::key(id)).await?;
        tracing::info!(batch = id, "batch record removed after the retention");
    }
    Ok(sweep)
}

/// Removes an ended batch's chunk inputs and its chunk jobs' outputs
/// (copies of its input and output files). Deletes are idempotent.
pub async fn remove_chunk_objects(state: &AppState, batch: &BatchRecord) -> Result<()> {
    for chunk in &batch.chunks {
        let mut jobs = vec![chunk.job_id.clone()];
        if chunk.state == ChunkState::Split {
            jobs.extend((chunk.first_line..=chunk.last_line).map(|n| line_job(&chunk.job_id, n)));
        }
        for job in jobs {
            if let Some(output) = state.statuses.view(&job).await?.and_then(|r| r.output) {
                if crate::outputs::is_job_output(state, &job, &output) {
                    objects::delete(&state.s3, &output.bucket, &output.key).await?;
                } else {
                    tracing::warn!(
                        job,
                        bucket = output.bucket,
                        key = output.key,
                        "a chunk job's record names an output that is not where the consumers write its outputs; not deleted"
                    );
                }
            }
            objects::delete(&state.s3, state.bucket(), &state.chunk_key(&job)).await?;
        }
    }
    Ok(())
}
