//! CLIP's and SigLIP's vision towers against transformers'
//! `get_image_features` (`tests/fixtures/vision/embeddings.json`, made by
//! `tests/fixtures/make/vision_towers.py`): random-weight models of two
//! shapes per family (quick_gelu and erf GELU CLIPs, one stored in f16; two
//! SigLIPs with their attention-pooling heads, one stored in bf16), four PNG
//! fixture images each, decoded and preprocessed by sluice from the
//! directory's `preprocessor_config.json` (bit-exact to transformers for
//! PNG: `image_preprocess.rs`), embedded together in one batch. Each
//! embedding is held within 1e-5 of the reference (relative to its largest
//! value; the closest two images of a model differ by about 1.0), and an
//! image embedded alone gives what it gives in the batch.

#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;

use serde::Deserialize;
use sluice_models::image::{Family, ImageEmbedder, ImageProcessor, VisionTower, decode};

#[derive(Deserialize)]
struct Reference {
    models: BTreeMap<String, Model>,
}

#[derive(Deserialize)]
struct Model {
    images: Vec<String>,
    embeddings: Vec<Vec<f32>>,
}

#[test]
fn clip_and_siglip_towers_embed_images_as_transformers_does() {
    let reference: Reference = common::fixture("vision/embeddings.json").unwrap();
    assert_eq!(reference.models.len(), 4);
    let mut report = Vec::new();
    for (name, want) in &reference.models {
        let dir = common::repo_root().join("tests/fixtures/vision").join(name);
        let tower = VisionTower::load(&dir).unwrap();
        let family = match name.starts_with("clip") {
            true => Family::Clip,
            false => Family::Siglip,
        };
        assert_eq!(tower.family(), family, "{name}");
        let processor = ImageProcessor::load(&dir).unwrap();
        let pixels: Vec<f32> = want
            .images
            .iter()
            .flat_map(|image| {
                let path = common::repo_root().join(format!("tests/fixtures/images/{image}.png"));
                let rgb = decode(&std::fs::read(path).unwrap(), 100_000_000).unwrap();
                processor.process(&rgb).values
            })
            .collect();
        let images = want.images.len();
        let got = tower.embed(&pixels, images);
        assert_eq!(got.len(), images * tower.dim(), "{name}");
        let mut worst = 0f32;
        for (i, expected) in want.embeddings.iter().enumerate() {
            let row = &got[i * tower.dim()..(i + 1) * tower.dim()];
            let scale = expected.iter().fold(0f32, |m, v| m.max(v.abs()));
            let diff = row
                .iter()
                .zip(expected)
                .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
            worst = worst.max(diff / scale);
            assert!(
                diff <= 1e-5 * scale,
                "{name} image {}: off by {diff} (largest value {scale})\n got {row:?}\nwant {expected:?}",
                want.images[i]
            );
        }
        // The second image alone: each image attends only to itself.
        let per_image = tower.pixels_per_image();
        let alone = tower.embed(&pixels[per_image..2 * per_image], 1);
        let in_batch = &got[tower.dim()..2 * tower.dim()];
        let apart = alone
            .iter()
            .zip(in_batch)
            .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
        assert!(
            apart <= 1e-6,
            "{name}: alone and in a batch differ by {apart}"
        );
        report.push(format!("{name} {worst:.2e}"));
    }
    eprintln!("largest relative difference: {}", report.join(", "));
}

#[test]
fn a_vision_config_sluice_would_answer_differently_is_refused_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let source = common::repo_root().join("tests/fixtures/vision/siglip-tanh");
    let mut config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(source.join("config.json")).unwrap()).unwrap();
    std::fs::copy(
        source.join("model.safetensors"),
        dir.path().join("model.safetensors"),
    )
    .unwrap();
    let refused = |config: &serde_json::Value| {
        std::fs::write(
            dir.path().join("config.json"),
            serde_json::to_vec(config).unwrap(),
        )
        .unwrap();
        match VisionTower::load(dir.path()) {
            Ok(_) => panic!("loaded {config}"),
            Err(e) => e.to_string(),
        }
    };
    config["vision_config"]["hidden_act"] = "relu".into();
    let e = refused(&config);
    assert!(e.contains("hidden_act \"relu\""), "{e}");
    config["vision_config"]["hidden_act"] = "gelu_pytorch_tanh".into();
    config["vision_config"]["vision_use_head"] = false.into();
    let e = refused(&config);
    assert!(e.contains("vision_use_head false"), "{e}");
    config["model_type"] = "blip".into();
    let e = refused(&config);
    assert!(e.contains("model_type \"blip\""), "{e}");
}

#[test]
fn an_embedder_embeds_image_objects_and_a_bad_one_fails_alone() {
    let reference: Reference = common::fixture("vision/embeddings.json").unwrap();
    let want = &reference.models["clip-quick-gelu"];
    let dir = common::repo_root().join("tests/fixtures/vision/clip-quick-gelu");
    let embedder = ImageEmbedder::load(&dir).unwrap();
    let files: Vec<Vec<u8>> = want
        .images
        .iter()
        .map(|image| {
            std::fs::read(common::repo_root().join(format!("tests/fixtures/images/{image}.png")))
                .unwrap()
        })
        .collect();
    let pdf = b"%PDF-1.7 not an image".to_vec();
    let objects: Vec<&[u8]> = vec![&files[0], &pdf, &files[1], &files[2], &files[3]];
    let got = embedder.embed(&objects, 100_000_000);
    assert_eq!(got.len(), 5);
    let e = got[1].as_ref().unwrap_err().to_string();
    assert!(e.contains("not an image: a PDF document"), "{e}");
    let embedded: Vec<&Vec<f32>> = got.iter().filter_map(|r| r.as_ref().ok()).collect();
    for (row, expected) in embedded.iter().zip(&want.embeddings) {
        let scale = expected.iter().fold(0f32, |m, v| m.max(v.abs()));
        let diff = row
            .iter()
            .zip(expected)
            .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
        assert!(diff <= 1e-5 * scale, "off by {diff}");
    }
    // Past the pixel cap: refused, the batch of none embedded.
    let got = embedder.embed(&objects[..2], 1000);
    let e = got[0].as_ref().unwrap_err().to_string();
    assert!(e.contains("--max-image-pixels"), "{e}");
    assert!(got[1].is_err());
}

#[test]
fn a_processor_that_does_not_make_the_towers_input_is_refused_at_load() {
    let dir = tempfile::tempdir().unwrap();
    let source = common::repo_root().join("tests/fixtures/vision/clip-quick-gelu");
    for file in ["config.json", "model.safetensors"] {
        std::fs::copy(source.join(file), dir.path().join(file)).unwrap();
    }
    let mut processor: serde_json::Value =
        serde_json::from_slice(&std::fs::read(source.join("preprocessor_config.json")).unwrap())
            .unwrap();
    processor["crop_size"] = serde_json::json!({"height": 48, "width": 48});
    std::fs::write(
        dir.path().join("preprocessor_config.json"),
        serde_json::to_vec(&processor).unwrap(),
    )
    .unwrap();
    let e = match ImageEmbedder::load(dir.path()) {
        Ok(_) => panic!("loaded a 48 x 48 processor for a 32 x 32 tower"),
        Err(e) => e.to_string(),
    };
    assert!(
        e.contains("makes 48 x 48 pixel values, its vision tower takes 32 x 32"),
        "{e}"
    );
    processor["do_center_crop"] = false.into();
    std::fs::write(
        dir.path().join("preprocessor_config.json"),
        serde_json::to_vec(&processor).unwrap(),
    )
    .unwrap();
    let e = match ImageEmbedder::load(dir.path()) {
        Ok(_) => panic!("loaded a shortest-edge processor without a crop"),
        Err(e) => e.to_string(),
    };
    assert!(e.contains("a size that follows each image's own"), "{e}");
}
