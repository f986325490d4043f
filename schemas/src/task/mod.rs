//! What each task's jobs carry, one file per task: its items (as a JSONL
//! line or an inline entry reads them) and its parameters, each declared
//! once as the task's own [`ParameterGroup`]. `Job` (`job.rs`) reads `task`
//! first, then checks that the parameters given are the task's.
//!
//! A new task is a file here, a variant of [`Task`] and of [`Item`], and a
//! group in `Parameters` where it has parameters.

pub mod classify;
pub mod embed;
pub mod encoder;
pub mod generate;
pub mod item;
pub mod kind;
pub mod parameters;
pub mod rerank;
pub mod transcribe;

pub use classify::{ClassifyParameters, LabelScore};
pub use embed::{EmbedParameters, MAX_PROMPT_NAME};
pub use encoder::EncoderParameters;
pub use generate::{
    ChatMessage, GenerateParameters, JsonSchemaFormat, Prompt, PromptInput, ResponseFormat,
};
pub use item::Item;
pub use kind::{SPECS, Spec, Task, Work};
pub use parameters::ParameterGroup;
pub use rerank::Pair;
pub use transcribe::{TranscribeParameters, Transcript, TranscriptSegment};
