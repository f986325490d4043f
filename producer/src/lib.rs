//! The sluice producer library: create the topology (`init`), upload inputs
//! and publish jobs (`submit`), and follow their results and status. The
//! `sluice` CLI is a thin layer over this.
//!
//! ```no_run
//! # async fn demo() -> anyhow::Result<()> {
//! use sluice_producer::{Producer, ProducerConfig};
//! let producer = Producer::connect(&ProducerConfig::default()).await?;
//! let mut results = producer.subscribe_results().await?;
//! let job = producer
//!     .embed_job_from_jsonl("docs-1", b"\"hello\"\n\"world\"\n".to_vec())
//!     .await?;
//! producer.submit(&job).await?;
//! let result = results.next_result().await?;
//! println!("{:?}: {:?}", result.job_id, result.outcome);
//! # Ok(()) }
//! ```

pub mod batch;
pub mod dlq;
pub mod models;
pub mod provision;
pub mod watch;

use std::time::Duration;

use anyhow::{Context, Result, bail};
use async_nats::HeaderMap;
use async_nats::jetstream::{self, kv};
use aws_sdk_s3::presigning::PresigningConfig;
use aws_sdk_s3::primitives::ByteStream;
use futures::StreamExt;
use sluice_schemas::names::headers;
use sluice_schemas::{
    Input, InputFormat, Job, JobResult, JobState, ObjectRef, Priority, Route, StatusRecord,
    StreamChunk, Task, Topology, VERSION,
};

/// Where the producer connects and what it names things.
#[derive(Debug, Clone)]
pub struct ProducerConfig {
    /// NATS, its auth, the namespace, S3 (the flags every sluice binary takes).
    pub deployment: sluice_connect::DeploymentArgs,
    /// Bucket for inputs (and, on the consumer, outputs).
    pub bucket: String,
    /// Key prefix for uploaded inputs.
    pub input_prefix: String,
    /// Longest lifetime of a presigned input URL: a job's own is shorter,
    /// ending [`PRESIGN_PAST_DEADLINE`] after its deadline, where it has one.
    pub presign_secs: u64,
    /// The model jobs ask for.
    pub model: String,
}

impl Default for ProducerConfig {
    fn default() -> Self {
        ProducerConfig {
            deployment: sluice_connect::DeploymentArgs::default(),
            bucket: "sluice".into(),
            input_prefix: "inputs/".into(),
            presign_secs: 24 * 3600,
            model: Task::Embed.default_model().into(),
        }
    }
}

/// How long a URL outlives its job's deadline: for the clocks of the
/// producer and the S3 server to differ, and for a job pulled just before
/// its deadline to fetch its input.
pub const PRESIGN_PAST_DEADLINE: Duration = Duration::from_secs(60);

/// The lifetime of a job's input URL presigned at `now`: `presign_secs`, or
/// less where the job has a deadline (until [`PRESIGN_PAST_DEADLINE`] after
/// it; at least a second): a URL copied out of a job message opens its
/// input no longer than the job could use it.
pub fn url_lifetime(
    presign_secs: u64,
    deadline: Option<time::OffsetDateTime>,
    now: time::OffsetDateTime,
) -> Duration {
    let longest = Duration::from_secs(presign_secs.max(1));
    let Some(deadline) = deadline else {
        return longest;
    };
    let left = Duration::try_from(deadline - now).unwrap_or(Duration::ZERO);
    (left + PRESIGN_PAST_DEADLINE).min(longest)
}

impl ProducerConfig {
    pub fn topology(&self) -> Topology {
        self.deployment.topology()
    }
}

pub struct Producer {
    pub config: ProducerConfig,
    pub topology: Topology,
    pub nats: async_nats::Client,
    pub js: jetstream::Context,
    pub s3: aws_sdk_s3::Client,
    /// The deployed models, which route each job by its `model`.
    pub models: models::ModelCatalog,
    /// Where this producer's jobs are answered: one of its own inboxes
    /// (`<inbox prefix>.<unique>`), each job at `<results>.<job id>`. Under
    /// the shipped permissions a publisher reads its own role's inboxes,
    /// not every result of the deployment.
    results: String,
    status: tokio::sync::OnceCell<kv::Store>,
}

impl Producer {
    pub async fn connect(config: &ProducerConfig) -> Result<Producer> {
        config.deployment.validate()?;
        let nats = sluice_connect::connect_nats(
            &config.deployment.nats_url,
            &config.deployment.nats_auth,
            "sluice-producer",
            false,
            Duration::from_secs(10),
        )
        .await?;
        let js = jetstream::new(nats.clone());
        let s3 = config.deployment.s3.client().await;
        Ok(Producer {
            topology: config.topology(),
            config: config.clone(),
            results: nats.new_inbox(),
            nats,
            models: models::ModelCatalog::new(js.clone(), config.topology()),
            js,
            s3,
            status: tokio::sync::OnceCell::new(),
        })
    }

    /// Uploads `body` to `bucket/<input_prefix><name>` and returns the input,
    /// presigned for reading, with its object named so it can be re-signed.
    pub async fn upload_input(&self, name: &str, body: Vec<u8>) -> Result<Input> {
        self.upload_input_until(name, body, None).await
    }

    /// [`Producer::upload_input`] for a job with `deadline`: its URL lives
    /// no longer than the job can run (see [`url_lifetime`]).
    pub async fn upload_input_until(
        &self,
        name: &str,
        body: Vec<u8>,
        deadline: Option<time::OffsetDateTime>,
    ) -> Result<Input> {
        self.upload_input_as(name, body, InputFormat::Jsonl, deadline)
            .await
    }

    /// [`Producer::upload_input_until`] of an input in `format` (an audio
    /// file for transcribe).
    pub async fn upload_input_as(
        &self,
        name: &str,
        body: Vec<u8>,
        format: InputFormat,
        deadline: Option<time::OffsetDateTime>,
    ) -> Result<Input> {
        let key = format!("{}{name}", self.config.input_prefix);
        self.s3
            .put_object()
            .bucket(&self.config.bucket)
            .key(&key)
            .body(ByteStream::from(body))
            .send()
            .await
            .map_err(|e| {
                anyhow::anyhow!(
                    "cannot upload s3://{}/{key}: {}",
                    self.config.bucket,
                    aws_sdk_s3::error::DisplayErrorContext(e)
                )
            })?;
        let lifetime = url_lifetime(
            self.config.presign_secs,
            deadline,
            time::OffsetDateTime::now_utc(),
        );
        let url = self
            .presign_get_for(&self.config.bucket, &key, lifetime)
            .await?;
        Ok(Input::Url {
            url,
            format,
            object: Some(ObjectRef {
                bucket: self.config.bucket.clone(),
                key,
            }),
        })
    }

    /// A GET URL of `bucket/key` for `presign_secs`.
    pub async fn presign_get(&self, bucket: &str, key: &str) -> Result<String> {
        let lifetime = Duration::from_secs(self.config.presign_secs);
        self.presign_get_for(bucket, key, lifetime).await
    }

    async fn presign_get_for(&self, bucket: &str, key: &str, lifetime: Duration) -> Result<String> {
        let presigned = self
            .s3
            .get_object()
            .bucket(bucket)
            .key(key)
            .presigned(PresigningConfig::expires_in(lifetime)?)
            .await
            .with_context(|| format!("cannot presign s3://{bucket}/{key}"))?;
        Ok(presigned.uri().to_string())
    }

    /// An embed job over one uploaded JSONL input.
    pub async fn embed_job_from_jsonl(&self, id: &str, jsonl: Vec<u8>) -> Result<Job> {
        let input = self.upload_input(&format!("{id}.jsonl"), jsonl).await?;
        Ok(self.embed_job(id, vec![input]))
    }

    /// An embed job with the given inputs and default parameters.
    pub fn embed_job(&self, id: &str, inputs: Vec<Input>) -> Job {
        self.job(Task::Embed, id, inputs)
    }

    /// A job of `task` for the configured model, with default parameters.
    pub fn job(&self, task: Task, id: &str, inputs: Vec<Input>) -> Job {
        Job {
            version: VERSION,
            id: id.to_string(),
            task: task.as_str().into(),
            model: self.config.model.clone(),
            inputs,
            parameters: Default::default(),
            token_estimate: None,
            deadline: None,
            submitted_at: Some(time::OffsetDateTime::now_utc()),
            output: Default::default(),
        }
    }

    /// Publishes `job` and waits for the stream to store it. The job id is the
    /// `Nats-Msg-Id`, so a second submit within the stream's duplicate window
    /// is dropped by the server (the returned ack says `duplicate`). The job
    /// starts a new trace; use [`Producer::submit_with`] to continue yours.
    pub async fn submit(&self, job: &Job) -> Result<jetstream::publish::PublishAck> {
        let reply_to = self.result_subject(&job.id);
        self.submit_with(job, &reply_to, Some(&new_traceparent()))
            .await
    }

    pub async fn submit_with(
        &self,
        job: &Job,
        reply_to: &str,
        traceparent: Option<&str>,
    ) -> Result<jetstream::publish::PublishAck> {
        let route = self.models.route(job, Priority::Normal, None).await?;
        publish(
            &self.js,
            &self.topology,
            &self.statuses().await?,
            job,
            &route,
            reply_to,
            traceparent,
        )
        .await
    }

    /// Publishes many jobs with up to `window` of them in flight at once
    /// (each its publish, its ack, then its `queued` status write, as
    /// [`Producer::submit_with`]), instead of one round trip after another.
    /// Yields one [`Submitted`] per job, in the order given, each only once
    /// its publish ack is in: a job is never reported submitted before the
    /// stream stored it. `submissions` is read lazily, no further ahead than
    /// the window; stop reading the stream to stop submitting (jobs already in
    /// flight may still be stored: drain it to learn which).
    pub async fn submit_pipelined<I>(
        &self,
        submissions: I,
        window: usize,
    ) -> Result<impl futures::Stream<Item = Submitted> + '_>
    where
        I: IntoIterator<Item = Submission>,
        I::IntoIter: Send + 'static,
    {
        let statuses = self.statuses().await?;
        Ok(futures::stream::iter(submissions)
            .map(move |s| {
                let statuses = statuses.clone();
                async move {
                    let route = self
                        .models
                        .route(&s.job, s.priority, s.tenant.as_deref())
                        .await;
                    let ack = match route {
                        Ok(route) => {
                            publish(
                                &self.js,
                                &self.topology,
                                &statuses,
                                &s.job,
                                &route,
                                &s.reply_to,
                                s.traceparent.as_deref(),
                            )
                            .await
                        }
                        Err(e) => Err(e),
                    };
                    Submitted {
                        job_id: s.job.id,
                        traceparent: s.traceparent,
                        ack,
                    }
                }
            })
            .buffered(window.max(1)))
    }

    /// The status records, written only through their named transitions
    /// (the same store the consumer uses).
    pub async fn statuses(&self) -> Result<sluice_status::StatusStore> {
        Ok(sluice_status::StatusStore::new(
            self.status_store().await?.clone(),
        ))
    }

    /// The subject job `job_id` is answered on when this producer submits
    /// it ([`Producer::submit`], [`Submission::new`]): under its own inbox.
    pub fn result_subject(&self, job_id: &str) -> String {
        format!("{}.{job_id}", self.results)
    }

    /// Subscribes to the results of the jobs this producer submits. Subscribe
    /// before submitting: results are plain NATS messages, gone if nobody
    /// listens (the status bucket keeps the outcome either way).
    pub async fn subscribe_results(&self) -> Result<Results> {
        self.results_on(&[self.results_subjects()]).await
    }

    /// Every result subject of this producer (`<results>.*`: a job id is
    /// one token, so its streamed text, `<results>.<job id>.text`, is not
    /// among them).
    fn results_subjects(&self) -> String {
        format!("{}.*", self.results)
    }

    /// Like [`Producer::subscribe_results`], and the default result
    /// subjects too (`sluice.results.<job id>`), where the consumers answer
    /// jobs published without a `Sluice-Reply-To` (by another client, or
    /// too broken to read). Under the shipped permissions only an admin
    /// may read those.
    pub async fn subscribe_results_and_defaults(&self) -> Result<Results> {
        self.results_on(&[
            self.results_subjects(),
            format!("{}.>", self.topology.result_subject_prefix),
        ])
        .await
    }

    async fn results_on(&self, subjects: &[String]) -> Result<Results> {
        let mut subs = Vec::new();
        for subject in subjects {
            subs.push(
                self.nats
                    .subscribe(subject.clone())
                    .await
                    .with_context(|| format!("cannot subscribe to {subject}"))?,
            );
        }
        Ok(Results {
            subs: futures::stream::select_all(subs),
        })
    }

    /// Subscribes to the text of a streaming generate job
    /// (`output.stream`) this producer submits: its [`StreamChunk`]s as
    /// the consumer publishes them, under the job's result subject
    /// ([`Topology::stream_subject_of`]), where no other client hears them.
    /// Subscribe before submitting the job; they are not stored.
    pub async fn subscribe_stream(&self, job_id: &str) -> Result<JobStream> {
        let subject = self
            .topology
            .stream_subject_of(job_id, Some(&self.result_subject(job_id)));
        let sub = self
            .nats
            .subscribe(subject.clone())
            .await
            .with_context(|| format!("cannot subscribe to {subject}"))?;
        Ok(JobStream { sub })
    }

    /// The status bucket (looked up once, then cached).
    pub async fn status_store(&self) -> Result<&kv::Store> {
        self.status
            .get_or_try_init(|| async {
                self.js
                    .get_key_value(&self.topology.status_bucket)
                    .await
                    .with_context(|| {
                        format!(
                            "cannot open the status bucket {} (not created yet? run `sluice init`)",
                            self.topology.status_bucket
                        )
                    })
            })
            .await
    }

    /// The job's status record, if the consumer (or submit) wrote one, as
    /// read now (a `queued` record past its deadline reads `expired`: see
    /// [`StatusRecord::as_of`]).
    pub async fn status(&self, job_id: &str) -> Result<Option<StatusRecord>> {
        self.status_in(None, job_id).await
    }

    /// [`Producer::status`] of a job published on `tenant`'s subjects
    /// (`None`: on a plain subject): its record is in that tenant's scope
    /// (see `sluice_status::StatusStore`).
    pub async fn status_in(
        &self,
        tenant: Option<&str>,
        job_id: &str,
    ) -> Result<Option<StatusRecord>> {
        let store = self.status_store().await?;
        let Some(bytes) = store.get(sluice_status::record_key(tenant, job_id)).await? else {
            return Ok(None);
        };
        let now = time::OffsetDateTime::now_utc();
        let record = serde_json::from_slice::<StatusRecord>(&bytes)
            .with_context(|| format!("the status record of {job_id} is not valid"))?
            .as_of(now);
        // A job left `running` past its deadline may be an orphan: its
        // consumer stopped, and the stream dropped the message at the
        // deadline before a redelivery. Then nothing will finish it: record
        // it `expired` (see StatusStore::expire_orphan).
        if record.state == JobState::Running
            && record.deadline.is_some_and(|d| d <= now)
            && let Some(sequence) = record.stream_sequence
            && self.job_message_gone(sequence).await?
            && let Some(expired) = self
                .statuses()
                .await?
                .scoped(tenant)
                .expire_orphan(job_id, sequence)
                .await?
        {
            return Ok(Some(expired));
        }
        Ok(Some(record))
    }

    /// Whether the job stream has moved past message `sequence`: it holds
    /// no message at or before it (its first sequence is after it). Read
    /// from the stream's state (`STREAM.INFO`) alone: a job's message is
    /// never read, since under the shipped permissions a publisher may not
    /// read other clients' jobs (their presigned URLs). A gone message
    /// behind an older one still waiting is not seen as gone until that
    /// one leaves: the orphan reads `running` until then, never `expired`
    /// too soon.
    async fn job_message_gone(&self, sequence: u64) -> Result<bool> {
        let stream = self
            .js
            .get_stream(&self.topology.job_stream)
            .await
            .with_context(|| format!("cannot read the state of {}", self.topology.job_stream))?;
        // An empty stream's first sequence is one past its last.
        Ok(sequence < stream.cached_info().state.first_sequence)
    }
}

/// The default number of jobs [`Producer::submit_pipelined`] keeps in flight:
/// enough to hide a loopback or LAN round trip behind the next publishes,
/// small enough that a failing server is noticed within one window.
pub const DEFAULT_SUBMIT_WINDOW: usize = 256;

/// A job ready to publish: where its result goes and the trace it joins.
#[derive(Debug, Clone)]
pub struct Submission {
    pub job: Job,
    pub reply_to: String,
    pub traceparent: Option<String>,
    /// The level it is published at (its subject).
    pub priority: Priority,
    /// The tenant it is published as (its subject; see [`publish`]).
    pub tenant: Option<String>,
}

impl Submission {
    /// `job` answered on `producer`'s result subject, starting a new trace
    /// unless `traceparent` continues one.
    pub fn new(producer: &Producer, job: Job, traceparent: Option<String>) -> Submission {
        Submission {
            reply_to: producer.result_subject(&job.id),
            traceparent: Some(traceparent.unwrap_or_else(new_traceparent)),
            priority: Priority::Normal,
            tenant: None,
            job,
        }
    }
}

/// What became of one job of [`Producer::submit_pipelined`].
#[derive(Debug)]
pub struct Submitted {
    pub job_id: String,
    pub traceparent: Option<String>,
    /// The stream's ack (`duplicate` when the id was seen within the
    /// duplicate window), or why the job was not stored or its status not
    /// written.
    pub ack: Result<jetstream::publish::PublishAck>,
}

/// Publishes `job` through JetStream (its id as `Nats-Msg-Id`, so a second
/// publish within the duplicate window is dropped by the server) and records
/// it `queued` unless it already has a record (a fast consumer may have
/// marked it running, or an earlier try queued it: that record wins). A
/// duplicate is recorded too: the try whose publish was stored may have lost
/// its ack and never written the record.
///
/// A job with a `deadline` also carries it as a per-message TTL
/// (`Nats-TTL`, whole seconds rounded up): the stream removes the job at its
/// deadline without a consumer pulling it, and its `queued` record (which
/// keeps the deadline) reads as `expired`. A job whose deadline has already
/// passed is refused here. On a stream created before sluice asked for
/// `allow_msg_ttl` (until `sluice init` upgrades it) the job is published
/// again without the TTL: consumers still refuse it after its deadline.
///
/// The job goes to `route`'s subject ([`Topology::subject_of`]; see
/// [`models::ModelCatalog::route`] for the model's part). A tenant
/// publishes to the tenant's subject, where consumers give each tenant with
/// a backlog an equal share (or its weight's) of their token throughput;
/// the job also carries the name as its `Sluice-Tenant` header. A tenant
/// name that is not a valid subject token is refused.
pub async fn publish(
    js: &jetstream::Context,
    topology: &Topology,
    statuses: &sluice_status::StatusStore,
    job: &Job,
    route: &Route,
    reply_to: &str,
    traceparent: Option<&str>,
) -> Result<jetstream::publish::PublishAck> {
    let tenant = route.tenant.as_deref();
    let ttl = match job.deadline {
        Some(deadline) => Some(
            ttl_until(deadline, time::OffsetDateTime::now_utc())
                .with_context(|| format!("job {} was not published", job.id))?,
        ),
        None => None,
    };
    if let Some(tenant) = tenant
        && !sluice_schemas::is_valid_tenant(tenant)
    {
        bail!(
            "job {} was not published: tenant {tenant:?} is not a valid name (1 to 64 of A-Z a-z 0-9 - _)",
            job.id
        );
    }
    let mut h = HeaderMap::new();
    h.insert(headers::REPLY_TO, reply_to);
    if let Some(tp) = traceparent {
        h.insert(headers::TRACEPARENT, tp);
    }
    if let Some(tenant) = tenant {
        h.insert(headers::TENANT, tenant);
    }
    let subject = topology.subject_of(route);
    let payload = bytes::Bytes::from(job.to_bytes());
    let store = |subject: String, h: HeaderMap| {
        let payload = payload.clone();
        async move {
            js.publish_with_headers(subject.clone(), h, payload)
                .await
                .with_context(|| format!("cannot publish to {subject}"))?
                .await
                .with_context(|| format!("the job stream did not store the job on {subject}"))
        }
    };
    // With its deadline as its TTL, unless the stream does not allow one.
    // Its message id is its status record's key: the stream's duplicate
    // window is one for all tenants, and one tenant's job must not be
    // dropped as a duplicate of another's that has the same id.
    let store_job = |subject: String, scope: Option<&str>| {
        let mut h = h.clone();
        h.insert(
            headers::MSG_ID,
            sluice_status::record_key(scope, &job.id).as_str(),
        );
        async move {
            match ttl {
                Some(ttl) => {
                    let mut with_ttl = h.clone();
                    with_ttl.insert(headers::MESSAGE_TTL, format!("{ttl}s").as_str());
                    match store(subject.clone(), with_ttl).await {
                        Err(e) if is_ttl_disabled(&e) => {
                            warn_ttl_disabled(&topology.job_stream);
                            store(subject, h).await
                        }
                        other => other,
                    }
                }
                None => store(subject, h).await,
            }
        }
    };
    let plain = topology.subject_of(&Route {
        tenant: None,
        ..route.clone()
    });
    // The job's status record is in its subject's tenant's scope (see
    // `sluice_status::StatusStore`): the tenant's, or the plain subjects'
    // when the job went to a plain one.
    let (ack, scope) = match store_job(subject.clone(), tenant).await {
        // A stream from before tenants has no tenant subjects: the job goes
        // to its level's plain subject (the default tenant's share, its
        // header still naming its tenant) until `sluice init` adds them.
        Err(e) if subject != plain && is_stream_not_found(&e) => {
            warn_no_tenant_subjects(&topology.job_stream);
            (store_job(plain, None).await?, None)
        }
        other => (other?, tenant),
    };
    // Also on a duplicate: the first publish may have been stored with its
    // ack lost (a leader change), so this retry is the first to hear of it
    // and nothing has recorded it yet. `queue` only creates, so a record a
    // consumer or an earlier try wrote stays as it is.
    statuses
        .scoped(scope)
        .queue(&job.id, ack.sequence, job.deadline)
        .await
        .with_context(|| format!("cannot record job {} as queued", job.id))?;
    Ok(ack)
}

/// The per-message TTL, in whole seconds, that removes a job stored `now`
/// at `deadline` (rounded up: never before it); an error if it has passed.
pub fn ttl_until(deadline: time::OffsetDateTime, now: time::OffsetDateTime) -> Result<u64> {
    let left = deadline - now;
    if !left.is_positive() {
        bail!(
            "its deadline ({}) passed {:.1} s ago",
            deadline
                .format(&time::format_description::well_known::Rfc3339)
                .unwrap_or_default(),
            -left.as_seconds_f64()
        );
    }
    Ok((left.as_seconds_f64().ceil() as u64).max(1))
}

/// Whether the stream refused a publish because it does not allow
/// per-message TTLs (JetStream error 10166).
fn is_ttl_disabled(e: &anyhow::Error) -> bool {
    e.chain().any(|cause| {
        cause
            .downcast_ref::<async_nats::jetstream::Error>()
            .is_some_and(|j| {
                j.error_code() == async_nats::jetstream::ErrorCode::MESSAGE_TTL_DISABLED
            })
    })
}

fn is_stream_not_found(e: &anyhow::Error) -> bool {
    e.chain().any(|cause| {
        cause
            .downcast_ref::<async_nats::jetstream::context::PublishError>()
            .is_some_and(|p| {
                p.kind() == async_nats::jetstream::context::PublishErrorKind::StreamNotFound
            })
    })
}

fn warn_no_tenant_subjects(stream: &str) {
    static WARNED: std::sync::Once = std::sync::Once::new();
    WARNED.call_once(|| {
        tracing::warn!(
            stream,
            "the job stream has no tenant subjects (created by an older sluice): tenants' jobs go to the plain subjects, without fair share; run `sluice init` to add them in place"
        )
    });
}

fn warn_ttl_disabled(stream: &str) {
    static WARNED: std::sync::Once = std::sync::Once::new();
    WARNED.call_once(|| {
        tracing::warn!(
            stream,
            "the job stream does not allow per-message TTL (created by an older sluice): jobs with a deadline stay in it until a consumer refuses them; run `sluice init` to upgrade it in place"
        )
    });
}

/// A fresh W3C `traceparent` (a new trace, sampled), for a job published
/// without one: the consumer's spans then share one trace id, which the CLI
/// prints and the consumer logs.
pub fn new_traceparent() -> String {
    let trace = uuid::Uuid::new_v4().simple().to_string();
    let span = uuid::Uuid::new_v4().simple().to_string();
    format!("00-{trace}-{}-01", &span[..16])
}

/// The trace id in a valid `traceparent`.
pub fn trace_id_of(traceparent: &str) -> Option<&str> {
    sluice_schemas::TraceParent::parse(traceparent).map(|tp| tp.trace_id)
}

/// A stream of results.
pub struct Results {
    subs: futures::stream::SelectAll<async_nats::Subscriber>,
}

impl Results {
    pub async fn next_result(&mut self) -> Result<JobResult> {
        let Some(msg) = self.subs.next().await else {
            bail!("the result subscription closed");
        };
        serde_json::from_slice(&msg.payload).context("a result message is not valid")
    }
}

/// One job's stream messages ([`Producer::subscribe_stream`]).
pub struct JobStream {
    sub: async_nats::Subscriber,
}

impl JobStream {
    /// The next message; `None` once the subscription closed.
    pub async fn next_chunk(&mut self) -> Option<Result<StreamChunk>> {
        let msg = self.sub.next().await?;
        Some(serde_json::from_slice(&msg.payload).context("a stream message is not valid"))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use time::macros::datetime;

    #[test]
    fn the_ttl_rounds_up_to_whole_seconds_and_a_past_deadline_is_refused() {
        let now = datetime!(2026-12-02 10:00:00 UTC);
        let ttl = |ms: i64| ttl_until(now + time::Duration::milliseconds(ms), now);
        assert_eq!(ttl(2000).unwrap(), 2);
        assert_eq!(ttl(2001).unwrap(), 3, "never before the deadline");
        assert_eq!(ttl(1).unwrap(), 1);
        let passed = ttl(-1500).unwrap_err().to_string();
        assert!(passed.contains("passed 1.5 s ago"), "{passed}");
        assert!(ttl(0).is_err(), "a deadline of now has passed");
    }

    /// A job's URL ends a minute after its deadline, never later than
    /// --presign-secs, at least a second after now.
    #[test]
    fn an_input_url_lives_no_longer_than_its_job_can_run() {
        let now = datetime!(2026-12-07 10:00:00 UTC);
        let at = |secs: i64| Some(now + time::Duration::seconds(secs));
        let table: [(u64, Option<time::OffsetDateTime>, u64); 5] = [
            (86_400, None, 86_400),
            (86_400, at(300), 360),
            (120, at(300), 120),
            (86_400, at(-30), 60),
            (0, None, 1),
        ];
        for (presign_secs, deadline, want) in table {
            assert_eq!(
                url_lifetime(presign_secs, deadline, now),
                Duration::from_secs(want),
                "{presign_secs} s, deadline {deadline:?}"
            );
        }
    }
}
