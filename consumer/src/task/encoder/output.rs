//! The encoder tasks' numeric outputs: embed's vectors and rerank's
//! scores, inline when small, else one `.npy` in S3 (`[items, dim]`
//! vectors or `[items]` scores). classify's labels are JSON lines
//! (`OutputStore::put_lines`).

use sluice_schemas::{Output, OutputOptions, npy};

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

fn npy_object(body: Vec<u8>, shape: Vec<u64>) -> OutputObject {
    OutputObject {
        body,
        format: "npy",
        content_type: "application/octet-stream",
        shape,
    }
}
