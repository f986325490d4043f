//! The OpenAI-compatible API's requests and answers, mapped to and from
//! sluice's job items, one file per endpoint. Pure: no I/O (the handlers
//! are `online.rs`, `files.rs` and `batches.rs`; the batch driver,
//! `driver/`).
//!
//! - `request.rs`: the endpoints, a request that can run, and the two ways
//!   one fails.
//! - `answer.rs`: a request's answer from its share of its job's output,
//!   the one `match` of endpoint against output.
//! - `lines.rs`: a batch line read and dispatched to its endpoint's reader
//!   (also the online requests' entry, `parse_request`), and the output and
//!   error files' lines.
//! - `embeddings.rs`, `chat.rs`, `completions.rs`, `rerank.rs`,
//!   `classify.rs`, `responses.rs`: each endpoint's body as job items, and its answer;
//!   `transcriptions.rs` the audio endpoints' form fields and answers;
//!   `sampling.rs` the generate endpoints' shared parameters,
//!   `generation.rs` their answers and stream chunks, `logprobs.rs` token
//!   logprobs in each of their shapes.
//!
//! A line that is not a request at all (not JSON, no `custom_id`, a
//! `custom_id` seen before, a method other than POST, a `url` the gateway
//! does not serve) fails the batch's validation with its line number, as
//! OpenAI's does. A request that is well-formed but cannot run (an unknown
//! model, a bad body, too large) fails alone: it gets a line in the error file.

mod answer;
mod chat;
mod classify;
mod completions;
mod embeddings;
mod generation;
mod lines;
pub mod logprobs;
mod request;
mod rerank;
pub mod responses;
mod sampling;
#[cfg(test)]
mod tests;
pub mod transcriptions;

pub use answer::{Share, answer_body, read_lines};
pub use embeddings::unit_vectors;
pub use generation::{Delta, generation_body, stream_chunk, usage_chunk};
pub use lines::{http_status, output_line, parse_request, read_line, unrun_line};
pub use request::{Endpoint, Line, LineError, Ranking, Request, RequestError};
