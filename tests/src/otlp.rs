//! A real OTLP/HTTP receiver for tests: it accepts `POST /v1/traces` and
//! `POST /v1/metrics` with the JSON encoding of the OTLP protocol (what an
//! OpenTelemetry collector accepts on port 4318) and keeps every span and
//! every metric data point.

use std::sync::{Arc, Mutex};

use anyhow::{Context, Result};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// One received span, as the exporter sent it.
#[derive(Debug, Clone)]
pub struct ReceivedSpan {
    pub trace_id: String,
    pub span_id: String,
    /// Empty for a root span.
    pub parent_span_id: String,
    pub name: String,
    /// (trace id, span id) of each link.
    pub links: Vec<(String, String)>,
    pub attributes: Value,
    pub service_name: String,
}

/// One metric as exported: its name and its OTLP JSON (`sum`, `gauge` or
/// `histogram` with `dataPoints`).
#[derive(Debug, Clone)]
pub struct ReceivedMetric {
    pub name: String,
    pub data: Value,
}

impl ReceivedMetric {
    /// The value of a sum or gauge data point with these attributes
    /// (`key=value`, empty for none); the count of a histogram's.
    pub fn value(&self, attribute: Option<(&str, &str)>) -> Option<f64> {
        let (kind, body) = ["sum", "gauge", "histogram"]
            .iter()
            .find_map(|k| self.data.get(*k).map(|b| (*k, b)))?;
        let points = body["dataPoints"].as_array()?;
        let point = points.iter().find(|p| match attribute {
            None => true,
            Some((key, value)) => p["attributes"].as_array().is_some_and(|a| {
                a.iter()
                    .any(|kv| kv["key"] == key && kv["value"]["stringValue"] == value)
            }),
        })?;
        let number = |v: &Value| v.as_f64().or_else(|| v.as_str()?.parse().ok());
        if kind == "histogram" {
            number(&point["count"])
        } else {
            number(&point["asInt"]).or_else(|| number(&point["asDouble"]))
        }
    }
}

pub struct OtlpReceiver {
    pub endpoint: String,
    spans: Arc<Mutex<Vec<ReceivedSpan>>>,
    metrics: Arc<Mutex<Vec<ReceivedMetric>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for OtlpReceiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl OtlpReceiver {
    /// Listens on a free loopback port; `endpoint` is its base URL.
    pub async fn start() -> Result<OtlpReceiver> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let endpoint = format!("http://{}", listener.local_addr()?);
        let spans = Arc::new(Mutex::new(Vec::new()));
        let metrics = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&spans);
        let metric_sink = Arc::clone(&metrics);
        let task = tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                let sink = Arc::clone(&sink);
                let metric_sink = Arc::clone(&metric_sink);
                tokio::spawn(async move {
                    if let Err(e) = serve(conn, &sink, &metric_sink).await {
                        eprintln!("otlp receiver: {e:#}");
                    }
                });
            }
        });
        Ok(OtlpReceiver {
            endpoint,
            spans,
            metrics,
            task,
        })
    }

    pub fn spans(&self) -> Vec<ReceivedSpan> {
        self.spans.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// The latest export of the metric called `name`.
    pub fn metric(&self, name: &str) -> Option<ReceivedMetric> {
        let metrics = self.metrics.lock().ok()?;
        metrics.iter().rev().find(|m| m.name == name).cloned()
    }
}

async fn serve(
    mut conn: TcpStream,
    sink: &Mutex<Vec<ReceivedSpan>>,
    metric_sink: &Mutex<Vec<ReceivedMetric>>,
) -> Result<()> {
    loop {
        let mut buf = Vec::new();
        let head_end = loop {
            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            let mut chunk = [0u8; 8192];
            let n = conn.read(&mut chunk).await?;
            if n == 0 {
                return Ok(()); // the client closed a kept-alive connection
            }
            buf.extend_from_slice(&chunk[..n]);
        };
        let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
        let length: usize = head
            .lines()
            .find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.eq_ignore_ascii_case("content-length")
                    .then(|| v.trim().parse().ok())?
            })
            .context("no content-length")?;
        while buf.len() < head_end + length {
            let mut chunk = vec![0u8; head_end + length - buf.len()];
            let n = conn.read(&mut chunk).await?;
            anyhow::ensure!(n > 0, "body cut short");
            buf.extend_from_slice(&chunk[..n]);
        }
        let body = &buf[head_end..head_end + length];
        let traces = head.starts_with("POST /v1/traces ");
        let metrics = head.starts_with("POST /v1/metrics ");
        let (status, reply) = match serde_json::from_slice::<Value>(body) {
            Ok(v) if traces => {
                if let Ok(mut s) = sink.lock() {
                    s.extend(spans_of(&v));
                }
                ("200 OK", "{}")
            }
            Ok(v) if metrics => {
                if let Ok(mut m) = metric_sink.lock() {
                    m.extend(metrics_of(&v));
                }
                ("200 OK", "{}")
            }
            Ok(_) => ("404 Not Found", "{}"),
            Err(_) => ("400 Bad Request", "{\"error\":\"not OTLP JSON\"}"),
        };
        let response = format!(
            "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{reply}",
            reply.len()
        );
        conn.write_all(response.as_bytes()).await?;
    }
}

/// The metrics of an `ExportMetricsServiceRequest` in OTLP/JSON.
fn metrics_of(request: &Value) -> Vec<ReceivedMetric> {
    let mut out = Vec::new();
    let empty = Vec::new();
    for rm in request["resourceMetrics"].as_array().unwrap_or(&empty) {
        for sm in rm["scopeMetrics"].as_array().unwrap_or(&empty) {
            for m in sm["metrics"].as_array().unwrap_or(&empty) {
                out.push(ReceivedMetric {
                    name: m["name"].as_str().unwrap_or_default().to_string(),
                    data: m.clone(),
                });
            }
        }
    }
    out
}

/// The spans of an `ExportTraceServiceRequest` in OTLP/JSON.
fn spans_of(request: &Value) -> Vec<ReceivedSpan> {
    let mut out = Vec::new();
    let empty = Vec::new();
    let str_of = |v: &Value| v.as_str().unwrap_or_default().to_string();
    for rs in request["resourceSpans"].as_array().unwrap_or(&empty) {
        let service_name = rs["resource"]["attributes"]
            .as_array()
            .unwrap_or(&empty)
            .iter()
            .find(|a| a["key"] == "service.name")
            .map(|a| str_of(&a["value"]["stringValue"]))
            .unwrap_or_default();
        for ss in rs["scopeSpans"].as_array().unwrap_or(&empty) {
            for span in ss["spans"].as_array().unwrap_or(&empty) {
                out.push(ReceivedSpan {
                    trace_id: str_of(&span["traceId"]),
                    span_id: str_of(&span["spanId"]),
                    parent_span_id: str_of(&span["parentSpanId"]),
                    name: str_of(&span["name"]),
                    links: span["links"]
                        .as_array()
                        .unwrap_or(&empty)
                        .iter()
                        .map(|l| (str_of(&l["traceId"]), str_of(&l["spanId"])))
                        .collect(),
                    attributes: span["attributes"].clone(),
                    service_name: service_name.clone(),
                });
            }
        }
    }
    out
}
