//! A done job's output read back from S3: the batch driver's finalizing
//! and the online answers both read them here.

use anyhow::{Context, Result, bail};
use sluice_schemas::{Generation, LabelScore, S3Output, Task};

use crate::objects;
use crate::state::AppState;

/// A done job's output, read back: the vectors (row-major, `dim` wide),
/// the scores (one per pair), each text's labels or the generations; the
/// encoders' with each item's tokens when the job listed them.
pub enum Outputs {
    Vectors {
        dim: usize,
        values: Vec<f32>,
        tokens: Vec<u64>,
    },
    Scores {
        values: Vec<f32>,
        tokens: Vec<u64>,
    },
    Labels {
        values: Vec<Vec<LabelScore>>,
        tokens: Vec<u64>,
    },
    Generations(Vec<Generation>),
}

/// Whether `output` is where the consumers write job `job_id`'s outputs
/// (`--bucket`, `<--output-prefix><job id>.`): a status record or a result
/// that names any other object (written by whoever could write to NATS) is
/// never read or deleted.
pub fn is_job_output(state: &AppState, job_id: &str, output: &S3Output) -> bool {
    is_output_of(
        state.bucket(),
        &state.config.output_prefix,
        job_id,
        &output.bucket,
        &output.key,
    )
}

/// The rule of [`is_job_output`]: `bucket`/`key` is one of job `job_id`'s
/// output objects, `<prefix><job id>.<stream sequence>-<attempt>.<format>`
/// in `outputs_bucket`.
fn is_output_of(outputs_bucket: &str, prefix: &str, job_id: &str, bucket: &str, key: &str) -> bool {
    bucket == outputs_bucket
        && key
            .strip_prefix(prefix)
            .and_then(|rest| rest.strip_prefix(job_id))
            .and_then(|rest| rest.strip_prefix('.'))
            .is_some_and(|rest| !rest.is_empty() && !rest.contains('/'))
}

/// Reads job `job_id`'s output object from S3: `npy` vectors (shape
/// `[items, dim]`) or scores (`[items]`), or `jsonl` lines, each a text's
/// labels (`task` classify) or a generation.
pub async fn read_output(
    state: &AppState,
    job_id: &str,
    output: &S3Output,
    tokens: Vec<u64>,
    task: Task,
) -> Result<Outputs> {
    if !is_job_output(state, job_id, output) {
        bail!(
            "job {job_id}'s output names s3://{}/{}, which is not where the consumers write its \
             outputs (s3://{}/{}{job_id}.*); not read",
            output.bucket,
            output.key,
            state.bucket(),
            state.config.output_prefix
        );
    }
    let body = objects::read_all(&state.s3, &output.bucket, &output.key).await?;
    match output.format.as_str() {
        "npy" if output.shape.len() == 1 => {
            let (_, _, values) =
                sluice_schemas::npy::decode_f32(&body).map_err(anyhow::Error::msg)?;
            Ok(Outputs::Scores { values, tokens })
        }
        "npy" => {
            let (_, dim, values) =
                sluice_schemas::npy::decode_f32(&body).map_err(anyhow::Error::msg)?;
            Ok(Outputs::Vectors {
                dim,
                values,
                tokens,
            })
        }
        "jsonl" if task == Task::Classify => Ok(Outputs::Labels {
            values: jsonl_lines(&body).context("reading a text's labels")?,
            tokens,
        }),
        "jsonl" => Ok(Outputs::Generations(
            jsonl_lines(&body).context("reading a generation")?,
        )),
        other => bail!("unknown output format {other}"),
    }
}

fn jsonl_lines<T: serde::de::DeserializeOwned>(body: &[u8]) -> serde_json::Result<Vec<T>> {
    body.split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .map(serde_json::from_slice)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_jobs_own_output_objects_are_its_outputs() {
        let table = [
            ("sluice", "outputs/job-1.7-1.npy", true),
            ("sluice", "outputs/job-1.7-2.jsonl", true),
            // Another tenant's file, another job's output, another bucket.
            ("sluice", "gateway/files/file-0123", false),
            ("sluice", "outputs/job-10.7-1.npy", false),
            ("sluice", "outputs/job-2.7-1.npy", false),
            ("private", "outputs/job-1.7-1.npy", false),
            // Past the prefix by a path, or nothing after the id.
            ("sluice", "outputs/job-1./../gateway/files/x", false),
            ("sluice", "outputs/job-1.", false),
            ("sluice", "outputs/job-1", false),
            ("sluice", "other/outputs/job-1.7-1.npy", false),
        ];
        for (bucket, key, ok) in table {
            assert_eq!(
                is_output_of("sluice", "outputs/", "job-1", bucket, key),
                ok,
                "{bucket}/{key}"
            );
        }
    }
}
