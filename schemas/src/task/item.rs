//! A job's item, as its task reads it from a JSONL line or an inline list
//! entry: the one place that maps a task to its item's reader.

use serde_json::Value;

use super::generate::Prompt;
use super::kind::Task;
use super::rerank::Pair;
use super::{classify, embed, generate, rerank, transcribe};

/// One item of a job, parsed from a JSONL line or an inline list entry.
#[derive(Debug, Clone, PartialEq)]
pub enum Item {
    /// A text to embed or classify.
    Text(String),
    /// A prompt to generate from.
    Prompt(Prompt),
    /// A (query, document) pair to score.
    Pair(Pair),
    /// A recording to transcribe: the audio file's bytes.
    Audio(Vec<u8>),
}

impl Item {
    /// Reads one item as `task` expects it (see each task's `item`). The
    /// error says what was found instead.
    pub fn from_value(task: Task, value: Value) -> Result<Item, String> {
        match task {
            Task::Embed => embed::item(value).map(Item::Text),
            Task::Generate => generate::item(value).map(Item::Prompt),
            Task::Rerank => rerank::item(value).map(Item::Pair),
            Task::Classify => classify::item(value).map(Item::Text),
            Task::Transcribe => transcribe::item(value).map(Item::Audio),
        }
    }
}
