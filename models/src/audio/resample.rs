//! Sample-rate conversion to Whisper's 16 kHz: band-limited interpolation
//! by a Kaiser-windowed sinc (16 zero crossings each side, cut off at 95 %
//! of the lower of the two Nyquist rates, beta 8.6: about 80 dB of
//! stop-band), streaming: samples go in as they are decoded and only the
//! filter's reach of input is kept, so a long recording is never held at
//! its source rate.
//!
//! Output sample `n` is the input band-limited and read at `n * from / to`
//! (exact integer arithmetic: no drift over hours); before the first and
//! past the last input sample the signal is zero. `ceil(len * to / from)`
//! samples come out of `len`.

/// Zero crossings of the sinc on each side of the center.
const ZEROS: f64 = 16.0;
/// The pass band's edge, as a fraction of the lower Nyquist rate.
const CUTOFF: f64 = 0.95;
/// The Kaiser window's shape: higher is a deeper stop band, a wider
/// transition.
const KAISER_BETA: f64 = 8.6;
/// Kernel table entries per input sample of distance (linearly
/// interpolated between).
const PHASES: usize = 512;

/// A converter from `from` Hz to `to` Hz.
pub struct Resampler {
    from: u64,
    to: u64,
    /// How far the kernel reaches, in input samples, each side.
    reach: f64,
    /// The kernel at distances 0, 1/PHASES, ... input samples.
    kernel: Vec<f32>,
    /// Input samples from absolute index `base` on.
    buffer: Vec<f32>,
    base: u64,
    /// Input samples pushed so far.
    pushed: u64,
    /// The next output sample's index.
    next: u64,
}

impl Resampler {
    pub fn new(from: u32, to: u32) -> Resampler {
        let (from, to) = (u64::from(from.max(1)), u64::from(to.max(1)));
        // Below the lower Nyquist rate, in cycles per input sample x 2.
        let scale = (to as f64 / from as f64).min(1.0) * CUTOFF;
        let reach = ZEROS / scale;
        let entries = (reach * PHASES as f64).ceil() as usize + 2;
        let norm = bessel_i0(KAISER_BETA);
        let kernel = (0..entries)
            .map(|i| {
                let d = i as f64 / PHASES as f64;
                if d >= reach {
                    return 0.0;
                }
                let x = d / reach;
                let window = bessel_i0(KAISER_BETA * (1.0 - x * x).sqrt()) / norm;
                (scale * sinc(scale * d) * window) as f32
            })
            .collect();
        Resampler {
            from,
            to,
            reach,
            kernel,
            buffer: Vec::new(),
            base: 0,
            pushed: 0,
            next: 0,
        }
    }

    /// Where output sample `n` reads the input, in input samples.
    fn position(&self, n: u64) -> f64 {
        let num = u128::from(n) * u128::from(self.from);
        let whole = num / u128::from(self.to);
        let rest = num % u128::from(self.to);
        whole as f64 + rest as f64 / self.to as f64
    }

    /// Takes `input` (the next samples at `from` Hz) and appends to `out`
    /// every output sample whose filter reach it completes.
    pub fn push(&mut self, input: &[f32], out: &mut Vec<f32>) {
        if self.from == self.to {
            out.extend_from_slice(input);
            self.pushed += input.len() as u64;
            return;
        }
        self.buffer.extend_from_slice(input);
        self.pushed += input.len() as u64;
        loop {
            let t = self.position(self.next);
            if (t + self.reach).floor() as u64 >= self.pushed {
                break;
            }
            out.push(self.sample_at(t));
            self.next += 1;
        }
        // Keep only what the next output sample still reaches.
        let keep_from = (self.position(self.next) - self.reach).floor().max(0.0) as u64;
        if keep_from > self.base {
            let drop = ((keep_from - self.base) as usize).min(self.buffer.len());
            self.buffer.drain(..drop);
            self.base += drop as u64;
        }
    }

    /// The input ended: appends the output samples left (the signal past
    /// its end read as zero).
    pub fn finish(&mut self, out: &mut Vec<f32>) {
        if self.from == self.to {
            return;
        }
        loop {
            let t = self.position(self.next);
            if t >= self.pushed as f64 {
                break;
            }
            out.push(self.sample_at(t));
            self.next += 1;
        }
        self.buffer.clear();
    }

    /// The band-limited input at position `t`.
    fn sample_at(&self, t: f64) -> f32 {
        let first = (t - self.reach).ceil().max(self.base as f64) as u64;
        let last = ((t + self.reach).floor() as u64).min(self.base + self.buffer.len() as u64);
        let mut sum = 0f64;
        for k in first..last {
            let d = (t - k as f64).abs() * PHASES as f64;
            let i = d as usize;
            let frac = (d - i as f64) as f32;
            let (a, b) = (self.kernel[i], self.kernel[i + 1]);
            let h = a + (b - a) * frac;
            sum += f64::from(h * self.buffer[(k - self.base) as usize]);
        }
        sum as f32
    }
}

fn sinc(x: f64) -> f64 {
    if x.abs() < 1e-12 {
        1.0
    } else {
        let px = std::f64::consts::PI * x;
        px.sin() / px
    }
}

/// The modified Bessel function of the first kind, order 0 (its power
/// series, to double precision).
fn bessel_i0(x: f64) -> f64 {
    let (mut sum, mut term, half) = (1.0, 1.0, x / 2.0);
    for k in 1..64 {
        term *= half / k as f64;
        let add = term * term;
        sum += add;
        if add < sum * 1e-17 {
            break;
        }
    }
    sum
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tone(rate: u32, hz: f64, n: usize) -> Vec<f32> {
        (0..n)
            .map(|i| (2.0 * std::f64::consts::PI * hz * i as f64 / f64::from(rate)).sin() as f32)
            .collect()
    }

    fn resample_in_pieces(from: u32, to: u32, input: &[f32], piece: usize) -> Vec<f32> {
        let mut r = Resampler::new(from, to);
        let mut out = Vec::new();
        for chunk in input.chunks(piece) {
            r.push(chunk, &mut out);
        }
        r.finish(&mut out);
        out
    }

    /// A 440 Hz and a 3 kHz tone from 44.1, 48, 22.05 and 8 kHz (up and
    /// down) come out as the same tones at 16 kHz, within 1e-3 away from
    /// the ends; the length is ceil(len * to / from); pushing the input in
    /// pieces of any size gives the same samples as all at once.
    #[test]
    fn tones_keep_their_pitch_and_shape_at_any_rate_and_piece_size() {
        for from in [44_100u32, 48_000, 22_050, 8_000, 16_000] {
            for hz in [440.0, 3_000.0] {
                let n = from as usize; // one second
                let input = tone(from, hz, n);
                let out = resample_in_pieces(from, 16_000, &input, n);
                assert_eq!(
                    out.len(),
                    (n as u64 * 16_000).div_ceil(u64::from(from)) as usize,
                    "{from} Hz"
                );
                let want = tone(16_000, hz, out.len());
                let worst = out[200..out.len() - 200]
                    .iter()
                    .zip(&want[200..])
                    .map(|(a, b)| (a - b).abs())
                    .fold(0f32, f32::max);
                assert!(worst < 1e-3, "{from} Hz, {hz} Hz tone: off by {worst}");
                for piece in [1, 7, 4096] {
                    assert_eq!(
                        resample_in_pieces(from, 16_000, &input, piece),
                        out,
                        "{from} Hz in pieces of {piece}"
                    );
                }
            }
        }
    }

    /// Above the new Nyquist rate (8 kHz) a tone is filtered out, not
    /// folded back: 12 kHz at 48 kHz leaves less than 1e-3.
    #[test]
    fn what_16_khz_cannot_carry_is_removed_not_aliased() {
        let input = tone(48_000, 12_000.0, 48_000);
        let out = resample_in_pieces(48_000, 16_000, &input, 48_000);
        let worst = out[200..out.len() - 200]
            .iter()
            .fold(0f32, |a, b| a.max(b.abs()));
        assert!(worst < 1e-3, "an aliased 4 kHz of amplitude {worst}");
    }
}
