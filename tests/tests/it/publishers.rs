//! Publishers in other languages: the Python and Node examples, which use only
//! the published contract, submit real jobs to a real deployment.

use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;
use sluice_schemas::JobState;
use sluice_tests::deploy::Deployment;
use sluice_tests::repo_root;

/// Runs an example program with the deployment's publisher environment and
/// returns its one JSON line; panics with its output when it fails.
async fn run_example(d: &Deployment, program: &str, args: &[String]) -> Value {
    let root = repo_root();
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(args)
        .current_dir(&root)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .envs(d.publisher_env())
        .env("SLUICE_WAIT_TIMEOUT_SECS", "120")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {program} (run ./scripts/setup): {e}"));
    let out = tokio::time::timeout(Duration::from_secs(180), child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("{program} {args:?} ran past 180 s"))
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{program} {args:?} failed ({}):\nstdout: {stdout}\nstderr: {stderr}",
        out.status
    );
    serde_json::from_str(stdout.trim())
        .unwrap_or_else(|e| panic!("{program} printed no JSON line ({e}): {stdout}\n{stderr}"))
}

fn texts(n: usize) -> Vec<String> {
    (0..n)
        .map(|i| format!("sentence {i} published from another language"))
        .collect()
}

/// A job large enough for an S3 output and a small one answered inline, both
/// normalized vectors of the model's dimension; nothing left in the stream.
async fn check_example(program: &str, script: &str) {
    let d = Deployment::start().await.unwrap();
    let _consumer = d.start_consumer(&[]).await.unwrap();
    for (n, output) in [(12, "s3"), (2, "inline")] {
        let mut args = vec![script.to_string()];
        args.extend(texts(n));
        let got = run_example(&d, program, &args).await;
        assert_eq!(got["output"], output, "{got}");
        assert_eq!(got["shape"], serde_json::json!([n, 384]), "{got}");
        let norms = got["norms"].as_array().unwrap();
        assert_eq!(norms.len(), n);
        for norm in norms {
            assert!((norm.as_f64().unwrap() - 1.0).abs() < 1e-3, "{got}");
        }
        let id = got["job_id"].as_str().unwrap();
        let status = d.producer.status(id).await.unwrap().unwrap();
        assert_eq!(status.state, sluice_schemas::JobState::Done, "{status:?}");
    }
    assert_eq!(d.jobs_in_stream_settled(0).await, 0);
}

#[tokio::test]
async fn python_publisher_example_submits_and_reads_results() {
    let python = repo_root().join(".sluice/pyenv/bin/python");
    check_example(python.to_str().unwrap(), "examples/python/submit_embed.py").await;
}

#[tokio::test]
async fn node_publisher_example_submits_and_reads_results() {
    check_example("node", "examples/node/submit_embed.mjs").await;
}

#[tokio::test]
async fn rust_producer_example_submits_and_reads_results() {
    let d = Deployment::start().await.unwrap();
    let _consumer = d.start_consumer(&[]).await.unwrap();
    let profile_dir = std::env::current_exe()
        .unwrap()
        .parent()
        .and_then(|deps| deps.parent())
        .unwrap()
        .to_path_buf();
    let example = profile_dir.join("examples/submit");
    assert!(
        example.is_file(),
        "{} not built (cargo build --workspace --all-targets; scripts/test does)",
        example.display()
    );
    let out = tokio::process::Command::new(&example)
        .args(texts(12))
        .env_clear()
        .envs(d.publisher_env())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(180), out)
        .await
        .expect("the example ran past 180 s")
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("shape [12, 384]"),
        "{}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Every message that names a reply subject is answered there, readable or
/// not (issue #16): a Python publisher written from the contract sends each
/// kind of bad message with its own inbox and waits for one answer each.
/// Each is answered under the body's id, else its Nats-Msg-Id, else `null`;
/// each with an id has a failed status; each has a dead letter; a valid job
/// without Nats-Msg-Id runs; nothing stays in the stream.
#[tokio::test]
async fn python_bad_messages_are_each_answered_on_their_reply_subject() {
    let d = Deployment::start().await.unwrap();
    let consumer = d
        .start_consumer(&["--max-input-bytes=100000"])
        .await
        .unwrap();
    let python = repo_root().join(".sluice/pyenv/bin/python");
    let args = [
        "examples/python/bad_messages.py".to_string(),
        "200000".to_string(),
    ];
    let got = run_example(&d, python.to_str().unwrap(), &args).await;
    let answers = got["answers"].as_array().unwrap();
    let by_kind = |kind: &str| {
        answers
            .iter()
            .find(|a| a["kind"] == kind)
            .unwrap_or_else(|| panic!("no {kind} in {got}"))
    };
    // (kind, code, whether the answer carries the sent Nats-Msg-Id as its id)
    let bad = [
        ("not_json", "malformed_message", true),
        ("not_utf8", "malformed_message", true),
        ("json_array", "schema_violation", true),
        ("id_refused_by_schema", "schema_violation", true),
        ("inline_over_size_cap", "input_too_large", true),
        ("no_id_anywhere", "malformed_message", false),
        ("inline_item_not_text", "input_invalid", true),
        ("presign_out_of_range", "invalid_parameters", true),
    ];
    let mut ids = Vec::new();
    for (kind, code, has_id) in bad {
        let a = by_kind(kind);
        eprintln!("{kind}: {} {}", a["code"], a["message"]);
        assert_eq!(a["status"], "error", "{kind}: {a}");
        assert_eq!(a["code"], code, "{kind}: {a}");
        assert_eq!(a["header_outcome"], code, "{kind}: {a}");
        assert!(
            !a["message"].as_str().unwrap().is_empty(),
            "{kind}: no message"
        );
        if kind == "not_utf8" {
            let message = a["message"].as_str().unwrap();
            assert!(message.contains("not valid UTF-8"), "{message}");
        }
        if has_id {
            let id = a["sent_id"].as_str().unwrap();
            assert_eq!(a["job_id"], id, "{kind}: {a}");
            assert_eq!(a["header_job_id"], id, "{kind}: {a}");
            let status = d.producer.status(id).await.unwrap();
            let status = status.unwrap_or_else(|| panic!("{kind}: no status for {id}"));
            assert_eq!(status.state, JobState::Failed, "{kind}: {status:?}");
            assert_eq!(
                status.error.map(|e| e.code.as_str().to_string()),
                Some(code.to_string()),
                "{kind}"
            );
            ids.push(id.to_string());
        } else {
            assert_eq!(a["job_id"], Value::Null, "{kind}: {a}");
            assert_eq!(a["header_job_id"], Value::Null, "{kind}: {a}");
        }
    }
    let fine = by_kind("valid_without_msg_id");
    assert_eq!(fine["status"], "ok", "{fine}");
    let fine_id = fine["job_id"].as_str().unwrap();
    assert!(fine_id.ends_with("-no-msg-id"), "{fine}");
    let status = d.producer.status(fine_id).await.unwrap().unwrap();
    assert_eq!(status.state, JobState::Done);

    // One dead letter per bad message, with the original body and headers.
    let letters = d
        .producer
        .dead_letters(&sluice_producer::dlq::Filter::default())
        .await
        .unwrap();
    assert_eq!(letters.len(), bad.len(), "{letters:?}");
    for id in &ids {
        assert!(
            letters.iter().any(|(_, l)| l.job_id.as_deref() == Some(id)),
            "no dead letter for {id}"
        );
    }
    assert_eq!(
        letters.iter().filter(|(_, l)| l.job_id.is_none()).count(),
        1,
        "the message without any id"
    );
    assert_eq!(d.jobs_in_stream_settled(0).await, 0, "nothing left behind");
    consumer.shutdown(Duration::from_secs(10)).await.unwrap();
}
