//! The official `openai` Python SDK (installed by `scripts/setup` into
//! `.sluice/pyenv`) driving a gateway, as a user's script would.

use std::time::Duration;

use serde_json::Value;

use crate::repo_root;

/// Runs `script` (Python source) with `args` as its `sys.argv[1:]`, pointed
/// at the gateway API `base` (`http://host:port/v1`) with `key`; panics
/// with its stderr when it fails or outlives `timeout`; returns its stdout
/// parsed as JSON.
pub async fn run_python(
    script: &str,
    args: &[String],
    base: &str,
    key: &str,
    timeout: Duration,
) -> Value {
    let run = tokio::process::Command::new(repo_root().join(".sluice/pyenv/bin/python"))
        .arg("-c")
        .arg(script)
        .args(args)
        .env("OPENAI_BASE_URL", base)
        .env("OPENAI_API_KEY", key)
        .kill_on_drop(true)
        .output();
    let run = tokio::time::timeout(timeout, run)
        .await
        .unwrap_or_else(|_| panic!("the SDK script ran past {timeout:?}"))
        .expect("run the SDK's Python");
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    serde_json::from_slice(&run.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&run.stdout)))
}
