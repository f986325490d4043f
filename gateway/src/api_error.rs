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

    /// 429: `tenant` sent more requests than its rate allows; one more is
    /// admitted after `wait`.
    pub fn rate_limited(tenant: &str, wait: std::time::Duration) -> ApiError {
        let mut error = ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limit_error",
            format!(
                "Rate limit reached for tenant {tenant} (--rate-limit-rps, shared by its keys): \
                 retry after {:.1} s.",
                wait.as_secs_f64()
            ),
        )
        .code("rate_limit_exceeded");
        error.retry_after = Some(wait.as_secs_f64().ceil().max(1.0) as u64);
        error
    }

    /// 429: `tenant`'s online requests used more model tokens than its
    /// `per_minute` allows; one more is admitted after `wait`.
    pub fn token_rate_limited(
        tenant: &str,
        per_minute: u64,
        wait: std::time::Duration,
    ) -> ApiError {
        let mut error = ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "tokens",
            format!(
                "Rate limit reached for tenant {tenant} on tokens per minute: limit \
                 {per_minute} (--token-rate-limit-tpm, shared by its keys): retry after {:.1} s.",
                wait.as_secs_f64()
            ),
        )
        .code("rate_limit_exceeded");
        error.retry_after = Some(wait.as_secs_f64().ceil().max(1.0) as u64);
        error
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

    /// A request body that stopped arriving (`bounds::BodyStalled`).
    pub fn stalled(stall: &crate::bounds::BodyStalled) -> ApiError {
        ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            "invalid_request_error",
            format!("The request body stopped arriving: {stall}."),
        )
        .code("request_timeout")
    }

    /// A failure of ours (NATS or S3): logged in full under an error id,
    /// answered 503 (so the SDKs retry it) with a stable message naming the
    /// id. The cause's text never reaches the client: it can name internal
    /// hosts, buckets and subjects.
    pub fn unavailable(error: anyhow::Error) -> ApiError {
        let id = uuid::Uuid::now_v7().simple().to_string();
        tracing::error!(error_id = %id, error = format!("{error:#}"), "request failed");
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            unavailable_message(&id),
        )
        .code("service_unavailable")
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

/// What a client is told of a failure of ours.
fn unavailable_message(error_id: &str) -> String {
    format!(
        "The gateway could not complete the request; try again. (error id {error_id}: the gateway's log has the cause)"
    )
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_internal_failure_is_answered_without_its_cause() {
        let cause = anyhow::anyhow!("dispatch failure: connect to nats://10.0.0.7:4222 refused")
            .context("publishing to sluice.jobs.embed");
        let e = ApiError::unavailable(cause);
        assert_eq!(e.status, StatusCode::SERVICE_UNAVAILABLE);
        let body = e.body().to_string();
        assert!(
            !body.contains("10.0.0.7") && !body.contains("sluice.jobs"),
            "{body}"
        );
        assert!(
            e.message
                .starts_with("The gateway could not complete the request; try again. (error id "),
            "{}",
            e.message
        );
        assert_eq!(
            (e.kind, e.code),
            ("server_error", Some("service_unavailable"))
        );
    }
}
