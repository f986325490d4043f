//! The gateway's online endpoints (`/v1/embeddings`, `/v1/chat/completions`,
//! `/v1/completions`, `/v1/models`), each request a job through the queue,
//! called by the official `openai` SDK (Python, from PyPI) and, for the
//! error cases, by plain HTTP.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sluice_schemas::JobState;
use sluice_tests::deploy::Deployment;
use sluice_tests::fixtures::{cosine, minilm_reference};
use sluice_tests::repo_root;

const KEY: &str = "sk-team-a-0123456789";
const KEYS: &str = "team-a:sk-team-a-0123456789";

const SDK_SCRIPT: &str = r#"
import json, sys
from openai import OpenAI
texts = json.loads(sys.argv[1])
client = OpenAI()
models = [m.id for m in client.models.list()]
emb = client.embeddings.create(model="all-minilm-l6-v2", input=texts)
chat = client.chat.completions.create(
    model="smollm2-135m-instruct",
    messages=[{"role": "user", "content": "What is 2 plus 2?"}],
    max_tokens=8, temperature=0)
comp = client.completions.create(
    model="smollm2-135m-instruct", prompt="The capital of France is", max_tokens=4, temperature=0)
# The same requests streamed.
stream = client.chat.completions.create(
    model="smollm2-135m-instruct",
    messages=[{"role": "user", "content": "What is 2 plus 2?"}],
    max_tokens=8, temperature=0, stream=True, stream_options={"include_usage": True})
deltas, roles, finish, usage, ids = [], [], None, None, set()
for chunk in stream:
    ids.add(chunk.id)
    if chunk.usage:
        usage = [chunk.usage.prompt_tokens, chunk.usage.completion_tokens]
    for c in chunk.choices:
        if c.delta.role:
            roles.append(c.delta.role)
        if c.delta.content:
            deltas.append(c.delta.content)
        finish = c.finish_reason or finish
comp_stream = client.completions.create(
    model="smollm2-135m-instruct", prompt="The capital of France is", max_tokens=4,
    temperature=0, stream=True)
comp_deltas = [c.text for chunk in comp_stream for c in chunk.choices]
print(json.dumps({
    "streamed": deltas,
    "streamed_roles": roles,
    "streamed_finish": finish,
    "streamed_usage": usage,
    "streamed_ids": len(ids),
    "completion_streamed": "".join(comp_deltas),
    "models": models,
    "vectors": [d.embedding for d in emb.data],
    "embed_tokens": emb.usage.prompt_tokens,
    "chat": chat.choices[0].message.content,
    "chat_finish": chat.choices[0].finish_reason,
    "chat_usage": [chat.usage.prompt_tokens, chat.usage.completion_tokens],
    "completion": comp.choices[0].text,
}))
"#;

#[tokio::test]
async fn the_openai_sdk_calls_the_online_endpoints_through_the_queue() {
    let d = Deployment::start().await.unwrap();
    let embed = d.start_consumer(&[]).await.unwrap();
    let _generate = d
        .start_consumer(&[
            "--task=generate",
            "--max-new-tokens=16",
            "--max-prompt-tokens=256",
        ])
        .await
        .unwrap();
    let gateway = d.start_gateway(KEYS, &[]).await.unwrap();
    let base = format!("http://{}/v1", gateway.addr);
    let reference = minilm_reference().unwrap();
    let texts: Vec<&str> = reference
        .items
        .iter()
        .take(6)
        .map(|i| i.text.as_str())
        .collect();

    let run = tokio::process::Command::new(repo_root().join(".sluice/pyenv/bin/python"))
        .arg("-c")
        .arg(SDK_SCRIPT)
        .arg(serde_json::to_string(&texts).unwrap())
        .env("OPENAI_BASE_URL", &base)
        .env("OPENAI_API_KEY", KEY)
        .kill_on_drop(true)
        .output();
    let run = tokio::time::timeout(Duration::from_secs(300), run)
        .await
        .unwrap()
        .unwrap();
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let got: Value = serde_json::from_slice(&run.stdout).unwrap();
    assert_eq!(
        got["models"],
        json!(["all-minilm-l6-v2", "smollm2-135m-instruct"])
    );
    let vectors: Vec<Vec<f32>> = serde_json::from_value(got["vectors"].clone()).unwrap();
    let offline = sluice_tests::offline_vectors(&texts).await;
    assert_eq!(vectors.len(), texts.len());
    for (online, offline) in vectors.iter().zip(&offline) {
        let c = cosine(online, offline);
        assert!(c >= 0.9999, "online vs offline cosine {c}");
    }
    assert!(got["embed_tokens"].as_u64().unwrap() > 0, "{got}");
    assert!(!got["chat"].as_str().unwrap().is_empty(), "{got}");
    assert!(
        ["stop", "length"].contains(&got["chat_finish"].as_str().unwrap()),
        "{got}"
    );
    assert!(got["chat_usage"][0].as_u64().unwrap() > 0, "{got}");
    assert!(got["chat_usage"][1].as_u64().unwrap() > 0, "{got}");
    assert!(!got["completion"].as_str().unwrap().is_empty(), "{got}");
    // Streamed, the same greedy answer arrives in pieces: the deltas add up
    // to the whole answer, with its finish reason and usage.
    let deltas: Vec<String> = serde_json::from_value(got["streamed"].clone()).unwrap();
    assert_eq!(deltas.concat(), got["chat"].as_str().unwrap(), "{got}");
    assert!(deltas.len() >= 2, "the answer came in one piece: {got}");
    assert_eq!(got["streamed_roles"], json!(["assistant"]), "{got}");
    assert_eq!(got["streamed_finish"], got["chat_finish"], "{got}");
    assert_eq!(
        got["streamed_usage"], got["chat_usage"],
        "include_usage: {got}"
    );
    assert_eq!(got["streamed_ids"], 1, "one id per stream: {got}");
    assert_eq!(got["completion_streamed"], got["completion"], "{got}");
    // Each request was a job on the stream, published as the key's tenant.
    let tenants = embed.stats.tenant_tokens();
    assert!(
        tenants.iter().any(|(t, n)| t == "team-a" && *n > 0),
        "{tenants:?}"
    );

    // What cannot run is refused at once, in OpenAI's error shape.
    let http = reqwest::Client::new();
    let post = |path: &str, body: Value, key: Option<&str>| {
        let mut r = http
            .post(format!("{base}{path}"))
            .header("content-type", "application/json")
            .body(body.to_string());
        if let Some(key) = key {
            r = r.bearer_auth(key);
        }
        r.send()
    };
    for (path, body, key, status, code) in [
        (
            "/embeddings",
            json!({"model": "all-minilm-l6-v2", "input": "x", "stream": true}),
            Some(KEY),
            400,
            Value::Null,
        ),
        (
            "/embeddings",
            json!({"model": "text-embedding-3-small", "input": "x"}),
            Some(KEY),
            404,
            json!("model_not_found"),
        ),
        (
            "/chat/completions",
            json!({"model": "smollm2-135m-instruct", "messages": "not a list"}),
            Some(KEY),
            400,
            Value::Null,
        ),
        (
            "/embeddings",
            json!({"model": "all-minilm-l6-v2", "input": "x"}),
            None,
            401,
            json!("invalid_api_key"),
        ),
    ] {
        let r = post(path, body.clone(), key).await.unwrap();
        assert_eq!(r.status().as_u16(), status, "{path} {body}");
        let answer: Value = serde_json::from_slice(&r.bytes().await.unwrap()).unwrap();
        assert!(answer["error"]["message"].is_string(), "{answer}");
        if !code.is_null() {
            assert_eq!(answer["error"]["code"], code, "{answer}");
        }
    }
    let r = http
        .post(format!("{base}/embeddings"))
        .bearer_auth(KEY)
        .header("sluice-deadline-secs", "soon")
        .header("content-type", "application/json")
        .body(json!({"model": "all-minilm-l6-v2", "input": "x"}).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 400);
}

/// A request whose deadline passes while its job waits (no consumer runs)
/// is answered 504, and its job is cancelled: a consumer that starts later
/// never runs it.
#[tokio::test]
async fn an_online_request_past_its_deadline_gets_504_and_its_job_never_runs() {
    let d = Deployment::start().await.unwrap();
    let gateway = d
        .start_gateway(KEYS, &["--online-grace-secs=1"])
        .await
        .unwrap();
    let asked = Instant::now();
    let r = reqwest::Client::new()
        .post(format!("http://{}/v1/embeddings", gateway.addr))
        .bearer_auth(KEY)
        .header("sluice-deadline-secs", "1")
        .header("content-type", "application/json")
        .body(json!({"model": "all-minilm-l6-v2", "input": "too late"}).to_string())
        .send()
        .await
        .unwrap();
    let waited = asked.elapsed();
    assert_eq!(r.status().as_u16(), 504);
    let answer: Value = serde_json::from_slice(&r.bytes().await.unwrap()).unwrap();
    assert_eq!(answer["error"]["code"], "deadline_exceeded", "{answer}");
    assert!(
        waited < Duration::from_secs(10),
        "answered after {waited:?}"
    );
    let message = answer["error"]["message"].as_str().unwrap();
    assert!(message.contains("will not run"), "{message}");
    let job_id = message
        .split("its job ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .unwrap()
        .to_string();
    let status = d.producer.status(&job_id).await.unwrap().unwrap();
    assert!(
        matches!(status.state, JobState::Cancelled | JobState::Expired),
        "{status:?}"
    );
    // A consumer that starts now does not run it.
    let consumer = d.start_consumer(&[]).await.unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        consumer
            .stats
            .jobs_ok
            .load(std::sync::atomic::Ordering::Relaxed),
        0
    );
    let status = d.producer.status(&job_id).await.unwrap().unwrap();
    assert!(
        matches!(status.state, JobState::Cancelled | JobState::Expired),
        "{status:?}"
    );
    consumer.shutdown(Duration::from_secs(5)).await.unwrap();
}
