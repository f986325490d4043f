//! Token logprobs in OpenAI's shapes: an entry of chat completions' and the
//! Responses API's lists, a chat choice's `logprobs`, the legacy
//! completions' parallel lists. Pure.

use serde_json::{Map, Value, json};
use sluice_schemas::Logprob;

/// A token's logprob as chat completions and the Responses API answer it:
/// its text, logprob and bytes, with its step's alternatives.
pub fn token(l: &Logprob) -> Value {
    json!({
        "token": l.token,
        "logprob": l.logprob,
        "bytes": l.bytes,
        "top_logprobs": l.top_logprobs.iter().map(|t| json!({
            "token": t.token,
            "logprob": t.logprob,
            "bytes": t.bytes,
        })).collect::<Vec<_>>(),
    })
}

/// A chat choice's `logprobs`: one entry per generated token.
pub fn chat(logprobs: &[Logprob]) -> Value {
    json!({
        "content": logprobs.iter().map(token).collect::<Vec<_>>(),
        "refusal": null,
    })
}

/// A legacy completions choice's `logprobs`: parallel lists of the tokens,
/// their logprobs, each step's alternatives keyed by text (the chosen token
/// among them, as OpenAI's: up to `logprobs` + 1 entries) and each token's
/// offset in characters into the completion's text (`offset`: where the
/// first token starts, for a streamed chunk).
pub fn completion(logprobs: &[Logprob], offset: usize) -> Value {
    let mut text_offset = Vec::with_capacity(logprobs.len());
    let mut at = offset;
    for l in logprobs {
        text_offset.push(at);
        at += l.token.chars().count();
    }
    json!({
        "tokens": logprobs.iter().map(|l| l.token.as_str()).collect::<Vec<_>>(),
        "token_logprobs": logprobs.iter().map(|l| l.logprob).collect::<Vec<_>>(),
        "top_logprobs": logprobs.iter().map(|l| {
            let mut top = Map::new();
            for t in &l.top_logprobs {
                top.entry(t.token.clone()).or_insert(t.logprob.into());
            }
            top.entry(l.token.clone()).or_insert(l.logprob.into());
            Value::Object(top)
        }).collect::<Vec<_>>(),
        "text_offset": text_offset,
    })
}
