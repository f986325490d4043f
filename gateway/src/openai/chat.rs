//! `/v1/chat/completions`: a body's messages as one generate item (its
//! sampling and logprobs with it).

use serde_json::{Map, Value, json};
use sluice_schemas::{GenerateParameters, Item, Task};

use super::request::RequestError;
use super::sampling::generate_parameters;

/// What logprobs a chat completions body asks for: `logprobs: true`, with
/// `top_logprobs` alternatives per token (0 to 20; default 0).
pub(super) fn chat_logprobs(body: &Map<String, Value>) -> Result<Option<u32>, RequestError> {
    let on = match body.get("logprobs") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(on)) => *on,
        Some(_) => {
            return Err(RequestError::invalid(
                "`logprobs` must be true or false",
                Some("logprobs"),
            ));
        }
    };
    let most = GenerateParameters::MAX_LOGPROBS;
    let top = match body.get("top_logprobs") {
        None | Some(Value::Null) => None,
        Some(v) => Some(
            v.as_u64()
                .filter(|&n| n <= u64::from(most))
                .ok_or_else(|| {
                    RequestError::invalid(
                        format!("`top_logprobs` must be a whole number from 0 to {most}"),
                        Some("top_logprobs"),
                    )
                })? as u32,
        ),
    };
    match (on, top) {
        (true, top) => Ok(Some(top.unwrap_or(0))),
        (false, Some(n)) if n > 0 => Err(RequestError::invalid(
            "`top_logprobs` needs `logprobs`: true",
            Some("top_logprobs"),
        )),
        (false, _) => Ok(None),
    }
}

pub(super) fn chat_item(body: &mut Map<String, Value>) -> Result<Value, RequestError> {
    let mut item = generate_parameters(body, None, chat_logprobs(body)?)?;
    let Some(Value::Array(messages)) = body.remove("messages") else {
        return Err(RequestError::invalid(
            "`messages` must be a list",
            Some("messages"),
        ));
    };
    let mut out = Vec::with_capacity(messages.len());
    for m in messages {
        let role = m.get("role").and_then(Value::as_str).unwrap_or_default();
        // OpenAI's newer name for the system role.
        let role = if role == "developer" { "system" } else { role };
        let content = match m.get("content") {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Array(parts)) => parts
                .iter()
                .map(|p| {
                    match (
                        p.get("type").and_then(Value::as_str),
                        p.get("text").and_then(Value::as_str),
                    ) {
                        (Some("text"), Some(t)) => Ok(t),
                        _ => Err(RequestError::invalid(
                            "only text content parts are supported",
                            Some("messages"),
                        )),
                    }
                })
                .collect::<Result<Vec<_>, _>>()?
                .join(""),
            _ => {
                return Err(RequestError::invalid(
                    "each message needs a `content` string",
                    Some("messages"),
                ));
            }
        };
        out.push(json!({"role": role, "content": content}));
    }
    item.insert("messages".into(), Value::Array(out));
    let item = Value::Object(item);
    Item::from_value(Task::Generate, item.clone())
        .map_err(|e| RequestError::invalid(e, Some("messages")))?;
    Ok(item)
}
