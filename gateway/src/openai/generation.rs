//! The generate endpoints' answers: a chat completion's, a completion's or
//! a response's body, and the streamed chunks of the first two.

use serde_json::{Value, json};
use sluice_schemas::{FinishReason, Generation, Logprob};

use super::logprobs;
use super::request::{Endpoint, Request};

/// OpenAI's finish reasons: the model's end of turn is `stop` too.
fn finish_reason(r: FinishReason) -> &'static str {
    match r {
        FinishReason::Length => "length",
        FinishReason::Stop | FinishReason::Eos => "stop",
    }
}

/// The response body of a chat completion, completions or responses
/// request.
pub fn generation_body(
    request: &Request,
    id: &str,
    created: i64,
    model: &str,
    generations: &[Generation],
) -> Value {
    let endpoint = request.endpoint;
    if endpoint == Endpoint::Responses
        && let Some(generation) = generations.first()
    {
        let echo = request.echo.clone().unwrap_or_default();
        return super::responses::body(id, created, model, &echo, generation);
    }
    let prompt: u64 = generations.iter().map(|g| g.prompt_tokens).sum();
    let completion: u64 = generations.iter().map(|g| g.completion_tokens).sum();
    let choices: Vec<Value> = generations
        .iter()
        .enumerate()
        .map(|(index, g)| match endpoint {
            Endpoint::ChatCompletions => json!({
                "index": index,
                "message": {"role": "assistant", "content": g.text, "refusal": null},
                "logprobs": g.logprobs.as_deref().map(logprobs::chat),
                "finish_reason": finish_reason(g.finish_reason),
            }),
            _ => json!({
                "index": index,
                "text": g.text,
                "logprobs": g.logprobs.as_deref().map(|l| logprobs::completion(l, 0)),
                "finish_reason": finish_reason(g.finish_reason),
            }),
        })
        .collect();
    let mut body = envelope(endpoint, false, id, created, model, choices);
    body["usage"] = json!({"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion});
    body
}

/// What one streamed chunk of a completion says about one choice.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Delta<'a> {
    /// chat: the assistant's role, on a choice's first chunk.
    Role,
    /// New text, and the logprobs of the tokens since the last chunk when
    /// they were asked for (with the first one's character offset into the
    /// choice's text, for the legacy completions' `text_offset`).
    Text {
        text: &'a str,
        logprobs: Option<(&'a [Logprob], usize)>,
    },
    Finish(FinishReason),
}

/// One Server-Sent Event body of a streamed chat completion
/// (`chat.completion.chunk`) or completion (`text_completion`), for choice
/// `index`. With `include_usage` every chunk carries `"usage": null`, as
/// OpenAI's do, and [`usage_chunk`] ends the stream.
pub fn stream_chunk(
    endpoint: Endpoint,
    id: &str,
    created: i64,
    model: &str,
    index: u32,
    delta: Delta<'_>,
    include_usage: bool,
) -> Value {
    let finish = match delta {
        Delta::Finish(r) => Value::from(finish_reason(r)),
        _ => Value::Null,
    };
    let logprobs = match delta {
        Delta::Text { logprobs, .. } => logprobs,
        _ => None,
    };
    let choice = match endpoint {
        Endpoint::ChatCompletions => json!({
            "index": index,
            "delta": match delta {
                Delta::Role => json!({"role": "assistant", "content": ""}),
                Delta::Text { text, .. } => json!({"content": text}),
                Delta::Finish(_) => json!({}),
            },
            "logprobs": logprobs.map(|(l, _)| logprobs::chat(l)),
            "finish_reason": finish,
        }),
        _ => json!({
            "index": index,
            "text": match delta {
                Delta::Text { text, .. } => text,
                _ => "",
            },
            "logprobs": logprobs.map(|(l, offset)| logprobs::completion(l, offset)),
            "finish_reason": finish,
        }),
    };
    let mut chunk = envelope(endpoint, true, id, created, model, vec![choice]);
    if include_usage {
        chunk["usage"] = Value::Null;
    }
    chunk
}

/// The last chunk of a stream that asked `stream_options.include_usage`:
/// no choices, the request's usage.
pub fn usage_chunk(
    endpoint: Endpoint,
    id: &str,
    created: i64,
    model: &str,
    prompt_tokens: u64,
    completion_tokens: u64,
) -> Value {
    let mut chunk = envelope(endpoint, true, id, created, model, Vec::new());
    chunk["usage"] = json!({
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    });
    chunk
}

/// What a completion body and a streamed chunk share: id, object, time,
/// model, choices.
fn envelope(
    endpoint: Endpoint,
    streamed: bool,
    id: &str,
    created: i64,
    model: &str,
    choices: Vec<Value>,
) -> Value {
    let (prefix, object) = match (endpoint, streamed) {
        (Endpoint::ChatCompletions, false) => ("chatcmpl", "chat.completion"),
        (Endpoint::ChatCompletions, true) => ("chatcmpl", "chat.completion.chunk"),
        _ => ("cmpl", "text_completion"),
    };
    json!({
        "id": format!("{prefix}-{id}"),
        "object": object,
        "created": created,
        "model": model,
        "system_fingerprint": null,
        "choices": choices,
    })
}
