//! The gateway's facts in its KV bucket: `file.<id>` and `batch.<id>`
//! records, and an `active.<id>` marker for each batch that is not final.
//! Every change is a compare-and-swap on the record's revision, so any
//! number of gateways can share the bucket.

use anyhow::{Context, Result, bail};
use async_nats::jetstream::kv;
use futures::TryStreamExt;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

#[derive(Clone)]
pub struct Records {
    kv: kv::Store,
}

impl Records {
    pub fn new(kv: kv::Store) -> Records {
        Records { kv }
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
    fn key(id: &str) -> String;
    fn tenant(&self) -> &str;
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

/// One page of a list endpoint: the records under `prefix` that `keep`
/// accepts, newest first (ids are time-ordered) unless `ascending`, from
/// after the id `after`, at most `limit`, in OpenAI's list shape.
pub async fn page<T: DeserializeOwned>(
    records: &Records,
    prefix: &str,
    after: Option<&str>,
    limit: usize,
    ascending: bool,
    keep: impl Fn(&T) -> bool,
    to_api: impl Fn(&T) -> Value,
) -> Result<Value> {
    let mut ids = records.ids(prefix).await?;
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
        let Some(record) = records.get::<T>(&format!("{prefix}{id}")).await? else {
            continue;
        };
        if !keep(&record) {
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
