//! Request bodies parsed the one way every handler takes them: a body that
//! cannot be read or parsed is answered in OpenAI's error shape
//! ([`ApiError`], 400 `invalid_request_error`; 413 past the size limit),
//! never axum's plain-text rejection, which the SDKs cannot read; a body
//! that stopped arriving is 408.

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;
use serde::de::DeserializeOwned;

use crate::api_error::ApiError;
use crate::bounds::BodyStalled;

/// A JSON body read as `T`.
pub struct OpenAiJson<T>(pub T);

/// What a body is called in the errors about it.
pub trait BodyName {
    /// "a batch", "a JSON object", ...
    const NAME: &'static str;
}

impl BodyName for serde_json::Map<String, serde_json::Value> {
    const NAME: &'static str = "a JSON object";
}

impl<T, S> FromRequest<S> for OpenAiJson<T>
where
    T: DeserializeOwned + BodyName,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let bytes = Bytes::from_request(req, state).await.map_err(|e| {
            if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "invalid_request_error",
                    "The request body is larger than the gateway accepts.",
                )
                .code("request_too_large")
            } else if let Some(stall) = BodyStalled::in_chain(&e) {
                ApiError::stalled(stall)
            } else {
                ApiError::invalid(format!(
                    "The request body could not be read: {}",
                    e.body_text()
                ))
            }
        })?;
        parse(&bytes).map(OpenAiJson)
    }
}

/// `bytes` as `T`, or the error a client is answered.
pub fn parse<T: DeserializeOwned + BodyName>(bytes: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(bytes)
        .map_err(|e| ApiError::invalid(format!("The request body is not {}: {e}", T::NAME)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Map, Value};

    #[test]
    fn a_body_that_is_not_the_type_is_answered_in_openais_shape() {
        let table: [(&[u8], Option<&str>); 4] = [
            (br#"{"model": "m"}"#, None),
            (
                b"[1, 2]",
                Some("The request body is not a JSON object: invalid type: sequence"),
            ),
            (
                b"{\"model\": ",
                Some("The request body is not a JSON object: EOF while parsing"),
            ),
            (
                b"",
                Some("The request body is not a JSON object: EOF while parsing"),
            ),
        ];
        for (body, want) in table {
            match (parse::<Map<String, Value>>(body), want) {
                (Ok(_), None) => {}
                (Err(e), Some(want)) => {
                    assert_eq!(e.status, StatusCode::BAD_REQUEST);
                    assert!(e.message.starts_with(want), "{}", e.message);
                    assert_eq!(e.body()["error"]["type"], "invalid_request_error");
                }
                (got, want) => panic!(
                    "{:?}: got ok={}, want {want:?}",
                    String::from_utf8_lossy(body),
                    got.is_ok()
                ),
            }
        }
    }
}
