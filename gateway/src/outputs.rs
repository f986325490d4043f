//! A done job's output read back from S3: the batch driver's finalizing
//! and the online answers both read them here.

use anyhow::{Context, Result, bail};
use sluice_schemas::{Generation, S3Output};

use crate::objects;
use crate::state::AppState;

/// A done job's output, read back: the vectors (row-major, `dim` wide),
/// the scores (one per pair) or the generations; the encoders' with each
/// item's tokens when the job listed them.
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
    Generations(Vec<Generation>),
}

/// Reads an output object from S3: `npy` vectors (shape `[items, dim]`)
/// or scores (`[items]`), or `jsonl` generations.
pub async fn read_output(state: &AppState, output: &S3Output, tokens: Vec<u64>) -> Result<Outputs> {
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
        "jsonl" => Ok(Outputs::Generations(
            body.split(|b| *b == b'\n')
                .filter(|l| !l.is_empty())
                .map(serde_json::from_slice)
                .collect::<Result<_, _>>()
                .context("reading a generation")?,
        )),
        other => bail!("unknown output format {other}"),
    }
}
