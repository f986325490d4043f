//! A CLIP or SigLIP directory as an image embedder: its image processor
//! (`preprocessor_config.json`) and its vision tower (`config.json`,
//! `model.safetensors`), checked against each other at load (the processor
//! must make the tower's square input from any image), and image objects
//! to embeddings, each image's own error kept apart from the others'.

use std::path::Path;

use crate::LoadError;

use super::decode::{ImageError, decode};
use super::preprocess::{ImageProcessor, Size};
use super::tower::VisionTower;

/// A directory's processor and tower, loaded together.
pub struct ImageEmbedder {
    processor: ImageProcessor,
    tower: VisionTower,
}

impl ImageEmbedder {
    /// From `dir`; refused when the processor's output is not always the
    /// tower's `image_size` square (transformers would fail on, or
    /// interpolate, another size), naming both.
    pub fn load(dir: &Path) -> Result<ImageEmbedder, LoadError> {
        let processor = ImageProcessor::load(dir)?;
        let tower = VisionTower::load(dir)?;
        let side = tower.config().image_size;
        let made = processor_output(&processor);
        if made != Some((side, side)) {
            let made = match made {
                Some((w, h)) => format!("{w} x {h}"),
                None => "a size that follows each image's own".to_string(),
            };
            return Err(LoadError::Unsupported(format!(
                "{}: its image processor makes {made} pixel values, its vision tower takes {side} x {side} (image_size): set the processor's crop_size or size to {side}",
                dir.display()
            )));
        }
        Ok(ImageEmbedder { processor, tower })
    }

    pub fn tower(&self) -> &VisionTower {
        &self.tower
    }

    pub fn processor(&self) -> &ImageProcessor {
        &self.processor
    }

    /// The embeddings of the image objects `images` (their bytes, as
    /// stored), those that decode embedded together; an image that does
    /// not decode, or is larger than `max_pixels`, gets its error and
    /// leaves the others' embeddings as they would be without it.
    pub fn embed(&self, images: &[&[u8]], max_pixels: u64) -> Vec<Result<Vec<f32>, ImageError>> {
        let decoded: Vec<Result<Vec<f32>, ImageError>> = images
            .iter()
            .map(|bytes| decode(bytes, max_pixels).map(|rgb| self.processor.process(&rgb).values))
            .collect();
        let pixels: Vec<f32> = decoded
            .iter()
            .filter_map(|d| d.as_ref().ok())
            .flatten()
            .copied()
            .collect();
        let good = decoded.iter().filter(|d| d.is_ok()).count();
        let embedded = match good {
            0 => Vec::new(),
            _ => self.tower.embed(&pixels, good),
        };
        let mut rows = embedded.chunks_exact(self.tower.dim());
        decoded
            .into_iter()
            .map(|d| d.map(|_| rows.next().map(<[f32]>::to_vec).unwrap_or_default()))
            .collect()
    }
}

/// The (width, height) `processor` makes of every image, or `None` when it
/// depends on the image (no crop and a shortest-edge resize, or no resize).
fn processor_output(processor: &ImageProcessor) -> Option<(usize, usize)> {
    if processor.do_center_crop
        && let Some(Size::HeightWidth { height, width }) = processor.crop_size
    {
        return Some((width, height));
    }
    match processor.size {
        Size::HeightWidth { height, width } if processor.do_resize => Some((width, height)),
        _ => None,
    }
}
