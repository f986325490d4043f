//! A small HTTP endpoint for operators: `/healthz` (alive), `/readyz` (ready
//! to take jobs; not while draining), `/debug/memory` (budget and memory, JSON)
//! and `/metrics` (Prometheus text).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::budget::Budget;
use crate::in_flight::InFlight;
use crate::memory::MemoryProbe;
use crate::telemetry::{Readings, Stats};

#[derive(Clone)]
pub struct State {
    pub stats: Arc<Stats>,
    pub in_flight: Arc<InFlight>,
    pub budget: Budget,
    /// Set once the model is warm and the consumer bound; cleared on drain.
    pub ready: Arc<AtomicBool>,
    pub nats: async_nats::Client,
    /// "cpu" or "cuda:N".
    pub device: String,
    pub memory: MemoryProbe,
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
        "/readyz" => match readiness(state) {
            Ok(()) => respond(&mut conn, 200, "text/plain", "ready\n").await,
            Err(why) => respond(&mut conn, 503, "text/plain", &format!("not ready: {why}\n")).await,
        },
        "/debug/memory" => {
            let body = memory_json(state).to_string();
            respond(&mut conn, 200, "application/json", &body).await
        }
        "/metrics" => {
            respond(
                &mut conn,
                200,
                "text/plain; version=0.0.4",
                &state.stats.render_prometheus(&state.readings()),
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

impl State {
    /// The budget and memory now, as `/metrics` and the OTLP push read them.
    pub fn readings(&self) -> Readings {
        Readings {
            budget: self.budget.snapshot(),
            in_flight: Arc::clone(&self.in_flight),
            memory: self.memory.read(),
            ready: readiness(self).is_ok(),
        }
    }
}

fn memory_json(state: &State) -> serde_json::Value {
    let b = state.budget.snapshot();
    let m = state.memory.read();
    serde_json::json!({
        "device": state.device,
        "budget_bytes": b.limit_bytes,
        "reserved_bytes": b.reserved_bytes,
        "peak_reserved_bytes": b.peak_reserved_bytes,
        "host_resident_bytes": m.host_resident_bytes,
        "host_peak_resident_bytes": m.host_peak_resident_bytes,
        // The GPU's memory from its driver (null on the CPU): the whole
        // device, other processes included.
        "device_memory": m.device,
        "jobs_in_flight": state.in_flight.jobs(),
        "tokens_in_flight": state.in_flight.tokens(),
    })
}

/// Ready: the model is loaded and warm and the consumer bound (both true
/// once `ready` is set), NATS is connected, and the consumer is not draining.
fn readiness(state: &State) -> Result<(), &'static str> {
    if !state.ready.load(Ordering::Acquire) {
        return Err("draining");
    }
    if state.nats.connection_state() != async_nats::connection::State::Connected {
        return Err("NATS disconnected");
    }
    Ok(())
}
