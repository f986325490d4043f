//! A batch's record in the gateway bucket (`batch.<id>`): its status, its
//! chunks and what the Batch object shows.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BatchStatus {
    Validating,
    Failed,
    InProgress,
    Finalizing,
    Completed,
    Expired,
    Cancelling,
    Cancelled,
}

impl BatchStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            BatchStatus::Validating => "validating",
            BatchStatus::Failed => "failed",
            BatchStatus::InProgress => "in_progress",
            BatchStatus::Finalizing => "finalizing",
            BatchStatus::Completed => "completed",
            BatchStatus::Expired => "expired",
            BatchStatus::Cancelling => "cancelling",
            BatchStatus::Cancelled => "cancelled",
        }
    }

    pub fn is_final(self) -> bool {
        matches!(
            self,
            BatchStatus::Failed
                | BatchStatus::Completed
                | BatchStatus::Expired
                | BatchStatus::Cancelled
        )
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Counts {
    pub total: u64,
    pub completed: u64,
    pub failed: u64,
}

/// A validation error, with the line it is on (1-based).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BatchError {
    pub code: String,
    pub message: String,
    pub param: Option<String>,
    pub line: Option<u64>,
}

/// Where a chunk job stands, as the driver last saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChunkState {
    /// Published (or to be published); not final yet.
    Pending,
    Done,
    /// Failed as a whole; a chunk of several lines is then split.
    Failed,
    /// Run again as one job per line (`<job>-l<n>`), after failing whole.
    Split,
    /// Cancelled or expired before it ran.
    NotRun,
}

/// A run of consecutive runnable lines of one model, run as one job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Chunk {
    /// `<batch id>-e<n>` (embed) or `-g<n>` (generate).
    pub job_id: String,
    pub model: String,
    /// embed: the prompt its lines asked for (`parameters.prompt_name`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_name: Option<String>,
    /// The input file's line numbers (1-based) of its first and last line;
    /// lines between them that failed alone are not in the chunk.
    pub first_line: u64,
    pub last_line: u64,
    /// Runnable lines in the chunk.
    pub lines: u64,
    pub state: ChunkState,
}

/// Who is working on a batch's validation or finalization, until when.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Lease {
    pub owner: String,
    pub until: i64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BatchRecord {
    pub id: String,
    pub tenant: String,
    pub endpoint: String,
    pub input_file_id: String,
    pub completion_window: String,
    pub metadata: Option<Map<String, Value>>,
    /// `output_expires_after`: seconds from their creation until the output
    /// and error files expire (None: `--retention-days`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_expires_after: Option<i64>,
    pub status: BatchStatus,
    pub created_at: i64,
    pub expires_at: i64,
    pub in_progress_at: Option<i64>,
    pub finalizing_at: Option<i64>,
    pub completed_at: Option<i64>,
    pub failed_at: Option<i64>,
    pub expired_at: Option<i64>,
    pub cancelling_at: Option<i64>,
    pub cancelled_at: Option<i64>,
    pub request_counts: Counts,
    pub output_file_id: Option<String>,
    pub error_file_id: Option<String>,
    pub errors: Vec<BatchError>,
    pub chunks: Vec<Chunk>,
    /// Lines that failed alone at validation (known before any chunk runs).
    pub failed_at_validation: u64,
    pub lease: Option<Lease>,
    /// The batch's trace (its create request's span): its chunk jobs and
    /// the driver's spans join it (`traces.rs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
}

impl BatchRecord {
    pub fn key(id: &str) -> String {
        format!("batch.{id}")
    }

    pub fn active_key(id: &str) -> String {
        format!("active.{id}")
    }

    /// The Batch object as the OpenAI SDKs parse it.
    pub fn to_api(&self) -> Value {
        let errors = (!self.errors.is_empty()).then(|| {
            json!({
                "object": "list",
                "data": self.errors,
            })
        });
        json!({
            "id": self.id,
            "object": "batch",
            "endpoint": self.endpoint,
            "errors": errors,
            "input_file_id": self.input_file_id,
            "completion_window": self.completion_window,
            "status": self.status,
            "output_file_id": self.output_file_id,
            "error_file_id": self.error_file_id,
            "created_at": self.created_at,
            "in_progress_at": self.in_progress_at,
            "expires_at": self.expires_at,
            "finalizing_at": self.finalizing_at,
            "completed_at": self.completed_at,
            "failed_at": self.failed_at,
            "expired_at": self.expired_at,
            "cancelling_at": self.cancelling_at,
            "cancelled_at": self.cancelled_at,
            "request_counts": self.request_counts,
            "metadata": self.metadata,
        })
    }
}

/// `24h`, `90m`, `30s`, `2d`: the completion window in seconds. OpenAI
/// accepts only `24h`; shorter windows serve tests and urgent work.
pub fn window_secs(window: &str) -> Option<i64> {
    let (number, unit) = window.split_at(window.len().checked_sub(1)?);
    let n: i64 = number.parse().ok().filter(|n| *n > 0)?;
    let scale = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return None,
    };
    n.checked_mul(scale).filter(|s| *s <= 7 * 86_400)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn completion_windows_read_as_durations() {
        assert_eq!(window_secs("24h"), Some(86_400));
        assert_eq!(window_secs("30s"), Some(30));
        assert_eq!(window_secs("2d"), Some(172_800));
        for bad in ["", "h", "0h", "-1h", "24", "1w", "8d"] {
            assert_eq!(window_secs(bad), None, "{bad}");
        }
    }
}
