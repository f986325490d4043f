//! Listens for the server's MAX_DELIVERIES advisories on the job consumer and
//! dead-letters the messages they name (see `job::dead_letter_exhausted`).
//! Advisories are plain core messages, lost if nobody listens: every consumer
//! process listens, in one queue group, so exactly one handles each.

use std::sync::Weak;

use async_nats::jetstream;
use futures::StreamExt;

use crate::job;
use crate::service::Shared;

#[derive(serde::Deserialize)]
struct MaxDeliveries {
    stream_seq: u64,
    deliveries: u32,
}

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
            job::dead_letter_exhausted(&shared, &stream, advisory.stream_seq, advisory.deliveries)
                .await
        {
            tracing::error!(seq = advisory.stream_seq, error = %e, "cannot dead-letter an exhausted job; it stays in the job stream");
        }
    }
}
