//! The transcribe task's output: the transcripts inline when their JSON is
//! small, else JSONL in S3 (one transcript per line, in item order).

use sluice_schemas::{Output, OutputOptions, Transcript};

use crate::error::JobError;
use crate::output::OutputStore;
use crate::output::store::{OutputObject, OutputOf};

/// Puts the transcripts inline when small (unless the job asked for S3),
/// else into S3 as JSONL.
pub async fn store_transcripts(
    store: &OutputStore,
    of: OutputOf<'_>,
    transcripts: Vec<Transcript>,
    options: &OutputOptions,
) -> Result<Output, JobError> {
    let object = OutputObject::jsonl(&transcripts, "a transcript")?;
    if store.fits_inline(object.body.len() as u64, options) {
        return Ok(Output::transcripts(transcripts));
    }
    drop(transcripts);
    store.put(of, object, options).await
}
