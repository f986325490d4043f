//! The sweeper every gateway runs: it removes the files whose expiry has
//! passed and the batch records past their retention, as
//! [`lifecycle::plan`] decides, and an ended batch's chunk objects.

use std::collections::HashSet;
use std::time::Duration;

use anyhow::Result;

use super::chunks::line_job;
use crate::batch_record::{BatchRecord, ChunkState};
use crate::file_record::FileRecord;
use crate::lifecycle::{self, Sweep};
use crate::objects;
use crate::records::{Owned, index_key};
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
    mend_indexes(state, &files, &batches).await?;
    for id in &sweep.files {
        objects::delete(&state.s3, state.bucket(), &state.file_key(id)).await?;
        match files.iter().find(|f| &f.id == id) {
            Some(f) => {
                state
                    .records
                    .delete_owned::<FileRecord>(&f.tenant, id)
                    .await?
            }
            None => state.records.delete(&FileRecord::key(id)).await?,
        }
        tracing::info!(file = id, "expired file removed");
    }
    for id in &sweep.batches {
        match batches.iter().find(|b| &b.id == id) {
            Some(batch) => {
                remove_chunk_objects(state, batch).await?;
                state
                    .records
                    .delete_owned::<BatchRecord>(&batch.tenant, id)
                    .await?;
            }
            None => state.records.delete(&BatchRecord::key(id)).await?,
        }
        tracing::info!(batch = id, "batch record removed after the retention");
    }
    Ok(sweep)
}

/// How long an index entry may name a record that is not there before the
/// sweeper removes it: far longer than the moment between an entry and
/// its record being written.
const DANGLING_AFTER: Duration = Duration::from_secs(3600);

/// Each tenant's index as its records say: an entry written for a record
/// that has none (one older than the index), an entry whose record has
/// been gone for [`DANGLING_AFTER`] removed (a gateway that crashed between
/// the two writes).
async fn mend_indexes(
    state: &AppState,
    files: &[FileRecord],
    batches: &[BatchRecord],
) -> Result<()> {
    let entries: HashSet<String> = state
        .records
        .ids("tenant.")
        .await?
        .into_iter()
        .map(|rest| format!("tenant.{rest}"))
        .collect();
    let mut records = HashSet::new();
    let owned = files
        .iter()
        .map(|f| {
            (
                f.tenant.as_str(),
                <FileRecord as Owned>::KIND,
                f.id.as_str(),
            )
        })
        .chain(batches.iter().map(|b| {
            (
                b.tenant.as_str(),
                <BatchRecord as Owned>::KIND,
                b.id.as_str(),
            )
        }));
    for (tenant, kind, id) in owned {
        let entry = index_key(tenant, kind, id);
        if !entries.contains(&entry) {
            state.records.index(tenant, kind, id).await?;
            tracing::info!(
                tenant,
                kind,
                id,
                "index entry written for a record older than the index"
            );
        }
        records.insert(entry);
    }
    for key in entries.difference(&records) {
        if state
            .records
            .age(key)
            .await?
            .is_some_and(|age| age > DANGLING_AFTER)
        {
            state.records.delete(key).await?;
            tracing::info!(key, "index entry of a record that is gone removed");
        }
    }
    Ok(())
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
            if let Some(output) = state
                .statuses_of(&batch.tenant)
                .view(&job)
                .await?
                .and_then(|r| r.output)
            {
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
