//! Live counts of a deployment for `sluice watch`: what waits in the stream,
//! what consumers hold, and how jobs ended (from the status bucket).

use std::collections::HashMap;

use anyhow::{Context, Result};
use async_nats::jetstream::kv;
use futures::{StreamExt, TryStreamExt};
use serde::Serialize;
use sluice_schemas::{JobState, Priority, StatusRecord, Task};

use crate::Producer;

/// One reading of a deployment.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Counts {
    /// Status records by state.
    pub queued: u64,
    pub running: u64,
    pub done: u64,
    pub failed: u64,
    pub cancelled: u64,
    /// Deadline passed before the job ran (dropped from the stream at its
    /// deadline, or refused by a consumer that pulled it late).
    pub expired: u64,
    /// Messages in the dead-letter stream.
    pub dead_lettered: u64,
    /// Job stream figures.
    pub stream: StreamFigures,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct StreamFigures {
    /// Jobs stored in the job stream (not yet acked or terminated).
    pub messages: u64,
    pub bytes: u64,
    /// Not yet delivered to any consumer.
    pub pending: u64,
    /// Delivered and not yet acked: held by consumers right now.
    pub in_flight: u64,
    /// Delivered more than once and not yet acked.
    pub redelivered: u64,
    /// Pull requests waiting for jobs (idle consumer capacity).
    pub waiting_pulls: u64,
    /// Not yet delivered, by priority (`pending` is their sum).
    pub pending_by_priority: PendingByPriority,
    /// Not yet delivered, by tenant (`default`: the plain subjects'; a
    /// tenant no consumer process has taken jobs of yet counts all its jobs).
    pub pending_by_tenant: std::collections::BTreeMap<String, u64>,
}

/// The backlog of each priority level.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct PendingByPriority {
    pub high: u64,
    pub normal: u64,
    pub low: u64,
}

impl PendingByPriority {
    fn add(&mut self, priority: Priority, n: u64) {
        *match priority {
            Priority::High => &mut self.high,
            Priority::Normal => &mut self.normal,
            Priority::Low => &mut self.low,
        } += n;
    }
}

/// The latest state of every job in the status bucket, kept up to date from a
/// KV watch, so that a live view costs one message per change, not one read
/// per job per refresh.
#[derive(Default)]
pub struct StatusTally {
    /// Each job's state and, while queued, its deadline (a queued job past
    /// it counts as expired: see `StatusRecord::as_of`).
    states: HashMap<String, (JobState, Option<time::OffsetDateTime>)>,
}

impl StatusTally {
    pub fn apply(&mut self, entry: &kv::Entry) {
        match entry.operation {
            kv::Operation::Put => {
                if let Ok(r) = serde_json::from_slice::<StatusRecord>(&entry.value) {
                    self.states.insert(entry.key.clone(), (r.state, r.deadline));
                }
            }
            kv::Operation::Delete | kv::Operation::Purge => {
                self.states.remove(&entry.key);
            }
        }
    }

    pub fn fill(&self, counts: &mut Counts) {
        counts.queued = 0;
        counts.running = 0;
        counts.done = 0;
        counts.failed = 0;
        counts.cancelled = 0;
        counts.expired = 0;
        let now = time::OffsetDateTime::now_utc();
        for (state, deadline) in self.states.values() {
            *match state.as_of(*deadline, now) {
                JobState::Queued => &mut counts.queued,
                JobState::Running => &mut counts.running,
                JobState::Done => &mut counts.done,
                JobState::Failed => &mut counts.failed,
                JobState::Cancelled => &mut counts.cancelled,
                JobState::Expired => &mut counts.expired,
            } += 1;
        }
    }
}

/// A live view: the status tally follows the bucket, stream figures are read
/// on each [`Watcher::read`].
pub struct Watcher<'a> {
    producer: &'a Producer,
    tally: StatusTally,
    updates: Option<kv::Watch>,
}

impl<'a> Watcher<'a> {
    /// Starts watching and reads the bucket's current records.
    pub async fn start(producer: &'a Producer) -> Result<Watcher<'a>> {
        let store = producer.status_store().await?;
        let mut tally = StatusTally::default();
        let stored = store
            .status()
            .await
            .context("cannot read the status bucket")?
            .values();
        let mut updates = store
            .watch_with_history(">")
            .await
            .context("cannot watch the status bucket")?;
        if stored > 0 {
            // The first entries are the latest record of every key; `delta`
            // counts down to 0 on the last of them.
            // (Bounded: records that expire meanwhile would leave it short.)
            while let Ok(Some(entry)) =
                tokio::time::timeout(std::time::Duration::from_secs(5), updates.next()).await
            {
                let entry = entry.context("watching the status bucket")?;
                tally.apply(&entry);
                if entry.delta == 0 {
                    break;
                }
            }
        }
        Ok(Watcher {
            producer,
            tally,
            updates: Some(updates),
        })
    }

    /// Takes in the status changes that arrived since the last read, then
    /// reads the stream figures.
    pub async fn read(&mut self) -> Result<Counts> {
        if let Some(updates) = self.updates.as_mut() {
            loop {
                match futures::FutureExt::now_or_never(updates.next()) {
                    Some(Some(Ok(entry))) => self.tally.apply(&entry),
                    Some(Some(Err(e))) => {
                        return Err(e).context("watching the status bucket");
                    }
                    Some(None) => {
                        self.updates = None;
                        break;
                    }
                    None => break,
                }
            }
        }
        let mut counts = Counts::default();
        self.tally.fill(&mut counts);
        let p = self.producer;
        let t = &p.topology;
        let mut jobs = p.js.get_stream(&t.job_stream).await.with_context(|| {
            format!(
                "cannot open the job stream {} (not created yet? run `sluice init`)",
                t.job_stream
            )
        })?;
        let state = jobs.info().await?.state.clone();
        counts.stream.messages = state.messages;
        counts.stream.bytes = state.bytes;
        // Each task's and level's durable consumer holds its own backlog:
        // add them up.
        for (task, priority) in Task::ALL
            .into_iter()
            .flat_map(|t| Priority::ALL.map(|p| (t, p)))
        {
            let name = t.consumer_at(task, priority);
            let info = jobs.consumer_info(&name).await.with_context(|| {
                format!("cannot read the consumer {name} (not created yet? run `sluice init`)")
            })?;
            counts.stream.pending += info.num_pending;
            counts
                .stream
                .pending_by_priority
                .add(priority, info.num_pending);
            counts.stream.in_flight += info.num_ack_pending as u64;
            counts.stream.redelivered += info.num_redelivered as u64;
            counts.stream.waiting_pulls += info.num_waiting as u64;
            *counts
                .stream
                .pending_by_tenant
                .entry(sluice_schemas::DEFAULT_TENANT.into())
                .or_default() += info.num_pending;
        }
        // Tenants' jobs: their subjects' counts, and their consumers'
        // figures where a consumer process has created one.
        let tenant_subjects = jobs
            .info_with_subjects(format!("{}.*.*.*", t.job_subject_prefix))
            .await?
            .try_collect::<Vec<(String, usize)>>()
            .await?;
        for (subject, stored) in tenant_subjects {
            let Some(route) = t.route_of(&subject) else {
                continue;
            };
            let task = Task::ALL.into_iter().find(|k| k.as_str() == route.task);
            let (Some(tenant), Some(task)) = (route.tenant, task) else {
                continue;
            };
            let name = t.tenant_consumer(task, route.priority, &tenant);
            let pending = match jobs.consumer_info(&name).await {
                Ok(info) => {
                    counts.stream.in_flight += info.num_ack_pending as u64;
                    counts.stream.redelivered += info.num_redelivered as u64;
                    counts.stream.waiting_pulls += info.num_waiting as u64;
                    info.num_pending
                }
                Err(_) => stored as u64,
            };
            counts.stream.pending += pending;
            counts
                .stream
                .pending_by_priority
                .add(route.priority, pending);
            *counts.stream.pending_by_tenant.entry(tenant).or_default() += pending;
        }
        let mut dlq = p.js.get_stream(&t.dlq_stream).await.with_context(|| {
            format!(
                "cannot open the dead-letter stream {} (not created yet? run `sluice init`)",
                t.dlq_stream
            )
        })?;
        counts.dead_lettered = dlq.info().await?.state.messages;
        Ok(counts)
    }

    /// Waits up to `for_how_long` for status changes, taking them in as they come.
    pub async fn follow(&mut self, for_how_long: std::time::Duration) -> Result<()> {
        let deadline = tokio::time::Instant::now() + for_how_long;
        while let Some(updates) = self.updates.as_mut() {
            match tokio::time::timeout_at(deadline, updates.next()).await {
                Ok(Some(Ok(entry))) => self.tally.apply(&entry),
                Ok(Some(Err(e))) => return Err(e).context("watching the status bucket"),
                Ok(None) => self.updates = None,
                Err(_) => return Ok(()),
            }
        }
        tokio::time::sleep_until(deadline).await;
        Ok(())
    }
}
