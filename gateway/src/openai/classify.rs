//! `/v1/classify`, in vLLM's shape (SGLang's too): `input`'s texts as
//! classify items, and each text's label scores in the labels' id order
//! (`probs`), with its best label.

use serde_json::{Map, Value, json};
use sluice_schemas::LabelScore;

use super::request::{RequestError, strings};

/// A classify body's texts: `input`, a string or a non-empty list of them.
pub(super) fn classify_items(body: &mut Map<String, Value>) -> Result<Vec<Value>, RequestError> {
    Ok(strings(body.remove("input"), "input")?
        .into_iter()
        .map(Value::String)
        .collect())
}

/// The response body of a classify request: per text, its best label and
/// every label's score in id order (the job asked for every label, best
/// first; ties keep the lower id first, as the answer's `label`).
pub fn classify_body(
    id: &str,
    model: &str,
    created: i64,
    answers: &[Vec<LabelScore>],
    tokens: u64,
) -> Value {
    let data: Vec<Value> = answers
        .iter()
        .enumerate()
        .map(|(index, labels)| {
            let mut probs = vec![0f32; labels.len()];
            for l in labels {
                if let Some(p) = probs.get_mut(l.id as usize) {
                    *p = l.score;
                }
            }
            json!({
                "index": index,
                "label": labels.first().map(|l| l.label.as_str()),
                "probs": probs,
                "num_classes": labels.len(),
            })
        })
        .collect();
    json!({
        "id": format!("classify-{id}"),
        "object": "list",
        "created": created,
        "model": model,
        "data": data,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0},
    })
}
