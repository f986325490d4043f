//! The generate task: prompts (raw text, or chat messages through the
//! model's template), each with its own sampling and stopping, falling back
//! on the job's [`GenerateParameters`] and then on the consumer's defaults.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::kind::Task;
use super::parameters::ParameterGroup;
use crate::message::{kind_of, truncate_for_message};

/// Sampling and stopping of one generate prompt: given per job in
/// [`Parameters`](crate::Parameters), per prompt in its item; unset fields fall back in that order
/// and then on the consumer's defaults.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GenerateParameters {
    /// Most tokens to generate per prompt (default: the consumer's
    /// `--default-max-new-tokens`; at most its `--max-new-tokens`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_new_tokens: Option<u32>,
    /// Sampling temperature, 0 for greedy (the default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
    /// Nucleus sampling mass in (0, 1] (default 1: all tokens).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f64>,
    /// Sampling seed (default 0); same seed, same output.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
    /// Generation stops before the first of these texts (at most
    /// [`GenerateParameters::MAX_STOP`], none empty).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop: Option<Vec<String>>,
    /// The text must be JSON (any object, or valid against a JSON schema),
    /// decoded under that constraint token by token; OpenAI's
    /// `response_format`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_format: Option<ResponseFormat>,
    /// Answer each generated token's logprob with the step's `logprobs`
    /// most likely tokens (0 to [`GenerateParameters::MAX_LOGPROBS`];
    /// unset: no logprobs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<u32>,
}

impl ParameterGroup for GenerateParameters {
    const TASKS: &'static [Task] = &[Task::Generate];

    fn check(&self) -> Result<(), String> {
        GenerateParameters::check(self).map_err(|m| format!("parameters: {m}"))
    }
}

impl GenerateParameters {
    /// Most stop sequences per prompt.
    pub const MAX_STOP: usize = 8;
    /// Longest stop sequence, in bytes.
    pub const MAX_STOP_BYTES: usize = 256;
    /// Most alternatives `logprobs` lists per token (OpenAI's
    /// `top_logprobs` limit).
    pub const MAX_LOGPROBS: u32 = 20;

    /// `self` where set, else `fallback`.
    pub fn or(self, fallback: &GenerateParameters) -> GenerateParameters {
        GenerateParameters {
            max_new_tokens: self.max_new_tokens.or(fallback.max_new_tokens),
            temperature: self.temperature.or(fallback.temperature),
            top_p: self.top_p.or(fallback.top_p),
            seed: self.seed.or(fallback.seed),
            stop: self.stop.or_else(|| fallback.stop.clone()),
            response_format: self
                .response_format
                .or_else(|| fallback.response_format.clone()),
            logprobs: self.logprobs.or(fallback.logprobs),
        }
    }

    /// Refuses values without meaning; the message names the parameter.
    pub fn check(&self) -> Result<(), String> {
        if self.max_new_tokens == Some(0) {
            return Err("max_new_tokens must be at least 1".into());
        }
        if let Some(t) = self.temperature
            && !(t.is_finite() && t >= 0.0)
        {
            return Err(format!(
                "temperature must be a finite number >= 0 (0: greedy), not {t}"
            ));
        }
        if let Some(p) = self.top_p
            && !(p > 0.0 && p <= 1.0)
        {
            return Err(format!("top_p must be in (0, 1], not {p}"));
        }
        if let Some(stop) = &self.stop {
            if stop.len() > Self::MAX_STOP {
                return Err(format!(
                    "stop holds {} sequences; at most {} are accepted",
                    stop.len(),
                    Self::MAX_STOP
                ));
            }
            if let Some(i) = stop.iter().position(String::is_empty) {
                return Err(format!("stop[{i}] is empty"));
            }
            if let Some(i) = stop.iter().position(|s| s.len() > Self::MAX_STOP_BYTES) {
                return Err(format!(
                    "stop[{i}] is {} bytes; at most {} are accepted",
                    stop[i].len(),
                    Self::MAX_STOP_BYTES
                ));
            }
        }
        if let Some(format) = &self.response_format {
            format.check()?;
        }
        if let Some(k) = self.logprobs
            && k > Self::MAX_LOGPROBS
        {
            return Err(format!(
                "logprobs is {k}; at most {} alternatives per token are listed",
                Self::MAX_LOGPROBS
            ));
        }
        Ok(())
    }
}

/// What a generated text must be: OpenAI's `response_format`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum ResponseFormat {
    /// Free text (no constraint).
    Text,
    /// A JSON object, any.
    JsonObject,
    /// JSON valid against a schema.
    JsonSchema { json_schema: JsonSchemaFormat },
}

/// A `json_schema` response format, as OpenAI's API takes it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JsonSchemaFormat {
    /// The schema's name (letters, digits, `_` and `-`; at most 64).
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The JSON schema (an object).
    pub schema: Value,
    /// OpenAI's strict mode. Every schema is enforced here, strict or not:
    /// the text always validates (unless `max_new_tokens` cuts it short).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strict: Option<bool>,
}

impl ResponseFormat {
    /// Longest schema, serialized, in bytes.
    pub const MAX_SCHEMA_BYTES: usize = 64 * 1024;

    /// Refuses a name or schema that is not one; the schema's meaning is
    /// checked where it is compiled (the consumer).
    pub fn check(&self) -> Result<(), String> {
        let ResponseFormat::JsonSchema { json_schema } = self else {
            return Ok(());
        };
        let name = &json_schema.name;
        if name.is_empty()
            || name.len() > 64
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        {
            return Err(format!(
                "response_format.json_schema.name must be 1 to 64 letters, digits, '_' or '-', not {:?}",
                truncate_for_message(name)
            ));
        }
        if !json_schema.schema.is_object() {
            return Err(format!(
                "response_format.json_schema.schema must be a JSON object, found {}",
                kind_of(&json_schema.schema)
            ));
        }
        let bytes = json_schema.schema.to_string().len();
        if bytes > Self::MAX_SCHEMA_BYTES {
            return Err(format!(
                "response_format.json_schema.schema is {bytes} bytes; at most {} are accepted",
                Self::MAX_SCHEMA_BYTES
            ));
        }
        Ok(())
    }
}

/// One generate item: a raw prompt or chat messages, with its own parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct Prompt {
    pub input: PromptInput,
    /// Overrides of the job's parameters for this prompt.
    pub parameters: GenerateParameters,
}

/// What the model reads.
#[derive(Debug, Clone, PartialEq)]
pub enum PromptInput {
    /// Tokenized as is, no template.
    Text(String),
    /// Rendered through the model's chat template, ending with the assistant's turn.
    Messages(Vec<ChatMessage>),
}

/// One chat turn.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChatMessage {
    /// `system`, `user` or `assistant`.
    pub role: String,
    pub content: String,
}

impl ChatMessage {
    pub const ROLES: [&'static str; 3] = ["system", "user", "assistant"];
}

/// Reads one generate item: a JSON string (a raw prompt), `{"prompt":
/// "..."}` or `{"messages": [{"role", "content"}, ...]}`, the objects
/// optionally with their own [`GenerateParameters`].
pub fn item(value: Value) -> Result<Prompt, String> {
    let mut map = match value {
        Value::String(s) => {
            return Ok(Prompt {
                input: PromptInput::Text(s),
                parameters: GenerateParameters::default(),
            });
        }
        Value::Object(map) => map,
        other => {
            return Err(format!(
                "a generate item must be a JSON string, {{\"prompt\": \"...\"}} or {{\"messages\": [...]}}, found {}",
                kind_of(&other)
            ));
        }
    };
    let invalid = |e: serde_json::Error| format!("a generate item object is invalid: {e}");
    let prompt: Option<String> = map
        .remove("prompt")
        .map(serde_json::from_value)
        .transpose()
        .map_err(invalid)?
        .flatten();
    let messages: Option<Vec<ChatMessage>> = map
        .remove("messages")
        .map(serde_json::from_value)
        .transpose()
        .map_err(invalid)?
        .flatten();
    // The rest are the prompt's own parameters (and nothing else).
    let parameters: GenerateParameters =
        serde_json::from_value(Value::Object(map)).map_err(invalid)?;
    let input = match (prompt, messages) {
        (Some(p), None) => PromptInput::Text(p),
        (None, Some(messages)) => {
            if messages.is_empty() {
                return Err("a generate item's `messages` is empty".into());
            }
            if let Some(m) = messages
                .iter()
                .find(|m| !ChatMessage::ROLES.contains(&m.role.as_str()))
            {
                return Err(format!(
                    "unknown chat role {:?}; use one of {}",
                    truncate_for_message(&m.role),
                    ChatMessage::ROLES.join(", ")
                ));
            }
            PromptInput::Messages(messages)
        }
        (Some(_), Some(_)) => {
            return Err("a generate item has either `prompt` or `messages`, not both".into());
        }
        (None, None) => {
            return Err("a generate item object needs `prompt` or `messages`".into());
        }
    };
    Ok(Prompt { input, parameters })
}
