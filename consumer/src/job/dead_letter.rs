//! Giving up on a job: the dead letter, the failed status and the error
//! result ([`give_up`]); the backstop for jobs that ran out of deliveries
//! without the consumer seeing the last one ([`dead_letter_exhausted`]);
//! and the listener for the server's MAX_DELIVERIES advisories that feeds
//! it. Advisories are plain core messages, lost if nobody listens: every
//! consumer process listens, in one queue group, so exactly one handles
//! each.

use std::collections::BTreeMap;
use std::sync::Weak;
use std::sync::atomic::Ordering;

use async_nats::jetstream;
use base64::Engine as _;
use futures::StreamExt;
use sluice_schemas::names::headers;
use sluice_schemas::{
    DeadLetter, ErrorCode, JobResult, JobState, Outcome, Task, Timings, Usage, VERSION,
};
use time::OffsetDateTime;

use super::delivery::{Delivery, job_id_of, route, status, status_scope};
use crate::error::JobError;
use crate::shared::Shared;

#[derive(serde::Deserialize)]
struct MaxDeliveries {
    stream_seq: u64,
    deliveries: u32,
}

/// Subscribes to the advisories for the durable consumer `consumer`.
pub async fn subscribe(
    nats: &async_nats::Client,
    stream_name: &str,
    consumer: &str,
) -> Result<async_nats::Subscriber, async_nats::SubscribeError> {
    let subject = format!("$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.{stream_name}.{consumer}");
    nats.queue_subscribe(subject, format!("sluice-advisories-{consumer}"))
        .await
}

/// Holds `shared` weakly, so a consumer that shuts down is not kept alive by
/// this listener; it ends at the first advisory after that.
pub async fn run(
    shared: Weak<Shared>,
    stream: jetstream::stream::Stream,
    mut sub: async_nats::Subscriber,
) {
    while let Some(msg) = sub.next().await {
        let Some(shared) = shared.upgrade() else {
            return;
        };
        let Ok(advisory) = serde_json::from_slice::<MaxDeliveries>(&msg.payload) else {
            tracing::warn!("unreadable MAX_DELIVERIES advisory");
            continue;
        };
        tracing::warn!(
            seq = advisory.stream_seq,
            deliveries = advisory.deliveries,
            "a job ran out of deliveries; dead-lettering it"
        );
        if let Err(e) =
            dead_letter_exhausted(&shared, &stream, advisory.stream_seq, advisory.deliveries).await
        {
            tracing::error!(seq = advisory.stream_seq, error = %e, "cannot dead-letter an exhausted job; it stays in the job stream");
        }
    }
}

/// The job message as it was published, kept whole in its dead letter.
#[derive(Clone, Copy)]
pub struct Original<'a> {
    pub headers: Option<&'a async_nats::HeaderMap>,
    pub payload: &'a [u8],
}

/// Everything a final failure does before the message leaves the stream:
/// the dead letter, then the failed status (both awaited: an error in either
/// means the message must stay, to be given up on again), then the error
/// result (best effort: core NATS; the status record holds the outcome). A cancelled job is answered but not dead-lettered
/// (`dead_letter` false), by the one delivery whose answer claim wins.
pub async fn give_up(
    shared: &Shared,
    d: &Delivery,
    original: Original<'_>,
    error: &JobError,
    dead_letter: bool,
    timings: Timings,
    finished_at: OffsetDateTime,
) -> Result<(), JobError> {
    let job_id = d.job_id.clone();
    let timings_total = timings.total.unwrap_or(0.0);
    if let Some(id) = &job_id
        && dead_letter
        && let Ok(Some(record)) = d.statuses(&shared.status).get(id).await
        && record.state.is_final()
        && record.stream_sequence == Some(d.stream_sequence)
    {
        // Another delivery of this same message already answered it: this
        // failure is stale. (A different message under a final job's id,
        // e.g. an unreadable one whose Nats-Msg-Id reuses the id, is still
        // dead-lettered and answered below; its status stays as it is.)
        tracing::info!(job = %id, state = ?record.state, "job already answered; dropping a stale failure");
        shared
            .stats
            .jobs_already_final
            .fetch_add(1, Ordering::Relaxed);
        return Ok(());
    }
    if dead_letter {
        let mut letter = DeadLetter {
            version: VERSION,
            job_id: job_id.clone(),
            error: error.info(),
            attempts: d.attempt,
            original_subject: d.subject.clone(),
            stream_sequence: d.stream_sequence,
            dead_lettered_at: finished_at,
            headers: original
                .headers
                .map(|h| {
                    h.iter()
                        .map(|(k, vs)| {
                            (
                                k.to_string(),
                                vs.iter().map(|v| v.as_str().to_string()).collect(),
                            )
                        })
                        .collect::<BTreeMap<_, _>>()
                })
                .unwrap_or_default(),
            payload_base64: base64::engine::general_purpose::STANDARD.encode(original.payload),
            payload_object: None,
        };
        if !shared.dead_letters.fits(&letter) {
            // Too large to carry: kept beside the letter, never lost (an
            // error here leaves the message in the stream, to try again).
            letter.payload_object = Some(
                shared
                    .outputs
                    .keep_dead_letter_payload(d.stream_sequence, original.payload)
                    .await?,
            );
            letter.payload_base64.clear();
        }
        let task = d.task.map(Task::as_str).unwrap_or("unknown");
        shared
            .dead_letters
            .publish(shared.topology.dlq_subject(task), &letter)
            .await?;
    }
    if let Some(job_id) = &job_id
        && dead_letter
    {
        // A job pulled after its deadline was never run: `expired`, as a
        // job the stream dropped at its deadline reads.
        let state = if error.code == ErrorCode::DeadlineExceeded {
            JobState::Expired
        } else {
            JobState::Failed
        };
        let mut record = status(job_id, state, d);
        record.error = Some(error.info());
        match d.statuses(&shared.status).finish(&record).await {
            Ok(true) => {}
            // Final already: a delivery of this message that finished it
            // answered; otherwise (a cancel, another message under the same
            // id) this message is answered once, by the delivery whose claim
            // wins.
            Ok(false) => {
                if !claim_answer(shared, job_id, d).await? {
                    return Ok(());
                }
            }
            // The message must stay: its redelivery finds no final record,
            // gives up again, and its dead letter is dropped as a duplicate
            // (same message id), so the failure is recorded once, and with
            // its status record (a job that is dead-lettered but reads
            // `running` forever would be lost to whoever asks).
            Err(e) => {
                let e = JobError::from(e);
                tracing::warn!(job = %job_id, error = %e, "cannot record the failure (its dead letter is stored); the job will be redelivered");
                return Err(e);
            }
        }
    }
    // A cancelled job's record is final already (the cancel wrote it):
    // of the deliveries that find it so, the one whose claim wins answers.
    if let Some(job_id) = &job_id
        && !dead_letter
        && !claim_answer(shared, job_id, d).await?
    {
        return Ok(());
    }
    // Counted before the error result goes out, as ok jobs are.
    shared.stats.record_job_failed(error.code);
    if dead_letter {
        shared.stats.dead_lettered.fetch_add(1, Ordering::Relaxed);
    }
    // Every message that names a reply subject is answered, with or without
    // an id; without either there is nowhere to answer (the dead letter
    // holds it).
    let reply_to = d.reply_to.clone().or_else(|| {
        job_id
            .as_deref()
            .map(|id| shared.topology.result_subject(id))
    });
    if let Some(reply_to) = reply_to {
        let result = JobResult {
            version: VERSION,
            job_id: job_id.clone(),
            outcome: Outcome::Error {
                error: error.info(),
            },
            usage: Usage::default(),
            timings_ms: timings,
            attempt: d.attempt,
            served_by: Some(shared.served_by()),
            finished_at,
        };
        if let Err(e) = shared
            .results
            .publish(&reply_to, &result, d.traceparent.as_deref())
            .await
        {
            tracing::warn!(job = job_id.as_deref().unwrap_or("?"), error = %e, "cannot publish the error result (it is in the dead-letter stream)");
        }
    }
    tracing::info!(
        job = job_id.as_deref().unwrap_or("?"),
        trace_id = %d.trace_id,
        outcome = "failed",
        code = %error.code,
        attempt = d.attempt,
        seq = d.stream_sequence,
        total_ms = timings_total,
        error = %error.message,
        "job failed"
    );
    Ok(())
}

/// Whether this delivery answers a job whose record is already final
/// ([`sluice_status::StatusStore::claim_answer`]): false when another
/// delivery of the message answered or claimed it (counted as an answer
/// already given). An error leaves the message for redelivery.
async fn claim_answer(shared: &Shared, job_id: &str, d: &Delivery) -> Result<bool, JobError> {
    match d
        .statuses(&shared.status)
        .claim_answer(job_id, d.stream_sequence, d.attempt)
        .await
    {
        Ok(true) => Ok(true),
        Ok(false) => {
            tracing::info!(job = %job_id, trace_id = %d.trace_id, attempt = d.attempt, seq = d.stream_sequence, "another delivery answered the job; not answering twice");
            shared
                .stats
                .jobs_already_final
                .fetch_add(1, Ordering::Relaxed);
            Ok(false)
        }
        Err(e) => {
            let e = JobError::from(e);
            tracing::warn!(job = %job_id, error = %e, "cannot claim the answer to a final job; it will be redelivered");
            Err(e)
        }
    }
}

/// The backstop for jobs that ran out of deliveries without the consumer
/// seeing the last one (a crash, or a timeout on the final delivery): the
/// server's MAX_DELIVERIES advisory names the stream sequence; the message is
/// read back, dead-lettered and then deleted from the work queue.
pub async fn dead_letter_exhausted(
    shared: &Shared,
    stream: &jetstream::stream::Stream,
    sequence: u64,
    deliveries: u32,
) -> Result<(), JobError> {
    let msg = match stream.get_raw_message(sequence).await {
        Ok(m) => m,
        Err(e) => {
            // Already gone (acked or dead-lettered elsewhere): nothing to do.
            tracing::debug!(seq = sequence, error = %e, "exhausted message no longer in the stream");
            return Ok(());
        }
    };
    let decoded = sluice_schemas::Job::decode(&msg.payload).ok();
    let get = |name: &str| msg.headers.get(name).map(|v| v.as_str().to_string());
    let (priority, tenant) = route(&shared.topology, &msg.subject, get(headers::TENANT));
    let d = Delivery {
        attempt: deliveries,
        stream_sequence: sequence,
        published: msg.time,
        subject: msg.subject.to_string(),
        traceparent: get(headers::TRACEPARENT),
        reply_to: get(headers::REPLY_TO),
        job_id: job_id_of(&msg.payload, get(headers::MSG_ID).as_deref()),
        task: decoded.as_ref().map(|v| v.task),
        replays: 0,
        trace_id: "-".into(),
        priority,
        tenant,
        status_scope: status_scope(&shared.topology, &msg.subject),
    };
    let error = JobError::new(
        ErrorCode::MaxDeliveriesExceeded,
        format!(
            "the job was delivered {deliveries} times without an answer (the consumer crashed or timed out each time)"
        ),
    );
    give_up(
        shared,
        &d,
        Original {
            headers: Some(&msg.headers),
            payload: &msg.payload,
        },
        &error,
        true,
        Timings::default(),
        OffsetDateTime::now_utc(),
    )
    .await?;
    if let Err(e) = stream.delete_message(sequence).await {
        tracing::warn!(seq = sequence, error = %e, "cannot delete the dead-lettered message from the job stream");
    }
    Ok(())
}
