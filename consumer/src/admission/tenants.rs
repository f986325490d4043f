//! Tenant fair share in admission: which tenant's durable consumer the next
//! pull at a level asks first, and how many jobs it asks for.
//!
//! Deficit round-robin over token cost: each tenant has a *charge*, the
//! tokens of its jobs divided by its weight (default 1; `[tenant_weights]`
//! in the settings file). A job is charged its estimate (the tenant's mean
//! tokens per job so far) when it is taken, and corrected to its real tokens
//! when it ends, so jobs still running count. The tenant with the least
//! charge goes next and is asked for about one quantum of tokens' worth of
//! jobs; so while several tenants have a backlog each gets its weight's
//! share of the token throughput, whether its jobs are long or short.
//!
//! Idle time banks no credit: a tenant found with nothing to take is lifted
//! to the least charge of the tenants that have work, and so is a tenant
//! that arrives (has jobs waiting at a level and had none the last time
//! that level was asked), else a new
//! tenant would take everything until it had caught up with the history of
//! tenants that were busy all day.

use std::collections::HashMap;
use std::sync::Mutex;

/// The tenant weights stored on the durable consumers (`tenant=weight,...`).
pub fn parse_weights(text: &str) -> HashMap<String, f64> {
    text.split(',')
        .filter_map(|pair| {
            let (tenant, weight) = pair.split_once('=')?;
            let weight: f64 = weight.trim().parse().ok()?;
            (weight > 0.0).then(|| (tenant.trim().to_string(), weight))
        })
        .collect()
}

#[derive(Default)]
struct Account {
    /// Tokens (estimated while running) divided by the weight.
    charge: f64,
    /// Jobs finished and their tokens, for the estimate.
    jobs: u64,
    tokens: u64,
}

pub struct TenantShares {
    accounts: Mutex<HashMap<String, Account>>,
    /// The tenants of the last [`TenantShares::order`] at each level.
    last: Mutex<HashMap<usize, Vec<String>>>,
    weights: HashMap<String, f64>,
}

impl TenantShares {
    pub fn new(weights: HashMap<String, f64>) -> TenantShares {
        TenantShares {
            accounts: Mutex::default(),
            last: Mutex::default(),
            weights,
        }
    }

    fn weight(&self, tenant: &str) -> f64 {
        self.weights.get(tenant).copied().unwrap_or(1.0)
    }

    fn with<R>(&self, tenant: &str, f: impl FnOnce(&mut Account) -> R) -> R {
        let mut accounts = self.accounts.lock().unwrap_or_else(|e| e.into_inner());
        f(accounts.entry(tenant.to_string()).or_default())
    }

    /// The tokens `tenant`'s next job is expected to use: its mean so far,
    /// else `fallback`.
    pub fn estimate(&self, tenant: &str, fallback: u64) -> u64 {
        self.with(tenant, |a| {
            a.tokens.checked_div(a.jobs).map_or(fallback, |m| m.max(1))
        })
    }

    /// How many of `tenant`'s jobs make about `quantum` tokens (at least 1).
    pub fn jobs_per_quantum(&self, tenant: &str, quantum: u64, fallback: u64) -> usize {
        usize::try_from(quantum / self.estimate(tenant, fallback).max(1))
            .unwrap_or(usize::MAX)
            .max(1)
    }

    /// A job of `tenant`'s was taken, expected to use `estimate` tokens.
    pub fn taken(&self, tenant: &str, estimate: u64) {
        let w = self.weight(tenant);
        self.with(tenant, |a| a.charge += estimate as f64 / w);
    }

    /// The job taken with `estimate` ended having used `tokens` (0 when it
    /// failed or went back to the stream).
    pub fn finished(&self, tenant: &str, estimate: u64, tokens: u64) {
        let w = self.weight(tenant);
        self.with(tenant, |a| {
            a.charge += (tokens as f64 - estimate as f64) / w;
            if tokens > 0 {
                a.jobs += 1;
                a.tokens += tokens;
            }
        });
    }

    /// `tenants` (those with jobs waiting at level `level`) in the order to
    /// ask them: least charge first, ties by name. A tenant that was not
    /// among them the last time starts at the least charge of those that
    /// were.
    pub fn order<'a>(&self, level: usize, tenants: &'a [String]) -> Vec<&'a String> {
        let mut accounts = self.accounts.lock().unwrap_or_else(|e| e.into_inner());
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        let before = last.entry(level).or_default();
        let floor = tenants
            .iter()
            .filter(|t| before.contains(*t))
            .filter_map(|t| accounts.get(t).map(|a| a.charge))
            .reduce(f64::min);
        for t in tenants {
            let a = accounts.entry(t.clone()).or_default();
            if let Some(floor) = floor
                && !before.contains(t)
            {
                a.charge = a.charge.max(floor);
            }
        }
        *before = tenants.to_vec();
        let charge = |t: &String| accounts.get(t).map_or(0.0, |a| a.charge);
        let mut order: Vec<&String> = tenants.iter().collect();
        order.sort_by(|a, b| charge(a).total_cmp(&charge(b)).then_with(|| a.cmp(b)));
        order
    }

    /// `tenant` had nothing to take: lift its charge to the least of
    /// `others` (the tenants with work), so it banks nothing while idle.
    pub fn found_empty(&self, tenant: &str, others: &[String]) {
        let mut accounts = self.accounts.lock().unwrap_or_else(|e| e.into_inner());
        let least = others
            .iter()
            .filter(|o| o.as_str() != tenant)
            .filter_map(|o| accounts.get(o).map(|a| a.charge))
            .reduce(f64::min);
        if let Some(least) = least {
            let a = accounts.entry(tenant.to_string()).or_default();
            a.charge = a.charge.max(least);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two tenants always backlogged, one with jobs of 4,096 tokens, one
    /// with jobs of 64: each round serves the first in order one quantum's
    /// worth of jobs; the tokens split evenly, and 2 : 1 with a weight.
    fn serve(weights: HashMap<String, f64>) -> (u64, u64) {
        let s = TenantShares::new(weights);
        let tenants = vec!["a".to_string(), "b".to_string()];
        let job_tokens = |t: &str| if t == "a" { 4096 } else { 64 };
        let mut served: HashMap<String, u64> = HashMap::new();
        // Jobs in flight: (tenant, estimate, tokens), finishing two rounds late.
        let mut running: std::collections::VecDeque<(String, u64, u64)> = Default::default();
        for _ in 0..2_000 {
            let first = s.order(0, &tenants)[0].clone();
            for _ in 0..s.jobs_per_quantum(&first, 2048, 256) {
                let estimate = s.estimate(&first, 256);
                s.taken(&first, estimate);
                running.push_back((first.clone(), estimate, job_tokens(&first)));
            }
            while running.len() > 40 {
                let Some((t, e, tokens)) = running.pop_front() else {
                    break;
                };
                s.finished(&t, e, tokens);
                *served.entry(t).or_default() += tokens;
            }
        }
        (served["a"], served["b"])
    }

    #[test]
    fn backlogged_tenants_share_tokens_by_weight_whatever_their_job_sizes() {
        let (a, b) = serve(HashMap::new());
        let ratio = a as f64 / b as f64;
        assert!((0.95..1.05).contains(&ratio), "a {a} b {b}");
        let (a, b) = serve(parse_weights("a=2, b=1"));
        let ratio = a as f64 / b as f64;
        assert!((1.9..2.1).contains(&ratio), "a {a} b {b}");
    }

    #[test]
    fn an_idle_tenant_banks_nothing_and_a_failed_job_refunds_its_estimate() {
        let s = TenantShares::new(HashMap::new());
        let both = vec!["a".to_string(), "b".to_string()];
        s.taken("a", 1_000_000);
        s.finished("a", 1_000_000, 1_000_000);
        // c arrives after a served a million tokens alone: it starts level
        // with a, not a million tokens ahead.
        assert_eq!(s.order(0, &["a".to_string()]), ["a"]);
        let a_and_c = vec!["a".to_string(), "c".to_string()];
        assert_eq!(s.order(0, &a_and_c), ["a", "c"], "level: ties by name");
        s.taken("a", 100);
        assert_eq!(s.order(0, &a_and_c), ["c", "a"]);
        s.taken("c", 200);
        assert_eq!(s.order(0, &a_and_c), ["a", "c"], "c gets no banked credit");
        // b was idle all that time; asked and found empty, it is lifted to
        // a's charge.
        assert_eq!(s.order(0, &both)[0], "a");
        s.found_empty("b", &both);
        s.taken("a", 100);
        assert_eq!(s.order(0, &both)[0], "b");
        // A job that failed costs nothing: its estimate comes back.
        s.taken("b", 500);
        s.finished("b", 500, 0);
        assert_eq!(s.order(0, &both)[0], "b");
        assert_eq!(s.estimate("b", 77), 77, "a failed job does not count");
        assert_eq!(s.estimate("a", 77), 1_000_000);
        assert_eq!(parse_weights("x=2,bad,y=0,z=1.5").len(), 2);
    }
}
