//! The transcription thread: owns the Whisper model and takes the windows
//! of the recordings it holds in turn (one window of each, then the next
//! of each), so a long recording does not hold a short one behind it. A
//! recording whose job went away (cancelled, past its deadline, drained)
//! is dropped before its next window.

use std::sync::Arc;

use sluice_models::audio::features::WINDOW_FRAMES;
use sluice_models::whisper::Whisper;
use sluice_models::whisper::transcribe::{
    Options, Recording, Segment, decode_window, detect_language, timestamp_prompt,
};
use sluice_schemas::ErrorCode;
use tokio::sync::{mpsc, oneshot};

use crate::error::JobError;

/// One recording on its way to the thread.
pub struct Request {
    pub recording: Recording,
    pub options: Options,
    pub reply: oneshot::Sender<Result<Transcribed, JobError>>,
}

/// A recording's transcript, as the model gave it.
#[derive(Debug)]
pub struct Transcribed {
    /// Given, detected, or none (an English-only model).
    pub language: Option<String>,
    pub segments: Vec<Segment>,
    /// Windows decoded.
    pub windows: u64,
}

/// A recording between its windows.
struct Active {
    recording: Recording,
    options: Options,
    /// The forced prompt, once its first window told the language.
    prompt: Option<Vec<u32>>,
    language: Option<String>,
    windows: u64,
    reply: oneshot::Sender<Result<Transcribed, JobError>>,
}

pub fn spawn(
    whisper: Arc<Whisper>,
    mut requests: mpsc::Receiver<Request>,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name("sluice-transcriber".into())
        .spawn(move || {
            let mut active: Vec<Active> = Vec::new();
            loop {
                if active.is_empty() {
                    match requests.blocking_recv() {
                        Some(r) => active.push(Active::new(r)),
                        None => return,
                    }
                }
                while let Ok(r) = requests.try_recv() {
                    active.push(Active::new(r));
                }
                // One window of each recording, in arrival order.
                let mut still = Vec::with_capacity(active.len());
                for mut a in active.drain(..) {
                    if a.reply.is_closed() {
                        continue;
                    }
                    match a.step(&whisper) {
                        Ok(true) => {
                            let Active {
                                recording,
                                language,
                                windows,
                                reply,
                                ..
                            } = a;
                            let _ = reply.send(Ok(Transcribed {
                                language,
                                segments: recording.into_segments(),
                                windows,
                            }));
                        }
                        Ok(false) => still.push(a),
                        Err(e) => {
                            let _ = a.reply.send(Err(e));
                        }
                    }
                }
                active = still;
            }
        })
}

impl Active {
    fn new(r: Request) -> Active {
        Active {
            language: r.options.language.clone(),
            recording: r.recording,
            options: r.options,
            prompt: None,
            windows: 0,
            reply: r.reply,
        }
    }

    /// Decodes the next window; true once the recording is done.
    fn step(&mut self, whisper: &Whisper) -> Result<bool, JobError> {
        let failed = |e: sluice_models::ModelError| {
            JobError::new(ErrorCode::Internal, format!("transcription failed: {e}"))
        };
        let Some(window) = self.recording.next_window() else {
            return Ok(true);
        };
        let audio = whisper
            .model
            .encode(&window.features, WINDOW_FRAMES)
            .map_err(failed)?;
        let prompt = match &self.prompt {
            Some(p) => p.clone(),
            None => {
                if whisper.is_multilingual() && self.language.is_none() {
                    self.language = Some(
                        detect_language(&whisper.model, &whisper.settings, &audio)
                            .map_err(failed)?,
                    );
                }
                let p = timestamp_prompt(
                    &whisper.settings,
                    self.language.as_deref(),
                    self.options.task,
                )
                .map_err(|m| JobError::new(ErrorCode::InvalidParameters, m))?;
                self.prompt = Some(p.clone());
                p
            }
        };
        let decoded = decode_window(
            &whisper.model,
            &whisper.settings,
            &whisper.rules,
            &audio,
            &prompt,
            self.options.max_new_tokens,
        )
        .map_err(failed)?;
        self.recording.accept(&window, &decoded, &whisper.rules);
        self.windows += 1;
        Ok(self.recording.is_done())
    }
}
