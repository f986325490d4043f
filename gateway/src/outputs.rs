//! A done job's output read back from S3: the batch driver's finalizing
//! and the online answers both read them here.

use anyhow::{Context, Result, bail};
use serde_json::Value;
use sluice_schemas::{InlineItems, S3Output};

use crate::objects;
use crate::openai::Share;
use crate::state::AppState;

/// A done job's output, read back, whichever its task: the vectors
/// (row-major, `dim` wide), the scores (one per item) or one JSON line per
/// item (a generation, a text's labels); the encoders' with each item's
/// tokens when the job listed them.
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
    Lines {
        values: Vec<Value>,
        tokens: Vec<u64>,
    },
}

impl Outputs {
    /// An inline output (read from the result itself).
    pub fn inline(items: InlineItems) -> Outputs {
        let tokens = Vec::new();
        match items {
            InlineItems::Vectors(rows) => Outputs::Vectors {
                dim: rows.first().map_or(0, Vec::len),
                values: rows.concat(),
                tokens,
            },
            InlineItems::Scores(values) => Outputs::Scores { values, tokens },
            InlineItems::Lines(values) => Outputs::Lines { values, tokens },
        }
    }

    /// Every item's output.
    pub fn all(&self) -> Share<'_> {
        match self {
            Outputs::Vectors { dim, values, .. } => Share::Vectors { dim: *dim, values },
            Outputs::Scores { values, .. } => Share::Scores(values),
            Outputs::Lines { values, .. } => Share::Lines(values),
        }
    }

    /// Items `first..first + n`'s outputs and the tokens they used (0 when
    /// the job did not list them); an error when the output has fewer items.
    pub fn share(&self, first: usize, n: usize) -> Result<(Share<'_>, u64)> {
        let short = || anyhow::anyhow!("the job's output has fewer items than its requests");
        let used = |tokens: &[u64]| tokens.get(first..first + n).map_or(0, |t| t.iter().sum());
        Ok(match self {
            Outputs::Vectors {
                dim,
                values,
                tokens,
            } => (
                Share::Vectors {
                    dim: *dim,
                    values: values
                        .get(first * dim..(first + n) * dim)
                        .ok_or_else(short)?,
                },
                used(tokens),
            ),
            Outputs::Scores { values, tokens } => (
                Share::Scores(values.get(first..first + n).ok_or_else(short)?),
                used(tokens),
            ),
            Outputs::Lines { values, tokens } => (
                Share::Lines(values.get(first..first + n).ok_or_else(short)?),
                used(tokens),
            ),
        })
    }
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
/// `[items, dim]`) or scores (`[items]`), or `jsonl` lines.
pub async fn read_output(
    state: &AppState,
    job_id: &str,
    output: &S3Output,
    tokens: Vec<u64>,
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
        "jsonl" => Ok(Outputs::Lines {
            values: jsonl_lines(&body).context("reading the output's lines")?,
            tokens,
        }),
        other => bail!("unknown output format {other}"),
    }
}

fn jsonl_lines(body: &[u8]) -> serde_json::Result<Vec<Value>> {
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
