//! Waiting for job results in tests, with deadlines.

use std::time::Duration;

use sluice_schemas::{JobResult, Outcome};

/// The next `n` results, in arrival order; panics if they do not all come
/// within `timeout`.
pub async fn wait_results(
    results: &mut sluice_producer::Results,
    n: usize,
    timeout: Duration,
) -> Vec<JobResult> {
    let mut got = Vec::new();
    let deadline = tokio::time::Instant::now() + timeout;
    while got.len() < n {
        match tokio::time::timeout_at(deadline, results.next_result()).await {
            Ok(r) => got.push(r.unwrap()),
            Err(_) => panic!("only {} of {n} results within {timeout:?}", got.len()),
        }
    }
    got
}

/// Waits for the next result and returns its error; panics on an ok result.
pub async fn next_error(
    results: &mut sluice_producer::Results,
) -> (JobResult, sluice_schemas::ErrorInfo) {
    let r = wait_results(results, 1, Duration::from_secs(60))
        .await
        .remove(0);
    match &r.outcome {
        Outcome::Error { error } => {
            let error = error.clone();
            (r, error)
        }
        other => panic!("{:?}: expected an error, got {other:?}", r.job_id),
    }
}
