//! A small HTTP endpoint for operators: `/healthz` (alive), `/readyz` (ready
//! to take jobs; not while draining), `/debug/memory` (budget and memory, JSON)
//! and `/metrics` (Prometheus text).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::budget::{Budget, resident_bytes};
use crate::telemetry::Stats;

#[derive(Clone)]
pub struct State {
    pub stats: Arc<Stats>,
    pub budget: Budget,
    pub ready: Arc<AtomicBool>,
}

/// Binds `addr` and serves in the background; returns the bound address.
pub async fn serve(addr: SocketAddr, state: State) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    tokio::spawn(async move {
        loop {
            let Ok((conn, _)) = listener.accept().await else {
                continue;
            };
            let state = state.clone();
            tokio::spawn(async move {
                if let Err(e) = answer(conn, &state).await {
                    tracing::debug!(error = %e, "http connection");
                }
            });
        }
    });
    Ok(bound)
}

async fn answer(mut conn: TcpStream, state: &State) -> std::io::Result<()> {
    let mut buf = vec![0u8; 4096];
    let mut len = 0;
    // Read the request head (we ignore bodies).
    while !buf[..len].windows(4).any(|w| w == b"\r\n\r\n") {
        if len == buf.len() {
            return respond(&mut conn, 431, "text/plain", "request head too large\n").await;
        }
        let n = conn.read(&mut buf[len..]).await?;
        if n == 0 {
            return Ok(());
        }
        len += n;
    }
    let head = String::from_utf8_lossy(&buf[..len]);
    let mut parts = head.split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    if method != "GET" {
        return respond(&mut conn, 405, "text/plain", "only GET\n").await;
    }
    match path.split('?').next().unwrap_or("") {
        "/healthz" => respond(&mut conn, 200, "text/plain", "ok\n").await,
        "/readyz" => {
            if state.ready.load(Ordering::Acquire) {
                respond(&mut conn, 200, "text/plain", "ready\n").await
            } else {
                respond(&mut conn, 503, "text/plain", "not ready\n").await
            }
        }
        "/debug/memory" => {
            let body = memory_json(state).to_string();
            respond(&mut conn, 200, "application/json", &body).await
        }
        "/metrics" => {
            respond(
                &mut conn,
                200,
                "text/plain; version=0.0.4",
                &metrics_text(state),
            )
            .await
        }
        _ => respond(&mut conn, 404, "text/plain", "not found\n").await,
    }
}

async fn respond(conn: &mut TcpStream, code: u16, ctype: &str, body: &str) -> std::io::Result<()> {
    let reason = match code {
        200 => "OK",
        404 => "Not Found",
        405 => "Method Not Allowed",
        431 => "Request Header Fields Too Large",
        _ => "Service Unavailable",
    };
    let head = format!(
        "HTTP/1.1 {code} {reason}\r\ncontent-type: {ctype}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    conn.write_all(head.as_bytes()).await?;
    conn.write_all(body.as_bytes()).await?;
    conn.shutdown().await
}

fn memory_json(state: &State) -> serde_json::Value {
    let b = state.budget.snapshot();
    serde_json::json!({
        "budget_bytes": b.limit_bytes,
        "reserved_bytes": b.reserved_bytes,
        "peak_reserved_bytes": b.peak_reserved_bytes,
        "resident_bytes": resident_bytes(),
        "jobs_in_flight": state.stats.jobs_in_flight.load(Ordering::Relaxed),
    })
}

fn metrics_text(state: &State) -> String {
    use std::fmt::Write;
    let s = &state.stats;
    let b = state.budget.snapshot();
    let mut out = String::new();
    let mut line = |name: &str, kind: &str, help: &str, value: u64| {
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}"
        );
    };
    let get = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
    line(
        "sluice_jobs_ok_total",
        "counter",
        "Jobs answered ok.",
        get(&s.jobs_ok),
    );
    line(
        "sluice_jobs_retried_total",
        "counter",
        "Transient failures Nak'ed for retry.",
        get(&s.jobs_retried),
    );
    line(
        "sluice_items_total",
        "counter",
        "Items embedded in ok jobs.",
        get(&s.items_done),
    );
    line(
        "sluice_tokens_total",
        "counter",
        "Real tokens in ok jobs.",
        get(&s.tokens_done),
    );
    line(
        "sluice_batches_total",
        "counter",
        "Batches run.",
        get(&s.batches),
    );
    line(
        "sluice_batch_items_total",
        "counter",
        "Items over all batches.",
        get(&s.batch_items),
    );
    line(
        "sluice_batch_real_tokens_total",
        "counter",
        "Real tokens over all batches.",
        get(&s.batch_real_tokens),
    );
    line(
        "sluice_batch_padded_tokens_total",
        "counter",
        "Padded tokens (items x longest) over all batches.",
        get(&s.batch_padded_tokens),
    );
    line(
        "sluice_batch_padded_tokens_max",
        "gauge",
        "Largest padded cost of a batch.",
        get(&s.max_batch_padded_tokens),
    );
    line(
        "sluice_batches_multi_job_total",
        "counter",
        "Batches holding items of several jobs.",
        get(&s.batches_multi_job),
    );
    line(
        "sluice_jobs_in_flight",
        "gauge",
        "Jobs admitted and not yet settled.",
        get(&s.jobs_in_flight),
    );
    line(
        "sluice_budget_bytes",
        "gauge",
        "Memory budget for jobs.",
        b.limit_bytes,
    );
    line(
        "sluice_budget_reserved_bytes",
        "gauge",
        "Bytes reserved by in-flight jobs.",
        b.reserved_bytes,
    );
    line(
        "sluice_budget_reserved_peak_bytes",
        "gauge",
        "Highest reserved bytes so far.",
        b.peak_reserved_bytes,
    );
    let _ = writeln!(
        out,
        "# HELP sluice_jobs_failed_total Jobs failed for good, by error code.\n# TYPE sluice_jobs_failed_total counter"
    );
    for (code, n) in s.jobs_failed() {
        let _ = writeln!(out, "sluice_jobs_failed_total{{code=\"{code}\"}} {n}");
    }
    out
}
