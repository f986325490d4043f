//! Idle long-polls: when no queue had jobs, each waits up to
//! `--pull-expires-ms` for one job under a reservation of its own, so a job
//! anywhere is taken as soon as it is published.

use std::time::Duration;

use async_nats::jetstream::{self, consumer::PullConsumer};
use futures::StreamExt;
use futures::future::BoxFuture;

use super::plan::QueueKey;
use crate::budget::Reservation;

/// What one idle long-poll ended with: the queue, what it delivered (at
/// most one job), and the reservation it was made under.
pub type Delivered = (QueueKey, Option<jetstream::Message>, Reservation);

/// One queue's idle long-poll.
pub type IdlePoll = BoxFuture<'static, Delivered>;

/// Waits up to `expires` for one job from `queue`.
pub fn long_poll(
    consumer: PullConsumer,
    queue: QueueKey,
    reservation: Reservation,
    expires: Duration,
) -> IdlePoll {
    Box::pin(async move {
        let (level, tenant) = (queue.0, queue.1.as_str());
        let msg = match consumer
            .batch()
            .max_messages(1)
            .expires(expires)
            .messages()
            .await
        {
            Ok(mut messages) => match messages.next().await {
                Some(Ok(msg)) => Some(msg),
                Some(Err(e)) => {
                    tracing::debug!(error = %e, %level, %tenant, "idle pull ended with an error");
                    None
                }
                None => None,
            },
            Err(e) => {
                tracing::debug!(error = %e, %level, %tenant, "idle pull failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                None
            }
        };
        (queue, msg, reservation)
    })
}
