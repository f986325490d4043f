//! Each tenant's request rate: a token bucket per tenant (all its keys
//! share it), refilled at `rate` requests a second up to `burst`. A request
//! takes one token; with none left it is refused, told how long until one
//! is back. Tenants come from the keys, so the buckets are as many as the
//! tenants: bounded.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The request-rate limit of every tenant.
pub struct RequestRate {
    /// Tokens a second.
    rate: f64,
    /// The most tokens a bucket holds: the requests a tenant may send at
    /// once after a quiet spell.
    burst: f64,
    buckets: Mutex<HashMap<String, Bucket>>,
}

#[derive(Clone, Copy, Debug)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

impl RequestRate {
    /// `rate` requests a second, `burst` at once (at least 1).
    pub fn new(rate: f64, burst: u32) -> RequestRate {
        RequestRate {
            rate,
            burst: f64::from(burst.max(1)),
            buckets: Mutex::new(HashMap::new()),
        }
    }

    /// Takes one of `tenant`'s tokens at `now`, or says how long until one
    /// is back.
    pub fn admit(&self, tenant: &str, now: Instant) -> Result<(), Duration> {
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
        let (next, outcome) = take(*bucket, now, self.rate, self.burst);
        *bucket = next;
        outcome
    }
}

/// The bucket after a request at `now`, and whether it was admitted: the
/// tokens refilled since the last request (never past `burst`), less one.
fn take(bucket: Bucket, now: Instant, rate: f64, burst: f64) -> (Bucket, Result<(), Duration>) {
    let elapsed = now.saturating_duration_since(bucket.at).as_secs_f64();
    let tokens = (bucket.tokens + elapsed * rate).min(burst);
    let bucket = Bucket { tokens, at: now };
    if tokens >= 1.0 {
        let taken = Bucket {
            tokens: tokens - 1.0,
            at: now,
        };
        return (taken, Ok(()));
    }
    let wait = Duration::from_secs_f64((1.0 - tokens) / rate);
    (bucket, Err(wait))
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
}
