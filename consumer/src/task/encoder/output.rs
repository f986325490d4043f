//! The encoder tasks' outputs: embed's vectors, rerank's scores and
//! classify's labels, inline when small, else one object in S3 (`.npy` of
//! `[items, dim]` vectors or `[items]` scores; JSONL of each text's labels).

use sluice_schemas::{LabelScore, Output, OutputOptions, npy};

use crate::error::JobError;
use crate::output::OutputStore;
use crate::output::store::{OutputObject, OutputOf};

/// Puts the vectors inline when small (unless the job asked for S3), else
/// into S3 as `.npy`.
pub async fn store_embeddings(
    store: &OutputStore,
    of: OutputOf<'_>,
    vectors: Vec<Vec<f32>>,
    dim: usize,
    options: &OutputOptions,
) -> Result<Output, JobError> {
    if store.fits_inline((vectors.len() * dim * 4) as u64, options) {
        return Ok(Output::embeddings(vectors));
    }
    let rows = vectors.len() as u64;
    let body = npy::encode_f32(&vectors, dim);
    drop(vectors);
    store
        .put(of, npy_object(body, vec![rows, dim as u64]), options)
        .await
}

/// Puts the scores inline when small (unless the job asked for S3), else
/// into S3 as `.npy` of shape `[items]`.
pub async fn store_scores(
    store: &OutputStore,
    of: OutputOf<'_>,
    scores: Vec<f32>,
    options: &OutputOptions,
) -> Result<Output, JobError> {
    if store.fits_inline((scores.len() * 4) as u64, options) {
        return Ok(Output::scores(scores));
    }
    let items = scores.len() as u64;
    let body = npy::encode_f32_vector(&scores);
    drop(scores);
    store.put(of, npy_object(body, vec![items]), options).await
}

/// Puts each text's labels inline when their JSON is small (unless the job
/// asked for S3), else into S3 as JSONL, one text's labels per line.
pub async fn store_classifications(
    store: &OutputStore,
    of: OutputOf<'_>,
    classifications: Vec<Vec<LabelScore>>,
    options: &OutputOptions,
) -> Result<Output, JobError> {
    let object = OutputObject::jsonl(&classifications, "a text's labels")?;
    if store.fits_inline(object.body.len() as u64, options) {
        return Ok(Output::classifications(classifications));
    }
    drop(classifications);
    store.put(of, object, options).await
}

fn npy_object(body: Vec<u8>, shape: Vec<u64>) -> OutputObject {
    OutputObject {
        body,
        format: "npy",
        content_type: "application/octet-stream",
        shape,
    }
}
