//! What both tasks' start-up shares: the device, the budget's size, and
//! what start-up hands the rest of the consumer.

use candle_core::Device;

use crate::budget::{Budget, JobCost, device_headroom_bytes};
use crate::config::{Config, DeviceKind, ModelConfig};
use crate::memory::MemoryProbe;

/// What the task-specific half of start-up hands the rest.
pub struct Started<E> {
    pub engine: E,
    /// The thread that owns the model (the executor, or the generation thread).
    pub model_thread: std::thread::JoinHandle<()>,
    pub cost: JobCost,
    pub budget: Budget,
    /// The device's name for logs and status, e.g. `cpu` or `cuda:0`.
    pub device: String,
    /// Reads the memory where the model runs.
    pub memory: MemoryProbe,
}

impl<E> Started<E> {
    /// The same, with the engine wrapped (in `super::Engine`).
    pub fn map_engine<F>(self, f: impl FnOnce(E) -> F) -> Started<F> {
        Started {
            engine: f(self.engine),
            model_thread: self.model_thread,
            cost: self.cost,
            budget: self.budget,
            device: self.device,
            memory: self.memory,
        }
    }
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
