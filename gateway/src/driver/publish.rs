//! A chunk's (or a split line's) job: its input written to S3 and the job
//! published, once: a job that already has a status record is never
//! published again.

use std::time::Duration;

use anyhow::{Context, Result};
use aws_sdk_s3::presigning::PresigningConfig;
use sluice_schemas::{
    EmbedParameters, ErrorCode, ErrorInfo, Input, InputFormat, Job, ObjectRef, OutputOptions,
    Parameters, Task, TranscribeParameters, VERSION,
};

use super::chunks::{self, OpenChunk};
use super::input::runnable_lines;
use crate::batch_record::{BatchRecord, Chunk, ChunkState};
use crate::file_record::FileRecord;
use crate::objects::ObjectWriter;
use crate::state::AppState;

/// Writes chunk number `index`'s input to S3: the chunk, pending.
pub async fn write_chunk(
    state: &AppState,
    batch_id: &str,
    index: usize,
    chunk: OpenChunk,
) -> Result<Chunk> {
    let job_id = chunks::chunk_job(batch_id, chunk.task, index);
    write_input(state, &job_id, &chunk.body).await?;
    Ok(Chunk {
        job_id,
        model: chunk.model,
        prompt_name: chunk.prompt_name,
        first_line: chunk.first_line,
        last_line: chunk.last_line,
        lines: chunk.lines,
        state: ChunkState::Pending,
    })
}

async fn write_input(state: &AppState, job_id: &str, body: &[u8]) -> Result<()> {
    let mut writer = ObjectWriter::new(&state.s3, state.bucket(), &state.chunk_key(job_id));
    writer.write(body).await?;
    writer.finish().await?;
    Ok(())
}

/// Runs a failed chunk again as one job per line.
pub async fn split(state: &AppState, batch: &BatchRecord, chunk: &Chunk) -> Result<()> {
    for (line, _, request) in
        runnable_lines(state, batch, chunk.first_line, chunk.last_line).await?
    {
        let job_id = chunks::line_job(&chunk.job_id, line);
        if state
            .statuses_of(&batch.tenant)
            .get(&job_id)
            .await?
            .is_some()
        {
            continue;
        }
        let mut body = Vec::new();
        chunks::append_items(&mut body, &request.items);
        write_input(state, &job_id, &body).await?;
        publish(state, batch, chunk, &job_id).await?;
    }
    Ok(())
}

/// How long past a job's deadline its input's URL stays valid: a fetch
/// that starts just before the deadline (the consumer checks it before it
/// fetches) still finishes.
pub const PRESIGN_PAST_DEADLINE: Duration = Duration::from_secs(300);

/// The lifetime of a chunk input's presigned URL: `--presign-secs`, but no
/// longer than the job can run (its deadline, the batch's window end, and
/// [`PRESIGN_PAST_DEADLINE`]); a URL that outlives its job is a key to the
/// tenant's data for whoever saw the job message.
pub fn presign_lifetime(
    now: time::OffsetDateTime,
    deadline: Option<time::OffsetDateTime>,
    max_secs: u64,
) -> Duration {
    let max = Duration::from_secs(max_secs);
    let Some(deadline) = deadline else {
        return max;
    };
    let left = Duration::try_from(deadline - now).unwrap_or(Duration::ZERO);
    max.min(left + PRESIGN_PAST_DEADLINE)
}

/// Publishes the job `job_id` (the chunk's own, or one of its lines' after
/// a split) unless it already has a status record.
pub async fn publish(
    state: &AppState,
    batch: &BatchRecord,
    chunk: &Chunk,
    job_id: &str,
) -> Result<()> {
    if state
        .statuses_of(&batch.tenant)
        .get(job_id)
        .await?
        .is_some()
    {
        return Ok(());
    }
    let task = chunks::chunk_task(&chunk.job_id);
    let key = state.chunk_key(job_id);
    let now = time::OffsetDateTime::now_utc();
    let deadline = time::OffsetDateTime::from_unix_timestamp(batch.expires_at).ok();
    if deadline.is_some_and(|d| d <= now) {
        // The window ended: the job would only expire in the queue. Without
        // a record, `progress` stops it and counts its lines as not run.
        return Ok(());
    }
    let lifetime = presign_lifetime(now, deadline, state.config.presign_secs);
    let mut parameters = Parameters {
        embed: EmbedParameters {
            prompt_name: chunk.prompt_name.clone(),
            normalize: crate::openai::unit_vectors(task),
        },
        ..Parameters::default()
    };
    let input = if task == Task::Transcribe {
        match audio_input(state, batch, &key, lifetime).await? {
            Ok((input, transcribe)) => {
                parameters.transcribe = transcribe;
                input
            }
            Err(refused) => {
                // Never published: the job fails as the consumer would
                // fail it, and the line gets the error.
                fail_unpublished(state, batch, job_id, deadline, refused).await?;
                return Ok(());
            }
        }
    } else {
        Input::Url {
            url: presign(state, &key, lifetime).await?,
            format: InputFormat::Jsonl,
            object: Some(ObjectRef {
                bucket: state.bucket().to_string(),
                key,
            }),
        }
    };
    let job = Job {
        version: VERSION,
        id: job_id.to_string(),
        task: task.as_str().into(),
        model: chunk.model.clone(),
        inputs: vec![input],
        parameters,
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
    let route = state
        .models
        .route(
            &job,
            // A batch is throughput work with hours to finish: it yields to
            // normal and high jobs but keeps its guaranteed share.
            sluice_schemas::Priority::Low,
            // As the API key's tenant: tenants share the consumers' tokens.
            Some(&batch.tenant),
        )
        .await?;
    sluice_producer::publish(
        &state.js,
        &state.topology,
        &state.statuses,
        &job,
        &route,
        &reply_to,
        batch.traceparent.as_deref(),
    )
    .await?;
    Ok(())
}

/// A GET URL of `key` in the bucket, for `lifetime`.
async fn presign(state: &AppState, key: &str, lifetime: Duration) -> Result<String> {
    let presigned = state
        .s3
        .get_object()
        .bucket(state.bucket())
        .key(key)
        .presigned(PresigningConfig::expires_in(lifetime)?)
        .await
        .with_context(|| format!("presigning {key}"))?;
    Ok(presigned.uri().to_string())
}

/// A transcription line's recording as its job's input, from the chunk's
/// one item (`openai/transcriptions.rs`'s `batch_item`): a file of the
/// batch's tenant (presigned for `lifetime`) or an https URL, with the
/// line's parameters; a file that is not the tenant's (or has expired) is
/// refused (`invalid_parameters`, naming it) and never presigned.
async fn audio_input(
    state: &AppState,
    batch: &BatchRecord,
    chunk_key: &str,
    lifetime: Duration,
) -> Result<Result<(Input, TranscribeParameters), ErrorInfo>> {
    let body = crate::objects::read_all(&state.s3, state.bucket(), chunk_key).await?;
    let item: serde_json::Value = body
        .split(|b| *b == b'\n')
        .find(|l| !l.is_empty())
        .map(serde_json::from_slice)
        .transpose()?
        .context("a transcription chunk without its item")?;
    let transcribe = TranscribeParameters {
        language: item["language"].as_str().map(str::to_string),
        translate: item["translate"].as_bool(),
    };
    if let Some(url) = item["audio_url"].as_str() {
        let input = Input::Url {
            url: url.to_string(),
            format: InputFormat::Audio,
            object: None,
        };
        return Ok(Ok((input, transcribe)));
    }
    let id = item["audio_file"].as_str().unwrap_or_default();
    let file = state
        .records
        .owned::<FileRecord>(&batch.tenant, id)
        .await?
        .filter(|f| !f.expired(crate::state::now()));
    if file.is_none() {
        // The caller's mistake, so its message reaches the caller.
        return Ok(Err(ErrorInfo::new(
            ErrorCode::InvalidParameters,
            format!("`file`: the recording {id} is not one of your files (or it has expired)"),
        )));
    }
    let key = state.file_key(id);
    let input = Input::Url {
        url: presign(state, &key, lifetime).await?,
        format: InputFormat::Audio,
        object: Some(ObjectRef {
            bucket: state.bucket().to_string(),
            key,
        }),
    };
    Ok(Ok((input, transcribe)))
}

/// Records job `job_id` failed with `error` without publishing it.
async fn fail_unpublished(
    state: &AppState,
    batch: &BatchRecord,
    job_id: &str,
    deadline: Option<time::OffsetDateTime>,
    error: ErrorInfo,
) -> Result<()> {
    state
        .statuses_of(&batch.tenant)
        .finish(&sluice_schemas::StatusRecord {
            version: VERSION,
            job_id: job_id.to_string(),
            state: sluice_schemas::JobState::Failed,
            updated_at: time::OffsetDateTime::now_utc(),
            attempts: 0,
            stream_sequence: None,
            output: None,
            error: Some(error),
            replays: 0,
            usage: None,
            deadline,
            answered: Vec::new(),
        })
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use time::macros::datetime;

    #[test]
    fn a_urls_lifetime_ends_soon_after_its_jobs_deadline() {
        let now = datetime!(2026-12-07 00:00 UTC);
        let week = 7 * 24 * 3600;
        let table = [
            // (deadline, --presign-secs, lifetime in seconds)
            (Some(now + time::Duration::hours(24)), week, 24 * 3600 + 300),
            (Some(now + time::Duration::minutes(10)), week, 600 + 300),
            (Some(now + time::Duration::hours(24)), 3600, 3600),
            (Some(now - time::Duration::minutes(1)), week, 300),
            (None, week, week),
        ];
        for (deadline, max, secs) in table {
            assert_eq!(
                presign_lifetime(now, deadline, max),
                Duration::from_secs(secs),
                "{deadline:?} {max}"
            );
        }
    }
}
