//! The dead-letter stream: list, show, replay; and cancelling a queued job.

use anyhow::{Context, Result, bail};
use async_nats::HeaderMap;
use base64::Engine;
use sluice_schemas::names::headers;
use sluice_schemas::{DeadLetter, ErrorCode, Input, Job};
use sluice_status::Replay;
use time::OffsetDateTime;

use crate::Producer;

/// Which dead letters to take.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    pub code: Option<ErrorCode>,
    pub job_id: Option<String>,
    /// Dead-lettered at or after this instant.
    pub since: Option<OffsetDateTime>,
}

impl Filter {
    pub fn matches(&self, letter: &DeadLetter) -> bool {
        self.code.is_none_or(|c| letter.error.code == c)
            && self
                .job_id
                .as_deref()
                .is_none_or(|id| letter.job_id.as_deref() == Some(id))
            && self.since.is_none_or(|t| letter.dead_lettered_at >= t)
    }
}

/// A replay's receipt.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Replayed {
    pub dlq_sequence: u64,
    pub job_id: Option<String>,
    pub subject: String,
    pub stream_sequence: u64,
    pub refreshed_urls: usize,
}

impl Producer {
    /// Dead letters matching `filter`, with their sequence in the DLQ stream.
    pub async fn dead_letters(&self, filter: &Filter) -> Result<Vec<(u64, DeadLetter)>> {
        let mut stream = self
            .js
            .get_stream(&self.topology.dlq_stream)
            .await
            .with_context(|| {
                format!(
                    "cannot open the dead-letter stream {} (not created yet? run `sluice init`)",
                    self.topology.dlq_stream
                )
            })?;
        let state = stream.info().await?.state.clone();
        let mut out = Vec::new();
        if state.messages == 0 {
            return Ok(out);
        }
        for seq in state.first_sequence..=state.last_sequence {
            let Ok(msg) = stream.get_raw_message(seq).await else {
                continue; // deleted or aged out
            };
            match serde_json::from_slice::<DeadLetter>(&msg.payload) {
                Ok(letter) if filter.matches(&letter) => out.push((seq, letter)),
                Ok(_) => {}
                Err(e) => tracing::warn!(seq, error = %e, "unreadable dead letter"),
            }
        }
        Ok(out)
    }

    /// One dead letter by its DLQ sequence.
    pub async fn dead_letter(&self, seq: u64) -> Result<DeadLetter> {
        let stream = self.js.get_stream(&self.topology.dlq_stream).await?;
        let msg = stream
            .get_raw_message(seq)
            .await
            .with_context(|| format!("no dead letter at sequence {seq}"))?;
        serde_json::from_slice(&msg.payload)
            .with_context(|| format!("dead letter {seq} is not valid"))
    }

    /// The original job message of a dead letter: carried in it, or, for
    /// one too large to carry, read from the object it names.
    pub async fn dead_letter_payload(&self, dlq_seq: u64, letter: &DeadLetter) -> Result<Vec<u8>> {
        let Some(object) = &letter.payload_object else {
            return base64::engine::general_purpose::STANDARD
                .decode(&letter.payload_base64)
                .with_context(|| format!("dead letter {dlq_seq} has an invalid payload"));
        };
        let got = self
            .s3
            .get_object()
            .bucket(&object.bucket)
            .key(&object.key)
            .send()
            .await
            .map_err(|e| {
                anyhow::anyhow!(
                    "cannot read dead letter {dlq_seq}'s payload from s3://{}/{}: {}",
                    object.bucket,
                    object.key,
                    aws_sdk_s3::error::DisplayErrorContext(e)
                )
            })?;
        let bytes = got.body.collect().await.with_context(|| {
            format!(
                "cannot read dead letter {dlq_seq}'s payload from s3://{}/{}",
                object.bucket, object.key
            )
        })?;
        Ok(bytes.into_bytes().to_vec())
    }

    /// Republishes a dead letter's job to its original subject with a new
    /// message id (the duplicate window would drop the old one), re-signing
    /// URL inputs that name their object when `refresh_urls` is set, and
    /// records the replay in the job's status.
    pub async fn replay(
        &self,
        dlq_seq: u64,
        letter: &DeadLetter,
        refresh_urls: bool,
    ) -> Result<Replayed> {
        let payload = self.dead_letter_payload(dlq_seq, letter).await?;
        let mut refreshed_urls = 0;
        // One parse: a job with a deadline goes back with the time it has
        // left as its TTL (one whose deadline has passed would only expire
        // again), and --refresh-urls presigns its stored inputs again.
        let job = serde_json::from_slice::<Job>(&payload).ok();
        let ttl = match job.as_ref().and_then(|j| j.deadline) {
            Some(deadline) => Some(
                crate::ttl_until(deadline, time::OffsetDateTime::now_utc()).with_context(|| {
                    format!(
                        "dead letter {dlq_seq} (job {}) was not replayed: it would only expire again",
                        letter.job_id.as_deref().unwrap_or("?")
                    )
                })?,
            ),
            None => None,
        };
        let payload = match job {
            Some(mut job) if refresh_urls => {
                for input in &mut job.inputs {
                    if let Input::Url {
                        url,
                        object: Some(o),
                        ..
                    } = input
                    {
                        *url = self.presign_get(&o.bucket, &o.key).await?;
                        refreshed_urls += 1;
                    }
                }
                job.to_bytes()
            }
            Some(_) => payload,
            None if refresh_urls => bail!(
                "dead letter {dlq_seq} does not hold a valid job, so its URLs cannot be refreshed; replay it without --refresh-urls"
            ),
            None => payload,
        };
        let mut replays = 1;
        if let Some(id) = &letter.job_id {
            // Its record is in its original subject's tenant's scope.
            let scope = self
                .topology
                .route_of(&letter.original_subject)
                .and_then(|r| r.tenant);
            match self
                .statuses()
                .await?
                .scoped(scope.as_deref())
                .replay(id)
                .await?
            {
                Replay::Queued { replays: n } => replays = n,
                Replay::AlreadyDone(record) => bail!(
                    "job {id} is done (its status says so since {}): dead letter {dlq_seq} is stale, and replaying it would run the job twice",
                    record.updated_at
                ),
            }
        }
        let mut h = HeaderMap::new();
        for (name, values) in &letter.headers {
            if name.eq_ignore_ascii_case(headers::MSG_ID)
                || name.eq_ignore_ascii_case(headers::MESSAGE_TTL)
            {
                continue;
            }
            for v in values {
                h.append(name.as_str(), v.as_str());
            }
        }
        let msg_id = format!(
            "{}-replay-{dlq_seq}-{replays}",
            letter.job_id.as_deref().unwrap_or("unknown")
        );
        h.insert(headers::MSG_ID, msg_id.as_str());
        if let Some(ttl) = ttl {
            h.insert(headers::MESSAGE_TTL, format!("{ttl}s").as_str());
        }
        let ack = self
            .js
            .publish_with_headers(letter.original_subject.clone(), h, payload.into())
            .await?
            .await
            .with_context(|| format!("the job stream did not take the replay of {dlq_seq}"))?;
        Ok(Replayed {
            dlq_sequence: dlq_seq,
            job_id: letter.job_id.clone(),
            subject: letter.original_subject.clone(),
            stream_sequence: ack.sequence,
            refreshed_urls,
        })
    }

    /// Marks a job cancelled if it has not finished; a consumer that pulls it
    /// later answers `cancelled` without running it. Returns false when the
    /// job had already finished (or is unknown).
    pub async fn cancel(&self, job_id: &str) -> Result<bool> {
        self.cancel_in(None, job_id).await
    }

    /// [`Producer::cancel`] of a job published on `tenant`'s subjects
    /// (`None`: on a plain subject).
    pub async fn cancel_in(&self, tenant: Option<&str>, job_id: &str) -> Result<bool> {
        // Compare-and-swap in the status store: a finish in between wins.
        Ok(self.statuses().await?.scoped(tenant).cancel(job_id).await?)
    }
}
