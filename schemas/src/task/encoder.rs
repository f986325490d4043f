//! What the encoder tasks, embed and rerank, share of their parameters.

use serde::{Deserialize, Serialize};

use super::kind::Task;
use super::parameters::ParameterGroup;

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
    const TASKS: &'static [Task] = &[Task::Embed, Task::Rerank];

    fn check(&self) -> Result<(), String> {
        Ok(())
    }
}
