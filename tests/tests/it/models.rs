//! Many models on one namespace (issue #36): `[[models]]` in the settings
//! give each (task, model) its own subjects and durable consumers, so a
//! consumer only ever pulls the jobs of the model it loaded; a job for a
//! model nobody deploys is refused before it is published; a job whose body
//! and subject disagree is a `schema_violation`; `init` adds the models to
//! a stream made without them, in place, and the jobs waiting there run.

use std::collections::HashMap;
use std::time::Duration;

use futures::StreamExt;
use serde_json::json;
use sluice_producer::Submission;
use sluice_producer::provision::{self, Change, Settings};
use sluice_schemas::{ErrorCode, Input, Job, Outcome, Priority, Route, Task};
use sluice_tests::deploy::Deployment;
use sluice_tests::fixtures::jsonl;
use sluice_tests::results::wait_results;

const T: Duration = Duration::from_secs(300);
const MINILM: &str = "all-minilm-l6-v2";
/// The same weights under another name, cutting items at 64 tokens: a
/// second embedding model whose answers differ from the first's.
const SHORT: &str = "minilm-short";
const SMOLLM: &str = "smollm2-135m-instruct";

const MODELS: &str = r#"
[[models]]
task = "embed"
name = "all-minilm-l6-v2"

[[models]]
task = "embed"
name = "minilm-short"

[[models]]
task = "generate"
name = "smollm2-135m-instruct"
"#;

fn settings() -> Settings {
    Settings::from_toml(MODELS).unwrap()
}

/// About 100 word pieces: cut by the short model, whole for the default.
fn long_text(i: usize) -> String {
    format!(
        "text {i}: {}",
        "the river carries water down to the valley ".repeat(12)
    )
}

fn job(d: &Deployment, task: Task, model: &str, id: &str, items: Vec<serde_json::Value>) -> Job {
    let mut job = d.producer.job(task, id, vec![Input::Inline { items }]);
    job.model = model.into();
    job
}

/// Reads results into `answered` (job id: the model that answered it, each
/// Ok) until `enough` says so.
async fn answer_until(
    results: &mut sluice_producer::Results,
    answered: &mut HashMap<String, String>,
    enough: impl Fn(&HashMap<String, String>) -> bool,
) {
    while !enough(answered) {
        let r = tokio::time::timeout(T, results.next_result())
            .await
            .unwrap()
            .unwrap();
        assert!(matches!(r.outcome, Outcome::Ok { .. }), "{r:?}");
        answered.insert(r.job_id.unwrap(), r.served_by.unwrap().model);
    }
}

/// How many live consumers serve `model` (embed), from the consumers bucket.
async fn live(d: &Deployment, model: &str) -> usize {
    let live = sluice_connect::consumers::live_consumers(&d.producer.js, &d.producer.topology)
        .await
        .unwrap();
    sluice_schemas::consumers::serving(&live, "embed", model)
}

/// `GET /v1/models`'s `data`.
async fn get_models(base: &str) -> Vec<serde_json::Value> {
    let listed = reqwest::Client::new()
        .get(format!("{base}/models"))
        .bearer_auth("sk-team-a-0123456789")
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let listed: serde_json::Value = serde_json::from_str(&listed).unwrap();
    listed["data"].as_array().unwrap().clone()
}

/// `GET /v1/models`: each id with its `live` and `consumers`.
async fn listed_models(base: &str) -> HashMap<String, (bool, u64)> {
    get_models(base)
        .await
        .iter()
        .map(|m| {
            let id = m["id"].as_str().unwrap().to_string();
            let live = m["live"].as_bool().unwrap();
            let consumers = m["consumers"].as_u64().unwrap();
            (id, (live, consumers))
        })
        .collect()
}

/// `sluice watch --once --json`'s row of embed `model`: (pending + in flight, consumers).
async fn watched(d: &Deployment, model: &str) -> (u64, u64) {
    let watch = d.cli(&["watch", "--once", "--json"], None, T).await;
    assert_eq!(watch.code, Some(0), "{watch:?}");
    let counts = &watch.json_lines()[0];
    let row = counts["models"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["task"] == "embed" && r["model"] == model)
        .unwrap_or_else(|| panic!("no row of {model}: {counts}"));
    (
        row["pending"].as_u64().unwrap() + row["in_flight"].as_u64().unwrap(),
        row["consumers"].as_u64().unwrap(),
    )
}

#[tokio::test]
async fn three_models_share_a_namespace_and_every_job_is_answered_by_its_own() {
    let d = Deployment::start_with(settings()).await.unwrap();
    let mut results = d.producer.subscribe_results_and_defaults().await.unwrap();
    let minilm = d.start_consumer(&[]).await.unwrap();
    let short = d
        .start_consumer(&[&format!("--model-name={SHORT}"), "--max-tokens-per-item=64"])
        .await
        .unwrap();
    let smollm = d
        .start_consumer(&["--task=generate", "--max-items-per-job=8"])
        .await
        .unwrap();

    // 501 jobs, interleaved: each third for one model.
    const JOBS: usize = 501;
    let models = [
        (Task::Embed, MINILM),
        (Task::Embed, SHORT),
        (Task::Generate, SMOLLM),
    ];
    let mut wanted = HashMap::new();
    let submissions: Vec<Submission> = (0..JOBS)
        .map(|i| {
            let (task, model) = models[i % 3];
            let id = format!("j-{i}");
            let item = match task {
                Task::Embed | Task::Classify => json!(long_text(i)),
                Task::Generate => json!({"prompt": format!("Count: {i},"), "max_new_tokens": 1}),
                Task::Rerank => json!({"query": "which text?", "document": long_text(i)}),
                Task::Transcribe => unreachable!("no transcribe model in this test"),
            };
            wanted.insert(id.clone(), model);
            Submission::new(&d.producer, job(&d, task, model, &id, vec![item]), None)
        })
        .collect();
    let mut acks = d.producer.submit_pipelined(submissions, 256).await.unwrap();
    while let Some(s) = acks.next().await {
        s.ack.unwrap();
    }
    drop(acks);

    let got = wait_results(&mut results, JOBS, T).await;
    assert_eq!(got.len(), JOBS);
    let mut answered: HashMap<String, usize> = HashMap::new();
    for r in &got {
        let id = r.job_id.clone().unwrap();
        assert!(matches!(r.outcome, Outcome::Ok { .. }), "{r:?}");
        let served_by = r.served_by.as_ref().unwrap();
        assert_eq!(
            served_by.model, wanted[&id],
            "{id} ran on another model: {r:?}"
        );
        assert!(!served_by.forward.is_empty());
        // The short model cut the text; the default read it whole.
        if wanted[&id] != SMOLLM {
            let cut = u64::from(wanted[&id] == SHORT);
            assert_eq!(r.usage.truncated_items, cut, "{id}: {r:?}");
        }
        *answered.entry(id).or_default() += 1;
    }
    assert_eq!(answered.len(), JOBS, "every job answered");
    assert!(answered.values().all(|&n| n == 1), "each once");
    assert_eq!(d.dead_letters().await, 0);
    assert_eq!(d.jobs_in_stream_settled(0).await, 0);
    // Each model's consumer took its third, no other.
    for (consumer, n) in [(&minilm, 167), (&short, 167), (&smollm, 167)] {
        let ok = consumer
            .stats
            .jobs_ok
            .load(std::sync::atomic::Ordering::Relaxed);
        assert_eq!(ok, n);
    }
    // The routed model's jobs went through its own durable consumer.
    let routed = d
        .topology
        .model_consumer(Task::Embed, Some(SHORT), Priority::Normal, None);
    let stream = d
        .producer
        .js
        .get_stream(&d.topology.job_stream)
        .await
        .unwrap();
    let info = stream.consumer_info(&routed).await.unwrap();
    assert!(info.delivered.stream_sequence > 0, "{info:?}");
    for c in [minilm, short, smollm] {
        c.shutdown(Duration::from_secs(10)).await.unwrap();
    }
}

#[tokio::test]
async fn init_adds_models_in_place_and_an_undeployed_or_misrouted_model_is_refused() {
    // A deployment from before models: one job waits on the plain subject.
    let d = Deployment::start().await.unwrap();
    let mut results = d.producer.subscribe_results_and_defaults().await.unwrap();
    let waiting = job(&d, Task::Embed, MINILM, "waited", vec![json!("hello")]);
    d.producer.submit(&waiting).await.unwrap();

    // init adds the models in place, and says so; again, nothing changes.
    let p = &d.producer;
    let changes = provision::ensure(&p.js, None, &d.bucket, &d.topology, &settings())
        .await
        .unwrap();
    let created: Vec<String> = changes
        .iter()
        .filter_map(|c| match c {
            Change::Created(what) => Some(what.clone()),
            _ => None,
        })
        .collect();
    assert!(
        created
            .iter()
            .any(|c| c.starts_with(&format!("model embed/{SHORT}"))),
        "{created:?}"
    );
    assert!(
        created.iter().any(|c| c.starts_with(&format!(
            "consumer {}",
            d.topology
                .model_consumer(Task::Embed, Some(SHORT), Priority::High, None)
        ))),
        "{created:?}"
    );
    assert!(
        changes
            .iter()
            .any(|c| matches!(c, Change::Updated(what, _) if what.starts_with("stream"))),
        "the stream gains the routed model's subjects: {changes:?}"
    );
    let again = provision::ensure(&p.js, None, &d.bucket, &d.topology, &settings())
        .await
        .unwrap();
    assert!(
        again.iter().all(|c| matches!(c, Change::Unchanged(_))),
        "{again:?}"
    );
    // Another default for a task with waiting jobs is refused, naming the fix.
    let swapped = Settings::from_toml(&MODELS.replacen(
        "name = \"all-minilm-l6-v2\"\n\n[[models]]\ntask = \"embed\"\nname = \"minilm-short\"",
        "name = \"minilm-short\"\n\n[[models]]\ntask = \"embed\"\nname = \"all-minilm-l6-v2\"",
        1,
    ))
    .unwrap();
    let e = provision::ensure(&p.js, None, &d.bucket, &d.topology, &swapped)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("make minilm-short the default embed model, but it is all-minilm-l6-v2"),
        "{e}"
    );

    // A publisher reads the models again within `REFRESH`; this one at once.
    p.models.read().await.unwrap();

    // The job that waited through the upgrade runs on the default model.
    let consumer = d.start_consumer(&[]).await.unwrap();
    let r = wait_results(&mut results, 1, T).await.remove(0);
    assert_eq!(r.job_id.as_deref(), Some("waited"));
    assert!(matches!(r.outcome, Outcome::Ok { .. }), "{r:?}");

    // A model nobody deploys: the CLI refuses it before uploading (exit 2,
    // naming the deployed ones), the library too, and a raw publish to its
    // subject finds no stream. Nothing reaches a consumer.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("one.jsonl");
    std::fs::write(&file, jsonl(&["a text".to_string()])).unwrap();
    let cli = d
        .cli(
            &["submit", "--model", "e5-large", file.to_str().unwrap()],
            None,
            T,
        )
        .await;
    assert_eq!(cli.code, Some(2), "{cli:?}");
    assert!(
        cli.stderr.contains(&format!(
            "model \"e5-large\" is not deployed for the embed task (deployed: {MINILM}, {SHORT})"
        )),
        "{cli:?}"
    );
    // The gateway answers 404 model_not_found, as OpenAI does, and lists
    // the deployed models.
    let gateway = d
        .start_gateway("team-a:sk-team-a-0123456789", &[])
        .await
        .unwrap();
    let http = reqwest::Client::new();
    let base = format!("http://{}/v1", gateway.addr);
    let r = http
        .post(format!("{base}/embeddings"))
        .bearer_auth("sk-team-a-0123456789")
        .header("content-type", "application/json")
        .body(json!({"model": "e5-large", "input": "x"}).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    let body: serde_json::Value = serde_json::from_str(&r.text().await.unwrap()).unwrap();
    assert_eq!(body["error"]["code"], "model_not_found", "{body}");
    let listed = get_models(&base).await;
    let ids: Vec<&str> = listed.iter().map(|m| m["id"].as_str().unwrap()).collect();
    // And transcribe's default, by its flag: `init` deployed none of
    // transcribe's models here.
    assert_eq!(ids, [MINILM, SHORT, SMOLLM, "whisper-tiny-en"]);
    gateway.stop();
    let unknown = job(&d, Task::Embed, "e5-large", "e5-job", vec![json!("x")]);
    let e = p.submit(&unknown).await.unwrap_err();
    let refused = sluice_producer::models::not_deployed(&e).unwrap();
    assert_eq!(refused.deployed, [MINILM, SHORT]);
    let subject = d.topology.subject_of(&Route {
        task: "embed".into(),
        model: Some("e5-large".into()),
        priority: Priority::Normal,
        tenant: None,
    });
    let raw = async {
        p.js.publish(subject, unknown.to_bytes().into())
            .await?
            .await
    };
    assert!(
        raw.await.is_err(),
        "no stream takes an undeployed model's subject"
    );
    assert_eq!(d.jobs_in_stream().await, 0);
    assert!(p.status("e5-job").await.unwrap().is_none());
    // Nor can a consumer of it start.
    let e = d
        .start_consumer(&["--model-name=e5-large"])
        .await
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("--model-name: model \"e5-large\" is not deployed"),
        "{e}"
    );
    // Nor an embed consumer under the name of a model deployed for
    // generate: it would never see a job of that name.
    let e = d
        .start_consumer(&[&format!("--model-name={SMOLLM}")])
        .await
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains(&format!(
            "--model-name: model \"{SMOLLM}\" is deployed for the generate task, not embed"
        )),
        "{e}"
    );

    // A body that names another model than its subject is a schema
    // violation, dead-lettered, not run on the wrong model.
    let misrouted = job(&d, Task::Embed, SHORT, "misrouted", vec![json!("x")]);
    let mut h = async_nats::HeaderMap::new();
    h.insert("Nats-Msg-Id", "misrouted");
    p.js.publish_with_headers(
        d.topology.job_subject("embed"),
        h,
        misrouted.to_bytes().into(),
    )
    .await
    .unwrap()
    .await
    .unwrap();
    let r = wait_results(&mut results, 1, T).await.remove(0);
    let Outcome::Error { error } = &r.outcome else {
        panic!("{r:?}")
    };
    assert_eq!(error.code, ErrorCode::SchemaViolation, "{r:?}");
    assert!(
        error.message.contains(&format!("names model \"{SHORT}\""))
            && error.message.contains(MINILM),
        "{}",
        error.message
    );
    assert_eq!(d.dead_letters().await, 1, "kept in the dead-letter stream");
    consumer.shutdown(Duration::from_secs(10)).await.unwrap();
}

#[tokio::test]
async fn a_model_whose_only_consumer_is_killed_waits_while_the_other_runs_on() {
    let settings = Settings::from_toml(&format!("ack_wait_secs = 5\n{MODELS}")).unwrap();
    let d = Deployment::start_with(settings).await.unwrap();
    let mut results = d.producer.subscribe_results_and_defaults().await.unwrap();
    let minilm = d.start_consumer(&[]).await.unwrap();
    let short_args = [
        format!("--model-name={SHORT}"),
        "--max-tokens-per-item=64".into(),
    ];
    let short_args: Vec<&str> = short_args.iter().map(String::as_str).collect();
    let short = d.spawn_consumer(&short_args).await.unwrap();
    let gateway = d
        .start_gateway("team-a:sk-team-a-0123456789", &[])
        .await
        .unwrap();
    let base = format!("http://{}/v1", gateway.addr);
    // Each consumer lists itself as it starts.
    assert_eq!((live(&d, MINILM).await, live(&d, SHORT).await), (1, 1));
    let listed = listed_models(&base).await;
    assert_eq!(listed[MINILM], (true, 1), "{listed:?}");
    assert_eq!(listed[SHORT], (true, 1), "{listed:?}");
    assert_eq!(listed[SMOLLM], (false, 0), "{listed:?}");

    const A_JOBS: usize = 300;
    const B_JOBS: usize = 100;
    let submissions: Vec<Submission> = (0..A_JOBS + B_JOBS)
        .map(|i| {
            let (model, id) = match i % 4 {
                3 => (MINILM, format!("b-{i}")),
                _ => (SHORT, format!("a-{i}")),
            };
            let job = job(&d, Task::Embed, model, &id, vec![json!(long_text(i))]);
            Submission::new(&d.producer, job, None)
        })
        .collect();
    let mut acks = d.producer.submit_pipelined(submissions, 256).await.unwrap();
    while let Some(s) = acks.next().await {
        s.ack.unwrap();
    }
    drop(acks);

    let mut answered: HashMap<String, String> = HashMap::new();
    // A's consumer dies mid-run (SIGKILL: no drain, no Nak).
    let count = |a: &HashMap<String, String>, prefix: &str| {
        a.keys().filter(|id| id.starts_with(prefix)).count()
    };
    answer_until(&mut results, &mut answered, |a| count(a, "a-") >= 5).await;
    let pid = short.pid().unwrap();
    std::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .unwrap();
    drop(short);
    // B's jobs are all answered, by B's model; A's wait in the stream.
    answer_until(&mut results, &mut answered, |a| count(a, "b-") == B_JOBS).await;
    let a_done = count(&answered, "a-");
    assert!(
        a_done < A_JOBS,
        "A's consumer finished before it was killed"
    );
    let waiting = d.jobs_in_stream().await;
    assert!(
        waiting >= (A_JOBS - a_done) as u64,
        "{waiting} in the stream, {a_done} of A done"
    );
    // A killed consumer drops out of the list once its heartbeat is
    // missed (the bucket's max age), while A's jobs wait for a new one.
    let gone = sluice_tests::read_until(T, || live(&d, SHORT), |&n| n == 0).await;
    assert_eq!(gone, 0);
    assert_eq!(live(&d, MINILM).await, 1);
    let listed = listed_models(&base).await;
    assert_eq!(listed[SHORT], (false, 0), "{listed:?}");
    assert_eq!(listed[MINILM], (true, 1), "{listed:?}");
    let (a_waiting, a_consumers) = watched(&d, SHORT).await;
    assert_eq!(a_consumers, 0);
    assert!(
        a_waiting >= (A_JOBS - a_done) as u64,
        "watch shows {a_waiting} of A waiting, {a_done} of A done"
    );
    assert_eq!(watched(&d, MINILM).await, (0, 1));
    // A's consumer is back: A's jobs run, redelivered ones included.
    let mut short = d.spawn_consumer(&short_args).await.unwrap();
    assert_eq!(listed_models(&base).await[SHORT], (true, 1));
    let drained = sluice_tests::read_until(T, || d.jobs_in_stream(), |&n| n == 0).await;
    assert_eq!(drained, 0, "A's jobs did not drain:\n{}", short.log_tail());
    // Every result seen came from the job's own model. A job killed after
    // its status was finished but before its result went out is acked on
    // redelivery without a second answer: its status record is the answer.
    while let Ok(Ok(r)) =
        tokio::time::timeout(Duration::from_millis(500), results.next_result()).await
    {
        answered.insert(r.job_id.unwrap(), r.served_by.unwrap().model);
    }
    for (id, model) in &answered {
        let want = if id.starts_with("a-") { SHORT } else { MINILM };
        assert_eq!(model, want, "{id}");
    }
    for i in 0..A_JOBS + B_JOBS {
        let id = match i % 4 {
            3 => format!("b-{i}"),
            _ => format!("a-{i}"),
        };
        let status = d.producer.status(&id).await.unwrap().unwrap();
        assert_eq!(
            status.state,
            sluice_schemas::JobState::Done,
            "{id}: {status:?}"
        );
    }
    assert_eq!(d.dead_letters().await, 0);
    // A consumer that stops cleanly removes its record at once.
    let status = short.terminate(Duration::from_secs(30));
    assert!(status.is_some_and(|s| s.success()), "{status:?}");
    assert_eq!(live(&d, SHORT).await, 0);
    minilm.shutdown(Duration::from_secs(10)).await.unwrap();
    assert_eq!(live(&d, MINILM).await, 0);
    gateway.stop();
}
