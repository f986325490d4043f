//! A delivery of a job message as the rest of the job sees it: what
//! JetStream and the headers say (attempt, sequence, reply subject, trace
//! context), the job id read even from a job that fails to decode, the
//! progress-ack keep-alive, and the Naks that give a message back.

use std::time::Duration;

use async_nats::jetstream::{self, AckKind};
use sluice_schemas::{JobState, StatusRecord, Task, VERSION};
use time::OffsetDateTime;
use tokio::sync::watch;

/// What we know of a delivery before and after decoding it.
pub struct Delivery {
    pub attempt: u32,
    pub stream_sequence: u64,
    pub published: OffsetDateTime,
    pub subject: String,
    pub traceparent: Option<String>,
    pub reply_to: Option<String>,
    pub job_id: Option<String>,
    pub task: Option<Task>,
    /// Replays recorded in the job's status, carried into every status write.
    pub replays: u32,
    /// The job's trace id, for log lines ("-" when tracing is off).
    pub trace_id: String,
    /// The level and tenant, from the subject (the tenant from the
    /// `Sluice-Tenant` header on a plain subject; `default` without one).
    pub priority: sluice_schemas::Priority,
    pub tenant: String,
    /// The tenant whose status records the job's is among: its subject's
    /// (`None` on a plain subject, whatever the header says; see
    /// [`sluice_status::StatusStore`]).
    pub status_scope: Option<String>,
}

impl Delivery {
    /// The status records of this delivery's scope.
    pub fn statuses(&self, all: &sluice_status::StatusStore) -> sluice_status::StatusStore {
        all.scoped(self.status_scope.as_deref())
    }
}

/// The tenant a job subject names (`None` for a plain subject): the scope
/// of its job's status record. Only the subject: NATS checks it against the
/// publisher's permissions, not a header.
pub fn status_scope(topology: &sluice_schemas::Topology, subject: &str) -> Option<String> {
    topology.route_of(subject).and_then(|r| r.tenant)
}

/// A job subject's priority and tenant; on a plain subject the tenant the
/// `Sluice-Tenant` header names (for labels only: fair share follows the
/// subject), else `default`.
pub fn route(
    topology: &sluice_schemas::Topology,
    subject: &str,
    tenant_header: Option<String>,
) -> (sluice_schemas::Priority, String) {
    let route = topology.route_of(subject);
    let priority = route
        .as_ref()
        .map_or(sluice_schemas::Priority::Normal, |r| r.priority);
    let tenant = route
        .and_then(|r| r.tenant)
        .or_else(|| tenant_header.filter(|t| sluice_schemas::is_valid_tenant(t)))
        .unwrap_or_else(|| sluice_schemas::DEFAULT_TENANT.to_string());
    (priority, tenant)
}

/// The status record this delivery writes in `state`.
pub fn status(job_id: &str, state: JobState, d: &Delivery) -> StatusRecord {
    StatusRecord {
        version: VERSION,
        job_id: job_id.to_string(),
        state,
        updated_at: OffsetDateTime::now_utc(),
        attempts: d.attempt,
        stream_sequence: Some(d.stream_sequence),
        output: None,
        error: None,
        replays: d.replays,
        usage: None,
        deadline: None,
        answered: Vec::new(),
    }
}

/// The id a job message is answered under, even when the message is not a
/// valid job: the body's `id` when the body is JSON with a valid id, else the
/// `Nats-Msg-Id` header's when that is a valid id (the contract makes it the
/// job id, or `<tenant>.<job id>` on a tenant's subject), else none.
pub fn job_id_of(payload: &[u8], nats_msg_id: Option<&str>) -> Option<String> {
    let valid = |id: &str| sluice_schemas::names::is_valid_job_id(id).then(|| id.to_string());
    serde_json::from_slice::<serde_json::Value>(payload)
        .ok()
        .and_then(|body| body.get("id")?.as_str().and_then(valid))
        .or_else(|| {
            nats_msg_id
                .and_then(|m| m.rsplit('.').next())
                .and_then(valid)
        })
}

/// Resolves once `abort` turns true; never if its sender goes away.
pub async fn aborted(abort: &mut watch::Receiver<bool>) {
    loop {
        if *abort.borrow_and_update() {
            return;
        }
        if abort.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

pub fn header(msg: &jetstream::Message, name: &str) -> Option<String> {
    msg.headers
        .as_ref()
        .and_then(|h| h.get(name))
        .map(|v| v.as_str().to_string())
}

pub fn ms_between(a: OffsetDateTime, b: OffsetDateTime) -> f64 {
    ((b - a).as_seconds_f64() * 1e3).max(0.0)
}

/// Sends progress acks while the job waits or runs, so its ack deadline does
/// not pass; stops when dropped.
pub struct KeepAlive(Option<tokio::task::JoinHandle<()>>);

impl KeepAlive {
    pub fn start(js: &jetstream::Context, msg: &jetstream::Message, every: Duration) -> KeepAlive {
        let acker = jetstream::message::Acker::new(js.clone(), msg.reply.clone());
        KeepAlive(Some(tokio::spawn(async move {
            let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
            loop {
                tick.tick().await;
                if let Err(e) = acker.ack_with(AckKind::Progress).await {
                    tracing::debug!(error = %e, "progress ack failed");
                }
            }
        })))
    }
}

impl KeepAlive {
    /// Stops it and waits until it has stopped, so that no progress ack of
    /// this delivery can follow the ack decision.
    pub async fn stop(mut self) {
        if let Some(task) = self.0.take() {
            task.abort();
            let _ = task.await;
        }
    }
}

impl Drop for KeepAlive {
    fn drop(&mut self) {
        if let Some(task) = self.0.take() {
            task.abort();
        }
    }
}

/// Gives a message back for immediate redelivery (drain, or a delivery that
/// was never admitted).
pub async fn nak_now(msg: &jetstream::Message) {
    if let Err(e) = msg.ack_with(AckKind::Nak(None)).await {
        tracing::warn!(error = %e, "nak failed; the job will be redelivered after ack_wait");
    }
}

pub async fn nak(msg: &jetstream::Message, delay: Duration) {
    if let Err(e) = msg.ack_with(AckKind::Nak(Some(delay))).await {
        tracing::warn!(error = %e, "nak failed; the job will be redelivered after ack_wait");
    }
}

#[cfg(test)]
mod tests {
    use super::job_id_of;

    #[test]
    fn the_body_id_wins_then_the_message_id_then_none() {
        let id = |body: &[u8], header: Option<&str>| job_id_of(body, header);
        assert_eq!(
            id(br#"{"id":"job-1"}"#, Some("other")),
            Some("job-1".into())
        );
        // Not a valid job otherwise: the id is still read.
        assert_eq!(
            id(br#"{"id":"job-1","task":7}"#, None),
            Some("job-1".into())
        );
        // Not JSON, not UTF-8, an array, an id the schema refuses: the header.
        for body in [
            &b"not json"[..],
            b"\xff\xfe{",
            b"[1,2]",
            br#"{"id":"a b/c"}"#,
        ] {
            assert_eq!(id(body, Some("job-2")), Some("job-2".into()), "{body:?}");
            // A tenant's job's message id is its status key.
            assert_eq!(
                id(body, Some("acme.job-2")),
                Some("job-2".into()),
                "{body:?}"
            );
            assert_eq!(id(body, None), None, "{body:?}");
        }
        // A header the schema would refuse as an id is not used either.
        assert_eq!(id(b"not json", Some("has space")), None);
        assert_eq!(id(b"not json", Some("")), None);
    }
}
