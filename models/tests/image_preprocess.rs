//! Image decoding and preprocessing against transformers' `load_image` and
//! its PIL-backend image processors (`tests/fixtures/images.json`, made by
//! `tests/fixtures/make/images.py` from the 31 images of
//! `tests/fixtures/images/`: PNG in RGB, RGBA, grey, grey with alpha and
//! palette modes; JPEG, one with an EXIF orientation; WebP lossless and
//! lossy; GIF; BMP; sizes from 37 x 23 to 500 x 30). For each image the
//! decoded RGB and, for CLIP's two shapes and SigLIP's, the pixel values
//! compared by SHA-256: equal to the bit, but for JPEG. A JPEG's pixels
//! are the `image` crate's decoder's (zune-jpeg), not libjpeg-turbo's,
//! whose IDCT and chroma upsampling round differently by a few levels: its
//! processed values are held within 4 levels at the fixture's samples (in
//! normalized units, 4 / 255 / the smallest std), the largest printed.

#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;

use serde::Deserialize;
use sha2::{Digest, Sha256};
use sluice_models::image::{ImageProcessor, decode};

#[derive(Deserialize)]
struct Reference {
    processors: BTreeMap<String, serde_json::Value>,
    images: Vec<Image>,
}

#[derive(Deserialize)]
struct Image {
    file: String,
    width: usize,
    height: usize,
    rgb_sha256: String,
    processed: BTreeMap<String, Processed>,
}

#[derive(Deserialize)]
struct Processed {
    shape: Vec<usize>,
    sha256: String,
    samples: Vec<(usize, f32)>,
}

fn sha256(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[test]
fn images_decode_and_preprocess_as_transformers_pil_backend_does() {
    let reference: Reference = common::fixture("images.json").unwrap();
    let processors: BTreeMap<&str, ImageProcessor> = reference
        .processors
        .iter()
        .map(|(name, config)| {
            (
                name.as_str(),
                serde_json::from_value(config.clone()).unwrap(),
            )
        })
        .collect();
    let mut failures = Vec::new();
    let (mut jpeg_worst, mut jpegs) = (0f32, 0);
    for image in &reference.images {
        let jpeg = image.file.ends_with(".jpg");
        let bytes = std::fs::read(common::repo_root().join(&image.file)).unwrap();
        let rgb = decode(&bytes, 100_000_000).unwrap();
        assert_eq!(
            (rgb.width, rgb.height),
            (image.width, image.height),
            "{}",
            image.file
        );
        let decoded_same = sha256(&rgb.pixels) == image.rgb_sha256;
        if !decoded_same && !jpeg {
            failures.push(format!("{}: decoded RGB differs", image.file));
        }
        jpegs += usize::from(jpeg);
        for (name, want) in &image.processed {
            let got = processors[name.as_str()].process(&rgb);
            assert_eq!(
                vec![3, got.height, got.width],
                want.shape,
                "{} {name}",
                image.file
            );
            let bytes: Vec<u8> = got.values.iter().flat_map(|v| v.to_le_bytes()).collect();
            let worst = want
                .samples
                .iter()
                .map(|(i, v)| (got.values[*i] - v).abs())
                .fold(0f32, f32::max);
            if jpeg {
                jpeg_worst = jpeg_worst.max(worst);
                continue;
            }
            if sha256(&bytes) != want.sha256 {
                failures.push(format!(
                    "{} {name}: pixel values differ (decoded the same: {decoded_same}; largest difference at the samples {worst:e})",
                    image.file
                ));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} differences:\n{}",
        failures.len(),
        failures.join("\n")
    );
    // 4 levels of 255 over the smallest std of the three processors
    // (CLIP's 0.2613).
    let bound = 4.0 / 255.0 / 0.2613;
    eprintln!(
        "{} images bit-exact; {jpegs} JPEGs within {jpeg_worst:.4} of the reference at the samples (bound {bound:.4})",
        reference.images.len() - jpegs
    );
    assert!(jpeg_worst <= bound, "a JPEG's values are {jpeg_worst} off");
}
