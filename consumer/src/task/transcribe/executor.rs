//! The transcription thread: owns the Whisper model and runs the
//! recordings it holds as one [`Transcriptions`] (a window of each decoded
//! in the same decoder steps, a recording's next window encoded as its
//! last one ends), so a long recording does not hold a short one behind
//! it. A recording whose job went away (cancelled, past its deadline,
//! drained) is dropped before the next step.

use std::sync::Arc;

use sluice_models::whisper::Whisper;
use sluice_models::whisper::transcribe::{Options, Recording};
use sluice_models::whisper::transcriptions::{Failure, Transcribed, Transcriptions};
use sluice_schemas::ErrorCode;
use tokio::sync::{mpsc, oneshot};

use crate::error::JobError;

/// One recording on its way to the thread.
pub struct Request {
    pub recording: Recording,
    pub options: Options,
    pub reply: oneshot::Sender<Result<Transcribed, JobError>>,
}

pub fn spawn(
    whisper: Arc<Whisper>,
    mut requests: mpsc::Receiver<Request>,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name("sluice-transcriber".into())
        .spawn(move || {
            let mut active = Transcriptions::new(&whisper.model, &whisper.settings, &whisper.rules);
            loop {
                if active.is_empty() {
                    match requests.blocking_recv() {
                        Some(r) => active.add(r.reply, r.recording, r.options),
                        None => return,
                    }
                }
                while let Ok(r) = requests.try_recv() {
                    active.add(r.reply, r.recording, r.options);
                }
                active.retain(|reply| !reply.is_closed());
                for (reply, done) in active.step() {
                    let _ = reply.send(done.map_err(job_error));
                }
            }
        })
}

fn job_error(failure: Failure) -> JobError {
    match failure {
        Failure::Parameters(m) => JobError::new(ErrorCode::InvalidParameters, m),
        Failure::Model(e) => {
            JobError::new(ErrorCode::Internal, format!("transcription failed: {e}"))
        }
    }
}
