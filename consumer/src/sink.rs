//! The sink: writes outputs (inline, or to S3 at a key derived from the job id
//! so a redelivered job overwrites rather than duplicates), publishes results
//! to the job's reply subject, keeps the status record, and dead-letters.

use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream::{self, kv};
use aws_sdk_s3::presigning::PresigningConfig;
use aws_sdk_s3::primitives::ByteStream;
use sha2::{Digest, Sha256};
use sluice_schemas::names::headers;
use sluice_schemas::{
    DeadLetter, ErrorCode, Generation, JobResult, Outcome, Output, S3Output, StatusRecord,
};

use crate::error::JobError;
use crate::npy;

pub struct Sink {
    pub s3: aws_sdk_s3::Client,
    pub bucket: String,
    pub prefix: String,
    pub inline_max_bytes: u64,
    pub nats: async_nats::Client,
    pub js: jetstream::Context,
    pub status: kv::Store,
}

fn storage(e: impl std::fmt::Display) -> JobError {
    JobError::new(ErrorCode::StorageUnavailable, e.to_string())
}

/// Status and result writes go to NATS; a failure there is retried like storage.
fn queue(what: &str, e: impl std::fmt::Display) -> JobError {
    JobError::new(ErrorCode::StorageUnavailable, format!("{what}: {e}"))
}

impl Sink {
    /// The S3 key of a job's output in `format` (`npy`, `jsonl`).
    pub fn output_key(&self, job_id: &str, format: &str) -> String {
        format!("{}{job_id}.{format}", self.prefix)
    }

    /// Puts the vectors inline when small, else into S3 as `.npy`.
    pub async fn store_embeddings(
        &self,
        job_id: &str,
        vectors: Vec<Vec<f32>>,
        dim: usize,
        presign_get_secs: Option<u32>,
    ) -> Result<Output, JobError> {
        let raw_bytes = (vectors.len() * dim * 4) as u64;
        if raw_bytes <= self.inline_max_bytes {
            return Ok(Output::embeddings(vectors));
        }
        let rows = vectors.len() as u64;
        let body = npy::encode_f32(&vectors, dim);
        drop(vectors);
        self.put(
            job_id,
            body,
            "npy",
            "application/octet-stream",
            vec![rows, dim as u64],
            presign_get_secs,
        )
        .await
    }

    /// Puts the generations inline when their JSON is small, else into S3
    /// as JSONL (one generation object per line, in item order).
    pub async fn store_generations(
        &self,
        job_id: &str,
        generations: Vec<Generation>,
        presign_get_secs: Option<u32>,
    ) -> Result<Output, JobError> {
        let mut body = Vec::new();
        for g in &generations {
            serde_json::to_writer(&mut body, g).map_err(|e| {
                JobError::new(ErrorCode::Internal, format!("encoding a generation: {e}"))
            })?;
            body.push(b'\n');
        }
        if body.len() as u64 <= self.inline_max_bytes {
            return Ok(Output::generations(generations));
        }
        drop(generations);
        self.put(
            job_id,
            body,
            "jsonl",
            "application/x-ndjson",
            Vec::new(),
            presign_get_secs,
        )
        .await
    }

    /// Writes a job's output object (keyed by the job id, so a redelivery
    /// overwrites it) and describes it.
    async fn put(
        &self,
        job_id: &str,
        body: Vec<u8>,
        format: &str,
        content_type: &str,
        shape: Vec<u64>,
        presign_get_secs: Option<u32>,
    ) -> Result<Output, JobError> {
        let sha256 = hex::encode(Sha256::digest(&body));
        let key = self.output_key(job_id, format);
        let bytes = body.len() as u64;
        self.s3
            .put_object()
            .bucket(&self.bucket)
            .key(&key)
            .content_type(content_type)
            .metadata("sha256", &sha256)
            .body(ByteStream::from(body))
            .send()
            .await
            .map_err(|e| {
                storage(format!(
                    "writing s3://{}/{key}: {}",
                    self.bucket,
                    aws_sdk_s3::error::DisplayErrorContext(e)
                ))
            })?;
        let url = match presign_get_secs {
            Some(secs) => Some(self.presign_get(&key, secs).await?),
            None => None,
        };
        Ok(Output::S3(S3Output {
            bucket: self.bucket.clone(),
            key,
            bytes,
            sha256,
            format: format.into(),
            shape,
            url,
        }))
    }

    async fn presign_get(&self, key: &str, secs: u32) -> Result<String, JobError> {
        let config =
            PresigningConfig::expires_in(Duration::from_secs(u64::from(secs))).map_err(|e| {
                JobError::new(
                    ErrorCode::InvalidParameters,
                    format!("output.presign_get_secs: {e}"),
                )
            })?;
        let req = self
            .s3
            .get_object()
            .bucket(&self.bucket)
            .key(key)
            .presigned(config)
            .await
            .map_err(|e| storage(format!("presigning s3://{}/{key}: {e}", self.bucket)))?;
        Ok(req.uri().to_string())
    }

    /// Publishes the result (core NATS) to `reply_to`, with the trace context.
    pub async fn publish_result(
        &self,
        reply_to: &str,
        result: &JobResult,
        traceparent: Option<&str>,
    ) -> Result<(), JobError> {
        let mut h = HeaderMap::new();
        h.insert(headers::JOB_ID, result.job_id.as_str());
        let outcome = match &result.outcome {
            Outcome::Ok { .. } => "ok",
            Outcome::Error { error } => error.code.as_str(),
        };
        h.insert(headers::OUTCOME, outcome);
        if let Some(tp) = traceparent {
            h.insert(headers::TRACEPARENT, tp);
        }
        let payload = serde_json::to_vec(result).map_err(|e| queue("encoding the result", e))?;
        self.nats
            .publish_with_headers(reply_to.to_string(), h, payload.into())
            .await
            .map_err(|e| queue("publishing the result", e))?;
        Ok(())
    }

    pub async fn get_status(&self, job_id: &str) -> Result<Option<StatusRecord>, JobError> {
        let entry = self
            .status
            .get(job_id)
            .await
            .map_err(|e| queue("reading the status record", e))?;
        Ok(entry.and_then(|bytes| serde_json::from_slice(&bytes).ok()))
    }

    /// Updates a job's status by compare-and-swap: `decide` sees the current
    /// record and returns the one to write, or None to leave it. Retries when
    /// another writer got in between, so the decision is always made on what
    /// is really there. Returns the record written (None when left) and the
    /// record `decide` last saw.
    pub async fn swap_status<F>(
        &self,
        job_id: &str,
        mut decide: F,
    ) -> Result<(Option<StatusRecord>, Option<StatusRecord>), JobError>
    where
        F: FnMut(Option<&StatusRecord>) -> Option<StatusRecord>,
    {
        for _ in 0..16 {
            let entry = self
                .status
                .entry(job_id)
                .await
                .map_err(|e| queue("reading the status record", e))?;
            let live = entry.as_ref().filter(|e| e.operation == kv::Operation::Put);
            let current = live.and_then(|e| serde_json::from_slice::<StatusRecord>(&e.value).ok());
            let Some(next) = decide(current.as_ref()) else {
                return Ok((None, current));
            };
            let payload = serde_json::to_vec(&next).map_err(|e| queue("encoding the status", e))?;
            let written = match live {
                Some(e) => self
                    .status
                    .update(job_id, payload.into(), e.revision)
                    .await
                    .map(|_| ())
                    .map_err(|e| {
                        (
                            e.kind() == kv::UpdateErrorKind::WrongLastRevision,
                            e.to_string(),
                        )
                    }),
                None => self
                    .status
                    .create(job_id, payload.into())
                    .await
                    .map(|_| ())
                    .map_err(|e| {
                        (
                            e.kind() == kv::CreateErrorKind::AlreadyExists,
                            e.to_string(),
                        )
                    }),
            };
            match written {
                Ok(()) => return Ok((Some(next), current)),
                Err((true, _)) => continue, // someone wrote in between: decide again
                Err((false, e)) => return Err(queue("writing the status record", e)),
            }
        }
        Err(queue(
            "writing the status record",
            "too much contention on the key",
        ))
    }

    /// Writes a final status unless one is already there. Of two deliveries
    /// of one job running at once (a stale Nak or an ack timeout can cause
    /// that), only one finishes it. Returns whether this write won; the loser
    /// must not answer the job again.
    pub async fn finish_status(&self, record: &StatusRecord) -> Result<bool, JobError> {
        let (written, _) = self
            .swap_status(&record.job_id, |current| {
                let done = current.is_some_and(|r| r.state.is_final());
                (!done).then(|| StatusRecord {
                    replays: current.map_or(record.replays, |r| r.replays),
                    ..record.clone()
                })
            })
            .await?;
        Ok(written.is_some())
    }

    /// Publishes a dead letter and waits for the stream to store it. The
    /// message id makes a retry of this step idempotent.
    pub async fn dead_letter(&self, subject: String, letter: &DeadLetter) -> Result<(), JobError> {
        let mut h = HeaderMap::new();
        h.insert(
            headers::MSG_ID,
            format!("dlq-{}-{}", letter.stream_sequence, letter.attempts).as_str(),
        );
        if let Some(id) = &letter.job_id {
            h.insert(headers::JOB_ID, id.as_str());
        }
        let payload =
            serde_json::to_vec(letter).map_err(|e| queue("encoding the dead letter", e))?;
        self.js
            .publish_with_headers(subject, h, payload.into())
            .await
            .map_err(|e| queue("publishing the dead letter", e))?
            .await
            .map_err(|e| queue("storing the dead letter", e))?;
        Ok(())
    }
}
