//! What turns an image object into a vision model's input: `decode` (the
//! bytes to 8-bit RGB as transformers' `load_image` makes it, a bomb
//! refused from its header), `resample` (Pillow's resize, to the bit) and
//! `preprocess` (the image processor's resize, crop, rescale and normalize
//! from `preprocessor_config.json`). Held to transformers' PIL backend by
//! `models/tests/image_preprocess.rs`.

pub mod decode;
pub mod embedder;
pub mod preprocess;
pub mod resample;
pub mod tower;

pub use decode::{ImageError, decode};
pub use embedder::ImageEmbedder;
pub use preprocess::{ImageProcessor, PixelValues};
pub use resample::{Filter, Rgb8};
pub use tower::{Family, VisionTower};
