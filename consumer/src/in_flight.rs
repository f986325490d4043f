//! What admission has taken and not yet settled: jobs, and the real tokens
//! of those already tokenized. Admission holds embed jobs back while these
//! hold `--max-tokens-in-flight` tokens; `/metrics` and `/stats` read the
//! same counts. A leaf: admission counts a job in when it takes it, the
//! job's pipeline counts its tokens in with [`InFlight::tokenized`], and the
//! guards count both out, so neither imports the other.
//!
//! Invariant: `tokenized_jobs <= jobs` at every instant a reader can see
//! (a job is counted in before its task starts and out after its
//! [`Tokenized`] guard drops), so the untokenized count never underflows.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Default)]
pub struct InFlight {
    jobs: AtomicU64,
    tokenized_jobs: AtomicU64,
    tokens: AtomicU64,
}

impl InFlight {
    /// Jobs taken and not settled.
    pub fn jobs(&self) -> u64 {
        self.jobs.load(Ordering::Relaxed)
    }

    /// Real tokens of the tokenized jobs not settled.
    pub fn tokens(&self) -> u64 {
        self.tokens.load(Ordering::Relaxed)
    }

    /// A job was taken: counted until the guard drops (which the job's
    /// task owns).
    pub fn job(self: &Arc<Self>) -> Job {
        self.jobs.fetch_add(1, Ordering::Relaxed);
        Job {
            in_flight: Arc::clone(self),
        }
    }

    /// A taken job's `tokens` are known: counted until the guard drops.
    pub fn tokenized(&self, tokens: u64) -> Tokenized<'_> {
        self.tokens.fetch_add(tokens, Ordering::Relaxed);
        self.tokenized_jobs.fetch_add(1, Ordering::Relaxed);
        Tokenized {
            in_flight: self,
            tokens,
        }
    }

    /// The tokens admitted and not settled: those of tokenized jobs, plus
    /// `per_untokenized_job` for each job not tokenized yet (the caller's
    /// estimate: the mean of the jobs answered so far).
    pub fn tokens_admitted(&self, per_untokenized_job: u64) -> u64 {
        let untokenized = self
            .jobs()
            .saturating_sub(self.tokenized_jobs.load(Ordering::Relaxed));
        self.tokens() + untokenized * per_untokenized_job.max(1)
    }
}

/// One taken job, counted in [`InFlight`] while alive.
pub struct Job {
    in_flight: Arc<InFlight>,
}

impl Drop for Job {
    fn drop(&mut self) {
        self.in_flight.jobs.fetch_sub(1, Ordering::Relaxed);
    }
}

/// One job's tokens, counted in [`InFlight`] while alive.
pub struct Tokenized<'a> {
    in_flight: &'a InFlight,
    tokens: u64,
}

impl Drop for Tokenized<'_> {
    fn drop(&mut self) {
        let f = self.in_flight;
        f.tokens.fetch_sub(self.tokens, Ordering::Relaxed);
        f.tokenized_jobs.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn untokenized_jobs_count_at_the_estimate_and_guards_count_out() {
        let f = Arc::new(InFlight::default());
        assert_eq!(f.tokens_admitted(100), 0);
        let a = f.job();
        let b = f.job();
        // Neither tokenized: two estimates (an estimate of 0 counts as 1).
        assert_eq!(f.tokens_admitted(100), 200);
        assert_eq!(f.tokens_admitted(0), 2);
        let a_tokens = f.tokenized(30);
        assert_eq!(f.tokens_admitted(100), 130);
        assert_eq!((f.jobs(), f.tokens()), (2, 30));
        drop(a_tokens);
        drop(a);
        assert_eq!(f.tokens_admitted(100), 100);
        drop(b);
        assert_eq!((f.jobs(), f.tokens(), f.tokens_admitted(100)), (0, 0, 0));
    }
}
