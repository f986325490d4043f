//! The rerank task: (query, document) pairs, each scored by a
//! cross-encoder. Its one parameter, `truncate`, it shares with embed
//! ([`super::encoder::EncoderParameters`]).

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::message::kind_of;

/// One rerank item: how relevant `document` is to `query`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Pair {
    pub query: String,
    pub document: String,
}

/// Reads one rerank item: `{"query": "...", "document": "..."}`.
pub fn item(value: Value) -> Result<Pair, String> {
    match value {
        value @ Value::Object(_) => serde_json::from_value(value).map_err(|e| {
            format!("a rerank item is {{\"query\": \"...\", \"document\": \"...\"}}: {e}")
        }),
        other => Err(format!(
            "a rerank item must be an object {{\"query\": \"...\", \"document\": \"...\"}}, found {}",
            kind_of(&other)
        )),
    }
}
