//! The generate task's output: the generations inline when their JSON is
//! small, else JSONL in S3 (one generation object per line, in item order).

use sluice_schemas::{Generation, Output, OutputOptions};

use crate::error::JobError;
use crate::output::OutputStore;
use crate::output::store::{OutputObject, OutputOf};

/// Puts the generations inline when their JSON is small (unless the job
/// asked for S3), else into S3 as JSONL.
pub async fn store_generations(
    store: &OutputStore,
    of: OutputOf<'_>,
    generations: Vec<Generation>,
    options: &OutputOptions,
) -> Result<Output, JobError> {
    let object = OutputObject::jsonl(&generations, "a generation")?;
    if store.fits_inline(object.body.len() as u64, options) {
        return Ok(Output::generations(generations));
    }
    drop(generations);
    store.put(of, object, options).await
}
