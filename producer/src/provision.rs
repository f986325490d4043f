//! `sluice init`: creates or updates, idempotently, the job stream, the durable
//! pull consumers (per task, level and routed model), the dead-letter stream,
//! the status, gateway and models buckets and the S3 bucket.

use std::time::Duration;

use anyhow::{Context, Result, bail};
use async_nats::jetstream::{self, consumer, kv, stream};
use sluice_schemas::{DeployedModel, Priority, Route, Task, Topology};

/// The knobs of the topology, with production defaults. `deploy/sluice.toml`
/// spells out every one of them; `sluice init --settings FILE` reads such a file
/// (keys left out keep their defaults, unknown keys are refused).
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Settings {
    /// How long a re-published job id is recognized as a duplicate.
    #[serde(rename = "duplicate_window_secs", with = "secs")]
    pub duplicate_window: Duration,
    /// Largest job message the stream accepts (inputs go behind URLs).
    pub max_message_bytes: i32,
    /// How long a delivered job may go without an ack or progress ack.
    #[serde(rename = "ack_wait_secs", with = "secs")]
    pub ack_wait: Duration,
    /// Deliveries before a job is given up (and dead-lettered).
    pub max_deliver: i64,
    /// Unacked deliveries allowed across the whole fleet of consumers.
    pub max_ack_pending: i64,
    /// Replicas of streams and bucket (3 in a production cluster).
    pub replicas: usize,
    /// How long dead letters are kept.
    #[serde(rename = "dead_letter_max_age_secs", with = "secs")]
    pub dlq_max_age: Duration,
    /// How long status records are kept.
    #[serde(rename = "status_max_age_secs", with = "secs")]
    pub status_max_age: Duration,
    /// Tenants' weights in consumers' fair share (a tenant left out weighs
    /// 1): a tenant of weight 2 gets twice the token throughput of one of
    /// weight 1 while both have a backlog. Stored on the durable consumers
    /// (their metadata, [`TENANT_WEIGHTS_KEY`]), where consumer processes
    /// read them when they start.
    pub tenant_weights: std::collections::BTreeMap<String, u32>,
    /// The models the deployment routes (`[[models]]`); none: every job of
    /// a task goes to its plain subjects, whatever model it names.
    pub models: Vec<ModelSettings>,
}

/// One `[[models]]` entry: a model a task's consumers may load. The first
/// entry of a task is its default model, which takes the task's plain
/// subjects and durable consumers (those of a deployment from before
/// models were routed); every other gets its own (see
/// [`sluice_schemas::models`]).
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSettings {
    pub task: String,
    pub name: String,
    /// This model's tenants' weights, in place of the top-level
    /// `[tenant_weights]` (stored on its own durable consumers).
    pub tenant_weights: Option<std::collections::BTreeMap<String, u32>>,
}

pub use sluice_schemas::names::TENANT_WEIGHTS_KEY;

impl Default for Settings {
    fn default() -> Self {
        Settings {
            duplicate_window: Duration::from_secs(120),
            max_message_bytes: 1024 * 1024,
            ack_wait: Duration::from_secs(60),
            max_deliver: 5,
            max_ack_pending: 10_000,
            replicas: 1,
            dlq_max_age: Duration::from_secs(14 * 24 * 3600),
            status_max_age: Duration::from_secs(8 * 24 * 3600),
            tenant_weights: Default::default(),
            models: Vec::new(),
        }
    }
}

impl Settings {
    /// Parses a settings file (TOML) and checks its values.
    pub fn from_toml(text: &str) -> Result<Settings> {
        let s: Settings = toml::from_str(text).map_err(|e| anyhow::anyhow!("{e}"))?;
        s.validate()?;
        Ok(s)
    }

    pub fn load(path: &std::path::Path) -> Result<Settings> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read settings file {}", path.display()))?;
        Settings::from_toml(&text)
            .with_context(|| format!("invalid settings file {}", path.display()))
    }

    pub fn validate(&self) -> Result<()> {
        let positive = [
            (
                "duplicate_window_secs",
                self.duplicate_window.as_secs() as i64,
            ),
            ("ack_wait_secs", self.ack_wait.as_secs() as i64),
            ("max_message_bytes", i64::from(self.max_message_bytes)),
            ("max_deliver", self.max_deliver),
            ("max_ack_pending", self.max_ack_pending),
            (
                "dead_letter_max_age_secs",
                self.dlq_max_age.as_secs() as i64,
            ),
            ("status_max_age_secs", self.status_max_age.as_secs() as i64),
        ];
        for (key, value) in positive {
            if value <= 0 {
                bail!("{key} = {value}: must be at least 1");
            }
        }
        validate_weights("tenant_weights", &self.tenant_weights)?;
        let mut seen = std::collections::HashSet::new();
        for (i, m) in self.models.iter().enumerate() {
            let at = format!("models[{i}]");
            if Task::parse(&m.task).is_none() {
                bail!(
                    "{at}.task = {:?}: not a task (one of: {})",
                    m.task,
                    Task::ALL.map(Task::as_str).join(", ")
                );
            }
            if !sluice_schemas::names::is_valid_model(&m.name) {
                bail!(
                    "{at}.name = {:?}: a model name is 1 to 64 of A-Z a-z 0-9 - _ (a subject token: `bge-small-en-v1_5`, not `v1.5`)",
                    m.name
                );
            }
            if !seen.insert((m.task.as_str(), m.name.as_str())) {
                bail!("{at}: model {:?} of {} is listed twice", m.name, m.task);
            }
            if let Some(weights) = &m.tenant_weights {
                validate_weights(&format!("{at}.tenant_weights"), weights)?;
            }
        }
        if !(1..=5).contains(&self.replicas) {
            bail!("replicas = {}: JetStream allows 1 to 5", self.replicas);
        }
        if self.max_deliver < 2 {
            bail!(
                "max_deliver = {}: at least 2, so a job survives one crashed consumer",
                self.max_deliver
            );
        }
        Ok(())
    }
}

impl Settings {
    /// The models bucket's records the settings make: a task's first
    /// `[[models]]` entry is its default.
    pub fn deployed_models(&self) -> Vec<DeployedModel> {
        let mut defaults = std::collections::HashSet::new();
        self.models
            .iter()
            .map(|m| DeployedModel {
                task: m.task.clone(),
                model: m.name.clone(),
                default: defaults.insert(m.task.clone()),
            })
            .collect()
    }

    /// The tenant weights on `model`'s durable consumers (`None`: the
    /// default model's, the top-level ones).
    fn weights_of(
        &self,
        task: Task,
        model: Option<&str>,
    ) -> &std::collections::BTreeMap<String, u32> {
        self.models
            .iter()
            .find(|m| m.task == task.as_str() && Some(m.name.as_str()) == model)
            .or_else(|| {
                // The default model's entry may carry its own weights too.
                model
                    .is_none()
                    .then(|| self.models.iter().find(|m| m.task == task.as_str()))
                    .flatten()
            })
            .and_then(|m| m.tenant_weights.as_ref())
            .unwrap_or(&self.tenant_weights)
    }
}

fn validate_weights(key: &str, weights: &std::collections::BTreeMap<String, u32>) -> Result<()> {
    for (tenant, weight) in weights {
        if !sluice_schemas::is_valid_tenant(tenant) {
            bail!("{key}: {tenant:?} is not a tenant name (1 to 64 of A-Z a-z 0-9 - _)");
        }
        if !(1..=1000).contains(weight) {
            bail!("{key}.{tenant} = {weight}: must be 1 to 1000");
        }
    }
    Ok(())
}

/// Durations as whole seconds in settings files.
mod secs {
    use std::time::Duration;

    pub fn deserialize<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let n: u64 = serde::Deserialize::deserialize(d)?;
        Ok(Duration::from_secs(n))
    }
}

/// What `ensure` did to one resource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    Created(String),
    /// The resource, and what changed ("ack_wait 60s -> 30s", ...).
    Updated(String, Vec<String>),
    Unchanged(String),
    /// A record the settings no longer hold (a model left out).
    Removed(String),
}

impl Change {
    /// For `--json`: `{"action": "created" | "updated" | "unchanged", "resource": ..., "changes": [...]}`.
    pub fn to_json(&self) -> serde_json::Value {
        let (action, resource, changes) = match self {
            Change::Created(r) => ("created", r, &[][..]),
            Change::Updated(r, c) => ("updated", r, &c[..]),
            Change::Unchanged(r) => ("unchanged", r, &[][..]),
            Change::Removed(r) => ("removed", r, &[][..]),
        };
        serde_json::json!({"action": action, "resource": resource, "changes": changes})
    }
}

impl std::fmt::Display for Change {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Change::Created(w) => write!(f, "created   {w}"),
            Change::Updated(w, what) => write!(f, "updated   {w} ({})", what.join(", ")),
            Change::Unchanged(w) => write!(f, "unchanged {w}"),
            Change::Removed(w) => write!(f, "removed   {w}"),
        }
    }
}

/// The job stream, with the routed models' subjects it already has
/// (`have`) kept beside the settings'.
pub fn job_stream_config(t: &Topology, s: &Settings, have: &[String]) -> stream::Config {
    let mut subjects = t.job_subjects();
    subjects.extend(routed_subjects(t, s, have));
    stream::Config {
        name: t.job_stream.clone(),
        subjects,
        retention: stream::RetentionPolicy::WorkQueue,
        duplicate_window: s.duplicate_window,
        max_message_size: s.max_message_bytes,
        num_replicas: s.replicas,
        storage: stream::StorageType::File,
        // A job's deadline travels as its `Nats-TTL`: the server removes a
        // job that expires while it waits (nats-server 2.11+; once on, a
        // stream cannot turn it off again).
        allow_message_ttl: true,
        ..Default::default()
    }
}

/// The subjects of the routed (non-default) models: the settings' and the
/// ones the stream already has (`have`), sorted. A model left out of the
/// settings keeps its subjects, so the jobs waiting there are never
/// stranded.
fn routed_subjects(t: &Topology, s: &Settings, have: &[String]) -> Vec<String> {
    let mut subjects: Vec<String> = s
        .deployed_models()
        .iter()
        .filter_map(|m| Some(t.model_subjects(&m.task, &m.route()?)))
        .flatten()
        .chain(have.iter().filter(|s| t.is_model_subject(s)).cloned())
        .collect();
    subjects.sort();
    subjects.dedup();
    subjects
}

pub fn dlq_stream_config(t: &Topology, s: &Settings) -> stream::Config {
    stream::Config {
        name: t.dlq_stream.clone(),
        subjects: vec![t.dlq_subjects()],
        // Limits retention: dead letters stay browsable until they age out.
        retention: stream::RetentionPolicy::Limits,
        max_age: s.dlq_max_age,
        // Dead letters carry the original job (base64) plus the error: no cap.
        max_message_size: -1,
        duplicate_window: s.duplicate_window,
        num_replicas: s.replicas,
        storage: stream::StorageType::File,
        ..Default::default()
    }
}

/// The durable consumer of `task`'s jobs for `model` (`None`: the default
/// model) at `priority`: filtered to that subject, so each task's and
/// model's processes share their own consumers and never pull another's
/// jobs (a work-queue stream needs the filters not to overlap), and a
/// consumer process can prefer one level over another.
pub fn consumer_config(
    t: &Topology,
    s: &Settings,
    task: Task,
    model: Option<&str>,
    priority: Priority,
) -> consumer::pull::Config {
    let route = Route {
        task: task.as_str().to_string(),
        model: model.map(str::to_string),
        priority,
        tenant: None,
    };
    consumer::pull::Config {
        durable_name: Some(t.model_consumer(task, model, priority, None)),
        filter_subject: t.subject_of(&route),
        ack_policy: consumer::AckPolicy::Explicit,
        ack_wait: s.ack_wait,
        max_deliver: s.max_deliver,
        max_ack_pending: s.max_ack_pending,
        // No `backoff`: it would replace ack_wait per attempt and redeliver
        // long jobs while they run. Consumers Nak with their own delays.
        metadata: tenant_weights_metadata(s.weights_of(task, model)),
        ..Default::default()
    }
}

fn tenant_weights_metadata(
    weights: &std::collections::BTreeMap<String, u32>,
) -> std::collections::HashMap<String, String> {
    if weights.is_empty() {
        return Default::default();
    }
    let weights = weights
        .iter()
        .map(|(t, w)| format!("{t}={w}"))
        .collect::<Vec<_>>()
        .join(",");
    [(TENANT_WEIGHTS_KEY.to_string(), weights)].into()
}

/// Pushes "name have -> want" when the two differ.
fn diff<T: PartialEq + std::fmt::Debug>(out: &mut Vec<String>, name: &str, have: &T, want: &T) {
    if have != want {
        out.push(format!("{name} {have:?} -> {want:?}"));
    }
}

fn stream_diff(have: &stream::Config, want: &stream::Config) -> Vec<String> {
    let mut out = Vec::new();
    diff(&mut out, "subjects", &have.subjects, &want.subjects);
    diff(
        &mut out,
        "duplicate_window",
        &have.duplicate_window,
        &want.duplicate_window,
    );
    diff(
        &mut out,
        "max_message_size",
        &have.max_message_size,
        &want.max_message_size,
    );
    diff(&mut out, "replicas", &have.num_replicas, &want.num_replicas);
    diff(&mut out, "max_age", &have.max_age, &want.max_age);
    diff(
        &mut out,
        "allow_msg_ttl",
        &have.allow_message_ttl,
        &want.allow_message_ttl,
    );
    out
}

async fn ensure_stream(js: &jetstream::Context, want: stream::Config) -> Result<Change> {
    let what = format!("stream {}", want.name);
    match js.get_stream(&want.name).await {
        Ok(mut existing) => {
            let have = existing.info().await?.config.clone();
            if have.retention != want.retention {
                anyhow::bail!(
                    "{what} exists with retention {:?}, not {:?}; retention cannot be changed in place: \
                     delete the stream (after draining it) and run init again",
                    have.retention,
                    want.retention
                );
            }
            let changed = stream_diff(&have, &want);
            if changed.is_empty() {
                Ok(Change::Unchanged(what))
            } else {
                js.update_stream(&want)
                    .await
                    .with_context(|| format!("cannot update {what}"))?;
                Ok(Change::Updated(what, changed))
            }
        }
        Err(_) => {
            js.create_stream(want)
                .await
                .with_context(|| format!("cannot create {what}"))?;
            Ok(Change::Created(what))
        }
    }
}

async fn ensure_consumer(
    js: &jetstream::Context,
    stream_name: &str,
    want: consumer::pull::Config,
) -> Result<Change> {
    let name = want.durable_name.clone().unwrap_or_default();
    let what = format!("consumer {name} on {stream_name}");
    let stream = js.get_stream(stream_name).await?;
    match stream.consumer_info(&name).await {
        Ok(info) => {
            let have = &info.config;
            let mut changed = Vec::new();
            diff(
                &mut changed,
                "filter_subject",
                &have.filter_subject,
                &want.filter_subject,
            );
            diff(&mut changed, "ack_wait", &have.ack_wait, &want.ack_wait);
            diff(
                &mut changed,
                "max_deliver",
                &have.max_deliver,
                &want.max_deliver,
            );
            diff(
                &mut changed,
                "max_ack_pending",
                &have.max_ack_pending,
                &want.max_ack_pending,
            );
            diff(
                &mut changed,
                "tenant_weights",
                &have.metadata.get(TENANT_WEIGHTS_KEY),
                &want.metadata.get(TENANT_WEIGHTS_KEY),
            );
            if changed.is_empty() {
                Ok(Change::Unchanged(what))
            } else {
                stream
                    .update_consumer(want)
                    .await
                    .with_context(|| format!("cannot update {what}"))?;
                Ok(Change::Updated(what, changed))
            }
        }
        Err(_) => {
            stream
                .create_consumer(want)
                .await
                .with_context(|| format!("cannot create {what}"))?;
            Ok(Change::Created(what))
        }
    }
}

/// Who answers a bucket's reads.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Reads {
    /// Any replica (direct gets): the cheapest, but a replica that has not
    /// caught up (one just restarted) answers with what it has, even
    /// "not there" for a record written a moment ago.
    AnyReplica,
    /// The stream's leader only (direct gets off): a read sees every write
    /// acknowledged before it. For records whose writer or another process
    /// acts on the read at once: job status, the gateway's files and
    /// batches (the fault soak saw a just-uploaded file answer 404, and a
    /// batch record read as missing, from a replica that had restarted).
    Leader,
}

/// A key-value bucket, on file: see [`ensure_kv_bucket_on`].
async fn ensure_kv_bucket(
    js: &jetstream::Context,
    bucket: &str,
    description: &str,
    max_age: Duration,
    replicas: usize,
    reads: Reads,
) -> Result<Change> {
    let storage = stream::StorageType::File;
    ensure_kv_bucket_on(js, bucket, description, max_age, replicas, storage, reads).await
}

/// A key-value bucket: created, or its age, replicas and reads changed in
/// place (a bucket is a stream named `KV_<bucket>`). `max_age` zero keeps
/// entries until deleted.
async fn ensure_kv_bucket_on(
    js: &jetstream::Context,
    bucket: &str,
    description: &str,
    max_age: Duration,
    replicas: usize,
    storage: stream::StorageType,
    reads: Reads,
) -> Result<Change> {
    let what = format!("key-value bucket {bucket}");
    let allow_direct = reads == Reads::AnyReplica;
    if js.get_key_value(bucket).await.is_ok() {
        let mut backing = js.get_stream(format!("KV_{bucket}")).await?;
        let mut config = backing.info().await?.config.clone();
        let mut changed = Vec::new();
        diff(&mut changed, "max_age", &config.max_age, &max_age);
        diff(&mut changed, "replicas", &config.num_replicas, &replicas);
        diff(
            &mut changed,
            "allow_direct",
            &config.allow_direct,
            &allow_direct,
        );
        if changed.is_empty() {
            return Ok(Change::Unchanged(what));
        }
        config.max_age = max_age;
        config.num_replicas = replicas;
        config.allow_direct = allow_direct;
        js.update_stream(&config)
            .await
            .with_context(|| format!("cannot update {what}"))?;
        return Ok(Change::Updated(what, changed));
    }
    js.create_key_value(kv::Config {
        bucket: bucket.to_string(),
        description: description.into(),
        history: 1,
        max_age,
        num_replicas: replicas,
        storage,
        ..Default::default()
    })
    .await
    .with_context(|| format!("cannot create {what}"))?;
    if !allow_direct {
        // async-nats makes every bucket with direct gets on.
        let mut backing = js.get_stream(format!("KV_{bucket}")).await?;
        let mut config = backing.info().await?.config.clone();
        config.allow_direct = false;
        js.update_stream(&config)
            .await
            .with_context(|| format!("cannot make {what} read from its leader"))?;
    }
    Ok(Change::Created(what))
}

/// The models bucket made to hold the settings' records (a model left out
/// is removed: publishers are refused it from then on, while its subjects
/// and durable consumers stay, so the jobs waiting there still run). A task
/// whose default would change is refused: the jobs waiting on its plain
/// subjects were published for the old one.
async fn ensure_models(js: &jetstream::Context, t: &Topology, s: &Settings) -> Result<Vec<Change>> {
    let bucket = &t.models_bucket;
    let mut changes = vec![
        ensure_kv_bucket(
            js,
            bucket,
            "sluice deployed models, one record per task and model",
            Duration::ZERO,
            s.replicas,
            Reads::AnyReplica,
        )
        .await?,
    ];
    let kv = js.get_key_value(bucket).await?;
    let have = sluice_connect::models::records(&kv).await?;
    let want = s.deployed_models();
    check_defaults(&have, &want, bucket)?;
    for m in &want {
        let what = format!("model {}/{}", m.task, m.model);
        let change = match have.iter().find(|h| h.key() == m.key()) {
            Some(h) if h == m => Change::Unchanged(what.clone()),
            Some(h) => Change::Updated(
                what.clone(),
                vec![format!("default {} -> {}", h.default, m.default)],
            ),
            None => Change::Created(format!(
                "{what} ({})",
                match m.route() {
                    None => format!("the default: {}", t.job_subject(&m.task)),
                    Some(route) => format!(
                        "{}.*",
                        t.subject_of(&Route {
                            task: m.task.clone(),
                            model: Some(route),
                            priority: Priority::Normal,
                            tenant: None,
                        })
                    ),
                }
            )),
        };
        if !matches!(change, Change::Unchanged(_)) {
            let record = serde_json::to_vec(m)?;
            kv.put(m.key(), record.into())
                .await
                .with_context(|| format!("cannot write {what} to {bucket}"))?;
        }
        changes.push(change);
    }
    for h in have
        .iter()
        .filter(|h| !want.iter().any(|m| m.key() == h.key()))
    {
        kv.delete(h.key())
            .await
            .with_context(|| format!("cannot remove model {}/{} from {bucket}", h.task, h.model))?;
        changes.push(Change::Removed(format!(
            "model {}/{} (publishers are refused it now; its waiting jobs stay)",
            h.task, h.model
        )));
    }
    Ok(changes)
}

/// Refuses settings that would give a task another default model than the
/// one recorded (`have`).
fn check_defaults(have: &[DeployedModel], want: &[DeployedModel], bucket: &str) -> Result<()> {
    for old in have.iter().filter(|h| h.default) {
        let new = want.iter().find(|m| m.task == old.task && m.default);
        if let Some(new) = new
            && new.model != old.model
        {
            bail!(
                "the settings make {} the default {} model, but it is {} (recorded in {bucket}): \
                 the jobs waiting on the plain subjects were published for {}. List {} first \
                 among the {} models, or drain its jobs and delete its record \
                 (`nats kv del {bucket} {}`) before making another the default",
                new.model,
                old.task,
                old.model,
                old.model,
                old.model,
                old.task,
                old.key()
            );
        }
    }
    Ok(())
}

async fn ensure_bucket(s3: &aws_sdk_s3::Client, bucket: &str) -> Result<Change> {
    let what = format!("S3 bucket {bucket}");
    if s3.head_bucket().bucket(bucket).send().await.is_ok() {
        return Ok(Change::Unchanged(what));
    }
    s3.create_bucket()
        .bucket(bucket)
        .send()
        .await
        .map_err(|e| {
            anyhow::anyhow!(
                "cannot create {what}: {}",
                aws_sdk_s3::error::DisplayErrorContext(e)
            )
        })?;
    Ok(Change::Created(what))
}

/// Creates or updates everything a deployment needs; returns what it did.
pub async fn ensure(
    js: &jetstream::Context,
    s3: Option<&aws_sdk_s3::Client>,
    bucket: &str,
    t: &Topology,
    s: &Settings,
) -> Result<Vec<Change>> {
    // The models first: a refused change of a task's default leaves
    // everything else as it was.
    let mut models = ensure_models(js, t, s).await?;
    let have = match js.get_stream(&t.job_stream).await {
        Ok(mut stream) => stream.info().await?.config.subjects.clone(),
        Err(_) => Vec::new(),
    };
    let mut changes = vec![ensure_stream(js, job_stream_config(t, s, &have)).await?];
    // In task order: an older deployment's unfiltered embed consumer gets its
    // filter before another task's consumer can be created beside it.
    for task in Task::ALL {
        // Normal first: an older deployment's consumer of the plain subject
        // is the normal level's, and gets its filter before the others'.
        for priority in [Priority::Normal, Priority::High, Priority::Low] {
            let plain = consumer_config(t, s, task, None, priority);
            changes.push(ensure_consumer(js, &t.job_stream, plain).await?);
        }
    }
    for m in s.deployed_models() {
        let (Some(task), Some(model)) = (Task::parse(&m.task), m.route()) else {
            continue;
        };
        for priority in [Priority::Normal, Priority::High, Priority::Low] {
            let routed = consumer_config(t, s, task, Some(&model), priority);
            changes.push(ensure_consumer(js, &t.job_stream, routed).await?);
        }
    }
    changes.append(&mut models);
    changes.push(ensure_stream(js, dlq_stream_config(t, s)).await?);
    changes.push(
        ensure_kv_bucket(
            js,
            &t.status_bucket,
            "sluice job status, one record per job id",
            s.status_max_age,
            s.replicas,
            Reads::Leader,
        )
        .await?,
    );
    // The gateway's files and batches: kept until deleted.
    changes.push(
        ensure_kv_bucket(
            js,
            &t.gateway_bucket,
            "sluice gateway: OpenAI-compatible files and batches",
            Duration::ZERO,
            s.replicas,
            Reads::Leader,
        )
        .await?,
    );
    // The live consumers' heartbeats: short-lived by design, so in memory
    // (every consumer writes its record again within seconds of a restart).
    changes.push(
        ensure_kv_bucket_on(
            js,
            &t.consumers_bucket,
            "sluice live consumers, one record per process, kept fresh by its heartbeat",
            sluice_schemas::consumers::HEARTBEAT_TTL,
            s.replicas,
            stream::StorageType::Memory,
            Reads::AnyReplica,
        )
        .await?,
    );
    if let Some(s3) = s3 {
        changes.push(ensure_bucket(s3, bucket).await?);
    }
    Ok(changes)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn tenant_weights_are_checked_and_travel_as_consumer_metadata() {
        let s = Settings::from_toml("[tenant_weights]\nacme = 3\nbeta = 1\n").unwrap();
        let c = consumer_config(&Topology::default(), &s, Task::Embed, None, Priority::Low);
        assert_eq!(c.metadata[TENANT_WEIGHTS_KEY], "acme=3,beta=1");
        let none = consumer_config(
            &Topology::default(),
            &Settings::default(),
            Task::Embed,
            None,
            Priority::Low,
        );
        assert!(none.metadata.is_empty());
        let e = Settings::from_toml("[tenant_weights]\n\"a.b\" = 2\n").unwrap_err();
        assert!(e.to_string().contains("not a tenant name"), "{e}");
        let e = Settings::from_toml("[tenant_weights]\nacme = 0\n").unwrap_err();
        assert!(e.to_string().contains("must be 1 to 1000"), "{e}");
    }

    const TWO_EMBED_MODELS: &str = r#"
[[models]]
task = "embed"
name = "minilm"

[[models]]
task = "embed"
name = "bge-small"
tenant_weights = { acme = 5 }

[[models]]
task = "generate"
name = "smollm2"
"#;

    #[test]
    fn the_first_model_of_a_task_is_its_default_and_the_others_are_routed() {
        let s = Settings::from_toml(TWO_EMBED_MODELS).unwrap();
        let routes: Vec<_> = s
            .deployed_models()
            .iter()
            .map(|m| (m.key(), m.route()))
            .collect();
        assert_eq!(
            routes,
            [
                ("embed.minilm".to_string(), None),
                ("embed.bge-small".to_string(), Some("bge-small".to_string())),
                ("generate.smollm2".to_string(), None),
            ]
        );
        let t = Topology::default();
        let subjects = job_stream_config(&t, &s, &[]).subjects;
        assert_eq!(subjects.len(), t.job_subjects().len() + 6);
        assert!(subjects.contains(&"sluice.jobs.embed.model.bge-small.low.*".to_string()));
        let c = consumer_config(&t, &s, Task::Embed, Some("bge-small"), Priority::High);
        assert_eq!(
            c.durable_name.as_deref(),
            Some("sluice-workers-high@bge-small")
        );
        assert_eq!(c.filter_subject, "sluice.jobs.embed.model.bge-small.high");
        assert_eq!(c.metadata[TENANT_WEIGHTS_KEY], "acme=5");
        let plain = consumer_config(&t, &s, Task::Embed, None, Priority::Normal);
        assert_eq!(plain.durable_name.as_deref(), Some("sluice-workers"));
        assert!(
            plain.metadata.is_empty(),
            "the default model's weights are the top level's"
        );
    }

    #[test]
    fn a_routed_models_subjects_stay_when_it_leaves_the_settings() {
        let t = Topology::default();
        let before = Settings::from_toml(TWO_EMBED_MODELS).unwrap();
        let have = job_stream_config(&t, &before, &[]).subjects;
        let after = job_stream_config(&t, &Settings::default(), &have).subjects;
        assert_eq!(after, have, "no waiting job is stranded");
        let fresh = job_stream_config(&t, &Settings::default(), &[]).subjects;
        assert_eq!(fresh, t.job_subjects());
    }

    #[test]
    fn bad_models_are_refused_naming_the_entry() {
        let cases = [
            (
                "[[models]]\ntask = \"summarize\"\nname = \"m\"\n",
                "models[0].task = \"summarize\": not a task",
            ),
            (
                "[[models]]\ntask = \"embed\"\nname = \"bge-v1.5\"\n",
                "models[0].name = \"bge-v1.5\"",
            ),
            (
                "[[models]]\ntask = \"embed\"\nname = \"m\"\n[[models]]\ntask = \"embed\"\nname = \"m\"\n",
                "models[1]: model \"m\" of embed is listed twice",
            ),
            (
                "[[models]]\ntask = \"embed\"\nname = \"m\"\ntenant_weights = { acme = 0 }\n",
                "models[0].tenant_weights.acme = 0",
            ),
            (
                "[[models]]\ntask = \"embed\"\nname = \"m\"\nweights = 2\n",
                "weights",
            ),
        ];
        for (toml, want) in cases {
            let e = format!("{:#}", Settings::from_toml(toml).unwrap_err());
            assert!(e.contains(want), "{toml}: {e}");
        }
    }

    #[test]
    fn a_tasks_default_model_cannot_change_under_its_waiting_jobs() {
        let record = |model: &str, default| DeployedModel {
            task: "embed".into(),
            model: model.into(),
            default,
        };
        let have = [record("minilm", true), record("bge", false)];
        let swapped = [record("bge", true), record("minilm", false)];
        let e = check_defaults(&have, &swapped, "sluice-models")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("make bge the default embed model, but it is minilm"),
            "{e}"
        );
        assert!(e.contains("nats kv del sluice-models embed.minilm"), "{e}");
        // The same default, another model added or removed: fine; a task
        // with no record yet takes any default.
        check_defaults(&have, &[record("minilm", true)], "b").unwrap();
        check_defaults(&[], &swapped, "b").unwrap();
    }

    #[test]
    fn the_shipped_settings_file_spells_out_the_defaults() {
        let text = include_str!("../../deploy/sluice.toml");
        assert_eq!(Settings::from_toml(text).unwrap(), Settings::default());
    }

    #[test]
    fn keys_left_out_keep_their_defaults() {
        let s = Settings::from_toml("ack_wait_secs = 30\nreplicas = 3\n").unwrap();
        assert_eq!(s.ack_wait, Duration::from_secs(30));
        assert_eq!(s.replicas, 3);
        assert_eq!(s.max_deliver, Settings::default().max_deliver);
    }

    #[test]
    fn bad_settings_are_refused_naming_the_key() {
        let e = Settings::from_toml("ack_wiat_secs = 30\n").unwrap_err();
        assert!(format!("{e:#}").contains("ack_wiat_secs"), "{e:#}");
        let e = Settings::from_toml("max_deliver = 1\n").unwrap_err();
        assert!(format!("{e:#}").contains("max_deliver = 1"), "{e:#}");
        let e = Settings::from_toml("replicas = 7\n").unwrap_err();
        assert!(format!("{e:#}").contains("replicas = 7"), "{e:#}");
        let e = Settings::from_toml("ack_wait_secs = \"60s\"\n").unwrap_err();
        assert!(format!("{e:#}").contains("ack_wait_secs"), "{e:#}");
    }
}
