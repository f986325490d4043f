//! The memory budget: a byte count that reservations draw from and give back.
//! See `budget.md` for why it is built this way.
//!
//! Invariant: the sum of live reservations never exceeds the limit. Every
//! reservation goes through one compare-and-swap that checks it.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::Notify;

#[derive(Clone)]
pub struct Budget {
    inner: Arc<Inner>,
}

struct Inner {
    limit: AtomicU64,
    /// The limit never shrinks below this (one job at its worst), so
    /// admission can always take one more job.
    floor: AtomicU64,
    reserved: AtomicU64,
    peak_reserved: AtomicU64,
    released: Notify,
}

/// What the budget holds right now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct BudgetSnapshot {
    pub limit_bytes: u64,
    pub reserved_bytes: u64,
    pub peak_reserved_bytes: u64,
}

impl Budget {
    pub fn new(limit_bytes: u64) -> Budget {
        Budget {
            inner: Arc::new(Inner {
                limit: AtomicU64::new(limit_bytes),
                floor: AtomicU64::new(0),
                reserved: AtomicU64::new(0),
                peak_reserved: AtomicU64::new(0),
                released: Notify::new(),
            }),
        }
    }

    /// [`Budget::shrink_limit`] never takes the limit below `bytes` (the
    /// most one job can reserve: admission waits for that much).
    pub fn with_floor(self, bytes: u64) -> Budget {
        self.inner.floor.store(bytes, Ordering::Release);
        self
    }

    pub fn snapshot(&self) -> BudgetSnapshot {
        BudgetSnapshot {
            limit_bytes: self.inner.limit.load(Ordering::Acquire),
            reserved_bytes: self.inner.reserved.load(Ordering::Acquire),
            peak_reserved_bytes: self.inner.peak_reserved.load(Ordering::Acquire),
        }
    }

    /// Reserves `bytes` if they fit under the limit now.
    pub fn try_reserve(&self, bytes: u64) -> Option<Reservation> {
        let limit = self.inner.limit.load(Ordering::Acquire);
        let mut current = self.inner.reserved.load(Ordering::Acquire);
        loop {
            let next = current.checked_add(bytes)?;
            if next > limit {
                return None;
            }
            match self.inner.reserved.compare_exchange_weak(
                current,
                next,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    self.inner.peak_reserved.fetch_max(next, Ordering::AcqRel);
                    return Some(Reservation {
                        budget: self.clone(),
                        bytes,
                    });
                }
                Err(actual) => current = actual,
            }
        }
    }

    /// Waits until `bytes` fit, then reserves them. Never returns if `bytes`
    /// exceeds the limit: admission asks for one job's worst case, which
    /// start-up checked against the limit and which the limit's floor keeps
    /// within it.
    pub async fn reserve(&self, bytes: u64) -> Reservation {
        loop {
            // Register for the wake-up before checking, so a release between
            // the check and the wait is not missed.
            let released = self.inner.released.notified();
            tokio::pin!(released);
            released.as_mut().enable();
            if let Some(r) = self.try_reserve(bytes) {
                return r;
            }
            released.await;
        }
    }

    /// Lowers the limit (after the device ran out of memory), never below
    /// the floor. Live reservations stay; new ones see the lower limit.
    pub fn shrink_limit(&self, new_limit: u64) {
        let floor = self.inner.floor.load(Ordering::Acquire);
        self.inner
            .limit
            .fetch_min(new_limit.max(floor), Ordering::AcqRel);
    }

    fn release(&self, bytes: u64) {
        if bytes > 0 {
            self.inner.reserved.fetch_sub(bytes, Ordering::AcqRel);
            self.inner.released.notify_waiters();
        }
    }
}

/// Bytes held from the budget until dropped.
pub struct Reservation {
    budget: Budget,
    bytes: u64,
}

impl Reservation {
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Gives back what is above `bytes` (no-op if already at or under it).
    pub fn shrink_to(&mut self, bytes: u64) {
        if bytes < self.bytes {
            self.budget.release(self.bytes - bytes);
            self.bytes = bytes;
        }
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.budget.release(self.bytes);
    }
}

impl std::fmt::Debug for Reservation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Reservation({} bytes)", self.bytes)
    }
}

/// Why free memory could not be measured.
#[derive(Debug, thiserror::Error)]
pub enum HeadroomError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: &'static str,
        source: std::io::Error,
    },
    #[error("no MemAvailable in /proc/meminfo")]
    NoMemAvailable,
    #[error("cannot read CUDA free memory: {0}")]
    Cuda(String),
    #[error("no headroom measurement for device {0}")]
    Unsupported(String),
}

/// Free memory where the model runs, in bytes.
pub fn device_headroom_bytes(device: &candle_core::Device) -> Result<u64, HeadroomError> {
    match device {
        candle_core::Device::Cpu => cpu_headroom_bytes(),
        #[cfg(feature = "cuda")]
        // cuMemGetInfo answers for the context current on the calling
        // thread: the device's own call binds its context first.
        candle_core::Device::Cuda(cuda) => cuda
            .cuda_stream()
            .context()
            .mem_get_info()
            .map(|(free, _total)| free as u64)
            .map_err(|e| HeadroomError::Cuda(e.to_string())),
        #[allow(unreachable_patterns)]
        other => Err(HeadroomError::Unsupported(format!("{other:?}"))),
    }
}

/// On a CPU: the smaller of MemAvailable and what the cgroup still allows.
pub fn cpu_headroom_bytes() -> Result<u64, HeadroomError> {
    const MEMINFO: &str = "/proc/meminfo";
    let meminfo = std::fs::read_to_string(MEMINFO).map_err(|source| HeadroomError::Read {
        path: MEMINFO,
        source,
    })?;
    let available = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kb| kb * 1024)
        .ok_or(HeadroomError::NoMemAvailable)?;
    Ok(match cgroup_room_bytes() {
        Some(room) => available.min(room),
        None => available,
    })
}

/// The cgroup's limit minus its usage (v2, then v1); None when unlimited.
fn cgroup_room_bytes() -> Option<u64> {
    let read = |p: &str| std::fs::read_to_string(p).ok();
    let num = |s: Option<String>| s.and_then(|s| s.trim().parse::<u64>().ok());
    if let Some(max) = num(read("/sys/fs/cgroup/memory.max")) {
        let used = num(read("/sys/fs/cgroup/memory.current")).unwrap_or(0);
        return Some(max.saturating_sub(used));
    }
    let limit = num(read("/sys/fs/cgroup/memory/memory.limit_in_bytes"))?;
    // v1 reports "unlimited" as a huge number.
    if limit >= 1 << 60 {
        return None;
    }
    let used = num(read("/sys/fs/cgroup/memory/memory.usage_in_bytes")).unwrap_or(0);
    Some(limit.saturating_sub(used))
}

/// This process's resident set size, in bytes.
pub fn resident_bytes() -> Option<u64> {
    proc_status_bytes("VmRSS:")
}

/// The highest resident set size this process has had, in bytes.
pub fn peak_resident_bytes() -> Option<u64> {
    proc_status_bytes("VmHWM:")
}

/// The resident set size and its high-water mark, from one read of
/// `/proc/self/status`.
pub fn resident_and_peak_bytes() -> (Option<u64>, Option<u64>) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    (
        status_field_bytes(&status, "VmRSS:"),
        status_field_bytes(&status, "VmHWM:"),
    )
}

fn proc_status_bytes(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status_field_bytes(&status, field)
}

fn status_field_bytes(status: &str, field: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kb| kb * 1024)
}

/// What one job can cost in memory, for admission. See `budget.md`.
#[derive(Debug, Clone)]
pub struct JobCost {
    pub max_input_bytes: u64,
    pub max_items: u64,
    pub per_item: ItemCost,
}

/// What an item can cost, in its task's own work units (tokens for every
/// task today) and the bytes they hold. Each task's start-up fills it in;
/// the arithmetic below is the same for all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ItemCost {
    /// The most units one item can take (the model's token limit; a
    /// prompt's `max_prompt_tokens + max_new_tokens`).
    pub max_units: u64,
    /// Where an item's units are bounded by its input bytes: how many it
    /// can take beyond one per byte (a tokenizer's special tokens). `None`
    /// where they are not (a chat template, generated tokens).
    pub units_beyond_bytes: Option<u64>,
    /// Bytes each unit holds while the job runs (its id and batch copy; a
    /// sequence token's KV cache).
    pub bytes_per_unit: u64,
    /// Bytes each item holds beyond its units (its vector and its `.npy`
    /// copy; its score).
    pub bytes_per_item: u64,
    /// How many times over a job holds its input bytes at once: 3 for JSONL
    /// (the download, its text and the parsed values), 1 for an audio file
    /// (decoded from the download as it stands; the samples are units).
    pub input_copies: u64,
}

impl JobCost {
    /// Bytes per item beyond what its task counts: bookkeeping and channel
    /// messages.
    const PER_ITEM: u64 = 256;

    /// The most a job can hold before its inputs are read: the raw input and
    /// its copies, and every item at the longest the input allows.
    pub fn worst_bytes(&self) -> u64 {
        // A JSONL item takes at least 3 bytes ("" and a newline).
        let items = self.max_items.min(self.max_input_bytes / 3 + 1);
        let at_most = items * self.per_item.max_units;
        let units = match self.per_item.units_beyond_bytes {
            Some(extra) => at_most.min(self.max_input_bytes + extra * items),
            None => at_most,
        };
        self.per_item.input_copies * self.max_input_bytes + self.actual_bytes(items, units)
    }

    /// What a job holds once its items are counted in units (embed: the
    /// items' token ids, plus vectors; rerank: the pairs' ids and token
    /// types, plus scores; generate: the sequences' whole lengths,
    /// `prompt + max_new_tokens` each, each with its KV cache).
    pub fn actual_bytes(&self, items: u64, units: u64) -> u64 {
        units * self.per_item.bytes_per_unit
            + items * (self.per_item.bytes_per_item + Self::PER_ITEM)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// A job at its worst holds its input three times over, and each item
    /// at the most units its task allows, or its bytes allow where they
    /// bound its units.
    #[test]
    fn a_job_at_its_worst() {
        let cost = |max_input_bytes, max_items, units_beyond_bytes| JobCost {
            max_input_bytes,
            max_items,
            per_item: ItemCost {
                max_units: 500,
                units_beyond_bytes,
                bytes_per_unit: 8,
                bytes_per_item: 100,
                input_copies: 3,
            },
        };
        let item = 100 + JobCost::PER_ITEM;
        // (input bytes, items, units beyond bytes) -> worst bytes
        let table = [
            // 10 items of at most 500 units, but 1000 bytes bound them to 1020
            ((1000, 10, Some(2)), 3000 + 1020 * 8 + 10 * item),
            // unbounded by bytes: every item at its longest
            ((1000, 10, None), 3000 + 5000 * 8 + 10 * item),
            // bytes bound the items too: 30 bytes hold at most 11 items
            ((30, 1000, None), 90 + 11 * 500 * 8 + 11 * item),
            // few items, many bytes: the units' own limit
            ((100_000, 2, Some(2)), 300_000 + 1000 * 8 + 2 * item),
        ];
        for ((bytes, items, beyond), worst) in table {
            assert_eq!(
                cost(bytes, items, beyond).worst_bytes(),
                worst,
                "{bytes} bytes, {items} items, {beyond:?}"
            );
        }
        assert_eq!(cost(1000, 10, None).actual_bytes(3, 40), 40 * 8 + 3 * item);
    }

    #[test]
    fn reservations_never_exceed_the_limit() {
        let b = Budget::new(100);
        let r1 = b.try_reserve(60).unwrap();
        assert!(b.try_reserve(41).is_none());
        let mut r2 = b.try_reserve(40).unwrap();
        assert_eq!(b.snapshot().reserved_bytes, 100);
        r2.shrink_to(10);
        assert_eq!(b.snapshot().reserved_bytes, 70);
        drop(r1);
        assert_eq!(b.snapshot().reserved_bytes, 10);
        assert_eq!(b.snapshot().peak_reserved_bytes, 100);
        drop(r2);
        assert_eq!(b.snapshot().reserved_bytes, 0);
        assert!(b.try_reserve(u64::MAX).is_none());
    }

    #[test]
    fn concurrent_reservations_respect_the_limit() {
        let b = Budget::new(1000);
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let b = b.clone();
                std::thread::spawn(move || {
                    for i in 0..20_000u64 {
                        if let Some(mut r) = b.try_reserve(1 + i % 97) {
                            assert!(b.snapshot().reserved_bytes <= 1000);
                            r.shrink_to(i % 13);
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(b.snapshot().reserved_bytes, 0);
        assert!(b.snapshot().peak_reserved_bytes <= 1000);
    }

    #[tokio::test]
    async fn reserve_waits_for_a_release() {
        let b = Budget::new(10);
        let held = b.try_reserve(8).unwrap();
        let b2 = b.clone();
        let waiter = tokio::spawn(async move { b2.reserve(5).await.bytes() });
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        assert!(!waiter.is_finished());
        drop(held);
        assert_eq!(waiter.await.unwrap(), 5);
    }

    #[test]
    fn headroom_is_measured() {
        let h = cpu_headroom_bytes().unwrap();
        assert!(h > 16 << 20, "headroom {h} looks wrong");
        assert!(resident_bytes().unwrap() > 0);
    }

    /// Repeated out-of-memory shrinks stop at the floor, so one job at its
    /// worst can still be admitted (admission would otherwise wait forever).
    #[tokio::test]
    async fn shrinking_stops_at_the_floor() {
        let b = Budget::new(1000).with_floor(300);
        for _ in 0..20 {
            let limit = b.snapshot().limit_bytes;
            b.shrink_limit(limit / 10 * 8);
        }
        assert_eq!(b.snapshot().limit_bytes, 300);
        let r = tokio::time::timeout(std::time::Duration::from_secs(5), b.reserve(300)).await;
        assert!(r.is_ok(), "one worst-case job is still admitted");
        // Without a floor the limit goes where it is told.
        let c = Budget::new(1000);
        c.shrink_limit(10);
        assert_eq!(c.snapshot().limit_bytes, 10);
    }
}
