//! OpenAI's Responses API (issue #40) through the gateway with the official
//! `openai` SDK: a plain call answers what the same chat completion does
//! (greedy, same messages), in the Responses shape with usage; streamed, its
//! deltas add up to that answer and the events come in OpenAI's order; a
//! `text.format` JSON schema holds; a batch with url `/v1/responses` answers
//! as online; tools, stored conversations and images are refused 400,
//! naming the field.

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
Q = "What is the capital of France?"
I = "Answer in one short sentence."
out = {}
r = client.responses.create(model=M, instructions=I, input=Q, max_output_tokens=24, temperature=0)
out["plain"] = {"text": r.output_text, "status": r.status, "id": r.id, "object": r.object,
                "usage": r.usage.model_dump(), "instructions": r.instructions,
                "max_output_tokens": r.max_output_tokens, "role": r.output[0].role}
c = client.chat.completions.create(model=M, messages=[{"role": "system", "content": I}, {"role": "user", "content": Q}],
                                   max_tokens=24, temperature=0)
out["chat"] = {"text": c.choices[0].message.content, "prompt_tokens": c.usage.prompt_tokens}
r = client.responses.create(model=M, input=[{"role": "developer", "content": I},
                                            {"role": "user", "content": [{"type": "input_text", "text": Q}]}],
                            max_output_tokens=24, temperature=0)
out["listed"] = r.output_text
kinds, deltas, done = [], [], None
for event in client.responses.create(model=M, instructions=I, input=Q, max_output_tokens=24, temperature=0, stream=True):
    kinds.append([event.type, event.sequence_number])
    if event.type == "response.output_text.delta":
        deltas.append(event.delta)
    if event.type in ("response.completed", "response.incomplete"):
        done = {"text": event.response.output_text, "usage": event.response.usage.model_dump(), "status": event.response.status}
out["stream"] = {"kinds": kinds, "deltas": deltas, "done": done}
r = client.responses.create(model=M, input="Extract the person: Maria Lopez, 34, a nurse from Madrid.",
                            max_output_tokens=96, temperature=0,
                            text={"format": {"type": "json_schema", "name": "person", "schema": schema, "strict": True}})
out["structured"] = {"text": r.output_text, "status": r.status}
refusals = {
    "tools": dict(input=Q, tools=[{"type": "web_search"}]),
    "previous_response_id": dict(input=Q, previous_response_id="resp_123"),
    "input_image": dict(input=[{"role": "user", "content": [{"type": "input_image", "image_url": "https://example.com/a.png"}]}]),
}
out["refused"] = {}
for name, kwargs in refusals.items():
    try:
        client.responses.create(model=M, max_output_tokens=8, **kwargs)
        out["refused"][name] = None
    except openai.BadRequestError as e:
        out["refused"][name] = {"status": e.status_code, "body": e.body}
lines = "".join(json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/responses",
    "body": {"model": M, "instructions": I, "input": q, "max_output_tokens": 24, "temperature": 0}}) + "\n"
    for i, q in enumerate([Q, "Name a color."]))
f = client.files.create(file=("lines.jsonl", lines.encode()), purpose="batch")
b = client.batches.create(input_file_id=f.id, endpoint="/v1/responses", completion_window="24h")
deadline = time.time() + 240
while b.status not in ("completed", "failed", "expired", "cancelled") and time.time() < deadline:
    time.sleep(0.5)
    b = client.batches.retrieve(b.id)
out["batch_status"] = b.status
out["batch"] = {}
if b.output_file_id:
    for line in client.files.content(b.output_file_id).text.splitlines():
        o = json.loads(line)
        body = o["response"]["body"]
        out["batch"][o["custom_id"]] = {"object": body["object"], "text": body["output"][0]["content"][0]["text"]}
print(json.dumps(out))
"#;

#[tokio::test]
async fn the_responses_api_answers_as_chat_does_plain_streamed_structured_and_batched() {
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
            "age": {"type": "integer", "minimum": 0, "maximum": 150}
        },
        "required": ["name", "age"],
        "additionalProperties": false
    });
    let out = sluice_tests::sdk::run_python(
        SCRIPT,
        &[schema.to_string()],
        &format!("http://{}/v1", gateway.addr),
        KEY,
        Duration::from_secs(400),
    )
    .await;
    eprintln!("{}", serde_json::to_string_pretty(&out).unwrap());

    // Plain: the Responses shape, answering what chat answers.
    let plain = &out["plain"];
    let text = plain["text"].as_str().unwrap();
    assert!(!text.is_empty(), "{plain}");
    assert_eq!(plain["text"], out["chat"]["text"], "responses vs chat");
    assert_eq!(plain["object"], "response");
    assert!(
        plain["id"].as_str().unwrap().starts_with("resp_"),
        "{plain}"
    );
    assert_eq!(plain["role"], "assistant");
    assert_eq!(plain["instructions"], "Answer in one short sentence.");
    assert_eq!(plain["max_output_tokens"], 24);
    assert!(
        plain["status"] == "completed" || plain["status"] == "incomplete",
        "{plain}"
    );
    let usage = &plain["usage"];
    assert_eq!(usage["input_tokens"], out["chat"]["prompt_tokens"]);
    let output_tokens = usage["output_tokens"].as_u64().unwrap();
    assert!((1..=24).contains(&output_tokens), "{usage}");
    assert_eq!(
        usage["total_tokens"].as_u64().unwrap(),
        usage["input_tokens"].as_u64().unwrap() + output_tokens
    );
    // `developer` and `input_text` parts read as system and user messages.
    assert_eq!(out["listed"], plain["text"]);

    // Streamed: OpenAI's event order, numbered; the deltas add up to the
    // answer, and the last event carries it whole with the same usage.
    let stream = &out["stream"];
    let kinds: Vec<&str> = stream["kinds"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k[0].as_str().unwrap())
        .collect();
    for (i, k) in stream["kinds"].as_array().unwrap().iter().enumerate() {
        assert_eq!(k[1], i as u64, "sequence numbers: {stream}");
    }
    let deltas = kinds
        .iter()
        .filter(|k| **k == "response.output_text.delta")
        .count();
    assert!(deltas >= 2, "{stream}");
    let mut expected = vec![
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ];
    expected.extend(std::iter::repeat_n("response.output_text.delta", deltas));
    expected.extend([
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
    ]);
    let last = if plain["status"] == "completed" {
        "response.completed"
    } else {
        "response.incomplete"
    };
    expected.push(last);
    assert_eq!(kinds, expected);
    let streamed: String = stream["deltas"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_str().unwrap())
        .collect();
    assert_eq!(streamed, text);
    assert_eq!(stream["done"]["text"], plain["text"]);
    assert_eq!(stream["done"]["usage"], plain["usage"]);

    // text.format: the answer parses and validates.
    let structured = out["structured"]["text"].as_str().unwrap();
    let value: Value = serde_json::from_str(structured)
        .unwrap_or_else(|e| panic!("structured: {e}: {structured:?}"));
    assert!(
        jsonschema::validator_for(&schema).unwrap().is_valid(&value),
        "{value}"
    );
    assert_eq!(out["structured"]["status"], "completed");

    // What is not text generation: 400, naming the field.
    for (name, param) in [
        ("tools", "tools"),
        ("previous_response_id", "previous_response_id"),
        ("input_image", "input"),
    ] {
        let refused = &out["refused"][name];
        assert_eq!(refused["status"], 400, "{name}: {refused}");
        assert_eq!(refused["body"]["param"], param, "{name}: {refused}");
        assert_eq!(refused["body"]["code"], "unsupported_parameter");
        let message = refused["body"]["message"].as_str().unwrap();
        assert!(message.contains(name), "{name}: {message}");
    }

    // A batch of /v1/responses lines answers as online.
    assert_eq!(out["batch_status"], "completed", "{out}");
    assert_eq!(out["batch"]["r0"]["object"], "response");
    assert_eq!(out["batch"]["r0"]["text"], plain["text"]);
    assert!(
        !out["batch"]["r1"]["text"].as_str().unwrap().is_empty(),
        "{out}"
    );
    gateway.stop();
    consumer.shutdown(Duration::from_secs(10)).await.unwrap();
}
