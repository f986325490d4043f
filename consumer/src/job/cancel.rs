//! Noticing that a running job was cancelled. `sluice cancel`, a gateway
//! whose client went away, or any writer of the status contract stores a
//! `cancelled` record; a generate job watches its own record's KV subject
//! (a core subscription, no server-side consumer) from before it is marked
//! running, so a cancel stored after that is seen, and its sequences leave
//! the generation thread before the next step.

use futures::StreamExt;
use sluice_status::StatusStore;

use crate::shared::Shared;

/// Resolves [`CancelWatch::cancelled`] once the job's record reads `cancelled`.
pub struct CancelWatch {
    subscription: Option<async_nats::Subscriber>,
}

impl CancelWatch {
    /// Watches `job_id`'s status record (in `statuses`' scope). When the
    /// subscription cannot be made the job runs without the watch (a cancel
    /// then takes effect at its end, as the status compare-and-swap
    /// decides), with a warning.
    pub async fn subscribe(shared: &Shared, statuses: &StatusStore, job_id: &str) -> CancelWatch {
        let subject = statuses.record_subject(job_id);
        match shared.js.client().subscribe(subject).await {
            Ok(subscription) => CancelWatch {
                subscription: Some(subscription),
            },
            Err(e) => {
                tracing::warn!(job = %job_id, error = %e, "cannot watch the job's status for a cancel; it will run to its end");
                CancelWatch::none()
            }
        }
    }

    /// A watch that never fires (jobs short enough to run to their end).
    pub fn none() -> CancelWatch {
        CancelWatch { subscription: None }
    }

    /// Waits until a `cancelled` record is stored; never returns otherwise.
    pub async fn cancelled(&mut self) {
        if let Some(subscription) = self.subscription.as_mut() {
            while let Some(message) = subscription.next().await {
                if StatusStore::is_cancelled_write(&message.payload) {
                    return;
                }
            }
        }
        std::future::pending::<()>().await;
    }
}
