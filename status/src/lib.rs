//! The job status record's one store. Every writer (the producer's submit,
//! the consumer, `sluice cancel`, `sluice dlq replay`) goes through a named
//! transition here, each a compare-and-swap on the record's KV revision that
//! retries when another writer got in between, so each decision is made on
//! what is really there:
//!
//! | transition | from | to | when the record is final |
//! | --- | --- | --- | --- |
//! | [`StatusStore::queue`] | nothing | `queued` | left (create-if-absent: a fast consumer's `running` wins) |
//! | [`StatusStore::start`] | nothing, `queued`, `running` | `running` (the stored deadline kept) | left; the caller answers from it |
//! | [`StatusStore::requeue`] | `running` (this message) | `queued`: waiting for its redelivery | left |
//! | [`StatusStore::finish`] | nothing, `queued`, `running` | `done`, `failed`, `cancelled` | left: the first final status wins |
//! | [`StatusStore::cancel`] | nothing, `queued`, `running` | `cancelled` | left |
//! | [`StatusStore::expire_orphan`] | `running` (this message) past its deadline, the message gone from the stream | `expired` | left |
//! | [`StatusStore::replay`] | nothing, `failed`, `cancelled`, `expired` | `queued`, replays + 1 | `done` is refused: it succeeded |
//! | [`StatusStore::claim_answer`] | not final: left | - | this delivery's claim added to `answered`, unless this message has one or a delivery of it finished the job |
//!
//! A delivery answers a job only from a transition it won: `finish` for
//! the outcome it wrote, `claim_answer` for a record someone else made
//! final (a cancelled job, one whose final status another message wrote).
//! So however many deliveries of one message race (an ack lost, a slow
//! link past the ack wait), the job is answered at most once.
//!
//! `replays` is carried through every transition. `expired` has no writer of
//! its own when the stream drops a job at its deadline: a `queued` record
//! whose deadline has passed *reads* as `expired`
//! ([`StatusRecord::as_of`]), in [`StatusStore::view`] and in the decisions of
//! `cancel`; a consumer that pulls a job after its deadline writes `expired`
//! through `finish`. A job given back for a retry is `queued` again
//! ([`StatusStore::requeue`]), so one whose deadline passes while it waits
//! reads `expired` too: the stream drops it then, and it never runs again.

use std::time::Duration;

use async_nats::jetstream::kv;
use sluice_schemas::{AnswerClaim, JobState, StatusRecord, VERSION};
use time::OffsetDateTime;

/// Why a status read or write failed. Each names the job and keeps the
/// server's error as its source.
#[derive(Debug, thiserror::Error)]
pub enum StatusError {
    #[error("reading the status record of {job_id}")]
    Read {
        job_id: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("writing the status record of {job_id}")]
    Write {
        job_id: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("the status record of {job_id} kept changing under 16 writes in a row")]
    Contention { job_id: String },
}

/// The key of `job_id`'s record for a job on `tenant`'s subjects (`None`:
/// a plain subject): see [`StatusStore`].
pub fn record_key(tenant: Option<&str>, job_id: &str) -> String {
    match tenant {
        Some(tenant) => format!("{tenant}.{job_id}"),
        None => job_id.to_string(),
    }
}

/// What [`StatusStore::start`] found.
#[derive(Debug, Clone, PartialEq)]
pub enum Start {
    /// The job is marked running: this record was written.
    Running(StatusRecord),
    /// The job's status is already final: it was answered (or cancelled)
    /// before; nothing was written.
    Final(StatusRecord),
}

/// What [`StatusStore::replay`] did.
#[derive(Debug, Clone, PartialEq)]
pub enum Replay {
    /// Queued again; the job's replay count is now this.
    Queued { replays: u32 },
    /// The job is `done`: replaying it would run it twice.
    AlreadyDone(Box<StatusRecord>),
}

/// The status records of one scope: the jobs of one tenant's subjects, or
/// those of the plain subjects.
///
/// A job published on a tenant's subject (`sluice.jobs.<task>.<level>.<tenant>`)
/// has its record under `<tenant>.<job id>`; a job on a plain subject under
/// `<job id>` (job ids have no dots, so the two never meet). The scope comes
/// from the subject, which NATS checks against the publisher's permissions,
/// never from the job's body or headers: a publisher allowed only
/// `sluice.jobs.*.*.acme` and `$KV.sluice-status.acme.>` reads and writes
/// the records of acme's jobs and no others, and no job it publishes makes
/// a consumer write another tenant's record (`deploy/nats/permissions.conf`).
#[derive(Clone)]
pub struct StatusStore {
    kv: kv::Store,
    scope: Option<String>,
}

impl StatusStore {
    /// The plain subjects' records.
    pub fn new(kv: kv::Store) -> StatusStore {
        StatusStore { kv, scope: None }
    }

    /// The records of the jobs on `tenant`'s subjects (`None`: the plain
    /// subjects').
    pub fn scoped(&self, tenant: Option<&str>) -> StatusStore {
        StatusStore {
            kv: self.kv.clone(),
            scope: tenant.map(str::to_string),
        }
    }

    /// Which tenant's records these are (`None`: the plain subjects').
    pub fn scope(&self) -> Option<&str> {
        self.scope.as_deref()
    }

    /// The key of `job_id`'s record in this scope.
    pub fn key(&self, job_id: &str) -> String {
        record_key(self.scope.as_deref(), job_id)
    }

    /// The core NATS subject every write of `job_id`'s record is published
    /// on (`$KV.<bucket>.<job id>`): a subscriber there sees each new
    /// revision as it is stored, with no consumer on the server.
    pub fn record_subject(&self, job_id: &str) -> String {
        format!("{}{}", self.kv.prefix, self.key(job_id))
    }

    /// Whether a message on [`StatusStore::record_subject`] stored a
    /// `cancelled` record (deletes and other states: false).
    pub fn is_cancelled_write(payload: &[u8]) -> bool {
        serde_json::from_slice::<StatusRecord>(payload)
            .is_ok_and(|r| r.state == JobState::Cancelled)
    }

    pub async fn get(&self, job_id: &str) -> Result<Option<StatusRecord>, StatusError> {
        let entry = self
            .kv
            .get(self.key(job_id))
            .await
            .map_err(|e| StatusError::Read {
                job_id: job_id.to_string(),
                source: Box::new(e),
            })?;
        Ok(entry.and_then(|bytes| serde_json::from_slice(&bytes).ok()))
    }

    /// The record as a reader takes it now: [`StatusStore::get`] with
    /// [`StatusRecord::as_of`] applied (a `queued` job past its deadline is
    /// `expired`). For readers (the CLI, the gateway); a writer deciding a
    /// transition works on what is stored.
    pub async fn view(&self, job_id: &str) -> Result<Option<StatusRecord>, StatusError> {
        Ok(self
            .get(job_id)
            .await?
            .map(|r| r.as_of(OffsetDateTime::now_utc())))
    }

    /// `queued`, unless the job has a record already (a consumer that was
    /// faster than the publisher's status write keeps its `running`).
    /// The job's `deadline`, if it has one, is kept so the record reads as
    /// `expired` once it passes. Returns whether this wrote it.
    pub async fn queue(
        &self,
        job_id: &str,
        stream_sequence: u64,
        deadline: Option<OffsetDateTime>,
    ) -> Result<bool, StatusError> {
        let record = StatusRecord {
            version: VERSION,
            job_id: job_id.to_string(),
            state: JobState::Queued,
            updated_at: OffsetDateTime::now_utc(),
            attempts: 0,
            stream_sequence: Some(stream_sequence),
            output: None,
            error: None,
            replays: 0,
            usage: None,
            deadline,
            answered: Vec::new(),
        };
        // One round trip (submit's hot path): written only if the key has
        // no revision yet, with no read. (`kv::Store::create` reads the key
        // back when one is there, to tell a deleted key from a live one;
        // status records are never deleted, and a tenant's publisher may
        // write its own records but read none: see `StatusStore`.)
        let payload = serde_json::to_vec(&record).map_err(|e| StatusError::Write {
            job_id: job_id.to_string(),
            source: Box::new(e),
        })?;
        match self.kv.update(self.key(job_id), payload.into(), 0).await {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == kv::UpdateErrorKind::WrongLastRevision => Ok(false),
            Err(e) => Err(StatusError::Write {
                job_id: job_id.to_string(),
                source: Box::new(e),
            }),
        }
    }

    /// `running` (as `record` says: attempt, sequence), unless the status is
    /// final: then the job was answered before and must not run again.
    pub async fn start(&self, record: &StatusRecord) -> Result<Start, StatusError> {
        let (written, seen) = self
            .swap(&record.job_id, |current| match current {
                Some(r) if r.state.is_final() => None,
                Some(r) => Some(StatusRecord {
                    replays: r.replays,
                    deadline: record.deadline.or(r.deadline),
                    ..record.clone()
                }),
                None => Some(record.clone()),
            })
            .await?;
        Ok(match (written, seen) {
            (Some(written), _) => Start::Running(written),
            (None, Some(seen)) => Start::Final(seen),
            // swap only declines to write over a final record.
            (None, None) => Start::Running(record.clone()),
        })
    }

    /// `queued` again, the deadline, attempts and sequence kept, when the
    /// record is `running` for delivery `attempt` of the message
    /// `stream_sequence`: the consumer gave the job back for a retry (a
    /// later delivery that already started is left running). Returns
    /// whether it was written.
    pub async fn requeue(
        &self,
        job_id: &str,
        stream_sequence: u64,
        attempt: u32,
    ) -> Result<bool, StatusError> {
        let (written, _) = self
            .swap(job_id, |current| match current {
                Some(r)
                    if r.state == JobState::Running
                        && r.stream_sequence == Some(stream_sequence)
                        && r.attempts == attempt =>
                {
                    Some(StatusRecord {
                        state: JobState::Queued,
                        updated_at: OffsetDateTime::now_utc(),
                        ..r.clone()
                    })
                }
                _ => None,
            })
            .await?;
        Ok(written.is_some())
    }

    /// `expired`, when the record is `running` for the message
    /// `stream_sequence`, its deadline has passed, and the caller has seen
    /// that the job stream no longer holds that message: a consumer started
    /// the job and stopped (killed, its machine lost) before finishing it,
    /// and the stream dropped the message at its deadline (`Nats-TTL`)
    /// before it could be redelivered, so nothing will ever finish it.
    /// (A consumer writes the final status before it acks, so a finished
    /// job's record is final by the time its message is gone.) Returns the
    /// record written, if it was.
    pub async fn expire_orphan(
        &self,
        job_id: &str,
        stream_sequence: u64,
    ) -> Result<Option<StatusRecord>, StatusError> {
        let now = OffsetDateTime::now_utc();
        let (written, _) = self
            .swap(job_id, |current| match current {
                Some(r)
                    if r.state == JobState::Running
                        && r.stream_sequence == Some(stream_sequence)
                        && r.deadline.is_some_and(|d| d <= now) =>
                {
                    Some(StatusRecord {
                        state: JobState::Expired,
                        updated_at: now,
                        error: Some(sluice_schemas::ErrorInfo::new(
                            sluice_schemas::ErrorCode::DeadlineExceeded,
                            "a consumer started the job and stopped before finishing it; \
                             its deadline passed before it could run again"
                                .to_string(),
                        )),
                        ..r.clone()
                    })
                }
                _ => None,
            })
            .await?;
        Ok(written)
    }

    /// A final status (`record.state` is `done`, `failed` or `cancelled`)
    /// unless one is already there. Of two deliveries of one job running at
    /// once (a stale Nak or an ack timeout can cause that), only one
    /// finishes it. Returns whether this write won; the loser must not
    /// answer the job again.
    ///
    /// A write whose reply was lost (the stream's leader changed, a
    /// timeout) may still have been stored: the record is read back, up to
    /// 5 times a second apart, and the write counts as this one's if the
    /// final record there is exactly `record` (same state, attempt, sequence
    /// and time). Otherwise a redelivery would find the job final, take it
    /// as answered, and its result would never be published.
    pub async fn finish(&self, record: &StatusRecord) -> Result<bool, StatusError> {
        let attempt = self
            .swap(&record.job_id, |current| {
                let done = current.is_some_and(|r| r.state.is_final());
                (!done).then(|| StatusRecord {
                    replays: current.map_or(record.replays, |r| r.replays),
                    ..record.clone()
                })
            })
            .await;
        match attempt {
            Ok((written, _)) => Ok(written.is_some()),
            Err(error) => {
                self.read_back(&record.job_id, error, |current| {
                    current.filter(|c| c.state.is_final()).map(|c| {
                        c.state == record.state
                            && c.attempts == record.attempts
                            && c.stream_sequence == record.stream_sequence
                            && c.updated_at == record.updated_at
                    })
                })
                .await
            }
        }
    }

    /// Claims the answer to a job whose record another writer made final
    /// (a cancel, an expiry) for delivery `attempt` of the job message
    /// `stream_sequence`: the claim is added to the record's `answered`
    /// unless a delivery of that message claimed it first. Of any number of
    /// deliveries of one message racing to answer, exactly one gets true;
    /// the others must not publish. True as well when this delivery's own
    /// claim is there already (its reply was lost and it asks again) and
    /// when there is no record at all (it aged out of the bucket: nothing
    /// to decide against). False when the record is not final (a replay
    /// queued the job again: its new message answers) or was finished by a
    /// delivery of this message (that delivery answered).
    ///
    /// A write whose reply was lost is read back, as in
    /// [`StatusStore::finish`]: the claim counts if it is there.
    pub async fn claim_answer(
        &self,
        job_id: &str,
        stream_sequence: u64,
        attempt: u32,
    ) -> Result<bool, StatusError> {
        let mine = AnswerClaim {
            stream_sequence,
            attempt,
        };
        let attempt_claim = self
            .swap(job_id, |current| {
                let r = current?;
                // Final states other than `cancelled` that name this
                // message were written by a delivery of it (`finish`),
                // which answered.
                let finished_by_this_message =
                    r.state != JobState::Cancelled && r.stream_sequence == Some(stream_sequence);
                let claimed = r
                    .answered
                    .iter()
                    .any(|c| c.stream_sequence == stream_sequence);
                if !r.state.is_final() || finished_by_this_message || claimed {
                    return None;
                }
                let mut answered = r.answered.clone();
                answered.push(mine);
                let excess = answered.len().saturating_sub(StatusRecord::MAX_ANSWERED);
                answered.drain(..excess);
                Some(StatusRecord {
                    answered,
                    ..r.clone()
                })
            })
            .await;
        let decided = |record: Option<&StatusRecord>| match record {
            None => true,
            Some(r) => r.answered.contains(&mine),
        };
        match attempt_claim {
            Ok((Some(_), _)) => Ok(true),
            Ok((None, seen)) => Ok(decided(seen.as_ref())),
            Err(error) => {
                self.read_back(job_id, error, |current| {
                    current.filter(|c| c.answered.contains(&mine)).map(|_| true)
                })
                .await
            }
        }
    }

    /// After a write whose reply was lost (`error`): reads the record back,
    /// up to 5 times a second apart, until `decide` can tell from it whether
    /// the write was stored (`Some`); a record it cannot tell from (`None`)
    /// or 5 failed reads give `error` back.
    async fn read_back(
        &self,
        job_id: &str,
        error: StatusError,
        decide: impl Fn(Option<&StatusRecord>) -> Option<bool>,
    ) -> Result<bool, StatusError> {
        for _ in 0..5 {
            tokio::time::sleep(Duration::from_secs(1)).await;
            match self.get(job_id).await {
                Ok(current) => return decide(current.as_ref()).ok_or(error),
                Err(_) => continue,
            }
        }
        Err(error)
    }

    /// `cancelled`, unless the job has finished. Returns whether it was
    /// cancelled (false: it had already finished).
    pub async fn cancel(&self, job_id: &str) -> Result<bool, StatusError> {
        self.cancel_if(job_id, |state| !state.is_final()).await
    }

    /// `cancelled` only while the job waits in the queue: a running job is
    /// let finish (a batch's cancel). Returns whether it was cancelled.
    pub async fn cancel_queued(&self, job_id: &str) -> Result<bool, StatusError> {
        self.cancel_if(job_id, |state| state == JobState::Queued)
            .await
    }

    async fn cancel_if(
        &self,
        job_id: &str,
        cancellable: impl Fn(JobState) -> bool,
    ) -> Result<bool, StatusError> {
        let now = OffsetDateTime::now_utc();
        let (written, _) = self
            .swap(job_id, |current| match current {
                Some(r) if !cancellable(r.clone().as_of(now).state) => None,
                _ => Some(StatusRecord {
                    version: VERSION,
                    job_id: job_id.to_string(),
                    state: JobState::Cancelled,
                    updated_at: OffsetDateTime::now_utc(),
                    attempts: current.map_or(0, |r| r.attempts),
                    stream_sequence: current.and_then(|r| r.stream_sequence),
                    output: None,
                    error: None,
                    replays: current.map_or(0, |r| r.replays),
                    usage: None,
                    deadline: current.and_then(|r| r.deadline),
                    answered: Vec::new(),
                }),
            })
            .await?;
        Ok(written.is_some())
    }

    /// `queued` again for a replay of a dead-lettered job, its replay count
    /// one higher. A job that is `done` is not replayed (its dead letter is
    /// stale: another delivery succeeded).
    pub async fn replay(&self, job_id: &str) -> Result<Replay, StatusError> {
        let (written, seen) = self
            .swap(job_id, |current| match current {
                Some(r) if r.state == JobState::Done => None,
                _ => Some(StatusRecord {
                    version: VERSION,
                    job_id: job_id.to_string(),
                    state: JobState::Queued,
                    updated_at: OffsetDateTime::now_utc(),
                    attempts: 0,
                    stream_sequence: None,
                    output: None,
                    error: None,
                    replays: current.map_or(0, |r| r.replays) + 1,
                    usage: None,
                    deadline: None,
                    answered: Vec::new(),
                }),
            })
            .await?;
        Ok(match (written, seen) {
            (Some(w), _) => Replay::Queued { replays: w.replays },
            (None, Some(done)) => Replay::AlreadyDone(Box::new(done)),
            (None, None) => Replay::Queued { replays: 1 },
        })
    }

    /// Compare-and-swap: `decide` sees the current record and returns the
    /// one to write, or None to leave it. Retries when another writer got in
    /// between. Returns the record written (None when left) and the record
    /// `decide` last saw.
    async fn swap<F>(
        &self,
        job_id: &str,
        mut decide: F,
    ) -> Result<(Option<StatusRecord>, Option<StatusRecord>), StatusError>
    where
        F: FnMut(Option<&StatusRecord>) -> Option<StatusRecord>,
    {
        let write_error = |e: Box<dyn std::error::Error + Send + Sync>| StatusError::Write {
            job_id: job_id.to_string(),
            source: e,
        };
        for _ in 0..16 {
            let entry = self
                .kv
                .entry(self.key(job_id))
                .await
                .map_err(|e| StatusError::Read {
                    job_id: job_id.to_string(),
                    source: Box::new(e),
                })?;
            let live = entry.as_ref().filter(|e| e.operation == kv::Operation::Put);
            let current = live.and_then(|e| serde_json::from_slice::<StatusRecord>(&e.value).ok());
            let Some(next) = decide(current.as_ref()) else {
                return Ok((None, current));
            };
            let payload = serde_json::to_vec(&next).map_err(|e| write_error(Box::new(e)))?;
            let written = match live {
                Some(e) => self
                    .kv
                    .update(self.key(job_id), payload.into(), e.revision)
                    .await
                    .map(|_| ())
                    .map_err(|e| {
                        (
                            e.kind() == kv::UpdateErrorKind::WrongLastRevision,
                            Box::new(e) as Box<dyn std::error::Error + Send + Sync>,
                        )
                    }),
                None => self
                    .kv
                    .create(self.key(job_id), payload.into())
                    .await
                    .map(|_| ())
                    .map_err(|e| {
                        (
                            e.kind() == kv::CreateErrorKind::AlreadyExists,
                            Box::new(e) as Box<dyn std::error::Error + Send + Sync>,
                        )
                    }),
            };
            match written {
                Ok(()) => return Ok((Some(next), current)),
                Err((true, _)) => continue, // someone wrote in between: decide again
                Err((false, e)) => return Err(write_error(e)),
            }
        }
        Err(StatusError::Contention {
            job_id: job_id.to_string(),
        })
    }
}
