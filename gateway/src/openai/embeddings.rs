//! `/v1/embeddings`: a body's texts as embed items, and the answer.

use base64::Engine;
use serde_json::{Map, Value, json};
use sluice_schemas::MAX_PROMPT_NAME;

use super::request::{RequestError, strings};

pub(super) fn embedding_items(
    body: &mut Map<String, Value>,
) -> Result<(Vec<Value>, bool), RequestError> {
    if body.get("dimensions").is_some_and(|d| !d.is_null()) {
        return Err(RequestError::invalid(
            "`dimensions` is not supported: the model answers with its own dimension",
            Some("dimensions"),
        ));
    }
    let base64 = match body.get("encoding_format").and_then(Value::as_str) {
        None | Some("float") => false,
        Some("base64") => true,
        Some(other) => {
            return Err(RequestError::invalid(
                format!("`encoding_format` must be \"float\" or \"base64\", not {other:?}"),
                Some("encoding_format"),
            ));
        }
    };
    let texts = strings(body.remove("input"), "input")?;
    // An empty text is embedded (as sentence-transformers does), where
    // OpenAI refuses it.
    Ok((texts.into_iter().map(Value::String).collect(), base64))
}

/// `prompt_name`: absent, null, or 1 to [`MAX_PROMPT_NAME`] characters (the
/// consumer refuses a name its model does not have).
pub(super) fn prompt_name(body: &Map<String, Value>) -> Result<Option<String>, RequestError> {
    match body.get("prompt_name") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(name)) if (1..=MAX_PROMPT_NAME).contains(&name.chars().count()) => {
            Ok(Some(name.clone()))
        }
        Some(_) => Err(RequestError::invalid(
            format!(
                "`prompt_name` must be the name of one of the model's prompts (a string of 1 to {MAX_PROMPT_NAME} characters)"
            ),
            Some("prompt_name"),
        )),
    }
}

/// `parameters.normalize` of the jobs an embeddings request becomes: OpenAI's
/// embeddings are unit vectors ("normalized to length 1", its API says, and
/// clients compute cosine as a dot product on that word), so the gateway
/// asks for them whatever the model's own modules do; other tasks take no
/// such parameter.
pub fn unit_vectors(task: sluice_schemas::Task) -> Option<bool> {
    (task == sluice_schemas::Task::Embed).then_some(true)
}

/// The response body of an embeddings request.
pub fn embeddings_body(model: &str, vectors: &[&[f32]], tokens: u64, base64: bool) -> Value {
    let data: Vec<Value> = vectors
        .iter()
        .enumerate()
        .map(|(index, v)| {
            let embedding = if base64 {
                let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                Value::String(base64::engine::general_purpose::STANDARD.encode(bytes))
            } else {
                json!(v)
            };
            json!({"object": "embedding", "index": index, "embedding": embedding})
        })
        .collect();
    json!({
        "object": "list",
        "data": data,
        "model": model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    })
}
