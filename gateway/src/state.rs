//! What every request handler and the batch driver share, built once at start.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use axum::extract::FromRef;

use sluice_schemas::{Task, Topology};
use sluice_status::StatusStore;

use crate::auth::Keys;
use crate::config::Config;
use crate::records::Records;

/// Cloned for every request (extractors, middleware, tasks), so one `Arc`:
/// the fields hold names, stream infos and clients whose deep copies cost
/// kilobytes each, which 200 concurrent requests turned into tens of MB.
#[derive(Clone)]
pub struct AppState(Arc<Shared>);

impl AppState {
    pub fn new(shared: Shared) -> AppState {
        AppState(Arc::new(shared))
    }
}

impl std::ops::Deref for AppState {
    type Target = Shared;

    fn deref(&self) -> &Shared {
        &self.0
    }
}

/// What [`AppState`] shares.
pub struct Shared {
    pub config: Arc<Config>,
    pub keys: Arc<Keys>,
    /// A permit per online request answered now, `--max-online-requests`
    /// in all (taken by `in_flight.rs`).
    pub online_slots: Arc<tokio::sync::Semaphore>,
    /// Each tenant's model tokens a minute on online requests
    /// (`--token-rate-limit-tpm`; none: unlimited).
    pub token_rate: Option<crate::rate::TokenRate>,
    pub topology: Topology,
    pub records: Records,
    pub statuses: StatusStore,
    pub js: async_nats::jetstream::Context,
    pub s3: aws_sdk_s3::Client,
    /// This process's name in batch leases.
    pub owner: String,
    /// Batches this process is advancing now.
    pub busy: Busy,
    pub metrics: Arc<crate::metrics::Metrics>,
    pub traces: crate::traces::Traces,
    /// The deployed models (`sluice init`'s `[[models]]`), which route jobs
    /// and say which models are served.
    pub models: Arc<sluice_producer::models::ModelCatalog>,
    /// The longest completion window a batch may ask for: a margin inside
    /// the status bucket's maximum age (`lifecycle::max_window_secs`).
    pub max_window_secs: i64,
}

impl Shared {
    /// The status records of `tenant`'s jobs: the gateway publishes every
    /// job as its API key's tenant, on the tenant's subjects, so each job's
    /// record is in that tenant's scope (`sluice_status::StatusStore`).
    pub fn statuses_of(&self, tenant: &str) -> StatusStore {
        self.statuses.scoped(Some(tenant))
    }

    pub fn bucket(&self) -> &str {
        &self.config.bucket
    }

    /// The S3 key of a file's bytes.
    pub fn file_key(&self, file_id: &str) -> String {
        format!("{}files/{file_id}", self.config.prefix)
    }

    /// The S3 key of a chunk job's input.
    pub fn chunk_key(&self, job_id: &str) -> String {
        format!("{}chunks/{job_id}.jsonl", self.config.prefix)
    }

    /// Whether the consumers of `task` serve `model`: a deployed model of
    /// its task, where `sluice init` routes the task's models; else the
    /// task's `--<task>-models` flag ([`Config::models_of`]).
    pub fn serves(&self, task: Task, model: &str) -> bool {
        self.served_models(task).iter().any(|m| m == model)
    }

    /// The models `task`'s consumers serve (see [`Shared::serves`]).
    pub fn served_models(&self, task: Task) -> Vec<String> {
        let deployed = self.models.snapshot();
        let routed: Vec<String> = deployed
            .of_task(task.as_str())
            .map(|m| m.model.clone())
            .collect();
        if !routed.is_empty() {
            return routed;
        }
        self.config.models_of(task).to_vec()
    }
}

/// Seconds since the Unix epoch, as the OpenAI objects give times.
pub fn now() -> i64 {
    time::OffsetDateTime::now_utc().unix_timestamp()
}

impl FromRef<AppState> for Arc<Keys> {
    fn from_ref(state: &AppState) -> Arc<Keys> {
        Arc::clone(&state.keys)
    }
}

/// Batches this process is advancing now (so the loop and a kick do not
/// work on one batch at once).
#[derive(Clone, Default)]
pub struct Busy(Arc<Mutex<HashSet<String>>>);

impl Busy {
    pub fn claim(&self, id: &str) -> Option<BusyGuard> {
        let mut set = self.0.lock().unwrap_or_else(|e| e.into_inner());
        set.insert(id.to_string()).then(|| BusyGuard {
            busy: self.clone(),
            id: id.to_string(),
        })
    }
}

pub struct BusyGuard {
    busy: Busy,
    id: String,
}

impl Drop for BusyGuard {
    fn drop(&mut self) {
        let mut set = self.busy.0.lock().unwrap_or_else(|e| e.into_inner());
        set.remove(&self.id);
    }
}
