//! The consumer's one error type for a job: a stable code from the wire
//! contract (which says whether retrying helps), a message for people, and
//! the inner error that caused it, when there was one (for logs; the wire
//! carries the code and the message). Inner layers' typed errors are mapped
//! to wire codes here, in one place.

use std::sync::Arc;

use sluice_schemas::{ErrorCode, ErrorInfo};

use sluice_models::{ModelError, TokenizeError};

#[derive(Debug, Clone, thiserror::Error)]
#[error("{code}: {message}")]
pub struct JobError {
    pub code: ErrorCode,
    pub message: String,
    #[source]
    pub source: Option<Arc<dyn std::error::Error + Send + Sync>>,
}

/// Two errors are the same when the publisher would see the same: code and
/// message.
impl PartialEq for JobError {
    fn eq(&self, other: &JobError) -> bool {
        self.code == other.code && self.message == other.message
    }
}

impl JobError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> JobError {
        JobError {
            code,
            message: message.into(),
            source: None,
        }
    }

    /// The same, keeping the inner error that caused it.
    pub fn caused_by(
        code: ErrorCode,
        message: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> JobError {
        JobError {
            code,
            message: message.into(),
            source: Some(Arc::new(source)),
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
        JobError::caused_by(ErrorCode::StorageUnavailable, message, e)
    }
}

/// A model that ran out of device memory may succeed later (with a smaller
/// budget); any other model failure is internal.
impl From<ModelError> for JobError {
    fn from(e: ModelError) -> JobError {
        let code = match e {
            ModelError::OutOfMemory(_) => ErrorCode::DeviceOutOfMemory,
            ModelError::Failed(_) | ModelError::Input(_) => ErrorCode::Internal,
        };
        JobError::caused_by(code, e.to_string(), e)
    }
}

/// A text over the model's limit is the publisher's to fix (or to allow
/// with `truncate`); one the tokenizer cannot read is invalid input.
impl From<TokenizeError> for JobError {
    fn from(e: TokenizeError) -> JobError {
        match e {
            TokenizeError::TooLong { .. } => JobError::caused_by(
                ErrorCode::ItemTooLong,
                format!("{e}; set parameters.truncate=true to cut it, or split the text"),
                e,
            ),
            TokenizeError::Failed(ref m) => {
                JobError::caused_by(ErrorCode::InputInvalid, m.clone(), e)
            }
        }
    }
}

impl From<ErrorInfo> for JobError {
    fn from(e: ErrorInfo) -> JobError {
        JobError::new(e.code, e.message)
    }
}
