//! A recording's bytes to Whisper's input samples: demuxed and decoded by
//! symphonia (pure Rust: WAV, FLAC, MP3, Ogg Vorbis, AAC in MP4/M4A, PCM
//! and ADPCM in WAV or Matroska), its channels averaged to mono and
//! resampled to 16 kHz as it decodes ([`Resampler`]), so that only the
//! 16 kHz samples are held, never the source's PCM.
//!
//! Anything else is an [`AudioError`] a user can act on, never a panic:
//! zero bytes; bytes no demuxer recognizes (named by their signature where
//! it is a known one, with the supported list); a container with no audio
//! track (a video), or whose audio is in a codec there is no decoder for
//! (Opus, named); a stream that breaks off or ends before the length its
//! header declares; a recording longer than the caller allows; one that
//! holds no samples.

use std::io::Cursor;

use symphonia::core::audio::SampleBuffer;
use symphonia::core::codecs::{CODEC_TYPE_NULL, CODEC_TYPE_OPUS, DecoderOptions};
use symphonia::core::errors::Error as SymphoniaError;
use symphonia::core::formats::FormatOptions;
use symphonia::core::io::{MediaSource, MediaSourceStream};
use symphonia::core::meta::MetadataOptions;
use symphonia::core::probe::Hint;

use super::features::SAMPLE_RATE;
use super::resample::Resampler;

/// What sluice decodes, for error messages.
pub const SUPPORTED: &str = "WAV (PCM, ADPCM), FLAC, MP3, Ogg Vorbis, AAC in MP4/M4A";

/// Why a recording cannot be read.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum AudioError {
    #[error("the audio file is empty (0 bytes)")]
    Empty,
    #[error("the input is not audio sluice can read ({seen}); supported: {SUPPORTED}")]
    UnknownFormat { seen: String },
    #[error("the {container} file has no audio track (a video without sound?)")]
    NoAudioTrack { container: String },
    #[error(
        "the {container} file's audio is {codec}, which sluice cannot decode; supported: {SUPPORTED}"
    )]
    UnsupportedCodec { container: String, codec: String },
    #[error("the {container} audio is damaged after {seconds:.1} s: {detail}")]
    Damaged {
        container: String,
        seconds: f64,
        detail: String,
    },
    #[error(
        "the {container} audio ends early: its header declares {declared:.1} s, the file holds {seconds:.1} s (truncated?)"
    )]
    Truncated {
        container: String,
        declared: f64,
        seconds: f64,
    },
    #[error("the audio is longer than {limit:.0} s, the most this consumer transcribes")]
    TooLong { limit: f64 },
    #[error("the {container} audio holds no samples")]
    NoSamples { container: String },
}

/// A decoded recording.
#[derive(Debug, Clone)]
pub struct Audio {
    /// 16 kHz mono, nominally in [-1, 1].
    pub samples: Vec<f32>,
    /// The container, as its signature reads ("WAV", "MP3", ...).
    pub container: String,
    /// The source's sample rate and channels.
    pub source_rate: u32,
    pub source_channels: usize,
}

impl Audio {
    pub fn seconds(&self) -> f64 {
        self.samples.len() as f64 / f64::from(SAMPLE_RATE)
    }
}

/// Decodes `bytes`; refused past `max_seconds` of audio.
pub fn decode_bytes(bytes: Vec<u8>, max_seconds: f64) -> Result<Audio, AudioError> {
    if bytes.is_empty() {
        return Err(AudioError::Empty);
    }
    let container = sniff(&bytes);
    decode(Box::new(Cursor::new(bytes)), container, max_seconds)
}

/// Decodes the file at `path` (read as it decodes); refused past
/// `max_seconds` of audio.
pub fn decode_file(
    path: &std::path::Path,
    max_seconds: f64,
) -> std::io::Result<Result<Audio, AudioError>> {
    let mut file = std::fs::File::open(path)?;
    let mut head = [0u8; 16];
    let n = std::io::Read::read(&mut file, &mut head)?;
    if n == 0 {
        return Ok(Err(AudioError::Empty));
    }
    std::io::Seek::rewind(&mut file)?;
    Ok(decode(Box::new(file), sniff(&head[..n]), max_seconds))
}

/// The container a file's first bytes announce, if a known one.
fn sniff(head: &[u8]) -> Option<&'static str> {
    let starts = |magic: &[u8]| head.starts_with(magic);
    let at = |offset: usize, magic: &[u8]| head.get(offset..offset + magic.len()) == Some(magic);
    Some(if starts(b"RIFF") && at(8, b"WAVE") {
        "WAV"
    } else if starts(b"fLaC") {
        "FLAC"
    } else if starts(b"OggS") {
        "Ogg"
    } else if starts(b"ID3") || (head.len() > 1 && head[0] == 0xFF && head[1] & 0xE0 == 0xE0) {
        "MP3"
    } else if at(4, b"ftyp") {
        "MP4"
    } else if starts(&[0x1A, 0x45, 0xDF, 0xA3]) {
        "Matroska/WebM"
    } else if starts(b"FORM") {
        "AIFF"
    } else if starts(b"%PDF") {
        "PDF"
    } else if starts(&[0x89, b'P', b'N', b'G']) {
        "PNG"
    } else if starts(&[0xFF, 0xD8, 0xFF]) {
        "JPEG"
    } else {
        return None;
    })
}

fn decode(
    source: Box<dyn MediaSource>,
    sniffed: Option<&'static str>,
    max_seconds: f64,
) -> Result<Audio, AudioError> {
    let container = sniffed.unwrap_or("audio").to_string();
    let stream = MediaSourceStream::new(source, Default::default());
    let probed = symphonia::default::get_probe()
        .format(
            &Hint::new(),
            stream,
            // Encoder delay and padding trimmed (MP3's LAME tag, MP4's
            // edit lists): sample 0 is the recording's first.
            &FormatOptions {
                enable_gapless: true,
                ..FormatOptions::default()
            },
            &MetadataOptions::default(),
        )
        .map_err(|e| AudioError::UnknownFormat {
            seen: match sniffed {
                Some(name) => format!("a {name} file it cannot demux: {e}"),
                None => "no known audio signature in its first bytes".to_string(),
            },
        })?;
    let mut format = probed.format;
    let track = format
        .tracks()
        .iter()
        .find(|t| t.codec_params.codec != CODEC_TYPE_NULL && t.codec_params.sample_rate.is_some())
        .ok_or_else(|| AudioError::NoAudioTrack {
            container: container.clone(),
        })?;
    let track_id = track.id;
    let params = track.codec_params.clone();
    let mut decoder = symphonia::default::get_codecs()
        .make(&params, &DecoderOptions::default())
        .map_err(|_| AudioError::UnsupportedCodec {
            container: container.clone(),
            codec: if params.codec == CODEC_TYPE_OPUS {
                "Opus".to_string()
            } else {
                format!("a codec with no decoder here ({:?})", params.codec)
            },
        })?;
    let source_rate = params.sample_rate.unwrap_or(SAMPLE_RATE);
    let declared = params.n_frames;
    let mut resampler = Resampler::new(source_rate, SAMPLE_RATE);
    let mut samples = Vec::new();
    let mut mono = Vec::new();
    let mut interleaved: Option<SampleBuffer<f32>> = None;
    let mut channels = params.channels.map_or(1, |c| c.count());
    let mut frames: u64 = 0;
    let seconds_at = |frames: u64| frames as f64 / f64::from(source_rate.max(1));
    let damaged = |frames: u64, detail: String| AudioError::Damaged {
        container: container.clone(),
        seconds: seconds_at(frames),
        detail,
    };
    loop {
        let packet = match format.next_packet() {
            Ok(packet) => packet,
            Err(SymphoniaError::IoError(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                break;
            }
            Err(SymphoniaError::ResetRequired) => break,
            Err(e) => return Err(damaged(frames, e.to_string())),
        };
        if packet.track_id() != track_id {
            continue;
        }
        let decoded = match decoder.decode(&packet) {
            Ok(decoded) => decoded,
            // A bad packet (a damaged MP3 frame, say) is skipped, as
            // players do; a stream of nothing but is caught below.
            Err(SymphoniaError::DecodeError(_)) => continue,
            Err(e) => return Err(damaged(frames, e.to_string())),
        };
        let spec = *decoded.spec();
        channels = spec.channels.count().max(1);
        let buffer = match &mut interleaved {
            Some(b) if b.capacity() >= decoded.capacity() * channels => b,
            slot => slot.insert(SampleBuffer::new(decoded.capacity() as u64, spec)),
        };
        buffer.copy_interleaved_ref(decoded);
        mono.clear();
        mono.extend(
            buffer
                .samples()
                .chunks_exact(channels)
                .map(|frame| frame.iter().sum::<f32>() / channels as f32),
        );
        frames += mono.len() as u64;
        if seconds_at(frames) > max_seconds {
            return Err(AudioError::TooLong { limit: max_seconds });
        }
        resampler.push(&mono, &mut samples);
    }
    resampler.finish(&mut samples);
    if frames == 0 {
        return Err(AudioError::NoSamples { container });
    }
    if let Some(declared) = declared {
        // A decoder may trim a few hundred frames of codec delay.
        if frames + (declared / 100).max(4096) < declared {
            return Err(AudioError::Truncated {
                container,
                declared: seconds_at(declared),
                seconds: seconds_at(frames),
            });
        }
    }
    Ok(Audio {
        samples,
        container,
        source_rate,
        source_channels: channels,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn wav(rate: u32, channels: u16, samples: &[i16]) -> Vec<u8> {
        crate::audio::wav::pcm16(rate, channels, samples)
    }

    /// Stereo 44.1 kHz, the left channel a tone and the right its
    /// negative plus a constant: mono is the constant's half; 2 s come out
    /// as 32,000 samples at 16 kHz.
    #[test]
    fn a_stereo_wav_is_averaged_to_mono_and_resampled_to_16_khz() {
        let mut samples = Vec::new();
        for i in 0..88_200 {
            let tone = ((i as f64 * 0.05).sin() * 8000.0) as i16;
            samples.extend([tone, 4000 - tone]);
        }
        let audio = decode_bytes(wav(44_100, 2, &samples), 60.0).unwrap();
        assert_eq!(
            (audio.container.as_str(), audio.source_rate),
            ("WAV", 44_100)
        );
        assert_eq!(audio.source_channels, 2);
        assert_eq!(audio.samples.len(), 32_000);
        let middle = &audio.samples[1_000..31_000];
        let want = 2000.0 / 32768.0;
        assert!(
            middle.iter().all(|s| (s - want).abs() < 1e-3),
            "{:?}",
            &middle[..4]
        );
    }

    /// Every kind of bad input is its own error, naming what was seen and
    /// what is supported.
    #[test]
    fn bad_audio_is_refused_with_what_was_seen_and_what_is_supported() {
        let tone: Vec<i16> = (0..16_000).map(|i| ((i % 40) * 100) as i16).collect();
        let good = wav(16_000, 1, &tone);
        let mut truncated = good.clone();
        truncated.truncate(good.len() / 3);
        let png = [&[0x89, b'P', b'N', b'G', 13, 10, 26, 10][..], &[0u8; 64]].concat();
        let cases: Vec<(&str, Vec<u8>, &str)> = vec![
            ("empty", Vec::new(), "empty (0 bytes)"),
            (
                "text",
                b"hello, this is not audio at all".to_vec(),
                "no known audio signature",
            ),
            ("png", png, "a PNG file it cannot demux"),
            (
                "truncated",
                truncated,
                "ends early: its header declares 1.0 s",
            ),
            ("no samples", wav(16_000, 1, &[]), "holds no samples"),
        ];
        for (what, bytes, says) in cases {
            let error = decode_bytes(bytes, 60.0).unwrap_err();
            let message = error.to_string();
            assert!(message.contains(says), "{what}: {message}");
            if matches!(error, AudioError::UnknownFormat { .. }) {
                assert!(message.contains(SUPPORTED), "{what}: {message}");
            }
        }
        // Too long for the caller: refused as it decodes.
        let error = decode_bytes(good, 0.5).unwrap_err();
        assert_eq!(error, AudioError::TooLong { limit: 0.5 });
    }
}
