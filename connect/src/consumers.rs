//! The live consumers (see `sluice_schemas::consumers`), read by the gateway
//! and `sluice watch`.

use anyhow::{Context, Result};
use async_nats::jetstream;
use futures::TryStreamExt;
use sluice_schemas::{LiveConsumer, Topology};

/// The consumers whose heartbeat is recent, by key; none when the
/// deployment has no consumers bucket (made by an older `sluice init`). A
/// record that does not parse is skipped: a reader must not fail because a
/// newer consumer writes more.
pub async fn live_consumers(
    js: &jetstream::Context,
    topology: &Topology,
) -> Result<Vec<LiveConsumer>> {
    let Ok(bucket) = js.get_key_value(&topology.consumers_bucket).await else {
        return Ok(Vec::new());
    };
    let what = || {
        format!(
            "cannot read the consumers bucket {}",
            topology.consumers_bucket
        )
    };
    let keys: Vec<String> = bucket
        .keys()
        .await
        .with_context(what)?
        .try_collect()
        .await
        .with_context(what)?;
    let now = time::OffsetDateTime::now_utc();
    let mut live = Vec::new();
    for key in keys {
        let Some(value) = bucket.get(&key).await.with_context(what)? else {
            continue;
        };
        if let Ok(c) = serde_json::from_slice::<LiveConsumer>(&value)
            && c.is_live(now)
        {
            live.push(c);
        }
    }
    Ok(live)
}
