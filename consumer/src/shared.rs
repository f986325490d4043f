//! What every job task shares, built once at start-up by `crate::service`
//! and handed to each job behind an `Arc`. A leaf for the stages: nothing
//! here imports `service` or `job`, so neither imports the other back.

use std::time::Duration;

use async_nats::jetstream;
use sluice_schemas::Topology;

use crate::budget::JobCost;
use crate::fetch::Fetcher;
use crate::in_flight::InFlight;
use crate::output::{DeadLetters, OutputStore, ResultPublisher};
use crate::task::engine::TaskEngine;
use crate::telemetry::{Stats, Tracing};
use sluice_status::StatusStore;

/// Per-job limits from the config.
pub struct JobLimits {
    pub max_input_bytes: u64,
    pub max_items_per_job: u64,
}

/// Which of its task's subjects a consumer process pulls (see
/// `sluice_schemas::models`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelRoute {
    /// A task with no deployed-model records: its plain subjects, where a
    /// job may name any model (another's is refused `unknown_model`).
    Unrouted,
    /// The task's default model: its plain subjects.
    Default,
    /// A routed model: its own subjects (`<task>.model.<model>...`).
    Own(String),
}

impl ModelRoute {
    /// The [`sluice_schemas::Route`]'s model of the subjects pulled.
    pub fn route(&self) -> Option<&str> {
        match self {
            ModelRoute::Own(model) => Some(model),
            ModelRoute::Unrouted | ModelRoute::Default => None,
        }
    }
}

/// What every job task shares.
pub struct Shared {
    pub topology: Topology,
    pub js: jetstream::Context,
    /// The model loaded (`--model-name`): the one a job must name.
    pub model_name: String,
    pub model_route: ModelRoute,
    pub limits: JobLimits,
    pub cost: JobCost,
    pub fetcher: Fetcher,
    pub engine: Box<dyn TaskEngine>,
    /// Outputs: inline, or S3 objects.
    pub outputs: OutputStore,
    /// Results on each job's reply subject.
    pub results: ResultPublisher,
    /// The job status records (KV).
    pub status: StatusStore,
    /// The dead-letter stream.
    pub dead_letters: DeadLetters,
    pub stats: std::sync::Arc<Stats>,
    /// What admission took and has not settled (read by the in-flight cap).
    pub in_flight: std::sync::Arc<InFlight>,
    pub max_deliver: i64,
    pub progress_interval: Duration,
    pub retry_base: Duration,
    pub retry_max: Duration,
    pub tracing: Tracing,
}

impl Shared {
    /// What a result says of the consumer that answered it.
    pub fn served_by(&self) -> sluice_schemas::ServedBy {
        sluice_schemas::ServedBy {
            model: self.model_name.clone(),
            forward: self.engine.forward().to_string(),
        }
    }
}
