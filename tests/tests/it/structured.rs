//! Structured outputs (issue #40) through the gateway with the official
//! `openai` SDK: chat completions with a strict JSON schema, online and in a
//! batch, whose every answer parses and validates (the same prompts without
//! it do not all parse: the constraint did something); a streamed
//! constrained chat whose deltas concatenate to valid JSON; a schema the
//! compiler refuses, answered 400 `invalid_parameters` with its reason.

use std::time::Duration;

use serde_json::{Value, json};
use sluice_tests::deploy::Deployment;

const KEY: &str = "sk-team-a-0123456789";
const KEYS: &str = "team-a:sk-team-a-0123456789";

const SCRIPT: &str = r#"
import json, sys, time
import openai
from openai import OpenAI
client = OpenAI()
M = "smollm2-135m-instruct"
schema = json.loads(sys.argv[1])
questions = json.loads(sys.argv[2])
fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": schema, "strict": True}}
out = {"online": [], "free": [], "batch": [], "streamed": "", "refused": None}
for q in questions:
    msgs = [{"role": "user", "content": q}]
    r = client.chat.completions.create(model=M, messages=msgs, max_tokens=96, temperature=0, response_format=fmt)
    out["online"].append([r.choices[0].message.content, r.choices[0].finish_reason])
    r = client.chat.completions.create(model=M, messages=msgs, max_tokens=96, temperature=0)
    out["free"].append(r.choices[0].message.content)
stream = client.chat.completions.create(
    model=M, messages=[{"role": "user", "content": "Extract the person: John Smith, 50, a baker from Lyon."}],
    max_tokens=96, temperature=0, stream=True, response_format=fmt)
parts = []
for chunk in stream:
    if chunk.choices and chunk.choices[0].delta.content:
        parts.append(chunk.choices[0].delta.content)
    if chunk.choices and chunk.choices[0].finish_reason:
        out["streamed_finish"] = chunk.choices[0].finish_reason
out["streamed"] = "".join(parts)
out["streamed_parts"] = len(parts)
try:
    client.chat.completions.create(
        model=M, messages=[{"role": "user", "content": "hi"}], max_tokens=8,
        response_format={"type": "json_schema", "json_schema": {"name": "bad", "schema": {"type": "frobnicate"}}})
except openai.BadRequestError as e:
    out["refused"] = {"status": e.status_code, "body": e.body}
lines = "".join(json.dumps({
    "custom_id": f"q{i}", "method": "POST", "url": "/v1/chat/completions",
    "body": {"model": M, "messages": [{"role": "user", "content": q}], "max_tokens": 96,
             "temperature": 0, "response_format": fmt}}) + "\n" for i, q in enumerate(questions))
f = client.files.create(file=("lines.jsonl", lines.encode()), purpose="batch")
b = client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
deadline = time.time() + 240
while b.status not in ("completed", "failed", "expired", "cancelled") and time.time() < deadline:
    time.sleep(0.5)
    b = client.batches.retrieve(b.id)
out["batch_status"] = b.status
if b.output_file_id:
    for line in client.files.content(b.output_file_id).text.splitlines():
        o = json.loads(line)
        c = o["response"]["body"]["choices"][0]
        out["batch"].append([o["custom_id"], c["message"]["content"], c["finish_reason"]])
print(json.dumps(out))
"#;

#[tokio::test]
async fn strict_json_schemas_hold_online_streamed_and_in_batches_through_the_sdk() {
    let d = Deployment::start().await.unwrap();
    let consumer = d
        .start_consumer(&["--task=generate", "--max-items-per-job=8"])
        .await
        .unwrap();
    let gateway = d.start_gateway(KEYS, &[]).await.unwrap();
    let schema = json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 40},
            "age": {"type": "integer", "minimum": 0, "maximum": 150},
            "city": {"type": "string", "maxLength": 40}
        },
        "required": ["name", "age", "city"],
        "additionalProperties": false
    });
    let questions = json!([
        "Extract the person: Maria Lopez, 34, a nurse from Madrid.",
        "Who wrote Hamlet? Answer briefly.",
        "Write a haiku about the sea.",
    ]);
    let out = sluice_tests::sdk::run_python(
        SCRIPT,
        &[schema.to_string(), questions.to_string()],
        &format!("http://{}/v1", gateway.addr),
        KEY,
        Duration::from_secs(400),
    )
    .await;
    eprintln!("{}", serde_json::to_string_pretty(&out).unwrap());
    let validator = jsonschema::validator_for(&schema).unwrap();
    let valid = |text: &str, what: &str| {
        let value: Value =
            serde_json::from_str(text).unwrap_or_else(|e| panic!("{what}: {e}: {text:?}"));
        assert!(
            validator.is_valid(&value),
            "{what}: {value} does not validate"
        );
    };
    for (i, answer) in out["online"].as_array().unwrap().iter().enumerate() {
        assert_eq!(answer[1], "stop", "online {i}: {answer}");
        valid(answer[0].as_str().unwrap(), &format!("online {i}"));
    }
    let free_parsing = out["free"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| serde_json::from_str::<Value>(t.as_str().unwrap()).is_ok())
        .count();
    assert!(
        free_parsing < 3,
        "unconstrained answers parse too: {}",
        out["free"]
    );
    // A batch answers as the online requests do (same prompts, greedy).
    assert_eq!(out["batch_status"], "completed", "{out}");
    let batch = out["batch"].as_array().unwrap();
    assert_eq!(batch.len(), 3);
    for line in batch {
        let i: usize = line[0].as_str().unwrap()[1..].parse().unwrap();
        valid(line[1].as_str().unwrap(), &format!("batch line {i}"));
        assert_eq!(line[1], out["online"][i][0], "batch line {i} as online");
    }
    // Streamed: the deltas add up to JSON that validates.
    assert_eq!(out["streamed_finish"], "stop", "{out}");
    assert!(out["streamed_parts"].as_u64().unwrap() > 3, "{out}");
    valid(out["streamed"].as_str().unwrap(), "streamed");
    // A schema the compiler refuses: 400 with the reason.
    let refused = &out["refused"];
    assert_eq!(refused["status"], 400, "{out}");
    assert_eq!(refused["body"]["code"], "invalid_parameters", "{refused}");
    let message = refused["body"]["message"].as_str().unwrap();
    assert!(
        message.contains("response_format") && message.contains("frobnicate"),
        "{message}"
    );
    gateway.stop();
    consumer.shutdown(Duration::from_secs(10)).await.unwrap();
}
