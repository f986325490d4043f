//! Admission's decisions, pure: whether a round may pull and how many jobs,
//! how many one pull asks a tenant for, and which queues get an idle
//! long-poll. `admission::Admission` carries them out.

use std::time::Duration;

use sluice_schemas::Priority;

/// A queue admission pulls from: a level, and a tenant at it (the level's
/// own durable consumer for the default tenant).
pub type QueueKey = (Priority, String);

/// The knobs admission runs by (from the config, fixed at start-up).
#[derive(Clone, Debug)]
pub struct PullPlan {
    /// The most jobs one round reserves for and pulls (`--pull-max-messages`).
    pub max_messages: usize,
    /// How long an idle long-poll waits (`--pull-expires-ms`).
    pub expires: Duration,
    /// Jobs this process takes in all before it recycles (`recycle.rs`).
    pub job_limit: Option<u64>,
    /// A task whose items of many jobs share batches (the task's
    /// `Pacing`): take no more jobs while those taken hold this many tokens.
    pub in_flight_cap: Option<InFlightCap>,
    /// While several tenants have jobs at a level, one pull asks a tenant
    /// for about this many tokens' worth of jobs.
    pub tenant_quantum: u64,
    /// The tokens assumed of a tenant's job before any of its jobs finished.
    pub job_estimate: u64,
}

/// `--max-tokens-in-flight`, and the tokens assumed of a job not tokenized
/// yet before any job has finished.
#[derive(Clone, Copy, Debug)]
pub struct InFlightCap {
    pub tokens: u64,
    pub per_job: u64,
}

/// What one round of admission may do.
#[derive(Debug, PartialEq, Eq)]
pub enum Round {
    /// The recycle job limit is reached: take nothing more.
    Recycled,
    /// Enough tokens in flight: the rest waits in the stream, where a
    /// higher level (or another consumer) can still take it first.
    Full,
    /// Reserve and pull up to this many jobs.
    Pull { most: usize },
}

impl PullPlan {
    /// This round, having `taken` jobs in all and `admitted` tokens in
    /// flight (read only under an in-flight cap).
    pub fn round(&self, taken: u64, admitted: u64) -> Round {
        let left = self.job_limit.map(|limit| limit.saturating_sub(taken));
        if left == Some(0) {
            return Round::Recycled;
        }
        if self.in_flight_cap.is_some_and(|cap| admitted >= cap.tokens) {
            return Round::Full;
        }
        let most = left.map_or(self.max_messages, |l| {
            self.max_messages
                .min(usize::try_from(l).unwrap_or(usize::MAX))
        });
        Round::Pull { most }
    }

    /// How many jobs one pull asks a tenant for, holding `reserved`
    /// reservations with `admitted` tokens in flight: no more than the
    /// reservations; about a quantum's worth while `several` tenants share
    /// the level; under an in-flight cap, no more than its room (at least
    /// one), so one pull cannot take a tenant far past it. `jobs_in` is how
    /// many of the tenant's jobs make a given number of tokens (at least 1).
    pub fn pull_size(
        &self,
        reserved: usize,
        several: bool,
        admitted: u64,
        jobs_in: impl Fn(u64) -> usize,
    ) -> usize {
        let mut want = reserved;
        if several {
            want = want.min(jobs_in(self.tenant_quantum));
        }
        if let Some(cap) = self.in_flight_cap {
            want = want.min(jobs_in(cap.tokens.saturating_sub(admitted)));
        }
        want
    }
}

/// The queues to give an idle long-poll, in order: each level present,
/// highest first; at each, the default tenant first, then the tenants
/// `backlogged` there; none that `polling` already has.
pub fn idle_queues(
    present: &[Priority],
    backlogged: impl Fn(Priority) -> Vec<String>,
    polling: &[QueueKey],
) -> Vec<QueueKey> {
    Priority::ALL
        .into_iter()
        .filter(|l| present.contains(l))
        .flat_map(|l| {
            let mut tenants = backlogged(l);
            if !tenants.iter().any(|t| t == sluice_schemas::DEFAULT_TENANT) {
                tenants.insert(0, sluice_schemas::DEFAULT_TENANT.to_string());
            }
            tenants.into_iter().map(move |t| (l, t))
        })
        .filter(|q| !polling.contains(q))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use Priority::*;

    fn plan(job_limit: Option<u64>, cap: Option<u64>) -> PullPlan {
        PullPlan {
            max_messages: 16,
            expires: Duration::from_secs(1),
            job_limit,
            in_flight_cap: cap.map(|tokens| InFlightCap {
                tokens,
                per_job: 256,
            }),
            tenant_quantum: 1000,
            job_estimate: 100,
        }
    }

    #[test]
    fn a_round_pulls_within_the_job_limit_and_the_in_flight_cap() {
        // (job limit, cap, taken, admitted) -> round
        let table = [
            (None, None, 0, 0, Round::Pull { most: 16 }),
            (None, None, 1_000_000, u64::MAX, Round::Pull { most: 16 }),
            (Some(10), None, 10, 0, Round::Recycled),
            (Some(10), None, 11, 0, Round::Recycled),
            (Some(10), None, 7, 0, Round::Pull { most: 3 }),
            (Some(100), None, 7, 0, Round::Pull { most: 16 }),
            (None, Some(500), 0, 499, Round::Pull { most: 16 }),
            (None, Some(500), 0, 500, Round::Full),
            // The job limit goes first: recycling beats a full cap.
            (Some(1), Some(500), 1, 900, Round::Recycled),
            (Some(2), Some(500), 1, 10, Round::Pull { most: 1 }),
        ];
        for (limit, cap, taken, admitted, want) in table {
            assert_eq!(
                plan(limit, cap).round(taken, admitted),
                want,
                "limit {limit:?} cap {cap:?} taken {taken} admitted {admitted}"
            );
        }
    }

    #[test]
    fn a_pull_asks_for_a_quantum_when_tenants_share_and_for_the_caps_room() {
        // A tenant whose jobs are 100 tokens each.
        let jobs_in = |tokens: u64| usize::try_from(tokens / 100).unwrap_or(usize::MAX).max(1);
        // (cap, reserved, several, admitted) -> jobs asked for
        let table = [
            (None, 16, false, 0, 16),
            // Several tenants: the 1,000-token quantum is 10 jobs.
            (None, 16, true, 0, 10),
            (None, 4, true, 0, 4),
            // Under a cap of 500 with 200 in flight: room for 3.
            (Some(500), 16, false, 200, 3),
            (Some(500), 2, false, 200, 2),
            // No room left still asks for one (the round checked the cap).
            (Some(500), 16, false, 500, 1),
            (Some(5000), 16, true, 0, 10),
        ];
        for (cap, reserved, several, admitted, want) in table {
            assert_eq!(
                plan(None, cap).pull_size(reserved, several, admitted, jobs_in),
                want,
                "cap {cap:?} reserved {reserved} several {several} admitted {admitted}"
            );
        }
    }

    #[test]
    fn idle_polls_go_highest_level_first_default_tenant_first_and_once_each() {
        let t = |s: &str| s.to_string();
        let backlogged = |l: Priority| match l {
            High => vec![t("acme")],
            Normal => vec![t("acme"), t("default"), t("zeta")],
            Low => vec![],
        };
        let all = idle_queues(&[Low, Normal, High], backlogged, &[]);
        assert_eq!(
            all,
            vec![
                (High, t("default")),
                (High, t("acme")),
                (Normal, t("acme")),
                (Normal, t("default")),
                (Normal, t("zeta")),
                (Low, t("default")),
            ]
        );
        // A stream from before priorities: the normal level only; queues
        // already polling are skipped.
        let normal = idle_queues(&[Normal], backlogged, &[(Normal, t("acme"))]);
        assert_eq!(normal, vec![(Normal, t("default")), (Normal, t("zeta"))]);
    }
}
