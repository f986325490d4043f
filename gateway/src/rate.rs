//! Each tenant's rates, a token bucket per tenant (all its keys share it)
//! refilled at a steady rate up to a burst; tenants come from the keys, so
//! the buckets are as many as the tenants: bounded.
//!
//! - [`RequestRate`]: a request takes one token; with none left it is
//!   refused, told how long until one is back.
//! - [`TokenRate`]: model tokens (prompt and completion) of online
//!   requests. A request is admitted while its tenant's bucket is not in
//!   debt, and the tokens it used, as its answer reports them, are taken
//!   when it is answered: a large request may take the bucket below zero,
//!   and the tenant's next one waits until it has refilled. The charge is
//!   exact (no estimate before the model has tokenized), and a tenant
//!   overshoots by at most what its requests in flight use.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Token buckets by tenant: `rate` tokens a second, at most `burst` held.
struct Buckets {
    rate: f64,
    burst: f64,
    buckets: Mutex<HashMap<String, Bucket>>,
}

#[derive(Clone, Copy, Debug)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

impl Buckets {
    fn new(rate: f64, burst: f64) -> Buckets {
        Buckets {
            rate,
            burst,
            buckets: Mutex::new(HashMap::new()),
        }
    }

    /// `tenant`'s bucket at `now` takes `cost` if it holds `need`, or says
    /// how long until it will.
    fn take(&self, tenant: &str, now: Instant, need: f64, cost: f64) -> Result<(), Duration> {
        let mut buckets = self
            .buckets
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let full = Bucket {
            tokens: self.burst,
            at: now,
        };
        // The tenant's name is copied once, at its first request.
        let bucket = match buckets.get_mut(tenant) {
            Some(bucket) => bucket,
            None => buckets.entry(tenant.to_string()).or_insert(full),
        };
        let (next, outcome) = take(*bucket, now, self.rate, self.burst, need, cost);
        *bucket = next;
        outcome
    }
}

/// The bucket after a take at `now`, and whether it was admitted: the
/// tokens refilled since the last take (never past `burst`), less `cost`
/// when they reach `need`.
fn take(
    bucket: Bucket,
    now: Instant,
    rate: f64,
    burst: f64,
    need: f64,
    cost: f64,
) -> (Bucket, Result<(), Duration>) {
    let elapsed = now.saturating_duration_since(bucket.at).as_secs_f64();
    let tokens = (bucket.tokens + elapsed * rate).min(burst);
    if tokens >= need {
        let taken = Bucket {
            tokens: tokens - cost,
            at: now,
        };
        return (taken, Ok(()));
    }
    let wait = Duration::from_secs_f64((need - tokens) / rate);
    (Bucket { tokens, at: now }, Err(wait))
}

/// The request-rate limit of every tenant.
pub struct RequestRate(Buckets);

impl RequestRate {
    /// `rate` requests a second, `burst` at once (at least 1).
    pub fn new(rate: f64, burst: u32) -> RequestRate {
        RequestRate(Buckets::new(rate, f64::from(burst.max(1))))
    }

    /// Takes one of `tenant`'s tokens at `now`, or says how long until one
    /// is back.
    pub fn admit(&self, tenant: &str, now: Instant) -> Result<(), Duration> {
        self.0.take(tenant, now, 1.0, 1.0)
    }
}

/// The model-token rate limit of every tenant's online requests.
pub struct TokenRate {
    buckets: Buckets,
    per_minute: u64,
}

impl TokenRate {
    /// `per_minute` tokens a minute, as many at once after a quiet minute.
    pub fn new(per_minute: u64) -> TokenRate {
        let burst = per_minute.max(1) as f64;
        TokenRate {
            buckets: Buckets::new(burst / 60.0, burst),
            per_minute,
        }
    }

    pub fn per_minute(&self) -> u64 {
        self.per_minute
    }

    /// Admits a request of `tenant` at `now` unless its bucket is in debt
    /// (then: how long until it is not).
    pub fn admit(&self, tenant: &str, now: Instant) -> Result<(), Duration> {
        self.buckets.take(tenant, now, 1.0, 0.0)
    }

    /// Takes the `tokens` an answered request used from `tenant`'s bucket.
    pub fn charge(&self, tenant: &str, tokens: u64, now: Instant) {
        let _ = self
            .buckets
            .take(tenant, now, f64::NEG_INFINITY, tokens as f64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// At 2 a second with a burst of 3: three at once, then refused with the
    /// wait for the next token; half a second on, one more; each tenant on
    /// its own bucket.
    #[test]
    fn a_tenant_gets_its_burst_then_its_rate_and_no_more() {
        let limit = RequestRate::new(2.0, 3);
        let t0 = Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        let table: [(&str, Instant, Result<(), Duration>); 8] = [
            ("a", ms(0), Ok(())),
            ("a", ms(0), Ok(())),
            ("a", ms(0), Ok(())),
            ("a", ms(0), Err(Duration::from_millis(500))),
            ("b", ms(0), Ok(())),
            ("a", ms(250), Err(Duration::from_millis(250))),
            ("a", ms(500), Ok(())),
            ("a", ms(500), Err(Duration::from_millis(500))),
        ];
        for (i, (tenant, at, want)) in table.into_iter().enumerate() {
            let got = limit.admit(tenant, at);
            match (got, want) {
                (Ok(()), Ok(())) => {}
                (Err(g), Err(w)) => {
                    assert!(
                        g.abs_diff(w) < Duration::from_millis(1),
                        "row {i}: {g:?} vs {w:?}"
                    )
                }
                _ => panic!(
                    "row {i}: {tenant} at +{:?}: {got:?}, expected {want:?}",
                    at - t0
                ),
            }
        }
        // A long quiet spell refills no more than the burst.
        for _ in 0..3 {
            assert_eq!(limit.admit("a", ms(60_000)), Ok(()));
        }
        assert!(limit.admit("a", ms(60_000)).is_err());
    }

    /// At 6,000 tokens a minute (100 a second, 6,000 at once): admitted
    /// while not in debt, however much the answers used; a 9,000-token
    /// answer puts the tenant 3,000 in debt, so its next request waits the
    /// 30 s that refill it, and one more second of refill lets it in; the
    /// other tenant is not held.
    #[test]
    fn a_tenant_is_admitted_while_not_in_debt_and_charged_what_its_answers_used() {
        let limit = TokenRate::new(6_000);
        let t0 = Instant::now();
        let s = |n: u64| t0 + Duration::from_secs(n);
        assert_eq!(limit.admit("a", s(0)), Ok(()));
        limit.charge("a", 5_000, s(0));
        assert_eq!(limit.admit("a", s(0)), Ok(()), "1,000 left");
        limit.charge("a", 4_000, s(0));
        let Err(wait) = limit.admit("a", s(0)) else {
            panic!("admitted in debt");
        };
        assert!(
            wait.abs_diff(Duration::from_millis(30_010)) < Duration::from_millis(1),
            "{wait:?}"
        );
        assert_eq!(limit.admit("b", s(0)), Ok(()), "b has its own bucket");
        assert!(limit.admit("a", s(30)).is_err(), "30 s refill 3,000: at 0");
        assert_eq!(limit.admit("a", s(31)), Ok(()));
        // A quiet spell refills no more than a minute's worth.
        limit.charge("a", 0, s(3_600));
        limit.charge("a", 6_000, s(3_600));
        assert!(limit.admit("a", s(3_600)).is_err());
    }
}
