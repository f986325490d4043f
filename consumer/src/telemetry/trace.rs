//! Distributed tracing: a job's spans continue the publisher's W3C
//! `traceparent`, so one trace runs from the publish to the result. Exported
//! with OpenTelemetry over OTLP/HTTP when an endpoint is configured; with none,
//! nothing is recorded and nothing costs.
//!
//! Stage spans are recorded after the fact, with the instants each stage
//! already measures for the result's `timings_ms`, so tracing adds no code to
//! the data path beyond one call per stage. A batch gets its own span with a
//! link to every job whose items it held (the OpenTelemetry convention for
//! batch processing); each job's trace gets a `batch_wait` and an
//! `inference` span covering its batches.

use std::sync::Arc;
use std::time::{Instant, SystemTime};

use opentelemetry::trace::{
    Link, SpanContext, SpanKind, Status, TraceContextExt, Tracer as _, TracerProvider as _,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::trace::{SdkTracerProvider, Tracer};

pub use sluice_connect::otlp::OtlpProtocol;
use sluice_connect::otlp::span_context as parse_traceparent;

/// The consumer's tracer: disabled (the default) or exporting over OTLP.
#[derive(Clone, Default)]
pub struct Tracing {
    inner: Option<Arc<Exporting>>,
}

struct Exporting {
    provider: SdkTracerProvider,
    tracer: Tracer,
}

impl Tracing {
    pub fn disabled() -> Tracing {
        Tracing::default()
    }

    /// Exports spans in batches to `<endpoint>/v1/traces`.
    pub fn otlp(endpoint: &str, protocol: OtlpProtocol) -> anyhow::Result<Tracing> {
        let provider =
            sluice_connect::otlp::tracer_provider(endpoint, protocol, "sluice-consumer")?;
        let tracer = provider.tracer("sluice-consumer");
        Ok(Tracing {
            inner: Some(Arc::new(Exporting { provider, tracer })),
        })
    }

    pub fn is_enabled(&self) -> bool {
        self.inner.is_some()
    }

    /// Starts a job's span, `began` being when its admission began; its
    /// parent is the publisher's span when `traceparent` is valid.
    pub fn job(&self, traceparent: Option<&str>, began: Instant) -> JobTrace {
        let Some(inner) = &self.inner else {
            return JobTrace::default();
        };
        let parent = traceparent
            .and_then(parse_traceparent)
            .map(|sc| Context::new().with_remote_span_context(sc))
            .unwrap_or_default();
        let span = inner
            .tracer
            .span_builder("sluice.job")
            .with_kind(SpanKind::Consumer)
            .with_start_time(system_time(began))
            .start_with_context(&inner.tracer, &parent);
        JobTrace {
            inner: Some((Arc::clone(inner), parent.with_span(span))),
        }
    }

    /// Records one batch, linked to the jobs whose items it held.
    pub fn batch(
        &self,
        started: Instant,
        ended: Instant,
        attributes: Vec<KeyValue>,
        jobs: Vec<SpanContext>,
    ) {
        let Some(inner) = &self.inner else { return };
        let links = jobs.into_iter().map(Link::with_context).collect();
        let mut span = inner
            .tracer
            .span_builder("sluice.batch")
            .with_kind(SpanKind::Internal)
            .with_start_time(system_time(started))
            .with_attributes(attributes)
            .with_links(links)
            .start(&inner.tracer);
        opentelemetry::trace::Span::end_with_timestamp(&mut span, system_time(ended));
    }

    /// Exports what is still buffered; call once, on shutdown.
    pub fn shutdown(&self) {
        if let Some(inner) = &self.inner
            && let Err(e) = inner.provider.shutdown()
        {
            tracing::warn!(error = %e, "flushing traces on shutdown failed");
        }
    }
}

/// One job's span and the context its stage spans are children of. The
/// default (tracing disabled) records nothing.
#[derive(Default)]
pub struct JobTrace {
    inner: Option<(Arc<Exporting>, Context)>,
}

impl JobTrace {
    /// The job span's context, for links from batches.
    pub fn span_context(&self) -> Option<SpanContext> {
        self.inner
            .as_ref()
            .map(|(_, cx)| cx.span().span_context().clone())
    }

    /// The trace id, for log lines; None when tracing is disabled.
    pub fn trace_id(&self) -> Option<String> {
        self.span_context().map(|sc| sc.trace_id().to_string())
    }

    /// Records a finished stage as a child span of the job.
    pub fn stage(&self, name: &'static str, start: Instant, end: Instant) {
        self.stage_with(name, start, end, Vec::new());
    }

    pub fn stage_with(
        &self,
        name: &'static str,
        start: Instant,
        end: Instant,
        attributes: Vec<KeyValue>,
    ) {
        let Some((inner, cx)) = &self.inner else {
            return;
        };
        let mut span = inner
            .tracer
            .span_builder(name)
            .with_kind(SpanKind::Internal)
            .with_start_time(system_time(start))
            .with_attributes(attributes)
            .start_with_context(&inner.tracer, cx);
        opentelemetry::trace::Span::end_with_timestamp(&mut span, system_time(end));
    }

    pub fn set_attributes(&self, attributes: Vec<KeyValue>) {
        if let Some((_, cx)) = &self.inner {
            cx.span().set_attributes(attributes);
        }
    }

    /// Ends the job span with its outcome (`error_code` for failures).
    pub fn end(self, outcome: &'static str, error_code: Option<&'static str>) {
        let Some((_, cx)) = self.inner else { return };
        let span = cx.span();
        span.set_attribute(KeyValue::new("sluice.outcome", outcome));
        if let Some(code) = error_code {
            span.set_attribute(KeyValue::new("error.type", code));
            span.set_status(Status::error(code));
        }
        span.end();
    }
}

/// The wall-clock time of a monotonic instant (for span timestamps).
fn system_time(at: Instant) -> SystemTime {
    let now = Instant::now();
    let wall = SystemTime::now();
    if at <= now {
        wall - now.duration_since(at)
    } else {
        wall + at.duration_since(now)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn disabled_tracing_records_nothing() {
        let t = Tracing::disabled();
        let job = t.job(
            Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
            Instant::now(),
        );
        assert!(job.span_context().is_none() && job.trace_id().is_none());
        job.stage("fetch", Instant::now(), Instant::now());
        job.end("ok", None);
    }
}
