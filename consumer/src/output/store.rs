//! Job outputs: inline in the result when small, else an object in S3,
//! described by its size, SHA-256 and shape.
//!
//! Each delivery writes its own object, `<prefix><job id>.<stream
//! sequence>-<attempt>.<format>`: two deliveries of one job can both run
//! (one that stalled past its ack wait, and its redelivery), and their
//! outputs may differ in bytes (batches of different composition pad
//! differently). Only the delivery whose `finish` wins is answered, and its
//! object is the one the record and the result name; a losing delivery
//! deletes its own object ([`OutputStore::discard`]) and can never replace
//! the answered one.

use std::time::Duration;

use aws_sdk_s3::presigning::PresigningConfig;
use aws_sdk_s3::primitives::ByteStream;
use sha2::{Digest, Sha256};
use sluice_schemas::{ErrorCode, ObjectRef, Output, OutputOptions, S3Output};

use crate::error::JobError;

pub struct OutputStore {
    pub s3: aws_sdk_s3::Client,
    pub bucket: String,
    pub prefix: String,
    pub inline_max_bytes: u64,
}

/// A task's output as the object it becomes in S3.
pub struct OutputObject {
    pub body: Vec<u8>,
    /// The key's extension and the result's `format` (`npy`, `jsonl`).
    pub format: &'static str,
    pub content_type: &'static str,
    /// The array's shape, for an `.npy`; empty for JSONL.
    pub shape: Vec<u64>,
}

impl OutputObject {
    /// `items` as JSONL, one JSON value per line (`what` names one in the
    /// error, which only a type that cannot be JSON would give).
    pub fn jsonl<T: serde::Serialize>(items: &[T], what: &str) -> Result<OutputObject, JobError> {
        let mut body = Vec::new();
        for item in items {
            serde_json::to_writer(&mut body, item)
                .map_err(|e| JobError::new(ErrorCode::Internal, format!("encoding {what}: {e}")))?;
            body.push(b'\n');
        }
        Ok(OutputObject {
            body,
            format: "jsonl",
            content_type: "application/x-ndjson",
            shape: Vec::new(),
        })
    }
}

/// Which delivery of which job an output belongs to: it names the object.
#[derive(Debug, Clone, Copy)]
pub struct OutputOf<'a> {
    pub job_id: &'a str,
    pub stream_sequence: u64,
    pub attempt: u32,
}

impl OutputStore {
    /// The S3 key of a delivery's output in `format` (`npy`, `jsonl`).
    pub fn output_key(&self, of: OutputOf<'_>, format: &str) -> String {
        format!(
            "{}{}.{}-{}.{format}",
            self.prefix, of.job_id, of.stream_sequence, of.attempt
        )
    }

    /// Deletes the object a delivery wrote when that delivery is not the
    /// one answered (another finished the job first, or it was cancelled
    /// meanwhile). Best effort: an object left behind is never named by a
    /// result or a record (a bucket lifecycle rule on the prefix clears it).
    pub async fn discard(&self, key: &str) {
        if let Err(e) = self
            .s3
            .delete_object()
            .bucket(&self.bucket)
            .key(key)
            .send()
            .await
        {
            tracing::warn!(
                bucket = %self.bucket,
                key,
                error = %aws_sdk_s3::error::DisplayErrorContext(&e),
                "cannot delete the output of a delivery that was not answered; it is left behind"
            );
        }
    }

    /// Whether an output of `bytes` travels inline in the result: it is
    /// small (`--inline-max-bytes`) and its job did not ask for S3.
    pub fn fits_inline(&self, bytes: u64, options: &OutputOptions) -> bool {
        bytes <= self.inline_max_bytes && !options.always_s3()
    }

    /// A task's items as JSON: inline in the result (`inline` makes the
    /// output of them) when small (unless the job asked for S3), else one
    /// JSON line per item, in item order, in S3. `what` names an item in an
    /// error.
    pub async fn put_lines<T: serde::Serialize>(
        &self,
        of: OutputOf<'_>,
        items: Vec<T>,
        what: &str,
        inline: impl FnOnce(Vec<T>) -> Output,
        options: &OutputOptions,
    ) -> Result<Output, JobError> {
        let object = OutputObject::jsonl(&items, what)?;
        if self.fits_inline(object.body.len() as u64, options) {
            return Ok(inline(items));
        }
        drop(items);
        self.put(of, object, options).await
    }

    /// Writes this delivery's output object and describes it (with a
    /// presigned GET where the job asked for one).
    pub async fn put(
        &self,
        of: OutputOf<'_>,
        object: OutputObject,
        options: &OutputOptions,
    ) -> Result<Output, JobError> {
        let OutputObject {
            body,
            format,
            content_type,
            shape,
        } = object;
        let sha256 = hex::encode(Sha256::digest(&body));
        let key = self.output_key(of, format);
        let bytes = body.len() as u64;
        self.write(&key, body, content_type, Some(&sha256)).await?;
        let url = match options.presign_get_secs {
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

    /// Keeps a job message's payload that is too large to carry in its
    /// dead letter, at `<prefix>dead-letters/<stream sequence>.job` (one
    /// message is given up on once, so a retry writes the same object).
    pub async fn keep_dead_letter_payload(
        &self,
        stream_sequence: u64,
        payload: &[u8],
    ) -> Result<ObjectRef, JobError> {
        let key = format!("{}dead-letters/{stream_sequence}.job", self.prefix);
        self.write(&key, payload.to_vec(), "application/json", None)
            .await?;
        Ok(ObjectRef {
            bucket: self.bucket.clone(),
            key,
        })
    }

    /// Puts `body` at `key` in the output bucket (with its SHA-256 as
    /// metadata when given); a failure is `storage_unavailable`.
    async fn write(
        &self,
        key: &str,
        body: Vec<u8>,
        content_type: &str,
        sha256: Option<&str>,
    ) -> Result<(), JobError> {
        self.s3
            .put_object()
            .bucket(&self.bucket)
            .key(key)
            .content_type(content_type)
            .set_metadata(sha256.map(|h| [("sha256".to_string(), h.to_string())].into()))
            .body(ByteStream::from(body))
            .send()
            .await
            .map_err(|e| {
                let message = format!(
                    "writing s3://{}/{key}: {}",
                    self.bucket,
                    aws_sdk_s3::error::DisplayErrorContext(&e)
                );
                JobError::caused_by(ErrorCode::StorageUnavailable, message, e)
            })?;
        Ok(())
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
            .map_err(|e| {
                let message = format!("presigning s3://{}/{key}: {e}", self.bucket);
                JobError::caused_by(ErrorCode::StorageUnavailable, message, e)
            })?;
        Ok(req.uri().to_string())
    }
}
