//! A recording of any length to timed segments, as transformers'
//! `WhisperForConditionalGeneration.generate(..., return_timestamps=True)`
//! does it (sequential long-form decoding, its defaults: greedy, no
//! temperature fallback, each window's prompt the forced one alone):
//!
//! - the features are computed once: a recording of at most 30 s padded to
//!   30 s, a longer one over its own length (its range taken over the
//!   whole recording);
//! - [`Recording`] cuts a 30 s window at its `seek` (the last one padded
//!   with zeros), a window is decoded greedily under the
//!   [`TimestampRules`](super::timestamps::TimestampRules) ([`decode_window`]), and the window's
//!   timestamp pairs become segments; the next window starts at the last
//!   closed segment's end, so a sentence cut by a window's edge is decoded
//!   whole in the next one, never twice, or after the whole window when
//!   it ended in silence (a single timestamp before the end).
//!
//! The window's decoding is separate from the recording's progress so that
//! one thread can take windows of many recordings in turn.

use super::config::GenerationSettings;
use super::generate::{WhisperTask, prompt};
use super::model::{AudioStates, DecoderState, WhisperModel};
use super::timestamps::{TIME_PRECISION, TimestampRules, log_softmax};
use crate::audio::features::{FeatureExtractor, HOP, LogMel, SAMPLE_RATE, WINDOW_FRAMES};
use crate::error::ModelError;

/// Mel frames per timestamp step (two frames per encoder position).
const FRAMES_PER_STEP: usize = 2;

/// One segment of a transcript: its times in the recording and its tokens
/// (its timestamps included, as the reference gives them).
#[derive(Debug, Clone, PartialEq)]
pub struct Segment {
    pub start: f64,
    pub end: f64,
    pub tokens: Vec<u32>,
    /// The mean log probability of the tokens its window chose (the end of
    /// text included), shared by the window's segments.
    pub avg_logprob: f64,
    /// The probability of `<|nospeech|>` after the start of its window's
    /// transcript.
    pub no_speech_prob: f64,
}

impl Segment {
    /// Its text tokens (those before the end of text).
    pub fn text_tokens(&self, rules: &TimestampRules) -> Vec<u32> {
        self.tokens
            .iter()
            .copied()
            .filter(|&t| t < rules.eos)
            .collect()
    }
}

/// One window's greedy decoding.
#[derive(Debug, Clone, PartialEq)]
pub struct Decoded {
    /// The tokens after the prompt, without the end of text.
    pub tokens: Vec<u32>,
    pub avg_logprob: f64,
    pub no_speech_prob: f64,
}

/// One window to decode: `n_mels` rows of 3,000 frames.
#[derive(Debug, Clone)]
pub struct Window {
    pub features: Vec<f32>,
    /// Where it starts, in frames of the recording.
    pub seek: usize,
    /// Its frames of the recording (the rest is padding).
    pub frames: usize,
}

/// A recording's progress through its windows.
#[derive(Debug, Clone)]
pub struct Recording {
    features: LogMel,
    /// The frames to transcribe: 3,000 for a short recording (its
    /// padding included, as the reference), else the recording's.
    total_frames: usize,
    seek: usize,
    segments: Vec<Segment>,
    /// The recording's length in seconds (before any padding).
    pub seconds: f64,
}

impl Recording {
    /// The features of `samples` (16 kHz mono).
    pub fn new(extractor: &FeatureExtractor, samples: &[f32]) -> Recording {
        let window_samples = WINDOW_FRAMES * HOP;
        let features = extractor.compute(samples, window_samples);
        Recording {
            total_frames: features.frames,
            features,
            seek: 0,
            segments: Vec::new(),
            seconds: samples.len() as f64 / f64::from(SAMPLE_RATE),
        }
    }

    /// Windows left, at most (each takes at least one timestamp step).
    pub fn windows_left(&self) -> usize {
        self.total_frames
            .saturating_sub(self.seek)
            .div_ceil(WINDOW_FRAMES)
    }

    pub fn is_done(&self) -> bool {
        self.seek >= self.total_frames
    }

    /// The next window, or `None` once the recording is transcribed.
    pub fn next_window(&self) -> Option<Window> {
        if self.is_done() {
            return None;
        }
        let frames = (self.total_frames - self.seek).min(WINDOW_FRAMES);
        let n_mels = self.features.n_mels;
        let mut features = vec![0f32; n_mels * WINDOW_FRAMES];
        for mel in 0..n_mels {
            let row = self.features.row(mel);
            features[mel * WINDOW_FRAMES..mel * WINDOW_FRAMES + frames]
                .copy_from_slice(&row[self.seek..self.seek + frames]);
        }
        Some(Window {
            features,
            seek: self.seek,
            frames,
        })
    }

    /// Takes `window`'s decoding: its segments, and where the next window
    /// starts (transformers' `_retrieve_segment`).
    pub fn accept(&mut self, window: &Window, decoded: &Decoded, rules: &TimestampRules) {
        let offset = window.seek as f64 * TIME_PRECISION / FRAMES_PER_STEP as f64;
        let (segments, advance) = split(&decoded.tokens, window.frames, rules);
        for (start, end, tokens) in segments {
            self.segments.push(Segment {
                start: offset + start,
                end: offset + end,
                tokens,
                avg_logprob: decoded.avg_logprob,
                no_speech_prob: decoded.no_speech_prob,
            });
        }
        // A window always moves on (a first timestamp of <|0.00|> closing
        // nothing would otherwise decode the same window again).
        self.seek += advance.max(FRAMES_PER_STEP).min(window.frames);
    }

    /// The segments so far.
    pub fn segments(&self) -> &[Segment] {
        &self.segments
    }

    pub fn into_segments(self) -> Vec<Segment> {
        self.segments
    }
}

/// A window's tokens as segments (start and end in seconds within the
/// window, and the segment's tokens with its timestamps), and the frames
/// the next window moves on by.
pub fn split(
    tokens: &[u32],
    window_frames: usize,
    rules: &TimestampRules,
) -> (Vec<(f64, f64, Vec<u32>)>, usize) {
    let is_ts: Vec<bool> = tokens.iter().map(|&t| rules.is_timestamp(t)).collect();
    let single_ending = is_ts.len() >= 2 && !is_ts[is_ts.len() - 2] && is_ts[is_ts.len() - 1];
    let mut cuts: Vec<usize> = (1..is_ts.len())
        .filter(|&i| is_ts[i - 1] && is_ts[i])
        .collect();
    if cuts.is_empty() {
        // One segment: to its last timestamp, else the window's end.
        let mut end = (window_frames / FRAMES_PER_STEP) as f64 * TIME_PRECISION;
        if let Some(&last) = tokens.iter().rev().find(|&&t| rules.is_timestamp(t))
            && last != rules.timestamp_begin
        {
            end = rules.seconds(last);
        }
        return (vec![(0.0, end, tokens.to_vec())], window_frames);
    }
    if single_ending {
        cuts.push(tokens.len());
    } else if let Some(last) = cuts.last_mut() {
        *last += 1;
    }
    let mut segments = Vec::with_capacity(cuts.len());
    let mut from = 0;
    for (i, &to) in cuts.iter().enumerate() {
        let slice = &tokens[from..to];
        let last_index = if i + 1 < cuts.len() || single_ending {
            slice.len() - 1
        } else {
            slice.len() - 2
        };
        segments.push((
            rules.seconds(slice[0]),
            rules.seconds(slice[last_index]),
            slice.to_vec(),
        ));
        from = to;
    }
    let advance = if single_ending {
        window_frames
    } else {
        // After the last closed segment: what follows it was cut by the
        // window's edge and is decoded again in the next one.
        let last_pos = tokens[from - 2].saturating_sub(rules.timestamp_begin) as usize;
        last_pos * FRAMES_PER_STEP
    };
    (segments, advance)
}

/// What a transcription asks of the model.
#[derive(Debug, Clone, PartialEq)]
pub struct Options {
    /// The spoken language's code (`en`, `fr`); on a multilingual model,
    /// detected from the first window when not given.
    pub language: Option<String>,
    pub task: WhisperTask,
    /// At most this many tokens per window (the decoder's room when not
    /// given).
    pub max_new_tokens: Option<usize>,
}

/// A model's timestamp tokens, from its generation settings; `None` for a
/// model without them.
pub fn rules(settings: &GenerationSettings) -> Option<TimestampRules> {
    let no_timestamps = settings.no_timestamps_token_id?;
    Some(TimestampRules {
        no_timestamps,
        timestamp_begin: no_timestamps + 1,
        eos: settings.eos_token_id,
        max_initial_index: settings.max_initial_timestamp_index,
    })
}

/// The forced prompt of a window decoded with timestamps: the start, the
/// language and task on a multilingual model.
pub fn timestamp_prompt(
    settings: &GenerationSettings,
    language: Option<&str>,
    task: WhisperTask,
) -> Result<Vec<u32>, String> {
    let mut ids = prompt(settings, language, task)?;
    if settings.no_timestamps_token_id.is_some() {
        ids.pop();
    }
    Ok(ids)
}

/// The language a window's audio is most likely in, by the model's
/// language tokens after the start of transcript (transformers'
/// `detect_language`): its code, e.g. `en`.
pub fn detect_language(
    model: &WhisperModel,
    settings: &GenerationSettings,
    audio: &AudioStates,
) -> Result<String, ModelError> {
    let mut state = model.start(audio)?;
    let logits = model.step(&mut state, &[settings.decoder_start_token_id])?;
    settings
        .lang_to_id
        .iter()
        .filter(|&(_, &id)| (id as usize) < logits.len())
        .max_by(|a, b| logits[*a.1 as usize].total_cmp(&logits[*b.1 as usize]))
        .map(|(token, _)| {
            token
                .trim_start_matches("<|")
                .trim_end_matches("|>")
                .to_string()
        })
        .ok_or_else(|| ModelError::Failed("the model lists no language tokens".into()))
}

/// Greedy decoding of one window (`audio`: the encoder's states) after
/// `prompt`, under the generation config's suppressions and the timestamp
/// rules, to the end of text or the decoder's room.
pub fn decode_window(
    model: &WhisperModel,
    settings: &GenerationSettings,
    rules: &TimestampRules,
    audio: &AudioStates,
    prompt: &[u32],
    max_new_tokens: Option<usize>,
) -> Result<Decoded, ModelError> {
    let mut window = WindowDecoding::start(model, audio, prompt, max_new_tokens)?;
    loop {
        if let Some(decoded) = decode_step(model, settings, rules, &mut [&mut window])?
            .pop()
            .flatten()
        {
            return Ok(decoded);
        }
    }
}

/// One window's greedy decoding, a decoder step at a time, so that the
/// windows of several recordings share each step ([`decode_step`]): the
/// prompt's start of transcript alone (`<|nospeech|>`'s probability is read
/// after it), the rest of the prompt, then a token a step.
pub struct WindowDecoding {
    state: DecoderState,
    /// What the next step reads.
    input: Vec<u32>,
    /// The rest of the prompt, read by the second step.
    prompt_rest: Vec<u32>,
    tokens: Vec<u32>,
    sum_logprob: f64,
    no_speech_prob: Option<f64>,
    /// The most tokens it may generate.
    room: usize,
}

impl WindowDecoding {
    /// A window's decoding after `prompt` (not empty).
    pub fn start(
        model: &WhisperModel,
        audio: &AudioStates,
        prompt: &[u32],
        max_new_tokens: Option<usize>,
    ) -> Result<WindowDecoding, ModelError> {
        let Some((first, rest)) = prompt.split_first() else {
            return Err(ModelError::Failed("an empty decoder prompt".into()));
        };
        Ok(WindowDecoding {
            state: model.start(audio)?,
            input: vec![*first],
            prompt_rest: rest.to_vec(),
            tokens: Vec::new(),
            sum_logprob: 0.0,
            no_speech_prob: None,
            room: model
                .config
                .max_target_positions
                .saturating_sub(prompt.len())
                .min(max_new_tokens.unwrap_or(usize::MAX)),
        })
    }

    /// Takes the logits of the step that read `input`; the window's
    /// decoding once it is over.
    fn advance(
        &mut self,
        settings: &GenerationSettings,
        rules: &TimestampRules,
        mut logits: Vec<f32>,
    ) -> Option<Decoded> {
        if self.no_speech_prob.is_none() {
            let no_speech = rules.no_timestamps.saturating_sub(1) as usize;
            self.no_speech_prob = Some(
                log_softmax(&logits)
                    .get(no_speech)
                    .map_or(0.0, |l| f64::from(l.exp())),
            );
            if !self.prompt_rest.is_empty() {
                self.input = std::mem::take(&mut self.prompt_rest);
                return None;
            }
        }
        if self.tokens.is_empty() {
            for &t in &settings.begin_suppress_tokens {
                if let Some(l) = logits.get_mut(t as usize) {
                    *l = f32::NEG_INFINITY;
                }
            }
        }
        for &t in &settings.suppress_tokens {
            if let Some(l) = logits.get_mut(t as usize) {
                *l = f32::NEG_INFINITY;
            }
        }
        rules.apply(&self.tokens, &mut logits);
        let next = WhisperModel::argmax(&logits);
        self.sum_logprob += f64::from(log_softmax(&logits)[next as usize]);
        self.tokens.push(next);
        if next != rules.eos && self.tokens.len() < self.room {
            self.input = vec![next];
            return None;
        }
        let mut tokens = std::mem::take(&mut self.tokens);
        let avg_logprob = self.sum_logprob / tokens.len() as f64;
        if tokens.last() == Some(&rules.eos) {
            tokens.pop();
        }
        Some(Decoded {
            tokens,
            avg_logprob,
            no_speech_prob: self.no_speech_prob.unwrap_or(0.0),
        })
    }
}

/// One decoder step shared by `windows` (none of them over): each reads
/// its next input; for each, its decoding if this step ended it.
pub fn decode_step(
    model: &WhisperModel,
    settings: &GenerationSettings,
    rules: &TimestampRules,
    windows: &mut [&mut WindowDecoding],
) -> Result<Vec<Option<Decoded>>, ModelError> {
    let inputs: Vec<Vec<u32>> = windows.iter().map(|w| w.input.clone()).collect();
    let token_lists: Vec<&[u32]> = inputs.iter().map(Vec::as_slice).collect();
    let mut states: Vec<&mut DecoderState> = windows.iter_mut().map(|w| &mut w.state).collect();
    let logits = model.step_many(&mut states, &token_lists)?;
    Ok(windows
        .iter_mut()
        .zip(logits)
        .map(|(w, logits)| w.advance(settings, rules, logits))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    const RULES: TimestampRules = TimestampRules {
        no_timestamps: 50362,
        timestamp_begin: 50363,
        eos: 50256,
        max_initial_index: Some(50),
    };

    fn ts(seconds: f64) -> u32 {
        RULES.timestamp_begin + (seconds / TIME_PRECISION).round() as u32
    }

    fn times(tokens: &[u32], frames: usize) -> (Vec<(f64, f64, usize)>, usize) {
        let (segments, advance) = split(tokens, frames, &RULES);
        (
            segments
                .into_iter()
                .map(|(s, e, t)| {
                    (
                        (s * 100.0).round() / 100.0,
                        (e * 100.0).round() / 100.0,
                        t.len(),
                    )
                })
                .collect(),
            advance,
        )
    }

    /// The cases of transformers' `_retrieve_segment`.
    #[test]
    fn a_windows_timestamps_cut_its_segments_and_say_where_the_next_starts() {
        // Pairs, then a segment cut by the window's edge: seek to the last
        // closed end (6.0 s = 300 steps = 600 frames).
        let cut = [ts(0.0), 1, 2, ts(2.5), ts(2.5), 3, ts(6.0), ts(6.0), 4, 5];
        assert_eq!(times(&cut, 3000), (vec![(0.0, 2.5, 4), (2.5, 6.0, 4)], 600));
        // A single timestamp at the end: silence after, the whole window.
        let single = [ts(0.0), 1, ts(2.5), ts(2.5), 3, ts(4.0)];
        assert_eq!(
            times(&single, 3000),
            (vec![(0.0, 2.5, 3), (2.5, 4.0, 3)], 3000)
        );
        // No pair: one segment, to its last timestamp.
        assert_eq!(
            times(&[ts(0.0), 1, 2, ts(3.0)], 3000),
            (vec![(0.0, 3.0, 4)], 3000)
        );
        // No timestamp past the first: the window's frames.
        assert_eq!(times(&[ts(0.0), 1, 2], 1200), (vec![(0.0, 12.0, 3)], 1200));
    }

    #[test]
    fn segments_land_at_the_windows_offset_and_a_window_always_moves_on() {
        let extractor = FeatureExtractor::new(80);
        let samples = vec![0f32; 16_000 * 45];
        let mut recording = Recording::new(&extractor, &samples);
        assert_eq!(recording.windows_left(), 2);
        let first = recording.next_window().unwrap_or_else(|| unreachable!());
        assert_eq!((first.seek, first.frames), (0, 3000));
        let decoded = Decoded {
            tokens: vec![ts(0.0), 1, ts(2.0), ts(2.0), 2, ts(20.0), ts(20.0), 3],
            avg_logprob: -0.5,
            no_speech_prob: 0.1,
        };
        recording.accept(&first, &decoded, &RULES);
        let second = recording.next_window().unwrap_or_else(|| unreachable!());
        assert_eq!((second.seek, second.frames), (2000, 2500));
        let decoded = Decoded {
            tokens: vec![ts(0.0), 3, ts(1.0)],
            avg_logprob: -0.25,
            no_speech_prob: 0.0,
        };
        recording.accept(&second, &decoded, &RULES);
        assert!(recording.is_done());
        let got: Vec<(f64, f64, Vec<u32>)> = recording
            .segments()
            .iter()
            .map(|s| (s.start, s.end, s.tokens.clone()))
            .collect();
        assert_eq!(
            got,
            [
                (0.0, 2.0, vec![ts(0.0), 1, ts(2.0)]),
                // The last closed segment keeps both timestamps of its
                // pair, as transformers slices it (`slices[-1] += 1`).
                (2.0, 20.0, vec![ts(2.0), 2, ts(20.0), ts(20.0)]),
                (20.0, 21.0, vec![ts(0.0), 3, ts(1.0)])
            ]
        );
        // A window whose only timestamp is <|0.00|> closing nothing still
        // moves on by a step.
        let mut stuck = Recording::new(&extractor, &samples);
        let w = stuck.next_window().unwrap_or_else(|| unreachable!());
        let nothing = Decoded {
            tokens: vec![ts(0.0), ts(0.0)],
            avg_logprob: 0.0,
            no_speech_prob: 1.0,
        };
        stuck.accept(&w, &nothing, &RULES);
        assert_eq!(stuck.seek, FRAMES_PER_STEP);
    }
}
