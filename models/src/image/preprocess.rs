//! A vision model's input from an RGB image, as transformers' image
//! processors make it with their PIL backend (`CLIPImageProcessor`,
//! `SiglipImageProcessor` and their kin, from `preprocessor_config.json`):
//! resize (to the shortest edge, keeping the aspect, or to a fixed size)
//! with Pillow's filter ([`super::resample`]), center crop (padding with
//! black where the image is smaller), rescale (`u8 as f64 * factor`, then
//! f32) and normalize (`(x - mean) / std` in f32), channels first. Each step
//! in the reference's arithmetic, so the pixel values are its own to the
//! bit.

use std::path::Path;

use serde::Deserialize;

use super::resample::{Filter, Rgb8};
use crate::error::LoadError;

/// `size` / `crop_size` as the config writes them.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(untagged)]
pub enum Size {
    ShortestEdge {
        shortest_edge: usize,
    },
    HeightWidth {
        height: usize,
        width: usize,
    },
    /// A plain number, as older configs write it (openai's CLIP
    /// directories): what it means depends on the processor
    /// ([`ImageProcessor::settled`]).
    Number(usize),
}

/// What `preprocessor_config.json` says, of what sluice runs.
#[derive(Debug, Clone, Deserialize)]
pub struct ImageProcessor {
    #[serde(default = "yes")]
    pub do_resize: bool,
    pub size: Size,
    /// Pillow's filter number (2 bilinear, 3 bicubic).
    #[serde(default = "bicubic")]
    pub resample: u32,
    #[serde(default)]
    pub do_center_crop: bool,
    pub crop_size: Option<Size>,
    #[serde(default = "yes")]
    pub do_rescale: bool,
    #[serde(default = "one_255th")]
    pub rescale_factor: f64,
    #[serde(default = "yes")]
    pub do_normalize: bool,
    pub image_mean: Option<[f64; 3]>,
    pub image_std: Option<[f64; 3]>,
    /// `CLIPImageProcessor`, `SiglipImageProcessor`, ...
    #[serde(default)]
    pub image_processor_type: Option<String>,
}

fn yes() -> bool {
    true
}

fn bicubic() -> u32 {
    3
}

fn one_255th() -> f64 {
    1.0 / 255.0
}

/// The processed image: `[3, height, width]`, channels first.
#[derive(Debug, Clone, PartialEq)]
pub struct PixelValues {
    pub height: usize,
    pub width: usize,
    pub values: Vec<f32>,
}

impl ImageProcessor {
    /// From `dir/preprocessor_config.json` (or transformers 5's
    /// `processor_config.json`, whose `image_processor` it is); what sluice
    /// does not run (a filter other than bilinear and bicubic, a crop
    /// without its size) refused naming the field.
    pub fn load(dir: &Path) -> Result<ImageProcessor, LoadError> {
        let (path, value) = ["preprocessor_config.json", "processor_config.json"]
            .iter()
            .map(|f| dir.join(f))
            .find(|p| p.is_file())
            .map(|p| {
                let text = std::fs::read_to_string(&p).map_err(|source| LoadError::Read {
                    path: p.clone(),
                    source,
                })?;
                let value: serde_json::Value =
                    serde_json::from_str(&text).map_err(|e| LoadError::Unsupported(format!("{}: {e}", p.display())))?;
                Ok::<_, LoadError>((p, value))
            })
            .transpose()?
            .ok_or_else(|| {
                LoadError::Unsupported(format!(
                    "{}: no preprocessor_config.json (or processor_config.json): the image processor's settings",
                    dir.display()
                ))
            })?;
        let settings = value.get("image_processor").cloned().unwrap_or(value);
        let processor: ImageProcessor = serde_json::from_value(settings)
            .map(ImageProcessor::settled)
            .map_err(|e| LoadError::Unsupported(format!("{}: {e}", path.display())))?;
        processor
            .check()
            .map_err(|m| LoadError::Unsupported(format!("{}: {m}", path.display())))?;
        Ok(processor)
    }

    /// Plain-number sizes read as transformers reads them
    /// (`get_size_dict`): `size` is the shortest edge for CLIP's processor
    /// (`default_to_square=False`), a square for the others; `crop_size`
    /// always a square.
    pub fn settled(mut self) -> ImageProcessor {
        let clip = self
            .image_processor_type
            .as_deref()
            .is_some_and(|t| t.starts_with("CLIPImageProcessor"));
        if let Size::Number(n) = self.size {
            self.size = match clip {
                true => Size::ShortestEdge { shortest_edge: n },
                false => Size::HeightWidth {
                    height: n,
                    width: n,
                },
            };
        }
        if let Some(Size::Number(n)) = self.crop_size {
            self.crop_size = Some(Size::HeightWidth {
                height: n,
                width: n,
            });
        }
        self
    }

    /// Why sluice cannot run these settings, if it cannot.
    pub fn check(&self) -> Result<(), String> {
        if self.do_resize && Filter::from_pil(self.resample).is_none() {
            return Err(format!(
                "resample {}: only 2 (bilinear) and 3 (bicubic) are supported",
                self.resample
            ));
        }
        if self.do_center_crop && !matches!(self.crop_size, Some(Size::HeightWidth { .. })) {
            return Err("do_center_crop without a crop_size of height and width".into());
        }
        if self.do_normalize && (self.image_mean.is_none() || self.image_std.is_none()) {
            return Err("do_normalize without image_mean and image_std".into());
        }
        Ok(())
    }

    /// The size (width, height) the resize makes of a `width` x `height`
    /// image (transformers' `get_resize_output_image_size`).
    pub fn resized_size(&self, width: usize, height: usize) -> (usize, usize) {
        match self.size {
            Size::HeightWidth { height, width } => (width, height),
            // Not settled: a square, as transformers' default.
            Size::Number(n) => (n, n),
            Size::ShortestEdge { shortest_edge } => {
                let (short, long) = if width <= height {
                    (width, height)
                } else {
                    (height, width)
                };
                // int(requested * long / short), in Python's floats.
                let new_long = (shortest_edge as f64 * long as f64 / short as f64) as usize;
                if width <= height {
                    (shortest_edge, new_long)
                } else {
                    (new_long, shortest_edge)
                }
            }
        }
    }

    /// The model's input from `image`.
    pub fn process(&self, image: &Rgb8) -> PixelValues {
        let mut image = if self.do_resize {
            let (w, h) = self.resized_size(image.width, image.height);
            let filter = Filter::from_pil(self.resample).unwrap_or(Filter::Bicubic);
            image.resized(w.max(1), h.max(1), filter)
        } else {
            image.clone()
        };
        if self.do_center_crop
            && let Some(Size::HeightWidth { height, width }) = self.crop_size
        {
            image = center_crop(&image, width, height);
        }
        let (w, h) = (image.width, image.height);
        let mut values = vec![0f32; 3 * w * h];
        let mean = self.image_mean.unwrap_or([0.0; 3]).map(|m| m as f32);
        let std = self.image_std.unwrap_or([1.0; 3]).map(|s| s as f32);
        for (i, pixel) in image.pixels.chunks_exact(3).enumerate() {
            for c in 0..3 {
                let mut x = f64::from(pixel[c]);
                if self.do_rescale {
                    x *= self.rescale_factor;
                }
                let mut x = x as f32;
                if self.do_normalize {
                    x = (x - mean[c]) / std[c];
                }
                values[c * w * h + i] = x;
            }
        }
        PixelValues {
            height: h,
            width: w,
            values,
        }
    }
}

/// transformers' `center_crop`: the `width` x `height` window at the
/// image's center (offsets rounded down), the image first padded with
/// black to at least that size (centered, the odd pixel after).
pub fn center_crop(image: &Rgb8, width: usize, height: usize) -> Rgb8 {
    let (ow, oh) = (image.width as i64, image.height as i64);
    let (cw, ch) = (width as i64, height as i64);
    let top = (oh - ch).div_euclid(2);
    let left = (ow - cw).div_euclid(2);
    if top >= 0 && left >= 0 {
        return image.cropped(left as usize, top as usize, width, height);
    }
    let (nw, nh) = (cw.max(ow), ch.max(oh));
    let (top_pad, left_pad) = ((nh - oh + 1) / 2, (nw - ow + 1) / 2);
    let (top, left) = (top + top_pad, left + left_pad);
    let (y0, y1) = (top.max(0), (top + ch).min(nh));
    let (x0, x1) = (left.max(0), (left + cw).min(nw));
    let (w, h) = ((x1 - x0) as usize, (y1 - y0) as usize);
    let mut pixels = vec![0u8; w * h * 3];
    for y in 0..h as i64 {
        // The canvas row y0 + y holds the image's row y0 + y - top_pad.
        let sy = y0 + y - top_pad;
        if !(0..oh).contains(&sy) {
            continue;
        }
        for x in 0..w as i64 {
            let sx = x0 + x - left_pad;
            if !(0..ow).contains(&sx) {
                continue;
            }
            let src = ((sy * ow + sx) * 3) as usize;
            let dst = ((y * w as i64 + x) * 3) as usize;
            pixels[dst..dst + 3].copy_from_slice(&image.pixels[src..src + 3]);
        }
    }
    Rgb8 {
        width: w,
        height: h,
        pixels,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn the_shortest_edge_takes_the_size_and_the_crop_rounds_down() {
        let clip: ImageProcessor = serde_json::from_value(serde_json::json!({
            "size": {"shortest_edge": 224}, "do_center_crop": true,
            "crop_size": {"height": 224, "width": 224},
            "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]
        }))
        .unwrap();
        assert_eq!(clip.resized_size(300, 200), (336, 224));
        assert_eq!(clip.resized_size(303, 200), (339, 224));
        assert_eq!(clip.resized_size(200, 1000), (224, 1120));
        // Older configs' plain numbers, as transformers reads them.
        let numbers = |kind: &str| -> ImageProcessor {
            serde_json::from_value::<ImageProcessor>(serde_json::json!({
                "image_processor_type": kind, "size": 224, "crop_size": 224,
                "do_center_crop": true, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]
            }))
            .unwrap()
            .settled()
        };
        let old_clip = numbers("CLIPImageProcessor");
        assert_eq!(old_clip.size, Size::ShortestEdge { shortest_edge: 224 });
        assert_eq!(
            old_clip.crop_size,
            Some(Size::HeightWidth {
                height: 224,
                width: 224
            })
        );
        assert!(old_clip.check().is_ok());
        assert_eq!(
            numbers("SiglipImageProcessor").size,
            Size::HeightWidth {
                height: 224,
                width: 224
            }
        );
        let image = Rgb8 {
            width: 5,
            height: 1,
            pixels: (0..15).collect(),
        };
        // 5 -> 2 wide: offset (5 - 2) // 2 = 1.
        assert_eq!(center_crop(&image, 2, 1).pixels, vec![3, 4, 5, 6, 7, 8]);
        // Smaller than the crop: padded, the image centered.
        let padded = center_crop(&image, 5, 3);
        assert_eq!((padded.width, padded.height), (5, 3));
        assert!(padded.pixels[..15].iter().all(|v| *v == 0));
        assert_eq!(&padded.pixels[15..30], &image.pixels[..]);
    }
}
