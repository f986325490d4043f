//! Each tenant's storage, bounded: the bytes of the files it uploaded and
//! still holds (not expired, not deleted) may not pass
//! `--max-tenant-file-bytes`. An upload gets the room its tenant has left
//! (at most `--max-file-bytes`) and is cut off, its parts removed, at the
//! byte that would pass it.
//!
//! The usage is read from the tenant's file records (through its index,
//! so no other tenant's are read) when the upload starts, so two uploads of one tenant at once may each take the room
//! both saw: the quota can be passed by at most one room per upload in
//! flight. The batches' output and error files (written by the gateway,
//! bounded by their input) do not count.

use crate::api_error::ApiError;
use crate::file_record::FileRecord;
use crate::state::{AppState, now};

/// The purpose of the files a tenant uploads (and that count).
pub const UPLOADED: &str = "batch";

/// How many bytes one upload may store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Room {
    pub bytes: u64,
    /// What holds the upload to `bytes`: the tenant's quota (`Some(used)`),
    /// or the file limit.
    pub used: Option<u64>,
}

impl Room {
    /// The room one upload has: the file limit, or what the quota leaves
    /// when that is less (`quota` 0: no quota).
    pub fn of(max_file_bytes: u64, quota: u64, used: u64) -> Room {
        if quota == 0 || quota.saturating_sub(used) >= max_file_bytes {
            return Room {
                bytes: max_file_bytes,
                used: None,
            };
        }
        Room {
            bytes: quota.saturating_sub(used),
            used: Some(used),
        }
    }

    /// The answer to an upload that does not fit.
    pub fn refusal(&self, max_file_bytes: u64, quota: u64) -> ApiError {
        match self.used {
            None => ApiError::too_large(format!(
                "the file is larger than the limit of {max_file_bytes} bytes"
            ))
            .param("file"),
            Some(used) => ApiError::too_large(format!(
                "the file does not fit in this organization's storage: its files hold {used} of \
                 {quota} bytes (--max-tenant-file-bytes); delete files (DELETE /v1/files/{{id}}) \
                 or let them expire, then upload again"
            ))
            .code("storage_quota_exceeded")
            .param("file"),
        }
    }
}

/// The room `tenant`'s next upload has.
pub async fn room(state: &AppState, tenant: &str) -> Result<Room, ApiError> {
    let quota = state.config.max_tenant_file_bytes;
    let used = if quota == 0 {
        0
    } else {
        used(state, tenant).await?
    };
    Ok(Room::of(state.config.max_file_bytes, quota, used))
}

/// The bytes of the files `tenant` uploaded and still holds.
async fn used(state: &AppState, tenant: &str) -> Result<u64, ApiError> {
    let at = now();
    let mut used = 0u64;
    for id in state.records.owned_ids::<FileRecord>(tenant).await? {
        let Some(file) = state
            .records
            .get::<FileRecord>(&FileRecord::key(&id))
            .await?
        else {
            continue;
        };
        if file.tenant == tenant && file.purpose == UPLOADED && !file.expired(at) {
            used = used.saturating_add(file.bytes);
        }
    }
    Ok(used)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The room is the file limit until the quota leaves less; no quota is
    /// the file limit always.
    #[test]
    fn an_upload_has_the_file_limit_or_what_the_quota_leaves() {
        let table = [
            // (max file, quota, used) -> (room, held by the quota)
            ((100, 0, 5_000), (100, None)),
            ((100, 1_000, 0), (100, None)),
            ((100, 1_000, 900), (100, None)),
            ((100, 1_000, 901), (99, Some(901))),
            ((100, 1_000, 1_000), (0, Some(1_000))),
            ((100, 1_000, 1_500), (0, Some(1_500))),
        ];
        for ((max, quota, used), (bytes, by)) in table {
            assert_eq!(
                Room::of(max, quota, used),
                Room { bytes, used: by },
                "max {max}, quota {quota}, used {used}"
            );
        }
    }
}
