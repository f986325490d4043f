//! Errors in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`
//! with the HTTP status the SDKs map to their exception classes.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub kind: &'static str,
    pub param: Option<&'static str>,
    pub code: Option<&'static str>,
    /// Seconds for a `Retry-After` header (429s: when to try again).
    pub retry_after: Option<u64>,
}

impl ApiError {
    pub fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
            kind,
            param: None,
            code: None,
            retry_after: None,
        }
    }

    pub fn code(mut self, code: &'static str) -> ApiError {
        self.code = Some(code);
        self
    }

    pub fn param(mut self, param: &'static str) -> ApiError {
        self.param = Some(param);
        self
    }

    pub fn unauthorized(message: &str) -> ApiError {
        ApiError::new(StatusCode::UNAUTHORIZED, "invalid_request_error", message)
            .code("invalid_api_key")
    }

    pub fn invalid(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
    }

    pub fn not_found(what: &str, id: &str) -> ApiError {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            format!("No such {what}: '{id}'"),
        )
        .code("not_found")
    }

    pub fn too_large(message: impl Into<String>) -> ApiError {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            message,
        )
        .code("file_too_large")
    }

    /// A failure of ours (NATS or S3): logged in full, answered 503 so the
    /// SDKs retry it.
    pub fn unavailable(error: anyhow::Error) -> ApiError {
        tracing::error!(error = format!("{error:#}"), "request failed");
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            format!("the gateway could not complete the request: {error:#}"),
        )
    }

    pub fn body(&self) -> serde_json::Value {
        json!({
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        })
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, Json(self.body())).into_response();
        if let Some(secs) = self.retry_after {
            response
                .headers_mut()
                .insert(axum::http::header::RETRY_AFTER, secs.into());
        }
        response
    }
}

impl From<anyhow::Error> for ApiError {
    fn from(e: anyhow::Error) -> ApiError {
        ApiError::unavailable(e)
    }
}
