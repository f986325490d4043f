//! Token logprobs through the gateway with the official `openai` SDK (issue
//! #52): chat completions (`logprobs`, `top_logprobs`), legacy completions
//! (`logprobs` as a count) and the Responses API (`include:
//! ["message.output_text.logprobs"]`), each plain, streamed and in a batch,
//! all answering the same tokens and figures for the same greedy prompt; the
//! figures are the model's own distribution (the chosen greedy token is the
//! step's most likely, its logprob the first alternative's, alternatives in
//! order). The figures themselves are held to llama.cpp's in
//! `models/tests/families.rs` (the generator the consumer runs).

use std::time::Duration;

use serde_json::{Value, json};
use sluice_tests::deploy::Deployment;

const KEY: &str = "sk-team-a-0123456789";
const KEYS: &str = "team-a:sk-team-a-0123456789";

const SCRIPT: &str = r#"
import json, sys, time
from openai import OpenAI
client = OpenAI()
M = "smollm2-135m-instruct"
I = "Answer in one short sentence."
Q = "What is the capital of France?"
MESSAGES = [{"role": "system", "content": I}, {"role": "user", "content": Q}]
P = "The capital of France is"
out = {}

def entries(content):
    return [{"token": t.token, "logprob": t.logprob, "bytes": t.bytes,
             "top": [[a.token, a.logprob, a.bytes] for a in t.top_logprobs]} for t in content]

c = client.chat.completions.create(model=M, messages=MESSAGES, max_tokens=12, temperature=0,
                                   logprobs=True, top_logprobs=5)
out["chat"] = {"text": c.choices[0].message.content, "finish": c.choices[0].finish_reason,
               "completion_tokens": c.usage.completion_tokens,
               "logprobs": entries(c.choices[0].logprobs.content)}
plain = client.chat.completions.create(model=M, messages=MESSAGES, max_tokens=12, temperature=0)
out["chat_without"] = {"text": plain.choices[0].message.content,
                       "logprobs": plain.choices[0].logprobs}
streamed = []
for chunk in client.chat.completions.create(model=M, messages=MESSAGES, max_tokens=12, temperature=0,
                                            logprobs=True, top_logprobs=5, stream=True):
    for choice in chunk.choices:
        if choice.logprobs and choice.logprobs.content:
            streamed.extend(entries(choice.logprobs.content))
out["chat_streamed"] = streamed

comp = client.completions.create(model=M, prompt=P, max_tokens=6, temperature=0, logprobs=3)
lp = comp.choices[0].logprobs
out["completion"] = {"text": comp.choices[0].text, "tokens": lp.tokens,
                     "token_logprobs": lp.token_logprobs, "top_logprobs": lp.top_logprobs,
                     "text_offset": lp.text_offset}
tokens, offsets = [], []
for chunk in client.completions.create(model=M, prompt=P, max_tokens=6, temperature=0, logprobs=3, stream=True):
    for choice in chunk.choices:
        if choice.logprobs:
            tokens.extend(choice.logprobs.tokens)
            offsets.extend(choice.logprobs.text_offset)
out["completion_streamed"] = {"tokens": tokens, "text_offset": offsets}

r = client.responses.create(model=M, instructions=I, input=Q, max_output_tokens=12, temperature=0,
                            include=["message.output_text.logprobs"], top_logprobs=5)
out["responses"] = {"text": r.output_text, "logprobs": entries(r.output[0].content[0].logprobs)}
deltas, done = [], None
for event in client.responses.create(model=M, instructions=I, input=Q, max_output_tokens=12, temperature=0,
                                     include=["message.output_text.logprobs"], top_logprobs=5, stream=True):
    if event.type == "response.output_text.delta":
        deltas.extend(entries(event.logprobs))
    if event.type == "response.output_text.done":
        done = entries(event.logprobs)
out["responses_streamed"] = {"deltas": deltas, "done": done}

lines = "".join(json.dumps(line) + "\n" for line in [
    {"custom_id": "chat", "method": "POST", "url": "/v1/chat/completions",
     "body": {"model": M, "messages": MESSAGES, "max_tokens": 12, "temperature": 0,
              "logprobs": True, "top_logprobs": 5}},
    {"custom_id": "completion", "method": "POST", "url": "/v1/completions",
     "body": {"model": M, "prompt": P, "max_tokens": 6, "temperature": 0, "logprobs": 3}},
    {"custom_id": "responses", "method": "POST", "url": "/v1/responses",
     "body": {"model": M, "instructions": I, "input": Q, "max_output_tokens": 12, "temperature": 0,
              "include": ["message.output_text.logprobs"], "top_logprobs": 5}},
])
f = client.files.create(file=("lines.jsonl", lines.encode()), purpose="batch")
b = client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
deadline = time.time() + 240
while b.status not in ("completed", "failed", "expired", "cancelled") and time.time() < deadline:
    time.sleep(0.5)
    b = client.batches.retrieve(b.id)
out["batch_status"] = b.status
out["batch"] = {}
if b.output_file_id:
    for line in client.files.content(b.output_file_id).text.splitlines():
        o = json.loads(line)
        out["batch"][o["custom_id"]] = o["response"]["body"]
print(json.dumps(out))
"#;

/// A chat-shaped logprob entry as the script prints it.
fn tokens(list: &Value) -> Vec<String> {
    list.as_array()
        .unwrap()
        .iter()
        .map(|e| e["token"].as_str().unwrap().to_string())
        .collect()
}

fn figures(list: &Value) -> Vec<f64> {
    list.as_array()
        .unwrap()
        .iter()
        .map(|e| e["logprob"].as_f64().unwrap())
        .collect()
}

/// Two runs of the same greedy prompt on one consumer: the same tokens, the
/// same figures (to f32 noise: another run may batch the prompt with other
/// work).
fn assert_same(what: &str, got: &Value, want: &Value) {
    assert_eq!(tokens(got), tokens(want), "{what}: tokens");
    for (g, w) in figures(got).iter().zip(figures(want)) {
        assert!((g - w).abs() < 1e-3, "{what}: {g} vs {w}");
    }
}

#[tokio::test]
async fn the_sdk_gets_logprobs_from_chat_completions_and_responses_plain_streamed_and_batched() {
    let d = Deployment::start().await.unwrap();
    let _consumer = d
        .start_consumer(&["--task=generate", "--max-items-per-job=8"])
        .await
        .unwrap();
    let gateway = d.start_gateway(KEYS, &[]).await.unwrap();
    let out = sluice_tests::sdk::run_python(
        SCRIPT,
        &[],
        &format!("http://{}/v1", gateway.addr),
        KEY,
        Duration::from_secs(400),
    )
    .await;

    // Chat: one entry per generated token, their bytes the text; greedy,
    // each token is its step's most likely, listed first with its figure;
    // five alternatives in order, each a probability.
    let chat = &out["chat"];
    let list = chat["logprobs"].as_array().unwrap();
    assert!(!list.is_empty(), "{chat}");
    assert_eq!(
        list.len() as u64,
        chat["completion_tokens"].as_u64().unwrap(),
        "one entry per generated token: {chat}"
    );
    let bytes: Vec<u8> = list
        .iter()
        .flat_map(|e| e["bytes"].as_array().unwrap().iter())
        .map(|b| b.as_u64().unwrap() as u8)
        .collect();
    let text = chat["text"].as_str().unwrap();
    assert!(
        String::from_utf8_lossy(&bytes).starts_with(text),
        "the tokens' bytes are the text: {:?} vs {text:?}",
        String::from_utf8_lossy(&bytes)
    );
    for e in list {
        let top = e["top"].as_array().unwrap();
        assert_eq!(top.len(), 5, "{e}");
        assert_eq!(top[0][0], e["token"], "greedy takes the most likely: {e}");
        assert_eq!(top[0][1], e["logprob"], "{e}");
        let lps: Vec<f64> = top.iter().map(|t| t[1].as_f64().unwrap()).collect();
        assert!(lps.windows(2).all(|w| w[0] >= w[1]), "in order: {e}");
        assert!(lps.iter().all(|&l| l <= 0.0), "{e}");
        let mass: f64 = lps.iter().map(|l| l.exp()).sum();
        assert!(mass <= 1.0 + 1e-4, "{e}");
    }
    // Not asked: none, and the same text.
    assert_eq!(out["chat_without"]["logprobs"], Value::Null);
    assert_eq!(out["chat_without"]["text"], chat["text"]);
    // Streamed, the chunks' entries add up to the plain answer's.
    assert_same("chat streamed", &out["chat_streamed"], &chat["logprobs"]);

    // Legacy completions: parallel lists; each step's dict holds its three
    // alternatives and the chosen token (the most likely: among them).
    let comp = &out["completion"];
    let toks: Vec<&str> = comp["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    assert!(!toks.is_empty(), "{comp}");
    assert_eq!(toks.concat(), comp["text"].as_str().unwrap(), "{comp}");
    let mut at = 0;
    for (i, tok) in toks.iter().enumerate() {
        assert_eq!(comp["text_offset"][i], at, "{comp}");
        at += tok.chars().count() as u64;
        let top = comp["top_logprobs"][i].as_object().unwrap();
        assert_eq!(top.len(), 3, "the chosen is among the three: {comp}");
        assert_eq!(top[*tok], comp["token_logprobs"][i], "{comp}");
    }
    assert_eq!(out["completion_streamed"]["tokens"], comp["tokens"]);
    assert_eq!(
        out["completion_streamed"]["text_offset"],
        comp["text_offset"]
    );

    // Responses: the same prompt as the chat's, the same entries.
    assert_eq!(out["responses"]["text"], chat["text"]);
    assert_same(
        "responses",
        &out["responses"]["logprobs"],
        &chat["logprobs"],
    );
    assert_same(
        "responses deltas",
        &out["responses_streamed"]["deltas"],
        &chat["logprobs"],
    );
    assert_same(
        "responses done",
        &out["responses_streamed"]["done"],
        &chat["logprobs"],
    );

    // In a batch: each line's body carries its endpoint's shape, with the
    // online answers' tokens.
    assert_eq!(out["batch_status"], "completed", "{out}");
    let batch = &out["batch"];
    let content = &batch["chat"]["choices"][0]["logprobs"]["content"];
    assert_eq!(tokens(content), tokens(&chat["logprobs"]), "{batch}");
    assert_eq!(
        batch["completion"]["choices"][0]["logprobs"]["tokens"], comp["tokens"],
        "{batch}"
    );
    let output_text = &batch["responses"]["output"][0]["content"][0];
    assert_eq!(
        tokens(&output_text["logprobs"]),
        tokens(&chat["logprobs"]),
        "{batch}"
    );
    assert_eq!(json!(output_text["text"]), chat["text"]);
}
