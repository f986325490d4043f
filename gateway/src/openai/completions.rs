//! `/v1/completions` (the legacy API): a body's prompts as generate items.

use serde_json::{Map, Value};

use super::request::{RequestError, strings};
use super::sampling::generate_parameters;

/// The most alternatives the legacy completions' `logprobs` lists
/// (OpenAI's limit there).
const COMPLETIONS_MAX_LOGPROBS: u64 = 5;

/// What logprobs a legacy completions body asks for: `logprobs`, the
/// number of alternatives per token (0 to 5).
pub(super) fn completion_logprobs(body: &Map<String, Value>) -> Result<Option<u32>, RequestError> {
    if body.get("top_logprobs").is_some_and(|v| !v.is_null()) {
        return Err(RequestError::invalid(
            format!(
                "`top_logprobs` is a chat completions parameter; completions take `logprobs`, a number of alternatives from 0 to {COMPLETIONS_MAX_LOGPROBS}"
            ),
            Some("top_logprobs"),
        ));
    }
    match body.get("logprobs") {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .filter(|&n| n <= COMPLETIONS_MAX_LOGPROBS)
            .map(|n| Some(n as u32))
            .ok_or_else(|| {
                RequestError::invalid(
                    format!(
                        "`logprobs` must be a whole number from 0 to {COMPLETIONS_MAX_LOGPROBS} (the alternatives listed per token)"
                    ),
                    Some("logprobs"),
                )
            }),
    }
}

/// OpenAI's legacy completions answer 16 tokens when `max_tokens` is unset.
const COMPLETIONS_DEFAULT_MAX_TOKENS: u32 = 16;

pub(super) fn completion_items(body: &mut Map<String, Value>) -> Result<Vec<Value>, RequestError> {
    if body.get("echo").is_some_and(|e| e.as_bool() == Some(true)) {
        return Err(RequestError::invalid(
            "`echo` is not supported",
            Some("echo"),
        ));
    }
    let parameters = generate_parameters(
        body,
        Some(COMPLETIONS_DEFAULT_MAX_TOKENS),
        completion_logprobs(body)?,
    )?;
    let prompts = strings(body.remove("prompt"), "prompt")?;
    Ok(prompts
        .into_iter()
        .map(|p| {
            let mut item = parameters.clone();
            item.insert("prompt".into(), Value::String(p));
            Value::Object(item)
        })
        .collect())
}
