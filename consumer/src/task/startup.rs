//! What every task's start-up shares: the device, the budget's size, and
//! what start-up hands the rest of the consumer.

use candle_core::Device;

use super::engine::TaskEngine;
use crate::budget::{Budget, JobCost, device_headroom_bytes};
use crate::config::{Config, DeviceKind, ModelConfig};
use crate::memory::MemoryProbe;

/// What a task's start-up hands the rest of the consumer.
pub struct Started {
    pub engine: Box<dyn TaskEngine>,
    /// The thread that owns the model (the executor, or the generation thread).
    pub model_thread: std::thread::JoinHandle<()>,
    pub cost: JobCost,
    pub pacing: Pacing,
    pub budget: Budget,
    /// The device's name for logs and status, e.g. `cpu` or `cuda:0`.
    pub device: String,
    /// Reads the memory where the model runs.
    pub memory: MemoryProbe,
}

/// How admission paces a task's jobs, in the task's units.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pacing {
    /// Where items of many jobs share batches, the units they may hold in
    /// flight (admission holds a job back past the cap); `None` where the
    /// task paces its own work (generate's step takes what fits).
    pub in_flight: Option<InFlightUnits>,
    /// A tenant's quantum in the fair share: what one batch or step takes.
    pub tenant_quantum: u64,
    /// What a job is charged to its priority level before its real units
    /// are known.
    pub job_estimate: u64,
}

/// The cap on units in flight, and what an untokenized job counts against it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InFlightUnits {
    pub cap: u64,
    pub per_job: u64,
}

/// Opens the configured device.
pub fn open_device(config: &ModelConfig) -> candle_core::Result<Device> {
    let kernels = sluice_models::cpu::choice();
    match &kernels.note {
        Some(note) => tracing::warn!(level = kernels.level.name(), "{note}"),
        None => tracing::debug!(level = kernels.level.name(), "CPU kernels"),
    }
    match config.device {
        DeviceKind::Cpu => Ok(Device::Cpu),
        DeviceKind::Cuda => Device::new_cuda(config.cuda_ordinal),
    }
}

pub fn device_name(device: &candle_core::Device) -> String {
    match device.location() {
        candle_core::DeviceLocation::Cpu => "cpu".to_string(),
        candle_core::DeviceLocation::Cuda { gpu_id } => format!("cuda:{gpu_id}"),
        other => format!("{other:?}"),
    }
}

/// The budget: explicit, or a fraction of the headroom left after loading the model.
pub fn budget_limit(config: &Config, device: &candle_core::Device) -> anyhow::Result<u64> {
    Ok(match config.memory_budget_bytes {
        Some(b) => b,
        None => {
            let headroom = device_headroom_bytes(device)?;
            (headroom as f64 * config.memory_fraction) as u64
        }
    })
}
