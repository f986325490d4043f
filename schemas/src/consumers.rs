//! The live consumers: each consumer process keeps a record of itself (what
//! it serves and on what) in the topology's `consumers_bucket`, written
//! again every [`HEARTBEAT_EVERY`]. The bucket keeps an entry
//! [`HEARTBEAT_TTL`] after its last write, so a process that dies without a
//! word (SIGKILL, a lost node) drops out of the list by itself; one that
//! stops cleanly removes its record as it starts to drain. Pure: the writing
//! is the consumer's, the reading the gateway's and `sluice watch`'s.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

/// How often a consumer writes its record.
pub const HEARTBEAT_EVERY: Duration = Duration::from_secs(5);
/// How long a record is kept after its last write (the bucket's max age):
/// three missed heartbeats.
pub const HEARTBEAT_TTL: Duration = Duration::from_secs(15);

/// One consumer process, as it describes itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LiveConsumer {
    /// Unique per process: `<host>-<pid>-<start nanos, hex>`, a key token.
    pub id: String,
    /// The task it serves (`embed`, `generate`).
    pub task: String,
    /// The model it loaded (`--model-name`).
    pub model: String,
    /// The forward that runs it (as in a result's `served_by`).
    pub forward: String,
    /// Where the model runs (`cpu`, `cuda:0`).
    pub device: String,
    /// Its memory budget in bytes.
    pub budget_bytes: u64,
    /// The sluice version it runs.
    pub version: String,
    pub host: String,
    pub pid: u32,
    #[serde(with = "time::serde::rfc3339")]
    pub started_at: OffsetDateTime,
    /// When it last wrote this record.
    #[serde(with = "time::serde::rfc3339")]
    pub heartbeat_at: OffsetDateTime,
}

impl LiveConsumer {
    /// An id for a process on `host` with `pid` started at `started_at`:
    /// the host name kept to key-safe characters.
    pub fn id_for(host: &str, pid: u32, started_at: OffsetDateTime) -> String {
        let host: String = host
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
            .take(63)
            .collect();
        let nanos = started_at.unix_timestamp_nanos() as u64;
        format!("{host}-{pid}-{nanos:x}")
    }

    /// Its key in the consumers bucket: `<task>.<model>.<id>`.
    pub fn key(&self) -> String {
        format!("{}.{}.{}", self.task, self.model, self.id)
    }

    /// Whether its last heartbeat is recent enough at `now` (readers check
    /// it too, so a bucket kept longer than [`HEARTBEAT_TTL`] by hand still
    /// lists only the living).
    pub fn is_live(&self, now: OffsetDateTime) -> bool {
        now - self.heartbeat_at < HEARTBEAT_TTL
    }
}

/// How many live consumers serve `model` of `task`.
pub fn serving(consumers: &[LiveConsumer], task: &str, model: &str) -> usize {
    consumers
        .iter()
        .filter(|c| c.task == task && c.model == model)
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn consumer(task: &str, model: &str, heartbeat_at: OffsetDateTime) -> LiveConsumer {
        let started_at = time::macros::datetime!(2026-12-04 09:00 UTC);
        LiveConsumer {
            id: LiveConsumer::id_for("pod/a.b_c", 42, started_at),
            task: task.into(),
            model: model.into(),
            forward: "packed-avx2".into(),
            device: "cpu".into(),
            budget_bytes: 1 << 30,
            version: "0.1.0".into(),
            host: "pod/a.b_c".into(),
            pid: 42,
            started_at,
            heartbeat_at,
        }
    }

    #[test]
    fn the_key_is_task_model_and_a_key_safe_id() {
        let at = time::macros::datetime!(2026-12-04 09:00 UTC);
        let c = consumer("embed", "minilm", at);
        assert!(c.id.starts_with("pod-a-b-c-42-"), "{}", c.id);
        assert!(
            c.key()
                .chars()
                .all(|ch| ch.is_ascii_alphanumeric() || "-_.".contains(ch))
        );
        assert_eq!(c.key().split('.').count(), 3);
        assert!(c.key().starts_with("embed.minilm."));
    }

    #[test]
    fn a_record_is_live_until_three_heartbeats_are_missed() {
        let at = time::macros::datetime!(2026-12-04 09:00 UTC);
        let c = consumer("embed", "minilm", at);
        assert!(c.is_live(at));
        assert!(c.is_live(at + HEARTBEAT_EVERY * 2));
        assert!(!c.is_live(at + HEARTBEAT_TTL));
    }

    #[test]
    fn serving_counts_by_task_and_model() {
        let at = time::macros::datetime!(2026-12-04 09:00 UTC);
        let all = [
            consumer("embed", "a", at),
            consumer("embed", "a", at),
            consumer("embed", "b", at),
            consumer("generate", "a", at),
        ];
        assert_eq!(serving(&all, "embed", "a"), 2);
        assert_eq!(serving(&all, "embed", "b"), 1);
        assert_eq!(serving(&all, "generate", "a"), 1);
        assert_eq!(serving(&all, "generate", "b"), 0);
    }
}
