//! The tenants' durable consumers of one task and model route: found by asking the stream
//! which tenant subjects hold jobs (every `--tenant-refresh-ms`), created on
//! first sight (by whichever consumer process sees the tenant first; the
//! others bind to it), and deleted by the server after an hour without a
//! pull. Generic over [`JobStream`] so its tests run on a fake stream.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::time::Duration;

use async_nats::jetstream::consumer::{PullConsumer, pull};
use async_nats::jetstream::stream::Stream;
use futures::TryStreamExt;
use sluice_schemas::{Priority, Route, Task, Topology};
use tokio::time::Instant;

use super::plan::QueueKey;

/// What [`TenantQueues`] asks of the job stream.
pub trait JobStream: Send + Sync {
    type Consumer: Clone + Send + Sync;
    /// The subjects matching `filter` and how many messages each holds.
    fn subjects(
        &self,
        filter: &str,
    ) -> impl Future<Output = anyhow::Result<Vec<(String, usize)>>> + Send;
    /// The durable consumer `name`, created with `config` if it is missing.
    fn consumer(
        &self,
        name: &str,
        config: pull::Config,
    ) -> impl Future<Output = anyhow::Result<Self::Consumer>> + Send;
}

impl JobStream for Stream {
    type Consumer = PullConsumer;

    async fn subjects(&self, filter: &str) -> anyhow::Result<Vec<(String, usize)>> {
        let subjects = self.info_with_subjects(filter).await?;
        Ok(subjects.try_collect().await?)
    }

    async fn consumer(&self, name: &str, config: pull::Config) -> anyhow::Result<PullConsumer> {
        Ok(self.get_or_create_consumer(name, config).await?)
    }
}

pub struct TenantQueues<S: JobStream = Stream> {
    stream: S,
    topology: Topology,
    task: Task,
    /// The model route pulled (`None`: the task's plain subjects).
    model: Option<String>,
    /// The level consumers' settings (ack wait, deliveries, ...), which
    /// each tenant's consumer takes over.
    template: pull::Config,
    refresh: Duration,
    next_at: Instant,
    consumers: HashMap<QueueKey, S::Consumer>,
    backlogged: [Vec<String>; 3],
    /// Tenants whose consumer could not be created (warned once).
    refused: HashSet<QueueKey>,
    /// Called with each tenant consumer's name once it exists (to listen
    /// for its MAX_DELIVERIES advisories).
    on_new: Box<dyn Fn(String) + Send + Sync>,
}

/// How long a tenant's durable consumer lives without a pull.
const TENANT_CONSUMER_IDLE: Duration = Duration::from_secs(3600);

impl<S: JobStream> TenantQueues<S> {
    pub fn new(
        stream: S,
        topology: Topology,
        task: Task,
        model: Option<String>,
        template: pull::Config,
        refresh: Duration,
        on_new: Box<dyn Fn(String) + Send + Sync>,
    ) -> TenantQueues<S> {
        TenantQueues {
            stream,
            topology,
            task,
            model,
            template,
            refresh,
            next_at: Instant::now(),
            consumers: HashMap::new(),
            backlogged: Default::default(),
            refused: HashSet::new(),
            on_new,
        }
    }

    /// When the next look at the stream is due.
    pub fn next_at(&self) -> Instant {
        self.next_at
    }

    /// The tenants with jobs in the stream at `level` as of the last look
    /// (the default tenant's plain subject included); the default tenant
    /// alone when none had.
    pub fn backlogged(&self, level: Priority) -> Vec<String> {
        match &self.backlogged[level.index()] {
            none if none.is_empty() => vec![sluice_schemas::DEFAULT_TENANT.to_string()],
            some => some.clone(),
        }
    }

    pub fn consumer(&self, level: Priority, tenant: &str) -> Option<S::Consumer> {
        self.consumers.get(&(level, tenant.to_string())).cloned()
    }

    /// A pull from the tenant's consumer failed (deleted as idle, say):
    /// forget it; the next look creates it again if the tenant has jobs.
    pub fn forget(&mut self, level: Priority, tenant: &str) {
        self.consumers.remove(&(level, tenant.to_string()));
        self.backlogged[level.index()].retain(|t| t != tenant);
    }

    /// The subjects of this task's tenant jobs, at every level: while
    /// admission is idle it listens there (core NATS) for a job of a tenant
    /// no long-poll waits on.
    pub fn arrivals(&self) -> String {
        format!(
            "{}.*.*",
            self.topology
                .subject_of(&self.route(Priority::Normal, None))
        )
    }

    /// The route of this task's and model's jobs of `tenant` at `level`.
    fn route(&self, level: Priority, tenant: Option<&str>) -> Route {
        Route {
            task: self.task.as_str().to_string(),
            model: self.model.clone(),
            priority: level,
            tenant: tenant.map(str::to_string),
        }
    }

    /// Whether a job of `route` is one of this task's and model's.
    fn pulls(&self, route: &Route) -> bool {
        route.task == self.task.as_str() && route.model == self.model
    }

    /// A job arrived on `subject` (see [`TenantQueues::arrivals`]): its
    /// tenant counts as backlogged at its level from now, its consumer made
    /// if need be, without waiting for the next look at the stream. Returns
    /// its queue when it is a tenant's of this task.
    pub async fn arrived(&mut self, subject: &str) -> Option<QueueKey> {
        let route = self.topology.route_of(subject)?;
        if !self.pulls(&route) {
            return None;
        }
        let (level, tenant) = (route.priority, route.tenant_name().to_string());
        if tenant == sluice_schemas::DEFAULT_TENANT || !self.ensure_consumer(level, &tenant).await {
            return None;
        }
        let have = &mut self.backlogged[level.index()];
        if !have.contains(&tenant) {
            have.push(tenant.clone());
            have.sort();
        }
        Some((level, tenant))
    }

    /// Looks at the stream again if it is time. A failed look keeps what the
    /// last one found.
    pub async fn refresh_if_due(&mut self) {
        if Instant::now() < self.next_at {
            return;
        }
        self.next_at = Instant::now() + self.refresh;
        // Every job subject: the plain ones (the default tenant's) too.
        let filter = format!("{}.>", self.topology.job_subject_prefix);
        let look = self.stream.subjects(&filter);
        let subjects = match tokio::time::timeout(Duration::from_secs(5), look).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "cannot list tenant subjects; keeping the last list");
                return;
            }
            Err(_) => {
                tracing::debug!("listing tenant subjects timed out; keeping the last list");
                return;
            }
        };
        let mut found: [Vec<String>; 3] = Default::default();
        for (subject, count) in subjects {
            let Some(route) = self.topology.route_of(&subject) else {
                continue;
            };
            if self.pulls(&route) && count > 0 {
                found[route.priority.index()].push(route.tenant_name().to_string());
            }
        }
        for level in Priority::ALL {
            let mut have = Vec::new();
            for tenant in std::mem::take(&mut found[level.index()]) {
                if tenant == sluice_schemas::DEFAULT_TENANT
                    || self.ensure_consumer(level, &tenant).await
                {
                    have.push(tenant);
                }
            }
            have.dedup();
            have.sort();
            self.backlogged[level.index()] = have;
        }
    }

    async fn ensure_consumer(&mut self, level: Priority, tenant: &str) -> bool {
        let key = (level, tenant.to_string());
        if self.consumers.contains_key(&key) {
            return true;
        }
        let name =
            self.topology
                .model_consumer(self.task, self.model.as_deref(), level, Some(tenant));
        let config = pull::Config {
            name: Some(name.clone()),
            durable_name: Some(name.clone()),
            filter_subject: self.topology.subject_of(&self.route(level, Some(tenant))),
            inactive_threshold: TENANT_CONSUMER_IDLE,
            ..self.template.clone()
        };
        match self.stream.consumer(&name, config).await {
            Ok(consumer) => {
                self.refused.remove(&key);
                tracing::info!(consumer = %name, %tenant, %level, "taking a tenant's jobs");
                (self.on_new)(name);
                self.consumers.insert(key, consumer);
                true
            }
            Err(e) => {
                if self.refused.insert(key) {
                    tracing::warn!(consumer = %name, %tenant, %level, error = %e, "cannot create a tenant's durable consumer: its jobs wait (check the NATS permissions: $JS.API.CONSUMER.CREATE)");
                }
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};

    use super::*;
    use Priority::*;

    /// A job stream in memory: the subjects a look finds, whether looks
    /// fail, which consumer names it refuses to create, what it created.
    #[derive(Default)]
    struct FakeStream {
        subjects: Mutex<Vec<(String, usize)>>,
        look_fails: AtomicBool,
        refuse: Mutex<HashSet<String>>,
        made: Mutex<Vec<pull::Config>>,
    }

    impl JobStream for Arc<FakeStream> {
        type Consumer = String;

        async fn subjects(&self, filter: &str) -> anyhow::Result<Vec<(String, usize)>> {
            anyhow::ensure!(
                !self.look_fails.load(Ordering::Relaxed),
                "stream info failed"
            );
            let prefix = filter.strip_suffix('>').unwrap();
            let all = self.subjects.lock().unwrap().clone();
            Ok(all
                .into_iter()
                .filter(|(s, _)| s.starts_with(prefix))
                .collect())
        }

        async fn consumer(&self, name: &str, config: pull::Config) -> anyhow::Result<String> {
            anyhow::ensure!(
                !self.refuse.lock().unwrap().contains(name),
                "permission denied"
            );
            let mut made = self.made.lock().unwrap();
            if !made.iter().any(|c| c.name.as_deref() == Some(name)) {
                made.push(config);
            }
            Ok(name.to_string())
        }
    }

    fn topology() -> Topology {
        Topology::default()
    }

    fn subject(task: &str, level: Priority, tenant: &str) -> String {
        topology().job_subject_for(task, level, Some(tenant))
    }

    type Queues = TenantQueues<Arc<FakeStream>>;

    /// Queues of the embed task over `stream`, looking again after
    /// `refresh`, and the consumer names its `on_new` was called with.
    fn queues(stream: &Arc<FakeStream>, refresh: Duration) -> (Queues, Arc<Mutex<Vec<String>>>) {
        model_queues(stream, refresh, None)
    }

    /// The same for the embed task's routed `model`.
    fn model_queues(
        stream: &Arc<FakeStream>,
        refresh: Duration,
        model: Option<&str>,
    ) -> (Queues, Arc<Mutex<Vec<String>>>) {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let on_new = {
            let seen = Arc::clone(&seen);
            Box::new(move |name: String| seen.lock().unwrap().push(name))
        };
        let template = pull::Config {
            ack_wait: Duration::from_secs(77),
            max_deliver: 5,
            ..Default::default()
        };
        let q = TenantQueues::new(
            Arc::clone(stream),
            topology(),
            Task::Embed,
            model.map(str::to_string),
            template,
            refresh,
            on_new,
        );
        (q, seen)
    }

    fn names(tenants: &[&str]) -> Vec<String> {
        tenants.iter().map(|t| t.to_string()).collect()
    }

    #[tokio::test]
    async fn a_look_finds_each_levels_tenants_and_makes_their_consumers() {
        let stream = Arc::new(FakeStream::default());
        *stream.subjects.lock().unwrap() = vec![
            (topology().job_subject("embed"), 3),
            (subject("embed", Normal, "zeta"), 2),
            (subject("embed", Normal, "acme"), 2),
            (subject("embed", High, "acme"), 1),
            (subject("embed", Low, "zed"), 4),
            // Drained: nothing to take.
            (subject("embed", Normal, "beta"), 0),
            // Another task's tenant.
            (subject("generate", Normal, "gamma"), 5),
        ];
        let (mut q, seen) = queues(&stream, Duration::from_secs(3600));
        assert_eq!(q.backlogged(Normal), names(&["default"]), "before any look");
        q.refresh_if_due().await;
        assert_eq!(q.backlogged(Normal), names(&["acme", "default", "zeta"]));
        assert_eq!(q.backlogged(High), names(&["acme"]));
        assert_eq!(q.backlogged(Low), names(&["zed"]));
        let t = topology();
        let expected = [
            t.tenant_consumer(Task::Embed, Normal, "acme"),
            t.tenant_consumer(Task::Embed, Normal, "zeta"),
            t.tenant_consumer(Task::Embed, High, "acme"),
            t.tenant_consumer(Task::Embed, Low, "zed"),
        ];
        let mut seen = seen.lock().unwrap().clone();
        seen.sort();
        let mut sorted = expected.to_vec();
        sorted.sort();
        assert_eq!(seen, sorted, "one on_new per tenant consumer made");
        assert_eq!(q.consumer(Normal, "acme"), Some(expected[0].clone()));
        assert_eq!(
            q.consumer(Normal, "default"),
            None,
            "the level's own consumer"
        );
        assert_eq!(q.consumer(Normal, "gamma"), None);
        // Each consumer filters its tenant's subject, forgets itself after
        // an hour idle, and takes the level consumer's settings.
        let made = stream.made.lock().unwrap().clone();
        assert_eq!(made.len(), 4);
        let acme_high = made
            .iter()
            .find(|c| c.name.as_deref() == Some(expected[2].as_str()))
            .unwrap();
        assert_eq!(
            acme_high.durable_name.as_deref(),
            Some(expected[2].as_str())
        );
        assert_eq!(acme_high.filter_subject, subject("embed", High, "acme"));
        assert_eq!(acme_high.inactive_threshold, TENANT_CONSUMER_IDLE);
        assert_eq!(
            (acme_high.ack_wait, acme_high.max_deliver),
            (Duration::from_secs(77), 5)
        );
    }

    #[tokio::test]
    async fn a_failed_look_keeps_the_last_list_and_a_refused_consumer_is_asked_again() {
        let stream = Arc::new(FakeStream::default());
        let beta = topology().tenant_consumer(Task::Embed, Normal, "beta");
        *stream.subjects.lock().unwrap() = vec![
            (subject("embed", Normal, "acme"), 1),
            (subject("embed", Normal, "beta"), 1),
        ];
        stream.refuse.lock().unwrap().insert(beta.clone());
        let (mut q, seen) = queues(&stream, Duration::ZERO);
        q.refresh_if_due().await;
        // beta's consumer could not be made: its jobs wait, not counted.
        assert_eq!(q.backlogged(Normal), names(&["acme"]));
        assert_eq!(q.consumer(Normal, "beta"), None);
        stream.look_fails.store(true, Ordering::Relaxed);
        stream.refuse.lock().unwrap().clear();
        q.refresh_if_due().await;
        assert_eq!(q.backlogged(Normal), names(&["acme"]), "kept");
        stream.look_fails.store(false, Ordering::Relaxed);
        q.refresh_if_due().await;
        assert_eq!(q.backlogged(Normal), names(&["acme", "beta"]));
        assert_eq!(q.consumer(Normal, "beta"), Some(beta.clone()));
        assert_eq!(seen.lock().unwrap().last(), Some(&beta));
        // The jobs drain: the tenant is not backlogged, its consumer kept.
        *stream.subjects.lock().unwrap() = vec![(subject("embed", Normal, "beta"), 0)];
        q.refresh_if_due().await;
        assert_eq!(q.backlogged(Normal), names(&["default"]));
        assert_eq!(q.consumer(Normal, "beta"), Some(beta));
    }

    #[tokio::test]
    async fn no_look_before_it_is_due() {
        let stream = Arc::new(FakeStream::default());
        let (mut q, _) = queues(&stream, Duration::from_secs(3600));
        q.refresh_if_due().await;
        *stream.subjects.lock().unwrap() = vec![(subject("embed", Normal, "acme"), 1)];
        q.refresh_if_due().await;
        assert_eq!(q.backlogged(Normal), names(&["default"]));
        assert!(q.next_at() > Instant::now() + Duration::from_secs(3000));
    }

    #[tokio::test]
    async fn a_job_arriving_while_idle_makes_its_tenant_backlogged_at_once() {
        let stream = Arc::new(FakeStream::default());
        let (mut q, seen) = queues(&stream, Duration::from_secs(3600));
        assert_eq!(
            q.arrivals(),
            format!("{}.embed.*.*", topology().job_subject_prefix)
        );
        let queue = q.arrived(&subject("embed", High, "new")).await;
        assert_eq!(queue, Some((High, "new".to_string())));
        assert_eq!(q.backlogged(High), names(&["new"]));
        assert_eq!(seen.lock().unwrap().len(), 1);
        // Again: no second consumer.
        q.arrived(&subject("embed", High, "new")).await;
        assert_eq!(
            (q.backlogged(High).len(), seen.lock().unwrap().len()),
            (1, 1)
        );
        // Not a tenant job of this task.
        assert_eq!(q.arrived(&subject("generate", High, "new")).await, None);
        assert_eq!(q.arrived(&topology().job_subject("embed")).await, None);
        assert_eq!(q.arrived(&subject("embed", Low, "default")).await, None);
        assert_eq!(q.arrived("elsewhere.embed.high.new").await, None);
        // A pull from it failed (deleted as idle): forgotten until seen again.
        q.forget(High, "new");
        assert_eq!(q.consumer(High, "new"), None);
        assert_eq!(q.backlogged(High), names(&["default"]));
    }

    fn model_subject(model: &str, level: Priority, tenant: Option<&str>) -> String {
        topology().subject_of(&Route {
            task: "embed".into(),
            model: Some(model.into()),
            priority: level,
            tenant: tenant.map(str::to_string),
        })
    }

    #[tokio::test]
    async fn a_routed_models_queues_see_only_its_jobs_and_the_plain_ones_none_of_them() {
        let stream = Arc::new(FakeStream::default());
        *stream.subjects.lock().unwrap() = vec![
            (topology().job_subject("embed"), 3),
            (subject("embed", Normal, "acme"), 2),
            (model_subject("bge", Normal, None), 1),
            (model_subject("bge", High, Some("zeta")), 2),
            (model_subject("e5", Low, Some("acme")), 2),
        ];
        let (mut bge, made) = model_queues(&stream, Duration::from_secs(3600), Some("bge"));
        bge.refresh_if_due().await;
        assert_eq!(bge.backlogged(Normal), names(&["default"]));
        assert_eq!(bge.backlogged(High), names(&["zeta"]));
        assert_eq!(
            bge.backlogged(Low),
            names(&["default"]),
            "e5's tenant is not bge's"
        );
        let zeta = topology().model_consumer(Task::Embed, Some("bge"), High, Some("zeta"));
        assert_eq!(zeta, "sluice-workers-high-t-zeta@bge");
        assert_eq!(*made.lock().unwrap(), vec![zeta.clone()]);
        let config = stream.made.lock().unwrap()[0].clone();
        assert_eq!(
            config.filter_subject,
            model_subject("bge", High, Some("zeta"))
        );
        assert_eq!(
            bge.arrivals(),
            format!("{}.embed.model.bge.*.*", topology().job_subject_prefix)
        );
        assert_eq!(
            bge.arrived(&model_subject("e5", High, Some("new"))).await,
            None
        );
        assert_eq!(bge.arrived(&subject("embed", High, "new")).await, None);
        assert_eq!(
            bge.arrived(&model_subject("bge", Low, Some("new"))).await,
            Some((Low, "new".to_string()))
        );
        // The default model's queues: the plain tenants only.
        let (mut plain, _) = queues(&stream, Duration::from_secs(3600));
        plain.refresh_if_due().await;
        assert_eq!(plain.backlogged(Normal), names(&["acme", "default"]));
        assert_eq!(plain.backlogged(High), names(&["default"]));
        assert_eq!(
            plain.arrived(&model_subject("bge", Normal, None)).await,
            None
        );
    }
}
