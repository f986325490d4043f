//! Reaching an OpenTelemetry collector over OTLP/HTTP, the same way from
//! every sluice binary: the encoding flag, the `<endpoint>/v1/<signal>`
//! URLs, the resource every span and metric carries, and W3C `traceparent`
//! headers read as span contexts.

use std::time::Duration;

use opentelemetry::KeyValue;
use opentelemetry::trace::{SpanContext, SpanId, TraceFlags, TraceId, TraceState};
use opentelemetry_otlp::{Protocol, WithExportConfig};

/// The OTLP/HTTP encoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OtlpProtocol {
    #[value(name = "http/protobuf")]
    HttpProtobuf,
    #[value(name = "http/json")]
    HttpJson,
}

/// The OTLP flags every sluice binary takes, flattened into its config.
#[derive(Debug, Clone, clap::Args)]
pub struct OtlpArgs {
    /// OTLP/HTTP endpoint to export traces and metrics to (e.g.
    /// http://otel-collector:4318; spans go to <endpoint>/v1/traces, metrics
    /// to <endpoint>/v1/metrics). Unset: no traces are recorded and metrics
    /// are only served on /metrics.
    #[arg(long = "otlp-endpoint", env = "OTEL_EXPORTER_OTLP_ENDPOINT")]
    pub endpoint: Option<String>,
    /// OTLP/HTTP encoding.
    #[arg(
        long = "otlp-protocol",
        env = "OTEL_EXPORTER_OTLP_PROTOCOL",
        value_enum,
        default_value = "http/protobuf"
    )]
    pub protocol: OtlpProtocol,
    /// With --otlp-endpoint: seconds between metric pushes (to <endpoint>/v1/metrics).
    #[arg(
        long = "otlp-metrics-interval-secs",
        env = "SLUICE_OTLP_METRICS_INTERVAL_SECS",
        default_value_t = 15
    )]
    pub metrics_interval_secs: u64,
}

impl OtlpArgs {
    /// The key a bad endpoint is reported under.
    pub const ENDPOINT_KEY: &'static str =
        "otlp_endpoint (--otlp-endpoint / OTEL_EXPORTER_OTLP_ENDPOINT)";
    /// What to do about a bad endpoint.
    pub const ENDPOINT_FIX: &'static str =
        "must be an http:// or https:// URL such as http://otel-collector:4318";

    /// The endpoint, if it is set and is not an http(s) URL with a host.
    pub fn bad_endpoint(&self) -> Option<&str> {
        let endpoint = self.endpoint.as_deref()?;
        let ok = url::Url::parse(endpoint)
            .is_ok_and(|u| matches!(u.scheme(), "http" | "https") && u.host().is_some());
        (!ok).then_some(endpoint)
    }

    /// Time between metric pushes (at least a second).
    pub fn metrics_interval(&self) -> Duration {
        Duration::from_secs(self.metrics_interval_secs.max(1))
    }
}

/// Points an OTLP/HTTP exporter builder at `<endpoint>/v1/<signal>`; returns
/// it and that URL (for error messages).
pub fn target<B: WithExportConfig>(
    builder: B,
    endpoint: &str,
    signal: &str,
    protocol: OtlpProtocol,
) -> (B, String) {
    let url = format!("{}/v1/{signal}", endpoint.trim_end_matches('/'));
    let builder = builder
        .with_protocol(match protocol {
            OtlpProtocol::HttpProtobuf => Protocol::HttpBinary,
            OtlpProtocol::HttpJson => Protocol::HttpJson,
        })
        .with_endpoint(url.clone())
        .with_timeout(Duration::from_secs(10));
    (builder, url)
}

/// What every exported span and metric of `service` says about its source.
pub fn resource(service: &'static str) -> opentelemetry_sdk::Resource {
    opentelemetry_sdk::Resource::builder()
        .with_service_name(service)
        .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
        .build()
}

/// A tracer provider of `service` that exports spans in batches to
/// `<endpoint>/v1/traces`. Its HTTP client blocks: build it (and shut it
/// down) off the async runtime.
pub fn tracer_provider(
    endpoint: &str,
    protocol: OtlpProtocol,
    service: &'static str,
) -> anyhow::Result<opentelemetry_sdk::trace::SdkTracerProvider> {
    let (builder, url) = target(
        opentelemetry_otlp::SpanExporter::builder().with_http(),
        endpoint,
        "traces",
        protocol,
    );
    let exporter = builder
        .build()
        .map_err(|e| anyhow::anyhow!("cannot set up OTLP export to {url}: {e}"))?;
    Ok(opentelemetry_sdk::trace::SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource(service))
        .build())
}

/// A meter provider of `service` that pushes every `interval` (and once
/// more on shutdown) to `<endpoint>/v1/metrics`. Its HTTP client blocks:
/// build it (and shut it down) off the async runtime.
pub fn meter_provider(
    endpoint: &str,
    protocol: OtlpProtocol,
    interval: Duration,
    service: &'static str,
) -> anyhow::Result<opentelemetry_sdk::metrics::SdkMeterProvider> {
    let (builder, url) = target(
        opentelemetry_otlp::MetricExporter::builder().with_http(),
        endpoint,
        "metrics",
        protocol,
    );
    let exporter = builder
        .build()
        .map_err(|e| anyhow::anyhow!("cannot set up OTLP metrics export to {url}: {e}"))?;
    let reader = opentelemetry_sdk::metrics::PeriodicReader::builder(exporter)
        .with_interval(interval)
        .build();
    Ok(opentelemetry_sdk::metrics::SdkMeterProvider::builder()
        .with_reader(reader)
        .with_resource(resource(service))
        .build())
}

/// `00-<32 hex trace id>-<16 hex parent id>-<2 hex flags>` as a remote span
/// context; None when malformed (the work then starts a new trace).
pub fn span_context(traceparent: &str) -> Option<SpanContext> {
    let tp = sluice_schemas::TraceParent::parse(traceparent)?;
    Some(SpanContext::new(
        TraceId::from_hex(tp.trace_id).ok()?,
        SpanId::from_hex(tp.parent_id).ok()?,
        TraceFlags::new(tp.flags),
        true,
        TraceState::default(),
    ))
}

/// The `traceparent` header that names `span` as the parent.
pub fn traceparent(span: &SpanContext) -> String {
    format!(
        "00-{}-{}-{:02x}",
        span.trace_id(),
        span.span_id(),
        span.trace_flags().to_u8()
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn otlp_endpoints_must_be_http_urls_with_a_host() {
        let args = |endpoint: Option<&str>| OtlpArgs {
            endpoint: endpoint.map(str::to_owned),
            protocol: OtlpProtocol::HttpProtobuf,
            metrics_interval_secs: 0,
        };
        for good in [
            None,
            Some("http://otel:4318"),
            Some("https://10.0.0.1:4318/"),
        ] {
            assert_eq!(args(good).bad_endpoint(), None, "{good:?}");
        }
        for bad in ["otel:4318", "grpc://otel:4317", "http://", ""] {
            assert_eq!(args(Some(bad)).bad_endpoint(), Some(bad));
        }
        assert_eq!(args(None).metrics_interval(), Duration::from_secs(1));
    }

    #[test]
    fn traceparent_parsing_takes_valid_headers_and_refuses_the_rest() {
        let header = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let sc = span_context(header).unwrap();
        assert_eq!(
            sc.trace_id().to_string(),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        assert_eq!(sc.span_id().to_string(), "00f067aa0ba902b7");
        assert!(sc.is_sampled() && sc.is_remote());
        assert_eq!(traceparent(&sc), header);
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-xyz92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
        ] {
            assert!(span_context(bad).is_none(), "{bad:?}");
        }
    }
}
