//! `sluice batch`: the OpenAI batches of a `sluice-gateway`, reached through
//! its HTTP API with a tenant's key, the calls the `openai` SDK makes. The
//! gateway keeps every rule (which tenant sees what, which batch may be
//! retried); this client only asks.

use std::time::Duration;

use serde_json::{Value, json};

/// The metadata key that asks the gateway for a batch of only the failed
/// lines of an ended one (`gateway/src/batches.rs`, `RETRY_FAILED_OF`).
pub const RETRY_FAILED_OF: &str = "retry_failed_of";

#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    #[error("cannot reach the gateway at {url}: {source}")]
    Unreachable {
        url: String,
        #[source]
        source: reqwest::Error,
    },
    /// The gateway answered with an error in OpenAI's shape.
    #[error("the gateway refused ({status}{}): {message}", code.as_deref().map(|c| format!(", {c}")).unwrap_or_default())]
    Refused {
        status: u16,
        code: Option<String>,
        message: String,
    },
    #[error(
        "the gateway at {url} answered {status} with a body that is not an OpenAI object: {body}"
    )]
    BadAnswer {
        url: String,
        status: u16,
        body: String,
    },
}

impl GatewayError {
    /// The batch (or file) named does not exist for this key.
    pub fn is_not_found(&self) -> bool {
        matches!(self, GatewayError::Refused { status: 404, .. })
    }
}

/// A tenant's view of one gateway.
pub struct GatewayClient {
    base: String,
    key: String,
    http: reqwest::Client,
}

impl GatewayClient {
    /// `base_url` as given to the SDK (`http://host:8080/v1`); `/v1` is
    /// added when missing.
    pub fn new(base_url: &str, api_key: &str) -> GatewayClient {
        let base = base_url.trim_end_matches('/');
        let base = if base.ends_with("/v1") {
            base.to_string()
        } else {
            format!("{base}/v1")
        };
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .timeout(Duration::from_secs(300))
            .build()
            .unwrap_or_default();
        GatewayClient {
            base,
            key: api_key.to_string(),
            http,
        }
    }

    /// `GET /v1/batches/{id}`.
    pub async fn batch(&self, id: &str) -> Result<Value, GatewayError> {
        self.call(self.http.get(self.url(&format!("/batches/{id}"))))
            .await
    }

    /// A new batch of only the lines of `id` that failed (its error file's
    /// `custom_id`s), on the same endpoint; in `completion_window`, or the
    /// original's when `None`. `id` must have ended.
    pub async fn retry_failed(
        &self,
        id: &str,
        completion_window: Option<&str>,
    ) -> Result<Value, GatewayError> {
        let original = self.batch(id).await?;
        let field = |name: &str| original[name].as_str().unwrap_or_default().to_string();
        let window = completion_window
            .map(str::to_string)
            .unwrap_or_else(|| field("completion_window"));
        let body = json!({
            "input_file_id": field("input_file_id"),
            "endpoint": field("endpoint"),
            "completion_window": window,
            "metadata": {RETRY_FAILED_OF: id},
        });
        let request = self
            .http
            .post(self.url("/batches"))
            .header("content-type", "application/json")
            .body(body.to_string());
        self.call(request).await
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    async fn call(&self, request: reqwest::RequestBuilder) -> Result<Value, GatewayError> {
        let unreachable = |source| GatewayError::Unreachable {
            url: self.base.clone(),
            source,
        };
        let response = request
            .bearer_auth(&self.key)
            .send()
            .await
            .map_err(unreachable)?;
        let status = response.status().as_u16();
        let body = response.bytes().await.map_err(unreachable)?;
        let value: Value = serde_json::from_slice(&body).map_err(|_| GatewayError::BadAnswer {
            url: self.base.clone(),
            status,
            body: String::from_utf8_lossy(&body[..body.len().min(300)]).into_owned(),
        })?;
        if (200..300).contains(&status) {
            return Ok(value);
        }
        let error = &value["error"];
        Err(GatewayError::Refused {
            status,
            code: error["code"].as_str().map(str::to_string),
            message: error["message"]
                .as_str()
                .map_or_else(|| value.to_string(), str::to_string),
        })
    }
}

/// One line for people: id, status, counts, files.
pub fn describe(batch: &Value) -> String {
    let counts = &batch["request_counts"];
    let mut line = format!(
        "{}: {} ({} lines: {} completed, {} failed)",
        batch["id"].as_str().unwrap_or("?"),
        batch["status"].as_str().unwrap_or("?"),
        counts["total"],
        counts["completed"],
        counts["failed"],
    );
    for (name, field) in [("output", "output_file_id"), ("errors", "error_file_id")] {
        if let Some(file) = batch[field].as_str() {
            line.push_str(&format!("; {name} {file}"));
        }
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_url_gets_v1_once() {
        for given in [
            "http://h:8080",
            "http://h:8080/",
            "http://h:8080/v1",
            "http://h:8080/v1/",
        ] {
            assert_eq!(
                GatewayClient::new(given, "k").url("/batches"),
                "http://h:8080/v1/batches"
            );
        }
    }

    #[test]
    fn describe_names_counts_and_files() {
        let b = json!({"id": "batch_1", "status": "completed",
            "request_counts": {"total": 3, "completed": 2, "failed": 1},
            "output_file_id": "file-o", "error_file_id": "file-e"});
        assert_eq!(
            describe(&b),
            "batch_1: completed (3 lines: 2 completed, 1 failed); output file-o; errors file-e"
        );
    }
}
