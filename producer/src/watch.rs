//! Live counts of a deployment for `sluice watch`: what waits in the stream,
//! what consumers hold, and how jobs ended (from the status bucket).

use std::collections::HashMap;

use anyhow::{Context, Result};
use async_nats::jetstream::kv;
use futures::{StreamExt, TryStreamExt};
use serde::Serialize;
use sluice_schemas::{DeployedModels, JobState, LiveConsumer, Priority, Route, StatusRecord, Task};

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
    /// By model: a row per deployed model (`sluice init`'s `[[models]]`),
    /// and one per task whose jobs are not routed by model.
    pub models: Vec<ModelFigures>,
}

/// One model's (or one unrouted task's) share of the job stream.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ModelFigures {
    pub task: String,
    /// `None`: the task is not routed by model (no `[[models]]` of it), so
    /// this row is all its jobs whatever model they name.
    pub model: Option<String>,
    /// Not yet delivered.
    pub pending: u64,
    /// Delivered and not yet acked.
    pub in_flight: u64,
    /// Consumer processes serving it now (their heartbeat is recent).
    pub consumers: usize,
}

/// What one durable consumer (or one subject nobody consumes yet) holds.
#[derive(Debug, Clone, Copy, Default)]
struct Backlog {
    pending: u64,
    in_flight: u64,
    redelivered: u64,
    waiting_pulls: u64,
}

impl Counts {
    /// Adds one consumer's (or subject's) backlog at `route` (`None`: a
    /// consumer of no job subject of this topology, such as an unfiltered
    /// one from an old `init`: it counts in the totals only).
    fn add(&mut self, route: Option<&Route>, deployed: &DeployedModels, b: Backlog) {
        let s = &mut self.stream;
        s.pending += b.pending;
        s.in_flight += b.in_flight;
        s.redelivered += b.redelivered;
        s.waiting_pulls += b.waiting_pulls;
        let Some(route) = route else {
            return;
        };
        s.pending_by_priority.add(route.priority, b.pending);
        *s.pending_by_tenant
            .entry(route.tenant_name().to_string())
            .or_default() += b.pending;
        let model = route.model.clone().or_else(|| {
            deployed
                .of_task(&route.task)
                .next()
                .map(|m| m.model.clone())
        });
        if let Some(row) = self
            .models
            .iter_mut()
            .find(|r| r.task == route.task && r.model == model)
        {
            row.pending += b.pending;
            row.in_flight += b.in_flight;
        }
    }
}

/// A row per deployed model and per unrouted task, with its live consumers.
fn model_rows(deployed: &DeployedModels, live: &[LiveConsumer]) -> Vec<ModelFigures> {
    Task::ALL
        .iter()
        .flat_map(|task| {
            let task = task.as_str();
            let models: Vec<Option<String>> = match deployed.of_task(task).next() {
                None => vec![None],
                Some(_) => deployed
                    .of_task(task)
                    .map(|m| Some(m.model.clone()))
                    .collect(),
            };
            models.into_iter().map(move |model| ModelFigures {
                task: task.to_string(),
                consumers: match &model {
                    Some(m) => sluice_schemas::consumers::serving(live, task, m),
                    None => live.iter().filter(|c| c.task == task).count(),
                },
                model,
                ..ModelFigures::default()
            })
        })
        .collect()
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
        let deployed = sluice_connect::models::deployed_models(&p.js, t)
            .await?
            .unwrap_or_default();
        let live = sluice_connect::consumers::live_consumers(&p.js, t).await?;
        counts.models = model_rows(&deployed, &live);
        // Each durable consumer (a task's, model's, level's, tenant's) holds
        // its own backlog: add them up.
        let mut consumers = jobs.consumers();
        let mut bound = std::collections::HashSet::new();
        while let Some(info) = consumers.try_next().await? {
            let filter = info.config.filter_subject.clone();
            let route = t.route_of(&filter);
            bound.insert(filter);
            let figures = Backlog {
                pending: info.num_pending,
                in_flight: info.num_ack_pending as u64,
                redelivered: info.num_redelivered as u64,
                waiting_pulls: info.num_waiting as u64,
            };
            counts.add(route.as_ref(), &deployed, figures);
        }
        // A tenant's jobs no consumer process has taken yet wait on a
        // subject no durable filters: count what is stored there.
        let subjects = jobs
            .info_with_subjects(format!("{}.>", t.job_subject_prefix))
            .await?
            .try_collect::<Vec<(String, usize)>>()
            .await?;
        for (subject, stored) in subjects {
            if bound.contains(&subject) {
                continue;
            }
            let pending = Backlog {
                pending: stored as u64,
                ..Backlog::default()
            };
            counts.add(t.route_of(&subject).as_ref(), &deployed, pending);
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

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_schemas::DeployedModel;

    fn deployed() -> DeployedModels {
        let m = |model: &str, default| DeployedModel {
            task: "embed".into(),
            model: model.into(),
            default,
        };
        DeployedModels::new(vec![m("minilm", true), m("e5", false)])
    }

    fn route(task: &str, model: Option<&str>, priority: Priority, tenant: Option<&str>) -> Route {
        Route {
            task: task.into(),
            model: model.map(str::to_string),
            priority,
            tenant: tenant.map(str::to_string),
        }
    }

    fn backlog(pending: u64, in_flight: u64) -> Backlog {
        Backlog {
            pending,
            in_flight,
            ..Backlog::default()
        }
    }

    #[test]
    fn each_backlog_lands_in_the_totals_its_level_its_tenant_and_its_model() {
        let deployed = deployed();
        let mut c = Counts {
            models: model_rows(&deployed, &[]),
            ..Counts::default()
        };
        // (route, pending, in flight)
        let table = [
            (Some(route("embed", None, Priority::Normal, None)), 5, 1),
            (
                Some(route("embed", None, Priority::High, Some("acme"))),
                2,
                0,
            ),
            (Some(route("embed", Some("e5"), Priority::Low, None)), 7, 3),
            (
                Some(route("embed", Some("e5"), Priority::Normal, Some("acme"))),
                1,
                1,
            ),
            (Some(route("generate", None, Priority::Normal, None)), 4, 2),
            (None, 10, 0),
        ];
        for (r, pending, in_flight) in table {
            c.add(r.as_ref(), &deployed, backlog(pending, in_flight));
        }
        assert_eq!(c.stream.pending, 29);
        assert_eq!(c.stream.in_flight, 7);
        assert_eq!(
            c.stream.pending_by_priority,
            PendingByPriority {
                high: 2,
                normal: 10,
                low: 7
            }
        );
        assert_eq!(c.stream.pending_by_tenant["acme"], 3);
        assert_eq!(
            c.stream.pending_by_tenant[sluice_schemas::DEFAULT_TENANT],
            16
        );
        let row = |task: &str, model: Option<&str>| {
            let r = c
                .models
                .iter()
                .find(|r| r.task == task && r.model.as_deref() == model)
                .unwrap_or_else(|| panic!("no row {task}/{model:?} in {:?}", c.models));
            (r.pending, r.in_flight)
        };
        assert_eq!(row("embed", Some("minilm")), (7, 1));
        assert_eq!(row("embed", Some("e5")), (8, 4));
        assert_eq!(row("generate", None), (4, 2));
        assert_eq!(c.models.len(), 2 + Task::ALL.len() - 1);
    }
}
