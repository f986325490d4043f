//! The consumer's one error type for a job: a stable code from the wire
//! contract (which says whether retrying helps) and a message for people.

use sluice_schemas::{ErrorCode, ErrorInfo};

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct JobError {
    pub code: ErrorCode,
    pub message: String,
}

impl JobError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> JobError {
        JobError {
            code,
            message: message.into(),
        }
    }

    pub fn is_retryable(&self) -> bool {
        self.code.is_retryable()
    }

    pub fn info(&self) -> ErrorInfo {
        ErrorInfo::new(self.code, self.message.clone())
    }
}

/// The status bucket is NATS: a failure there is retried like storage.
impl From<sluice_status::StatusError> for JobError {
    fn from(e: sluice_status::StatusError) -> JobError {
        let mut message = e.to_string();
        let mut cause = std::error::Error::source(&e);
        while let Some(c) = cause {
            message.push_str(&format!(": {c}"));
            cause = c.source();
        }
        JobError::new(ErrorCode::StorageUnavailable, message)
    }
}

impl From<ErrorInfo> for JobError {
    fn from(e: ErrorInfo) -> JobError {
        JobError::new(e.code, e.message)
    }
}
