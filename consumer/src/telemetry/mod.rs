//! What the consumer tells operators: counters and histograms (`stats`,
//! served on `/metrics` by `crate::http`), the same pushed over OTLP
//! (`otlp`), and traces (`trace`: one span per job and its stages, one per
//! batch linked to its jobs).

pub mod otlp;
pub mod stats;
pub mod trace;

pub use stats::{BatchFigures, Readings, RecycleReason, Stats};
pub use trace::{JobTrace, OtlpProtocol, Tracing};
