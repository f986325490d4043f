//! Job TTL: a job's deadline travels as its `Nats-TTL`, so the server drops
//! a job that expires while it waits and its status reads `expired`; an
//! older stream without per-message TTL still works and `sluice init`
//! upgrades it in place; a job pulled after its deadline is `expired` too,
//! never run.

use std::time::{Duration, Instant};

use sluice_producer::provision::{self, Settings};
use sluice_schemas::{ErrorCode, JobState, Outcome, Task};
use sluice_tests::deploy::Deployment;
use sluice_tests::fixtures::jsonl;
use sluice_tests::read_until;

const T: Duration = Duration::from_secs(120);

fn texts(n: usize) -> Vec<String> {
    (0..n)
        .map(|i| format!("text {i} with a deadline"))
        .collect()
}

/// Issue #19's check: 1,000 jobs with a 2 s deadline, no consumer; 3 s
/// after publishing the stream holds none of them and every status reads
/// `expired`, in `sluice status`, `sluice watch` and the library.
#[tokio::test]
async fn jobs_that_expire_in_the_stream_are_dropped_by_the_server_and_read_expired() {
    let d = Deployment::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("jobs.jsonl");
    std::fs::write(&file, jsonl(&texts(1000))).unwrap();

    let published = Instant::now();
    let run = d
        .cli(
            &[
                "submit",
                "--json",
                "--each-line",
                "--deadline-secs",
                "2",
                file.to_str().unwrap(),
            ],
            None,
            T,
        )
        .await;
    assert_eq!(run.code, Some(0), "{run:?}");
    let ids: Vec<String> = run
        .json_lines()
        .iter()
        .map(|e| e["job_id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(ids.len(), 1000);
    let submit_secs = published.elapsed().as_secs_f64();
    let waiting = d.jobs_in_stream().await;
    assert!(
        waiting > 0,
        "the jobs wait in the stream before their deadline"
    );
    let status = d.cli(&["status", &ids[0], "--json"], None, T).await;
    assert_eq!(status.json_lines()[0]["state"], "queued", "{status:?}");

    // When did the server drop them? Polled every 100 ms, for the note.
    let emptied = loop {
        let left = d.jobs_in_stream().await;
        if left == 0 {
            break published.elapsed();
        }
        assert!(
            published.elapsed() < Duration::from_secs(3),
            "{left} of 1,000 jobs still in the stream 3 s after publishing"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    eprintln!(
        "1,000 jobs submitted in {submit_secs:.2} s; the stream was empty {:.2} s after the first publish",
        emptied.as_secs_f64()
    );
    tokio::time::sleep_until((published + Duration::from_secs(3)).into()).await;
    assert_eq!(d.jobs_in_stream().await, 0);

    let watch = d.cli(&["watch", "--once", "--json"], None, T).await;
    let c = &watch.json_lines()[0];
    assert_eq!(c["expired"], 1000, "{watch:?}");
    assert_eq!(c["queued"], 0, "{watch:?}");
    let statuses = d.producer.statuses().await.unwrap();
    for id in &ids {
        let r = statuses.view(id).await.unwrap().unwrap();
        assert_eq!(r.state, JobState::Expired, "{id}");
        assert_eq!(r.error.unwrap().code, ErrorCode::DeadlineExceeded);
    }
    let status = d.cli(&["status", &ids[999]], None, T).await;
    assert_eq!(status.code, Some(0), "{status:?}");
    assert!(status.stdout.contains("expired"), "{status:?}");
    assert!(
        status
            .stdout
            .contains("passed while it waited in the stream"),
        "{status:?}"
    );

    // Expired is final: not cancelled, and a consumer started now has nothing to run.
    let cancel = d.cli(&["cancel", &ids[1]], None, T).await;
    assert_eq!(cancel.code, Some(3), "{cancel:?}");

    // A waiting publisher learns it from the status record.
    let one = dir.path().join("one.jsonl");
    std::fs::write(&one, jsonl(&texts(1))).unwrap();
    let run = d
        .cli(
            &[
                "submit",
                "--wait",
                "--deadline-secs",
                "1",
                "--timeout-secs",
                "30",
                one.to_str().unwrap(),
            ],
            None,
            T,
        )
        .await;
    assert_eq!(
        run.code,
        Some(1),
        "an expired job is not a success: {run:?}"
    );
    assert!(run.stdout.contains("expired"), "{run:?}");
    assert!(run.stdout.contains("deadline_exceeded"), "{run:?}");
}

/// A stream made before sluice asked for per-message TTL: jobs with a
/// deadline are still published (without the TTL, with a warning), `sluice
/// init` turns TTL on in place keeping the waiting job, and a consumer that
/// pulls the job after its deadline answers `deadline_exceeded` and records
/// `expired` without running it; replaying its dead letter is refused, as
/// it would only expire again.
#[tokio::test]
async fn an_older_stream_is_upgraded_in_place_and_a_late_job_is_expired_not_run() {
    let d = Deployment::start().await.unwrap();
    let js = &d.producer.js;
    let settings = Settings::default();
    js.delete_stream(&d.topology.job_stream).await.unwrap();
    let mut old = provision::job_stream_config(&d.topology, &settings, &[]);
    old.allow_message_ttl = false;
    let stream = js.create_stream(old).await.unwrap();
    for task in Task::ALL {
        for priority in sluice_schemas::Priority::ALL {
            stream
                .create_consumer(provision::consumer_config(
                    &d.topology,
                    &settings,
                    task,
                    None,
                    priority,
                ))
                .await
                .unwrap();
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let one = dir.path().join("one.jsonl");
    std::fs::write(&one, jsonl(&texts(1))).unwrap();
    let run = d
        .cli(
            &[
                "submit",
                "--json",
                "--inline",
                "--id",
                "late-1",
                "--deadline-secs",
                "1",
                one.to_str().unwrap(),
            ],
            None,
            T,
        )
        .await;
    assert_eq!(run.code, Some(0), "{run:?}");
    assert!(
        run.stderr.contains("does not allow per-message TTL") && run.stderr.contains("sluice init"),
        "the publisher is told why the job stays and what to run: {run:?}"
    );
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(d.jobs_in_stream().await, 1, "no TTL: the job stays");
    let stored = d
        .producer
        .status_store()
        .await
        .unwrap()
        .get("late-1")
        .await
        .unwrap()
        .unwrap();
    let stored: sluice_schemas::StatusRecord = serde_json::from_slice(&stored).unwrap();
    assert_eq!(stored.state, JobState::Queued, "as stored");
    let r = d.producer.status("late-1").await.unwrap().unwrap();
    assert_eq!(r.state, JobState::Expired, "as read");

    let run = d.cli(&["init"], None, T).await;
    assert_eq!(run.code, Some(0), "{run:?}");
    assert!(
        run.stdout.contains("allow_msg_ttl false -> true"),
        "{run:?}"
    );
    let info = js
        .get_stream(&d.topology.job_stream)
        .await
        .unwrap()
        .info()
        .await
        .unwrap()
        .clone();
    assert!(info.config.allow_message_ttl);
    assert_eq!(info.state.messages, 1, "upgraded in place: the job stayed");

    // `sluice submit` without --wait names no inbox of its own: the job is
    // answered on its default subject.
    let mut results = d.producer.subscribe_results_and_defaults().await.unwrap();
    let consumer = d.spawn_consumer(&[]).await.unwrap();
    let result = match tokio::time::timeout(T, results.next_result()).await {
        Ok(r) => r.unwrap(),
        Err(_) => panic!("LOG {}", consumer.log()),
    };
    let Outcome::Error { error } = &result.outcome else {
        panic!("a late job ran: {result:?}")
    };
    assert_eq!(error.code, ErrorCode::DeadlineExceeded, "{}", error.message);
    let r = read_until(
        Duration::from_secs(10),
        || async { d.producer.status("late-1").await.unwrap().unwrap() },
        |r| r.state.is_final(),
    )
    .await;
    assert_eq!(r.state, JobState::Expired, "written by the consumer: {r:?}");
    assert_eq!(r.attempts, 1);
    let metrics = read_until(
        Duration::from_secs(10),
        || {
            let url = format!("{}/metrics", consumer.http());
            async move { sluice_tests::get_text(&url).await }
        },
        |text| text.contains("sluice_jobs_failed_total{code=\"deadline_exceeded\"} 1"),
    )
    .await;
    assert_eq!(
        sluice_tests::prometheus_value(
            &metrics,
            "sluice_jobs_failed_total{code=\"deadline_exceeded\"}"
        ),
        Some(1.0),
        "{metrics}"
    );
    assert_eq!(
        sluice_tests::prometheus_value(&metrics, "sluice_jobs_ok_total"),
        Some(0.0)
    );

    let dlq = read_until(
        Duration::from_secs(10),
        || d.cli(&["dlq", "ls", "--json"], None, T),
        |run| run.json_lines().len() == 1,
    )
    .await;
    assert_eq!(dlq.json_lines().len(), 1, "{dlq:?}");
    let run = d.cli(&["dlq", "replay", "--all"], None, T).await;
    assert_ne!(run.code, Some(0), "{run:?}");
    assert!(run.stderr.contains("would only expire again"), "{run:?}");
    assert_eq!(d.jobs_in_stream_settled(0).await, 0, "nothing was replayed");
}

/// A consumer that starts a job with a deadline and dies before finishing
/// it (found by the fault soak, issue #39): the stream drops the message at
/// the deadline, before an ack wait could redeliver it, so no consumer ever
/// sees the job again and its record would read `running` for good. A
/// reader that finds a `running` record past its deadline whose message is
/// gone records it `expired` (`StatusStore::expire_orphan`); one still
/// before its deadline, or whose message is still there, stays `running`.
#[tokio::test]
async fn a_job_its_consumer_abandoned_expires_once_the_stream_drops_it() {
    use sluice_schemas::{Input, StatusRecord, VERSION};
    let d = Deployment::start().await.unwrap();
    let statuses = d.producer.statuses().await.unwrap();
    let mut running = Vec::new();
    for (id, secs) in [("abandoned", 2), ("still-in-time", 60)] {
        let mut job = d.producer.job(
            Task::Embed,
            id,
            vec![Input::Inline {
                items: vec![serde_json::json!("a text")],
            }],
        );
        let deadline = time::OffsetDateTime::now_utc() + time::Duration::seconds(secs);
        job.deadline = Some(deadline);
        let ack = d.producer.submit(&job).await.unwrap();
        // What a consumer's start writes (no consumer runs: it "died").
        let record = StatusRecord {
            version: VERSION,
            job_id: id.into(),
            state: JobState::Running,
            updated_at: time::OffsetDateTime::now_utc(),
            attempts: 1,
            stream_sequence: Some(ack.sequence),
            output: None,
            error: None,
            replays: 0,
            usage: None,
            deadline: Some(deadline),
            answered: vec![],
        };
        statuses.start(&record).await.unwrap();
        running.push(record);
    }
    assert_eq!(
        d.producer.status("abandoned").await.unwrap().unwrap().state,
        JobState::Running,
        "before its deadline a running job reads running"
    );
    // The stream drops the first job at its deadline.
    let left = read_until(Duration::from_secs(10), || d.jobs_in_stream(), |&n| n == 1).await;
    assert_eq!(left, 1, "the 2 s job is dropped, the 60 s one kept");
    let r = d.producer.status("abandoned").await.unwrap().unwrap();
    assert_eq!(r.state, JobState::Expired);
    let error = r.error.unwrap();
    assert_eq!(error.code, ErrorCode::DeadlineExceeded);
    assert!(
        error.message.contains("stopped before finishing"),
        "{error:?}"
    );
    // Recorded, not only read so: every reader sees it, and it is final.
    let stored = statuses.get("abandoned").await.unwrap().unwrap();
    assert_eq!(stored.state, JobState::Expired);
    let status = d.cli(&["status", "abandoned"], None, T).await;
    assert!(status.stdout.contains("expired"), "{status:?}");
    // Before its deadline, message in the stream: left running.
    let r = d.producer.status("still-in-time").await.unwrap().unwrap();
    assert_eq!(r.state, JobState::Running);
    // Not before the deadline, whatever the stream holds.
    assert_eq!(
        statuses
            .expire_orphan("still-in-time", running[1].stream_sequence.unwrap())
            .await
            .unwrap(),
        None
    );
    // Not for another message's record.
    assert_eq!(
        statuses.expire_orphan("abandoned", 999).await.unwrap(),
        None
    );
}

/// The attack: a presigned URL copied out of a job message opens the
/// job's private input for as long as it lives. A job submitted with a
/// 30 s deadline carries a URL that ends a minute after it (X-Amz-Expires
/// at most 90), not the day it lived before; without a deadline, the
/// `--presign-secs` asked for.
#[tokio::test]
async fn a_jobs_input_url_lives_no_longer_than_the_job_can_run() {
    let d = Deployment::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("private.jsonl");
    std::fs::write(&file, jsonl(&texts(3))).unwrap();
    let path = file.to_str().unwrap();
    for (args, at_most, at_least) in [
        (vec!["--deadline-secs", "30"], 90, 60),
        (vec!["--presign-secs", "600"], 600, 600),
    ] {
        let mut cli = vec!["submit", "--json"];
        cli.extend(&args);
        cli.push(path);
        let run = d.cli(&cli, None, T).await;
        assert_eq!(run.code, Some(0), "{run:?}");
        let id = run.json_lines()[0]["job_id"].as_str().unwrap().to_string();
        // No consumer: the job waits in the stream; read it as anyone
        // with the stream's read rights would.
        let stream = d
            .producer
            .js
            .get_stream(&d.topology.job_stream)
            .await
            .unwrap();
        let info = stream.get_info().await.unwrap();
        let msg = stream
            .get_raw_message(info.state.last_sequence)
            .await
            .unwrap();
        let job = sluice_schemas::Job::decode(&msg.payload).unwrap().job;
        assert_eq!(job.id, id);
        let sluice_schemas::Input::Url { url, .. } = &job.inputs[0] else {
            panic!("{:?}", job.inputs)
        };
        let expires: u64 = url
            .split(['?', '&'])
            .find_map(|p| p.strip_prefix("X-Amz-Expires="))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no X-Amz-Expires in {url}"));
        eprintln!("{args:?}: the input URL lives {expires} s");
        assert!(
            (at_least..=at_most).contains(&expires),
            "{args:?}: X-Amz-Expires={expires}, not within {at_least}..={at_most}"
        );
    }
}
