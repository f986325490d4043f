//! What the encoder tasks, embed, rerank and classify, share: their
//! parameters, and the text item embed and classify read.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::kind::Task;
use super::parameters::ParameterGroup;
use crate::message::kind_of;

/// The encoder tasks' shared parameters.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EncoderParameters {
    /// Cut items longer than the model's limit (default true, like
    /// sentence-transformers; a pair loses tokens from its longer text
    /// first); when false such an item fails the job with `item_too_long`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub truncate: Option<bool>,
}

impl ParameterGroup for EncoderParameters {
    const TASKS: &'static [Task] = &[Task::Embed, Task::Rerank, Task::Classify];

    fn check(&self) -> Result<(), String> {
        Ok(())
    }
}

/// Reads one text item, a JSON string or an object `{"text": "..."}`;
/// `what` names it in messages ("an embed item").
pub(crate) fn text_item(what: &str, value: Value) -> Result<String, String> {
    match value {
        Value::String(s) => Ok(s),
        Value::Object(mut map) => match map.remove("text") {
            Some(Value::String(s)) if map.is_empty() => Ok(s),
            Some(Value::String(_)) => Err(format!(
                "{what} object has only the key \"text\", found also {:?}",
                map.keys().collect::<Vec<_>>()
            )),
            _ => Err(format!(
                "{what} must be a JSON string or {{\"text\": \"...\"}}"
            )),
        },
        other => Err(format!(
            "{what} must be a JSON string or {{\"text\": \"...\"}}, found {}",
            kind_of(&other)
        )),
    }
}
