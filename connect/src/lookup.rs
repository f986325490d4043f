//! Start-up lookups of what `sluice init` made (the job stream, its durable
//! consumers, the KV buckets), told apart by why they fail.
//!
//! A cluster whose nodes all restarted (a StatefulSet brought back) answers
//! JetStream requests only once it has elected a meta leader and the
//! streams' leaders: until then a lookup times out, or is refused as
//! temporarily unavailable. That is not a missing stream, and a process
//! that exits on it ("run `sluice init`") is restarted into the same answer
//! until the election ends. So a lookup is retried while JetStream does not
//! answer, for up to [`PATIENCE`], and fails at once only on the server's
//! own word that the thing does not exist (stream not found, 10059;
//! consumer not found, 10014), where the message names the fix.

use std::fmt;
use std::future::Future;
use std::time::{Duration, Instant};

/// How long a start-up lookup waits for JetStream to answer: an election
/// after a whole cluster restarts takes seconds to tens of seconds.
pub const PATIENCE: Duration = Duration::from_secs(90);

/// JetStream's error codes for "no such stream" and "no such consumer".
const STREAM_NOT_FOUND: &str = "error code 10059)";
const CONSUMER_NOT_FOUND: &str = "error code 10014)";

/// Why a lookup failed.
#[derive(Debug)]
pub enum LookupError {
    /// The server said it does not exist: `sluice init` has not made it.
    Missing(String),
    /// JetStream gave no answer (no leader, timeouts) for `waited`.
    Unanswered { waited: Duration, last: String },
}

impl fmt::Display for LookupError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LookupError::Missing(e) => write!(f, "{e}"),
            LookupError::Unanswered { waited, last } => write!(
                f,
                "JetStream gave no answer for {} s (is the cluster up, with a leader elected? `nats server report jetstream` tells): {last}",
                waited.as_secs()
            ),
        }
    }
}

impl std::error::Error for LookupError {}

impl LookupError {
    /// The error to exit with: `what` not found with `fix`, or not answered.
    pub fn for_start_up(self, what: &str, fix: &str) -> anyhow::Error {
        match self {
            LookupError::Missing(e) => anyhow::anyhow!("{what} not found: {fix} ({e})"),
            e => anyhow::anyhow!("cannot look up {what}: {e}"),
        }
    }
}

/// Whether `error` (with its chain) is the server's word that a stream or
/// consumer does not exist. async-nats wraps the server's error in several
/// kinds depending on the call; its text, `"<description> (code 404, error
/// code 10059)"`, is the same in all.
pub fn is_missing(error: &anyhow::Error) -> bool {
    error.chain().any(|e| {
        let text = e.to_string();
        text.contains(STREAM_NOT_FOUND) || text.contains(CONSUMER_NOT_FOUND)
    })
}

/// Runs `lookup` of `what` until it answers, it is missing, or
/// [`PATIENCE`] passes; each retry is logged.
pub async fn look_up<T, E, F, Fut>(what: &str, lookup: F) -> Result<T, LookupError>
where
    E: Into<anyhow::Error>,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    look_up_within(what, PATIENCE, lookup).await
}

/// [`look_up`] with its own patience.
pub async fn look_up_within<T, E, F, Fut>(
    what: &str,
    patience: Duration,
    mut lookup: F,
) -> Result<T, LookupError>
where
    E: Into<anyhow::Error>,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let started = Instant::now();
    let mut pause = Duration::from_millis(250);
    loop {
        let error = match lookup().await {
            Ok(found) => return Ok(found),
            Err(e) => e.into(),
        };
        if is_missing(&error) {
            return Err(LookupError::Missing(chain(&error)));
        }
        let waited = started.elapsed();
        if waited + pause > patience {
            return Err(LookupError::Unanswered {
                waited,
                last: chain(&error),
            });
        }
        tracing::warn!(
            what,
            error = %chain(&error),
            waited_s = waited.as_secs(),
            patience_s = patience.as_secs(),
            "JetStream does not answer yet (a cluster electing its leaders?); trying again"
        );
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(5));
    }
}

/// `error: cause: cause`, leaving out a cause its parent's text holds
/// already (async-nats repeats them).
fn chain(error: &anyhow::Error) -> String {
    let mut text = String::new();
    for e in error.chain() {
        let next = e.to_string();
        if !text.contains(&next) {
            if !text.is_empty() {
                text.push_str(": ");
            }
            text.push_str(&next);
        }
    }
    text
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[derive(Debug)]
    struct Failed(&'static str, Option<Box<Failed>>);
    impl fmt::Display for Failed {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(self.0)
        }
    }
    impl std::error::Error for Failed {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            self.1.as_deref().map(|e| e as _)
        }
    }

    #[test]
    fn only_the_servers_not_found_codes_are_missing() {
        let cases: [(Failed, bool); 5] = [
            (
                Failed(
                    "failed to get the bucket",
                    Some(Box::new(Failed(
                        "jetstream error: stream not found (code 404, error code 10059)",
                        None,
                    ))),
                ),
                true,
            ),
            (
                Failed("consumer not found (code 404, error code 10014)", None),
                true,
            ),
            (
                Failed(
                    "request error: timed out: request timed out: deadline has elapsed",
                    None,
                ),
                false,
            ),
            (
                Failed(
                    "JetStream system temporarily unavailable (code 503, error code 10008)",
                    None,
                ),
                false,
            ),
            // A longer code that merely starts with one of them.
            (
                Failed("something (code 404, error code 100590)", None),
                false,
            ),
        ];
        for (error, missing) in cases {
            let text = error.to_string();
            assert_eq!(is_missing(&error.into()), missing, "{text}");
        }
    }

    #[tokio::test]
    async fn a_lookup_is_retried_while_unanswered_and_gives_up_after_its_patience() {
        // Pauses of 0.25, 0.5, 1 s: three retries fit in 2 s.
        let patience = Duration::from_secs(2);
        let mut calls = 0;
        let got = look_up_within("the job stream", patience, || {
            calls += 1;
            let answer = if calls < 3 {
                Err(Failed("request timed out", None))
            } else {
                Ok(calls)
            };
            async move { answer }
        })
        .await;
        assert_eq!(got.unwrap(), 3);
        let mut calls = 0;
        let got: Result<(), _> = look_up_within("the job stream", patience, || {
            calls += 1;
            async { Err(Failed("request timed out", None)) }
        })
        .await;
        match got {
            Err(LookupError::Unanswered { waited, .. }) => {
                assert!(waited <= patience, "{waited:?}")
            }
            other => panic!("{other:?}"),
        }
        assert!(calls >= 3, "{calls}");
        let mut calls = 0;
        let got: Result<(), _> = look_up_within("the job stream", patience, || {
            calls += 1;
            async {
                Err(Failed(
                    "stream not found (code 404, error code 10059)",
                    None,
                ))
            }
        })
        .await;
        assert!(matches!(got, Err(LookupError::Missing(_))), "{got:?}");
        assert_eq!(calls, 1, "a missing stream is not waited for");
    }
}
