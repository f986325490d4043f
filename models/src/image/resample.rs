//! Pillow's resize of an 8-bit RGB image (`Image.resize` with a
//! resampling filter, no reducing gap; its `Resample.c`), to the bit: what
//! transformers' image processors run on a PIL image, so the pixels sluice
//! feeds a vision model are the reference's. Two separable passes,
//! horizontal then vertical, each output pixel a weighted sum of the
//! inputs under the filter stretched by the downscale factor; the weights
//! normalized in f64, then held in fixed point (22 fractional bits) and
//! summed in integers; each pass rounds and clips to 8 bits. Pillow 13
//! runs the vertical pass first where its kernel is the wider of the two
//! (more source rows per output row than source columns per output
//! column): found against Pillow on 25 shapes up, down and across, each
//! order matching it only where this rule picks it.

/// Pillow's fixed-point precision of a weight.
const PRECISION_BITS: u32 = 32 - 8 - 2;

/// A resampling filter: its kernel and support (in source pixels at scale 1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Filter {
    /// `PIL.Image.BICUBIC` (3): the cubic convolution with a = -0.5.
    Bicubic,
    /// `PIL.Image.BILINEAR` (2): the triangle.
    Bilinear,
}

impl Filter {
    /// The filter transformers' `resample` number names, if sluice runs it.
    pub fn from_pil(resample: u32) -> Option<Filter> {
        match resample {
            2 => Some(Filter::Bilinear),
            3 => Some(Filter::Bicubic),
            _ => None,
        }
    }

    fn support(self) -> f64 {
        match self {
            Filter::Bicubic => 2.0,
            Filter::Bilinear => 1.0,
        }
    }

    fn weight(self, x: f64) -> f64 {
        let x = x.abs();
        match self {
            Filter::Bicubic => {
                const A: f64 = -0.5;
                if x < 1.0 {
                    ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0
                } else if x < 2.0 {
                    (((x - 5.0) * x + 8.0) * x - 4.0) * A
                } else {
                    0.0
                }
            }
            Filter::Bilinear => {
                if x < 1.0 {
                    1.0 - x
                } else {
                    0.0
                }
            }
        }
    }
}

/// Pillow's `ksize`: the most weights an output position can have.
fn kernel_size(input: usize, output: usize, filter: Filter) -> usize {
    let filterscale = (input as f64 / output as f64).max(1.0);
    (filter.support() * filterscale).ceil() as usize * 2 + 1
}

/// Each output position's first input and its fixed-point weights over
/// the inputs from there.
struct Coefficients {
    first: Vec<usize>,
    weights: Vec<Vec<i32>>,
}

/// Pillow's `precompute_coeffs` and `normalize_coeffs_8bpc` for `input`
/// positions to `output`.
fn coefficients(input: usize, output: usize, filter: Filter) -> Coefficients {
    let scale = input as f64 / output as f64;
    let filterscale = scale.max(1.0);
    let support = filter.support() * filterscale;
    let mut first = Vec::with_capacity(output);
    let mut weights = Vec::with_capacity(output);
    for xx in 0..output {
        let center = (xx as f64 + 0.5) * scale;
        let ss = 1.0 / filterscale;
        // Pillow rounds with a cast toward zero, then clamps.
        let xmin = ((center - support + 0.5) as i64).max(0) as usize;
        let xmax = ((center + support + 0.5) as i64).min(input as i64) as usize;
        let count = xmax.saturating_sub(xmin);
        let raw: Vec<f64> = (0..count)
            .map(|x| filter.weight((x as f64 + xmin as f64 - center + 0.5) * ss))
            .collect();
        let total: f64 = raw.iter().sum();
        let fixed = raw
            .iter()
            .map(|w| {
                let w = if total != 0.0 { w / total } else { *w };
                let scaled = w * f64::from(1u32 << PRECISION_BITS);
                if w < 0.0 {
                    (-0.5 + scaled) as i32
                } else {
                    (0.5 + scaled) as i32
                }
            })
            .collect();
        first.push(xmin);
        weights.push(fixed);
    }
    Coefficients { first, weights }
}

/// Pillow's `clip8`: the fixed-point sum, rounded by the half added at the
/// start, to 0..=255.
fn clip8(sum: i64) -> u8 {
    (sum >> PRECISION_BITS).clamp(0, 255) as u8
}

/// An 8-bit RGB image, row-major, 3 bytes a pixel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rgb8 {
    pub width: usize,
    pub height: usize,
    pub pixels: Vec<u8>,
}

impl Rgb8 {
    /// `image` resized to `width` x `height` as Pillow resizes it.
    pub fn resized(&self, width: usize, height: usize, filter: Filter) -> Rgb8 {
        assert!(width > 0 && height > 0, "resize to an empty image");
        let vertical_first = width != self.width
            && height != self.height
            && kernel_size(self.height, height, filter) > kernel_size(self.width, width, filter);
        if vertical_first {
            // The same two passes in the other order: on the transposed
            // image, its rows are the columns.
            return self
                .transposed()
                .resized_across_first(height, width, filter)
                .transposed();
        }
        self.resized_across_first(width, height, filter)
    }

    /// Rows become columns.
    fn transposed(&self) -> Rgb8 {
        let mut pixels = vec![0u8; self.pixels.len()];
        for y in 0..self.height {
            for x in 0..self.width {
                let (from, to) = ((y * self.width + x) * 3, (x * self.height + y) * 3);
                pixels[to..to + 3].copy_from_slice(&self.pixels[from..from + 3]);
            }
        }
        Rgb8 {
            width: self.height,
            height: self.width,
            pixels,
        }
    }

    /// The horizontal pass, then the vertical one.
    fn resized_across_first(&self, width: usize, height: usize, filter: Filter) -> Rgb8 {
        let horizontal = width != self.width;
        let vertical = height != self.height;
        let columns = coefficients(self.width, width, filter);
        let rows = coefficients(self.height, height, filter);
        let half = 1i64 << (PRECISION_BITS - 1);
        // The horizontal pass, on the source rows the vertical one reads.
        let (first_row, last_row) = match vertical {
            true => (
                rows.first[0],
                rows.first[height - 1] + rows.weights[height - 1].len(),
            ),
            false => (0, self.height),
        };
        let across = if horizontal {
            let mut out = vec![0u8; (last_row - first_row) * width * 3];
            for (y, dst) in (first_row..last_row).zip(out.chunks_exact_mut(width * 3)) {
                let src = &self.pixels[y * self.width * 3..(y + 1) * self.width * 3];
                for (xx, pixel) in dst.chunks_exact_mut(3).enumerate() {
                    let (x0, k) = (columns.first[xx], &columns.weights[xx]);
                    let mut sums = [half; 3];
                    for (i, w) in k.iter().enumerate() {
                        let at = (x0 + i) * 3;
                        for (c, sum) in sums.iter_mut().enumerate() {
                            *sum += i64::from(src[at + c]) * i64::from(*w);
                        }
                    }
                    for (p, sum) in pixel.iter_mut().zip(sums) {
                        *p = clip8(sum);
                    }
                }
            }
            Rgb8 {
                width,
                height: last_row - first_row,
                pixels: out,
            }
        } else {
            Rgb8 {
                width: self.width,
                height: last_row - first_row,
                pixels: self.pixels[first_row * self.width * 3..last_row * self.width * 3].to_vec(),
            }
        };
        if !vertical {
            return across;
        }
        let mut out = vec![0u8; width * height * 3];
        for (yy, dst) in out.chunks_exact_mut(width * 3).enumerate() {
            let (y0, k) = (rows.first[yy] - first_row, &rows.weights[yy]);
            for (x, pixel) in dst.chunks_exact_mut(3).enumerate() {
                let mut sums = [half; 3];
                for (i, w) in k.iter().enumerate() {
                    let at = ((y0 + i) * width + x) * 3;
                    for (c, sum) in sums.iter_mut().enumerate() {
                        *sum += i64::from(across.pixels[at + c]) * i64::from(*w);
                    }
                }
                for (p, sum) in pixel.iter_mut().zip(sums) {
                    *p = clip8(sum);
                }
            }
        }
        Rgb8 {
            width,
            height,
            pixels: out,
        }
    }

    /// The `width` x `height` window at (`left`, `top`), which must lie
    /// inside the image.
    pub fn cropped(&self, left: usize, top: usize, width: usize, height: usize) -> Rgb8 {
        assert!(left + width <= self.width && top + height <= self.height);
        let mut pixels = Vec::with_capacity(width * height * 3);
        for y in top..top + height {
            let row = (y * self.width + left) * 3;
            pixels.extend_from_slice(&self.pixels[row..row + width * 3]);
        }
        Rgb8 {
            width,
            height,
            pixels,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weights_sum_to_one_in_fixed_point_and_a_same_size_resize_is_a_copy() {
        for (input, output) in [(10, 3), (3, 10), (224, 224), (1000, 224), (7, 1)] {
            let c = coefficients(input, output, Filter::Bicubic);
            for k in &c.weights {
                let sum: i64 = k.iter().map(|w| i64::from(*w)).sum();
                assert!(
                    (sum - (1 << PRECISION_BITS)).abs() <= k.len() as i64,
                    "{input}->{output}: {sum}"
                );
            }
        }
        let image = Rgb8 {
            width: 3,
            height: 2,
            pixels: (0..18).map(|v| v * 13).collect(),
        };
        assert_eq!(image.resized(3, 2, Filter::Bicubic), image);
        // A flat image stays flat at any size.
        let flat = Rgb8 {
            width: 5,
            height: 4,
            pixels: [10u8, 200, 77].repeat(20),
        };
        let big = flat.resized(13, 9, Filter::Bicubic);
        assert!(big.pixels.chunks_exact(3).all(|p| p == [10, 200, 77]));
        let small = flat.resized(2, 3, Filter::Bicubic);
        assert!(small.pixels.chunks_exact(3).all(|p| p == [10, 200, 77]));
    }
}
