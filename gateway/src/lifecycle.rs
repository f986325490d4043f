//! What the gateway keeps, and for how long: files that expire, batch
//! records removed once they are old, and nothing removed while a batch
//! still needs it.
//!
//! - A file expires at its `expires_at`: an upload's `expires_after`
//!   (`anchor` `created_at`, `seconds`), a batch's output and error files'
//!   `output_expires_after`, else `--retention-days` after it was made
//!   (OpenAI's default for batch files: 30 days). From then on it answers
//!   404; its bytes and record are removed by the sweeper once
//!   `--expiry-grace-secs` more have passed, unless it is the input of a
//!   batch that has not ended (a batch's input is read again when it
//!   finalizes), in which case it goes at the first sweep after the batch
//!   ends. The grace covers a batch created from the file just before it
//!   expired: creating reads the file record (refused once expired) and
//!   then writes the batch record, which the sweeper must see.
//! - A batch's chunk inputs and its chunk jobs' outputs are copies of its
//!   input and output files: they are removed when the batch ends, by the
//!   gateway that ends it.
//! - A batch record is removed `--retention-days` after the batch ended
//!   (its chunk inputs again with it, in case the end's removal failed).
//!   The gateway bucket itself has no maximum age, so a record never
//!   vanishes under a running batch; the status bucket does, so a batch's
//!   completion window must end a margin before its chunks' status records
//!   could age out ([`max_window_secs`]).
//!
//! This module is the policy, pure; `driver/sweep.rs` carries it out. Every
//! gateway sweeps; the sweep reads the records each time and deletes
//! idempotently, so any number of gateways, restarted at any moment, agree.

use std::collections::HashSet;
use std::time::Duration;

use serde_json::Value;

use crate::batch_record::BatchRecord;
use crate::file_record::FileRecord;

/// OpenAI's longest `expires_after` (30 days). sluice has no shortest.
pub const MAX_EXPIRES_AFTER_SECS: i64 = 30 * 86_400;

/// How long after a batch's window ends its finalizing may still need its
/// chunks' status records.
pub const FINALIZE_MARGIN_SECS: i64 = 86_400;

/// Reads an expiration policy (`anchor`, `seconds`): the seconds after the
/// file's creation, or what is wrong with it, naming the field.
pub fn expires_after(anchor: Option<&str>, seconds: Option<&Value>) -> Result<i64, String> {
    if anchor != Some("created_at") {
        return Err(format!(
            "expires_after[anchor] must be \"created_at\", not {anchor:?}"
        ));
    }
    let seconds = seconds.and_then(|s| match s {
        Value::Number(n) => n.as_i64(),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    });
    match seconds {
        Some(s) if (1..=MAX_EXPIRES_AFTER_SECS).contains(&s) => Ok(s),
        _ => Err(format!(
            "expires_after[seconds] must be a whole number of seconds from 1 to {MAX_EXPIRES_AFTER_SECS} (30 days)"
        )),
    }
}

/// When a file made at `created_at` expires: after its own policy's
/// seconds, else after the retention, else never.
pub fn expires_at(created_at: i64, policy_secs: Option<i64>, retention_days: u64) -> Option<i64> {
    let default = (retention_days > 0).then(|| retention_days as i64 * 86_400);
    policy_secs.or(default).map(|s| created_at + s)
}

/// The longest completion window this deployment can finish: a margin
/// inside the status bucket's maximum age (0: none), at most 7 days.
pub fn max_window_secs(status_max_age: Duration) -> i64 {
    let week = 7 * 86_400;
    if status_max_age.is_zero() {
        return week;
    }
    (status_max_age.as_secs() as i64 - FINALIZE_MARGIN_SECS).clamp(0, week)
}

/// What one sweep removes.
#[derive(Debug, Default, PartialEq)]
pub struct Sweep {
    pub files: Vec<String>,
    pub batches: Vec<String>,
}

/// The sweep's decision, pure: files expired more than `grace_secs` ago
/// that no unfinished batch reads, and batches ended more than the
/// retention ago.
pub fn plan(
    at: i64,
    files: &[FileRecord],
    batches: &[BatchRecord],
    grace_secs: i64,
    retention_days: u64,
) -> Sweep {
    let in_use: HashSet<&str> = batches
        .iter()
        .filter(|b| !b.status.is_final())
        .map(|b| b.input_file_id.as_str())
        .collect();
    let files = files
        .iter()
        .filter(|f| f.expires_at.is_some_and(|t| t + grace_secs <= at))
        .filter(|f| !in_use.contains(f.id.as_str()))
        .map(|f| f.id.clone())
        .collect();
    let retention = retention_days as i64 * 86_400;
    let batches = batches
        .iter()
        .filter(|_| retention_days > 0)
        .filter(|b| ended_at(b).is_some_and(|t| t + retention <= at))
        .map(|b| b.id.clone())
        .collect();
    Sweep { files, batches }
}

/// When a final batch ended.
fn ended_at(batch: &BatchRecord) -> Option<i64> {
    if !batch.status.is_final() {
        return None;
    }
    batch
        .completed_at
        .or(batch.failed_at)
        .or(batch.expired_at)
        .or(batch.cancelled_at)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::batch_record::{BatchStatus, Counts};
    use serde_json::json;

    #[test]
    fn expiration_policies_read_as_seconds_or_name_what_is_wrong() {
        assert_eq!(
            expires_after(Some("created_at"), Some(&json!(3600))),
            Ok(3600)
        );
        assert_eq!(expires_after(Some("created_at"), Some(&json!("5"))), Ok(5));
        for (anchor, seconds, names) in [
            (None, json!(5), "anchor"),
            (Some("last_active_at"), json!(5), "anchor"),
            (Some("created_at"), json!(0), "seconds"),
            (Some("created_at"), json!(2_592_001), "seconds"),
            (Some("created_at"), json!("soon"), "seconds"),
            (Some("created_at"), json!(1.5), "seconds"),
        ] {
            let e = expires_after(anchor, Some(&seconds)).unwrap_err();
            assert!(e.contains(names), "{anchor:?} {seconds}: {e}");
        }
        assert_eq!(expires_at(100, Some(5), 30), Some(105));
        assert_eq!(expires_at(100, None, 1), Some(100 + 86_400));
        assert_eq!(expires_at(100, None, 0), None);
    }

    #[test]
    fn windows_end_a_day_inside_the_status_records_age() {
        assert_eq!(max_window_secs(Duration::ZERO), 7 * 86_400);
        assert_eq!(max_window_secs(Duration::from_secs(8 * 86_400)), 7 * 86_400);
        assert_eq!(max_window_secs(Duration::from_secs(7 * 86_400)), 6 * 86_400);
        assert_eq!(max_window_secs(Duration::from_secs(3600)), 0);
    }

    fn file(id: &str, expires_at: Option<i64>) -> FileRecord {
        FileRecord {
            id: id.into(),
            tenant: "t".into(),
            filename: "f".into(),
            purpose: "batch".into(),
            bytes: 1,
            created_at: 0,
            expires_at,
        }
    }

    fn batch(id: &str, input: &str, status: BatchStatus, ended: Option<i64>) -> BatchRecord {
        BatchRecord {
            id: id.into(),
            tenant: "t".into(),
            endpoint: "/v1/embeddings".into(),
            input_file_id: input.into(),
            completion_window: "24h".into(),
            metadata: None,
            output_expires_after: None,
            status,
            created_at: 0,
            expires_at: 86_400,
            in_progress_at: None,
            finalizing_at: None,
            completed_at: ended.filter(|_| status == BatchStatus::Completed),
            failed_at: ended.filter(|_| status == BatchStatus::Failed),
            expired_at: ended.filter(|_| status == BatchStatus::Expired),
            cancelling_at: None,
            cancelled_at: ended.filter(|_| status == BatchStatus::Cancelled),
            request_counts: Counts::default(),
            output_file_id: None,
            error_file_id: None,
            errors: Vec::new(),
            chunks: Vec::new(),
            failed_at_validation: 0,
            lease: None,
            traceparent: None,
        }
    }

    /// At 1,000 s with a 10 s grace and 1 day's retention: which files and
    /// batch records go.
    #[test]
    fn a_sweep_removes_what_expired_and_nothing_a_running_batch_reads() {
        use BatchStatus::*;
        let day = 86_400;
        let files = [
            file("kept-forever", None),
            file("not-yet", Some(1_500)),
            file("in-grace", Some(995)),
            file("expired", Some(900)),
            file("input-of-running", Some(900)),
            file("input-of-ended", Some(900)),
        ];
        let batches = [
            batch("running", "input-of-running", InProgress, None),
            batch("finalizing", "input-of-running", Finalizing, None),
            batch("ended", "input-of-ended", Completed, Some(500)),
        ];
        let sweep = plan(1_000, &files, &batches, 10, 1);
        assert_eq!(sweep.files, ["expired", "input-of-ended"]);
        assert!(sweep.batches.is_empty());
        // A day later the ended batch's record goes too; a running one never.
        let batches = [
            batch("running", "a", Validating, None),
            batch("completed", "b", Completed, Some(500)),
            batch("failed", "c", Failed, Some(500)),
            batch("cancelled", "d", Cancelled, Some(900)),
            batch("expired", "e", Expired, Some(2 * day)),
        ];
        let sweep = plan(500 + day, &[], &batches, 10, 1);
        assert_eq!(sweep.batches, ["completed", "failed"]);
        // Retention 0 keeps batch records (and files without a policy).
        assert!(plan(100 * day, &[], &batches, 10, 0).batches.is_empty());
    }
}
