//! The sluice wire contract. Publishers in any language follow the JSON Schema
//! files in `schemas/json/`; these serde types are the Rust side of the same
//! contract, and a test keeps the two in agreement. No I/O here.

pub mod consumers;
mod error_code;
mod job;
mod message;
pub mod models;
pub mod names;
pub mod npy;
pub mod secret;
pub mod task;
pub mod trace_context;
pub use consumers::LiveConsumer;
pub use models::{DeployedModel, DeployedModels, NotDeployed};
pub use names::{DEFAULT_TENANT, Priority, Route, Topology, is_valid_tenant};
pub use secret::Secret;
pub use trace_context::TraceParent;
mod result;
mod stream;

pub use error_code::{ErrorCode, ErrorInfo};
pub use job::{
    Input, InputFormat, Job, JsonlError, ObjectRef, OutputOptions, Parameters, VERSION, ValidJob,
    parse_jsonl,
};
pub use message::truncate_for_message;
pub use result::{
    AnswerClaim, DeadLetter, FinishReason, Generation, InlineItems, JobResult, JobState, Logprob,
    Outcome, Output, S3Output, ServedBy, StatusRecord, Timings, TopLogprob, Usage,
};
pub use stream::{StreamChunk, StreamUsage};
pub use task::{
    ChatMessage, ClassifyParameters, EmbedParameters, EncoderParameters, GenerateParameters, Item,
    JsonSchemaFormat, LabelScore, MAX_PROMPT_NAME, Pair, Prompt, PromptInput, ResponseFormat, Task,
    TranscribeParameters, Transcript, TranscriptSegment, Work,
};

/// The JSON Schema files, embedded so tools can print or serve them.
pub mod json_schema {
    pub const JOB: &str = include_str!("../json/job.schema.json");
    pub const RESULT: &str = include_str!("../json/result.schema.json");
    pub const STATUS: &str = include_str!("../json/status.schema.json");
    pub const DEAD_LETTER: &str = include_str!("../json/dead_letter.schema.json");
    pub const STREAM_CHUNK: &str = include_str!("../json/stream_chunk.schema.json");
}
