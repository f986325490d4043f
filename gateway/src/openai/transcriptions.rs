//! OpenAI's audio endpoints (`/v1/audio/transcriptions`,
//! `/v1/audio/translations`): the form's fields as a transcribe job's
//! parameters, and a transcript as the answer in the `response_format`
//! asked (`json`, `text`, `srt`, `vtt`, `verbose_json`). What sluice does
//! not do is refused by name rather than answered differently: a
//! `temperature` other than 0 (it decodes greedily), a `prompt` (no
//! conditioning text), word timestamps, streaming.

use serde_json::{Map, Value, json};
use sluice_schemas::Transcript;
use sluice_schemas::task::transcribe::{srt, vtt};

/// How a transcript is answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResponseFormat {
    Json,
    Text,
    Srt,
    Vtt,
    VerboseJson,
}

impl ResponseFormat {
    const NAMES: [(&'static str, ResponseFormat); 5] = [
        ("json", ResponseFormat::Json),
        ("text", ResponseFormat::Text),
        ("srt", ResponseFormat::Srt),
        ("vtt", ResponseFormat::Vtt),
        ("verbose_json", ResponseFormat::VerboseJson),
    ];

    pub fn parse(name: &str) -> Option<ResponseFormat> {
        Self::NAMES
            .into_iter()
            .find(|(n, _)| *n == name)
            .map(|(_, f)| f)
    }
}

/// The form's fields other than `file`, as they came.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Fields {
    pub model: Option<String>,
    pub language: Option<String>,
    pub prompt: Option<String>,
    pub response_format: Option<String>,
    pub temperature: Option<String>,
    pub timestamp_granularities: Vec<String>,
    pub stream: Option<String>,
}

/// How a request's transcript is answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Answering {
    pub format: ResponseFormat,
    pub translate: bool,
    /// The recording is the caller's own URL (a batch line's `https://`
    /// one), not an object the gateway stored: why it could not be read is
    /// the caller's to know.
    pub callers_url: bool,
}

impl Default for Answering {
    fn default() -> Answering {
        Answering {
            format: ResponseFormat::Json,
            translate: false,
            callers_url: false,
        }
    }
}

/// A batch line's body (`/v1/audio/transcriptions` or `/translations`,
/// `model` already read): the recording is `file`, the id of a file the
/// tenant uploaded (`file-...`) or an `https://` URL; the other fields as
/// the form's. The job item names the recording and the parameters, which
/// the batch driver turns into the chunk job's audio input.
pub fn batch_item(
    body: &mut Map<String, Value>,
    model: &str,
    translate: bool,
) -> Result<(Value, Answering), Refusal> {
    fn text(body: &mut Map<String, Value>, name: &'static str) -> Result<Option<String>, Refusal> {
        match body.remove(name) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(Value::Number(n)) => Ok(Some(n.to_string())),
            Some(_) => Err((format!("`{name}` must be a string"), name)),
        }
    }
    let file = text(body, "file")?.unwrap_or_default();
    let source = if file.starts_with("file-") {
        json!({"audio_file": file})
    } else if file.starts_with("https://") {
        json!({"audio_url": file})
    } else {
        return Err((
            "`file` must name the recording: the id of a file you uploaded (file-...) or an https:// URL"
                .into(),
            "file",
        ));
    };
    let timestamp_granularities = match body.remove("timestamp_granularities") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(list)) => list
            .into_iter()
            .map(|v| v.as_str().unwrap_or_default().to_string())
            .collect(),
        Some(_) => {
            return Err((
                "`timestamp_granularities` must be a list".into(),
                "timestamp_granularities",
            ));
        }
    };
    let fields = Fields {
        model: Some(model.to_string()),
        language: text(body, "language")?,
        prompt: text(body, "prompt")?,
        response_format: text(body, "response_format")?,
        temperature: text(body, "temperature")?,
        timestamp_granularities,
        stream: match body.remove("stream") {
            Some(Value::Bool(true)) => Some("true".into()),
            _ => None,
        },
    };
    let asked = read_fields(fields)?;
    let callers_url = source.get("audio_url").is_some();
    let mut item = source;
    if let Some(language) = asked.language {
        item["language"] = json!(language);
    }
    if translate {
        item["translate"] = json!(true);
    }
    Ok((
        item,
        Answering {
            format: asked.format,
            translate,
            callers_url,
        },
    ))
}

/// A request that can run.
#[derive(Debug, Clone, PartialEq)]
pub struct Asked {
    pub model: String,
    pub language: Option<String>,
    pub format: ResponseFormat,
}

/// Why a form is refused: the message, and the field it names.
pub type Refusal = (String, &'static str);

/// Checks the fields: a model, a known format, and nothing asked that
/// sluice would answer differently.
pub fn read_fields(fields: Fields) -> Result<Asked, Refusal> {
    let model = fields
        .model
        .filter(|m| !m.trim().is_empty())
        .ok_or_else(|| ("the form has no `model` field".to_string(), "model"))?;
    let format = match fields.response_format.as_deref() {
        None | Some("") => ResponseFormat::Json,
        Some(name) => ResponseFormat::parse(name).ok_or_else(|| {
            (
                format!(
                    "'{name}' is not a response_format; use one of: {}",
                    ResponseFormat::NAMES.map(|(n, _)| n).join(", ")
                ),
                "response_format",
            )
        })?,
    };
    if let Some(t) = fields.temperature.as_deref().filter(|t| !t.is_empty()) {
        match t.parse::<f64>() {
            Ok(0.0) => {}
            Ok(_) => {
                return Err((
                    format!(
                        "temperature {t}: sluice transcribes greedily (temperature 0, as transformers' generate); leave it out or send 0"
                    ),
                    "temperature",
                ));
            }
            Err(_) => return Err((format!("temperature {t:?} is not a number"), "temperature")),
        }
    }
    if fields.prompt.as_deref().is_some_and(|p| !p.is_empty()) {
        return Err((
            "`prompt` (text to condition the transcript on) is not supported; leave it out".into(),
            "prompt",
        ));
    }
    if let Some(g) = fields
        .timestamp_granularities
        .iter()
        .find(|g| g.as_str() != "segment")
    {
        return Err((
            format!(
                "timestamp_granularities '{g}': only 'segment' is supported (word timestamps are not)"
            ),
            "timestamp_granularities[]",
        ));
    }
    if fields.stream.as_deref().is_some_and(|s| s == "true") {
        return Err((
            "stream: a transcript is answered whole; leave stream out".into(),
            "stream",
        ));
    }
    let language = fields.language.filter(|l| !l.is_empty());
    Ok(Asked {
        model,
        language,
        format,
    })
}

/// The answer's body: JSON, or text with its content type.
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    Json(Value),
    Text {
        body: String,
        content_type: &'static str,
    },
}

/// `transcript` answered as `format` asks; `translate` names the task in
/// `verbose_json`.
pub fn answer(transcript: &Transcript, format: ResponseFormat, translate: bool) -> Answer {
    let usage = json!({"type": "duration", "seconds": transcript.duration.ceil() as u64});
    let text = |body: String| Answer::Text {
        body,
        content_type: "text/plain; charset=utf-8",
    };
    match format {
        ResponseFormat::Json => Answer::Json(json!({
            "text": transcript.text.trim(),
            "usage": usage,
        })),
        ResponseFormat::Text => text(format!("{}\n", transcript.text.trim())),
        ResponseFormat::Srt => text(srt(transcript)),
        ResponseFormat::Vtt => Answer::Text {
            body: vtt(transcript),
            content_type: "text/vtt; charset=utf-8",
        },
        ResponseFormat::VerboseJson => {
            let segments: Vec<Value> = transcript
                .segments
                .iter()
                .map(|s| {
                    json!({
                        "id": s.id,
                        "seek": 0,
                        "start": s.start,
                        "end": s.end,
                        "text": s.text,
                        "tokens": s.tokens,
                        "temperature": 0.0,
                        "avg_logprob": s.avg_logprob,
                        "compression_ratio": 0.0,
                        "no_speech_prob": s.no_speech_prob,
                    })
                })
                .collect();
            Answer::Json(json!({
                "task": if translate { "translate" } else { "transcribe" },
                "language": transcript.language,
                "duration": transcript.duration,
                "text": transcript.text.trim(),
                "segments": segments,
                "usage": usage,
            }))
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use sluice_schemas::TranscriptSegment;

    fn fields(pairs: &[(&str, &str)]) -> Fields {
        let mut f = Fields {
            model: Some("whisper-tiny-en".into()),
            ..Fields::default()
        };
        for (k, v) in pairs {
            let raw = v.to_string();
            let v = Some(raw.clone());
            match *k {
                "model" => f.model = v,
                "language" => f.language = v,
                "prompt" => f.prompt = v,
                "response_format" => f.response_format = v,
                "temperature" => f.temperature = v,
                "stream" => f.stream = v,
                "timestamp_granularities[]" => f.timestamp_granularities.push(raw),
                _ => unreachable!("{k}"),
            }
        }
        f
    }

    /// Each refusal names its field; what OpenAI's SDK sends by default
    /// (temperature 0, segment granularity) runs.
    #[test]
    fn the_form_runs_or_is_refused_naming_the_field() {
        let ok = read_fields(fields(&[
            ("response_format", "srt"),
            ("temperature", "0"),
            ("timestamp_granularities[]", "segment"),
            ("language", "en"),
        ]))
        .unwrap_or_else(|e| unreachable!("{e:?}"));
        assert_eq!(ok.format, ResponseFormat::Srt);
        assert_eq!(ok.language.as_deref(), Some("en"));
        let refused = [
            (vec![("model", "")], "model"),
            (vec![("response_format", "docx")], "response_format"),
            (vec![("temperature", "0.2")], "temperature"),
            (vec![("temperature", "warm")], "temperature"),
            (vec![("prompt", "Kubernetes, NATS")], "prompt"),
            (
                vec![("timestamp_granularities[]", "word")],
                "timestamp_granularities[]",
            ),
            (vec![("stream", "true")], "stream"),
        ];
        for (pairs, param) in refused {
            let (message, got) = read_fields(fields(&pairs)).unwrap_err();
            assert_eq!(got, param, "{pairs:?}: {message}");
        }
    }

    #[test]
    fn a_transcript_answers_in_each_format() {
        let t = Transcript {
            text: " Hello there.".into(),
            language: "en".into(),
            duration: 2.5,
            segments: vec![TranscriptSegment {
                id: 0,
                start: 0.0,
                end: 2.5,
                text: " Hello there.".into(),
                tokens: vec![50363, 15496, 612, 13, 50488],
                avg_logprob: -0.3,
                no_speech_prob: 0.01,
            }],
        };
        assert_eq!(
            answer(&t, ResponseFormat::Json, false),
            Answer::Json(
                json!({"text": "Hello there.", "usage": {"type": "duration", "seconds": 3}})
            )
        );
        let Answer::Json(verbose) = answer(&t, ResponseFormat::VerboseJson, true) else {
            unreachable!()
        };
        assert_eq!(verbose["task"], "translate");
        assert_eq!(verbose["segments"][0]["end"], 2.5);
        assert_eq!(
            answer(&t, ResponseFormat::Text, false),
            Answer::Text {
                body: "Hello there.\n".into(),
                content_type: "text/plain; charset=utf-8"
            }
        );
        let Answer::Text { body, content_type } = answer(&t, ResponseFormat::Vtt, false) else {
            unreachable!()
        };
        assert!(body.starts_with("WEBVTT\n\n00:00:00.000 --> 00:00:02.500\nHello there."));
        assert_eq!(content_type, "text/vtt; charset=utf-8");
    }
}
