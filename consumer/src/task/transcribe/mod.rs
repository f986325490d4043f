//! The transcribe task's engine: Whisper on recordings. A job's items are
//! audio files (a URL input of format `audio`, or inline base64); prepare
//! decodes each on the blocking pool (symphonia, resampled to 16 kHz mono;
//! an unreadable file is `input_invalid` naming what it saw), computes its
//! features and shrinks the reservation to its real length; run hands the
//! recordings to the transcription thread (`executor`), which decodes
//! their 30 s windows alongside other jobs', and turns each one's segments
//! into a
//! [`Transcript`]; `output` writes them.

mod executor;
mod job;

use std::sync::Arc;

use anyhow::{Context, bail};
use sluice_models::audio::{AudioError, decode_bytes};
use sluice_models::whisper::transcribe::{Options, Recording};
use sluice_models::whisper::{Whisper, WhisperTask};
use sluice_schemas::{ErrorCode, Transcript, TranscriptSegment};
use tokio::sync::{mpsc, oneshot};

use super::startup::{Pacing, Started, budget_limit};
use crate::budget::{Budget, ItemCost, JobCost};
use crate::config::{Config, DeviceKind};
use crate::error::JobError;

/// Bytes an audio second holds while its job runs: its 16,000 samples
/// (f32), its features (100 frames of `n_mels`, f32) and a KiB of
/// transcript.
fn bytes_per_second(n_mels: u64) -> u64 {
    4 * 16_000 + 4 * 100 * n_mels + 1024
}

/// transcribe: the model's files, and the thread that runs it.
pub struct TranscribeEngine {
    whisper: Arc<Whisper>,
    executor: mpsc::Sender<executor::Request>,
    max_audio_seconds: f64,
}

/// Loads the Whisper directory, sizes and checks the budget, warms up and
/// starts the transcription thread.
pub fn start(config: &Config) -> anyhow::Result<Started> {
    if config.model.device == DeviceKind::Cuda {
        bail!(
            "the transcribe task runs on the CPU only for now: start it without --device cuda (SLUICE_DEVICE)"
        );
    }
    let dir = config.model.dir(config.task());
    if !dir.join("model.safetensors").is_file() {
        bail!(
            "no model at {}: run ./scripts/setup (it converts Whisper tiny.en into weights/whisper-tiny-en), or set --model-dir to a Whisper directory as transformers saves it",
            dir.display()
        );
    }
    let whisper = Arc::new(
        Whisper::load(&dir)
            .with_context(|| format!("cannot load the Whisper model at {}", dir.display()))?,
    );
    let device = candle_core::Device::Cpu;
    let limit = budget_limit(config, &device)?;
    let activation = whisper.model.window_activation_bytes();
    let n_mels = whisper.model.config.num_mel_bins as u64;
    let cost = JobCost {
        max_input_bytes: config.max_input_bytes(),
        max_items: config.max_items_per_job(),
        per_item: ItemCost {
            max_units: config.max_audio_seconds,
            units_beyond_bytes: None,
            bytes_per_unit: bytes_per_second(n_mels),
            // Its window's decoding state, held while the window is decoded
            // in the same steps as the other recordings'.
            bytes_per_item: 4096 + whisper.model.decoding_state_bytes(),
            input_copies: 1,
        },
    };
    let worst_job = cost.worst_bytes();
    if activation + worst_job > limit {
        bail!(
            "the memory budget ({} MiB) cannot hold one window's activations ({} MiB) plus one job at its worst case \
             ({} MiB: max_input_bytes={} and max_items_per_job={} recordings of max_audio_seconds={}): raise \
             --memory-budget (or --memory-fraction), or lower --max-input-bytes, --max-items-per-job or --max-audio-seconds",
            limit >> 20,
            activation >> 20,
            worst_job >> 20,
            config.max_input_bytes(),
            config.max_items_per_job(),
            config.max_audio_seconds,
        );
    }
    // Warm up: one window of silence, a few tokens.
    let warm = std::time::Instant::now();
    let silence = Recording::new(&whisper.extractor, &[0.0; 16_000]);
    if let Some(window) = silence.next_window() {
        let audio = whisper
            .model
            .encode(
                &window.features,
                sluice_models::audio::features::WINDOW_FRAMES,
            )
            .map_err(|e| anyhow::anyhow!("warm-up failed: {e}"))?;
        let prompt = sluice_models::whisper::transcribe::timestamp_prompt(
            &whisper.settings,
            whisper.is_multilingual().then_some("en"),
            WhisperTask::Transcribe,
        )
        .map_err(|e| anyhow::anyhow!("warm-up failed: {e}"))?;
        sluice_models::whisper::transcribe::decode_window(
            &whisper.model,
            &whisper.settings,
            &whisper.rules,
            &audio,
            &prompt,
            Some(4),
        )
        .map_err(|e| anyhow::anyhow!("warm-up failed: {e}"))?;
    }
    tracing::info!(
        task = config.task().as_str(),
        model = %dir.display(),
        mels = n_mels,
        multilingual = whisper.is_multilingual(),
        budget_mib = limit >> 20,
        activation_mib = activation >> 20,
        worst_job_mib = worst_job >> 20,
        warmup_ms = warm.elapsed().as_millis() as u64,
        "model ready"
    );
    let budget = Budget::new(limit - activation).with_floor(worst_job);
    let (tx, rx) = mpsc::channel(64);
    let thread = executor::spawn(Arc::clone(&whisper), rx)?;
    Ok(Started {
        engine: Box::new(TranscribeEngine {
            whisper,
            executor: tx,
            max_audio_seconds: config.max_audio_seconds as f64,
        }),
        model_thread: thread,
        cost,
        pacing: Pacing {
            in_flight: None,
            // A window's seconds.
            tenant_quantum: 30,
            job_estimate: 30,
        },
        budget,
        device: "cpu".into(),
        memory: crate::memory::MemoryProbe::for_device(&device),
    })
}

impl TranscribeEngine {
    /// The options a job's parameters ask for, checked against the model.
    fn options(&self, p: &sluice_schemas::TranscribeParameters) -> Result<Options, JobError> {
        let invalid = |m: String| JobError::new(ErrorCode::InvalidParameters, m);
        let translate = p.translate.unwrap_or(false);
        if !self.whisper.is_multilingual() {
            if translate {
                return Err(invalid(
                    "parameters.translate: this model is English-only; it cannot translate".into(),
                ));
            }
            if let Some(l) = p.language.as_deref().filter(|l| *l != "en") {
                return Err(invalid(format!(
                    "parameters.language {l:?}: this model is English-only (leave language out, or \"en\")"
                )));
            }
        } else if let Some(l) = &p.language
            && !self.whisper.knows_language(l)
        {
            return Err(invalid(format!(
                "parameters.language {l:?} is not one of the model's languages"
            )));
        }
        Ok(Options {
            language: if self.whisper.is_multilingual() {
                p.language.clone()
            } else {
                None
            },
            task: if translate {
                WhisperTask::Translate
            } else {
                WhisperTask::Transcribe
            },
            max_new_tokens: None,
        })
    }

    /// Decodes one recording's file and computes its features, off the
    /// runtime; `item` names it in an error.
    async fn prepare(&self, item: usize, bytes: Vec<u8>) -> Result<Recording, JobError> {
        let whisper = Arc::clone(&self.whisper);
        let max = self.max_audio_seconds;
        let decoded = tokio::task::spawn_blocking(move || {
            let audio = decode_bytes(bytes, max)?;
            Ok::<_, AudioError>(Recording::new(&whisper.extractor, &audio.samples))
        })
        .await
        .map_err(|e| JobError::new(ErrorCode::Internal, format!("decoding audio: {e}")))?;
        decoded.map_err(|e| {
            let code = match e {
                AudioError::TooLong { .. } => ErrorCode::InputTooLarge,
                _ => ErrorCode::InputInvalid,
            };
            JobError::new(code, format!("recording {item}: {e}"))
        })
    }

    /// Transcribes prepared recordings on the model's thread; their
    /// transcripts and the windows decoded.
    async fn transcribe(
        &self,
        recordings: Vec<Recording>,
        options: &Options,
    ) -> Result<(Vec<Transcript>, u64), JobError> {
        let mut waits = Vec::with_capacity(recordings.len());
        for recording in recordings {
            let seconds = recording.seconds;
            let (reply, answer) = oneshot::channel();
            self.executor
                .send(executor::Request {
                    recording,
                    options: options.clone(),
                    reply,
                })
                .await
                .map_err(|_| {
                    JobError::new(ErrorCode::Internal, "the transcription thread stopped")
                })?;
            waits.push((seconds, answer));
        }
        let mut out = Vec::with_capacity(waits.len());
        let mut windows = 0;
        for (seconds, answer) in waits {
            let done = answer.await.map_err(|_| {
                JobError::new(ErrorCode::Internal, "the transcription thread stopped")
            })??;
            windows += done.windows;
            out.push(self.transcript(seconds, done));
        }
        Ok((out, windows))
    }

    /// The wire's transcript of a recording the model transcribed.
    fn transcript(
        &self,
        seconds: f64,
        done: sluice_models::whisper::transcriptions::Transcribed,
    ) -> Transcript {
        let all: Vec<u32> = done
            .segments
            .iter()
            .flat_map(|s| s.tokens.iter().copied())
            .collect();
        let segments = done
            .segments
            .into_iter()
            .enumerate()
            .map(|(id, s)| TranscriptSegment {
                id: id as u32,
                start: round_ms(s.start),
                end: round_ms(s.end),
                text: self.whisper.text(&s.tokens),
                tokens: s.tokens,
                avg_logprob: s.avg_logprob,
                no_speech_prob: s.no_speech_prob,
            })
            .collect();
        Transcript {
            text: self.whisper.text(&all),
            language: done.language.unwrap_or_else(|| "en".into()),
            duration: round_ms(seconds),
            segments,
        }
    }
}

/// Seconds to the millisecond (a timestamp step is 20 ms).
fn round_ms(seconds: f64) -> f64 {
    (seconds * 1000.0).round() / 1000.0
}
