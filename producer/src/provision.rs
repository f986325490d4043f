//! `sluice init`: creates or updates, idempotently, the job stream, the durable
//! pull consumer, the dead-letter stream, the status bucket and the S3 bucket.

use std::time::Duration;

use anyhow::{Context, Result};
use async_nats::jetstream::{self, consumer, kv, stream};
use sluice_schemas::Topology;

/// The knobs of the topology, with production defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// How long a re-published job id is recognized as a duplicate.
    pub duplicate_window: Duration,
    /// Largest job message the stream accepts (inputs go behind URLs).
    pub max_message_bytes: i32,
    /// How long a delivered job may go without an ack or progress ack.
    pub ack_wait: Duration,
    /// Deliveries before a job is given up (and dead-lettered).
    pub max_deliver: i64,
    /// Unacked deliveries allowed across the whole fleet of consumers.
    pub max_ack_pending: i64,
    /// Replicas of streams and bucket (3 in a production cluster).
    pub replicas: usize,
    /// How long dead letters are kept.
    pub dlq_max_age: Duration,
    /// How long status records are kept.
    pub status_max_age: Duration,
}

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
        }
    }
}

/// What `ensure` did to one resource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    Created(String),
    Updated(String),
    Unchanged(String),
}

impl std::fmt::Display for Change {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Change::Created(w) => write!(f, "created   {w}"),
            Change::Updated(w) => write!(f, "updated   {w}"),
            Change::Unchanged(w) => write!(f, "unchanged {w}"),
        }
    }
}

pub fn job_stream_config(t: &Topology, s: &Settings) -> stream::Config {
    stream::Config {
        name: t.job_stream.clone(),
        subjects: vec![t.job_subjects()],
        retention: stream::RetentionPolicy::WorkQueue,
        duplicate_window: s.duplicate_window,
        max_message_size: s.max_message_bytes,
        num_replicas: s.replicas,
        storage: stream::StorageType::File,
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
        duplicate_window: s.duplicate_window,
        num_replicas: s.replicas,
        storage: stream::StorageType::File,
        ..Default::default()
    }
}

pub fn consumer_config(t: &Topology, s: &Settings) -> consumer::pull::Config {
    consumer::pull::Config {
        durable_name: Some(t.consumer.clone()),
        ack_policy: consumer::AckPolicy::Explicit,
        ack_wait: s.ack_wait,
        max_deliver: s.max_deliver,
        max_ack_pending: s.max_ack_pending,
        // No `backoff`: it would replace ack_wait per attempt and redeliver
        // long jobs while they run. Consumers Nak with their own delays.
        ..Default::default()
    }
}

fn stream_differs(have: &stream::Config, want: &stream::Config) -> bool {
    have.subjects != want.subjects
        || have.duplicate_window != want.duplicate_window
        || have.max_message_size != want.max_message_size
        || have.num_replicas != want.num_replicas
        || have.max_age != want.max_age
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
            if stream_differs(&have, &want) {
                js.update_stream(&want)
                    .await
                    .with_context(|| format!("cannot update {what}"))?;
                Ok(Change::Updated(what))
            } else {
                Ok(Change::Unchanged(what))
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
            let same = have.ack_wait == want.ack_wait
                && have.max_deliver == want.max_deliver
                && have.max_ack_pending == want.max_ack_pending;
            if same {
                Ok(Change::Unchanged(what))
            } else {
                stream
                    .update_consumer(want)
                    .await
                    .with_context(|| format!("cannot update {what}"))?;
                Ok(Change::Updated(what))
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

async fn ensure_status_bucket(
    js: &jetstream::Context,
    t: &Topology,
    s: &Settings,
) -> Result<Change> {
    let what = format!("key-value bucket {}", t.status_bucket);
    if js.get_key_value(&t.status_bucket).await.is_ok() {
        return Ok(Change::Unchanged(what));
    }
    js.create_key_value(kv::Config {
        bucket: t.status_bucket.clone(),
        description: "sluice job status, one record per job id".into(),
        history: 1,
        max_age: s.status_max_age,
        num_replicas: s.replicas,
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
    let mut changes = vec![
        ensure_stream(js, job_stream_config(t, s)).await?,
        ensure_consumer(js, &t.job_stream, consumer_config(t, s)).await?,
        ensure_stream(js, dlq_stream_config(t, s)).await?,
        ensure_status_bucket(js, t, s).await?,
    ];
    if let Some(s3) = s3 {
        changes.push(ensure_bucket(s3, bucket).await?);
    }
    Ok(changes)
}
