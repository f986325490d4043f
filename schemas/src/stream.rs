//! The streaming message: what a generate job that asked for `output.stream`
//! publishes as it decodes, on [`crate::Topology::stream_subject`].

use serde::{Deserialize, Serialize};

use crate::result::{FinishReason, Logprob};

/// One message of a streaming generate job: a prompt's new text since its
/// previous message, or (the prompt's last message) the rest of its text with
/// why it ended and what it used.
///
/// Per prompt and delivery, messages are numbered from 0 (`seq`); the
/// concatenation of a prompt's `text`s is its generation's `text` in the
/// result. Core NATS does not store them: subscribe before publishing the
/// job, and read a gap in `seq` as a message lost (the result still holds the
/// whole text). A redelivered job (a consumer that crashed mid-job) streams
/// again from the start under a higher `attempt`; with the same seed its
/// text is the same, so a reader that has shown some of it skips as many
/// bytes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamChunk {
    /// Always [`crate::VERSION`].
    pub version: u32,
    pub job_id: String,
    /// The prompt's index among the job's items.
    pub item: u32,
    /// The delivery of the job that generated this text (1 for the first).
    pub attempt: u32,
    /// This message's number among its prompt's messages of this attempt.
    pub seq: u64,
    /// New text (UTF-8 whole characters; may be empty).
    pub text: String,
    /// Only when the prompt asked for `logprobs`: those of the tokens
    /// generated since its previous message. A token's logprob may come a
    /// message before its text (text is held back while it may be the start
    /// of a stop sequence or ends inside a character); concatenated, a
    /// prompt's lists are its generation's `logprobs` in the result.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<Vec<Logprob>>,
    /// Only on a prompt's first message: milliseconds the job waited in the
    /// queue before a consumer pulled it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_ms: Option<f64>,
    /// Only on a prompt's last message: why it ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finish_reason: Option<FinishReason>,
    /// Only on a prompt's last message: its prompt and generated tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<StreamUsage>,
}

/// One prompt's tokens, on its last stream message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamUsage {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
}

impl StreamChunk {
    /// Whether this is its prompt's last message.
    pub fn is_last(&self) -> bool {
        self.finish_reason.is_some()
    }

    /// The message as it goes on the wire.
    pub fn to_bytes(&self) -> Vec<u8> {
        // Serializing these plain types cannot fail.
        serde_json::to_vec(self).unwrap_or_default()
    }
}
