//! The transcribe task end to end: a consumer started with `--task
//! transcribe` on the real Whisper tiny.en (`scripts/setup`), real
//! nats-server and SeaweedFS. A recording uploaded as a WAV file (the
//! espeak-ng speech said ten times, 89 s: three windows and more) is
//! answered with the segments transformers' long-form `generate` gives
//! (`tests/fixtures/whisper/longform.json`); a FLAC at 22.05 kHz carried
//! inline is transcribed; every bad recording and bad parameter is
//! answered with its code and dead-lettered, none lost.

use std::collections::HashMap;
use std::time::Duration;

use base64::Engine;
use serde::Deserialize;
use serde_json::{Value, json};
use sluice_schemas::{ErrorCode, Input, InputFormat, Outcome, Output, Task, Transcript};
use sluice_tests::deploy::Deployment;
use sluice_tests::results::wait_results;

#[derive(Deserialize)]
struct Reference {
    speech: Speech,
}

#[derive(Deserialize)]
struct Speech {
    repeats: usize,
    gap_samples: usize,
    segments: Vec<RefSegment>,
    text: String,
}

#[derive(Deserialize)]
struct RefSegment {
    start: f64,
    end: f64,
    tokens: Vec<u32>,
}

/// The reference's recording: the speech said `repeats` times with its
/// gap after each, as 16-bit PCM (the FLAC's own samples).
fn long_recording(speech: &Speech) -> Vec<i16> {
    let audio = sluice_tests::repo_root().join("tests/fixtures/audio/speech-en.flac");
    let once = sluice_models::audio::decode_file(&audio, 60.0)
        .unwrap()
        .unwrap()
        .samples;
    let mut pcm: Vec<i16> = Vec::new();
    for _ in 0..speech.repeats {
        pcm.extend(once.iter().map(|s| (s * 32768.0).round() as i16));
        pcm.extend(std::iter::repeat_n(0, speech.gap_samples));
    }
    pcm
}

fn reference() -> Speech {
    let path = sluice_tests::repo_root().join("tests/fixtures/whisper/longform.json");
    let reference: Reference =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    reference.speech
}

/// 16-bit mono PCM as a WAV file.
fn wav(samples: &[i16], rate: u32) -> Vec<u8> {
    sluice_models::audio::wav::pcm16(rate, 1, samples)
}

fn transcript(outcome: &Outcome, id: &str) -> Transcript {
    match outcome {
        Outcome::Ok {
            output: Output::Inline { transcripts, .. },
        } if transcripts.len() == 1 => transcripts[0].clone(),
        other => panic!("{id}: {other:?}"),
    }
}

fn inline(bytes: &[u8]) -> Input {
    Input::Inline {
        items: vec![json!({
            "audio_base64": base64::engine::general_purpose::STANDARD.encode(bytes)
        })],
    }
}

/// An in-process transcribe consumer of the real tiny.en, sized for the
/// tests' recordings.
async fn transcriber(d: &Deployment) -> sluice_consumer::Consumer {
    let model = sluice_tests::models_dir().join("whisper-tiny-en");
    assert!(
        model.join("model.safetensors").is_file(),
        "{} not found: run ./scripts/setup",
        model.display()
    );
    d.start_consumer_of(
        &model,
        &[
            "--task=transcribe",
            "--max-audio-seconds=600",
            "--max-input-bytes=33554432",
        ],
    )
    .await
    .unwrap()
}

#[tokio::test]
async fn recordings_are_transcribed_as_transformers_does_and_bad_ones_fail_alone() {
    let d = Deployment::start().await.unwrap();
    let _consumer = transcriber(&d).await;
    let audio = sluice_tests::repo_root().join("tests/fixtures/audio");
    let speech = reference();
    let pcm = long_recording(&speech);
    let long = d
        .producer
        .upload_input_as("long.wav", wav(&pcm, 16_000), InputFormat::Audio, None)
        .await
        .unwrap();
    let read = |name: &str| std::fs::read(audio.join(name)).unwrap();
    let mut truncated = wav(&pcm[..16_000 * 5], 16_000);
    truncated.truncate(truncated.len() / 2);
    let empty = d
        .producer
        .upload_input_as("empty.mp3", Vec::new(), InputFormat::Audio, None)
        .await
        .unwrap();

    let job = |id: &str, input: Input| {
        let mut j = d.producer.job(Task::Transcribe, id, vec![input]);
        j.model = Task::Transcribe.default_model().into();
        j
    };
    let mut french = job("french", inline(&read("tones.wav")));
    french.parameters.transcribe.language = Some("fr".into());
    let mut translate = job("translate", inline(&read("tones.wav")));
    translate.parameters.transcribe.translate = Some(true);
    let jobs = vec![
        job("long-wav", long),
        job("inline-flac-22k", inline(&read("speech-en-22k.flac"))),
        job("opus", inline(&read("tones.opus.ogg"))),
        job("garbage", inline(b"this is not audio at all, just text")),
        job("truncated", inline(&truncated)),
        job("empty", empty),
        french,
        translate,
    ];
    let mut results = d.producer.subscribe_results().await.unwrap();
    for j in &jobs {
        d.producer.submit(j).await.unwrap();
    }
    let got = wait_results(&mut results, jobs.len(), Duration::from_secs(240)).await;
    let by_id: HashMap<_, _> = got
        .into_iter()
        .map(|r| (r.job_id.clone().unwrap_or_default(), r))
        .collect();
    assert_eq!(by_id.len(), jobs.len(), "every job answered: {by_id:?}");

    // The long recording: the reference's segments, tokens and times.
    let r = &by_id["long-wav"];
    let t = transcript(&r.outcome, "long-wav");
    assert_eq!(t.text, speech.text);
    assert_eq!(t.language, "en");
    assert!((t.duration - pcm.len() as f64 / 16_000.0).abs() < 1e-3);
    assert_eq!(t.segments.len(), speech.segments.len());
    for (i, (s, want)) in t.segments.iter().zip(&speech.segments).enumerate() {
        assert_eq!(s.id as usize, i);
        assert_eq!(s.tokens, want.tokens, "segment {i}");
        assert!(
            (s.start - want.start).abs() < 1e-3 && (s.end - want.end).abs() < 1e-3,
            "segment {i}: {}..{} against {}..{}",
            s.start,
            s.end,
            want.start,
            want.end
        );
        assert!((0.0..=1.0).contains(&s.no_speech_prob) && s.avg_logprob <= 0.0);
    }
    assert_eq!(r.usage.audio_ms, (t.duration * 1000.0).round() as u64);
    let srt = sluice_schemas::task::transcribe::srt(&t);
    assert!(
        srt.starts_with("1\n00:00:00,000 --> 00:00:03,200\nThe quick brown fox"),
        "{srt}"
    );
    eprintln!(
        "long-wav: {} segments over {:.1} s in {:.0} ms of inference",
        t.segments.len(),
        t.duration,
        r.timings_ms.inference.unwrap_or(0.0)
    );

    // The 22.05 kHz FLAC, inline: read through the resampler.
    let t = transcript(&by_id["inline-flac-22k"].outcome, "inline-flac-22k");
    assert!((t.duration - 7.935).abs() < 0.01, "{}", t.duration);
    assert!(
        t.text.contains("lazy dog") && t.text.contains("memory"),
        "{}",
        t.text
    );
    assert!(!t.segments.is_empty());

    // Each bad one with its code and what it saw.
    for (id, code, says) in [
        ("opus", ErrorCode::InputInvalid, "opus"),
        ("garbage", ErrorCode::InputInvalid, "not audio"),
        ("truncated", ErrorCode::InputInvalid, "WAV"),
        ("empty", ErrorCode::InputInvalid, "empty"),
        ("french", ErrorCode::InvalidParameters, "English-only"),
        (
            "translate",
            ErrorCode::InvalidParameters,
            "cannot translate",
        ),
    ] {
        match &by_id[id].outcome {
            Outcome::Error { error } => {
                assert_eq!(error.code, code, "{id}: {error:?}");
                assert!(
                    error.message.to_lowercase().contains(&says.to_lowercase()),
                    "{id}: {}",
                    error.message
                );
                eprintln!("{id}: {} {}", error.code, error.message);
            }
            other => panic!("{id}: {other:?}"),
        }
    }
    assert_eq!(d.dead_letters().await, 6);
    assert_eq!(d.jobs_in_stream_settled(0).await, 0);
}

const KEY: &str = "sk-team-a-0123456789";
const KEYS: &str = "team-a:sk-team-a-0123456789";

const SDK_SCRIPT: &str = r#"
import json, sys
from openai import OpenAI
client = OpenAI()
path = sys.argv[1]
out = {}
for fmt in ["json", "text", "srt", "vtt", "verbose_json"]:
    with open(path, "rb") as f:
        r = client.audio.transcriptions.create(
            model="whisper-tiny-en", file=f, response_format=fmt,
            timestamp_granularities=["segment"] if fmt == "verbose_json" else None or [])
    out[fmt] = r if isinstance(r, str) else r.model_dump()
def refused(call):
    try:
        call()
        return "answered"
    except Exception as e:
        return [getattr(e, "status_code", None), str(e)]
with open(path, "rb") as f:
    out["translate"] = refused(lambda: client.audio.translations.create(model="whisper-tiny-en", file=f))
with open(path, "rb") as f:
    out["warm"] = refused(lambda: client.audio.transcriptions.create(
        model="whisper-tiny-en", file=f, temperature=0.5))
with open(path, "rb") as f:
    out["unknown_model"] = refused(lambda: client.audio.transcriptions.create(model="whisper-9", file=f))
print(json.dumps(out))
"#;

/// The official Python SDK's `audio.transcriptions.create` against the
/// gateway, in each `response_format`: one recording, one job through the
/// queue, answered in OpenAI's shapes; `sluice submit --task transcribe
/// --wait` prints the same transcript; a translation on an English-only
/// model and a temperature refused with 400, an unknown model with 404
/// `model_not_found`, as OpenAI answers it.
#[tokio::test]
async fn the_openai_sdk_and_the_cli_transcribe_through_the_queue() {
    let d = Deployment::start().await.unwrap();
    let consumer = transcriber(&d).await;
    let gateway = d.start_gateway(KEYS, &[]).await.unwrap();
    let base = format!("http://{}/v1", gateway.addr);
    let file = sluice_tests::repo_root().join("tests/fixtures/audio/speech-en-22k.flac");
    let got = sluice_tests::sdk::run_python(
        SDK_SCRIPT,
        &[file.display().to_string()],
        &base,
        KEY,
        Duration::from_secs(300),
    )
    .await;
    let text = got["json"]["text"].as_str().unwrap().to_string();
    eprintln!("the SDK's transcript: {text}");
    assert!(text.contains("dog.") && text.contains("memory"), "{got}");
    assert_eq!(got["json"]["usage"]["seconds"].as_f64(), Some(8.0), "{got}");
    assert_eq!(got["text"].as_str().unwrap().trim(), text, "{got}");
    let verbose = &got["verbose_json"];
    assert_eq!(verbose["text"], text.as_str(), "{got}");
    assert_eq!(verbose["language"], "en");
    assert_eq!(verbose["task"], "transcribe");
    let segments = verbose["segments"].as_array().unwrap();
    assert!(!segments.is_empty());
    let srt = got["srt"].as_str().unwrap();
    let vtt = got["vtt"].as_str().unwrap();
    let cues = segments
        .iter()
        .filter(|s| !s["text"].as_str().unwrap().trim().is_empty())
        .count();
    assert_eq!(srt.matches(" --> ").count(), cues, "{srt}");
    assert!(srt.starts_with("1\n00:00:00,000 --> "), "{srt}");
    assert!(vtt.starts_with("WEBVTT\n\n00:00:00.000 --> "), "{vtt}");
    assert_eq!(vtt.matches(" --> ").count(), cues, "{vtt}");
    for (case, says) in [
        ("translate", "cannot translate"),
        ("warm", "temperature"),
        ("unknown_model", "whisper-9"),
    ] {
        let refusal = &got[case];
        let status = if case == "unknown_model" { 404 } else { 400 };
        assert_eq!(refusal[0], status, "{case}: {refusal}");
        assert!(
            refusal[1].as_str().unwrap().contains(says),
            "{case}: {refusal}"
        );
    }

    // The CLI: the file uploaded as it is, its transcript printed.
    let path = file.to_str().unwrap();
    let run = d
        .cli(
            &["submit", "--task", "transcribe", "--wait", path],
            None,
            Duration::from_secs(120),
        )
        .await;
    eprintln!("{}", run.stdout);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert!(
        run.stdout.contains("ok, 1 recordings, 7.9 s of audio")
            && run
                .stdout
                .contains(&format!("(en, 7.9 s, {} segments) {text}", segments.len())),
        "{}",
        run.stdout
    );
    let run = d
        .cli(
            &[
                "submit",
                "--task",
                "transcribe",
                "--language",
                "fr",
                "--wait",
                path,
            ],
            None,
            Duration::from_secs(120),
        )
        .await;
    assert_eq!(run.code, Some(1), "{}", run.stderr);
    assert!(
        run.stdout.contains("error invalid_parameters") && run.stdout.contains("English-only"),
        "{}",
        run.stdout
    );
    let run = d
        .cli(
            &["submit", "--language", "en", path],
            None,
            Duration::from_secs(60),
        )
        .await;
    assert_eq!(run.code, Some(2), "{}", run.stderr);
    assert!(
        run.stderr
            .contains("--language and --translate apply to --task transcribe"),
        "{}",
        run.stderr
    );

    // Five formats and the CLI's file answered; the translation and the
    // CLI's French refused by the consumer, dead-lettered; the refused
    // temperature and model never became jobs.
    let ok = consumer
        .stats
        .jobs_ok
        .load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(ok, 6);
    assert_eq!(d.dead_letters().await, 2);
    assert_eq!(d.jobs_in_stream_settled(0).await, 0);
}

/// SIGKILL of the consumer process while it transcribes: each recording is
/// redelivered to the next consumer, transcribed whole from its first
/// window, answered once, with the reference's transcript; none lost, none
/// dead-lettered.
#[tokio::test]
async fn a_consumer_killed_mid_recording_loses_nothing() {
    let d = Deployment::start_with(sluice_producer::provision::Settings {
        max_deliver: 100,
        ack_wait: Duration::from_secs(10),
        ..Default::default()
    })
    .await
    .unwrap();
    let speech = reference();
    let wav_file = wav(&long_recording(&speech), 16_000);
    let input = d
        .producer
        .upload_input_as("long.wav", wav_file, InputFormat::Audio, None)
        .await
        .unwrap();
    let mut results = d.producer.subscribe_results().await.unwrap();
    let ids: Vec<String> = (0..2).map(|i| format!("killed-{i}")).collect();
    for id in &ids {
        let mut job = d.producer.job(Task::Transcribe, id, vec![input.clone()]);
        job.model = Task::Transcribe.default_model().into();
        d.producer.submit(&job).await.unwrap();
    }
    let args = [
        "--task=transcribe",
        "--max-audio-seconds=600",
        "--max-input-bytes=33554432",
        "--progress-interval-secs=3",
    ];
    let first = d.spawn_consumer(&args).await.unwrap();
    // Mid-file: its first recording running for a while (a few windows in).
    let started = std::time::Instant::now();
    loop {
        let status = d.producer.status(&ids[0]).await.unwrap();
        if status.is_some_and(|s| s.state == sluice_schemas::JobState::Running) {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(60), "never ran");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let pid = first.pid().unwrap();
    std::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .unwrap();
    eprintln!("killed consumer {pid} mid-recording");
    drop(first);
    let mut second = d.spawn_consumer(&args).await.unwrap();
    let got = wait_results(&mut results, ids.len(), Duration::from_secs(300)).await;
    let mut answered: HashMap<String, usize> = HashMap::new();
    for r in &got {
        let id = r.job_id.clone().unwrap_or_default();
        let t = transcript(&r.outcome, &id);
        assert_eq!(t.text, speech.text, "{id}");
        assert_eq!(t.segments.len(), speech.segments.len(), "{id}");
        *answered.entry(id).or_default() += 1;
    }
    assert_eq!(
        answered.len(),
        ids.len(),
        "every job answered: {answered:?}"
    );
    assert!(
        answered.values().all(|&n| n == 1),
        "each once: {answered:?}"
    );
    for id in &ids {
        let status = d.producer.status(id).await.unwrap().unwrap();
        assert_eq!(status.state, sluice_schemas::JobState::Done, "{id}");
    }
    assert_eq!(d.dead_letters().await, 0);
    assert_eq!(d.jobs_in_stream_settled(0).await, 0);
    let status = second.terminate(Duration::from_secs(30));
    assert!(status.is_some_and(|s| s.success()), "{status:?}");
}

const SDK_BATCH_SCRIPT: &str = r#"
import io, json, sys, time
from openai import OpenAI
client = OpenAI()
speech, tones, other_key = sys.argv[1], sys.argv[2], sys.argv[3]
with open(speech, "rb") as f:
    speech_id = client.files.create(file=f, purpose="batch").id
# Another tenant's recording, which team-a's lines must not reach.
with open(speech, "rb") as f:
    theirs = OpenAI(api_key=other_key).files.create(file=f, purpose="batch").id
with open(tones, "rb") as f:
    tones_id = client.files.create(file=f, purpose="batch").id
def line(custom_id, body, url="/v1/audio/transcriptions"):
    return {"custom_id": custom_id, "method": "POST", "url": url,
            "body": {"model": "whisper-tiny-en", **body}}
lines = [
    line("speech-json", {"file": speech_id}),
    line("speech-srt", {"file": speech_id, "response_format": "srt"}),
    line("speech-verbose", {"file": speech_id, "response_format": "verbose_json", "language": "en"}),
    line("tones-text", {"file": tones_id, "response_format": "text"}),
    line("french", {"file": speech_id, "language": "fr"}),
    line("not-mine", {"file": theirs}),
    line("no-such-file", {"file": "file-0123456789abcdef0123456789abcdef"}),
    line("warm", {"file": speech_id, "temperature": 0.7}),
    line("translate", {"file": speech_id}, url="/v1/audio/translations"),
    # The caller's own URL, which the consumers refuse to fetch: why is theirs to know.
    line("their-url", {"file": "https://127.0.0.1:9/talk.mp3"}),
]
body = "".join(json.dumps(l) + "\n" for l in lines).encode()
batch_input = client.files.create(file=("lines.jsonl", io.BytesIO(body)), purpose="batch")
batch = client.batches.create(input_file_id=batch_input.id, endpoint="/v1/audio/transcriptions",
                              completion_window="24h")
deadline = time.time() + 240
while batch.status not in ("completed", "failed", "expired", "cancelled") and time.time() < deadline:
    time.sleep(0.5)
    batch = client.batches.retrieve(batch.id)
read = lambda fid: [json.loads(l) for l in client.files.content(fid).text.splitlines() if l] if fid else []
print(json.dumps({"batch": batch.model_dump(), "output": read(batch.output_file_id),
                  "errors": read(batch.error_file_id)}))
"#;

/// A Batch of transcription lines through the official SDK (what OpenAI's
/// Batch API does not take): recordings uploaded as files, each line one
/// job; every line answered once, in its `response_format`; a language the
/// model lacks, a file that does not exist, a temperature and a
/// translation on an English-only model each fail alone, and so does the
/// attack: a line naming another tenant's uploaded recording by its id
/// (refused before any URL to it is made); a line naming its own URL that
/// the consumers refuse to fetch is told the consumer's reason.
#[tokio::test]
async fn a_batch_of_transcription_lines_answers_every_line() {
    let d = Deployment::start().await.unwrap();
    let _consumer = transcriber(&d).await;
    let gateway = d
        .start_gateway(
            "team-a:sk-team-a-0123456789,team-b:sk-team-b-0123456789",
            &[],
        )
        .await
        .unwrap();
    let base = format!("http://{}/v1", gateway.addr);
    let audio = sluice_tests::repo_root().join("tests/fixtures/audio");
    let got = sluice_tests::sdk::run_python(
        SDK_BATCH_SCRIPT,
        &[
            audio.join("speech-en-22k.flac").display().to_string(),
            audio.join("tones.wav").display().to_string(),
            "sk-team-b-0123456789".to_string(),
        ],
        &base,
        KEY,
        Duration::from_secs(300),
    )
    .await;
    let batch = &got["batch"];
    assert_eq!(batch["status"], "completed", "{got}");
    assert_eq!(
        batch["request_counts"],
        json!({"total": 10, "completed": 4, "failed": 6}),
        "{got}"
    );
    let by_id = |lines: &Value| -> HashMap<String, Value> {
        lines
            .as_array()
            .unwrap()
            .iter()
            .map(|l| (l["custom_id"].as_str().unwrap().to_string(), l.clone()))
            .collect()
    };
    let output = by_id(&got["output"]);
    let errors = by_id(&got["errors"]);
    assert_eq!(output.len() + errors.len(), 10, "each line once: {got}");
    let body = |id: &str| output[id]["response"]["body"].clone();
    let text = body("speech-json")["text"].as_str().unwrap().to_string();
    assert!(text.contains("dog.") && text.contains("memory"), "{text}");
    let srt = body("speech-srt");
    assert!(
        srt.as_str().unwrap().starts_with("1\n00:00:00,000 --> "),
        "{srt}"
    );
    let verbose = body("speech-verbose");
    assert_eq!(verbose["text"], text.as_str());
    assert!(!verbose["segments"].as_array().unwrap().is_empty());
    assert!(body("tones-text").is_string());
    for (id, says) in [
        ("french", "English-only"),
        ("not-mine", "not one of your files"),
        ("no-such-file", "not one of your files"),
        ("warm", "temperature"),
        ("translate", "cannot translate"),
        // Not "stored by the gateway": the consumer's own reason.
        ("their-url", "127.0.0.1 is a loopback address"),
    ] {
        let line = &errors[id];
        let message = line["response"]["body"]["error"]["message"]
            .as_str()
            .or(line["error"]["message"].as_str())
            .unwrap_or_default();
        assert!(message.contains(says), "{id}: {line}");
    }
    gateway.stop();
}

/// `POST /v1/audio/transcriptions` of a body built by hand: the recording
/// as `file`, the model, the response format.
async fn post_transcription(base: &str, audio: &[u8]) -> (u16, serde_json::Value) {
    const BOUNDARY: &str = "sluice-test-boundary";
    let mut body = Vec::new();
    for (name, value) in [("model", "whisper-tiny-en"), ("response_format", "json")] {
        body.extend_from_slice(
            format!(
                "--{BOUNDARY}\r\ncontent-disposition: form-data; name=\"{name}\"\r\n\r\n{value}\r\n"
            )
            .as_bytes(),
        );
    }
    body.extend_from_slice(
        format!(
            "--{BOUNDARY}\r\ncontent-disposition: form-data; name=\"file\"; filename=\"talk.wav\"\r\ncontent-type: audio/wav\r\n\r\n"
        )
        .as_bytes(),
    );
    body.extend_from_slice(audio);
    body.extend_from_slice(format!("\r\n--{BOUNDARY}--\r\n").as_bytes());
    let response = reqwest::Client::new()
        .post(format!("{base}/audio/transcriptions"))
        .bearer_auth(KEY)
        .header(
            "content-type",
            format!("multipart/form-data; boundary={BOUNDARY}"),
        )
        .body(body)
        .timeout(Duration::from_secs(300))
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    let body = response.text().await.unwrap();
    (
        status,
        serde_json::from_str(&body).unwrap_or(json!({"raw": body})),
    )
}

/// A recording's time to transcribe grows with its length, which the
/// gateway does not know: an online transcription that started by its
/// deadline is waited for `--online-transcribe-secs` (600 by default), not
/// the seconds other requests get past theirs (`--online-grace-secs`).
/// Before, a recording that took longer than the deadline and that grace
/// was cancelled mid-file and answered 504. Past `--online-transcribe-secs`
/// the request is answered 504 naming it, and its job cancelled.
#[tokio::test]
async fn an_online_transcription_is_waited_for_as_long_as_a_recording_takes() {
    let d = Deployment::start().await.unwrap();
    let consumer = transcriber(&d).await;
    // About 4.5 minutes of speech: several seconds to transcribe here,
    // more than the deadline and the grace below together.
    let mut speech = reference();
    speech.repeats = 30;
    let audio = wav(&long_recording(&speech), 16_000);
    let short = ["--online-deadline-secs=1", "--online-grace-secs=1"];
    let gateway = d.start_gateway(KEYS, &short).await.unwrap();
    let base = format!("http://{}/v1", gateway.addr);
    let started = std::time::Instant::now();
    let (status, body) = post_transcription(&base, &audio).await;
    let took = started.elapsed().as_secs_f64();
    eprintln!("answered {status} in {took:.1} s");
    assert_eq!(status, 200, "{body}");
    let text = body["text"].as_str().unwrap();
    assert_eq!(text.matches("memory").count(), 30, "{text}");
    assert!(
        took > 2.0,
        "the transcription took {took:.1} s: too quick to show the wait"
    );

    let strict = [
        "--online-deadline-secs=1",
        "--online-grace-secs=1",
        "--online-transcribe-secs=1",
    ];
    let gateway = d.start_gateway(KEYS, &strict).await.unwrap();
    let base = format!("http://{}/v1", gateway.addr);
    let (status, body) = post_transcription(&base, &audio).await;
    assert_eq!(status, 504, "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("was not done 1 s after it (--online-transcribe-secs); it was cancelled"),
        "{message}"
    );
    assert_eq!(body["error"]["code"], "deadline_exceeded", "{body}");
    // The job was cancelled, not lost: recorded so, nothing left in the
    // stream, nothing dead-lettered.
    let job = message.split_whitespace().nth(1).unwrap();
    let record = d
        .producer
        .status_in(Some("team-a"), job)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        record.state,
        sluice_schemas::JobState::Cancelled,
        "{record:?}"
    );
    assert_eq!(d.jobs_in_stream_settled(0).await, 0);
    assert_eq!(d.dead_letters().await, 0);
    assert_eq!(
        consumer
            .stats
            .jobs_ok
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
}

/// A flood of recordings at a small budget: the consumer pulls only what
/// its budget holds at each job's worst (`--max-audio-seconds` and
/// `--max-input-bytes`, and its window's decoding state), shrinks each to
/// its real length once decoded, and decodes the windows it holds in
/// shared steps; every job answered once with the reference's transcript,
/// the reservation never past the budget, and the RSS within the budget
/// plus the model (its f16 file widened to f32) plus an allowance.
#[tokio::test]
async fn a_flood_of_recordings_at_a_small_budget_keeps_memory_flat() {
    const JOBS: usize = 12;
    const BUDGET: u64 = 400 << 20;
    let d = Deployment::start().await.unwrap();
    let speech = reference();
    let input = d
        .producer
        .upload_input_as(
            "flood.wav",
            wav(&long_recording(&speech), 16_000),
            InputFormat::Audio,
            None,
        )
        .await
        .unwrap();
    let mut results = d.producer.subscribe_results().await.unwrap();
    let ids: Vec<String> = (0..JOBS).map(|i| format!("flood-{i}")).collect();
    for id in &ids {
        let mut job = d.producer.job(Task::Transcribe, id, vec![input.clone()]);
        job.model = Task::Transcribe.default_model().into();
        d.producer.submit(&job).await.unwrap();
    }
    let mut consumer = d
        .spawn_consumer(&[
            "--task=transcribe",
            &format!("--memory-budget={BUDGET}"),
            "--max-audio-seconds=600",
            "--max-input-bytes=33554432",
        ])
        .await
        .unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = consumer.sample_memory(std::sync::Arc::clone(&stop));
    let started = std::time::Instant::now();
    let got = wait_results(&mut results, JOBS, Duration::from_secs(600)).await;
    let secs = started.elapsed().as_secs_f64();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let seen = sampler.await.unwrap();
    let mut answered: HashMap<String, usize> = HashMap::new();
    for r in &got {
        let id = r.job_id.clone().unwrap_or_default();
        let t = transcript(&r.outcome, &id);
        assert_eq!(t.text, speech.text, "{id}");
        *answered.entry(id).or_default() += 1;
    }
    assert_eq!(answered.len(), JOBS, "every job answered: {answered:?}");
    assert!(
        answered.values().all(|&n| n == 1),
        "each once: {answered:?}"
    );
    let model =
        std::fs::metadata(sluice_tests::models_dir().join("whisper-tiny-en/model.safetensors"))
            .unwrap()
            .len();
    const ALLOWANCE: u64 = 256 << 20;
    eprintln!(
        "{JOBS} recordings of {:.0} s in {secs:.1} s; {} samples; reserved peak {} MiB of {} MiB; \
         RSS peak {} MiB (limit: budget {} + model in f32 {} + allowance {} MiB)",
        speech.repeats as f64 * 8.94,
        seen.samples,
        seen.max_reserved >> 20,
        seen.budget >> 20,
        seen.max_rss >> 20,
        BUDGET >> 20,
        (2 * model) >> 20,
        ALLOWANCE >> 20
    );
    assert!(seen.samples > 10, "too few memory samples");
    assert!(seen.max_reserved > 0, "the budget was never used");
    assert!(
        seen.max_rss <= BUDGET + 2 * model + ALLOWANCE,
        "RSS {} MiB past the budget, the model and the allowance",
        seen.max_rss >> 20
    );
    assert_eq!(d.dead_letters().await, 0);
    assert_eq!(d.jobs_in_stream_settled(0).await, 0);
    let status = consumer.terminate(Duration::from_secs(30));
    assert!(status.is_some_and(|s| s.success()), "{status:?}");
}
