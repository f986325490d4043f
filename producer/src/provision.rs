//! `sluice init`: creates or updates, idempotently, the job stream, the durable
//! pull consumer, the dead-letter stream, the status bucket and the S3 bucket.

use std::time::Duration;

use anyhow::{Context, Result, bail};
use async_nats::jetstream::{self, consumer, kv, stream};
use sluice_schemas::{Priority, Task, Topology};

/// The knobs of the topology, with production defaults. `deploy/sluice.toml`
/// spells out every one of them; `sluice init --config FILE` reads such a file
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
            status_max_age: Duration::from_secs(7 * 24 * 3600),
            tenant_weights: Default::default(),
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
        for (tenant, weight) in &self.tenant_weights {
            if !sluice_schemas::is_valid_tenant(tenant) {
                bail!(
                    "tenant_weights: {tenant:?} is not a tenant name (1 to 64 of A-Z a-z 0-9 - _)"
                );
            }
            if !(1..=1000).contains(weight) {
                bail!("tenant_weights.{tenant} = {weight}: must be 1 to 1000");
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
}

impl Change {
    /// For `--json`: `{"action": "created" | "updated" | "unchanged", "resource": ..., "changes": [...]}`.
    pub fn to_json(&self) -> serde_json::Value {
        let (action, resource, changes) = match self {
            Change::Created(r) => ("created", r, &[][..]),
            Change::Updated(r, c) => ("updated", r, &c[..]),
            Change::Unchanged(r) => ("unchanged", r, &[][..]),
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
        }
    }
}

pub fn job_stream_config(t: &Topology, s: &Settings) -> stream::Config {
    stream::Config {
        name: t.job_stream.clone(),
        subjects: t.job_subjects(),
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

/// The durable consumer of `task`'s jobs at `priority`: filtered to that
/// subject, so each task's processes share their own consumers and never
/// pull another task's jobs (a work-queue stream needs the filters not to
/// overlap), and a consumer process can prefer one level over another.
pub fn consumer_config(
    t: &Topology,
    s: &Settings,
    task: Task,
    priority: Priority,
) -> consumer::pull::Config {
    consumer::pull::Config {
        durable_name: Some(t.consumer_at(task, priority)),
        filter_subject: t.job_subject_at(task.as_str(), priority),
        ack_policy: consumer::AckPolicy::Explicit,
        ack_wait: s.ack_wait,
        max_deliver: s.max_deliver,
        max_ack_pending: s.max_ack_pending,
        // No `backoff`: it would replace ack_wait per attempt and redeliver
        // long jobs while they run. Consumers Nak with their own delays.
        metadata: tenant_weights_metadata(s),
        ..Default::default()
    }
}

fn tenant_weights_metadata(s: &Settings) -> std::collections::HashMap<String, String> {
    if s.tenant_weights.is_empty() {
        return Default::default();
    }
    let weights = s
        .tenant_weights
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

/// A key-value bucket: created, or its age and replicas changed in place
/// (a bucket is a stream named `KV_<bucket>`). `max_age` zero keeps
/// entries until deleted.
async fn ensure_kv_bucket(
    js: &jetstream::Context,
    bucket: &str,
    description: &str,
    max_age: Duration,
    replicas: usize,
) -> Result<Change> {
    let what = format!("key-value bucket {bucket}");
    if js.get_key_value(bucket).await.is_ok() {
        let mut backing = js.get_stream(format!("KV_{bucket}")).await?;
        let mut config = backing.info().await?.config.clone();
        let mut changed = Vec::new();
        diff(&mut changed, "max_age", &config.max_age, &max_age);
        diff(&mut changed, "replicas", &config.num_replicas, &replicas);
        if changed.is_empty() {
            return Ok(Change::Unchanged(what));
        }
        config.max_age = max_age;
        config.num_replicas = replicas;
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
        storage: stream::StorageType::File,
        ..Default::default()
    })
    .await
    .with_context(|| format!("cannot create {what}"))?;
    Ok(Change::Created(what))
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
    let mut changes = vec![ensure_stream(js, job_stream_config(t, s)).await?];
    // In task order: an older deployment's unfiltered embed consumer gets its
    // filter before another task's consumer can be created beside it.
    for task in Task::ALL {
        // Normal first: an older deployment's consumer of the plain subject
        // is the normal level's, and gets its filter before the others'.
        for priority in [Priority::Normal, Priority::High, Priority::Low] {
            changes.push(
                ensure_consumer(js, &t.job_stream, consumer_config(t, s, task, priority)).await?,
            );
        }
    }
    changes.push(ensure_stream(js, dlq_stream_config(t, s)).await?);
    changes.push(
        ensure_kv_bucket(
            js,
            &t.status_bucket,
            "sluice job status, one record per job id",
            s.status_max_age,
            s.replicas,
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
        let c = consumer_config(&Topology::default(), &s, Task::Embed, Priority::Low);
        assert_eq!(c.metadata[TENANT_WEIGHTS_KEY], "acme=3,beta=1");
        let none = consumer_config(
            &Topology::default(),
            &Settings::default(),
            Task::Embed,
            Priority::Low,
        );
        assert!(none.metadata.is_empty());
        let e = Settings::from_toml("[tenant_weights]\n\"a.b\" = 2\n").unwrap_err();
        assert!(e.to_string().contains("not a tenant name"), "{e}");
        let e = Settings::from_toml("[tenant_weights]\nacme = 0\n").unwrap_err();
        assert!(e.to_string().contains("must be 1 to 1000"), "{e}");
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
