//! The task-specific end of the data path, one folder per task, each in
//! the same two steps: prepare a job's items (tokens, and the memory they
//! really cost) and run them (the payload, and the stage times). `encoder`
//! (the embed and rerank tasks) batches items of many jobs by token sum
//! for one executor thread; `generate` hands sequences to a
//! continuous-batching generation thread.
//! `startup` holds what both tasks' start-up shares; `placement` says where
//! each part runs on the configured device (logged at start-up).

pub mod encoder;
pub mod generate;
pub mod placement;
pub mod startup;

use std::sync::Arc;

use sluice_schemas::Task;

use crate::config::Config;
use crate::telemetry::{Stats, Tracing};

/// The task-specific end of the data path.
pub enum Engine {
    /// embed or rerank.
    Encoder(encoder::EncoderEngine),
    Generate(generate::GenerateEngine),
}

impl Engine {
    /// The task this process serves.
    pub fn task(&self) -> Task {
        match self {
            Engine::Encoder(e) => e.inputs.task(),
            Engine::Generate(_) => Task::Generate,
        }
    }

    /// Which forward (embed, rerank) or step (generate) runs the model.
    pub fn forward(&self) -> &'static str {
        match self {
            Engine::Encoder(e) => e.forward,
            Engine::Generate(g) => g.forward,
        }
    }
}

/// Loads the task's model, sizes and checks the budget, warms up, and
/// starts the thread that owns the model.
pub fn start(
    config: &Config,
    stats: &Arc<Stats>,
    tracing: &Tracing,
) -> anyhow::Result<startup::Started<Engine>> {
    let started = match config.task() {
        Task::Embed | Task::Rerank => {
            encoder::start(config, stats, tracing)?.map_engine(Engine::Encoder)
        }
        Task::Generate => generate::start(config, stats)?.map_engine(Engine::Generate),
    };
    let plan = placement::plan(config.task(), &config.model, config.generate.weights);
    placement::log(&started.device, &plan);
    Ok(started)
}
