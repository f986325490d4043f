//! The job message: what a publisher puts on `sluice.jobs.<task>`.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use time::OffsetDateTime;

use crate::error_code::{ErrorCode, ErrorInfo};
use crate::message::{kind_of, truncate_for_message};
use crate::names::is_valid_job_id;
use crate::task::parameters::{ParameterGroup, field_names};
use crate::task::{
    ClassifyParameters, EmbedParameters, EncoderParameters, GenerateParameters, Item, Task,
    TranscribeParameters,
};

/// The wire version every message of this crate carries.
pub const VERSION: u32 = 1;

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
    /// `embed`, `generate`, `rerank` or `classify`.
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
    /// One audio file (WAV, FLAC, MP3, Ogg Vorbis, AAC in MP4/M4A; the
    /// container read from its bytes), one item: transcribe's input.
    Audio,
}

/// An object in S3.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ObjectRef {
    pub bucket: String,
    pub key: String,
}

/// A job's parameters: each task's own group, declared once in its file
/// under `task/`; on the wire, one flat object. A parameter given to a
/// task it does not apply to is refused with `invalid_parameters`; one no
/// task knows, with `schema_violation`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Parameters {
    /// embed, rerank and classify: `truncate`.
    pub encoder: EncoderParameters,
    /// embed: `normalize`, `prompt_name`.
    pub embed: EmbedParameters,
    /// generate: sampling and stopping, for a prompt's own to fall back on.
    pub generate: GenerateParameters,
    /// classify: `top_k`, `raw_scores`.
    pub classify: ClassifyParameters,
    /// transcribe: `language`, `translate`.
    pub transcribe: TranscribeParameters,
}

/// One group's parameters as the wire has them, with the tasks they apply
/// to, in declaration order.
struct Given {
    names: &'static [&'static str],
    values: serde_json::Map<String, Value>,
    tasks: &'static [Task],
}

impl Parameters {
    pub fn is_default(&self) -> bool {
        *self == Parameters::default()
    }

    /// The encoder tasks: cut an item over the model's limit (default true).
    pub fn truncate(&self) -> bool {
        self.encoder.truncate.unwrap_or(true)
    }

    /// Every group, as the wire has it.
    fn groups(&self) -> Result<[Given; 5], serde_json::Error> {
        fn given<G: ParameterGroup>(group: &G) -> Result<Given, serde_json::Error> {
            let values = match serde_json::to_value(group)? {
                Value::Object(map) => map,
                _ => serde_json::Map::new(),
            };
            Ok(Given {
                names: field_names::<G>(),
                values,
                tasks: G::TASKS,
            })
        }
        Ok([
            given(&self.encoder)?,
            given(&self.embed)?,
            given(&self.generate)?,
            given(&self.classify)?,
            given(&self.transcribe)?,
        ])
    }

    /// Each parameter given, with the tasks it applies to.
    fn given(&self) -> Vec<(&'static str, &'static [Task])> {
        let Ok(groups) = self.groups() else {
            return Vec::new();
        };
        groups
            .iter()
            .flat_map(|g| {
                g.names
                    .iter()
                    .filter(|name| g.values.contains_key(**name))
                    .map(|name| (*name, g.tasks))
            })
            .collect()
    }

    /// Every group's own checks.
    fn check(&self) -> Result<(), String> {
        self.encoder.check()?;
        ParameterGroup::check(&self.embed)?;
        ParameterGroup::check(&self.generate)?;
        ParameterGroup::check(&self.classify)?;
        ParameterGroup::check(&self.transcribe)
    }

    /// Every parameter name any task knows, for serde's "expected one of".
    fn all_names() -> &'static [&'static str] {
        static ALL: std::sync::OnceLock<Vec<&'static str>> = std::sync::OnceLock::new();
        ALL.get_or_init(|| {
            [
                field_names::<EncoderParameters>(),
                field_names::<EmbedParameters>(),
                field_names::<GenerateParameters>(),
                field_names::<ClassifyParameters>(),
                field_names::<TranscribeParameters>(),
            ]
            .concat()
        })
    }
}

impl Serialize for Parameters {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::{Error, SerializeMap};
        let groups = self.groups().map_err(S::Error::custom)?;
        let mut map = serializer.serialize_map(None)?;
        for g in &groups {
            for name in g.names {
                if let Some(value) = g.values.get(*name) {
                    map.serialize_entry(name, value)?;
                }
            }
        }
        map.end()
    }
}

impl<'de> Deserialize<'de> for Parameters {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let wire = serde_json::Map::<String, Value>::deserialize(deserializer)?;
        let mut parts: [serde_json::Map<String, Value>; 5] = Default::default();
        let names = [
            field_names::<EncoderParameters>(),
            field_names::<EmbedParameters>(),
            field_names::<GenerateParameters>(),
            field_names::<ClassifyParameters>(),
            field_names::<TranscribeParameters>(),
        ];
        for (key, value) in wire {
            let Some(group) = names.iter().position(|n| n.contains(&key.as_str())) else {
                return Err(D::Error::unknown_field(&key, Parameters::all_names()));
            };
            parts[group].insert(key, value);
        }
        fn group<G: ParameterGroup, E: Error>(
            part: serde_json::Map<String, Value>,
        ) -> Result<G, E> {
            serde_path_to_error::deserialize(Value::Object(part)).map_err(|e| {
                let path = e.path().to_string();
                E::custom(format!("{path}: {}", e.into_inner()))
            })
        }
        let [encoder, embed, generate, classify, transcribe] = parts;
        Ok(Parameters {
            encoder: group(encoder)?,
            embed: group(embed)?,
            generate: group(generate)?,
            classify: group(classify)?,
            transcribe: group(transcribe)?,
        })
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
                    format!(
                        "missing or non-string field `task` (one of {})",
                        Task::ALL.map(Task::as_str).join(", ")
                    ),
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
                Input::Url { url, format, .. } => {
                    if !(url.starts_with("http://") || url.starts_with("https://")) {
                        return violation(format!(
                            "inputs[{i}].url must be an http:// or https:// URL, found {:?}",
                            truncate_for_message(url)
                        ));
                    }
                    let audio = task == Task::Transcribe;
                    if audio != (*format == InputFormat::Audio) {
                        return violation(if audio {
                            format!(
                                "inputs[{i}].format must be \"audio\": a transcribe job's URL inputs are audio files"
                            )
                        } else {
                            format!(
                                "inputs[{i}].format \"audio\" is transcribe's; a {task} job reads \"jsonl\""
                            )
                        });
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
                [most @ .., last] => format!(
                    "the {} and {last} tasks",
                    most.iter()
                        .map(|t| t.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                [] => "no task".into(),
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
        self.parameters
            .check()
            .map_err(|m| ErrorInfo::new(ErrorCode::InvalidParameters, m))?;
        if task != Task::Generate && self.output.stream() {
            return Err(ErrorInfo::new(
                ErrorCode::InvalidParameters,
                format!(
                    "output.stream applies to generate jobs only (the {task} task's output comes whole in its result)"
                ),
            ));
        }
        Ok(())
    }

    /// The job as it goes on the wire.
    pub fn to_bytes(&self) -> Vec<u8> {
        // Serializing these plain types cannot fail.
        serde_json::to_vec(self).unwrap_or_default()
    }
}
