//! The gateway's traces, exported over OTLP/HTTP when `--otlp-endpoint` is
//! set (the consumer's conventions: `sluice_connect::otlp`).
//!
//! Every HTTP request is a server span, continuing the caller's
//! `traceparent` when it sends one. A batch's trace is its create request's:
//! the batch record keeps that span's `traceparent`, every chunk job is
//! published with it (so the consumers' `sluice.job` spans join the trace),
//! and the driver adds `sluice.openai_batch.validate`,
//! `sluice.openai_batch.finalize` and, once the batch has ended,
//! `sluice.openai_batch` (from its creation to its end, with its status and
//! counts) beside them. (The consumer's `sluice.batch` is a model batch.) Spans are recorded after the
//! fact with the times the driver measured, so a batch validated by one
//! gateway and finalized by another still makes one trace. With no endpoint
//! nothing is exported, and batches still get a `traceparent`, so their
//! chunk jobs share one trace id in the consumers' traces and logs.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use opentelemetry::trace::{SpanKind, Status, TraceContextExt, Tracer as _, TracerProvider as _};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::trace::{SdkTracerProvider, Tracer};
use sluice_connect::otlp::{self, OtlpProtocol};

/// The gateway's tracer: disabled (the default) or exporting over OTLP.
#[derive(Clone, Default)]
pub struct Traces {
    inner: Option<Arc<Exporting>>,
}

struct Exporting {
    provider: SdkTracerProvider,
    tracer: Tracer,
}

/// The `traceparent` of the request being served (an extension the
/// request middleware adds): a new batch's trace.
#[derive(Debug, Clone)]
pub struct RequestTrace(pub String);

impl Traces {
    pub fn disabled() -> Traces {
        Traces::default()
    }

    /// Exports spans in batches to `<endpoint>/v1/traces`. Its HTTP client
    /// blocks: call this (and `shutdown`) off the async runtime.
    pub fn otlp(endpoint: &str, protocol: OtlpProtocol) -> anyhow::Result<Traces> {
        let provider = otlp::tracer_provider(endpoint, protocol, "sluice-gateway")?;
        let tracer = provider.tracer("sluice-gateway");
        Ok(Traces {
            inner: Some(Arc::new(Exporting { provider, tracer })),
        })
    }

    /// Exports what is still buffered; call once, on shutdown, off the runtime.
    pub fn shutdown(&self) {
        if let Some(inner) = &self.inner
            && let Err(e) = inner.provider.shutdown()
        {
            tracing::warn!(error = %e, "flushing traces on shutdown failed");
        }
    }

    /// Starts a request's server span, the child of `parent` (the caller's
    /// `traceparent` header) when that is valid.
    pub fn request(&self, method: &str, route: &str, parent: Option<&str>) -> RequestSpan {
        let Some(inner) = &self.inner else {
            let traceparent = parent
                .filter(|p| otlp::span_context(p).is_some())
                .map_or_else(sluice_producer::new_traceparent, str::to_string);
            return RequestSpan {
                span: None,
                traceparent,
            };
        };
        let cx = span_parent(parent);
        let span = inner
            .tracer
            .span_builder(format!("{method} {route}"))
            .with_kind(SpanKind::Server)
            .with_attributes(vec![
                KeyValue::new("http.request.method", method.to_string()),
                KeyValue::new("http.route", route.to_string()),
            ])
            .start_with_context(&inner.tracer, &cx);
        let cx = cx.with_span(span);
        RequestSpan {
            traceparent: otlp::traceparent(cx.span().span_context()),
            span: Some(cx),
        }
    }

    /// Records a finished step of a batch under the batch's trace.
    pub fn batch_step(
        &self,
        batch_traceparent: Option<&str>,
        name: &'static str,
        start: SystemTime,
        end: SystemTime,
        attributes: Vec<KeyValue>,
    ) {
        let Some(inner) = &self.inner else { return };
        let mut span = inner
            .tracer
            .span_builder(name)
            .with_kind(SpanKind::Internal)
            .with_start_time(start)
            .with_attributes(attributes)
            .start_with_context(&inner.tracer, &span_parent(batch_traceparent));
        opentelemetry::trace::Span::end_with_timestamp(&mut span, end);
    }
}

/// A request's server span; `end` records its status.
pub struct RequestSpan {
    span: Option<Context>,
    traceparent: String,
}

impl RequestSpan {
    /// This span as a parent (or, with tracing off, the caller's header or
    /// a new one).
    pub fn traceparent(&self) -> &str {
        &self.traceparent
    }

    pub fn end(self, status: u16) {
        let Some(cx) = self.span else { return };
        let span = cx.span();
        span.set_attribute(KeyValue::new(
            "http.response.status_code",
            i64::from(status),
        ));
        if status >= 500 {
            span.set_status(Status::error(format!("HTTP {status}")));
        }
        span.end();
    }
}

fn span_parent(traceparent: Option<&str>) -> Context {
    traceparent
        .and_then(otlp::span_context)
        .map(|sc| Context::new().with_remote_span_context(sc))
        .unwrap_or_default()
}

/// The instant `unix_secs` seconds after the epoch (the batch record's times).
pub fn at_unix(unix_secs: i64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(unix_secs.max(0) as u64)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn disabled_traces_keep_a_valid_caller_trace_or_start_one() {
        let t = Traces::disabled();
        let caller = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let span = t.request("POST", "/v1/batches", Some(caller));
        assert_eq!(span.traceparent(), caller);
        span.end(200);
        for parent in [None, Some("not a traceparent")] {
            let span = t.request("POST", "/v1/batches", parent);
            let fresh = span.traceparent().to_string();
            assert!(otlp::span_context(&fresh).is_some(), "{fresh}");
            assert_ne!(fresh, caller);
        }
        t.batch_step(
            Some(caller),
            "sluice.openai_batch",
            at_unix(1),
            at_unix(2),
            vec![],
        );
    }
}
