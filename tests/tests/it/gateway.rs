//! `sluice-gateway`, OpenAI's Files and Batches APIs over the queue, driven
//! the way users drive OpenAI: by the official `openai` SDK (Python, from
//! PyPI) for the whole path, and by plain HTTP for the error cases, against
//! real consumers, NATS and S3.

use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::time::{Duration, Instant};

use base64::Engine;
use serde_json::{Value, json};
use sluice_schemas::JobState;
use sluice_tests::api::Api;
use sluice_tests::deploy::Deployment;
use sluice_tests::fixtures::{
    classifier_family, cosine, minilm_reference, ranking, reranker_family,
};
use sluice_tests::repo_root;

const KEY_A: &str = "sk-team-a-0123456789";
const KEY_B: &str = "sk-team-b-0123456789";
const KEYS: &str = "team-a:sk-team-a-0123456789,team-b:sk-team-b-0123456789";

fn embed_line(id: &str, input: Value, base64: bool) -> Value {
    let mut body = json!({"model": "all-minilm-l6-v2", "input": input});
    if base64 {
        body["encoding_format"] = json!("base64");
    }
    json!({"custom_id": id, "method": "POST", "url": "/v1/embeddings", "body": body})
}

fn chat_line(id: &str, question: &str) -> Value {
    json!({"custom_id": id, "method": "POST", "url": "/v1/chat/completions", "body": {
        "model": "smollm2-135m-instruct",
        "messages": [{"role": "user", "content": question}],
        "max_tokens": 8, "temperature": 0,
    }})
}

fn to_jsonl(lines: &[Value]) -> Vec<u8> {
    let mut out = Vec::new();
    for l in lines {
        out.extend(serde_json::to_vec(l).unwrap());
        out.push(b'\n');
    }
    out
}

fn read_jsonl(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// The vectors of an embeddings response body, float or base64.
fn vectors(body: &Value) -> Vec<Vec<f32>> {
    body["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| match &d["embedding"] {
            Value::String(b64) => base64::engine::general_purpose::STANDARD
                .decode(b64)
                .unwrap()
                .chunks(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
            v => serde_json::from_value(v.clone()).unwrap(),
        })
        .collect()
}

/// docs/gateway.md's batch script (`examples/openai/batch.py`, the official SDK)
/// run against a gateway: the final batch object.
async fn run_sdk_batch(
    base_url: &str,
    key: &str,
    input: &Path,
    out: &Path,
    errors: &Path,
    window: &str,
) -> Value {
    let mut cmd = tokio::process::Command::new(repo_root().join(".sluice/pyenv/bin/python"));
    cmd.arg(repo_root().join("examples/openai/batch.py"))
        .arg(input)
        .arg(out)
        .arg(errors)
        .arg(format!("--window={window}"));
    run_example(cmd, base_url, key).await
}

/// Runs an SDK example with the gateway's URL and a key: its last line of
/// output, the final batch object.
async fn run_example(mut cmd: tokio::process::Command, base_url: &str, key: &str) -> Value {
    cmd.env("OPENAI_BASE_URL", base_url)
        .env("OPENAI_API_KEY", key);
    let stdout = run_ok(cmd, "the batch").await;
    serde_json::from_str(stdout.trim().lines().last().unwrap_or_default()).unwrap()
}

/// Runs `cmd` to its end (at most 300 s), checks that it succeeded, and
/// returns its output.
async fn run_ok(mut cmd: tokio::process::Command, what: &str) -> String {
    let run = cmd.kill_on_drop(true).output();
    let run = tokio::time::timeout(Duration::from_secs(300), run)
        .await
        .unwrap_or_else(|_| panic!("{what} ran past 300 s"))
        .unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout).to_string();
    assert!(
        run.status.success(),
        "{what}: {}\n{stdout}\n{}",
        run.status,
        String::from_utf8_lossy(&run.stderr)
    );
    stdout
}

/// The official Node SDK (`examples/node/batch.mjs`) runs a small batch the
/// same way: every line answered, the vectors sentence-transformers'. Then
/// docs/gateway.md's Python snippet runs the same lines.
#[tokio::test]
async fn the_openai_node_sdk_and_the_readme_snippet_run_a_small_batch_on_sluice() {
    let d = Deployment::start().await.unwrap();
    let _embed = d.start_consumer(&[]).await.unwrap();
    let gateway = d.start_gateway(KEYS, &[]).await.unwrap();
    let reference = minilm_reference().unwrap();
    let lines: Vec<Value> = reference
        .items
        .iter()
        .enumerate()
        .map(|(i, item)| embed_line(&format!("n{i}"), json!(item.text), i % 2 == 0))
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let (input, out) = (dir.path().join("in.jsonl"), dir.path().join("out.jsonl"));
    std::fs::write(&input, to_jsonl(&lines)).unwrap();
    let mut cmd = tokio::process::Command::new("node");
    cmd.arg(repo_root().join("examples/node/batch.mjs"))
        .arg(&input)
        .arg(&out);
    let batch = run_example(cmd, &format!("http://{}/v1", gateway.addr), KEY_A).await;
    assert_eq!(batch["status"], "completed", "{batch}");
    let n = reference.items.len() as u64;
    assert_eq!(
        batch["request_counts"],
        json!({"total": n, "completed": n, "failed": 0})
    );
    let output = read_jsonl(&out);
    assert_eq!(output.len(), reference.items.len());
    for l in &output {
        let i: usize = l["custom_id"].as_str().unwrap()[1..].parse().unwrap();
        let v = &vectors(&l["response"]["body"])[0];
        let c = cosine(v, &reference.items[i].embedding);
        assert!(c >= 0.999, "n{i}: cosine {c}");
    }

    // docs/gateway.md's Python snippet, as written but for its URL and key, on
    // the same lines: it leaves every answer in output.jsonl.
    let snippet = readme_snippet(&format!("http://{}/v1", gateway.addr), KEY_A);
    let cwd = tempfile::tempdir().unwrap();
    std::fs::write(cwd.path().join("requests.jsonl"), to_jsonl(&lines)).unwrap();
    let mut cmd = tokio::process::Command::new(repo_root().join(".sluice/pyenv/bin/python"));
    cmd.arg("-c").arg(&snippet).current_dir(cwd.path());
    run_ok(cmd, &format!("the docs/gateway.md snippet\n{snippet}\n")).await;
    let output = read_jsonl(&cwd.path().join("output.jsonl"));
    let answered: HashSet<&str> = output
        .iter()
        .map(|l| l["custom_id"].as_str().unwrap())
        .collect();
    assert_eq!(answered.len(), reference.items.len());
    assert_eq!(output.len(), reference.items.len());
    gateway.stop();
}

/// The Python snippet of docs/gateway.md's "Run your OpenAI batch files on
/// sluice", its base URL and key replaced by these.
fn readme_snippet(base_url: &str, key: &str) -> String {
    let readme = std::fs::read_to_string(repo_root().join("docs/gateway.md")).unwrap();
    let section = readme
        .split("## Run your OpenAI batch files on sluice")
        .nth(1)
        .expect("docs/gateway.md has no section \"Run your OpenAI batch files on sluice\"");
    let code = section
        .split("```python\n")
        .nth(1)
        .and_then(|s| s.split("```").next())
        .expect("the section has no Python snippet");
    let (url, readme_key) = ("http://127.0.0.1:8080/v1", "sk-my-team-key-1234");
    assert!(
        code.contains(url) && code.contains(readme_key),
        "the snippet no longer uses {url} and {readme_key}:\n{code}"
    );
    code.replace(url, base_url).replace(readme_key, key)
}

/// The acceptance path of issue #18: a file of embedding and chat lines,
/// uploaded, run and downloaded by the official SDK. Every custom_id is
/// answered once; the vectors equal the offline command's (cosine >= 0.9999)
/// and sentence-transformers' (>= 0.999); chat answers
/// carry usage; the two lines that cannot run fail alone.
#[tokio::test]
async fn the_openai_sdk_runs_a_batch_of_embeddings_and_chats_on_sluice() {
    let d = Deployment::start().await.unwrap();
    let _embed = d.start_consumer(&[]).await.unwrap();
    let _generate = d
        .start_consumer(&[
            "--task=generate",
            "--max-new-tokens=16",
            "--max-prompt-tokens=256",
            "--max-items-per-job=32",
        ])
        .await
        .unwrap();
    let gateway = d.start_gateway(KEYS, &[]).await.unwrap();
    let reference = minilm_reference().unwrap();
    let texts: Vec<&str> = reference.items.iter().map(|i| i.text.as_str()).collect();
    let n = texts.len();

    let mut lines = Vec::new();
    // Which reference texts each embedding line asks for.
    let mut asked: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    for i in 0..1000 {
        let id = format!("emb-{i}");
        let picks: Vec<usize> = if i % 7 == 0 {
            vec![i % n, (i + 1) % n]
        } else {
            vec![i % n]
        };
        let input = if picks.len() == 1 && i % 2 == 0 {
            json!(texts[picks[0]])
        } else {
            json!(picks.iter().map(|&p| texts[p]).collect::<Vec<_>>())
        };
        lines.push(embed_line(&id, input, i % 3 == 0));
        asked.insert(id, picks);
        if i == 500 {
            // Lines that cannot run, in the middle: they fail alone.
            lines.push(
                json!({"custom_id": "unknown-model", "method": "POST", "url": "/v1/embeddings",
                "body": {"model": "text-embedding-3-small", "input": "x"}}),
            );
            lines.push(
                json!({"custom_id": "with-dimensions", "method": "POST", "url": "/v1/embeddings",
                "body": {"model": "all-minilm-l6-v2", "input": "x", "dimensions": 128}}),
            );
        }
    }
    for j in 0..20 {
        lines.push(chat_line(
            &format!("chat-{j}"),
            &format!("What is {j} plus {j}?"),
        ));
    }
    lines.push(json!({"custom_id": "completion-0", "method": "POST", "url": "/v1/completions",
        "body": {"model": "smollm2-135m-instruct", "prompt": "The capital of France is", "max_tokens": 4}}));

    let dir = tempfile::tempdir().unwrap();
    let (input, out, errors) = (
        dir.path().join("in.jsonl"),
        dir.path().join("out.jsonl"),
        dir.path().join("err.jsonl"),
    );
    std::fs::write(&input, to_jsonl(&lines)).unwrap();
    let base = format!("http://{}/v1", gateway.addr);
    let batch = run_sdk_batch(&base, KEY_A, &input, &out, &errors, "24h").await;

    let output = read_jsonl(&out);
    let failed = read_jsonl(&errors);
    let offline = sluice_tests::offline_vectors(&texts).await;
    assert_eq!(batch["status"], "completed", "{batch}");
    assert_eq!(
        batch["request_counts"],
        json!({"total": 1023, "completed": 1021, "failed": 2}),
        "{batch}\nfirst errors: {:?}",
        &failed[..failed.len().min(4)]
    );
    assert_eq!(batch["metadata"]["source"], "examples/openai/batch.py");
    for t in [
        "created_at",
        "in_progress_at",
        "finalizing_at",
        "completed_at",
    ] {
        assert!(batch[t].as_i64().is_some(), "{t} unset: {batch}");
    }
    let mut seen = HashSet::new();
    for l in output.iter().chain(&failed) {
        assert!(
            seen.insert(l["custom_id"].as_str().unwrap().to_string()),
            "answered twice: {l}"
        );
    }
    assert_eq!(seen.len(), 1023);
    assert_eq!(output.len(), 1021);

    let mut chats = 0;
    for l in &output {
        let id = l["custom_id"].as_str().unwrap();
        assert_eq!(l["response"]["status_code"], 200, "{l}");
        let body = &l["response"]["body"];
        if let Some(picks) = asked.get(id) {
            assert_eq!(body["object"], "list");
            assert_eq!(body["model"], "all-minilm-l6-v2");
            let vs = vectors(body);
            assert_eq!(vs.len(), picks.len(), "{id}");
            for (v, &p) in vs.iter().zip(picks) {
                let c = cosine(v, &reference.items[p].embedding);
                assert!(c >= 0.999, "{id}: cosine {c} to sentence-transformers");
                let c = cosine(v, &offline[p]);
                assert!(c >= 0.9999, "{id}: cosine {c} to sluice-consumer embed");
            }
            let expected: usize = picks
                .iter()
                .map(|&p| reference.items[p].tokens_untruncated.min(256))
                .sum();
            assert_eq!(body["usage"]["prompt_tokens"], expected as u64, "{id}");
        } else if id.starts_with("chat-") {
            chats += 1;
            assert_eq!(body["object"], "chat.completion");
            let choice = &body["choices"][0];
            assert_eq!(choice["message"]["role"], "assistant");
            assert!(["stop", "length"].contains(&choice["finish_reason"].as_str().unwrap()));
            let usage = &body["usage"];
            assert!(usage["prompt_tokens"].as_u64().unwrap() > 0, "{body}");
            let completion = usage["completion_tokens"].as_u64().unwrap();
            assert!((1..=8).contains(&completion), "{body}");
            assert_eq!(
                usage["total_tokens"].as_u64().unwrap(),
                usage["prompt_tokens"].as_u64().unwrap() + completion
            );
        } else {
            assert_eq!(id, "completion-0");
            assert_eq!(body["object"], "text_completion");
            assert!(body["choices"][0]["text"].as_str().is_some());
        }
    }
    assert_eq!(chats, 20);
    let by_id: BTreeMap<&str, &Value> = failed
        .iter()
        .map(|l| (l["custom_id"].as_str().unwrap(), l))
        .collect();
    let unknown = &by_id["unknown-model"]["response"];
    assert_eq!(unknown["status_code"], 404);
    assert_eq!(unknown["body"]["error"]["code"], "model_not_found");
    let dims = &by_id["with-dimensions"]["response"];
    assert_eq!(dims["status_code"], 400);
    assert_eq!(dims["body"]["error"]["param"], "dimensions");
    assert_eq!(d.jobs_in_stream_settled(0).await, 0);
    gateway.stop();
}

/// Files that are not batch files fail validation with the line and code
/// OpenAI gives; nothing is published for them. No consumer runs.
#[tokio::test]
async fn bad_batch_files_fail_validation_with_their_line_numbers() {
    let d = Deployment::start().await.unwrap();
    let gateway = d
        .start_gateway(
            KEYS,
            &[
                "--max-batch-lines=5",
                "--max-line-bytes=2000",
                "--max-file-bytes=20000",
            ],
        )
        .await
        .unwrap();
    let api = Api::new(gateway.addr);
    let good = |i: usize| embed_line(&format!("ok-{i}"), json!("a text"), false);
    let line = |v: Value| serde_json::to_vec(&v).unwrap();
    let cases: Vec<(&str, Vec<Vec<u8>>, &str, u64)> = vec![
        (
            "not JSONL",
            vec![b"this is not json".to_vec()],
            "invalid_json_line",
            1,
        ),
        (
            "no custom_id",
            vec![
                line(good(0)),
                line(json!({"method": "POST", "url": "/v1/embeddings", "body": {}})),
            ],
            "missing_required_parameter",
            2,
        ),
        (
            "duplicate custom_id",
            vec![line(good(0)), line(good(1)), line(good(0))],
            "duplicate_custom_id",
            3,
        ),
        (
            "unknown url",
            vec![line(
                json!({"custom_id": "x", "method": "POST", "url": "/v1/images/generations", "body": {}}),
            )],
            "invalid_url",
            1,
        ),
        (
            "too many lines",
            (0..6).map(|i| line(good(i))).collect(),
            "too_many_requests",
            6,
        ),
        (
            "a line over the limit",
            vec![
                line(good(0)),
                line(embed_line("big", json!("x".repeat(3000)), false)),
            ],
            "request_too_large",
            2,
        ),
    ];
    for (what, file, code, at) in cases {
        let bytes: Vec<u8> = file.join(&b'\n');
        let batch = api.batch(KEY_A, &bytes, "24h").await;
        let batch = api
            .wait(
                KEY_A,
                batch["id"].as_str().unwrap(),
                Duration::from_secs(30),
            )
            .await;
        assert_eq!(batch["status"], "failed", "{what}: {batch}");
        let errors = &batch["errors"]["data"];
        assert_eq!(errors[0]["code"], code, "{what}: {batch}");
        assert_eq!(errors[0]["line"], at, "{what}: {batch}");
        assert!(errors[0]["message"].as_str().is_some_and(|m| !m.is_empty()));
        assert!(batch["failed_at"].as_i64().is_some());
        assert_eq!(batch["output_file_id"], Value::Null);
    }
    // A file over --max-file-bytes is refused at upload, in OpenAI's shape.
    let (status, body) = api.upload(KEY_A, &vec![b'x'; 30_000]).await;
    assert_eq!(status, 413, "{body}");
    assert_eq!(body["error"]["code"], "file_too_large");
    // A batch on an endpoint the gateway does not serve is refused at once.
    let (_, file) = api.upload(KEY_A, &line(good(0))).await;
    let (status, body) = api
        .post("/batches", KEY_A, json!({"input_file_id": file["id"], "endpoint": "/v1/moderations", "completion_window": "24h"}))
        .await;
    assert_eq!(
        (status, body["error"]["param"].clone()),
        (400, json!("endpoint")),
        "{body}"
    );
    assert_eq!(d.jobs_in_stream().await, 0, "nothing was published");
    gateway.stop();
}

/// A file or batch id that is not one (issue #56: `*`, `.` and `>` reached
/// the record store and answered a retryable 503, logging an ERROR) is the
/// caller's 404, on every path that takes an id.
#[tokio::test]
async fn an_id_that_cannot_be_one_is_no_file_and_no_batch() {
    let d = Deployment::start().await.unwrap();
    let gateway = d.spawn_gateway(KEYS, &[]).await.unwrap();
    let api = Api::new(gateway.addr);
    // Characters a record key cannot hold (NATS subject tokens and
    // wildcards), an empty-looking and an over-long id: each is the
    // caller's 404 in OpenAI's shape, never a retryable 503.
    let long = "f".repeat(300);
    for id in ["a*b", "a.b", "a>b", "file-x.*", "%20", long.as_str()] {
        for path in [
            format!("/files/{id}"),
            format!("/files/{id}/content"),
            format!("/batches/{id}"),
        ] {
            let (status, body) = api.get(&path, KEY_A).await;
            assert_eq!(status, 404, "{path}: {body}");
            assert_eq!(body["error"]["code"], "not_found", "{path}: {body}");
        }
        let (status, body) = api
            .post(&format!("/batches/{id}/cancel"), KEY_A, json!({}))
            .await;
        assert_eq!(status, 404, "cancel {id}: {body}");
        let (status, body) = api
            .send(
                api.http.delete(format!("{}/files/{id}", api.base)),
                Some(KEY_A),
            )
            .await;
        assert_eq!(status, 404, "delete {id}: {body}");
    }
    let log = gateway.log();
    assert!(!log.contains("ERROR"), "an id logged an error:\n{log}");
}

/// What a client sends too much or wrongly of is the client's error in
/// OpenAI's shape (issue #56 saw retryable 503s and plain text): batch
/// metadata past its limits is 400 (or 413), a multipart body that is not
/// one 400 with a JSON error.
#[tokio::test]
async fn oversized_and_malformed_bodies_are_the_callers_errors_in_openais_shape() {
    let d = Deployment::start().await.unwrap();
    let gateway = d.spawn_gateway(KEYS, &[]).await.unwrap();
    let api = Api::new(gateway.addr);
    let metadata: serde_json::Map<String, Value> = (0..16)
        .map(|i| (format!("k{i}"), json!("v".repeat(100_000))))
        .collect();
    let (_, file) = api
        .upload(KEY_A, &to_jsonl(&[embed_line("a", json!("text"), false)]))
        .await;
    let (status, body) = api
        .post(
            "/batches",
            KEY_A,
            json!({"input_file_id": file["id"], "endpoint": "/v1/embeddings",
                   "completion_window": "24h", "metadata": metadata}),
        )
        .await;
    assert!(status == 400 || status == 413, "metadata: {status} {body}");
    assert!(body["error"]["message"].is_string(), "metadata: {body}");
    let (status, body) = api
        .send(
            api.http
                .post(format!("{}/files", api.base))
                .header("content-type", "multipart/form-data; boundary=XYZ")
                .body("--XYZ\r\nnot a part header\r\n\r\nx\r\n"),
            Some(KEY_A),
        )
        .await;
    assert_eq!(status, 400, "multipart: {body}");
    assert!(body["error"]["message"].is_string(), "multipart: {body}");
    let log = gateway.log();
    assert!(
        !log.contains("ERROR"),
        "a client's error logged an ERROR:\n{log}"
    );
}

/// A chunk job's input URL was presigned for 7 days whatever the batch's
/// window: whoever saw the job message (any NATS client, before #56's
/// roles) could read the tenant's batch input for a week. Now it lives no
/// longer than the job can run: the window's end and 5 minutes.
#[tokio::test]
async fn a_chunk_inputs_url_lives_no_longer_than_its_job_can_run() {
    let d = Deployment::start().await.unwrap();
    let gateway = d.start_gateway(KEYS, &[]).await.unwrap();
    let api = Api::new(gateway.addr);
    api.batch(
        KEY_A,
        &to_jsonl(&[embed_line("a", json!("text"), false)]),
        "24h",
    )
    .await;
    // No consumer: the chunk job waits in the stream.
    let stream = d
        .producer
        .js
        .get_stream(&d.topology.job_stream)
        .await
        .unwrap();
    let until = Instant::now() + Duration::from_secs(60);
    let job = loop {
        if let Ok(msg) = stream.get_raw_message(1).await {
            break sluice_schemas::Job::decode(&msg.payload).unwrap().job;
        }
        assert!(Instant::now() < until, "no chunk job after 60 s");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let sluice_schemas::Input::Url { url, .. } = &job.inputs[0] else {
        panic!("{:?}", job.inputs)
    };
    let expires: u64 = url
        .split(['?', '&'])
        .find_map(|p| p.strip_prefix("X-Amz-Expires="))
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        expires <= 24 * 3600 + 300,
        "the URL lives {expires} s, past its job's 24 h window"
    );
    assert!(expires >= 24 * 3600 - 60, "the URL lives {expires} s");
}

/// Each key is a tenant: another key cannot read, list or cancel the first
/// key's files and batches; no key or an unknown one gets 401.
#[tokio::test]
async fn a_key_sees_only_its_own_files_and_batches() {
    let d = Deployment::start().await.unwrap();
    let gateway = d.start_gateway(KEYS, &[]).await.unwrap();
    let api = Api::new(gateway.addr);
    let batch = api
        .batch(
            KEY_A,
            &to_jsonl(&[embed_line("a", json!("text"), false)]),
            "24h",
        )
        .await;
    let (batch_id, file_id) = (
        batch["id"].as_str().unwrap(),
        batch["input_file_id"].as_str().unwrap(),
    );

    for path in [
        format!("/files/{file_id}"),
        format!("/files/{file_id}/content"),
        format!("/batches/{batch_id}"),
    ] {
        let (status, body) = api.get(&path, KEY_B).await;
        assert_eq!(status, 404, "{path}: {body}");
        assert_eq!(body["error"]["code"], "not_found");
        assert_eq!(api.get(&path, KEY_A).await.0, 200, "{path}");
    }
    let (status, _) = api
        .post(&format!("/batches/{batch_id}/cancel"), KEY_B, json!({}))
        .await;
    assert_eq!(status, 404);
    let (_, files) = api.get("/files", KEY_B).await;
    assert_eq!(files["data"], json!([]));
    let (_, batches) = api.get("/batches", KEY_B).await;
    assert_eq!(batches["data"], json!([]));
    let (_, files) = api.get("/files", KEY_A).await;
    assert_eq!(files["data"][0]["id"], file_id);
    let (_, batches) = api.get("/batches", KEY_A).await;
    assert_eq!(batches["data"][0]["id"], batch_id);

    let (status, body) = api
        .send(api.http.get(format!("{}/files", api.base)), None)
        .await;
    assert_eq!(
        (status, body["error"]["code"].clone()),
        (401, json!("invalid_api_key")),
        "{body}"
    );
    let (status, body) = api.get("/batches", "sk-not-a-key-at-all").await;
    assert_eq!(
        (status, body["error"]["code"].clone()),
        (401, json!("invalid_api_key")),
        "{body}"
    );
    gateway.stop();
}

/// With no consumer running: a batch whose window ends expires, and a
/// cancelled one is cancelled, each with every line in its error file
/// (`batch_expired`, `batch_cancelled`); a consumer started afterwards runs
/// none of their chunks.
#[tokio::test]
async fn expired_and_cancelled_batches_answer_every_line_and_run_nothing() {
    let d = Deployment::start().await.unwrap();
    let gateway = d.start_gateway(KEYS, &["--chunk-lines=10"]).await.unwrap();
    let api = Api::new(gateway.addr);
    let file: Vec<Value> = (0..25)
        .map(|i| embed_line(&format!("l{i}"), json!("some text"), false))
        .collect();

    let expiring = api.batch(KEY_A, &to_jsonl(&file), "2s").await;
    let cancelled = api.batch(KEY_A, &to_jsonl(&file), "24h").await;
    let cancelled_id = cancelled["id"].as_str().unwrap();
    // Cancel once its chunks are published (in_progress).
    let until = Instant::now() + Duration::from_secs(30);
    while api.get(&format!("/batches/{cancelled_id}"), KEY_A).await.1["status"] != "in_progress" {
        assert!(Instant::now() < until);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (status, body) = api
        .post(&format!("/batches/{cancelled_id}/cancel"), KEY_A, json!({}))
        .await;
    assert_eq!(
        (status, body["status"].clone()),
        (200, json!("cancelling")),
        "{body}"
    );

    for (batch, status, code) in [
        (&expiring, "expired", "batch_expired"),
        (&cancelled, "cancelled", "batch_cancelled"),
    ] {
        let b = api
            .wait(
                KEY_A,
                batch["id"].as_str().unwrap(),
                Duration::from_secs(60),
            )
            .await;
        assert_eq!(b["status"], status, "{b}");
        assert_eq!(
            b["request_counts"],
            json!({"total": 25, "completed": 0, "failed": 25}),
            "{b}"
        );
        assert_eq!(b["output_file_id"], Value::Null, "{b}");
        let lines = api.content(KEY_A, &b["error_file_id"]).await;
        let ids: HashSet<&str> = lines
            .iter()
            .map(|l| l["custom_id"].as_str().unwrap())
            .collect();
        assert_eq!(ids.len(), 25);
        assert!(
            lines
                .iter()
                .all(|l| l["error"]["code"] == code && l["response"].is_null()),
            "{lines:?}"
        );
    }
    // The expired batch's jobs left the stream at its deadline (their
    // Nats-TTL) and read `expired`; the cancelled batch's wait in the stream,
    // cancelled: a consumer acks them without running them.
    let _consumer = d.start_consumer(&[]).await.unwrap();
    assert_eq!(d.jobs_in_stream_settled(0).await, 0);
    for (batch, state) in [
        (&expiring, JobState::Expired),
        (&cancelled, JobState::Cancelled),
    ] {
        for c in 0..3 {
            let job = format!("{}-e{c}", batch["id"].as_str().unwrap());
            // The gateway publishes as the key's tenant: the record is
            // team-a's.
            let record = d
                .producer
                .status_in(Some("team-a"), &job)
                .await
                .unwrap()
                .unwrap();
            assert_eq!(record.state, state, "{job}");
        }
    }

    // Retry what failed: a batch of only the expired batch's failed lines.
    let (status, retry) = api
        .post(
            "/batches",
            KEY_A,
            json!({"input_file_id": expiring["input_file_id"], "endpoint": "/v1/embeddings",
                   "completion_window": "24h", "metadata": {"retry_failed_of": expiring["id"]}}),
        )
        .await;
    assert_eq!(status, 200, "{retry}");
    assert_ne!(retry["input_file_id"], expiring["input_file_id"]);
    let retry = api
        .wait(
            KEY_A,
            retry["id"].as_str().unwrap(),
            Duration::from_secs(120),
        )
        .await;
    assert_eq!(retry["status"], "completed", "{retry}");
    assert_eq!(
        retry["request_counts"],
        json!({"total": 25, "completed": 25, "failed": 0}),
        "{retry}"
    );
    // The same from the CLI, for the cancelled batch: `sluice batch
    // retry-failed`, then `sluice batch show` once it has run.
    let url = format!("http://{}/v1", gateway.addr);
    let run = batch_cli(
        &d,
        &url,
        &[
            "--json",
            "batch",
            "retry-failed",
            cancelled_id,
            "--api-key",
            KEY_A,
        ],
    )
    .await;
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let retry: Value = serde_json::from_str(run.stdout.trim()).unwrap();
    assert_eq!(retry["metadata"]["retry_failed_of"], cancelled["id"]);
    let retry_id = retry["id"].as_str().unwrap();
    let done = api.wait(KEY_A, retry_id, Duration::from_secs(120)).await;
    assert_eq!(done["status"], "completed", "{done}");
    let run = batch_cli(&d, &url, &["batch", "show", retry_id, "--api-key", KEY_A]).await;
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert!(
        run.stdout.starts_with(&format!(
            "{retry_id}: completed (25 lines: 25 completed, 0 failed); output file-"
        )),
        "{}",
        run.stdout
    );
    // Errors the user sees: another tenant's batch is no batch (exit 3), an
    // unknown key is refused (exit 2), and so is a window over 7 days.
    let run = batch_cli(
        &d,
        &url,
        &["batch", "retry-failed", cancelled_id, "--api-key", KEY_B],
    )
    .await;
    assert_eq!(run.code, Some(3), "{}", run.stderr);
    assert!(run.stderr.contains("No such batch"), "{}", run.stderr);
    let run = batch_cli(
        &d,
        &url,
        &["batch", "show", retry_id, "--api-key", "sk-nobody"],
    )
    .await;
    assert_eq!(run.code, Some(2), "{}", run.stderr);
    assert!(
        run.stderr.contains("401, invalid_api_key"),
        "{}",
        run.stderr
    );
    let run = batch_cli(&d, &url, &["batch", "show", retry_id]).await;
    assert_eq!(run.code, Some(2), "{}", run.stderr);
    assert!(run.stderr.contains("no API key"), "{}", run.stderr);
    let run = batch_cli(
        &d,
        &url,
        &[
            "batch",
            "retry-failed",
            cancelled_id,
            "--completion-window",
            "9d",
            "--api-key",
            KEY_A,
        ],
    )
    .await;
    assert_eq!(run.code, Some(2), "{}", run.stderr);
    assert!(run.stderr.contains("at most 7 days"), "{}", run.stderr);

    // Only a final batch, with its own input file, can be retried.
    let (status, body) = api
        .post(
            "/batches",
            KEY_A,
            json!({"input_file_id": retry["input_file_id"], "endpoint": "/v1/embeddings",
                   "completion_window": "24h", "metadata": {"retry_failed_of": expiring["id"]}}),
        )
        .await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("input file"),
        "{body}"
    );
    gateway.stop();
}

/// `sluice ARGS --gateway-url URL`.
async fn batch_cli(d: &Deployment, url: &str, args: &[&str]) -> sluice_tests::deploy::CliRun {
    let mut all = args.to_vec();
    all.extend(["--gateway-url", url]);
    d.cli(&all, None, Duration::from_secs(60)).await
}

/// Faults (issue #18): SIGKILL the gateway and one of two consumers in the
/// middle of a 5,000-line batch, then start another gateway. The batch
/// still completes, every line answered exactly once: everything the first
/// gateway knew was in NATS and S3.
#[tokio::test]
async fn a_batch_survives_sigkill_of_its_gateway_and_a_consumer() {
    let settings = sluice_producer::provision::Settings {
        max_deliver: 100,
        ack_wait: Duration::from_secs(10),
        ..Default::default()
    };
    let d = Deployment::start_with(settings).await.unwrap();
    let consumer_args = ["--progress-interval-secs=3"];
    let mut doomed = d.spawn_consumer(&consumer_args).await.unwrap();
    let _survivor = d.spawn_consumer(&consumer_args).await.unwrap();
    let gateway_args = ["--chunk-lines=100", "--lease-secs=3"];
    let first = d.spawn_gateway(KEYS, &gateway_args).await.unwrap();
    let api = Api::new(first.addr);
    let reference = minilm_reference().unwrap();
    let lines: Vec<Value> = (0..5000)
        .map(|i| {
            let text = &reference.items[i % reference.items.len()].text;
            embed_line(&format!("line-{i}"), json!(format!("{i}: {text}")), false)
        })
        .collect();
    let batch = api.batch(KEY_A, &to_jsonl(&lines), "24h").await;
    let id = batch["id"].as_str().unwrap().to_string();

    // Mid-run: chunks done, chunks left.
    let until = Instant::now() + Duration::from_secs(300);
    loop {
        let (_, b) = api.get(&format!("/batches/{id}"), KEY_A).await;
        let done = b["request_counts"]["completed"].as_u64().unwrap_or(0);
        if done >= 500 {
            assert!(
                done < 4000,
                "the batch ran too fast to kill it mid-run: {b}"
            );
            break;
        }
        assert!(Instant::now() < until, "no progress: {b}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for (what, pid) in [("gateway", first.pid()), ("consumer", doomed.pid())] {
        let pid = pid.unwrap().to_string();
        std::process::Command::new("kill")
            .args(["-KILL", &pid])
            .status()
            .unwrap();
        eprintln!("killed the {what} ({pid})");
    }
    drop(first);
    let _ = doomed.terminate(Duration::from_secs(1));

    let second = d.start_gateway(KEYS, &gateway_args).await.unwrap();
    let api = Api::new(second.addr);
    let b = api.wait(KEY_A, &id, Duration::from_secs(600)).await;
    assert_eq!(b["status"], "completed", "{b}");
    assert_eq!(
        b["request_counts"],
        json!({"total": 5000, "completed": 5000, "failed": 0}),
        "{b}"
    );
    let output = api.content(KEY_A, &b["output_file_id"]).await;
    let mut seen = HashSet::new();
    for l in &output {
        assert!(
            seen.insert(l["custom_id"].as_str().unwrap().to_string()),
            "answered twice: {}",
            l["custom_id"]
        );
        assert_eq!(l["response"]["status_code"], 200);
        assert_eq!(vectors(&l["response"]["body"])[0].len(), 384);
    }
    assert_eq!(seen.len(), 5000);
    assert_eq!(d.jobs_in_stream_settled(0).await, 0);
    second.stop();
}

/// Traces (issue #18): a batch is one trace. Its create request's server
/// span continues the caller's `traceparent`; the driver's validate and
/// finalize spans, the batch's own span and every chunk job's `sluice.job`
/// span on the consumer are its children, exported over OTLP by both. The
/// gateway's metrics are pushed over OTLP too.
#[tokio::test]
async fn a_batch_is_one_trace_from_its_create_request_to_its_chunk_jobs() {
    const TRACE_ID: &str = "6e0c63257de34c926f9efcd03927272e";
    const CALLER_SPAN: &str = "1f2e3d4c5b6a7988";
    let receiver = sluice_tests::otlp::OtlpReceiver::start().await.unwrap();
    let otlp = [
        format!("--otlp-endpoint={}", receiver.endpoint),
        "--otlp-protocol=http/json".to_string(),
    ];
    let d = Deployment::start().await.unwrap();
    let consumer = d
        .start_consumer(&[otlp[0].as_str(), otlp[1].as_str()])
        .await
        .unwrap();
    let gateway = d
        .start_gateway(
            KEYS,
            &[otlp[0].as_str(), otlp[1].as_str(), "--chunk-lines=3"],
        )
        .await
        .unwrap();
    let api = Api::new(gateway.addr);
    let lines: Vec<Value> = (0..7)
        .map(|i| embed_line(&format!("t{i}"), json!(format!("traced text {i}")), false))
        .collect();
    let (status, file) = api.upload(KEY_A, &to_jsonl(&lines)).await;
    assert_eq!(status, 200, "{file}");
    let create = api
        .http
        .post(format!("{}/batches", api.base))
        .header("content-type", "application/json")
        .header("traceparent", format!("00-{TRACE_ID}-{CALLER_SPAN}-01"))
        .body(
            json!({"input_file_id": file["id"], "endpoint": "/v1/embeddings",
                   "completion_window": "24h"})
            .to_string(),
        );
    let (status, batch) = api.send(create, Some(KEY_A)).await;
    assert_eq!(status, 200, "{batch}");
    let id = batch["id"].as_str().unwrap();
    let done = api.wait(KEY_A, id, Duration::from_secs(120)).await;
    assert_eq!(done["status"], "completed", "{done}");
    // Shutting down flushes what each batch exporter still holds.
    gateway.shutdown().await;
    consumer.shutdown(Duration::from_secs(10)).await.unwrap();

    let spans = receiver.spans();
    let in_trace: Vec<_> = spans.iter().filter(|s| s.trace_id == TRACE_ID).collect();
    let create = in_trace
        .iter()
        .find(|s| s.name == "POST /v1/batches")
        .unwrap_or_else(|| panic!("no create span in the caller's trace: {spans:#?}"));
    assert_eq!(create.parent_span_id, CALLER_SPAN);
    assert_eq!(create.service_name, "sluice-gateway");
    let attributes = create.attributes.to_string();
    assert!(
        attributes.contains("http.response.status_code"),
        "{attributes}"
    );
    let children: Vec<_> = in_trace
        .iter()
        .filter(|s| s.parent_span_id == create.span_id)
        .collect();
    let named = |name: &str| children.iter().filter(|s| s.name == name).count();
    assert_eq!(named("sluice.openai_batch.validate"), 1, "{children:#?}");
    assert_eq!(named("sluice.openai_batch.finalize"), 1, "{children:#?}");
    let whole = children
        .iter()
        .find(|s| s.name == "sluice.openai_batch")
        .unwrap_or_else(|| panic!("no batch span: {children:#?}"));
    let attributes = whole.attributes.to_string();
    assert!(
        attributes.contains(id) && attributes.contains("completed"),
        "{attributes}"
    );
    // Three chunks of at most 3 lines: three jobs, each in the batch's trace.
    let jobs: Vec<_> = children
        .iter()
        .filter(|s| s.name == "sluice.job" && s.service_name == "sluice-consumer")
        .collect();
    assert_eq!(jobs.len(), 3, "{children:#?}");
    for c in 0..3 {
        let chunk = format!("{id}-e{c}");
        assert!(
            jobs.iter()
                .any(|s| s.attributes.to_string().contains(&chunk)),
            "no job span for {chunk}: {jobs:#?}"
        );
    }
    // Other requests are spans of their own, named by their route.
    assert!(
        spans
            .iter()
            .any(|s| s.name == "GET /v1/batches/{id}" && s.service_name == "sluice-gateway"),
        "no span for the polls"
    );

    // The gateway's metrics went out over OTLP too (pushed once more on
    // shutdown), named as on /metrics without `_total`.
    let ended = receiver
        .metric("sluice_gateway_batches_ended")
        .unwrap_or_else(|| panic!("no sluice_gateway_batches_ended metric exported"));
    assert_eq!(
        ended.value(Some(("status", "completed"))),
        Some(1.0),
        "{ended:?}"
    );
    let lines = receiver.metric("sluice_gateway_lines").unwrap();
    assert_eq!(
        lines.value(Some(("outcome", "completed"))),
        Some(7.0),
        "{lines:?}"
    );
    let created = receiver.metric("sluice_gateway_batches_created").unwrap();
    assert_eq!(created.value(None), Some(1.0), "{created:?}");
    let requests = receiver.metric("sluice_gateway_requests").unwrap();
    assert_eq!(
        requests.value(Some(("route", "/v1/batches"))),
        Some(1.0),
        "{requests:?}"
    );
    let finalize = receiver.metric("sluice_gateway_finalize_seconds").unwrap();
    assert_eq!(finalize.value(None), Some(1.0), "{finalize:?}");
}

/// deploy/nats/permissions.conf as shipped: a gateway with only the gateway
/// role's permissions (and a consumer with the consumer's) validates,
/// publishes, follows, cancels, lists and finalizes batches, and the server
/// refuses neither of them anything on the way; a client of another role
/// listening on every inbox hears none of the gateway's online answers.
#[tokio::test]
async fn the_shipped_permissions_let_the_gateway_run_and_cancel_batches() {
    let servers = sluice_tests::Servers::start_shipped().await.unwrap();
    let as_gateway = sluice_tests::deploy::role_args("gateway");
    let as_gateway: Vec<&str> = as_gateway.iter().map(String::as_str).collect();
    let as_consumer = sluice_tests::deploy::role_args("consumer");
    let as_consumer: Vec<&str> = as_consumer.iter().map(String::as_str).collect();
    let admin = sluice_connect::NatsAuth {
        nats_user: Some("admin".into()),
        nats_password: Some(sluice_schemas::Secret::new(sluice_tests::ROLE_PASSWORD)),
        ..Default::default()
    };
    // `sluice init` as admin, with the standard names the file is written for.
    let d = Deployment::start_named(servers, Vec::new(), admin, Default::default(), "")
        .await
        .unwrap();
    let gateway = d
        .start_gateway(KEYS, &[&as_gateway[..], &["--chunk-lines=4"]].concat())
        .await
        .unwrap();
    let api = Api::new(gateway.addr);
    let lines: Vec<Value> = (0..10)
        .map(|i| {
            embed_line(
                &format!("p{i}"),
                json!(format!("permitted text {i}")),
                false,
            )
        })
        .collect();

    // With no consumer yet, a batch's chunks wait in the stream: cancel it.
    let waiting = api.batch(KEY_A, &to_jsonl(&lines), "24h").await;
    let waiting_id = waiting["id"].as_str().unwrap();
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, b) = api.get(&format!("/batches/{waiting_id}"), KEY_A).await;
        if b["status"] == "in_progress" {
            break;
        }
        assert!(Instant::now() < until, "never in progress: {b}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (status, body) = api
        .post(&format!("/batches/{waiting_id}/cancel"), KEY_A, json!({}))
        .await;
    assert_eq!(status, 200, "{body}");
    let cancelled = api.wait(KEY_A, waiting_id, Duration::from_secs(60)).await;
    assert_eq!(cancelled["status"], "cancelled", "{cancelled}");
    assert_eq!(
        cancelled["request_counts"],
        json!({"total": 10, "completed": 0, "failed": 10})
    );

    // The attack: another role's client listens on every inbox and every
    // default result subject and every streamed text while team A's batch
    // runs (its chunk jobs' results name their output objects) and its
    // online request is
    // answered. Each role reads only its own prefix, and no publisher reads
    // the default result subjects: the snoop is refused and hears nothing.
    let publisher = sluice_connect::NatsAuth {
        nats_user: Some("publisher".into()),
        nats_password: Some(sluice_schemas::Secret::new(sluice_tests::ROLE_PASSWORD)),
        ..Default::default()
    };
    let snoop = sluice_connect::connect_nats(
        &d.servers.nats.url(),
        &publisher,
        "snoop",
        false,
        Duration::from_secs(10),
    )
    .await
    .unwrap();
    let mut heard = Vec::new();
    for subject in [
        "_INBOX.>",
        "_INBOX_gateway.>",
        "sluice.results.>",
        "sluice.stream.>",
    ] {
        heard.push(snoop.subscribe(subject).await.unwrap());
    }
    snoop.flush().await.unwrap();

    // A consumer with its own role runs the next one to the end.
    let consumer = d
        .start_consumer(
            &[
                &as_consumer[..],
                // Chunk outputs to S3: written with the consumer's
                // identity, read and removed with the gateway's.
                &["--inline-output-max-bytes=0"],
            ]
            .concat(),
        )
        .await
        .unwrap();
    let run = api.batch(KEY_A, &to_jsonl(&lines), "24h").await;
    let done = api
        .wait(KEY_A, run["id"].as_str().unwrap(), Duration::from_secs(120))
        .await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(
        done["request_counts"],
        json!({"total": 10, "completed": 10, "failed": 0})
    );
    assert_eq!(api.content(KEY_A, &done["output_file_id"]).await.len(), 10);
    let (status, body) = api
        .post(
            "/embeddings",
            KEY_A,
            json!({"model": "all-minilm-l6-v2", "input": "team A's private text"}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    for mut sub in heard {
        let got =
            tokio::time::timeout(Duration::from_secs(1), futures::StreamExt::next(&mut sub)).await;
        assert!(
            !matches!(got, Ok(Some(_))),
            "another role read team A's answer: {:?}",
            got.ok().flatten().map(|m| m.subject)
        );
    }
    drop(snoop);
    // Nor does another role's S3 identity read team A's batch files (input
    // and output), which only the gateway's reaches.
    for file in [&run["input_file_id"], &done["output_file_id"]] {
        let key = format!("gateway/files/{}", file.as_str().unwrap());
        assert!(d.read_object(&key).await.is_ok(), "{key} is there");
        for role in ["publisher", "consumer"] {
            assert!(d.role_reads(role, &key).await.is_err(), "{role} read {key}");
        }
    }

    let (status, list) = api.get("/batches", KEY_A).await;
    assert_eq!(status, 200, "{list}");
    assert_eq!(list["data"].as_array().map(Vec::len), Some(2), "{list}");
    gateway.stop();
    consumer.shutdown(Duration::from_secs(10)).await.unwrap();
    // The snoop's four subscriptions were refused; nothing else was: each
    // refusal of a role's own work costs it a timeout.
    let refused = d.servers.nats.permission_violations();
    let snooped = |l: &String| l.contains("user:publisher") && l.contains("Subscription Violation");
    assert_eq!(
        refused.iter().filter(|l| snooped(l)).count(),
        4,
        "the snoop's subscriptions were refused:\n{}",
        refused.join("\n")
    );
    let others: Vec<&String> = refused.iter().filter(|l| !snooped(l)).collect();
    assert!(
        others.is_empty(),
        "the shipped permissions refused the gateway or the consumer:\n{others:?}"
    );
}

/// The rerank API (vLLM's, llama-server's, Jina's and Cohere's shape) over
/// the queue, on the random-weight XLM-RoBERTa reranker served as
/// `xlm-reranker`: `POST /v1/rerank` answers the documents best first with
/// the scores a rerank job of the same pairs gets (which
/// `rerank::rerank_jobs_score_pairs_as_sentence_transformers...` holds to
/// sentence-transformers), `top_n` of them, with their texts when asked;
/// bad requests get OpenAI's error shape naming the field; `/v1/rerank`
/// batch lines are answered in the same shape, a line naming an undeployed
/// model failing alone.
#[tokio::test]
async fn the_gateway_ranks_documents_online_and_in_a_batch() {
    let d = Deployment::start().await.unwrap();
    let (dir, reference) = reranker_family("xlm-roberta-reranker").unwrap();
    let _rerank = d
        .start_consumer_of(&dir, &["--task=rerank", "--model-name=xlm-reranker"])
        .await
        .unwrap();
    let gateway = d
        .start_gateway(KEYS, &["--rerank-models=xlm-reranker"])
        .await
        .unwrap();
    let api = Api::new(gateway.addr);
    let query = reference.pairs[1].0.clone();
    let documents: Vec<String> = reference.pairs.iter().map(|p| p.1.clone()).collect();

    // The consumer's own scores of (query, document i), as a job.
    let mut results = d.producer.subscribe_results().await.unwrap();
    let items: Vec<Value> = documents
        .iter()
        .map(|doc| json!({"query": query, "document": doc}))
        .collect();
    let job = sluice_schemas::Job {
        model: "xlm-reranker".into(),
        ..d.producer.job(
            sluice_schemas::Task::Rerank,
            "direct",
            vec![sluice_schemas::Input::Inline { items }],
        )
    };
    d.producer.submit(&job).await.unwrap();
    let got = sluice_tests::results::wait_results(&mut results, 1, Duration::from_secs(60)).await;
    let sluice_schemas::Outcome::Ok {
        output: sluice_schemas::Output::Inline { scores, .. },
    } = &got[0].outcome
    else {
        panic!("{:?}", got[0].outcome);
    };
    let direct = scores.clone();
    let tokens = got[0].usage.tokens;
    let best = ranking(&direct);
    // The answer's results: (index, score, text) in its order.
    let read = |body: &Value| -> Vec<(usize, f32, Option<String>)> {
        body["results"]
            .as_array()
            .unwrap_or_else(|| panic!("{body}"))
            .iter()
            .map(|r| {
                (
                    r["index"].as_u64().unwrap() as usize,
                    r["relevance_score"].as_f64().unwrap() as f32,
                    r["document"]["text"].as_str().map(str::to_string),
                )
            })
            .collect()
    };
    let check = |body: &Value, top_n: usize, texts: bool| {
        let results = read(body);
        assert_eq!(results.len(), top_n, "{body}");
        for (rank, (index, score, text)) in results.into_iter().enumerate() {
            assert_eq!(index, best[rank], "rank {rank}: {body}");
            assert!(
                (score - direct[index]).abs() <= 1e-6,
                "{score} vs {}",
                direct[index]
            );
            assert_eq!(text, texts.then(|| documents[index].clone()), "{body}");
        }
        assert_eq!(body["model"], "xlm-reranker");
        assert_eq!(body["usage"]["total_tokens"], tokens, "{body}");
    };

    let (status, body) = api
        .post(
            "/rerank",
            KEY_A,
            json!({"model": "xlm-reranker", "query": query, "documents": documents, "top_n": 5, "return_documents": true}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    check(&body, 5, true);
    let objects: Vec<Value> = documents.iter().map(|t| json!({ "text": t })).collect();
    let (status, body) = api
        .post(
            "/rerank",
            KEY_A,
            json!({"model": "xlm-reranker", "query": query, "documents": objects}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    check(&body, documents.len(), false);

    for (body, status, param) in [
        (
            json!({"model": "bge-reranker-base", "query": "q", "documents": ["d"]}),
            404,
            "model",
        ),
        (
            json!({"model": "xlm-reranker", "query": "q", "documents": []}),
            400,
            "documents",
        ),
        (
            json!({"model": "xlm-reranker", "documents": ["d"]}),
            400,
            "query",
        ),
        (
            json!({"model": "xlm-reranker", "query": "q", "documents": ["d"], "stream": true}),
            400,
            "stream",
        ),
        (
            json!({"model": "xlm-reranker", "query": "q", "documents": ["d"], "top_n": -1}),
            400,
            "top_n",
        ),
    ] {
        let (got, answer) = api.post("/rerank", KEY_A, body.clone()).await;
        eprintln!("{body} -> {got} {answer}");
        assert_eq!(got, status, "{body}: {answer}");
        assert_eq!(answer["error"]["param"], param, "{body}: {answer}");
    }
    let (_, models) = api.get("/models", KEY_A).await;
    let listed = models["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["id"] == "xlm-reranker")
        .cloned()
        .unwrap_or_else(|| panic!("{models}"));
    assert_eq!(
        (listed["task"].as_str(), listed["live"].as_bool()),
        (Some("rerank"), Some(true))
    );

    // A batch of rerank lines.
    let line = |id: &str, body: Value| json!({"custom_id": id, "method": "POST", "url": "/v1/rerank", "body": body});
    let lines = [
        line(
            "top-3",
            json!({"model": "xlm-reranker", "query": query, "documents": documents, "top_n": 3, "return_documents": true}),
        ),
        line(
            "all",
            json!({"model": "xlm-reranker", "query": query, "documents": objects}),
        ),
        line(
            "unknown-model",
            json!({"model": "bge-reranker-base", "query": query, "documents": ["d"]}),
        ),
    ];
    let batch = api
        .batch_to(KEY_A, &to_jsonl(&lines), "24h", "/v1/rerank")
        .await;
    let done = api
        .wait(
            KEY_A,
            batch["id"].as_str().unwrap(),
            Duration::from_secs(120),
        )
        .await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["request_counts"]["completed"], 2, "{done}");
    assert_eq!(done["request_counts"]["failed"], 1, "{done}");
    let output = api.content(KEY_A, &done["output_file_id"]).await;
    let by_id: BTreeMap<&str, &Value> = output
        .iter()
        .map(|l| (l["custom_id"].as_str().unwrap(), &l["response"]))
        .collect();
    assert_eq!(by_id["top-3"]["status_code"], 200);
    check(&by_id["top-3"]["body"], 3, true);
    check(&by_id["all"]["body"], documents.len(), false);
    let errors = api.content(KEY_A, &done["error_file_id"]).await;
    assert_eq!(errors.len(), 1);
    assert_eq!(errors[0]["custom_id"], "unknown-model");
    assert_eq!(
        errors[0]["response"]["body"]["error"]["code"],
        "model_not_found"
    );
    assert_eq!(d.jobs_in_stream_settled(0).await, 0);
}

/// vLLM's classify API over the queue, on the random-weight XLM-RoBERTa
/// classifier (four labels, multi-label sigmoid) served as
/// `xlm-classifier`: `POST /v1/classify` answers each text with its best
/// label and every label's probability in id order, the
/// `text-classification` pipeline's within 1e-4; bad requests get OpenAI's
/// error shape naming the field; `/v1/classify` batch lines are answered
/// in the same shape (their chunk's output read back from S3), a line
/// naming an undeployed model failing alone.
#[tokio::test]
async fn the_gateway_classifies_texts_online_and_in_a_batch() {
    let d = Deployment::start().await.unwrap();
    let (dir, reference) = classifier_family("xlm-roberta-classifier").unwrap();
    let _classify = d
        .start_consumer_of(&dir, &["--task=classify", "--model-name=xlm-classifier"])
        .await
        .unwrap();
    let gateway = d
        .start_gateway(KEYS, &["--classify-models=xlm-classifier"])
        .await
        .unwrap();
    let api = Api::new(gateway.addr);
    let texts = &reference.texts;
    let tokens: u64 = reference.ids.iter().map(|i| i.len() as u64).sum();
    // Each answer against the pipeline's: probs in id order, the best label.
    let check = |body: &Value, first: usize, n: usize, tokens: u64| {
        let data = body["data"].as_array().unwrap_or_else(|| panic!("{body}"));
        assert_eq!(data.len(), n, "{body}");
        for (index, d) in data.iter().enumerate() {
            let want = &reference.answers[first + index];
            assert_eq!(d["index"], index, "{body}");
            assert_eq!(d["label"], want[0].label, "text {}: {body}", first + index);
            assert_eq!(d["num_classes"], reference.labels.len());
            let probs: Vec<f32> = serde_json::from_value(d["probs"].clone()).unwrap();
            for w in want {
                let id = reference.labels.iter().position(|l| *l == w.label).unwrap();
                assert!(
                    (probs[id] - w.score).abs() <= 1e-4,
                    "text {}, {}: {} vs {}",
                    first + index,
                    w.label,
                    probs[id],
                    w.score
                );
            }
        }
        assert_eq!(body["object"], "list");
        assert_eq!(body["model"], "xlm-classifier");
        assert_eq!(body["usage"]["total_tokens"], tokens, "{body}");
    };

    let (status, body) = api
        .post(
            "/classify",
            KEY_A,
            json!({"model": "xlm-classifier", "input": texts}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    check(&body, 0, texts.len(), tokens);
    let (status, body) = api
        .post(
            "/classify",
            KEY_A,
            json!({"model": "xlm-classifier", "input": texts[3]}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    check(&body, 3, 1, reference.ids[3].len() as u64);

    for (body, status, param) in [
        (
            json!({"model": "distilbert-sst2", "input": "t"}),
            404,
            "model",
        ),
        (
            json!({"model": "xlm-classifier", "input": []}),
            400,
            "input",
        ),
        (
            json!({"model": "xlm-classifier", "input": [1, 2]}),
            400,
            "input",
        ),
        (
            json!({"model": "xlm-classifier", "input": "t", "stream": true}),
            400,
            "stream",
        ),
    ] {
        let (got, answer) = api.post("/classify", KEY_A, body.clone()).await;
        eprintln!("{body} -> {got} {answer}");
        assert_eq!(got, status, "{body}: {answer}");
        assert_eq!(answer["error"]["param"], param, "{body}: {answer}");
    }
    let (_, models) = api.get("/models", KEY_A).await;
    let listed = models["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["id"] == "xlm-classifier")
        .cloned()
        .unwrap_or_else(|| panic!("{models}"));
    assert_eq!(
        (listed["task"].as_str(), listed["live"].as_bool()),
        (Some("classify"), Some(true))
    );

    // A batch of classify lines.
    let line = |id: &str, body: Value| json!({"custom_id": id, "method": "POST", "url": "/v1/classify", "body": body});
    let lines = [
        line("all", json!({"model": "xlm-classifier", "input": texts})),
        line("one", json!({"model": "xlm-classifier", "input": texts[5]})),
        line(
            "unknown-model",
            json!({"model": "distilbert-sst2", "input": "t"}),
        ),
    ];
    let batch = api
        .batch_to(KEY_A, &to_jsonl(&lines), "24h", "/v1/classify")
        .await;
    let done = api
        .wait(
            KEY_A,
            batch["id"].as_str().unwrap(),
            Duration::from_secs(120),
        )
        .await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["request_counts"]["completed"], 2, "{done}");
    assert_eq!(done["request_counts"]["failed"], 1, "{done}");
    let output = api.content(KEY_A, &done["output_file_id"]).await;
    let by_id: BTreeMap<&str, &Value> = output
        .iter()
        .map(|l| (l["custom_id"].as_str().unwrap(), &l["response"]))
        .collect();
    assert_eq!(by_id["all"]["status_code"], 200);
    check(&by_id["all"]["body"], 0, texts.len(), tokens);
    check(&by_id["one"]["body"], 5, 1, reference.ids[5].len() as u64);
    let errors = api.content(KEY_A, &done["error_file_id"]).await;
    assert_eq!(errors.len(), 1);
    assert_eq!(errors[0]["custom_id"], "unknown-model");
    assert_eq!(d.jobs_in_stream_settled(0).await, 0);
}
