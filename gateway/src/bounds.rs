//! What one client can hold of the gateway: connections, time and bytes.
//!
//! The HTTP server is served here rather than by `axum::serve`, for the
//! bounds a public endpoint needs and axum's server does not set:
//!
//! - **Connections**: at most `--max-connections` at once. One past it is
//!   answered `503` with `Retry-After` in OpenAI's error shape and closed,
//!   so a flood of half-open connections costs a few bytes each, not a task
//!   and its buffers for as long as the client likes.
//! - **Headers**: a request's headers must arrive within
//!   `--header-timeout-secs` of its first byte, and a kept-alive connection
//!   that sends no next request is closed after as long (slow-loris).
//! - **Bodies**: a request body that sends no bytes for `--body-idle-secs`
//!   fails with [`BodyStalled`], which the extractors answer `408` (an
//!   upload that stalls is aborted, its parts removed).
//!
//! Stopping the server (aborting its task) ends its connections too.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::Request;
use http_body::{Body as HttpBody, Frame};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tower::ServiceExt;

/// The server's bounds (see the module's doc).
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    pub max_connections: usize,
    pub header_timeout: Duration,
    pub body_idle: Duration,
}

/// Serves `app` on `listener` inside `bounds` until the task is aborted.
pub async fn serve(listener: TcpListener, app: Router, bounds: Bounds) {
    let slots = Arc::new(Semaphore::new(bounds.max_connections));
    let mut connections = JoinSet::new();
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
        };
        let tcp = match accepted {
            Ok((tcp, _)) => tcp,
            Err(e) => {
                // Out of file descriptors and the like: the listener is
                // fine; wait a little rather than spin on the error.
                tracing::warn!(error = %e, "cannot accept a connection");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        // No Nagle: a streamed answer is many small writes, each of which
        // should leave at once rather than wait for the previous one's ACK.
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "cannot set TCP_NODELAY on a connection");
        }
        let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
            connections.spawn(refuse(tcp, bounds.max_connections));
            continue;
        };
        let app = app.clone();
        connections.spawn(async move {
            let service = hyper::service::service_fn(move |request: Request<Incoming>| {
                let request = request.map(|body| Body::new(IdleBody::new(body, bounds.body_idle)));
                app.clone().oneshot(request)
            });
            let served = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(bounds.header_timeout)
                .serve_connection(TokioIo::new(tcp), service)
                .await;
            if let Err(e) = served {
                tracing::debug!(error = %e, "a connection ended with an error");
            }
            drop(slot);
        });
    }
}

/// One connection too many: answered 503 at once and closed.
async fn refuse(mut tcp: TcpStream, max: usize) {
    let body = serde_json::json!({"error": {
        "message": format!("The gateway is at its limit of {max} connections; retry shortly."),
        "type": "server_error",
        "param": null,
        "code": "too_many_connections",
    }})
    .to_string();
    let answer = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
         retry-after: 1\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let write = async {
        tcp.write_all(answer.as_bytes()).await?;
        tcp.shutdown().await
    };
    let _ = tokio::time::timeout(Duration::from_secs(2), write).await;
}

/// A request body sent no bytes for the gateway's `--body-idle-secs`.
#[derive(Debug, thiserror::Error)]
#[error("no bytes of the request body arrived for {} s", .0.as_secs())]
pub struct BodyStalled(pub Duration);

impl BodyStalled {
    /// The stall somewhere in `error`'s chain of sources, if it is one.
    pub fn in_chain<'a>(error: &'a (dyn std::error::Error + 'static)) -> Option<&'a BodyStalled> {
        let mut next = Some(error);
        while let Some(e) = next {
            if let Some(stalled) = e.downcast_ref::<BodyStalled>() {
                return Some(stalled);
            }
            next = e.source();
        }
        None
    }
}

/// A body that fails with [`BodyStalled`] when its next bytes take longer
/// than `idle` to come once asked for.
struct IdleBody<B> {
    body: B,
    idle: Duration,
    /// Armed while a frame is awaited.
    deadline: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<B> IdleBody<B> {
    fn new(body: B, idle: Duration) -> IdleBody<B> {
        IdleBody {
            body,
            idle,
            deadline: None,
        }
    }
}

impl<B> HttpBody for IdleBody<B>
where
    B: HttpBody + Unpin,
    B::Error: Into<axum::BoxError>,
{
    type Data = B::Data;
    type Error = axum::BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, axum::BoxError>>> {
        let this = &mut *self;
        // The body first: bytes that came while nobody asked are no stall.
        if let Poll::Ready(frame) = Pin::new(&mut this.body).poll_frame(cx) {
            this.deadline = None;
            return Poll::Ready(frame.map(|f| f.map_err(Into::into)));
        }
        let idle = this.idle;
        let deadline = this
            .deadline
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(idle)));
        match deadline.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Some(Err(Box::new(BodyStalled(idle))))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}
