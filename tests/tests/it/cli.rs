//! The `sluice` CLI as users run it: the real binary against real servers.

use std::time::Duration;

use serde_json::Value;
use sluice_schemas::npy;
use sluice_tests::deploy::{Deployment, run_cli};
use sluice_tests::fixtures::jsonl;
use sluice_tests::{Servers, free_port, read_until, unique_name};

const T: Duration = Duration::from_secs(120);

fn texts(n: usize, what: &str) -> Vec<String> {
    (0..n)
        .map(|i| format!("{what} number {i} goes through the queue"))
        .collect()
}

#[tokio::test]
async fn init_creates_then_changes_nothing_then_applies_a_settings_file() {
    let servers = Servers::start().await.unwrap();
    let env = vec![
        ("NATS_URL", servers.nats.url()),
        ("SLUICE_NAMESPACE", unique_name("cli")),
        ("SLUICE_BUCKET", unique_name("cli-init")),
        ("AWS_ENDPOINT_URL", servers.s3.endpoint()),
        ("AWS_ACCESS_KEY_ID", servers.s3.access_key.clone()),
        ("AWS_SECRET_ACCESS_KEY", servers.s3.secret_key.clone()),
    ];
    let actions = |run: &sluice_tests::deploy::CliRun| -> Vec<String> {
        assert_eq!(run.code, Some(0), "{run:?}");
        run.json_lines()
            .iter()
            .map(|c| format!("{} {}", c["action"].as_str().unwrap(), c["resource"]))
            .collect()
    };

    let first = run_cli(&env, &["init", "--json"], None, T).await;
    let first = actions(&first);
    // Job stream, one durable consumer per task and priority level (3 per
    // task: embed, generate, rerank, classify, transcribe), models bucket,
    // dead-letter stream, status bucket, gateway bucket, consumers bucket,
    // S3 bucket.
    let resources = 1 + 3 * sluice_schemas::Task::ALL.len() + 6;
    assert_eq!(resources, 22);
    assert_eq!(first.len(), resources, "{first:?}");
    assert!(first.iter().all(|a| a.starts_with("created ")), "{first:?}");

    let again = run_cli(&env, &["init", "--json"], None, T).await;
    let again = actions(&again);
    assert_eq!(again.len(), resources, "{again:?}");
    assert!(
        again.iter().all(|a| a.starts_with("unchanged ")),
        "the second run must change nothing: {again:?}"
    );

    // The shipped file is the defaults: applying it changes nothing either.
    let shipped = sluice_tests::repo_root().join("deploy/sluice.toml");
    let run = run_cli(
        &env,
        &["init", "--settings", shipped.to_str().unwrap()],
        None,
        T,
    )
    .await;
    assert_eq!(run.code, Some(0), "{run:?}");
    assert_eq!(
        run.stdout.matches("unchanged").count(),
        resources,
        "{run:?}"
    );

    // A changed setting updates only what it touches, and says how.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("sluice.toml");
    std::fs::write(&file, "ack_wait_secs = 30\nstatus_max_age_secs = 3600\n").unwrap();
    let run = run_cli(
        &env,
        &["init", "--settings", file.to_str().unwrap()],
        None,
        T,
    )
    .await;
    assert_eq!(run.code, Some(0), "{run:?}");
    let updated: Vec<&str> = run
        .stdout
        .lines()
        .filter(|l| l.starts_with("updated"))
        .collect();
    let consumers = 3 * sluice_schemas::Task::ALL.len();
    assert_eq!(updated.len(), consumers + 1, "{run:?}");
    assert_eq!(
        updated
            .iter()
            .filter(|l| l.contains("consumer") && l.contains("ack_wait 60s -> 30s"))
            .count(),
        consumers,
        "every task's consumers at every priority level: {run:?}"
    );
    assert!(
        updated
            .iter()
            .any(|l| l.contains("key-value bucket") && l.contains("max_age")),
        "{run:?}"
    );

    // A settings file with a typo is refused, naming the key; nothing changes.
    std::fs::write(&file, "ack_wiat_secs = 30\n").unwrap();
    let run = run_cli(
        &env,
        &["init", "--settings", file.to_str().unwrap()],
        None,
        T,
    )
    .await;
    assert_eq!(run.code, Some(2), "{run:?}");
    assert!(
        run.stderr.contains("invalid settings file") && run.stderr.contains("ack_wiat_secs"),
        "{run:?}"
    );
}

#[tokio::test]
async fn submit_wait_download_status_dedup_and_watch() {
    let d = Deployment::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let inputs = dir.path().join("inputs");
    std::fs::create_dir(&inputs).unwrap();
    // 20 texts: an S3 output; 2 texts: inline.
    std::fs::write(inputs.join("a-many.jsonl"), jsonl(&texts(20, "many"))).unwrap();
    std::fs::write(inputs.join("b-few.jsonl"), jsonl(&texts(2, "few"))).unwrap();
    std::fs::write(inputs.join("ignored.txt"), "not an input").unwrap();
    let single = dir.path().join("single.jsonl");
    std::fs::write(&single, jsonl(&texts(3, "single"))).unwrap();

    // Without --wait and with no consumer yet: submitted and queued.
    let submit_single = [
        "submit",
        "--json",
        "--id",
        "queued-1",
        single.to_str().unwrap(),
    ];
    let run = d.cli(&submit_single, None, T).await;
    assert_eq!(run.code, Some(0), "{run:?}");
    let events = run.json_lines();
    assert_eq!(events.len(), 1, "{run:?}");
    assert_eq!(events[0]["event"], "submitted");
    assert_eq!(events[0]["job_id"], "queued-1");
    assert_eq!(events[0]["duplicate"], false);
    let trace_id = events[0]["trace_id"].as_str().unwrap();
    assert!(
        trace_id.len() == 32 && trace_id.bytes().all(|b| b.is_ascii_hexdigit()),
        "each job starts a trace whose id is printed: {run:?}"
    );
    let status = d.cli(&["status", "queued-1", "--json"], None, T).await;
    assert_eq!(status.code, Some(0), "{status:?}");
    let record = &status.json_lines()[0];
    assert_eq!(record["state"], "queued", "{status:?}");
    assert_eq!(record["stream_sequence"], events[0]["sequence"]);

    // The same id again within the duplicate window: not queued twice.
    let run = d.cli(&submit_single, None, T).await;
    assert_eq!(run.code, Some(0), "{run:?}");
    assert_eq!(run.json_lines()[0]["duplicate"], true, "{run:?}");
    assert_eq!(d.jobs_in_stream().await, 1);

    let watch = d.cli(&["watch", "--once", "--json"], None, T).await;
    assert_eq!(watch.code, Some(0), "{watch:?}");
    let counts = &watch.json_lines()[0];
    assert_eq!(counts["queued"], 1, "{watch:?}");
    assert_eq!(counts["done"], 0, "{watch:?}");
    assert_eq!(counts["stream"]["messages"], 1, "{watch:?}");
    assert_eq!(counts["stream"]["pending"], 1, "{watch:?}");

    // Now a consumer: a directory and stdin, waited for, outputs downloaded.
    let _consumer = d.start_consumer(&[]).await.unwrap();
    let out = dir.path().join("out");
    let stdin = jsonl(&texts(4, "stdin"));
    let run = d
        .cli(
            &[
                "submit",
                "--json",
                "--wait",
                "--download",
                out.to_str().unwrap(),
                inputs.to_str().unwrap(),
                "-",
            ],
            Some(&stdin),
            T,
        )
        .await;
    assert_eq!(run.code, Some(0), "{run:?}");
    let lines = run.json_lines();
    let submitted: Vec<&Value> = lines.iter().filter(|l| l["event"] == "submitted").collect();
    let results: Vec<&Value> = lines.iter().filter(|l| l.get("status").is_some()).collect();
    assert_eq!(submitted.len(), 3, "two .jsonl files and stdin: {run:?}");
    assert_eq!(results.len(), 3, "{run:?}");
    for r in &results {
        assert_eq!(r["status"], "ok", "{r}");
    }
    let many_id = submitted
        .iter()
        .find(|s| s["input"].as_str().unwrap().ends_with("a-many.jsonl"))
        .unwrap()["job_id"]
        .as_str()
        .unwrap()
        .to_string();
    let npy_path = out.join(format!("{many_id}.npy"));
    let (rows, dim, values) = npy::decode_f32(&std::fs::read(&npy_path).unwrap()).unwrap();
    assert_eq!((rows, dim), (20, 384));
    assert_eq!(values.len(), 20 * 384);
    let downloaded = std::fs::read_dir(&out).unwrap().count();
    assert_eq!(downloaded, 1, "only the S3 output is downloaded");

    // status of a finished job, for people and for scripts.
    let status = d.cli(&["status", &many_id], None, T).await;
    assert_eq!(status.code, Some(0), "{status:?}");
    assert!(status.stdout.contains(": done"), "{status:?}");
    assert!(
        status.stdout.contains(&format!("outputs/{many_id}.")) && status.stdout.contains("-1.npy"),
        "{status:?}"
    );

    // Wait for the queued job, then submit it again with --wait after its
    // duplicate window... no: within it. The server drops the duplicate, no
    // new result comes, and --wait answers from the status record.
    let deadline = tokio::time::Instant::now() + T;
    loop {
        let s = d.producer.status("queued-1").await.unwrap().unwrap();
        if s.state.is_final() {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "queued-1 never finished"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let run = d
        .cli(
            &[
                "submit",
                "--json",
                "--wait",
                "--timeout-secs",
                "60",
                "--id",
                "queued-1",
                single.to_str().unwrap(),
            ],
            None,
            T,
        )
        .await;
    assert_eq!(run.code, Some(0), "{run:?}");
    let lines = run.json_lines();
    assert_eq!(lines[0]["duplicate"], true, "{run:?}");
    assert_eq!(lines[1]["status_record"]["state"], "done", "{run:?}");

    // A job the consumer refuses: counted as failed and dead-lettered.
    let bad = d
        .producer
        .upload_input("broken.jsonl", b"\"fine\"\nnot json\n".to_vec())
        .await
        .unwrap();
    let sluice_schemas::Input::Url { url, .. } = bad else {
        unreachable!()
    };
    let run = d
        .cli(
            &["submit", "--wait", "--id", "broken-1", "--url", &url],
            None,
            T,
        )
        .await;
    assert_eq!(run.code, Some(1), "a failed job exits 1: {run:?}");
    assert!(
        run.stdout.contains("broken-1: error input_invalid"),
        "{run:?}"
    );
    assert!(run.stdout.contains("line 2: not JSON"), "{run:?}");

    // The Term ack follows the error result: read until it has landed (bounded).
    let watch = read_until(
        Duration::from_secs(5),
        || d.cli(&["watch", "--once", "--json"], None, T),
        |watch| {
            watch
                .json_lines()
                .first()
                .is_some_and(|c| c["stream"]["messages"] == 0 && c["stream"]["in_flight"] == 0)
        },
    )
    .await;
    assert_eq!(watch.code, Some(0), "{watch:?}");
    let c = &watch.json_lines()[0];
    assert_eq!(c["done"], 4, "{watch:?}");
    assert_eq!(c["failed"], 1, "{watch:?}");
    assert_eq!(c["queued"], 0, "{watch:?}");
    assert_eq!(c["running"], 0, "{watch:?}");
    assert_eq!(c["dead_lettered"], 1, "{watch:?}");
    assert_eq!(c["stream"]["messages"], 0, "{watch:?}");
    assert_eq!(c["stream"]["in_flight"], 0, "{watch:?}");

    // Cancelling a finished job is refused with exit 3; an unknown job has no status.
    let run = d.cli(&["cancel", &many_id], None, T).await;
    assert_eq!(run.code, Some(3), "{run:?}");
    let run = d.cli(&["status", "no-such-job"], None, T).await;
    assert_eq!(run.code, Some(3), "{run:?}");
    assert!(
        run.stderr.contains("no status for job no-such-job"),
        "{run:?}"
    );
}

#[tokio::test]
async fn bad_usage_gets_a_clear_message_a_nonzero_exit_and_publishes_nothing() {
    let d = Deployment::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let broken = dir.path().join("broken.jsonl");
    std::fs::write(&broken, "\"fine\"\n{\"txt\": \"typo\"}\n").unwrap();
    let empty = dir.path().join("empty.jsonl");
    std::fs::write(&empty, "\n").unwrap();
    let good = dir.path().join("good.jsonl");
    std::fs::write(&good, "\"fine\"\n").unwrap();
    let missing = dir.path().join("missing.jsonl");

    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["submit", missing.to_str().unwrap()], "cannot read"),
        (
            vec!["submit", broken.to_str().unwrap()],
            "broken.jsonl: line 2: an embed item",
        ),
        (vec!["submit", empty.to_str().unwrap()], "no items"),
        (
            vec!["submit", "--url", "ftp://example.com/x.jsonl"],
            "only http:// and https://",
        ),
        (vec!["submit", "--url", "not a url"], "is not a URL"),
        (vec!["submit"], "nothing to submit"),
        (
            vec![
                "submit",
                "--traceparent",
                "00-abc-01",
                good.to_str().unwrap(),
            ],
            "is not a W3C traceparent",
        ),
        (
            vec![
                "submit",
                "--id",
                "x",
                good.to_str().unwrap(),
                good.to_str().unwrap(),
            ],
            "--id applies to a single job",
        ),
        (
            vec!["dlq", "ls", "--code", "nope"],
            "unknown error code \"nope\"",
        ),
        (vec!["submit", "--no-such-flag"], "unexpected argument"),
        (
            vec![
                "submit",
                "--task",
                "generate",
                "--prompt-name",
                "query",
                good.to_str().unwrap(),
            ],
            "--prompt-name applies to --task embed",
        ),
    ];
    for (args, expected) in cases {
        let run = d.cli(&args, None, T).await;
        assert_eq!(run.code, Some(2), "{args:?}: {run:?}");
        assert!(
            run.stderr.contains(expected),
            "{args:?}: expected {expected:?} in stderr: {run:?}"
        );
    }
    assert_eq!(d.jobs_in_stream().await, 0, "nothing was published");

    // NATS unreachable: a closed port on loopback.
    let mut env = d.publisher_env();
    let url = format!("nats://127.0.0.1:{}", free_port());
    env.retain(|(k, _)| *k != "NATS_URL");
    env.push(("NATS_URL", url.clone()));
    let run = run_cli(&env, &["submit", good.to_str().unwrap()], None, T).await;
    assert_eq!(run.code, Some(2), "{run:?}");
    assert!(
        run.stderr.contains(&format!("NATS at {url}")),
        "the message names the server: {run:?}"
    );
    assert_eq!(d.jobs_in_stream().await, 0);

    // --help explains the flags and the exit codes.
    let help = d.cli(&["--help"], None, T).await;
    assert_eq!(help.code, Some(0));
    assert!(help.stdout.contains("Exit codes"), "{help:?}");
    assert!(help.stdout.contains("[env: NATS_URL]"), "{help:?}");
}

/// An older deployment (one unfiltered durable consumer on `sluice.jobs.>`)
/// is brought up to one filtered consumer per task by `sluice init`, in
/// place: the waiting embed job stays and is still the embed consumer's.
#[tokio::test]
async fn init_upgrades_an_unfiltered_consumer_in_place() {
    use async_nats::jetstream::{consumer, stream};
    let servers = Servers::start().await.unwrap();
    let ns = unique_name("upgrade");
    let t = sluice_schemas::Topology::namespaced(&ns);
    let js = async_nats::jetstream::new(servers.nats.connect().await.unwrap());
    let old = js
        .create_stream(stream::Config {
            name: t.job_stream.clone(),
            subjects: vec![format!("{}.>", t.job_subject_prefix)],
            retention: stream::RetentionPolicy::WorkQueue,
            ..Default::default()
        })
        .await
        .unwrap();
    old.create_consumer(consumer::pull::Config {
        durable_name: Some(t.consumer.clone()),
        ack_policy: consumer::AckPolicy::Explicit,
        ..Default::default()
    })
    .await
    .unwrap();
    js.publish(t.job_subject("embed"), "waiting".into())
        .await
        .unwrap()
        .await
        .unwrap();

    let env = vec![
        ("NATS_URL", servers.nats.url()),
        ("SLUICE_NAMESPACE", ns.clone()),
        ("SLUICE_BUCKET", unique_name("upgrade")),
        ("AWS_ENDPOINT_URL", servers.s3.endpoint()),
        ("AWS_ACCESS_KEY_ID", servers.s3.access_key.clone()),
        ("AWS_SECRET_ACCESS_KEY", servers.s3.secret_key.clone()),
    ];
    let run = run_cli(&env, &["init"], None, T).await;
    assert_eq!(run.code, Some(0), "{run:?}");
    assert!(
        run.stdout.contains("updated") && run.stdout.contains("filter_subject"),
        "{run:?}"
    );
    let mut jobs = js.get_stream(&t.job_stream).await.unwrap();
    let info = jobs.info().await.unwrap().clone();
    assert_eq!(info.config.subjects, t.job_subjects());
    assert_eq!(info.state.messages, 1, "the waiting job stayed");
    for task in sluice_schemas::Task::ALL {
        let c = jobs.consumer_info(t.consumer_for(task)).await.unwrap();
        assert_eq!(c.config.filter_subject, t.job_subject(task.as_str()));
        let pending = if task == sluice_schemas::Task::Embed {
            1
        } else {
            0
        };
        assert_eq!(c.num_pending, pending, "{task}");
    }
}

/// `--each-line` makes one inline job per line and publishes them pipelined:
/// every job is stored once, reported once (after its ack) and answered; an
/// input too big to travel inline, and a stream that is not there, are clear
/// errors with nothing reported submitted.
#[tokio::test]
async fn many_small_jobs_are_submitted_pipelined_and_each_answered_once() {
    let d = Deployment::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let many = dir.path().join("many.jsonl");
    std::fs::write(&many, jsonl(&texts(1000, "line"))).unwrap();

    let run = d
        .cli(
            &[
                "submit",
                "--json",
                "--each-line",
                "--window",
                "64",
                many.to_str().unwrap(),
            ],
            None,
            T,
        )
        .await;
    assert_eq!(run.code, Some(0), "{run:?}");
    let events = run.json_lines();
    assert_eq!(events.len(), 1000, "{}", run.stderr);
    let mut sequences: Vec<u64> = events
        .iter()
        .map(|e| e["sequence"].as_u64().unwrap())
        .collect();
    sequences.sort();
    assert_eq!(
        sequences,
        (1..=1000).collect::<Vec<u64>>(),
        "each job stored once"
    );
    let ids: std::collections::HashSet<&str> = events
        .iter()
        .map(|e| e["job_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids.len(), 1000);
    assert_eq!(events[0]["input"], format!("{}:1", many.display()));
    assert_eq!(
        events[999]["input"],
        format!("{}:1000", many.display()),
        "reported in order"
    );
    assert_eq!(d.jobs_in_stream().await, 1000);
    let watch = d.cli(&["watch", "--once", "--json"], None, T).await;
    assert_eq!(watch.json_lines()[0]["queued"], 1000, "{watch:?}");

    // One inline job of three items, answered; then all 1,000 are answered.
    let _consumer = d.start_consumer(&[]).await.unwrap();
    let three = dir.path().join("three.jsonl");
    std::fs::write(&three, jsonl(&texts(3, "inline"))).unwrap();
    let run = d
        .cli(
            &[
                "submit",
                "--json",
                "--wait",
                "--inline",
                three.to_str().unwrap(),
            ],
            None,
            T,
        )
        .await;
    assert_eq!(run.code, Some(0), "{run:?}");
    let lines = run.json_lines();
    assert_eq!(lines[0]["event"], "submitted", "{run:?}");
    assert_eq!(lines[1]["status"], "ok", "{run:?}");
    assert_eq!(lines[1]["usage"]["items"], 3, "{run:?}");
    let watch = read_until(
        Duration::from_secs(180),
        || d.cli(&["watch", "--once", "--json"], None, T),
        |w| w.json_lines().first().is_some_and(|c| c["done"] == 1001),
    )
    .await;
    let c = &watch.json_lines()[0];
    assert_eq!(c["done"], 1001, "{watch:?}");
    assert_eq!(c["failed"], 0, "{watch:?}");
    assert_eq!(c["dead_lettered"], 0, "{watch:?}");

    // Too big to carry inline: refused before anything is published.
    let big = dir.path().join("big.jsonl");
    std::fs::write(&big, jsonl(&["x".repeat(1_200_000)])).unwrap();
    let before = d.jobs_in_stream().await;
    let run = d
        .cli(&["submit", "--inline", big.to_str().unwrap()], None, T)
        .await;
    assert_eq!(run.code, Some(2), "{run:?}");
    assert!(
        run.stderr.contains("over the NATS server's max_payload"),
        "{run:?}"
    );
    assert!(run.stderr.contains("without --inline"), "{run:?}");
    let run = d
        .cli(
            &[
                "submit",
                "--each-line",
                "--url",
                "https://example.com/x.jsonl",
            ],
            None,
            T,
        )
        .await;
    assert_eq!(run.code, Some(2), "{run:?}");
    assert!(run.stderr.contains("not to --url inputs"), "{run:?}");
    assert_eq!(d.jobs_in_stream().await, before, "nothing was published");

    // The job stream gone (deleted under a running deployment): every publish
    // fails; the first failure is the error, and no job is reported submitted.
    d.producer
        .js
        .delete_stream(&d.producer.topology.job_stream)
        .await
        .unwrap();
    let run = d
        .cli(&["submit", "--each-line", three.to_str().unwrap()], None, T)
        .await;
    assert_eq!(run.code, Some(2), "{run:?}");
    assert!(run.stdout.is_empty(), "nothing reported submitted: {run:?}");
    assert!(run.stderr.contains("was not submitted"), "{run:?}");
    assert!(run.stderr.contains("no stream found"), "{run:?}");
}

/// Where docs/cli.md's generated reference starts: above it the manual,
/// below it each command's own `--help`.
const CLI_DOCS_MARKER: &str = "<!-- The reference below is the CLI's own --help, written by scripts/cli-docs; do not edit it by hand. -->\n";

/// The commands a `--help` text lists (its `Commands:` block, without
/// `help`).
fn subcommands(help: &str) -> Vec<String> {
    help.split("\nCommands:\n")
        .nth(1)
        .map(|block| {
            block
                .lines()
                .take_while(|l| !l.trim().is_empty())
                .filter_map(|l| l.split_whitespace().next())
                .filter(|name| *name != "help")
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

/// docs/cli.md's reference is the CLI's own `--help`, command by command
/// (run with no environment, so no local setting shows): the test fails
/// when the two disagree. `scripts/cli-docs` rewrites the reference (it
/// runs this test with `SLUICE_WRITE_CLI_DOCS=1`).
#[tokio::test]
async fn docs_cli_md_is_the_clis_own_help() {
    let mut reference = String::from("## Reference\n\n");
    let mut queue = std::collections::VecDeque::from([Vec::<String>::new()]);
    while let Some(path) = queue.pop_front() {
        let mut args: Vec<&str> = path.iter().map(String::as_str).collect();
        args.push("--help");
        let run = run_cli(&[], &args, None, T).await;
        assert_eq!(run.code, Some(0), "sluice {args:?}: {run:?}");
        let command = std::iter::once("sluice")
            .chain(path.iter().map(String::as_str))
            .collect::<Vec<_>>()
            .join(" ");
        reference.push_str(&format!(
            "### `{command}`\n\n```text\n{}\n```\n\n",
            run.stdout.trim_end()
        ));
        for name in subcommands(&run.stdout) {
            let mut next = path.clone();
            next.push(name);
            queue.push_back(next);
        }
    }
    let file = sluice_tests::repo_root().join("docs/cli.md");
    let doc = std::fs::read_to_string(&file).unwrap();
    let manual = doc
        .split_once(CLI_DOCS_MARKER)
        .map_or(doc.as_str(), |(manual, _)| manual);
    if std::env::var("SLUICE_WRITE_CLI_DOCS").as_deref() == Ok("1") {
        std::fs::write(&file, format!("{manual}{CLI_DOCS_MARKER}\n{reference}")).unwrap();
        return;
    }
    let generated = doc.split_once(CLI_DOCS_MARKER).map(|(_, g)| g);
    assert!(
        generated == Some(format!("\n{reference}").as_str()),
        "docs/cli.md's reference is not the CLI's --help: run scripts/cli-docs and commit docs/cli.md"
    );
}
