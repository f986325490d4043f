//! The deployed models as `sluice init` recorded them (the topology's models
//! bucket, one record per task and model; see `sluice_schemas::models`),
//! read the same way by the consumer, the CLI and the gateway.

use anyhow::{Context, Result};
use async_nats::jetstream::{self, kv};
use futures::TryStreamExt;
use sluice_schemas::{DeployedModel, DeployedModels, Topology};

/// Every record of the models bucket; `None` when the deployment has no
/// bucket (made by an `init` from before models were routed: every job goes
/// to its task's plain subjects).
pub async fn deployed_models(
    js: &jetstream::Context,
    topology: &Topology,
) -> Result<Option<DeployedModels>> {
    let Ok(bucket) = js.get_key_value(&topology.models_bucket).await else {
        return Ok(None);
    };
    Ok(Some(DeployedModels::new(
        records(&bucket)
            .await
            .with_context(|| format!("cannot read the models bucket {}", topology.models_bucket))?,
    )))
}

/// The records in `bucket`; one that does not parse is an error naming its
/// key (a bucket written by hand, or by a newer sluice).
pub async fn records(bucket: &kv::Store) -> Result<Vec<DeployedModel>> {
    let keys: Vec<String> = bucket.keys().await?.try_collect().await?;
    let mut models = Vec::new();
    for key in keys {
        let Some(value) = bucket.get(&key).await? else {
            continue;
        };
        models.push(
            serde_json::from_slice(&value)
                .with_context(|| format!("the record {key} is not a deployed model"))?,
        );
    }
    Ok(models)
}
