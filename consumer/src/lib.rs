//! The sluice consumer. The data path, one folder or file per stage (see
//! ARCHITECTURE.md at the repository root for the whole map):
//!
//! ```text
//! admission -> job::pipeline -> fetch -> task -> output -> job::settle
//! (pull within     (one tokio task  (inputs)  (the job's   (S3 or    (status, result,
//!  the budget)      per job)                   task runs)   inline)   ack / retry / DLQ)
//! ```
//!
//! `task` is the one place that knows what a task is: each task is a
//! folder behind the [`task::engine::TaskEngine`] trait (`task::encoder` serves
//! embed and rerank, batching items of many jobs by token sum;
//! `task::generate` continuous-batches sequences over the llama model), and
//! `task::start` is the registry from the configured task to its start-up.
//! The pipeline, admission and the budget name no task.
//!
//! `main` parses a [`Config`] and calls [`run`]; tests call [`start`].

pub mod admission;
pub mod alloc;
pub mod budget;
pub mod config;
pub mod device_check;
pub mod error;
pub mod fetch;
pub mod heartbeat;
pub mod http;
pub mod in_flight;
pub mod job;
pub mod memory;
pub mod model_name;
pub mod offline;
pub mod offline_generate;
pub mod output;
pub mod recycle;
pub mod service;
pub mod shared;
pub mod task;
pub mod telemetry;

use std::time::Duration;

pub use config::{Config, ModelConfig};
pub use service::{Consumer, start};

/// Runs the consumer until SIGTERM or SIGINT, or until a recycle limit is
/// reached (`recycle.rs`), then drains and returns.
pub async fn run(config: Config) -> anyhow::Result<()> {
    let drain = Duration::from_secs(config.drain_timeout_secs);
    let running = start(config).await?;
    let recycle = running.recycle.clone();
    tracing::info!(http = %running.http_addr, "consuming");
    if recycle.any() {
        tracing::info!(
            after_jobs = recycle.after_jobs,
            after_secs = recycle.after.map(|d| d.as_secs()),
            growth_mib = recycle.growth_bytes.map(|b| b >> 20),
            "recycle limits (jitter applied)"
        );
    }
    tokio::select! {
        _ = shutdown_signal() => {
            tracing::info!(drain_secs = drain.as_secs(), "stopping: draining in-flight jobs");
        }
        reason = recycle.reached(&running.stats, &running.memory) => {
            running.stats.record_recycle(reason);
            tracing::info!(
                reason = reason.as_str(),
                jobs = running.stats.jobs_finished.load(std::sync::atomic::Ordering::Relaxed),
                drain_secs = drain.as_secs(),
                "recycling: draining in-flight jobs, then exiting 0 for the supervisor to start a fresh process"
            );
        }
    }
    running.shutdown(drain).await
}

async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => {},
                _ = tokio::signal::ctrl_c() => {},
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
