//! Admission: reserve a job's worst case for each message before asking for
//! it, pull at most that many, hand each to its own task, and release what
//! the pull did not fill. The backlog stays in the stream.
//!
//! Each round ([`Admission::round`]):
//!
//! 1. **Plan** ([`PullPlan::round`]): stop at the recycle job limit; hold
//!    back while the in-flight cap of a batching task is full.
//! 2. **Reserve** one job's worst case, waiting for room, then as many more
//!    as the budget has room for (up to `--pull-max-messages`).
//! 3. **Busy round** ([`Admission::busy_round`]): ask the levels in
//!    [`LevelShares::order`] and, within a level, its tenants with jobs
//!    waiting in [`TenantShares::order`], with a pull that returns at once,
//!    stopping at the first that has jobs. While a level has several
//!    tenants a pull asks for about one quantum of tokens
//!    ([`PullPlan::pull_size`]), so the shares stay even.
//! 4. **Idle** ([`Admission::idle`]): when nothing had jobs, each queue gets
//!    one long-poll of its own under one reservation ([`plan::idle_queues`]),
//!    and admission listens on the tenant subjects, so a job anywhere is
//!    taken as soon as it is published (a tenant seen for the first time:
//!    at once, or within `--tenant-refresh-ms`).
//!
//! On stop: [`Admission::drain`] (see `service::Consumer::shutdown`).

mod idle;
mod levels;
mod plan;
mod queues;
mod tenants;

use std::ops::ControlFlow;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, consumer::PullConsumer};
use futures::stream::FuturesUnordered;
use futures::{FutureExt, StreamExt};
use sluice_schemas::{DEFAULT_TENANT, Priority};
use tokio::sync::watch;
use tokio::task::JoinSet;

pub use levels::LevelShares;
pub use plan::{InFlightCap, PullPlan, QueueKey, Round};
pub use queues::{JobStream, TenantQueues};
pub use tenants::{TenantShares, parse_weights};

use crate::budget::{Budget, Reservation};
use crate::job;
use crate::shared::Shared;
use idle::{Delivered, IdlePoll, long_poll};

/// Where admission pulls from: each level's durable consumer (the default
/// tenant's), each tenant's, and the tenants' shares.
pub struct Queues {
    pub levels: Vec<(Priority, PullConsumer)>,
    pub tenants: TenantQueues,
    pub shares: TenantShares,
}

/// The stop signal: `Some(drain)` once the process is stopping.
pub type Stop = watch::Receiver<Option<Duration>>;

/// Admission's state: what it pulls from, the shares it keeps, the job
/// tasks it started and its idle long-polls.
pub struct Admission {
    shared: Arc<Shared>,
    budget: Budget,
    plan: PullPlan,
    levels: Vec<(Priority, PullConsumer)>,
    /// The levels that have a durable consumer.
    present: Vec<Priority>,
    tenant_queues: TenantQueues,
    level_shares: Arc<LevelShares>,
    tenant_shares: Arc<TenantShares>,
    /// One task per job taken.
    jobs: JoinSet<()>,
    /// Set when the drain deadline passes: running jobs Nak and end.
    abort: watch::Sender<bool>,
    idle: FuturesUnordered<IdlePoll>,
    /// The queues `idle` has a long-poll on.
    polling: Vec<QueueKey>,
    /// While idle: tenant jobs as they are published (see [`Admission::idle`]).
    arrivals: Option<async_nats::Subscriber>,
    backoff: Duration,
    /// Jobs taken in all (for the recycle job limit).
    taken: u64,
    /// When the current round asked (each job's queue wait ends here).
    asked_at: Instant,
}

/// A pull that failed on a level's own consumer (the whole round backs off).
struct PullFailed(async_nats::jetstream::consumer::pull::BatchError);

impl Admission {
    pub fn new(shared: Arc<Shared>, queues: Queues, budget: Budget, plan: PullPlan) -> Admission {
        let present = queues.levels.iter().map(|(p, _)| *p).collect();
        Admission {
            shared,
            budget,
            plan,
            levels: queues.levels,
            present,
            tenant_queues: queues.tenants,
            level_shares: Arc::new(LevelShares::default()),
            tenant_shares: Arc::new(queues.shares),
            jobs: JoinSet::new(),
            abort: watch::channel(false).0,
            idle: FuturesUnordered::new(),
            polling: Vec::new(),
            arrivals: None,
            backoff: Duration::from_millis(100),
            taken: 0,
            asked_at: Instant::now(),
        }
    }

    /// Admits until stopped, then drains.
    pub async fn run(mut self, mut stop: Stop) -> anyhow::Result<()> {
        while stop.borrow().is_none() {
            if self.round(&mut stop).await.is_break() {
                break;
            }
        }
        self.drain(&stop).await;
        Ok(())
    }

    /// One round (see the module's steps); `Break` on stop.
    async fn round(&mut self, stop: &mut Stop) -> ControlFlow<()> {
        self.reap();
        let most = match self.plan.round(self.taken, self.tokens_admitted()) {
            Round::Recycled => {
                // `run` stops us once the jobs taken have finished.
                let _ = stop.changed().await;
                return ControlFlow::Break(());
            }
            Round::Full => {
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(2)) => return ControlFlow::Continue(()),
                    _ = stop.changed() => return ControlFlow::Break(()),
                }
            }
            Round::Pull { most } => most,
        };
        self.tenant_queues.refresh_if_due().await;
        self.asked_at = Instant::now();
        let Some(mut reservations) = self.reserve(most, stop).await? else {
            return ControlFlow::Continue(());
        };
        match self.busy_round(&mut reservations).await {
            Err(PullFailed(e)) => {
                tracing::warn!(error = %e, retry_in_ms = self.backoff.as_millis() as u64, "pull failed");
                drop(reservations);
                tokio::select! {
                    _ = tokio::time::sleep(self.backoff) => {},
                    _ = stop.changed() => return ControlFlow::Break(()),
                }
                self.backoff = (self.backoff * 2).min(Duration::from_secs(5));
                ControlFlow::Continue(())
            }
            Ok(got) => {
                self.backoff = Duration::from_millis(100);
                if got > 0 {
                    self.arrivals = None;
                    return ControlFlow::Continue(());
                }
                self.idle(reservations, stop).await
            }
        }
    }

    /// Reaps finished job tasks, and takes what idle long-polls delivered.
    fn reap(&mut self) {
        while self.jobs.try_join_next().is_some() {}
        while let Some(Some(done)) = self.idle.next().now_or_never() {
            self.idle_done(done);
        }
    }

    /// Tokens in flight, as the in-flight cap counts them (0 without one).
    fn tokens_admitted(&self) -> u64 {
        self.plan.in_flight_cap.map_or(0, |cap| {
            let per_job = self
                .shared
                .stats
                .mean_tokens_per_job()
                .unwrap_or(cap.per_job);
            self.shared.in_flight.tokens_admitted(per_job)
        })
    }

    /// Reserves one job's worst case, waiting for room (or taking what an
    /// idle long-poll delivers meanwhile: `None`), then up to `most` in all
    /// without waiting.
    async fn reserve(
        &mut self,
        most: usize,
        stop: &mut Stop,
    ) -> ControlFlow<(), Option<Vec<Reservation>>> {
        let worst = self.shared.cost.worst_bytes();
        let first = tokio::select! {
            r = self.budget.reserve(worst) => Some(r),
            Some(done) = self.idle.next(), if !self.idle.is_empty() => {
                self.idle_done(done);
                None
            }
            _ = stop.changed() => return ControlFlow::Break(()),
        };
        let Some(first) = first else {
            return ControlFlow::Continue(None);
        };
        let mut reservations = vec![first];
        while reservations.len() < most {
            match self.budget.try_reserve(worst) {
                Some(r) => reservations.push(r),
                None => break,
            }
        }
        ControlFlow::Continue(Some(reservations))
    }

    /// Asks the levels in share order, and their tenants in share order, at
    /// once, until one has jobs; returns how many it took.
    async fn busy_round(
        &mut self,
        reservations: &mut Vec<Reservation>,
    ) -> Result<usize, PullFailed> {
        for level in self.level_shares.order(&self.present) {
            let Some(plain) = self.level_consumer(level) else {
                continue;
            };
            let tenants = self.tenant_queues.backlogged(level);
            let several = tenants.len() > 1;
            for tenant in self.tenant_shares.order(level.index(), &tenants) {
                let consumer = if tenant == DEFAULT_TENANT {
                    plain.clone()
                } else if let Some(c) = self.tenant_queues.consumer(level, tenant) {
                    c
                } else {
                    continue;
                };
                let want = self.plan.pull_size(
                    reservations.len(),
                    several,
                    self.tokens_admitted(),
                    |tokens| {
                        self.tenant_shares
                            .jobs_per_quantum(tenant, tokens, self.plan.job_estimate)
                    },
                );
                let queue = (level, tenant.clone());
                let got = match self.pull(&consumer, queue, want, reservations).await {
                    Ok(got) => got,
                    Err(e) if tenant != DEFAULT_TENANT => {
                        tracing::debug!(error = %e.0, %tenant, %level, "pull from a tenant's consumer failed; looking it up again");
                        self.tenant_queues.forget(level, tenant);
                        continue;
                    }
                    Err(e) => return Err(e),
                };
                if got > 0 {
                    return Ok(got);
                }
                if several {
                    self.tenant_shares.found_empty(tenant, &tenants);
                }
            }
            self.level_shares.found_empty(level, &self.present);
        }
        Ok(0)
    }

    /// One pull that answers at once: up to `want` of `queue`'s jobs, each
    /// taken under one of `reservations`.
    async fn pull(
        &mut self,
        consumer: &PullConsumer,
        queue: QueueKey,
        want: usize,
        reservations: &mut Vec<Reservation>,
    ) -> Result<usize, PullFailed> {
        let mut messages = consumer
            .fetch()
            .max_messages(want)
            .messages()
            .await
            .map_err(PullFailed)?;
        // A reply lost with its server (a killed stream leader) must not
        // leave admission waiting forever, so the wait is bounded.
        let give_up = tokio::time::Instant::now() + self.plan.expires + Duration::from_secs(5);
        let mut got = 0;
        while let Ok(Some(next)) = tokio::time::timeout_at(give_up, messages.next()).await {
            match next {
                Ok(msg) => {
                    let Some(reservation) = reservations.pop() else {
                        tracing::error!(
                            "bug: a pull delivered more messages than it asked for; Nak'ing it"
                        );
                        job::nak_now(&msg).await;
                        continue;
                    };
                    got += 1;
                    self.take(msg, queue.clone(), reservation);
                }
                Err(e) => {
                    tracing::debug!(error = %e, "pull ended with an error");
                    break;
                }
            }
        }
        Ok(got)
    }

    /// Nothing had jobs: a long-poll per queue that has none yet, highest
    /// level first, each under one of the reservations (queues left without
    /// one are asked again next round); then wait for one to deliver (or all
    /// to expire), for a tenant's job, for the next look at the tenants, or
    /// for stop.
    async fn idle(
        &mut self,
        mut reservations: Vec<Reservation>,
        stop: &mut Stop,
    ) -> ControlFlow<()> {
        let queues = plan::idle_queues(
            &self.present,
            |l| self.tenant_queues.backlogged(l),
            &self.polling,
        );
        for queue in queues {
            let consumer = if queue.1 == DEFAULT_TENANT {
                self.level_consumer(queue.0)
            } else {
                self.tenant_queues.consumer(queue.0, &queue.1)
            };
            let Some(consumer) = consumer else {
                continue;
            };
            let Some(reservation) = reservations.pop() else {
                break;
            };
            self.polling.push(queue.clone());
            self.idle
                .push(long_poll(consumer, queue, reservation, self.plan.expires));
        }
        drop(reservations);
        // Idle long-polls wait on the tenants that had jobs at the last look
        // only; a job of another tenant (an API key's online request after a
        // quiet spell) would wait for the next look. So while idle, listen
        // to the tenant subjects: such a job makes its tenant's queue ready
        // at once (the listening ends when admission takes jobs again).
        if self.arrivals.is_none() {
            self.arrivals = self
                .shared
                .js
                .client()
                .subscribe(self.tenant_queues.arrivals())
                .await
                .map_err(|e| tracing::debug!(error = %e, "cannot listen for tenant jobs; new tenants are found at the next look"))
                .ok();
        }
        let arrivals = &mut self.arrivals;
        let arrival = async {
            match arrivals.as_mut() {
                Some(sub) => sub.next().await,
                None => std::future::pending().await,
            }
        };
        enum Woke {
            Delivered(Box<Delivered>),
            Arrived(String),
            Look,
        }
        let woke = tokio::select! {
            Some(done) = self.idle.next(), if !self.idle.is_empty() => Woke::Delivered(Box::new(done)),
            Some(msg) = arrival => Woke::Arrived(msg.subject.to_string()),
            _ = tokio::time::sleep_until(self.tenant_queues.next_at()) => Woke::Look,
            _ = stop.changed() => return ControlFlow::Break(()),
        };
        match woke {
            Woke::Delivered(done) => self.idle_done(*done),
            Woke::Arrived(subject) => {
                if let Some(queue) = self.tenant_queues.arrived(&subject).await
                    && !self.polling.contains(&queue)
                {
                    tracing::debug!(tenant = %queue.1, level = %queue.0, "a tenant's job arrived while idle");
                }
            }
            Woke::Look => {}
        }
        ControlFlow::Continue(())
    }

    /// What an idle long-poll delivered.
    fn idle_done(&mut self, (queue, msg, reservation): Delivered) {
        self.polling.retain(|q| *q != queue);
        if let Some(msg) = msg {
            self.take(msg, queue, reservation);
        }
    }

    fn level_consumer(&self, level: Priority) -> Option<PullConsumer> {
        self.levels
            .iter()
            .find(|(l, _)| *l == level)
            .map(|(_, c)| c.clone())
    }

    /// Hands one delivered job to its own task; its tokens are charged to
    /// its level and tenant when it ends (the tenant's estimate at once).
    fn take(
        &mut self,
        msg: jetstream::Message,
        (level, tenant): QueueKey,
        reservation: Reservation,
    ) {
        let counted = self.shared.in_flight.job();
        self.taken += 1;
        let estimate = self.tenant_shares.estimate(&tenant, self.plan.job_estimate);
        self.tenant_shares.taken(&tenant, estimate);
        let shared = Arc::clone(&self.shared);
        let level_shares = Arc::clone(&self.level_shares);
        let tenant_shares = Arc::clone(&self.tenant_shares);
        let (abort, asked_at) = (self.abort.subscribe(), self.asked_at);
        self.jobs.spawn(async move {
            let stats = Arc::clone(&shared.stats);
            let tokens = job::handle(shared, msg, reservation, asked_at, abort).await;
            level_shares.charge(level, tokens);
            tenant_shares.finished(&tenant, estimate, tokens);
            drop(counted);
            stats.jobs_finished.fetch_add(1, Ordering::Relaxed);
        });
    }

    /// Stopped: what the idle long-polls still deliver goes back at once;
    /// the jobs running get the drain time to finish, then are Nak'd for
    /// redelivery elsewhere.
    async fn drain(mut self, stop: &Stop) {
        while let Some((_, msg, _)) = self.idle.next().await {
            if let Some(msg) = msg {
                job::nak_now(&msg).await;
            }
        }
        let drain = stop.borrow().unwrap_or_default();
        let in_flight = self.jobs.len();
        tracing::info!(in_flight, drain_secs = drain.as_secs_f64(), "draining");
        let jobs = &mut self.jobs;
        let finished =
            tokio::time::timeout(drain, async { while jobs.join_next().await.is_some() {} }).await;
        if finished.is_err() {
            tracing::warn!(
                still_running = self.jobs.len(),
                "drain deadline passed: Nak'ing the jobs still running for redelivery elsewhere"
            );
            self.abort.send_replace(true);
            while self.jobs.join_next().await.is_some() {}
        }
    }
}
