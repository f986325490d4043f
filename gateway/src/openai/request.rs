//! What a request is, whichever endpoint it came to: the endpoints, a
//! request that can run (its job items and what its answer needs), and the
//! two ways one fails (a batch line that is not a request; a request that
//! fails alone, in OpenAI's error shape).

use serde_json::{Value, json};
use sluice_schemas::Task;

use super::responses::Echo;

/// The endpoints a batch line may call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Embeddings,
    ChatCompletions,
    Completions,
    /// The rerank API vLLM, llama-server, Jina and Cohere share (not
    /// OpenAI's): a query, documents, the documents ranked.
    Rerank,
    /// OpenAI's Responses API, for text (see [`super::responses`]).
    Responses,
    /// vLLM's classify API (not OpenAI's): texts, each to its labels.
    Classify,
    /// OpenAI's audio endpoints: a recording to its transcript, or to
    /// English. Online they take a multipart form (`audio.rs`); a batch
    /// line's body names the recording (`transcriptions.rs`).
    AudioTranscriptions,
    AudioTranslations,
}

impl Endpoint {
    pub const ALL: [Endpoint; 8] = [
        Endpoint::Embeddings,
        Endpoint::ChatCompletions,
        Endpoint::Completions,
        Endpoint::Rerank,
        Endpoint::Responses,
        Endpoint::Classify,
        Endpoint::AudioTranscriptions,
        Endpoint::AudioTranslations,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Endpoint::Embeddings => "/v1/embeddings",
            Endpoint::ChatCompletions => "/v1/chat/completions",
            Endpoint::Completions => "/v1/completions",
            Endpoint::Rerank => "/v1/rerank",
            Endpoint::Responses => "/v1/responses",
            Endpoint::Classify => "/v1/classify",
            Endpoint::AudioTranscriptions => "/v1/audio/transcriptions",
            Endpoint::AudioTranslations => "/v1/audio/translations",
        }
    }

    pub fn parse(url: &str) -> Option<Endpoint> {
        Endpoint::ALL.into_iter().find(|e| e.as_str() == url)
    }

    pub fn task(self) -> Task {
        match self {
            Endpoint::Embeddings => Task::Embed,
            Endpoint::ChatCompletions | Endpoint::Completions | Endpoint::Responses => {
                Task::Generate
            }
            Endpoint::Rerank => Task::Rerank,
            Endpoint::Classify => Task::Classify,
            Endpoint::AudioTranscriptions | Endpoint::AudioTranslations => Task::Transcribe,
        }
    }

    /// Whether an online request is a JSON body (`online.rs`); the audio
    /// endpoints take a multipart form (`audio.rs`).
    pub fn takes_json(self) -> bool {
        self.task() != Task::Transcribe
    }

    /// Whether the endpoint answers `stream: true` (the generate ones).
    pub fn streams(self) -> bool {
        self.task().work() == sluice_schemas::Work::Generate
    }

    pub fn list() -> String {
        Endpoint::ALL.map(Endpoint::as_str).join(", ")
    }
}

/// A line that fails the batch's validation.
#[derive(Debug, Clone, PartialEq)]
pub struct LineError {
    pub code: &'static str,
    pub message: String,
    pub param: Option<&'static str>,
}

/// A request that fails alone: its HTTP status and OpenAI error body.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestError {
    pub status: u16,
    pub code: &'static str,
    pub message: String,
    pub param: Option<&'static str>,
}

impl RequestError {
    pub(super) fn invalid(message: impl Into<String>, param: Option<&'static str>) -> RequestError {
        RequestError {
            status: 400,
            code: "invalid_request_error",
            message: message.into(),
            param,
        }
    }

    pub fn body(&self) -> Value {
        json!({"error": {
            "message": self.message,
            "type": if self.status >= 500 { "server_error" } else { "invalid_request_error" },
            "param": self.param,
            "code": self.code,
        }})
    }
}

/// A request that can run: its items, in the order the consumer answers them.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    pub endpoint: Endpoint,
    pub model: String,
    /// The job items (embed, classify: texts; generate: prompt objects;
    /// rerank: one `{"query", "document"}` pair per document, in the
    /// request's order).
    pub items: Vec<Value>,
    /// embeddings: answer vectors as base64 of little-endian float32.
    pub base64: bool,
    /// embeddings: the model's prompt to put before each text, by name (a
    /// body field sentence-transformers servers take; OpenAI's SDKs send it
    /// with `extra_body`). None: the model's default prompt.
    pub prompt_name: Option<String>,
    /// rerank: what the answer lists.
    pub ranking: Ranking,
    /// responses: the request's fields its answer repeats.
    pub echo: Option<Echo>,
    /// audio: how the transcript is answered, and whether it is a
    /// translation.
    pub audio: Option<super::transcriptions::Answering>,
}

/// What a rerank answer lists: the `top_n` best documents (none: all),
/// each with its text when `return_documents`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Ranking {
    pub top_n: Option<usize>,
    pub return_documents: bool,
}

/// What one line of a batch file is.
#[derive(Debug, Clone, PartialEq)]
pub enum Line {
    Run {
        custom_id: String,
        request: Request,
    },
    Fail {
        custom_id: String,
        error: RequestError,
    },
}

impl Line {
    pub fn custom_id(&self) -> &str {
        match self {
            Line::Run { custom_id, .. } | Line::Fail { custom_id, .. } => custom_id,
        }
    }
}

/// `input` / `prompt`: a string or a non-empty list of strings.
pub(super) fn strings(
    value: Option<Value>,
    name: &'static str,
) -> Result<Vec<String>, RequestError> {
    let refused = || {
        RequestError::invalid(
            format!(
                "`{name}` must be a string or a non-empty list of strings (token arrays are not supported)"
            ),
            Some(name),
        )
    };
    match value {
        Some(Value::String(s)) => Ok(vec![s]),
        Some(Value::Array(list)) if !list.is_empty() => list
            .into_iter()
            .map(|v| match v {
                Value::String(s) => Ok(s),
                _ => Err(refused()),
            })
            .collect(),
        _ => Err(refused()),
    }
}
