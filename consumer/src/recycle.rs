//! Worker recycling: after about N jobs, after about S seconds, or once its
//! memory has grown M MiB over its level after warm-up, the consumer drains
//! as on SIGTERM and exits 0, and its supervisor (Kubernetes, compose's
//! `restart:`) starts a fresh process. Long-lived inference processes grow
//! (allocator fragmentation, caches); a restart is the cure, and draining
//! makes it lossless. The job limit is exact: admission takes no more than
//! N jobs (`service::admit`), and the process recycles once they have
//! finished. The job and age limits get +-10% jitter, seeded per process, so
//! a fleet started together does not restart together.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::config::Config;
use crate::memory::MemoryProbe;
use crate::telemetry::Stats;

/// Why a process recycled itself: kept with the metrics that count it.
pub use crate::telemetry::RecycleReason as Reason;

/// The limits of one process, jitter applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecycleLimits {
    pub after_jobs: Option<u64>,
    pub after: Option<Duration>,
    pub growth_bytes: Option<u64>,
}

impl RecycleLimits {
    /// The configured limits, the job and age limits scaled by a factor in
    /// [0.9, 1.1] drawn from `seed`.
    pub fn new(config: &Config, seed: u64) -> RecycleLimits {
        let factor = jitter_factor(seed);
        let scaled = |v: u64| ((v as f64 * factor).round() as u64).max(1);
        let nonzero = |v: u64| (v > 0).then_some(v);
        RecycleLimits {
            after_jobs: nonzero(config.recycle_after_jobs).map(scaled),
            after: nonzero(config.recycle_after_secs)
                .map(|s| Duration::from_secs_f64(s as f64 * factor)),
            growth_bytes: nonzero(config.recycle_rss_growth_mib).map(|m| m << 20),
        }
    }

    pub fn any(&self) -> bool {
        self.after_jobs.is_some() || self.after.is_some() || self.growth_bytes.is_some()
    }

    /// Resolves when a limit is reached (never, when none is set). The
    /// memory baseline is read when it is first called: after warm-up.
    pub async fn reached(&self, stats: &Stats, memory: &MemoryProbe) -> Reason {
        if !self.any() {
            return std::future::pending().await;
        }
        let used = |m: &MemoryProbe| m.read().model_side_bytes();
        let (started, baseline) = (Instant::now(), used(memory));
        let mut tick = tokio::time::interval(Duration::from_millis(200));
        loop {
            tick.tick().await;
            if let Some(n) = self.after_jobs
                && stats.jobs_finished.load(Ordering::Relaxed) >= n
            {
                return Reason::Jobs;
            }
            if let Some(age) = self.after
                && started.elapsed() >= age
            {
                return Reason::Age;
            }
            if let Some(growth) = self.growth_bytes
                && used(memory).saturating_sub(baseline) >= growth
            {
                return Reason::Memory;
            }
        }
    }
}

/// A factor in [0.9, 1.1] from `seed` (splitmix64).
fn jitter_factor(seed: u64) -> f64 {
    let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    0.9 + 0.2 * ((z >> 11) as f64 / (1u64 << 53) as f64)
}

/// A seed that differs between processes and starts.
pub fn process_seed() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    nanos ^ ((std::process::id() as u64) << 32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::tests::config;

    #[test]
    fn jitter_stays_within_ten_percent_and_spreads_a_fleet() {
        let config = config(&["--recycle-after-jobs=1000", "--recycle-after-secs=3600"]);
        let mut jobs = Vec::new();
        for seed in 0..200u64 {
            let l = RecycleLimits::new(&config, seed);
            let n = l.after_jobs.unwrap_or(0);
            assert!((900..=1100).contains(&n), "{n}");
            let secs = l.after.unwrap_or_default().as_secs_f64();
            assert!((3240.0..=3960.0).contains(&secs), "{secs}");
            jobs.push(n);
        }
        jobs.sort();
        jobs.dedup();
        assert!(
            jobs.len() > 50,
            "200 processes drew only {} limits",
            jobs.len()
        );
    }

    #[test]
    fn zero_turns_a_limit_off_and_none_set_never_recycles() {
        let none = RecycleLimits::new(&config(&[]), 7);
        assert!(!none.any());
        let memory = RecycleLimits::new(&config(&["--recycle-rss-growth-mib=64"]), 7);
        assert_eq!(
            memory.growth_bytes,
            Some(64 << 20),
            "memory is not jittered"
        );
        assert_eq!((memory.after_jobs, memory.after), (None, None));
    }

    #[tokio::test]
    async fn the_job_limit_fires_once_enough_jobs_finished() {
        let limits = RecycleLimits {
            after_jobs: Some(3),
            after: None,
            growth_bytes: None,
        };
        let stats = Stats::default();
        stats.jobs_finished.store(3, Ordering::Relaxed);
        let reason = tokio::time::timeout(
            Duration::from_secs(5),
            limits.reached(&stats, &MemoryProbe::host()),
        )
        .await;
        assert_eq!(reason.ok(), Some(Reason::Jobs));
        // Nothing set: never.
        let never = RecycleLimits {
            after_jobs: None,
            after: None,
            growth_bytes: None,
        };
        let waited = tokio::time::timeout(
            Duration::from_millis(300),
            never.reached(&stats, &MemoryProbe::host()),
        )
        .await;
        assert!(waited.is_err());
    }
}
