//! Several recordings transcribed at once, as the transcribe task's thread
//! and `bench/transcribe` run them: a window of every recording is decoded
//! in the same decoder steps ([`decode_step`]: the weights read once a step
//! for all of them), and a recording's next window is encoded as soon as
//! its last one ends (continuous batching, as `generate`'s thread does), so
//! a long recording does not hold a short one behind it. Each recording's
//! segments are the ones it gets transcribed alone (a window's tokens are
//! the same bits whichever windows share its steps).

use std::time::Instant;

use super::config::GenerationSettings;
use super::model::WhisperModel;
use super::timestamps::TimestampRules;
use super::transcribe::{
    Options, Recording, Segment, Window, WindowDecoding, decode_step, detect_language, rules,
    timestamp_prompt,
};
use crate::audio::features::{FeatureExtractor, WINDOW_FRAMES};
use crate::error::ModelError;

/// A recording's transcript.
#[derive(Debug)]
pub struct Transcribed {
    /// Given, detected, or none (an English-only model).
    pub language: Option<String>,
    pub segments: Vec<Segment>,
    /// Windows decoded.
    pub windows: u64,
}

/// Why a recording was not transcribed.
#[derive(Debug)]
pub enum Failure {
    /// Its options ask what the model cannot do (a language it does not
    /// know, translating on an English-only model).
    Parameters(String),
    /// The model failed.
    Model(ModelError),
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Parameters(m) => f.write_str(m),
            Failure::Model(e) => write!(f, "{e}"),
        }
    }
}

struct InProgress<T> {
    tag: T,
    recording: Recording,
    options: Options,
    /// The forced prompt, once the first window told the language.
    prompt: Option<Vec<u32>>,
    language: Option<String>,
    /// The window being decoded, if any.
    window: Option<(Window, WindowDecoding)>,
    windows: u64,
}

/// The recordings being transcribed, each with a tag of the caller's (its
/// job's reply, its index).
pub struct Transcriptions<'m, T> {
    model: &'m WhisperModel,
    settings: &'m GenerationSettings,
    rules: &'m TimestampRules,
    active: Vec<InProgress<T>>,
    /// Seconds spent encoding windows and in decoder steps so far.
    pub encode_seconds: f64,
    pub decode_seconds: f64,
}

impl<'m, T> Transcriptions<'m, T> {
    pub fn new(
        model: &'m WhisperModel,
        settings: &'m GenerationSettings,
        rules: &'m TimestampRules,
    ) -> Self {
        Transcriptions {
            model,
            settings,
            rules,
            active: Vec::new(),
            encode_seconds: 0.0,
            decode_seconds: 0.0,
        }
    }

    pub fn add(&mut self, tag: T, recording: Recording, options: Options) {
        self.active.push(InProgress {
            tag,
            language: options.language.clone(),
            recording,
            options,
            prompt: None,
            window: None,
            windows: 0,
        });
    }

    /// Drops the recordings whose tag `keep` refuses (their jobs went
    /// away).
    pub fn retain(&mut self, mut keep: impl FnMut(&T) -> bool) {
        self.active.retain(|r| keep(&r.tag));
    }

    pub fn is_empty(&self) -> bool {
        self.active.is_empty()
    }

    /// Encodes the next window of each recording between windows, then
    /// runs one decoder step shared by every window being decoded; the
    /// recordings this finished (transcribed, or failed), with their tags.
    pub fn step(&mut self) -> Vec<(T, Result<Transcribed, Failure>)> {
        let mut finished = Vec::new();
        let mut still = Vec::with_capacity(self.active.len());
        for mut r in self.active.drain(..) {
            if r.window.is_some() {
                still.push(r);
                continue;
            }
            let started = Instant::now();
            let next = next_window(self.model, self.settings, &mut r);
            self.encode_seconds += started.elapsed().as_secs_f64();
            match next {
                Ok(true) => still.push(r),
                Ok(false) => finished.push(r.done()),
                Err(e) => finished.push((r.tag, Err(e))),
            }
        }
        self.active = still;
        if self.active.is_empty() {
            return finished;
        }
        let started = Instant::now();
        let mut windows: Vec<&mut WindowDecoding> = self
            .active
            .iter_mut()
            .filter_map(|r| r.window.as_mut().map(|(_, w)| w))
            .collect();
        let ended = decode_step(self.model, self.settings, self.rules, &mut windows);
        self.decode_seconds += started.elapsed().as_secs_f64();
        match ended {
            Ok(ended) => {
                let decoding = self.active.iter_mut().filter(|r| r.window.is_some());
                for (r, decoded) in decoding.zip(ended) {
                    if let Some(decoded) = decoded
                        && let Some((window, _)) = r.window.take()
                    {
                        r.recording.accept(&window, &decoded, self.rules);
                        r.windows += 1;
                    }
                }
                let (done, still): (Vec<_>, Vec<_>) = self
                    .active
                    .drain(..)
                    .partition(|r| r.window.is_none() && r.recording.is_done());
                self.active = still;
                finished.extend(done.into_iter().map(InProgress::done));
            }
            Err(e) => {
                // A bug (the inputs are the decoder's own): every recording
                // of the step fails rather than loops.
                let message = e.to_string();
                finished.extend(self.active.drain(..).map(|r| {
                    let error = ModelError::Failed(message.clone());
                    (r.tag, Err(Failure::Model(error)))
                }));
            }
        }
        finished
    }
}

/// Encodes `r`'s next window and starts its decoding; false when the
/// recording has no more.
fn next_window<T>(
    model: &WhisperModel,
    settings: &GenerationSettings,
    r: &mut InProgress<T>,
) -> Result<bool, Failure> {
    let Some(window) = r.recording.next_window() else {
        return Ok(false);
    };
    let audio = model
        .encode(&window.features, WINDOW_FRAMES)
        .map_err(Failure::Model)?;
    let prompt = match &r.prompt {
        Some(p) => p.clone(),
        None => {
            if settings.is_multilingual && r.language.is_none() {
                r.language =
                    Some(detect_language(model, settings, &audio).map_err(Failure::Model)?);
            }
            let p = timestamp_prompt(settings, r.language.as_deref(), r.options.task)
                .map_err(Failure::Parameters)?;
            r.prompt = Some(p.clone());
            p
        }
    };
    let decoding = WindowDecoding::start(model, &audio, &prompt, r.options.max_new_tokens)
        .map_err(Failure::Model)?;
    r.window = Some((window, decoding));
    Ok(true)
}

impl<T> InProgress<T> {
    fn done(self) -> (T, Result<Transcribed, Failure>) {
        let transcribed = Transcribed {
            language: self.language,
            segments: self.recording.into_segments(),
            windows: self.windows,
        };
        (self.tag, Ok(transcribed))
    }
}

/// Transcribes one recording on this thread, window after window; the
/// language detected (or given) and the segments. `keep_going` is asked
/// before each step (a cancel stops between steps).
pub fn transcribe(
    model: &WhisperModel,
    settings: &GenerationSettings,
    extractor: &FeatureExtractor,
    samples: &[f32],
    options: &Options,
    keep_going: &dyn Fn() -> bool,
) -> Result<(Option<String>, Vec<Segment>), Failure> {
    let rules = rules(settings).ok_or_else(|| {
        Failure::Model(ModelError::Failed(
            "the model's generation config has no <|notimestamps|> token".into(),
        ))
    })?;
    let mut one = Transcriptions::new(model, settings, &rules);
    one.add((), Recording::new(extractor, samples), options.clone());
    loop {
        if !keep_going() {
            return Err(Failure::Model(ModelError::Failed("cancelled".into())));
        }
        if let Some(((), done)) = one.step().pop() {
            let done = done?;
            return Ok((done.language, done.segments));
        }
    }
}
