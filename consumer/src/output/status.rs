//! The job status records in the status KV bucket, written by
//! compare-and-swap so a stale delivery can never move a final status back.

use async_nats::jetstream::kv;
use sluice_schemas::StatusRecord;

use super::results::queue;
use crate::error::JobError;

pub struct StatusStore {
    pub kv: kv::Store,
}

impl StatusStore {
    pub async fn get(&self, job_id: &str) -> Result<Option<StatusRecord>, JobError> {
        let entry = self
            .kv
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
    pub async fn swap<F>(
        &self,
        job_id: &str,
        mut decide: F,
    ) -> Result<(Option<StatusRecord>, Option<StatusRecord>), JobError>
    where
        F: FnMut(Option<&StatusRecord>) -> Option<StatusRecord>,
    {
        for _ in 0..16 {
            let entry = self
                .kv
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
                    .kv
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
                    .kv
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
    /// must not answer the job again. A write whose reply was lost is read
    /// back before it counts as failed.
    pub async fn finish(&self, record: &StatusRecord) -> Result<bool, JobError> {
        match self.finish_once(record).await {
            Err(error) => self.confirm_after_error(record, error).await,
            written => written,
        }
    }

    /// A write whose reply was lost (the stream's leader changed, a timeout)
    /// may still have been stored. Reads the record back, up to 5 times a
    /// second apart, and counts the write as this one's if the final record
    /// there is exactly `record` (same state, attempt, sequence and time):
    /// otherwise the redelivery would find the job final, take it as
    /// answered, and its result would never be published. A record that is
    /// not final means the write did not land; the caller retries the job.
    async fn confirm_after_error(
        &self,
        record: &StatusRecord,
        error: JobError,
    ) -> Result<bool, JobError> {
        for _ in 0..5 {
            tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            match self.get(&record.job_id).await {
                Ok(Some(current)) if current.state.is_final() => {
                    return Ok(current.state == record.state
                        && current.attempts == record.attempts
                        && current.stream_sequence == record.stream_sequence
                        && current.updated_at == record.updated_at);
                }
                Ok(_) => return Err(error),
                Err(_) => continue,
            }
        }
        Err(error)
    }

    async fn finish_once(&self, record: &StatusRecord) -> Result<bool, JobError> {
        let (written, _) = self
            .swap(&record.job_id, |current| {
                let done = current.is_some_and(|r| r.state.is_final());
                (!done).then(|| StatusRecord {
                    replays: current.map_or(record.replays, |r| r.replays),
                    ..record.clone()
                })
            })
            .await?;
        Ok(written.is_some())
    }
}
