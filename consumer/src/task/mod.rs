//! The one place that knows what a task is. Each task is a folder behind
//! [`TaskEngine`] (`engine`): how its items are prepared (tokens, and what they really
//! cost in the task's units), run and written. [`start`] is the registry
//! from the configured task to its start-up, which loads the model, sizes
//! and checks the budget, warms up and starts the thread that owns the
//! model. The pipeline, admission and the budget see only the trait, the
//! [`startup::Started`] it comes in and the task's [`ItemCost`] and
//! [`startup::Pacing`].
//!
//! `encoder` serves embed, rerank and classify (items of many jobs batched by token
//! sum for one executor thread); `generate` hands sequences to a
//! continuous-batching generation thread; `transcribe` hands recordings
//! to a thread that takes their 30 s windows in turn. `startup` holds what every
//! task's start-up shares; `placement` says where each part runs on the
//! configured device (logged at start-up).
//!
//! The engine is chosen by the task's [`Work`] (the row of
//! `sluice_schemas::task::SPECS`): a new task the encoder runs (a new head
//! over the same forward) is an arm in `encoder`; a new kind of work (audio
//! seconds, image patches) is a folder here with its start-up and a
//! `TaskEngine`, and one line in [`start`].
//!
//! [`ItemCost`]: crate::budget::ItemCost
//! [`TaskEngine`]: engine::TaskEngine

pub mod encoder;
pub mod engine;
pub mod generate;
pub mod placement;
pub mod startup;
pub mod transcribe;

use std::sync::Arc;

use sluice_schemas::Work;

use crate::config::Config;
use crate::telemetry::{Stats, Tracing};

/// The registry: loads the configured task's model, sizes and checks the
/// budget, warms up, and starts the thread that owns the model.
pub fn start(
    config: &Config,
    stats: &Arc<Stats>,
    tracing: &Tracing,
) -> anyhow::Result<startup::Started> {
    let started = match config.task().work() {
        Work::Encode => encoder::start(config, stats, tracing)?,
        Work::Generate => generate::start(config, stats)?,
        Work::Transcribe => transcribe::start(config)?,
    };
    let plan = placement::plan(config.task(), &config.model, config.generate.weights);
    placement::log(&started.device, &plan);
    Ok(started)
}
