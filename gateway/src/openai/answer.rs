//! A request's answer from its share of its job's output, whichever the
//! endpoint: the one place that says which output each endpoint reads
//! (the online handler and the batch driver both answer through
//! [`answer_body`], naming no endpoint).

use serde::de::DeserializeOwned;
use serde_json::Value;
use sluice_schemas::{Generation, LabelScore};

use super::request::{Endpoint, Request};
use super::{classify, embeddings, generation, rerank, transcriptions};

/// One request's share of its job's output, its items' rows in order: as
/// the consumer wrote them (`npy` vectors or scores, `jsonl` lines).
#[derive(Debug, Clone, Copy)]
pub enum Share<'a> {
    /// Row-major vectors, `dim` wide.
    Vectors {
        dim: usize,
        values: &'a [f32],
    },
    Scores(&'a [f32]),
    /// One JSON value per item (a generation, a text's labels).
    Lines(&'a [Value]),
}

impl Share<'_> {
    fn kind(&self) -> &'static str {
        match self {
            Share::Vectors { .. } => "vectors",
            Share::Scores(_) => "scores",
            Share::Lines(_) => "JSON lines",
        }
    }
}

/// The response body of `request` (job `id`'s, serving `model`, answered
/// at `created`) from its share of the job's output; `tokens`: the input
/// tokens it used (the encoder endpoints' usage; a generation carries its
/// own). An output that is not what the endpoint answers with is an error.
pub fn answer_body(
    request: &Request,
    id: &str,
    model: &str,
    created: i64,
    share: Share<'_>,
    tokens: u64,
) -> Result<Value, String> {
    match (request.endpoint, share) {
        (Endpoint::Embeddings, Share::Vectors { dim, values }) => {
            let rows: Vec<&[f32]> = values.chunks(dim.max(1)).collect();
            Ok(embeddings::embeddings_body(
                model,
                &rows,
                tokens,
                request.base64,
            ))
        }
        (Endpoint::Rerank, Share::Scores(scores)) => {
            Ok(rerank::rerank_body(id, model, request, scores, tokens))
        }
        (Endpoint::Classify, Share::Lines(lines)) => {
            let labels: Vec<Vec<LabelScore>> = read_lines(lines, "a text's labels")?;
            Ok(classify::classify_body(id, model, created, &labels, tokens))
        }
        (
            Endpoint::ChatCompletions | Endpoint::Completions | Endpoint::Responses,
            Share::Lines(lines),
        ) => {
            let generations: Vec<Generation> = read_lines(lines, "a generation")?;
            Ok(generation::generation_body(
                request,
                id,
                created,
                model,
                &generations,
            ))
        }
        (Endpoint::AudioTranscriptions | Endpoint::AudioTranslations, Share::Lines(lines)) => {
            let [transcript]: [sluice_schemas::Transcript; 1] = read_lines(lines, "a transcript")?
                .try_into()
                .map_err(|t: Vec<_>| format!("{} transcripts for one recording", t.len()))?;
            let answering = request.audio.unwrap_or_default();
            Ok(
                match transcriptions::answer(&transcript, answering.format, answering.translate) {
                    transcriptions::Answer::Json(body) => body,
                    // A batch line's body is JSON: the text as a string.
                    transcriptions::Answer::Text { body, .. } => Value::String(body),
                },
            )
        }
        (endpoint, share) => Err(format!(
            "the job's output is {}, which {} does not answer with",
            share.kind(),
            endpoint.as_str()
        )),
    }
}

/// Each line as a `T`; `what` names one in the error.
pub fn read_lines<T: DeserializeOwned>(lines: &[Value], what: &str) -> Result<Vec<T>, String> {
    lines
        .iter()
        .map(|l| T::deserialize(l).map_err(|e| format!("reading {what}: {e}")))
        .collect()
}
