//! The gateway's facts in its KV bucket: `file.<id>` and `batch.<id>`
//! records, an `active.<id>` marker for each batch that is not final, and
//! each tenant's index of its own, `tenant.<tenant>.<kind>.<id>` (empty),
//! so a tenant's list reads its own records and no one else's. Every change
//! of a record is a compare-and-swap on its revision, so any number of
//! gateways can share the bucket.
//!
//! An index entry is written before its record and removed after it: a
//! record is never missing from its tenant's lists; an entry whose record
//! is gone (a crash between the two) is skipped by the lists and removed
//! by the sweeper, which also writes the entries of records older than the
//! index.

use anyhow::{Context, Result, bail};
use async_nats::jetstream::kv;
use futures::TryStreamExt;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

#[derive(Clone)]
pub struct Records {
    kv: kv::Store,
    /// For the inboxes of the ordered consumers that list a prefix.
    client: async_nats::Client,
}

impl Records {
    pub fn new(kv: kv::Store, client: async_nats::Client) -> Records {
        Records { kv, client }
    }

    pub async fn get<T: DeserializeOwned>(&self, key: &str) -> Result<Option<T>> {
        let entry = self
            .kv
            .entry(key)
            .await
            .with_context(|| format!("reading {key}"))?;
        match entry.filter(|e| e.operation == kv::Operation::Put) {
            Some(e) => Ok(Some(
                serde_json::from_slice(&e.value)
                    .with_context(|| format!("the record {key} is not valid"))?,
            )),
            None => Ok(None),
        }
    }

    /// Creates `key`; false when it already exists.
    pub async fn create<T: Serialize>(&self, key: &str, value: &T) -> Result<bool> {
        let payload = serde_json::to_vec(value)?;
        match self.kv.create(key, payload.into()).await {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == kv::CreateErrorKind::AlreadyExists => Ok(false),
            Err(e) => Err(e).with_context(|| format!("writing {key}")),
        }
    }

    pub async fn put<T: Serialize>(&self, key: &str, value: &T) -> Result<()> {
        let payload = serde_json::to_vec(value)?;
        self.kv
            .put(key, payload.into())
            .await
            .with_context(|| format!("writing {key}"))?;
        Ok(())
    }

    /// How long ago `key` was last written, if it is there.
    pub async fn age(&self, key: &str) -> Result<Option<std::time::Duration>> {
        let entry = self
            .kv
            .entry(key)
            .await
            .with_context(|| format!("reading {key}"))?;
        Ok(entry
            .filter(|e| e.operation == kv::Operation::Put)
            .map(|e| (time::OffsetDateTime::now_utc() - e.created).unsigned_abs()))
    }

    pub async fn delete(&self, key: &str) -> Result<()> {
        self.kv
            .delete(key)
            .await
            .with_context(|| format!("deleting {key}"))?;
        Ok(())
    }

    /// Compare-and-swap: `change` sees the current record and returns the
    /// next one, or None to leave it. Retried when another writer got in
    /// between. Returns the record written, or None when left (or absent).
    pub async fn update<T, F>(&self, key: &str, mut change: F) -> Result<Option<T>>
    where
        T: Serialize + DeserializeOwned,
        F: FnMut(&T) -> Option<T>,
    {
        for _ in 0..32 {
            let entry = self
                .kv
                .entry(key)
                .await
                .with_context(|| format!("reading {key}"))?;
            let Some(entry) = entry.filter(|e| e.operation == kv::Operation::Put) else {
                return Ok(None);
            };
            let current: T = serde_json::from_slice(&entry.value)
                .with_context(|| format!("the record {key} is not valid"))?;
            let Some(next) = change(&current) else {
                return Ok(None);
            };
            let payload = serde_json::to_vec(&next)?;
            match self.kv.update(key, payload.into(), entry.revision).await {
                Ok(_) => return Ok(Some(next)),
                Err(e) if e.kind() == kv::UpdateErrorKind::WrongLastRevision => continue,
                Err(e) => return Err(e).with_context(|| format!("writing {key}")),
            }
        }
        bail!("{key} is changed by others faster than this gateway can update it")
    }

    /// The ids under `prefix` (`file.`, `batch.`, `active.`), sorted.
    pub async fn ids(&self, prefix: &str) -> Result<Vec<String>> {
        let keys = match self.kv.keys().await {
            Ok(keys) => keys,
            Err(e) => return Err(e).context("listing the gateway bucket"),
        };
        let mut ids: Vec<String> = keys
            .try_filter_map(|k| async move { Ok(k.strip_prefix(prefix).map(str::to_string)) })
            .try_collect()
            .await
            .context("listing the gateway bucket")?;
        ids.sort();
        Ok(ids)
    }
}

/// A record that belongs to a tenant.
pub trait Owned: DeserializeOwned {
    /// What it is in its tenant's index: `file`, `batch`.
    const KIND: &'static str;
    fn key(id: &str) -> String;
    fn tenant(&self) -> &str;
}

/// `tenant`'s index entry of its `kind` record `id`.
pub fn index_key(tenant: &str, kind: &str, id: &str) -> String {
    format!("{}{id}", index_prefix(tenant, kind))
}

/// Where `tenant`'s index of its `kind` records is.
pub fn index_prefix(tenant: &str, kind: &str) -> String {
    format!("tenant.{tenant}.{kind}.")
}

impl Records {
    /// Writes `record`, `id` of its tenant, after its index entry.
    pub async fn put_owned<T: Owned + Serialize>(&self, id: &str, record: &T) -> Result<()> {
        self.index(record.tenant(), T::KIND, id).await?;
        self.put(&T::key(id), record).await
    }

    /// Writes `tenant`'s index entry of its `kind` record `id` (again: the
    /// same empty entry).
    pub async fn index(&self, tenant: &str, kind: &str, id: &str) -> Result<()> {
        self.put(&index_key(tenant, kind, id), &json!({})).await
    }

    /// Removes `tenant`'s record `id`, then its index entry.
    pub async fn delete_owned<T: Owned>(&self, tenant: &str, id: &str) -> Result<()> {
        self.delete(&T::key(id)).await?;
        self.delete(&index_key(tenant, T::KIND, id)).await
    }

    /// The ids in `tenant`'s index of its `T` records, sorted; some may
    /// name a record that is gone.
    pub async fn owned_ids<T: Owned>(&self, tenant: &str) -> Result<Vec<String>> {
        self.ids_under(&index_prefix(tenant, T::KIND)).await
    }

    /// The keys under `prefix` (without it), sorted: read by an ordered
    /// consumer filtered to the prefix, so a tenant's list reads its own
    /// keys, not the bucket's.
    async fn ids_under(&self, prefix: &str) -> Result<Vec<String>> {
        use async_nats::jetstream::consumer::{DeliverPolicy, ReplayPolicy, push};
        let filter = format!("{}{prefix}>", self.kv.prefix);
        let listing = || format!("listing {prefix}* in the gateway bucket");
        let consumer = self
            .kv
            .stream
            .create_consumer(push::OrderedConfig {
                deliver_subject: self.client.new_inbox(),
                filter_subject: filter,
                headers_only: true,
                replay_policy: ReplayPolicy::Instant,
                deliver_policy: DeliverPolicy::LastPerSubject,
                ..Default::default()
            })
            .await
            .with_context(listing)?;
        let mut ids = Vec::new();
        if consumer.cached_info().num_pending == 0 {
            return Ok(ids);
        }
        let mut messages = consumer.messages().await.with_context(listing)?;
        let key_start = self.kv.prefix.len() + prefix.len();
        while let Some(message) = messages.try_next().await.with_context(listing)? {
            let pending = message.info().map_err(anyhow::Error::msg)?.pending;
            let removed = message
                .headers
                .as_ref()
                .and_then(|h| h.get("KV-Operation"))
                .is_some_and(|op| op.as_str() == "DEL" || op.as_str() == "PURGE");
            if !removed && let Some(id) = message.subject.get(key_start..) {
                ids.push(id.to_string());
            }
            if pending == 0 {
                break;
            }
        }
        ids.sort();
        Ok(ids)
    }
}

impl Records {
    /// The record `id` when `tenant` owns it; None when absent or another's.
    pub async fn owned<T: Owned>(&self, tenant: &str, id: &str) -> Result<Option<T>> {
        if !is_record_id(id) {
            return Ok(None);
        }
        Ok(self
            .get::<T>(&T::key(id))
            .await?
            .filter(|r| r.tenant() == tenant))
    }
}

/// Whether `id` can name a file or a batch: the ids the gateway mints
/// (`file-<hex>`, `batch_<hex>`) are letters, digits, `_` and `-`. Anything
/// else (a `.`, `*` or `>` would reach the bucket as part of a key, or a
/// wildcard) names none, and is looked up as no record: the caller's 404.
pub fn is_record_id(id: &str) -> bool {
    (1..=128).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// One page of a list endpoint: `tenant`'s `T` records that `keep`
/// accepts, newest first (ids are time-ordered) unless `ascending`, from
/// after the id `after`, at most `limit`, in OpenAI's list shape. Read
/// from the tenant's index: another tenant's records are never read.
pub async fn page<T: Owned>(
    records: &Records,
    tenant: &str,
    after: Option<&str>,
    limit: usize,
    ascending: bool,
    keep: impl Fn(&T) -> bool,
    to_api: impl Fn(&T) -> Value,
) -> Result<Value> {
    let mut ids = records.owned_ids::<T>(tenant).await?;
    if !ascending {
        ids.reverse();
    }
    let start = match after {
        Some(cursor) => ids
            .iter()
            .position(|id| id == cursor)
            .map_or(ids.len(), |i| i + 1),
        None => 0,
    };
    let mut data = Vec::new();
    let mut has_more = false;
    for id in &ids[start..] {
        let Some(record) = records.get::<T>(&T::key(id)).await? else {
            continue;
        };
        if record.tenant() != tenant || !keep(&record) {
            continue;
        }
        if data.len() == limit {
            has_more = true;
            break;
        }
        data.push(to_api(&record));
    }
    let first = data.first().map(|v| v["id"].clone());
    let last = data.last().map(|v| v["id"].clone());
    Ok(
        json!({ "object": "list", "data": data, "first_id": first, "last_id": last, "has_more": has_more }),
    )
}

#[cfg(test)]
mod tests {
    use super::is_record_id;

    #[test]
    fn only_what_the_gateway_mints_can_be_an_id() {
        for id in [
            "file-0193a1b2c3d4e5f60718293a4b5c6d7e",
            "batch_0193a1b2c3d4e5f60718293a4b5c6d7e",
            "x",
        ] {
            assert!(is_record_id(id), "{id}");
        }
        let long = "f".repeat(129);
        for id in ["", "a.b", "a*b", "a>b", "file-x.*", " ", "é", long.as_str()] {
            assert!(!is_record_id(id), "{id:?}");
        }
    }
}
