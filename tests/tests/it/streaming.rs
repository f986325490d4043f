//! Token streaming: a generate job that sets `output.stream` publishes its
//! text as it decodes (numbered messages on `<prefix>.stream.<job id>`, the
//! last with its finish reason and usage), `sluice submit --stream` prints
//! it, the gateway relays it as OpenAI's Server-Sent Events, a client that
//! goes away stops its generation, and the queue's limits answer 504 / 429.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::{Value, json};
use sluice_schemas::{Generation, Input, JobResult, JobState, Outcome, Output, StreamChunk, Task};
use sluice_tests::deploy::Deployment;
use sluice_tests::resident_bytes_of;

const MODEL: &str = "smollm2-135m-instruct";
const KEY: &str = "sk-team-a-0123456789";
const KEYS: &str = "team-a:sk-team-a-0123456789";

fn inline_generations(result: &JobResult) -> Vec<Generation> {
    match &result.outcome {
        Outcome::Ok {
            output: Output::Inline { generations, .. },
        } => generations.clone(),
        other => panic!("expected inline generations, got {other:?}"),
    }
}

/// Runs `script` with the official Python SDK, pointed at the gateway;
/// returns its stdout as JSON.
async fn python(script: &str, base: &str, timeout: Duration) -> Value {
    sluice_tests::sdk::run_python(script, &[], base, KEY, timeout).await
}

/// A generate consumer whose job budget holds `jobs` jobs at their worst
/// case (so a backlog waits in the stream, not in the consumer): a first
/// start measures the activations set aside and a job's worst case.
async fn consumer_for_jobs(d: &Deployment, jobs: u64, extra: &[&str]) -> sluice_consumer::Consumer {
    const PROBE: u64 = 400_000_000;
    let args = |budget: u64| {
        let mut args = vec![
            "--task=generate".to_string(),
            format!("--memory-budget={budget}"),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        args
    };
    let probe_args = args(PROBE);
    let probe = d
        .start_consumer(&probe_args.iter().map(String::as_str).collect::<Vec<_>>())
        .await
        .unwrap();
    let activation = PROBE - probe.budget.snapshot().limit_bytes;
    let worst = probe.worst_job_bytes;
    probe.shutdown(Duration::from_secs(5)).await.unwrap();
    let budget = activation + jobs * worst + worst / 2;
    let args = args(budget);
    let consumer = d
        .start_consumer(&args.iter().map(String::as_str).collect::<Vec<_>>())
        .await
        .unwrap();
    let limit = consumer.budget.snapshot().limit_bytes;
    assert!(
        limit / worst == jobs,
        "the job budget {limit} B holds {} jobs of {worst} B",
        limit / worst
    );
    consumer
}

/// The contract end to end: a streamed two-prompt job's messages are
/// numbered per prompt from 0, the first carries the queue wait, the last
/// the finish reason and usage, and each prompt's texts add up to its
/// generation in the result. `sluice submit --stream` prints the same.
#[tokio::test]
async fn a_streamed_job_numbers_its_text_and_it_adds_up_to_the_result() {
    let d = Deployment::start().await.unwrap();
    let consumer = d
        .start_consumer(&[
            "--task=generate",
            "--max-new-tokens=32",
            "--max-prompt-tokens=256",
        ])
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let prompts = dir.path().join("prompts.jsonl");
    std::fs::write(
        &prompts,
        format!(
            "{}\n{}\n",
            json!({"prompt": "Once upon a time", "max_new_tokens": 24}),
            json!({"messages": [{"role": "user", "content": "What is the capital of France?"}], "max_new_tokens": 16}),
        ),
    )
    .unwrap();
    let prompts = prompts.to_str().unwrap();

    // The test listens too, on the subject the text goes to: under the
    // CLI's reply subject (`_INBOX.<its own>.stream-1`), with `.text`.
    let nats = d.servers.nats.connect().await.unwrap();
    let mut listened = nats.subscribe("_INBOX.*.stream-1.text").await.unwrap();
    nats.flush().await.unwrap();
    let run = d
        .cli(
            &[
                "--json", "submit", "--task", "generate", "--inline", "--stream", "--id",
                "stream-1", prompts,
            ],
            None,
            Duration::from_secs(300),
        )
        .await;
    assert_eq!(run.code, Some(0), "{run:?}");
    let lines = run.json_lines();
    let result: JobResult = lines
        .iter()
        .find(|l| l.get("status").is_some())
        .map(|l| serde_json::from_value(l.clone()).unwrap())
        .unwrap_or_else(|| panic!("no result line: {run:?}"));
    let generations = inline_generations(&result);
    assert_eq!(generations.len(), 2);
    let printed: Vec<StreamChunk> = lines
        .iter()
        .filter_map(|l| l.get("stream"))
        .map(|c| serde_json::from_value(c.clone()).unwrap())
        .collect();

    let mut chunks = Vec::new();
    while chunks.len() < printed.len() {
        let next = tokio::time::timeout(Duration::from_secs(5), listened.next())
            .await
            .expect("the test saw every message the CLI printed")
            .unwrap();
        chunks.push(serde_json::from_slice::<StreamChunk>(&next.payload).unwrap());
    }
    assert_eq!(chunks, printed, "the CLI printed each message as published");
    let mut by_item: BTreeMap<u32, Vec<&StreamChunk>> = BTreeMap::new();
    for c in &chunks {
        assert_eq!((c.job_id.as_str(), c.attempt), ("stream-1", 1));
        by_item.entry(c.item).or_default().push(c);
    }
    assert_eq!(by_item.len(), 2);
    for (item, messages) in &by_item {
        let g = &generations[*item as usize];
        let seqs: Vec<u64> = messages.iter().map(|c| c.seq).collect();
        assert_eq!(
            seqs,
            (0..messages.len() as u64).collect::<Vec<_>>(),
            "numbered in order"
        );
        assert!(
            messages[0].queue_ms.is_some(),
            "the first carries the queue wait"
        );
        let last = messages.last().unwrap();
        assert!(
            messages[..messages.len() - 1].iter().all(|c| !c.is_last()),
            "one last message"
        );
        assert_eq!(last.finish_reason, Some(g.finish_reason));
        let usage = last.usage.unwrap();
        assert_eq!(
            (usage.prompt_tokens, usage.completion_tokens),
            (g.prompt_tokens, g.completion_tokens)
        );
        let text: String = messages.iter().map(|c| c.text.as_str()).collect();
        assert_eq!(text, g.text, "item {item}: the texts add up to the result");
        assert!(
            messages.len() >= 3,
            "item {item} came in pieces as it decoded: {messages:?}"
        );
    }
    assert_eq!(
        consumer.stats.stream_messages.load(Ordering::Relaxed),
        chunks.len() as u64
    );

    // For people: the text as it comes, the second prompt after its header.
    let run = d
        .cli(
            &[
                "submit", "--task", "generate", "--inline", "--stream", prompts,
            ],
            None,
            Duration::from_secs(300),
        )
        .await;
    assert_eq!(run.code, Some(0), "{run:?}");
    let expected = format!(
        "{}\n[prompt 1]\n{}\n",
        generations[0].text, generations[1].text
    );
    assert!(
        run.stdout.contains(&expected),
        "{expected:?} not in {run:?}"
    );

    // What cannot stream is refused before anything is published.
    let run = d
        .cli(
            &["submit", "--task", "embed", "--inline", "--stream", prompts],
            None,
            Duration::from_secs(60),
        )
        .await;
    assert_eq!(run.code, Some(2), "{run:?}");
    assert!(
        run.stderr.contains("--stream applies to --task generate"),
        "{run:?}"
    );
    consumer.shutdown(Duration::from_secs(5)).await.unwrap();
}

const CLOSE_AFTER_THREE: &str = r#"
import json
from openai import OpenAI
client = OpenAI()
stream = client.completions.create(
    model="smollm2-135m-instruct", prompt="Once upon a time", max_tokens=200,
    temperature=0, stream=True)
seen = []
for chunk in stream:
    seen.append(chunk.choices[0].text)
    if len(seen) == 3:
        break
stream.close()
print(json.dumps({"id": chunk.id, "seen": seen}))
"#;

/// A client that closes its stream after 3 chunks: its job is cancelled,
/// its sequence leaves the running set at once (the consumer publishes at
/// most one more message after the cancel is stored), the metrics show it,
/// and nothing is written for it.
#[tokio::test]
async fn a_client_that_closes_its_stream_stops_its_generation() {
    let d = Deployment::start().await.unwrap();
    let consumer = d
        .start_consumer(&[
            "--task=generate",
            "--max-new-tokens=256",
            "--max-prompt-tokens=64",
            "--max-items-per-job=1",
        ])
        .await
        .unwrap();
    let gateway = d.start_gateway(KEYS, &[]).await.unwrap();
    // One connection sees the status writes and the stream messages in the
    // order the server took them.
    let nats = async_nats::connect(&d.nats_urls).await.unwrap();
    let status_writes = format!("$KV.{}.>", d.topology.status_bucket);
    // The gateway's text comes under its answer's inbox.
    let streams = "_INBOX.*.text".to_string();
    let mut seen = futures::stream::select(
        nats.subscribe(status_writes).await.unwrap(),
        nats.subscribe(streams).await.unwrap(),
    );
    nats.flush().await.unwrap();

    let got = python(
        CLOSE_AFTER_THREE,
        &format!("http://{}/v1", gateway.addr),
        Duration::from_secs(120),
    )
    .await;
    let job_id = got["id"]
        .as_str()
        .unwrap()
        .trim_start_matches("cmpl-")
        .to_string();
    assert_eq!(got["seen"].as_array().unwrap().len(), 3, "{got}");

    let stats = &consumer.stats;
    let stopped = sluice_tests::read_until(
        Duration::from_secs(10),
        || async {
            (
                stats.cancelled_sequences.load(Ordering::Relaxed),
                stats.generate_running.load(Ordering::Relaxed),
            )
        },
        |&(cancelled, running)| cancelled == 1 && running == 0,
    )
    .await;
    assert_eq!(stopped, (1, 0), "(cancelled, running) sequences");
    let record = d
        .producer
        .status_in(Some("team-a"), &job_id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.state, JobState::Cancelled, "{record:?}");

    // Messages of this job after its cancelled record was stored.
    let mut after_cancel: Option<usize> = None;
    let mut messages = 0;
    while let Ok(Some(m)) = tokio::time::timeout(Duration::from_secs(1), seen.next()).await {
        if m.subject.ends_with(&job_id) && m.subject.starts_with("$KV.") {
            if sluice_status::StatusStore::is_cancelled_write(&m.payload) {
                after_cancel = Some(0);
            }
        } else if m.subject.ends_with(".text") {
            messages += 1;
            if let Some(n) = after_cancel.as_mut() {
                *n += 1;
            }
        }
    }
    let after_cancel = after_cancel.expect("the cancelled record was seen");
    eprintln!("{messages} stream messages, {after_cancel} after the cancel was stored");
    assert!(
        after_cancel <= 1,
        "the generation went on for {after_cancel} steps after its cancel"
    );
    assert!(
        messages < 200,
        "it did not run to its end: {messages} messages"
    );
    // Nothing is written for it; the consumer ran no job to its end.
    let objects = d
        .servers
        .s3
        .client()
        .list_objects_v2()
        .bucket(&d.bucket)
        .send()
        .await
        .unwrap();
    let keys: Vec<&str> = objects.contents().iter().filter_map(|o| o.key()).collect();
    assert!(
        !keys.iter().any(|k| k.contains(&job_id)),
        "an output was written: {keys:?}"
    );
    assert_eq!(stats.jobs_ok.load(Ordering::Relaxed), 0);
    consumer.shutdown(Duration::from_secs(5)).await.unwrap();
}

const MANY_STREAMS: &str = r#"
import asyncio, json, sys
from openai import AsyncOpenAI
n = int(sys.argv[1])
client = AsyncOpenAI(max_retries=0, timeout=600)
async def one(i):
    stream = await client.completions.create(
        model="smollm2-135m-instruct", prompt=f"Story {i}: once upon a time",
        max_tokens=8, temperature=0, stream=True)
    text, chunks, finish = "", 0, None
    async for chunk in stream:
        chunks += 1
        for c in chunk.choices:
            text += c.text
            finish = c.finish_reason or finish
    return {"text": text, "chunks": chunks, "finish": finish}
async def main():
    got = await asyncio.gather(*(one(i) for i in range(n)), return_exceptions=True)
    errors = [repr(g) for g in got if isinstance(g, BaseException)]
    done = [g for g in got if not isinstance(g, BaseException)]
    print(json.dumps({"done": done, "errors": errors[:5], "failed": len(errors)}))
asyncio.run(main())
"#;

/// 200 concurrent streaming requests against one generate consumer whose
/// budget holds 16 sequences: all complete, the consumer's reservations and
/// KV caches stay inside its budget with at most 16 running, and the
/// gateway's memory stays flat (a second burst adds nothing).
#[tokio::test]
async fn two_hundred_concurrent_streams_stay_inside_the_budget() {
    let d = Deployment::start().await.unwrap();
    let consumer = consumer_for_jobs(
        &d,
        16,
        &[
            "--max-sequences=16",
            "--max-items-per-job=1",
            "--max-prompt-tokens=32",
            "--max-new-tokens=8",
            "--max-input-bytes=4096",
        ],
    )
    .await;
    let gateway = d.spawn_gateway(KEYS, &[]).await.unwrap();
    let pid = gateway.pid().unwrap();
    let base = format!("http://{}/v1", gateway.addr);
    // Warm the gateway up (connections, buffers), then measure from there.
    let warm = python(
        &MANY_STREAMS.replace("sys.argv[1]", "16"),
        &base,
        Duration::from_secs(300),
    )
    .await;
    assert_eq!(warm["failed"], 0, "{warm}");
    let baseline = resident_bytes_of(pid).unwrap();

    let stop = Arc::new(AtomicBool::new(false));
    let peaks = Arc::new([AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)]);
    let sampler = {
        let (stop, peaks, budget, stats) = (
            Arc::clone(&stop),
            Arc::clone(&peaks),
            consumer.budget.clone(),
            Arc::clone(&consumer.stats),
        );
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let s = budget.snapshot();
                assert!(
                    s.reserved_bytes <= s.limit_bytes,
                    "reserved over the budget"
                );
                peaks[0].fetch_max(s.reserved_bytes, Ordering::Relaxed);
                peaks[1].fetch_max(
                    stats.generate_running.load(Ordering::Relaxed),
                    Ordering::Relaxed,
                );
                peaks[2].fetch_max(resident_bytes_of(pid).unwrap_or(0), Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
    };
    let started = Instant::now();
    let mut bursts = Vec::new();
    for _ in 0..2 {
        let got = python(
            &MANY_STREAMS.replace("sys.argv[1]", "200"),
            &base,
            Duration::from_secs(600),
        )
        .await;
        bursts.push((got, peaks[2].load(Ordering::Relaxed)));
    }
    stop.store(true, Ordering::Relaxed);
    sampler.await.unwrap();
    let limit = consumer.budget.snapshot().limit_bytes;
    let kv_peak = consumer.stats.kv_peak_bytes.load(Ordering::Relaxed);
    eprintln!(
        "2 x 200 streams in {:.1} s; consumer: job budget {limit} B, peak reserved {} B, peak KV {kv_peak} B, \
         most running {}; gateway RSS {baseline} B after warm-up, peak {} B after the first burst, {} B after the second",
        started.elapsed().as_secs_f64(),
        peaks[0].load(Ordering::Relaxed),
        peaks[1].load(Ordering::Relaxed),
        bursts[0].1,
        bursts[1].1,
    );
    for (got, _) in &bursts {
        assert_eq!(got["failed"], 0, "{got}");
        let done = got["done"].as_array().unwrap();
        assert_eq!(done.len(), 200);
        for one in done {
            assert!(!one["text"].as_str().unwrap().is_empty(), "{one}");
            assert!(one["chunks"].as_u64().unwrap() >= 2, "streamed: {one}");
            assert!(one["finish"].is_string(), "{one}");
        }
    }
    assert!(kv_peak <= limit, "KV {kv_peak} B over the budget {limit} B");
    assert!(peaks[1].load(Ordering::Relaxed) <= 16);
    // Flat: the first burst costs the gateway little beyond its warm-up,
    // and the second burst, as large, nothing more.
    let (first, second) = (bursts[0].1, bursts[1].1);
    assert!(
        first < baseline + 32 * 1024 * 1024,
        "gateway RSS grew from {baseline} B to {first} B over 200 streams"
    );
    assert!(
        second < first + 16 * 1024 * 1024,
        "gateway RSS grew again on a second burst: {first} B -> {second} B"
    );
    assert_eq!(
        consumer.stats.jobs_ok.load(Ordering::Relaxed),
        416,
        "every request was one job, run once"
    );
    consumer.shutdown(Duration::from_secs(5)).await.unwrap();
}

/// A request that cannot start in time behind a backlog: with
/// `--max-queue-wait-secs` it is refused 429 with `Retry-After`, with a 1 s
/// deadline (streamed) 504; both jobs are cancelled and never run.
#[tokio::test]
async fn requests_behind_a_backlog_get_429_or_504_and_their_jobs_never_run() {
    let d = Deployment::start().await.unwrap();
    // A budget for one job, and two long jobs ahead of the requests.
    let consumer =
        consumer_for_jobs(&d, 1, &["--max-new-tokens=128", "--max-items-per-job=1"]).await;
    let mut results = d.producer.subscribe_results().await.unwrap();
    for i in 0..2 {
        let mut job = d.producer.job(
            Task::Generate,
            &format!("backlog-{i}"),
            vec![Input::Inline {
                items: vec![json!({"prompt": "Once upon a time", "max_new_tokens": 128})],
            }],
        );
        job.model = MODEL.into();
        d.producer.submit(&job).await.unwrap();
    }
    let gateway = d
        .start_gateway(KEYS, &["--max-queue-wait-secs=1", "--online-grace-secs=1"])
        .await
        .unwrap();
    let http = reqwest::Client::new();
    let ask = |body: Value, deadline: Option<&str>| {
        let mut r = http
            .post(format!("http://{}/v1/completions", gateway.addr))
            .bearer_auth(KEY)
            .header("content-type", "application/json")
            .body(body.to_string());
        if let Some(secs) = deadline {
            r = r.header("sluice-deadline-secs", secs);
        }
        r.send()
    };
    let body = json!({"model": MODEL, "prompt": "Hello", "max_tokens": 4});
    let asked = Instant::now();
    let (queued, streamed) = tokio::join!(
        ask(body.clone(), None),
        ask(
            json!({"model": MODEL, "prompt": "Hello", "max_tokens": 4, "stream": true}),
            Some("1")
        )
    );
    let waited = asked.elapsed();
    let queued = queued.unwrap();
    assert_eq!(queued.status().as_u16(), 429);
    assert_eq!(
        queued
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok()),
        Some("1")
    );
    let queued: Value = serde_json::from_slice(&queued.bytes().await.unwrap()).unwrap();
    assert_eq!(queued["error"]["code"], "queue_wait_exceeded", "{queued}");
    let streamed = streamed.unwrap();
    assert_eq!(streamed.status().as_u16(), 504);
    let streamed: Value = serde_json::from_slice(&streamed.bytes().await.unwrap()).unwrap();
    assert_eq!(streamed["error"]["code"], "deadline_exceeded", "{streamed}");
    assert!(waited < Duration::from_secs(6), "answered after {waited:?}");

    // Both jobs read cancelled (or expired) and never run: once the backlog
    // is done, the consumer has run exactly its two jobs.
    let job_of = |answer: &Value| {
        answer["error"]["message"]
            .as_str()
            .unwrap()
            .split_whitespace()
            .find(|w| w.len() == 36 && w.matches('-').count() == 4)
            .unwrap()
            .to_string()
    };
    for id in [job_of(&queued), job_of(&streamed)] {
        let record = d.producer.status_in(Some("team-a"), &id).await.unwrap();
        let state = record.map(|r| r.as_of(time::OffsetDateTime::now_utc()).state);
        assert!(
            matches!(state, Some(JobState::Cancelled | JobState::Expired)),
            "{id}: {state:?}"
        );
    }
    let done = sluice_tests::results::wait_results(&mut results, 2, Duration::from_secs(120)).await;
    assert!(done.iter().all(|r| matches!(r.outcome, Outcome::Ok { .. })));
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(consumer.stats.jobs_ok.load(Ordering::Relaxed), 2);
    assert_eq!(
        consumer.stats.generated_tokens.load(Ordering::Relaxed),
        done.iter().map(|r| r.usage.completion_tokens).sum::<u64>(),
        "no tokens were generated for the refused requests"
    );
    consumer.shutdown(Duration::from_secs(5)).await.unwrap();
}
