//! The ack policy, as a pure function: what to do with a delivery given how
//! its processing ended, which attempt it was and how many the durable
//! consumer allows. [`super::settle`] applies the answer; nothing here talks
//! to a server, so the whole table is tested without one.

use std::time::Duration;

use sluice_schemas::ErrorCode;

use crate::error::JobError;

/// How processing a delivery ended.
#[derive(Debug, Clone, Copy)]
pub enum Ended<'a> {
    /// The job produced its output.
    Done,
    /// Its status was already final: an earlier delivery answered it and
    /// only that delivery's ack was lost.
    AlreadyAnswered,
    /// It failed with this error.
    Failed(&'a JobError),
}

/// What to do with the delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Disposition {
    /// Write the final status (compare-and-swap), publish the result, then
    /// ack. If the status write finds the job already final, only ack.
    AnswerThenAck,
    /// Ack without answering: the job was answered before.
    AckDuplicate,
    /// Give the message back for redelivery after this delay (a retryable
    /// failure with deliveries left).
    Nak(Duration),
    /// A final failure: publish the dead letter and write the failed status
    /// (both awaited: the message stays until both are durable), publish
    /// the error result, then Term.
    DeadLetterThenTerm,
    /// Cancelled: publish the error result but no dead letter (nothing to
    /// replay), then Term.
    AnswerThenTerm,
}

/// Exponential backoff between deliveries, capped, with jitter.
#[derive(Debug, Clone, Copy)]
pub struct Backoff {
    pub base: Duration,
    pub max: Duration,
}

impl Backoff {
    /// The delay before attempt `attempt + 1`: `base * 2^(attempt-1)`,
    /// capped at `max`, then scaled into [50%, 100%] by `jitter_seed`
    /// (bits that differ per message and attempt, so a burst of failures
    /// does not come back at once).
    pub fn delay(&self, attempt: u32, jitter_seed: u64) -> Duration {
        let base = self.base.as_millis() as u64;
        let cap = self.max.as_millis() as u64;
        let exp = base.saturating_mul(1u64 << attempt.saturating_sub(1).min(20));
        let capped = exp.min(cap);
        let frac = 0.5 + (jitter_seed % 1000) as f64 / 2000.0;
        Duration::from_millis((capped as f64 * frac) as u64)
    }
}

/// The ack decision. `max_deliver` is the durable consumer's limit
/// (`i64::MAX` when unlimited); `attempt` counts from 1.
pub fn decide(
    ended: Ended<'_>,
    attempt: u32,
    max_deliver: i64,
    backoff: &Backoff,
    jitter_seed: u64,
) -> Disposition {
    match ended {
        Ended::Done => Disposition::AnswerThenAck,
        Ended::AlreadyAnswered => Disposition::AckDuplicate,
        Ended::Failed(error) if error.code == ErrorCode::Cancelled => Disposition::AnswerThenTerm,
        Ended::Failed(error) if error.is_retryable() && i64::from(attempt) < max_deliver => {
            Disposition::Nak(backoff.delay(attempt, jitter_seed))
        }
        Ended::Failed(_) => Disposition::DeadLetterThenTerm,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BACKOFF: Backoff = Backoff {
        base: Duration::from_millis(1000),
        max: Duration::from_millis(60_000),
    };

    fn err(code: ErrorCode) -> JobError {
        JobError::new(code, "x")
    }

    /// Every outcome kind against first, middle and last attempts.
    #[test]
    fn the_ack_table() {
        use Disposition::*;
        let storage = err(ErrorCode::StorageUnavailable);
        let oom = err(ErrorCode::DeviceOutOfMemory);
        let fetch = err(ErrorCode::InputFetchFailed);
        let internal = err(ErrorCode::Internal);
        let invalid = err(ErrorCode::InputInvalid);
        let malformed = err(ErrorCode::MalformedMessage);
        let too_long = err(ErrorCode::ItemTooLong);
        let deadline = err(ErrorCode::DeadlineExceeded);
        let cancelled = err(ErrorCode::Cancelled);
        let exhausted = err(ErrorCode::MaxDeliveriesExceeded);
        // seed 999 -> 99.95% of the capped delay; seed 0 -> 50%.
        let cases: Vec<(Ended, u32, i64, Disposition)> = vec![
            (Ended::Done, 1, 5, AnswerThenAck),
            (Ended::Done, 5, 5, AnswerThenAck),
            (Ended::AlreadyAnswered, 1, 5, AckDuplicate),
            (Ended::AlreadyAnswered, 9, 5, AckDuplicate),
            // Retryable with deliveries left: Nak with backoff.
            (
                Ended::Failed(&storage),
                1,
                5,
                Nak(Duration::from_millis(999)),
            ),
            (Ended::Failed(&oom), 2, 5, Nak(Duration::from_millis(1999))),
            (
                Ended::Failed(&fetch),
                3,
                5,
                Nak(Duration::from_millis(3998)),
            ),
            (
                Ended::Failed(&internal),
                4,
                5,
                Nak(Duration::from_millis(7996)),
            ),
            // Retryable on the last delivery: nothing comes after it.
            (Ended::Failed(&storage), 5, 5, DeadLetterThenTerm),
            (Ended::Failed(&internal), 6, 5, DeadLetterThenTerm),
            // Unlimited deliveries: always retried.
            (
                Ended::Failed(&storage),
                1000,
                i64::MAX,
                Nak(Duration::from_millis(59_970)),
            ),
            // Final errors dead-letter on any attempt.
            (Ended::Failed(&invalid), 1, 5, DeadLetterThenTerm),
            (Ended::Failed(&malformed), 1, i64::MAX, DeadLetterThenTerm),
            (Ended::Failed(&too_long), 3, 5, DeadLetterThenTerm),
            (Ended::Failed(&deadline), 1, 5, DeadLetterThenTerm),
            (Ended::Failed(&exhausted), 5, 5, DeadLetterThenTerm),
            // Cancelled: answered, never dead-lettered, never retried.
            (Ended::Failed(&cancelled), 1, 5, AnswerThenTerm),
            (Ended::Failed(&cancelled), 5, 5, AnswerThenTerm),
        ];
        for (ended, attempt, max_deliver, want) in cases {
            let got = decide(ended, attempt, max_deliver, &BACKOFF, 999);
            assert_eq!(got, want, "{ended:?}, attempt {attempt} of {max_deliver}");
        }
    }

    #[test]
    fn backoff_doubles_is_capped_and_jitters_within_half() {
        let full = |attempt| BACKOFF.delay(attempt, 1000); // frac 0.5 + 0
        assert_eq!(full(1), Duration::from_millis(500));
        assert_eq!(full(2), Duration::from_millis(1000));
        assert_eq!(full(7), Duration::from_millis(30_000));
        assert_eq!(
            full(8),
            Duration::from_millis(30_000),
            "capped at 60 s * 0.5"
        );
        assert_eq!(full(u32::MAX), Duration::from_millis(30_000), "no overflow");
        for seed in [0, 1, 499, 500, 999, u64::MAX] {
            let d = BACKOFF.delay(3, seed);
            assert!(
                d >= Duration::from_millis(2000) && d < Duration::from_millis(4000),
                "{d:?}"
            );
        }
    }
}
