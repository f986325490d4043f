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
    /// must not answer the job again.
    pub async fn finish(&self, record: &StatusRecord) -> Result<bool, JobError> {
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
