//! Submit one embedding job from a Rust service and wait for its result.
//!
//! ```sh
//! NATS_URL=nats://127.0.0.1:4222 AWS_ENDPOINT_URL=http://127.0.0.1:8333 \
//!   cargo run -p sluice-producer --example submit -- "first text" "second text"
//! ```
//!
//! Reads the same environment as the `sluice` CLI: NATS_URL, SLUICE_NAMESPACE,
//! SLUICE_BUCKET, AWS_ENDPOINT_URL, AWS_REGION and the standard AWS credentials.

use std::time::Duration;

use anyhow::{Context, Result, bail};
use sluice_producer::{Producer, ProducerConfig};
use sluice_schemas::{Outcome, Output};

#[tokio::main]
async fn main() -> Result<()> {
    let texts: Vec<String> = std::env::args().skip(1).collect();
    if texts.is_empty() {
        bail!("give the texts to embed as arguments");
    }
    let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    let defaults = ProducerConfig::default();
    let mut deployment = defaults.deployment.clone();
    deployment.nats_url = var("NATS_URL").unwrap_or(deployment.nats_url);
    deployment.namespace = var("SLUICE_NAMESPACE").unwrap_or_default();
    deployment.s3.s3_endpoint = var("AWS_ENDPOINT_URL");
    deployment.s3.s3_region = var("AWS_REGION").unwrap_or(deployment.s3.s3_region);
    let config = ProducerConfig {
        deployment,
        bucket: var("SLUICE_BUCKET").unwrap_or(defaults.bucket.clone()),
        ..defaults
    };
    let producer = Producer::connect(&config).await?;

    // Subscribe first: results are plain NATS messages.
    let mut results = producer.subscribe_results().await?;
    let jsonl: String = texts
        .iter()
        .map(|t| serde_json::to_string(t).map(|line| line + "\n"))
        .collect::<Result<_, _>>()?;
    let id = format!("rust-example-{}", uuid::Uuid::now_v7());
    let job = producer
        .embed_job_from_jsonl(&id, jsonl.into_bytes())
        .await?;
    let ack = producer.submit(&job).await?;
    eprintln!("submitted {id} (stream sequence {})", ack.sequence);

    let result = tokio::time::timeout(Duration::from_secs(120), async {
        loop {
            let r = results.next_result().await?;
            if r.job_id.as_deref() == Some(id.as_str()) {
                return anyhow::Ok(r);
            }
        }
    })
    .await
    .context("no result within 120 s")??;
    match result.outcome {
        Outcome::Ok {
            output: Output::S3(o),
        } => println!("{id}: s3://{}/{} shape {:?}", o.bucket, o.key, o.shape),
        Outcome::Ok {
            output: Output::Inline { embeddings, .. },
        } => println!("{id}: {} inline vectors", embeddings.len()),
        Outcome::Error { error } => bail!("{id}: {} {}", error.code, error.message),
    }
    Ok(())
}
