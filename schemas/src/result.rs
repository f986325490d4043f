//! The result message (published to the job's reply subject), the status record
//! (kept per job in the status KV bucket) and the dead-letter entry.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

use crate::error_code::{ErrorCode, ErrorInfo};
use crate::task::{LabelScore, Transcript};

/// The answer to one job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobResult {
    /// Always [`crate::VERSION`].
    pub version: u32,
    /// The job's id: the body's `id` when it can be read, else the
    /// message's `Nats-Msg-Id` header when that is a valid id, else `null`
    /// (a message with neither, answered only because it named a
    /// `Sluice-Reply-To` subject; such a result is always an error).
    pub job_id: Option<String>,
    /// `"status": "ok"` with `output`, or `"status": "error"` with `error`.
    #[serde(flatten)]
    pub outcome: Outcome,
    #[serde(default)]
    pub usage: Usage,
    #[serde(default)]
    pub timings_ms: Timings,
    /// Which delivery of the job produced this result (1 for the first).
    pub attempt: u32,
    /// Which consumer answered (absent from older consumers' results).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub served_by: Option<ServedBy>,
    #[serde(with = "time::serde::rfc3339")]
    pub finished_at: OffsetDateTime,
}

/// The model a consumer loaded and the forward that runs it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServedBy {
    /// Its `--model-name`: the `model` its jobs name.
    pub model: String,
    /// `EmbeddingModel::forward_name` (embed) or the llama step (generate).
    pub forward: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum Outcome {
    Ok { output: Output },
    Error { error: ErrorInfo },
}

/// Where the output is.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum Output {
    /// Small outputs travel in the result itself.
    Inline {
        /// embed: one vector per item, in item order.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        embeddings: Vec<Vec<f32>>,
        /// generate: one generation per prompt, in item order.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        generations: Vec<Generation>,
        /// rerank: one relevance score per pair, in item order (the
        /// model's activation applied: a probability for a sigmoid head).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        scores: Vec<f32>,
        /// classify: each text's labels, best first (cut at the job's
        /// `top_k`), in item order.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        classifications: Vec<Vec<LabelScore>>,
        /// transcribe: one transcript per recording, in item order.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        transcripts: Vec<Transcript>,
    },
    /// Large outputs are written to S3 at a key derived from the job id.
    S3(S3Output),
}

impl Output {
    /// An inline embed output.
    pub fn embeddings(embeddings: Vec<Vec<f32>>) -> Output {
        Output::Inline {
            embeddings,
            generations: Vec::new(),
            scores: Vec::new(),
            classifications: Vec::new(),
            transcripts: Vec::new(),
        }
    }
    /// An inline generate output.
    pub fn generations(generations: Vec<Generation>) -> Output {
        Output::Inline {
            embeddings: Vec::new(),
            generations,
            scores: Vec::new(),
            classifications: Vec::new(),
            transcripts: Vec::new(),
        }
    }
    /// An inline rerank output.
    pub fn scores(scores: Vec<f32>) -> Output {
        Output::Inline {
            embeddings: Vec::new(),
            generations: Vec::new(),
            scores,
            classifications: Vec::new(),
            transcripts: Vec::new(),
        }
    }
    /// An inline classify output.
    pub fn classifications(classifications: Vec<Vec<LabelScore>>) -> Output {
        Output::Inline {
            embeddings: Vec::new(),
            generations: Vec::new(),
            scores: Vec::new(),
            classifications,
            transcripts: Vec::new(),
        }
    }
    /// An inline transcribe output.
    pub fn transcripts(transcripts: Vec<Transcript>) -> Output {
        Output::Inline {
            embeddings: Vec::new(),
            generations: Vec::new(),
            scores: Vec::new(),
            classifications: Vec::new(),
            transcripts,
        }
    }

    /// An inline output's items in the shape they would have in S3
    /// (`npy` rows, `npy` scores, `jsonl` lines), whichever task's, so a
    /// reader of results needs not name the tasks; `None` for an S3 output.
    pub fn inline_items(self) -> Option<InlineItems> {
        let Output::Inline {
            embeddings,
            generations,
            scores,
            classifications,
            transcripts,
        } = self
        else {
            return None;
        };
        Some(if !scores.is_empty() {
            InlineItems::Scores(scores)
        } else if !generations.is_empty() {
            InlineItems::Lines(json_lines(generations))
        } else if !classifications.is_empty() {
            InlineItems::Lines(json_lines(classifications))
        } else if !transcripts.is_empty() {
            InlineItems::Lines(json_lines(transcripts))
        } else {
            InlineItems::Vectors(embeddings)
        })
    }
}

/// Each item as JSON (these types always serialize: no map has a key that
/// is not a string).
fn json_lines<T: Serialize>(items: Vec<T>) -> Vec<serde_json::Value> {
    items
        .into_iter()
        .map(|i| serde_json::to_value(i).unwrap_or(serde_json::Value::Null))
        .collect()
}

/// See [`Output::inline_items`].
#[derive(Debug, Clone, PartialEq)]
pub enum InlineItems {
    /// One vector per item.
    Vectors(Vec<Vec<f32>>),
    /// One score per item.
    Scores(Vec<f32>),
    /// One JSON value per item (a generation, a text's labels).
    Lines(Vec<serde_json::Value>),
}

/// What one prompt produced: inline in a result, or one line of a JSONL
/// output in S3.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Generation {
    pub text: String,
    pub finish_reason: FinishReason,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    /// Only when the prompt's parameters asked for `logprobs`: one per
    /// generated token, in order (a stop sequence's tokens included, the
    /// end-of-turn token that ended it not).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<Vec<Logprob>>,
}

/// A generated token's log-probability under the model's own distribution
/// at its step (the softmax of its logits, before temperature, top-p and a
/// `response_format`'s mask), with the step's most likely tokens.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Logprob {
    /// The token's id in the model's vocabulary.
    pub id: u32,
    /// Its text (a piece of a UTF-8 character shows as U+FFFD; `bytes` has
    /// it exactly).
    pub token: String,
    pub bytes: Vec<u8>,
    /// Natural log; [`Logprob::FLOOR`] at the lowest.
    pub logprob: f32,
    /// The step's `logprobs` most likely tokens, most likely first (ties:
    /// the lower id first); empty when `logprobs` is 0.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub top_logprobs: Vec<TopLogprob>,
}

/// One of a step's most likely tokens.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TopLogprob {
    pub id: u32,
    pub token: String,
    pub bytes: Vec<u8>,
    pub logprob: f32,
}

impl Logprob {
    /// The lowest logprob on the wire, as OpenAI's API answers a token of
    /// no probability (JSON has no -infinity).
    pub const FLOOR: f32 = -9999.0;

    /// `logprob` as the wire carries it: at least [`Logprob::FLOOR`].
    pub fn floored(logprob: f32) -> f32 {
        if logprob.is_nan() {
            Self::FLOOR
        } else {
            logprob.max(Self::FLOOR)
        }
    }
}

/// Why a generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// `max_new_tokens` reached.
    Length,
    /// A stop sequence appeared (it is not part of the text).
    Stop,
    /// The model ended its turn.
    Eos,
}

impl FinishReason {
    /// The wire name: `length`, `stop` or `eos`.
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Length => "length",
            FinishReason::Stop => "stop",
            FinishReason::Eos => "eos",
        }
    }
}

/// An output object in S3.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct S3Output {
    pub bucket: String,
    pub key: String,
    /// Size of the object in bytes.
    pub bytes: u64,
    /// Lowercase hex SHA-256 of the object's bytes.
    pub sha256: String,
    /// `npy` (embed: float32, shape `[items, dim]`; rerank: float32, shape
    /// `[items]`) or `jsonl` (generate: one [`Generation`] per line, in item
    /// order).
    pub format: String,
    /// The array's shape, for `npy`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shape: Vec<u64>,
    /// A presigned GET URL, when the job asked for one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
}

/// What the job consumed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Usage {
    pub items: u64,
    /// Real (unpadded) tokens after truncation; for generate, prompt tokens.
    pub tokens: u64,
    /// Items that were cut to the model's limit.
    #[serde(default)]
    pub truncated_items: u64,
    /// generate: tokens generated, over all prompts.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub completion_tokens: u64,
    /// Each item's tokens (after truncation; for generate, its prompt's), in
    /// item order, when the job asked with `output.item_tokens`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub item_tokens: Vec<u64>,
    /// transcribe: milliseconds of audio, over all recordings.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub audio_ms: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Milliseconds spent in each stage. A stage the job did not reach is absent.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Timings {
    /// From publish (the stream's timestamp) to the consumer pulling the job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fetch: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokenize: Option<f64>,
    /// From the last item being ready to the last batch starting.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch_wait: Option<f64>,
    /// Sum of the model time of the batches that held the job's items.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inference: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub write: Option<f64>,
    /// From pulling the job until its output was written: the status write
    /// and the result's publish come after it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total: Option<f64>,
}

/// The lifecycle state of a job in the status bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobState {
    Queued,
    Running,
    Done,
    Failed,
    Cancelled,
    /// The job's deadline passed before it ran: it waited in the stream
    /// (which removes it at its deadline, see `Nats-TTL`) or a consumer
    /// pulled it too late. It was never run.
    Expired,
}

impl JobState {
    /// Done, failed, cancelled and expired are final: nothing overwrites them except a replay.
    pub fn is_final(self) -> bool {
        matches!(
            self,
            JobState::Done | JobState::Failed | JobState::Cancelled | JobState::Expired
        )
    }

    /// The state a record in this state with this `deadline` reads as at
    /// `now`: `queued` past its deadline is `expired`.
    pub fn as_of(self, deadline: Option<OffsetDateTime>, now: OffsetDateTime) -> JobState {
        if self == JobState::Queued && deadline.is_some_and(|d| d <= now) {
            JobState::Expired
        } else {
            self
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Queued => "queued",
            JobState::Running => "running",
            JobState::Done => "done",
            JobState::Failed => "failed",
            JobState::Cancelled => "cancelled",
            JobState::Expired => "expired",
        }
    }
}

/// One record per job in the status KV bucket, keyed by job id.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StatusRecord {
    pub version: u32,
    pub job_id: String,
    pub state: JobState,
    #[serde(with = "time::serde::rfc3339")]
    pub updated_at: OffsetDateTime,
    /// Deliveries so far.
    #[serde(default)]
    pub attempts: u32,
    /// The job message's sequence in the job stream.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream_sequence: Option<u64>,
    /// On done: where the output is (S3 only; inline outputs are in the result).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<S3Output>,
    /// On failed: why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorInfo>,
    /// On done: what the job consumed (as in its result).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// How many times the job was replayed from the dead-letter stream.
    #[serde(default)]
    pub replays: u32,
    /// The job's deadline, when it has one (written with `queued`): a
    /// `queued` record whose deadline has passed reads as `expired` (see
    /// [`StatusRecord::as_of`]), since the stream removed the job unrun.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "time::serde::rfc3339::option"
    )]
    pub deadline: Option<OffsetDateTime>,
    /// The deliveries that answered this record after another writer made
    /// it final (a cancel, an expiry): each claimed its answer here, by a
    /// compare-and-swap, before publishing it, so a job message whose
    /// record is already final is answered by one delivery only. At most
    /// one per job message; the newest [`StatusRecord::MAX_ANSWERED`] kept.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub answered: Vec<AnswerClaim>,
}

/// One delivery's claim to answer a job whose record was already final
/// (see [`StatusRecord::answered`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AnswerClaim {
    /// The job message's sequence in the job stream.
    pub stream_sequence: u64,
    /// Its delivery that answered (from 1).
    pub attempt: u32,
}

impl StatusRecord {
    /// How many answer claims a record keeps (one per job message; more
    /// than one message under one id is rare: a re-submit after the
    /// duplicate window).
    pub const MAX_ANSWERED: usize = 8;

    /// The record as a reader should take it at `now`: a job still `queued`
    /// after its deadline is `expired` (with `deadline_exceeded` as its
    /// error), because the stream dropped it at the deadline (its
    /// `Nats-TTL`) or a consumer will refuse it; nothing writes that
    /// transition, so every reader applies this rule. Other records are
    /// returned as they are.
    pub fn as_of(mut self, now: OffsetDateTime) -> StatusRecord {
        if let Some(deadline) = self.deadline
            && self.state.as_of(Some(deadline), now) != self.state
        {
            self.state = JobState::Expired;
            self.error = Some(ErrorInfo::new(
                ErrorCode::DeadlineExceeded,
                format!(
                    "the job's deadline ({}) passed while it waited in the stream; it was not run",
                    deadline
                        .format(&time::format_description::well_known::Rfc3339)
                        .unwrap_or_default()
                ),
            ));
        }
        self
    }
}

/// A job that will not be retried, as kept in the dead-letter stream.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeadLetter {
    pub version: u32,
    /// Absent when the message was too broken to read an id from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_id: Option<String>,
    pub error: ErrorInfo,
    /// Deliveries made before giving up.
    pub attempts: u32,
    pub original_subject: String,
    pub stream_sequence: u64,
    #[serde(with = "time::serde::rfc3339")]
    pub dead_lettered_at: OffsetDateTime,
    /// The original message's headers, name to values.
    #[serde(default)]
    pub headers: BTreeMap<String, Vec<String>>,
    /// The original payload, base64 (standard alphabet, padded); empty when
    /// it is kept in `payload_object` instead.
    pub payload_base64: String,
    /// Where the original payload is kept when it is too large to carry
    /// here (its base64 would pass the server's max payload): an object in
    /// the consumer's output bucket, kept beside the dead letter.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payload_object: Option<crate::ObjectRef>,
}
