//! Whisper's input: the log-mel spectrogram of 16 kHz mono audio, computed
//! as transformers' `WhisperFeatureExtractor` does (held to it by
//! `models/tests/whisper_features.rs` on its own output):
//!
//! 1. the samples padded with zeros to `pad_to` (30 s for one window),
//!    then 200 samples reflected at each end (a centered STFT);
//! 2. frames of 400 samples every 160 (10 ms), each times a periodic Hann
//!    window, a 400-point real FFT, its power `|X|^2`;
//! 3. each frame through `n_mels` triangular filters on the Slaney mel
//!    scale from 0 to 8 kHz, Slaney-normalized (area-equal), floored at
//!    1e-10, `log10`;
//! 4. the last frame dropped (30 s: 3,000 frames), every value raised to
//!    at least the spectrogram's maximum less 8 (80 dB of range), then
//!    `(x + 4) / 4`.
//!
//! Steps 2 and 3 run in f64 as the reference's NumPy path does; the result
//! is f32.

use std::sync::Arc;

use rayon::prelude::*;
use realfft::RealToComplex;

/// Whisper's sample rate.
pub const SAMPLE_RATE: u32 = 16_000;
/// Samples per FFT frame (25 ms).
pub const N_FFT: usize = 400;
/// Samples between frames (10 ms).
pub const HOP: usize = 160;
/// Samples in one 30 s window: what the encoder reads at once.
pub const WINDOW_SAMPLES: usize = 30 * SAMPLE_RATE as usize;
/// Frames in one 30 s window.
pub const WINDOW_FRAMES: usize = WINDOW_SAMPLES / HOP;

/// Frequency bins of one frame's one-sided spectrum.
const BINS: usize = N_FFT / 2 + 1;
/// The floor under a mel energy before its logarithm.
const MEL_FLOOR: f64 = 1e-10;

/// A log-mel spectrogram: `n_mels` rows of `frames` values, row-major
/// (the layout of transformers' `input_features[0]`).
#[derive(Debug, Clone, PartialEq)]
pub struct LogMel {
    pub n_mels: usize,
    pub frames: usize,
    pub values: Vec<f32>,
}

impl LogMel {
    /// Mel row `mel`.
    pub fn row(&self, mel: usize) -> &[f32] {
        &self.values[mel * self.frames..(mel + 1) * self.frames]
    }
}

/// The feature extractor of a Whisper model with `n_mels` mel bins (80, or
/// 128 as large-v3 has): its filter bank and FFT plan, made once.
pub struct FeatureExtractor {
    n_mels: usize,
    /// `n_mels` rows of [`BINS`] weights.
    filters: Vec<f64>,
    window: Vec<f64>,
    fft: Arc<dyn RealToComplex<f64>>,
}

impl FeatureExtractor {
    pub fn new(n_mels: usize) -> FeatureExtractor {
        let mut planner = realfft::RealFftPlanner::<f64>::new();
        FeatureExtractor {
            n_mels,
            filters: slaney_mel_filters(n_mels, BINS, SAMPLE_RATE as f64),
            window: periodic_hann(N_FFT),
            fft: planner.plan_fft_forward(N_FFT),
        }
    }

    pub fn n_mels(&self) -> usize {
        self.n_mels
    }

    /// The features of `samples` (16 kHz mono, nominally in [-1, 1])
    /// padded with zeros to `pad_to` samples when shorter: `pad_to` =
    /// [`WINDOW_SAMPLES`] for one 30 s window (longer audio is cut there by
    /// the caller), or the audio's own length for long-form audio, whose
    /// range (step 4) is then taken over the whole recording, as
    /// transformers does for long-form generation. `len / 160` frames.
    pub fn compute(&self, samples: &[f32], pad_to: usize) -> LogMel {
        let len = samples.len().max(pad_to);
        let frames = len / HOP;
        // The centered signal's sample `i` (before the 200 reflected ones).
        let padded = |i: usize| -> f64 {
            let at = reflect(i as isize - (N_FFT / 2) as isize, len);
            samples.get(at).map_or(0.0, |&s| f64::from(s))
        };
        // Frame-major mel energies, then transposed into rows.
        let mut energies = vec![0f64; frames * self.n_mels];
        energies
            .par_chunks_mut(self.n_mels)
            .enumerate()
            .for_each_init(
                || {
                    (
                        self.fft.make_input_vec(),
                        self.fft.make_output_vec(),
                        self.fft.make_scratch_vec(),
                        vec![0f64; BINS],
                    )
                },
                |(input, output, scratch, power), (frame, mels)| {
                    let start = frame * HOP;
                    for (k, x) in input.iter_mut().enumerate() {
                        *x = padded(start + k) * self.window[k];
                    }
                    // Sizes match the plan's: it cannot fail.
                    let _ = self.fft.process_with_scratch(input, output, scratch);
                    for (p, c) in power.iter_mut().zip(output.iter()) {
                        *p = c.re * c.re + c.im * c.im;
                    }
                    for (m, energy) in mels.iter_mut().enumerate() {
                        let weights = &self.filters[m * BINS..(m + 1) * BINS];
                        let dot: f64 = weights.iter().zip(power.iter()).map(|(w, p)| w * p).sum();
                        *energy = dot.max(MEL_FLOOR).log10();
                    }
                },
            );
        // In f32 from here, as the reference is.
        let max = energies
            .iter()
            .fold(f32::NEG_INFINITY, |a, &b| a.max(b as f32));
        let floor = max - 8.0;
        let mut values = vec![0f32; frames * self.n_mels];
        for (frame, mels) in energies.chunks(self.n_mels).enumerate() {
            for (m, &e) in mels.iter().enumerate() {
                values[m * frames + frame] = ((e as f32).max(floor) + 4.0) / 4.0;
            }
        }
        LogMel {
            n_mels: self.n_mels,
            frames,
            values,
        }
    }
}

/// NumPy's `reflect` padding of a signal of `len` samples: index `i`
/// (negative or past the end) mirrored about the end samples, which are
/// not repeated, as often as it takes.
fn reflect(i: isize, len: usize) -> usize {
    if len < 2 {
        return 0;
    }
    let period = 2 * (len as isize - 1);
    let i = i.rem_euclid(period);
    if i < len as isize {
        i as usize
    } else {
        (period - i) as usize
    }
}

/// The periodic Hann window of `n` samples (NumPy's `hanning(n + 1)[:-1]`,
/// torch's `hann_window(n)`).
fn periodic_hann(n: usize) -> Vec<f64> {
    (0..n)
        .map(|i| 0.5 - 0.5 * (2.0 * std::f64::consts::PI * i as f64 / n as f64).cos())
        .collect()
}

/// Hertz to mels on the Slaney scale: linear below 1 kHz, logarithmic
/// above.
fn hertz_to_mel(hz: f64) -> f64 {
    const MIN_LOG_HZ: f64 = 1000.0;
    const MIN_LOG_MEL: f64 = 15.0;
    if hz >= MIN_LOG_HZ {
        MIN_LOG_MEL + (hz / MIN_LOG_HZ).ln() * (27.0 / 6.4f64.ln())
    } else {
        3.0 * hz / 200.0
    }
}

fn mel_to_hertz(mel: f64) -> f64 {
    const MIN_LOG_HZ: f64 = 1000.0;
    const MIN_LOG_MEL: f64 = 15.0;
    if mel >= MIN_LOG_MEL {
        MIN_LOG_HZ * ((6.4f64.ln() / 27.0) * (mel - MIN_LOG_MEL)).exp()
    } else {
        200.0 * mel / 3.0
    }
}

/// `n_mels` triangular filters over `bins` FFT bins from 0 Hz to half the
/// sample rate, their corners evenly spaced in Slaney mels, each scaled to
/// unit area (`norm="slaney"`): transformers' `mel_filter_bank`. Row-major,
/// a row per filter.
fn slaney_mel_filters(n_mels: usize, bins: usize, sample_rate: f64) -> Vec<f64> {
    let (low, high) = (hertz_to_mel(0.0), hertz_to_mel(sample_rate / 2.0));
    // NumPy's linspace: start + i * step, the last exactly `high`.
    let step = (high - low) / (n_mels + 1) as f64;
    let corners: Vec<f64> = (0..n_mels + 2)
        .map(|i| {
            mel_to_hertz(if i == n_mels + 1 {
                high
            } else {
                low + i as f64 * step
            })
        })
        .collect();
    let nyquist = (sample_rate as u64 / 2) as f64;
    let bin_hz: Vec<f64> = (0..bins)
        .map(|b| nyquist * b as f64 / (bins - 1) as f64)
        .collect();
    let mut filters = vec![0f64; n_mels * bins];
    for m in 0..n_mels {
        let (left, center, right) = (corners[m], corners[m + 1], corners[m + 2]);
        let area = 2.0 / (right - left);
        for (b, &hz) in bin_hz.iter().enumerate() {
            let down = (hz - left) / (center - left);
            let up = (right - hz) / (right - center);
            filters[m * bins + b] = down.min(up).max(0.0) * area;
        }
    }
    filters
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reflection_mirrors_about_the_end_samples_as_numpy_pads() {
        // np.pad([0, 1, 2, 3], 5, mode="reflect")
        let padded: Vec<usize> = (-5..9).map(|i| reflect(i, 4)).collect();
        assert_eq!(padded, [1, 2, 3, 2, 1, 0, 1, 2, 3, 2, 1, 0, 1, 2]);
    }

    #[test]
    fn thirty_seconds_are_three_thousand_frames_of_each_mel() {
        let features = FeatureExtractor::new(80).compute(&[], WINDOW_SAMPLES);
        assert_eq!((features.n_mels, features.frames), (80, WINDOW_FRAMES));
        // Silence: every energy at the floor, so all equal the maximum.
        assert!(features.values.iter().all(|&v| v == features.values[0]));
        assert_eq!(features.values[0], ((-10.0 + 4.0) / 4.0) as f32);
    }
}
