//! The transcribe task: recordings, each to its transcript with timed
//! segments (OpenAI's `/v1/audio/transcriptions` and `/translations`,
//! faster-whisper's `transcribe`). A job's input is an audio object (a URL
//! input of format `audio`: one recording per object) or, for a short one,
//! inline as `{"audio_base64": "..."}`. The transcript is one JSON shape
//! (OpenAI's `verbose_json`); [`srt`], [`vtt`] and the text are renderings
//! of it, for the CLI and the gateway.

use base64::Engine;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::kind::Task;
use super::parameters::ParameterGroup;
use crate::message::{kind_of, truncate_for_message};

/// transcribe's own parameters.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TranscribeParameters {
    /// The spoken language's code (ISO 639-1, e.g. `en`, `fr`); default:
    /// detected from the first 30 s on a multilingual model, English on an
    /// English-only one. One the model does not know fails the job with
    /// `invalid_parameters`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub language: Option<String>,
    /// Translate the speech into English instead of transcribing it
    /// (Whisper's `translate` task; default false). An English-only model
    /// refuses it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub translate: Option<bool>,
}

impl ParameterGroup for TranscribeParameters {
    const TASKS: &'static [Task] = &[Task::Transcribe];

    fn check(&self) -> Result<(), String> {
        match &self.language {
            Some(code)
                if !(2..=8).contains(&code.len())
                    || !code.bytes().all(|b| b.is_ascii_lowercase() || b == b'-') =>
            {
                Err(format!(
                    "parameters.language must be a language code such as \"en\" or \"fr\", not {:?}",
                    truncate_for_message(code)
                ))
            }
            _ => Ok(()),
        }
    }
}

/// Reads one inline transcribe item: `{"audio_base64": "<the file's bytes
/// in base64>"}` (a whole audio file, in any format a URL input may be).
pub fn item(value: Value) -> Result<Vec<u8>, String> {
    let Value::Object(mut map) = value else {
        return Err(format!(
            "a transcribe item is an object {{\"audio_base64\": \"...\"}} (or a URL input of format \"audio\"), not {}",
            kind_of(&value)
        ));
    };
    if let Some(other) = map.keys().find(|k| *k != "audio_base64") {
        return Err(format!(
            "a transcribe item has only \"audio_base64\", not {:?}",
            truncate_for_message(other)
        ));
    }
    match map.remove("audio_base64") {
        Some(Value::String(text)) => base64::engine::general_purpose::STANDARD
            .decode(text.as_bytes())
            .map_err(|e| format!("a transcribe item's audio_base64 is not base64: {e}")),
        Some(other) => Err(format!(
            "a transcribe item's audio_base64 is a string, not {}",
            kind_of(&other)
        )),
        None => Err("a transcribe item needs \"audio_base64\"".into()),
    }
}

/// A recording's transcript (OpenAI's `verbose_json` transcription).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Transcript {
    /// The whole text, the segments' in order.
    pub text: String,
    /// The language transcribed from (given, detected, or `en` on an
    /// English-only model).
    pub language: String,
    /// The recording's length in seconds.
    pub duration: f64,
    pub segments: Vec<TranscriptSegment>,
}

/// One timed stretch of a transcript.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TranscriptSegment {
    pub id: u32,
    /// Seconds from the recording's start.
    pub start: f64,
    pub end: f64,
    pub text: String,
    /// The model's tokens, its timestamps included.
    pub tokens: Vec<u32>,
    /// The mean log probability of the tokens decoded in its window.
    pub avg_logprob: f64,
    /// The probability that its window holds no speech.
    pub no_speech_prob: f64,
}

/// `HH:MM:SS` and milliseconds after `separator`.
fn clock(seconds: f64, separator: char) -> String {
    let ms = (seconds.max(0.0) * 1000.0).round() as u64;
    format!(
        "{:02}:{:02}:{:02}{separator}{:03}",
        ms / 3_600_000,
        ms / 60_000 % 60,
        ms / 1000 % 60,
        ms % 1000
    )
}

/// The segments with text, as subtitle cues.
fn cues(t: &Transcript) -> impl Iterator<Item = &TranscriptSegment> {
    t.segments.iter().filter(|s| !s.text.trim().is_empty())
}

/// SubRip subtitles: numbered cues, `HH:MM:SS,mmm --> HH:MM:SS,mmm`.
pub fn srt(t: &Transcript) -> String {
    cues(t)
        .enumerate()
        .map(|(i, s)| {
            format!(
                "{}\n{} --> {}\n{}\n\n",
                i + 1,
                clock(s.start, ','),
                clock(s.end, ','),
                s.text.trim()
            )
        })
        .collect()
}

/// WebVTT subtitles: the header, then `HH:MM:SS.mmm --> HH:MM:SS.mmm` cues.
pub fn vtt(t: &Transcript) -> String {
    let mut out = String::from("WEBVTT\n\n");
    for s in cues(t) {
        out.push_str(&format!(
            "{} --> {}\n{}\n\n",
            clock(s.start, '.'),
            clock(s.end, '.'),
            s.text.trim()
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn transcript() -> Transcript {
        let segment = |id, start, end, text: &str| TranscriptSegment {
            id,
            start,
            end,
            text: text.into(),
            tokens: vec![],
            avg_logprob: -0.2,
            no_speech_prob: 0.01,
        };
        Transcript {
            text: " Hello there. General Kenobi.".into(),
            language: "en".into(),
            duration: 3725.5,
            segments: vec![
                segment(0, 0.0, 2.5, " Hello there."),
                segment(1, 2.5, 2.5, " "),
                segment(2, 3721.04, 3725.5, " General Kenobi."),
            ],
        }
    }

    #[test]
    fn subtitles_number_and_time_the_segments_with_text() {
        assert_eq!(
            srt(&transcript()),
            "1\n00:00:00,000 --> 00:00:02,500\nHello there.\n\n2\n01:02:01,040 --> 01:02:05,500\nGeneral Kenobi.\n\n"
        );
        assert_eq!(
            vtt(&transcript()),
            "WEBVTT\n\n00:00:00.000 --> 00:00:02.500\nHello there.\n\n01:02:01.040 --> 01:02:05.500\nGeneral Kenobi.\n\n"
        );
    }

    #[test]
    fn an_inline_item_is_base64_audio_and_nothing_else() {
        assert_eq!(
            item(serde_json::json!({"audio_base64": "UklGRg=="})).unwrap(),
            b"RIFF"
        );
        let refused = [
            (serde_json::json!("UklGRg=="), "not a string"),
            (
                serde_json::json!({"audio": "UklGRg=="}),
                "only \"audio_base64\"",
            ),
            (serde_json::json!({"audio_base64": "%%"}), "not base64"),
            (
                serde_json::json!({"audio_base64": 3}),
                "is a string, not a number",
            ),
            (serde_json::json!({}), "needs \"audio_base64\""),
        ];
        for (value, want) in refused {
            let err = item(value.clone()).unwrap_err();
            assert!(err.contains(want), "{value}: {err}");
        }
    }

    #[test]
    fn a_language_is_a_code() {
        let p = |l: &str| TranscribeParameters {
            language: Some(l.into()),
            translate: None,
        };
        assert!(p("en").check().is_ok() && p("yue").check().is_ok());
        for bad in ["", "e", "English", "en us", "zz;drop"] {
            assert!(p(bad).check().is_err(), "{bad}");
        }
    }
}
