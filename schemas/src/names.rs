//! Subjects, stream and bucket names, and header names: the one place they live.

use crate::Task;

/// A job's priority, chosen by the subject it is published to (see
/// [`Topology::job_subject_at`]). A consumer takes higher levels first but
/// gives each level with a backlog a guaranteed share of its token
/// throughput ([`Priority::weight`]), so `low` is never starved.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum Priority {
    High,
    Normal,
    Low,
}

impl Priority {
    /// In the order a consumer prefers them.
    pub const ALL: [Priority; 3] = [Priority::High, Priority::Normal, Priority::Low];

    pub fn as_str(self) -> &'static str {
        match self {
            Priority::High => "high",
            Priority::Normal => "normal",
            Priority::Low => "low",
        }
    }

    /// The level's share of token throughput while several levels have a
    /// backlog: 8 : 4 : 1.
    pub fn weight(self) -> u64 {
        match self {
            Priority::High => 8,
            Priority::Normal => 4,
            Priority::Low => 1,
        }
    }

    pub fn index(self) -> usize {
        self as usize
    }
}

impl std::fmt::Display for Priority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Priority {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Priority::ALL
            .into_iter()
            .find(|p| p.as_str() == s)
            .ok_or_else(|| format!("unknown priority {s:?}: use high, normal or low"))
    }
}

/// The tenant of jobs published to a task's plain (tenantless) subjects.
pub const DEFAULT_TENANT: &str = "default";

/// A tenant name is a NATS subject token and part of a durable consumer's
/// name: 1 to 64 of `A-Z a-z 0-9 - _`.
pub fn is_valid_tenant(tenant: &str) -> bool {
    !tenant.is_empty()
        && tenant.len() <= 64
        && tenant
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// A model name in a route is a NATS subject token and part of a durable
/// consumer's name: 1 to 64 of `A-Z a-z 0-9 - _` (the tenant's charset;
/// `bge-small-en-v1_5`, not `v1.5`).
pub fn is_valid_model(model: &str) -> bool {
    is_valid_tenant(model)
}

/// The subject token that says the next token is a model:
/// `<prefix>.<task>.model.<model>...`. Not a priority, so a subject with
/// it can never be read as `<prefix>.<task>.<level>.<tenant>`.
pub const MODEL_TOKEN: &str = "model";

/// Where a job subject sends a job: its task, model, priority and tenant
/// (see [`Topology::route_of`] and its inverse, [`Topology::subject_of`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    pub task: String,
    /// `None` on the task's plain subjects (no `model.<model>` tokens):
    /// the task's default model, served by its plain durable consumers.
    pub model: Option<String>,
    pub priority: Priority,
    /// `None` on the task's plain subjects: the [`DEFAULT_TENANT`].
    pub tenant: Option<String>,
}

impl Route {
    /// The tenant's name, [`DEFAULT_TENANT`] for none.
    pub fn tenant_name(&self) -> &str {
        self.tenant.as_deref().unwrap_or(DEFAULT_TENANT)
    }
}

/// The durable consumers' metadata key holding the tenants' weights in fair
/// share, as `tenant=weight,...` (`sluice init` writes it from the settings
/// file's `[tenant_weights]`; consumer processes read it when they start).
pub const TENANT_WEIGHTS_KEY: &str = "sluice.tenant_weights";

/// The JetStream stream that holds jobs waiting to run (work-queue retention).
pub const JOB_STREAM: &str = "SLUICE_JOBS";
/// Jobs are published to `sluice.jobs.<task>`, e.g. `sluice.jobs.embed`.
pub const JOB_SUBJECT_PREFIX: &str = "sluice.jobs";
/// The durable pull consumer every embed consumer process binds to; the
/// consumers of other tasks take this name plus `-<task>` (see
/// [`Topology::consumer_for`]).
pub const JOB_CONSUMER: &str = "sluice-workers";
/// The dead-letter stream (limits retention, so it can be browsed and replayed).
pub const DLQ_STREAM: &str = "SLUICE_DLQ";
/// Dead letters are published to `sluice.dlq.<task>`.
pub const DLQ_SUBJECT_PREFIX: &str = "sluice.dlq";
/// The KV bucket holding one status record per job, keyed by job id.
pub const STATUS_BUCKET: &str = "sluice-status";
/// The KV bucket of the OpenAI-compatible gateway (`sluice-gateway`): its
/// files (`file.<id>`) and batches (`batch.<id>`, and `active.<id>` while a
/// batch is not final).
pub const GATEWAY_BUCKET: &str = "sluice-gateway";
/// Key-value bucket of the deployed models, a record per (task, model)
/// (`sluice init` writes it from the settings file's `[[models]]`).
pub const MODELS_BUCKET: &str = "sluice-models";
/// Key-value bucket of the live consumer processes, a record per process
/// kept fresh by its heartbeat (see `crate::consumers`).
pub const CONSUMERS_BUCKET: &str = "sluice-consumers";
/// Where results go when a publisher names no reply subject: `sluice.results.<job id>`.
pub const RESULT_SUBJECT_PREFIX: &str = "sluice.results";
/// Where a streaming generate job's text goes as it is generated when the
/// job names no reply subject: `sluice.stream.<job id>` (core NATS, not
/// stored). A job with a `Sluice-Reply-To` streams under it instead (see
/// [`Topology::stream_subject_of`]).
pub const STREAM_SUBJECT_PREFIX: &str = "sluice.stream";
/// The token a job's reply subject is extended by for its streamed text:
/// `<Sluice-Reply-To>.text`.
pub const STREAM_REPLY_TOKEN: &str = "text";

/// The names of the streams, consumer, bucket and subjects one sluice
/// deployment uses. [`Topology::default`] is the production set above; a
/// namespaced one lets several deployments (or parallel tests) share a NATS server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topology {
    pub job_stream: String,
    pub job_subject_prefix: String,
    /// The embed task's durable consumer; see [`Topology::consumer_for`].
    pub consumer: String,
    pub dlq_stream: String,
    pub dlq_subject_prefix: String,
    pub status_bucket: String,
    pub result_subject_prefix: String,
    pub stream_subject_prefix: String,
    pub gateway_bucket: String,
    pub models_bucket: String,
    pub consumers_bucket: String,
}

impl Default for Topology {
    fn default() -> Self {
        Topology {
            job_stream: JOB_STREAM.into(),
            job_subject_prefix: JOB_SUBJECT_PREFIX.into(),
            consumer: JOB_CONSUMER.into(),
            dlq_stream: DLQ_STREAM.into(),
            dlq_subject_prefix: DLQ_SUBJECT_PREFIX.into(),
            status_bucket: STATUS_BUCKET.into(),
            result_subject_prefix: RESULT_SUBJECT_PREFIX.into(),
            stream_subject_prefix: STREAM_SUBJECT_PREFIX.into(),
            gateway_bucket: GATEWAY_BUCKET.into(),
            models_bucket: MODELS_BUCKET.into(),
            consumers_bucket: CONSUMERS_BUCKET.into(),
        }
    }
}

impl Topology {
    /// The standard names for an empty namespace, else [`Topology::namespaced`].
    pub fn for_namespace(ns: &str) -> Topology {
        if ns.is_empty() {
            Topology::default()
        } else {
            Topology::namespaced(ns)
        }
    }

    /// The default names with `ns` worked in: `SLUICE_JOBS_<ns>`, `<ns>.sluice.jobs`, ...
    /// `ns` must be a valid job-id-like token.
    pub fn namespaced(ns: &str) -> Topology {
        Topology {
            job_stream: format!("{JOB_STREAM}_{ns}"),
            job_subject_prefix: format!("{ns}.{JOB_SUBJECT_PREFIX}"),
            consumer: format!("{JOB_CONSUMER}-{ns}"),
            dlq_stream: format!("{DLQ_STREAM}_{ns}"),
            dlq_subject_prefix: format!("{ns}.{DLQ_SUBJECT_PREFIX}"),
            status_bucket: format!("{STATUS_BUCKET}-{ns}"),
            result_subject_prefix: format!("{ns}.{RESULT_SUBJECT_PREFIX}"),
            stream_subject_prefix: format!("{ns}.{STREAM_SUBJECT_PREFIX}"),
            gateway_bucket: format!("{GATEWAY_BUCKET}-{ns}"),
            models_bucket: format!("{MODELS_BUCKET}-{ns}"),
            consumers_bucket: format!("{CONSUMERS_BUCKET}-{ns}"),
        }
    }

    /// The subject a job of `task` is published to (the default model's,
    /// normal priority, the default tenant).
    pub fn job_subject(&self, task: &str) -> String {
        self.job_subject_at(task, Priority::Normal)
    }

    /// The subject of `task`'s jobs at `priority`: `normal` is the task's
    /// plain subject (what every publisher used before priorities), `high`
    /// and `low` add `.high` / `.low`.
    pub fn job_subject_at(&self, task: &str, priority: Priority) -> String {
        self.job_subject_for(task, priority, None)
    }

    /// The subject of `tenant`'s jobs of `task` at `priority`:
    /// `<prefix>.<task>.<high|normal|low>.<tenant>` (the level is always
    /// spelled out, so the tenant is always the fifth token). No tenant, or
    /// the [`DEFAULT_TENANT`]: [`Topology::job_subject_at`].
    pub fn job_subject_for(&self, task: &str, priority: Priority, tenant: Option<&str>) -> String {
        self.subject_of(&Route {
            task: task.to_string(),
            model: None,
            priority,
            tenant: tenant.map(str::to_string),
        })
    }

    /// The wildcard subject of every tenant's jobs of `task` at `priority`.
    pub fn tenant_subjects(&self, task: &str, priority: Priority) -> String {
        self.job_subject_for(task, priority, Some("*"))
    }

    /// The subject a job of `route` is published to; [`Topology::route_of`]
    /// reads it back. The grammar, after the job prefix:
    ///
    /// ```text
    /// <task>[.model.<model>]                      normal, the default tenant
    /// <task>[.model.<model>].<high|low>
    /// <task>[.model.<model>].<high|normal|low>.<tenant>
    /// ```
    ///
    /// Without `model.<model>`: the task's default model (the subjects
    /// every publisher used before models were routed).
    pub fn subject_of(&self, route: &Route) -> String {
        let mut subject = format!("{}.{}", self.job_subject_prefix, route.task);
        if let Some(model) = &route.model {
            subject = format!("{subject}.{MODEL_TOKEN}.{model}");
        }
        match (route.tenant.as_deref(), route.priority) {
            (Some(tenant), level) if tenant != DEFAULT_TENANT => {
                format!("{subject}.{}.{tenant}", level.as_str())
            }
            (_, Priority::Normal) => subject,
            (_, level) => format!("{subject}.{}", level.as_str()),
        }
    }

    /// What a job subject of this topology names; `None` for a subject
    /// outside the job stream's (or one [`Topology::subject_of`] never makes).
    pub fn route_of(&self, subject: &str) -> Option<Route> {
        let rest = subject
            .strip_prefix(self.job_subject_prefix.as_str())?
            .strip_prefix('.')?;
        let mut tokens = rest.split('.').peekable();
        let task = tokens.next().filter(|t| !t.is_empty())?.to_string();
        let model = match tokens.peek() {
            Some(&MODEL_TOKEN) => {
                tokens.next();
                Some(tokens.next().filter(|m| is_valid_model(m))?.to_string())
            }
            _ => None,
        };
        let level = tokens.next();
        let tenant = tokens.next();
        if tokens.next().is_some() {
            return None;
        }
        let priority = match level {
            None => Priority::Normal,
            Some(level) => level.parse().ok()?,
        };
        match (level, tenant) {
            // `<task>.normal` alone is not a job subject (normal is the plain one).
            (Some("normal"), None) => None,
            (_, Some(tenant)) if !is_valid_tenant(tenant) => None,
            (_, tenant) => Some(Route {
                task,
                model,
                priority,
                tenant: tenant.map(str::to_string),
            }),
        }
    }

    /// The job stream's subjects for `model` of `task` (it is added to the
    /// stream when the model is deployed): one per priority, and one
    /// wildcard per priority for tenants' jobs, as [`Topology::job_subjects`]
    /// lists for the default models.
    pub fn model_subjects(&self, task: &str, model: &str) -> Vec<String> {
        let route = |priority, tenant: Option<&str>| Route {
            task: task.to_string(),
            model: Some(model.to_string()),
            priority,
            tenant: tenant.map(str::to_string),
        };
        let plain = Priority::ALL.map(|p| self.subject_of(&route(p, None)));
        let tenants = Priority::ALL.map(|p| self.subject_of(&route(p, Some("*"))));
        plain.into_iter().chain(tenants).collect()
    }

    /// Whether `subject` (a stream's subject, wildcards and all) is a
    /// routed model's: `<prefix>.<task>.model.<model>...`.
    pub fn is_model_subject(&self, subject: &str) -> bool {
        subject
            .strip_prefix(self.job_subject_prefix.as_str())
            .and_then(|rest| rest.strip_prefix('.'))
            .is_some_and(|rest| rest.split('.').nth(1) == Some(MODEL_TOKEN))
    }

    /// The job stream's subjects: one per task and priority, and one
    /// wildcard per task and priority for tenants' jobs, so that a job
    /// published to the subject of a task nobody serves is refused at
    /// publish time instead of waiting forever.
    pub fn job_subjects(&self) -> Vec<String> {
        let plain = Task::ALL
            .iter()
            .flat_map(|t| Priority::ALL.map(|p| self.job_subject_at(t.as_str(), p)));
        let tenants = Task::ALL
            .iter()
            .flat_map(|t| Priority::ALL.map(|p| self.tenant_subjects(t.as_str(), p)));
        plain.chain(tenants).collect()
    }

    /// The durable consumer of `task`'s jobs at `priority`: `normal` is
    /// [`Topology::consumer_for`]'s, the others add `-high` / `-low`.
    pub fn consumer_at(&self, task: Task, priority: Priority) -> String {
        match priority {
            Priority::Normal => self.consumer_for(task),
            other => format!("{}-{}", self.consumer_for(task), other.as_str()),
        }
    }

    /// The durable consumer of one tenant's jobs of `task` at `priority`
    /// (consumer processes create it when they first see the tenant's
    /// backlog): [`Topology::consumer_at`]'s name plus `-t-<tenant>`.
    pub fn tenant_consumer(&self, task: Task, priority: Priority, tenant: &str) -> String {
        format!("{}-t-{tenant}", self.consumer_at(task, priority))
    }

    /// The durable consumer of `model`'s jobs of `task` at `priority`, and
    /// of one tenant's with `tenant`: [`Topology::consumer_at`]'s or
    /// [`Topology::tenant_consumer`]'s name, plus `@<model>` for a routed
    /// model (`sluice-workers-high-t-acme@bge-small`). The default model
    /// (`None`) keeps the names it had. No part before the `@` can hold
    /// one, so no two (model, level, tenant) share a name.
    pub fn model_consumer(
        &self,
        task: Task,
        model: Option<&str>,
        priority: Priority,
        tenant: Option<&str>,
    ) -> String {
        let name = match tenant {
            Some(tenant) => self.tenant_consumer(task, priority, tenant),
            None => self.consumer_at(task, priority),
        };
        match model {
            Some(model) => format!("{name}@{model}"),
            None => name,
        }
    }

    /// The durable consumer that processes of `task` share. Each task has its
    /// own, filtered to its own subject, so an embed process never pulls a
    /// generate job and the other way round. The embed one keeps the plain
    /// name (`sluice-workers`), the others add `-<task>`.
    pub fn consumer_for(&self, task: Task) -> String {
        match task {
            Task::Embed => self.consumer.clone(),
            other => format!("{}-{other}", self.consumer),
        }
    }

    /// The subject a dead letter of `task` is published to.
    pub fn dlq_subject(&self, task: &str) -> String {
        format!("{}.{task}", self.dlq_subject_prefix)
    }

    pub fn dlq_subjects(&self) -> String {
        format!("{}.>", self.dlq_subject_prefix)
    }

    /// The default result subject of a job.
    pub fn result_subject(&self, job_id: &str) -> String {
        format!("{}.{job_id}", self.result_subject_prefix)
    }

    /// Where a streaming generate job (`output.stream`) published with no
    /// reply subject publishes its [`crate::StreamChunk`]s. Under the
    /// shipped permissions only an admin reads these subjects.
    pub fn stream_subject(&self, job_id: &str) -> String {
        format!("{}.{job_id}", self.stream_subject_prefix)
    }

    /// Where a streaming job publishes its [`crate::StreamChunk`]s: under
    /// its reply subject (`<Sluice-Reply-To>.text`), so that its text goes
    /// where its answer goes and no other client hears it; else
    /// [`Topology::stream_subject`]. Subscribe before publishing the job.
    pub fn stream_subject_of(&self, job_id: &str, reply_to: Option<&str>) -> String {
        match reply_to {
            Some(reply_to) => format!("{reply_to}.{STREAM_REPLY_TOKEN}"),
            None => self.stream_subject(job_id),
        }
    }
}

/// Header names carried on job, result and dead-letter messages.
pub mod headers {
    /// JetStream de-duplication id: the job id on a job message.
    pub const MSG_ID: &str = "Nats-Msg-Id";
    /// Where the result goes. A JetStream publish's own reply subject carries the
    /// PubAck, so the job's reply subject travels in this header instead.
    pub const REPLY_TO: &str = "Sluice-Reply-To";
    /// The job id, also on results and dead letters.
    pub const JOB_ID: &str = "Sluice-Job-Id";
    /// W3C trace context, carried from publisher to result.
    pub const TRACEPARENT: &str = "traceparent";
    /// A job's per-message TTL (`"<seconds>s"`): the stream removes it
    /// then. Set from the job's deadline.
    pub const MESSAGE_TTL: &str = "Nats-TTL";
    /// The tenant a job claims. Read only for labels (metrics, logs) of a
    /// job on a task's plain subject; a tenant subject's token wins over it,
    /// since the NATS server checks subjects (publish permissions) and not
    /// headers. Fair share follows the subject alone.
    pub const TENANT: &str = "Sluice-Tenant";
    /// On a result message: `ok` or the error code.
    pub const OUTCOME: &str = "Sluice-Outcome";
}

/// A job id is used as a NATS subject token, a KV key and part of an S3 key, so
/// it is restricted to characters that are safe in all three.
pub fn is_valid_job_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 128
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn every_job_subject_routes_back_to_its_task_level_and_tenant() {
        for t in [Topology::default(), Topology::namespaced("ns1")] {
            for task in Task::ALL {
                for p in Priority::ALL {
                    let plain = t.route_of(&t.job_subject_at(task.as_str(), p)).unwrap();
                    assert_eq!((plain.task.as_str(), plain.priority), (task.as_str(), p));
                    assert_eq!(plain.tenant_name(), DEFAULT_TENANT);
                    let acme = t
                        .route_of(&t.job_subject_for(task.as_str(), p, Some("acme")))
                        .unwrap();
                    assert_eq!(
                        acme,
                        Route {
                            task: task.as_str().into(),
                            model: None,
                            priority: p,
                            tenant: Some("acme".into())
                        }
                    );
                    // A tenant named like a level is still a tenant.
                    let high = t
                        .route_of(&t.job_subject_for(task.as_str(), p, Some("high")))
                        .unwrap();
                    assert_eq!((high.priority, high.tenant_name()), (p, "high"));
                }
            }
        }
        let t = Topology::default();
        assert_eq!(
            t.job_subject_for("embed", Priority::Low, Some(DEFAULT_TENANT)),
            "sluice.jobs.embed.low"
        );
        assert_eq!(
            t.job_subject_for("embed", Priority::Normal, Some("b")),
            "sluice.jobs.embed.normal.b"
        );
        for not_a_job in [
            "sluice.jobs",
            "sluice.jobs.embed.normal",
            "sluice.jobs.embed.urgent.acme",
            "sluice.jobs.embed.low.acme.x",
            "sluice.jobsx.embed",
            "other.embed",
            "sluice.jobs.embed.model",
            "sluice.jobs.embed.model.a.b",
            "sluice.jobs.embed.model.bge.normal",
            "sluice.jobs.embed.model.bge.high.acme.x",
            "sluice.jobs.embed.model.*.high",
        ] {
            assert_eq!(t.route_of(not_a_job), None, "{not_a_job}");
        }
    }

    /// A job's streamed text goes where its answer goes, one token deeper
    /// (so `<inbox>.*` hears results and not text); without a reply
    /// subject, to the shared subject only an admin reads.
    #[test]
    fn a_jobs_text_streams_under_its_reply_subject() {
        let t = Topology::namespaced("ns1");
        let table = [
            (
                Some("_INBOX_publisher.abc.job-1"),
                "_INBOX_publisher.abc.job-1.text",
            ),
            (Some("_INBOX_gateway.xyz"), "_INBOX_gateway.xyz.text"),
            (None, "ns1.sluice.stream.job-1"),
        ];
        for (reply_to, subject) in table {
            assert_eq!(t.stream_subject_of("job-1", reply_to), subject);
        }
    }

    #[test]
    fn stream_subjects_do_not_overlap_and_tenant_consumers_are_named_apart() {
        let t = Topology::default();
        let subjects = t.job_subjects();
        assert!(subjects.contains(&"sluice.jobs.embed.high.*".to_string()));
        assert_eq!(subjects.len(), Task::ALL.len() * 6);
        assert_eq!(
            t.tenant_consumer(Task::Embed, Priority::High, "acme"),
            "sluice-workers-high-t-acme"
        );
        assert!(is_valid_tenant("team_a-1"));
        for bad in ["", "a.b", "a b", "*", ">", &"x".repeat(65)] {
            assert!(!is_valid_tenant(bad), "{bad}");
        }
    }

    /// Whether some subject matches both NATS subject filters.
    fn overlap(a: &str, b: &str) -> bool {
        let (a, b): (Vec<&str>, Vec<&str>) = (a.split('.').collect(), b.split('.').collect());
        for i in 0..a.len().max(b.len()) {
            match (a.get(i), b.get(i)) {
                (Some(&">"), _) | (_, Some(&">")) => return true,
                (Some(x), Some(y)) if x == y || *x == "*" || *y == "*" => {}
                _ => return false,
            }
        }
        true
    }

    #[test]
    fn a_models_subjects_route_back_to_it_and_overlap_no_other_stream_subject() {
        let t = Topology::namespaced("ns1");
        // Models named like levels, tokens and tenants are still models.
        let models = ["bge-small", "high", "model", "normal", "t", "a-t-b"];
        let mut stream = t.job_subjects();
        for task in Task::ALL {
            for model in models {
                for p in Priority::ALL {
                    for tenant in [None, Some("acme"), Some("model"), Some("low")] {
                        let route = Route {
                            task: task.as_str().into(),
                            model: Some(model.into()),
                            priority: p,
                            tenant: tenant.map(str::to_string),
                        };
                        let subject = t.subject_of(&route);
                        assert_eq!(t.route_of(&subject), Some(route), "{subject}");
                    }
                }
                stream.extend(t.model_subjects(task.as_str(), model));
            }
        }
        assert_eq!(stream.len(), Task::ALL.len() * 6 * (1 + models.len()));
        let routed = stream.iter().filter(|s| t.is_model_subject(s)).count();
        assert_eq!(routed, stream.len() - t.job_subjects().len());
        assert!(!Topology::default().is_model_subject(&stream[stream.len() - 1]));
        for (i, a) in stream.iter().enumerate() {
            for b in &stream[i + 1..] {
                assert!(!overlap(a, b), "{a} and {b} overlap");
            }
        }
        assert_eq!(
            Topology::default().subject_of(&Route {
                task: "embed".into(),
                model: Some("bge-small".into()),
                priority: Priority::High,
                tenant: Some("acme".into()),
            }),
            "sluice.jobs.embed.model.bge-small.high.acme"
        );
        assert!(overlap("a.*.c", "a.b.>") && !overlap("a.b", "a.b.c"));
    }

    #[test]
    fn no_two_routes_share_a_durable_consumer() {
        let t = Topology::default();
        let models = [None, Some("a"), Some("a-t-b"), Some("a-high"), Some("b")];
        let tenants = [None, Some("b"), Some("t-b"), Some("high-t-b"), Some("a")];
        let mut names = std::collections::HashMap::new();
        for task in Task::ALL {
            for model in models {
                for p in Priority::ALL {
                    for tenant in tenants {
                        let name = t.model_consumer(task, model, p, tenant);
                        let key = (task, model, p, tenant);
                        if let Some(other) = names.insert(name.clone(), key) {
                            panic!("{name}: {other:?} and {key:?}");
                        }
                    }
                }
            }
        }
        assert_eq!(
            t.model_consumer(Task::Embed, None, Priority::High, Some("acme")),
            t.tenant_consumer(Task::Embed, Priority::High, "acme"),
            "the default model keeps its names"
        );
        assert_eq!(
            t.model_consumer(Task::Generate, Some("qwen3"), Priority::Low, None),
            "sluice-workers-generate-low@qwen3"
        );
        assert!(is_valid_model("bge-small-en-v1_5"));
        for bad in ["", "v1.5", "a@b", "*", &"m".repeat(65)] {
            assert!(!is_valid_model(bad), "{bad}");
        }
    }
}
