//! `/v1/rerank`, in the shape vLLM, llama-server, Jina and Cohere share: a
//! query and documents as rerank pairs, and the documents ranked.

use serde_json::{Map, Value, json};

use super::request::{Ranking, Request, RequestError};

/// A rerank body: `query` (a string), `documents` (a non-empty list of
/// strings or `{"text": ...}` objects, as Cohere's v2 and vLLM take),
/// `top_n` (a whole number >= 1; default: every document) and
/// `return_documents` (default false, as Cohere's).
pub(super) fn rerank_items(
    body: &mut Map<String, Value>,
) -> Result<(Vec<Value>, Ranking), RequestError> {
    let query = match body.remove("query") {
        Some(Value::String(q)) => q,
        _ => {
            return Err(RequestError::invalid(
                "`query` is required: the text to rank the documents against",
                Some("query"),
            ));
        }
    };
    let refused = || {
        RequestError::invalid(
            "`documents` must be a non-empty list of strings or {\"text\": ...} objects",
            Some("documents"),
        )
    };
    let documents: Vec<String> = match body.remove("documents") {
        Some(Value::Array(list)) if !list.is_empty() => list
            .into_iter()
            .map(|d| match d {
                Value::String(s) => Ok(s),
                Value::Object(mut o) if o.len() == 1 => match o.remove("text") {
                    Some(Value::String(s)) => Ok(s),
                    _ => Err(refused()),
                },
                _ => Err(refused()),
            })
            .collect::<Result<_, _>>()?,
        _ => return Err(refused()),
    };
    let top_n = match body.get("top_n") {
        None | Some(Value::Null) => None,
        Some(v) => match v.as_u64() {
            Some(n) if n >= 1 => Some(usize::try_from(n).unwrap_or(usize::MAX)),
            _ => {
                return Err(RequestError::invalid(
                    "`top_n` must be a whole number >= 1 (how many of the best documents to list)",
                    Some("top_n"),
                ));
            }
        },
    };
    let return_documents = match body.get("return_documents") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => {
            return Err(RequestError::invalid(
                "`return_documents` must be a boolean",
                Some("return_documents"),
            ));
        }
    };
    let items = documents
        .into_iter()
        .map(|document| json!({"query": query, "document": document}))
        .collect();
    Ok((
        items,
        Ranking {
            top_n,
            return_documents,
        },
    ))
}

/// The response body of a rerank request: the documents by relevance, best
/// first (ties in request order), the first `top_n` of them, each with its
/// index in the request, its score and, with `return_documents`, its text
/// (from the request's items).
pub fn rerank_body(id: &str, model: &str, request: &Request, scores: &[f32], tokens: u64) -> Value {
    let mut order: Vec<usize> = (0..scores.len()).collect();
    order.sort_by(|a, b| scores[*b].total_cmp(&scores[*a]));
    order.truncate(request.ranking.top_n.unwrap_or(usize::MAX));
    let results: Vec<Value> = order
        .into_iter()
        .map(|index| {
            let mut result = json!({"index": index, "relevance_score": scores[index]});
            if request.ranking.return_documents {
                let text = request
                    .items
                    .get(index)
                    .and_then(|item| item.get("document"))
                    .cloned()
                    .unwrap_or(Value::Null);
                result["document"] = json!({ "text": text });
            }
            result
        })
        .collect();
    json!({
        "id": format!("rerank-{id}"),
        "object": "list",
        "model": model,
        "results": results,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    })
}
