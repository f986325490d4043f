//! An image object's bytes to 8-bit RGB, as transformers' `load_image`
//! makes it (PIL's `open`, `ImageOps.exif_transpose`, `convert("RGB")`): JPEG,
//! PNG, WebP, GIF (its first frame) and BMP decoded by the `image` crate,
//! the EXIF orientation applied, grey replicated and alpha dropped (not
//! blended, as PIL's conversion does). The size is read from the header
//! and refused past the caller's pixel limit before anything is decoded
//! (a decompression bomb: a 50,000 x 50,000 PNG of a few KB), and what is
//! not an image, or is damaged, is an error naming what was seen.

use std::io::Cursor;

use image::{ImageDecoder, ImageFormat, ImageReader};

use super::resample::Rgb8;

/// Why an image could not be read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ImageError {
    #[error("the image is empty (0 bytes)")]
    Empty,
    #[error("not an image: {seen}; sluice reads {SUPPORTED}")]
    NotAnImage { seen: String },
    #[error("{format} images are not read; sluice reads {SUPPORTED}")]
    Unsupported { format: String },
    #[error(
        "the image is {width} x {height} pixels ({} million), more than the {} million allowed (--max-image-pixels)",
        width * height / 1_000_000,
        max_pixels / 1_000_000
    )]
    TooLarge {
        width: u64,
        height: u64,
        max_pixels: u64,
    },
    #[error("the {format} image is damaged or truncated: {detail}")]
    Damaged { format: String, detail: String },
}

/// What [`decode`] reads.
pub const SUPPORTED: &str = "JPEG, PNG, WebP, GIF (its first frame) and BMP";

/// What the first bytes of something that is not an image look like.
fn seen(bytes: &[u8]) -> String {
    let starts = |sig: &[u8]| bytes.starts_with(sig);
    let name = if starts(b"%PDF") {
        "a PDF document"
    } else if starts(b"RIFF") && bytes.get(8..12) == Some(b"WAVE") {
        "a WAV recording"
    } else if starts(b"ID3") || starts(&[0xFF, 0xFB]) {
        "an MP3 recording"
    } else if starts(b"fLaC") {
        "a FLAC recording"
    } else if bytes.get(4..8) == Some(b"ftyp") {
        "an MP4/HEIF container (HEIC and AVIF are not read)"
    } else if starts(b"PK\x03\x04") {
        "a ZIP archive"
    } else if bytes.iter().take(64).all(|b| b.is_ascii()) {
        "text"
    } else {
        "no known image signature"
    };
    name.to_string()
}

/// Decodes `bytes`, refusing one of more than `max_pixels` pixels from
/// its header.
pub fn decode(bytes: &[u8], max_pixels: u64) -> Result<Rgb8, ImageError> {
    if bytes.is_empty() {
        return Err(ImageError::Empty);
    }
    let reader = ImageReader::new(Cursor::new(bytes))
        .with_guessed_format()
        .map_err(|e| ImageError::NotAnImage {
            seen: e.to_string(),
        })?;
    let Some(format) = reader.format() else {
        return Err(ImageError::NotAnImage { seen: seen(bytes) });
    };
    let name = format!("{format:?}").to_uppercase();
    if !matches!(
        format,
        ImageFormat::Jpeg
            | ImageFormat::Png
            | ImageFormat::WebP
            | ImageFormat::Gif
            | ImageFormat::Bmp
    ) {
        return Err(ImageError::Unsupported { format: name });
    }
    let damaged = |e: image::ImageError| ImageError::Damaged {
        format: name.clone(),
        detail: e.to_string(),
    };
    let mut decoder = reader.into_decoder().map_err(damaged)?;
    let (width, height) = decoder.dimensions();
    let pixels = u64::from(width) * u64::from(height);
    if pixels > max_pixels {
        return Err(ImageError::TooLarge {
            width: width.into(),
            height: height.into(),
            max_pixels,
        });
    }
    if pixels == 0 {
        return Err(ImageError::Damaged {
            format: name,
            detail: "it has no pixels".into(),
        });
    }
    let orientation = decoder.orientation().map_err(damaged)?;
    let mut image = image::DynamicImage::from_decoder(decoder).map_err(damaged)?;
    image.apply_orientation(orientation);
    let rgb = image.to_rgb8();
    Ok(Rgb8 {
        width: rgb.width() as usize,
        height: rgb.height() as usize,
        pixels: rgb.into_raw(),
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// CRC-32 (PNG's), bit by bit.
    fn crc32(bytes: &[u8]) -> u32 {
        let mut crc = !0u32;
        for b in bytes {
            crc ^= u32::from(*b);
            for _ in 0..8 {
                crc = if crc & 1 == 1 {
                    (crc >> 1) ^ 0xEDB8_8320
                } else {
                    crc >> 1
                };
            }
        }
        !crc
    }

    fn chunk(kind: &[u8], data: &[u8]) -> Vec<u8> {
        let mut out = (data.len() as u32).to_be_bytes().to_vec();
        out.extend_from_slice(kind);
        out.extend_from_slice(data);
        let mut crc_input = kind.to_vec();
        crc_input.extend_from_slice(data);
        out.extend_from_slice(&crc32(&crc_input).to_be_bytes());
        out
    }

    /// A PNG whose header says `width` x `height` RGB, with a few bytes of
    /// (not enough) image data: what a decompression bomb's header looks
    /// like, and a truncated file.
    fn png_header(width: u32, height: u32) -> Vec<u8> {
        let mut ihdr = width.to_be_bytes().to_vec();
        ihdr.extend_from_slice(&height.to_be_bytes());
        ihdr.extend_from_slice(&[8, 2, 0, 0, 0]);
        let mut out = Vec::new();
        out.extend_from_slice(&[0x89, b'P', b'N', b'G', b'\r', b'\n', 0x1a, b'\n']);
        out.extend(chunk(b"IHDR", &ihdr));
        // zlib: a stored block of 2 bytes, then the end.
        out.extend(chunk(
            b"IDAT",
            &[0x78, 0x01, 0x01, 0x02, 0x00, 0xfd, 0xff, 0, 0],
        ));
        out.extend(chunk(b"IEND", &[]));
        out
    }

    #[test]
    fn what_is_not_an_image_or_too_large_is_refused_naming_what_was_seen() {
        assert_eq!(decode(&[], 1 << 20), Err(ImageError::Empty));
        let pdf = decode(b"%PDF-1.7 not an image", 1 << 20).unwrap_err();
        assert_eq!(
            pdf,
            ImageError::NotAnImage {
                seen: "a PDF document".into()
            }
        );
        assert!(
            pdf.to_string().contains("sluice reads JPEG, PNG, WebP"),
            "{pdf}"
        );
        let text = decode(b"hello, world", 1 << 20).unwrap_err();
        assert_eq!(
            text,
            ImageError::NotAnImage {
                seen: "text".into()
            }
        );
        let tiff = decode(b"II*\0\x08\0\0\0rest of a tiff", 1 << 20).unwrap_err();
        assert!(matches!(tiff, ImageError::Unsupported { .. }), "{tiff:?}");
        // The bomb: 50,000 x 50,000 from a header of a few dozen bytes,
        // refused before any pixel is decoded.
        let bomb = decode(&png_header(50_000, 50_000), 100_000_000).unwrap_err();
        assert_eq!(
            bomb,
            ImageError::TooLarge {
                width: 50_000,
                height: 50_000,
                max_pixels: 100_000_000
            }
        );
        assert!(bomb.to_string().contains("2500 million"), "{bomb}");
        // Within the limit but its data cut short: damaged.
        let cut = decode(&png_header(64, 64), 100_000_000).unwrap_err();
        assert!(
            matches!(cut, ImageError::Damaged { ref format, .. } if format == "PNG"),
            "{cut:?}"
        );
    }
}
