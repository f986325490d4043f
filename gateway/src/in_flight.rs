//! The online requests one gateway answers at once. Each holds a job, a
//! subscription and a task until its answer is sent (a streamed answer until
//! its last event), so their number is capped: one more is answered 503
//! `too_many_requests_in_flight` with `Retry-After` at once, before any job
//! is published. The slot is held by the response body, so a stream keeps
//! it to its end, and a client that goes away gives it back.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use tokio::sync::OwnedSemaphorePermit;

use crate::api_error::ApiError;
use crate::state::AppState;

/// The middleware of the online routes: a slot, or 503.
pub async fn limit(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let Ok(permit) = Arc::clone(&state.online_slots).try_acquire_owned() else {
        let mut error = ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            format!(
                "This gateway is answering {} online requests already (--max-online-requests); retry in a second, or use another gateway.",
                state.config.max_online_requests
            ),
        )
        .code("too_many_requests_in_flight");
        error.retry_after = Some(1);
        return error.into_response();
    };
    let (parts, body) = next.run(request).await.into_parts();
    Response::from_parts(
        parts,
        Body::new(Held {
            body,
            _permit: permit,
        }),
    )
}

/// A response body that holds its request's slot until it is done or
/// dropped.
struct Held {
    body: Body,
    _permit: OwnedSemaphorePermit,
}

impl http_body::Body for Held {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}
