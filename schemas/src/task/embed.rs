//! The embed task: texts, each to one vector.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::encoder::text_item;
use super::kind::Task;
use super::parameters::ParameterGroup;
use crate::message::truncate_for_message;

/// Longest `parameters.prompt_name`, in characters.
pub const MAX_PROMPT_NAME: usize = 64;

/// embed's own parameters.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EmbedParameters {
    /// L2-normalize the vectors. Default: as sentence-transformers does
    /// with the model (unit vectors where its `modules.json` lists a
    /// `Normalize` module, raw elsewhere), unless the consumer's operator
    /// set `--normalize`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub normalize: Option<bool>,
    /// The prompt of the model's `config_sentence_transformers.json` to put
    /// before every text, by name (e5's and bge's "query" / "passage");
    /// default: the model's `default_prompt_name`, if it has one. A name
    /// the model does not have fails the job with `invalid_parameters`. At
    /// most [`MAX_PROMPT_NAME`] characters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_name: Option<String>,
}

impl ParameterGroup for EmbedParameters {
    const TASKS: &'static [Task] = &[Task::Embed];

    fn check(&self) -> Result<(), String> {
        match &self.prompt_name {
            Some(name) if !(1..=MAX_PROMPT_NAME).contains(&name.chars().count()) => Err(format!(
                "parameters.prompt_name must be 1 to {MAX_PROMPT_NAME} characters, not {:?}",
                truncate_for_message(name)
            )),
            _ => Ok(()),
        }
    }
}

/// Reads one embed item: a JSON string or an object `{"text": "..."}`.
pub fn item(value: Value) -> Result<String, String> {
    text_item("an embed item", value)
}
