//! The trait a task implements, and the one job it is handed to run.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

use opentelemetry::KeyValue;
use sluice_schemas::{Item, Job, Output, Task, Timings, Topology, Usage};

use crate::budget::{JobCost, Reservation};
use crate::error::JobError;
use crate::fetch::{FetchedItems, InputBody};
use crate::in_flight::InFlight;
use crate::output::OutputStore;
use crate::output::store::OutputOf;
use crate::telemetry::{JobTrace, Stats};

/// A task's end of the data path, as the pipeline drives it.
pub trait TaskEngine: Send + Sync {
    /// The task this process serves.
    fn task(&self) -> Task;

    /// Which forward (embed, rerank) or step (generate) runs the model.
    fn forward(&self) -> &'static str;

    /// Whether a job watches for a cancel while it runs (a task whose jobs
    /// run long); the pipeline then drops [`TaskEngine::run`]'s future on
    /// a cancel, which must free what the job holds.
    fn cancellable(&self) -> bool;

    /// Reads one of a job's inputs (`index`, in order) into `out`'s items,
    /// within `max_items`. By default as JSONL lines and inline entries of
    /// the task's item (`Item::from_value`); a task whose input is one
    /// binary object (an audio file, an image) reads its bytes here instead.
    fn read_input(
        &self,
        index: usize,
        input: InputBody<'_>,
        out: &mut FetchedItems,
        max_items: u64,
    ) -> Result<(), JobError> {
        crate::fetch::read_input(self.task(), index, input, out, max_items)
    }

    /// Runs one job's items: prepare them, shrink `job.reservation` to
    /// what they really cost, run the model, write the output; counts the
    /// units it serves to the job's tenant.
    fn run<'a>(&'a self, job: JobRun<'a>, items: Vec<Item>) -> Ran<'a>;
}

/// What [`TaskEngine::run`] returns: the output and its usage.
pub type Ran<'a> = Pin<Box<dyn Future<Output = Result<(Output, Usage), JobError>> + Send + 'a>>;

/// One job, and what a task's run of it uses of the consumer.
pub struct JobRun<'a> {
    pub job: &'a Job,
    /// The delivery (job, stream sequence, attempt): it names the job's
    /// output object.
    pub of: OutputOf<'a>,
    pub tenant: &'a str,
    /// The budget the job was admitted under (its worst case until run
    /// shrinks it).
    pub reservation: &'a mut Reservation,
    pub timings: &'a mut Timings,
    pub trace: &'a JobTrace,
    /// What every run shares of the consumer.
    pub cost: &'a JobCost,
    pub outputs: &'a OutputStore,
    pub in_flight: &'a InFlight,
    pub stats: &'a Arc<Stats>,
    /// For a streaming job's messages.
    pub nats: &'a async_nats::Client,
    /// The job's `Sluice-Reply-To`: its streamed text goes under it
    /// ([`Topology::stream_subject_of`]).
    pub reply_to: Option<&'a str>,
    pub topology: &'a Topology,
}

impl JobRun<'_> {
    /// Records the tokenize stage: `items` of `tokens`.
    pub fn tokenized(&mut self, started: Instant, items: u64, tokens: u64) {
        self.timings.tokenize = Some(started.elapsed().as_secs_f64() * 1e3);
        self.trace.stage_with(
            "tokenize",
            started,
            Instant::now(),
            vec![
                KeyValue::new("sluice.items", items as i64),
                KeyValue::new("sluice.tokens", tokens as i64),
            ],
        );
    }

    /// Records the write stage of `output`.
    pub fn written(&mut self, started: Instant, output: &Output) {
        self.timings.write = Some(started.elapsed().as_secs_f64() * 1e3);
        self.trace.stage_with(
            "write",
            started,
            Instant::now(),
            vec![KeyValue::new(
                "sluice.output",
                match output {
                    Output::S3(_) => "s3",
                    Output::Inline { .. } => "inline",
                },
            )],
        );
    }
}
