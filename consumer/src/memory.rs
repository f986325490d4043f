//! The memory the consumer holds now, read where it lives: the host's
//! resident set (RSS, `/proc/self/status`) always, and on `--device cuda` the
//! device's memory from the CUDA driver (`cuMemGetInfo`: free and total of
//! the whole GPU, so "used" counts every process on it). `/debug/memory`,
//! `/metrics` and the OTLP push read it through [`MemoryProbe`]; the budget's
//! start-up headroom comes from the same driver call
//! (`budget::device_headroom_bytes`).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::budget::resident_and_peak_bytes;

/// Memory figures at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryFigures {
    /// This process's resident set in host memory.
    pub host_resident_bytes: u64,
    /// The highest host resident set this process has had.
    pub host_peak_resident_bytes: u64,
    /// The device's memory; None on the CPU (or when the driver could not
    /// be read).
    pub device: Option<DeviceMemory>,
}

impl MemoryFigures {
    /// The memory in use where the model runs: the GPU's on a device, else
    /// host RSS.
    pub fn model_side_bytes(&self) -> u64 {
        self.device
            .map_or(self.host_resident_bytes, |d| d.used_bytes)
    }
}

/// A GPU's memory as its driver reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct DeviceMemory {
    /// `total - free`: the whole device, other processes included.
    pub used_bytes: u64,
    /// The highest `used_bytes` read so far (read at every scrape and every
    /// [`MemoryProbe::SAMPLE_EVERY`] in the background).
    pub peak_used_bytes: u64,
    pub free_bytes: u64,
    pub total_bytes: u64,
}

/// Reads `(free, total)` device bytes.
type ReadDevice = dyn Fn() -> Result<(u64, u64), String> + Send + Sync;

/// Reads the memory where the model runs. Cheap to clone.
#[derive(Clone)]
pub struct MemoryProbe {
    device: Option<Arc<DeviceProbe>>,
}

struct DeviceProbe {
    read: Box<ReadDevice>,
    peak_used: AtomicU64,
}

impl MemoryProbe {
    /// How often [`MemoryProbe::sample_in_background`] reads the device.
    pub const SAMPLE_EVERY: std::time::Duration = std::time::Duration::from_millis(100);

    /// Host memory only (the CPU device).
    pub fn host() -> MemoryProbe {
        MemoryProbe { device: None }
    }

    /// The probe for where `device` keeps its tensors.
    pub fn for_device(device: &candle_core::Device) -> MemoryProbe {
        match device {
            #[cfg(feature = "cuda")]
            candle_core::Device::Cuda(cuda) => {
                let context = Arc::clone(cuda.cuda_stream().context());
                // The driver call binds the device's context to the calling
                // thread first, so any thread may read it.
                MemoryProbe::with_device_reader(move || {
                    context
                        .mem_get_info()
                        .map(|(free, total)| (free as u64, total as u64))
                        .map_err(|e| e.to_string())
                })
            }
            _ => MemoryProbe::host(),
        }
    }

    /// A probe whose device figures come from `read` (`(free, total)`):
    /// the CUDA driver in [`MemoryProbe::for_device`], a fake in tests.
    pub fn with_device_reader(
        read: impl Fn() -> Result<(u64, u64), String> + Send + Sync + 'static,
    ) -> MemoryProbe {
        MemoryProbe {
            device: Some(Arc::new(DeviceProbe {
                read: Box::new(read),
                peak_used: AtomicU64::new(0),
            })),
        }
    }

    /// Whether this probe reads a device besides the host.
    pub fn has_device(&self) -> bool {
        self.device.is_some()
    }

    /// The figures now (and the device's peak brought up to date).
    pub fn read(&self) -> MemoryFigures {
        let (resident, peak) = resident_and_peak_bytes();
        MemoryFigures {
            host_resident_bytes: resident.unwrap_or(0),
            host_peak_resident_bytes: peak.unwrap_or(0),
            device: self.device.as_deref().and_then(DeviceProbe::read),
        }
    }

    /// On a device, reads it every [`MemoryProbe::SAMPLE_EVERY`] so the peak
    /// catches what happens between scrapes; does nothing on the host.
    pub fn sample_in_background(&self) {
        let Some(device) = self.device.clone() else {
            return;
        };
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(MemoryProbe::SAMPLE_EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            loop {
                tick.tick().await;
                let _ = device.read();
            }
        });
    }
}

impl DeviceProbe {
    fn read(&self) -> Option<DeviceMemory> {
        match (self.read)() {
            Ok((free, total)) => {
                let used = total.saturating_sub(free);
                let peak = self.peak_used.fetch_max(used, Ordering::Relaxed).max(used);
                Some(DeviceMemory {
                    used_bytes: used,
                    peak_used_bytes: peak,
                    free_bytes: free,
                    total_bytes: total,
                })
            }
            Err(e) => {
                tracing::debug!(error = %e, "cannot read device memory");
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::sync::Mutex;

    #[test]
    fn the_host_probe_reads_rss_and_no_device() {
        let m = MemoryProbe::host().read();
        assert!(m.host_resident_bytes > 0);
        assert!(m.host_peak_resident_bytes >= m.host_resident_bytes);
        assert_eq!(m.device, None);
        assert!(!MemoryProbe::for_device(&candle_core::Device::Cpu).has_device());
    }

    #[test]
    fn the_device_probe_reports_used_as_total_minus_free_and_keeps_the_peak() {
        const GIB: u64 = 1 << 30;
        let free = Arc::new(Mutex::new(Ok::<u64, String>(100 * GIB)));
        let reader = Arc::clone(&free);
        let probe = MemoryProbe::with_device_reader(move || {
            reader.lock().unwrap().clone().map(|f| (f, 140 * GIB))
        });
        let first = probe.read().device.unwrap();
        assert_eq!(first.used_bytes, 40 * GIB);
        assert_eq!(first.peak_used_bytes, 40 * GIB);
        assert_eq!(
            (first.free_bytes, first.total_bytes),
            (100 * GIB, 140 * GIB)
        );
        *free.lock().unwrap() = Ok(70 * GIB);
        assert_eq!(probe.read().device.unwrap().peak_used_bytes, 70 * GIB);
        *free.lock().unwrap() = Ok(120 * GIB);
        let after = probe.read().device.unwrap();
        assert_eq!(after.used_bytes, 20 * GIB);
        assert_eq!(after.peak_used_bytes, 70 * GIB, "the peak stays");
        // A driver error leaves the device figures out, not zeroed.
        *free.lock().unwrap() = Err("CUDA_ERROR_INVALID_CONTEXT".into());
        let failed = probe.read();
        assert_eq!(failed.device, None);
        assert!(failed.host_resident_bytes > 0);
    }
}
