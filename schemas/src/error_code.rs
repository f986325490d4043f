//! The fixed set of error codes a result or dead letter can carry.

use serde::{Deserialize, Serialize};

/// Every error a user can cause has a code here, and every code says whether
/// retrying the same job can help. The wire form is the snake_case name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// The message is not JSON, or not UTF-8.
    MalformedMessage,
    /// JSON, but not a valid job: a missing or mistyped field, an unknown field.
    SchemaViolation,
    /// The job's `version` is one this consumer does not speak.
    UnsupportedVersion,
    /// The task is not one this consumer runs.
    UnknownTask,
    /// The model is not the one this consumer serves.
    UnknownModel,
    /// A parameter is out of range or does not apply to the task.
    InvalidParameters,
    /// The input URL's host is not on the allow-list (or is link-local/metadata).
    InputNotAllowed,
    /// The input URL answered 4xx: expired or tampered signature, missing object.
    InputUnavailable,
    /// The input is larger than the byte cap, or the inline input than its limit.
    InputTooLarge,
    /// The input is not valid UTF-8 JSONL of the expected shape.
    InputInvalid,
    /// An item has more tokens than the model accepts and truncation is off.
    ItemTooLong,
    /// The job has more items than the consumer accepts in one job.
    TooManyItems,
    /// The job's deadline passed before it ran.
    DeadlineExceeded,
    /// The job was cancelled before it ran.
    Cancelled,
    /// The input server failed (5xx), timed out or could not be reached.
    InputFetchFailed,
    /// The output store failed or could not be reached.
    StorageUnavailable,
    /// The device ran out of memory during the job's batch.
    DeviceOutOfMemory,
    /// The server gave up redelivering the job (max deliveries) without a final answer.
    MaxDeliveriesExceeded,
    /// A bug or an unexpected failure inside the consumer.
    Internal,
}

impl ErrorCode {
    /// Every code, for documentation and tests.
    pub const ALL: [ErrorCode; 19] = [
        ErrorCode::MalformedMessage,
        ErrorCode::SchemaViolation,
        ErrorCode::UnsupportedVersion,
        ErrorCode::UnknownTask,
        ErrorCode::UnknownModel,
        ErrorCode::InvalidParameters,
        ErrorCode::InputNotAllowed,
        ErrorCode::InputUnavailable,
        ErrorCode::InputTooLarge,
        ErrorCode::InputInvalid,
        ErrorCode::ItemTooLong,
        ErrorCode::TooManyItems,
        ErrorCode::DeadlineExceeded,
        ErrorCode::Cancelled,
        ErrorCode::InputFetchFailed,
        ErrorCode::StorageUnavailable,
        ErrorCode::DeviceOutOfMemory,
        ErrorCode::MaxDeliveriesExceeded,
        ErrorCode::Internal,
    ];

    /// Whether running the same job again can succeed.
    pub fn is_retryable(self) -> bool {
        matches!(
            self,
            ErrorCode::InputFetchFailed
                | ErrorCode::StorageUnavailable
                | ErrorCode::DeviceOutOfMemory
                | ErrorCode::Internal
        )
    }

    /// The wire name, e.g. `input_too_large`.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::MalformedMessage => "malformed_message",
            ErrorCode::SchemaViolation => "schema_violation",
            ErrorCode::UnsupportedVersion => "unsupported_version",
            ErrorCode::UnknownTask => "unknown_task",
            ErrorCode::UnknownModel => "unknown_model",
            ErrorCode::InvalidParameters => "invalid_parameters",
            ErrorCode::InputNotAllowed => "input_not_allowed",
            ErrorCode::InputUnavailable => "input_unavailable",
            ErrorCode::InputTooLarge => "input_too_large",
            ErrorCode::InputInvalid => "input_invalid",
            ErrorCode::ItemTooLong => "item_too_long",
            ErrorCode::TooManyItems => "too_many_items",
            ErrorCode::DeadlineExceeded => "deadline_exceeded",
            ErrorCode::Cancelled => "cancelled",
            ErrorCode::InputFetchFailed => "input_fetch_failed",
            ErrorCode::StorageUnavailable => "storage_unavailable",
            ErrorCode::DeviceOutOfMemory => "device_out_of_memory",
            ErrorCode::MaxDeliveriesExceeded => "max_deliveries_exceeded",
            ErrorCode::Internal => "internal",
        }
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An error as it travels in a result, a status record or a dead letter.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ErrorInfo {
    pub code: ErrorCode,
    /// A message for people: what was wrong and, where it helps, how to fix it.
    pub message: String,
    pub retryable: bool,
}

impl ErrorInfo {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        ErrorInfo {
            code,
            message: message.into(),
            retryable: code.is_retryable(),
        }
    }
}
