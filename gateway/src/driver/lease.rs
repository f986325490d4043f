//! The lease one gateway holds on a batch while it validates or finalizes
//! it; the others skip the batch until it ends or lapses.

use std::time::{Duration, Instant};

use anyhow::{Result, bail};

use crate::batch_record::{BatchRecord, BatchStatus, Lease};
use crate::state::{AppState, now};

/// Takes (or renews) the batch's lease while it is in `status`; false when
/// another gateway holds it or the batch moved on.
pub async fn lease(state: &AppState, id: &str, statuses: &[BatchStatus]) -> Result<bool> {
    let t = now();
    let until = t + state.config.lease_secs as i64;
    let taken = state
        .records
        .update::<BatchRecord, _>(&BatchRecord::key(id), |b| {
            let free = match &b.lease {
                None => true,
                Some(l) => l.owner == state.owner || l.until < t,
            };
            (free && statuses.contains(&b.status)).then(|| BatchRecord {
                lease: Some(Lease {
                    owner: state.owner.clone(),
                    until,
                }),
                ..b.clone()
            })
        })
        .await?;
    Ok(taken.is_some())
}

/// Renews the lease at most every few seconds of work; errors when lost.
pub struct Renewal {
    last: Instant,
}

impl Renewal {
    pub fn new() -> Renewal {
        Renewal {
            last: Instant::now(),
        }
    }

    pub async fn keep(
        &mut self,
        state: &AppState,
        id: &str,
        statuses: &[BatchStatus],
    ) -> Result<()> {
        let every = Duration::from_secs((state.config.lease_secs / 3).max(1));
        if self.last.elapsed() >= every {
            if !lease(state, id, statuses).await? {
                bail!("lost the lease on batch {id}");
            }
            self.last = Instant::now();
        }
        Ok(())
    }
}
