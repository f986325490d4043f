//! This process's record in the consumers bucket (`sluice_schemas::consumers`):
//! written at start, again every [`HEARTBEAT_EVERY`], and removed when the
//! consumer starts to drain. A process that dies without a word drops out
//! when the bucket's max age passes. A deployment whose `sluice init`
//! predates the bucket gets no record (logged once); the bucket is looked
//! up again at each beat, so a later `init` is picked up without a restart.

use std::time::Duration;

use async_nats::jetstream::{self, kv};
use sluice_schemas::consumers::HEARTBEAT_EVERY;
use sluice_schemas::{LiveConsumer, Topology};
use tokio::sync::watch;

use crate::budget::Budget;

/// Where and what to beat.
pub struct Heartbeat {
    pub js: jetstream::Context,
    pub topology: Topology,
    pub record: LiveConsumer,
    pub budget: Budget,
}

impl Heartbeat {
    /// The record of this process serving `model` of `task` with `forward` on `device`.
    pub fn record(task: &str, model: &str, forward: &str, device: &str) -> LiveConsumer {
        let host = host_name();
        let pid = std::process::id();
        let started_at = time::OffsetDateTime::now_utc();
        LiveConsumer {
            id: LiveConsumer::id_for(&host, pid, started_at),
            task: task.into(),
            model: model.into(),
            forward: forward.into(),
            device: device.into(),
            budget_bytes: 0,
            version: env!("CARGO_PKG_VERSION").into(),
            host,
            pid,
            started_at,
            heartbeat_at: started_at,
        }
    }

    /// Writes the first record (before the consumer says it is ready, so
    /// that a ready consumer is listed), then beats in the background until
    /// `stop` says drain (or its sender goes), and removes the record; the
    /// handle ends when it is removed.
    pub async fn start(
        mut self,
        stop: watch::Receiver<Option<Duration>>,
    ) -> tokio::task::JoinHandle<()> {
        let mut warned = false;
        self.beat_logged(&mut warned).await;
        tokio::spawn(self.run(stop, warned))
    }

    async fn run(mut self, mut stop: watch::Receiver<Option<Duration>>, mut warned: bool) {
        let mut tick = tokio::time::interval_at(
            tokio::time::Instant::now() + HEARTBEAT_EVERY,
            HEARTBEAT_EVERY,
        );
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => self.beat_logged(&mut warned).await,
                changed = stop.changed() => {
                    if changed.is_err() || stop.borrow().is_some() {
                        break;
                    }
                }
            }
        }
        if let Some(bucket) = self.bucket().await
            && let Err(e) = bucket.purge(self.record.key()).await
        {
            tracing::warn!(error = %e, "cannot remove this consumer's record; it expires by itself");
        }
    }

    /// Writes the record, saying once that there is no bucket (`warned`).
    async fn beat_logged(&mut self, warned: &mut bool) {
        match self.beat().await {
            Ok(true) => *warned = false,
            Ok(false) if !*warned => {
                *warned = true;
                tracing::warn!(
                    bucket = %self.topology.consumers_bucket,
                    "no consumers bucket: this consumer is not listed as live \
                     (run `sluice init` to create it)"
                );
            }
            Ok(false) => {}
            Err(e) => tracing::warn!(error = %e, "cannot write this consumer's heartbeat"),
        }
    }

    /// Writes the record; `false` when there is no bucket.
    async fn beat(&mut self) -> anyhow::Result<bool> {
        let Some(bucket) = self.bucket().await else {
            return Ok(false);
        };
        self.record.heartbeat_at = time::OffsetDateTime::now_utc();
        self.record.budget_bytes = self.budget.snapshot().limit_bytes;
        bucket
            .put(self.record.key(), serde_json::to_vec(&self.record)?.into())
            .await?;
        Ok(true)
    }

    async fn bucket(&self) -> Option<kv::Store> {
        self.js
            .get_key_value(&self.topology.consumers_bucket)
            .await
            .ok()
    }
}

/// The host name (the pod's name in Kubernetes), or `unknown`.
fn host_name() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "unknown".into())
}
