//! `finalizing`: read the input file again and write the output and error
//! files in input order, one job's output in memory at a time, then record
//! the batch's end.

use std::collections::HashMap;
use std::time::{Instant, SystemTime};

use anyhow::{Context, Result, bail};
use serde_json::Value;
use sluice_schemas::{ErrorCode, JobState, StatusRecord};

use super::chunks::line_job;
use super::input::{InputLines, read_request};
use super::lease::{Renewal, lease};
use super::trace;
use crate::batch_record::{BatchRecord, BatchStatus, ChunkState, Counts};
use crate::file_record::FileRecord;
use crate::objects::{Line as RawLine, ObjectWriter};
use crate::openai::{self, Line, Request, RequestError};
use crate::outputs::{Outputs, read_output};
use crate::state::{AppState, now};

const FINALIZING: &[BatchStatus] = &[BatchStatus::Finalizing];

pub async fn finalize(state: &AppState, batch: BatchRecord) -> Result<()> {
    if !lease(state, &batch.id, FINALIZING).await? {
        return Ok(());
    }
    let started = Instant::now();
    let began = SystemTime::now();
    let ending = Ending::of(&batch);
    let files = write_files(state, &batch, ending).await?;
    let (completed, failed) = (files.completed, files.failed);
    let file_ids = store_files(state, &batch, files).await?;
    let at = now();
    let finished = state
        .records
        .update::<BatchRecord, _>(&BatchRecord::key(&batch.id), |b| {
            (b.status == BatchStatus::Finalizing).then(|| {
                let mut next = BatchRecord {
                    status: ending.status,
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
                match ending.status {
                    BatchStatus::Cancelled => next.cancelled_at = Some(at),
                    BatchStatus::Expired => next.expired_at = Some(at),
                    _ => next.completed_at = Some(at),
                }
                next
            })
        })
        .await?;
    if let Some(finished) = finished {
        let status = ending.status;
        state
            .metrics
            .batch_ended(status, completed, failed, Some(started.elapsed()));
        trace::step(
            state,
            &finished,
            "sluice.openai_batch.finalize",
            began,
            Vec::new(),
        );
        trace::end(state, &finished);
        tracing::info!(batch = batch.id, status = ?status, completed, failed, "batch finalized");
        state
            .records
            .delete(&BatchRecord::active_key(&batch.id))
            .await?;
        // The chunks' inputs and outputs are copies of the input and output
        // files: nobody reads them once the batch has ended.
        if let Err(e) = super::sweep::remove_chunk_objects(state, &finished).await {
            tracing::warn!(
                batch = batch.id,
                error = format!("{e:#}"),
                "cannot remove the chunks' objects; the retention sweep will"
            );
        }
    }
    Ok(())
}

/// How the batch ends, and what a line that never ran says.
#[derive(Clone, Copy)]
struct Ending {
    status: BatchStatus,
    unrun_code: &'static str,
    unrun_message: &'static str,
}

impl Ending {
    fn of(batch: &BatchRecord) -> Ending {
        let status = if batch.cancelling_at.is_some() {
            BatchStatus::Cancelled
        } else if batch.expired_at.is_some() {
            BatchStatus::Expired
        } else {
            BatchStatus::Completed
        };
        let (unrun_code, unrun_message) = match status {
            BatchStatus::Cancelled => (
                "batch_cancelled",
                "This request was not run: the batch was cancelled.",
            ),
            _ => (
                "batch_expired",
                "This request was not run: the batch's completion window ended first.",
            ),
        };
        Ending {
            status,
            unrun_code,
            unrun_message,
        }
    }
}

/// The output and error files being written, and their line counts.
struct Files {
    output_id: String,
    error_id: String,
    output: ObjectWriter,
    errors: ObjectWriter,
    completed: u64,
    failed: u64,
}

/// One pass over the input: each request's answer to the output file, or
/// its error to the error file, in input order.
async fn write_files(state: &AppState, batch: &BatchRecord, ending: Ending) -> Result<Files> {
    let hex = batch.id.trim_start_matches("batch_");
    let (output_id, error_id) = (format!("file-{hex}-output"), format!("file-{hex}-errors"));
    let mut files = Files {
        output: ObjectWriter::new(&state.s3, state.bucket(), &state.file_key(&output_id)),
        errors: ObjectWriter::new(&state.s3, state.bucket(), &state.file_key(&error_id)),
        output_id,
        error_id,
        completed: 0,
        failed: 0,
    };
    let mut renewal = Renewal::new();
    let mut input = InputLines::open(state, batch).await?;
    let mut jobs = LineJobs::default();
    let created = now();
    while let Some((line_no, raw)) = input.next().await? {
        renewal.keep(state, &batch.id, FINALIZING).await?;
        let RawLine::Text(text) = raw else { continue };
        let Ok(line) = read_request(state, &text) else {
            continue;
        };
        let request_id = format!("batch_req_{hex}_{line_no}");
        let (custom_id, request) = match line {
            Line::Fail { custom_id, error } => {
                let line = openai::output_line(&request_id, &custom_id, error.status, error.body());
                write_line(&mut files.errors, &line).await?;
                files.failed += 1;
                continue;
            }
            Line::Run { custom_id, request } => (custom_id, request),
        };
        let (job_id, record) = jobs.record(state, batch, line_no).await?;
        match record.as_ref().map(|r| r.state) {
            Some(JobState::Done) => {
                let record = record.as_ref().context("checked")?;
                let answers = jobs.answers(state, &job_id, record).await?;
                let body = answers.body(&request.model, &request, &request_id, created)?;
                let line = openai::output_line(&request_id, &custom_id, 200, body);
                write_line(&mut files.output, &line).await?;
                files.completed += 1;
            }
            Some(JobState::Failed) => {
                let (code, message) = record
                    .and_then(|r| r.error)
                    .map_or((ErrorCode::Internal, "the job failed".to_string()), |e| {
                        (e.code, e.message)
                    });
                let callers_url = request.audio.as_ref().is_some_and(|a| a.callers_url);
                let message = crate::job_errors::for_client(&job_id, code, &message, callers_url);
                let error = RequestError {
                    status: openai::http_status(code),
                    code: code.as_str(),
                    message: message.into_owned(),
                    param: None,
                };
                let line = openai::output_line(&request_id, &custom_id, error.status, error.body());
                write_line(&mut files.errors, &line).await?;
                files.failed += 1;
            }
            _ => {
                let line = openai::unrun_line(
                    &request_id,
                    &custom_id,
                    ending.unrun_code,
                    ending.unrun_message,
                );
                write_line(&mut files.errors, &line).await?;
                files.failed += 1;
            }
        }
    }
    Ok(files)
}

/// The jobs that answered the lines, looked up as the lines go by: the
/// chunk of the current line, its status record (the chunk's, or the
/// line's own after a split) and the output of the last done job read.
#[derive(Default)]
struct LineJobs {
    chunk_index: usize,
    statuses: HashMap<String, Option<StatusRecord>>,
    answers: Option<(String, Answers)>,
}

impl LineJobs {
    /// The job that answered line `line_no`, and its status record.
    async fn record(
        &mut self,
        state: &AppState,
        batch: &BatchRecord,
        line_no: u64,
    ) -> Result<(String, Option<StatusRecord>)> {
        while batch
            .chunks
            .get(self.chunk_index)
            .is_some_and(|c| c.last_line < line_no)
        {
            self.chunk_index += 1;
        }
        let Some(chunk) = batch
            .chunks
            .get(self.chunk_index)
            .filter(|c| c.first_line <= line_no)
        else {
            bail!("line {line_no} of batch {} is in no chunk", batch.id);
        };
        let job_id = match chunk.state {
            ChunkState::Split => line_job(&chunk.job_id, line_no),
            _ => chunk.job_id.clone(),
        };
        if !self.statuses.contains_key(&job_id) {
            if chunk.state != ChunkState::Split {
                self.statuses.clear();
            }
            let record = state.statuses_of(&batch.tenant).view(&job_id).await?;
            self.statuses.insert(job_id.clone(), record);
        }
        let record = self.statuses.get(&job_id).cloned().flatten();
        Ok((job_id, record))
    }

    /// The answers of `job_id` (done: `record`), read from S3 when it is
    /// not the job read last.
    async fn answers(
        &mut self,
        state: &AppState,
        job_id: &str,
        record: &StatusRecord,
    ) -> Result<&mut Answers> {
        if self.answers.as_ref().is_none_or(|(id, _)| id != job_id) {
            let output = record
                .output
                .as_ref()
                .context("a done chunk has no output object")?;
            let tokens = record
                .usage
                .as_ref()
                .map(|u| u.item_tokens.clone())
                .unwrap_or_default();
            let outputs = read_output(state, job_id, output, tokens).await?;
            self.answers = Some((job_id.to_string(), Answers { outputs, next: 0 }));
        }
        let (_, answers) = self.answers.as_mut().context("loaded")?;
        Ok(answers)
    }
}

/// A done job's answers, handed out request by request.
struct Answers {
    outputs: Outputs,
    next: usize,
}

impl Answers {
    fn body(&mut self, model: &str, request: &Request, id: &str, created: i64) -> Result<Value> {
        let n = request.items.len();
        let first = self.next;
        self.next += n;
        let (share, used) = self.outputs.share(first, n)?;
        openai::answer_body(request, id, model, created, share, used).map_err(anyhow::Error::msg)
    }
}

/// Stores the files that have lines (the empty ones are dropped): their ids,
/// output then errors.
async fn store_files(
    state: &AppState,
    batch: &BatchRecord,
    files: Files,
) -> Result<[Option<String>; 2]> {
    let mut ids = [None, None];
    let written = [
        (files.output, files.output_id, "output"),
        (files.errors, files.error_id, "errors"),
    ];
    for (slot, (writer, id, name)) in ids.iter_mut().zip(written) {
        if writer.is_empty() {
            writer.abort().await;
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
            expires_at: crate::lifecycle::expires_at(
                now(),
                batch.output_expires_after,
                state.config.retention_days,
            ),
        };
        state.records.put_owned(&id, &file).await?;
        *slot = Some(id);
    }
    Ok(ids)
}

async fn write_line(writer: &mut ObjectWriter, line: &Value) -> Result<()> {
    let mut bytes = serde_json::to_vec(line)?;
    bytes.push(b'\n');
    writer.write(&bytes).await
}
