//! The `.npy` format (version 1.0) for float32 matrices, as `numpy.load` reads it.

/// Encodes `rows` (each of length `dim`) as a little-endian float32 array of
/// shape `[rows, dim]`.
pub fn encode_f32(rows: &[Vec<f32>], dim: usize) -> Vec<u8> {
    let mut out = header(&format!("({}, {})", rows.len(), dim), rows.len() * dim);
    for row in rows {
        debug_assert_eq!(row.len(), dim);
        for v in row {
            out.extend_from_slice(&v.to_le_bytes());
        }
    }
    out
}

/// Encodes `values` as a little-endian float32 array of shape `[len]`.
pub fn encode_f32_vector(values: &[f32]) -> Vec<u8> {
    let mut out = header(&format!("({},)", values.len()), values.len());
    for v in values {
        out.extend_from_slice(&v.to_le_bytes());
    }
    out
}

/// The file's header for a float32 array of `shape` (a Python tuple), with
/// room for its `values`.
fn header(shape: &str, values: usize) -> Vec<u8> {
    let dict = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': {shape}, }}");
    // Magic (6) + version (2) + header length (2) + dict + padding + '\n' is a
    // multiple of 64.
    let unpadded = 10 + dict.len() + 1;
    let padding = (64 - unpadded % 64) % 64;
    let header_len = dict.len() + padding + 1;
    let mut out = Vec::with_capacity(10 + header_len + values * 4);
    out.extend_from_slice(b"\x93NUMPY\x01\x00");
    out.extend_from_slice(&(header_len as u16).to_le_bytes());
    out.extend_from_slice(dict.as_bytes());
    out.resize(out.len() + padding, b' ');
    out.push(b'\n');
    out
}

/// Decodes what [`encode_f32`] wrote: `(rows, dim, values)`; a vector
/// ([`encode_f32_vector`]) reads as `dim` 1.
pub fn decode_f32(bytes: &[u8]) -> Result<(usize, usize, Vec<f32>), String> {
    if bytes.len() < 10 || &bytes[..8] != b"\x93NUMPY\x01\x00" {
        return Err("not a version 1.0 .npy file".into());
    }
    let header_len = u16::from_le_bytes([bytes[8], bytes[9]]) as usize;
    let header = std::str::from_utf8(bytes.get(10..10 + header_len).ok_or("short header")?)
        .map_err(|_| "header is not UTF-8")?;
    if !header.contains("'descr': '<f4'") || !header.contains("'fortran_order': False") {
        return Err(format!("unsupported header {header}"));
    }
    let shape = header
        .split("'shape': (")
        .nth(1)
        .and_then(|s| s.split(')').next())
        .ok_or("no shape")?;
    let dims: Vec<usize> = shape
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.parse::<usize>().map_err(|e| e.to_string()))
        .collect::<Result<_, _>>()?;
    let (rows, dim) = match dims[..] {
        [rows, dim] => (rows, dim),
        [rows] => (rows, 1),
        _ => return Err(format!("expected 1 or 2 dimensions, found {dims:?}")),
    };
    let data = &bytes[10 + header_len..];
    if data.len() != rows * dim * 4 {
        return Err(format!(
            "{} data bytes for shape ({rows}, {dim})",
            data.len()
        ));
    }
    let values = data
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    Ok((rows, dim, values))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn round_trip_and_alignment() {
        for n in [0usize, 1, 3, 1000] {
            let rows: Vec<Vec<f32>> = (0..n).map(|i| vec![i as f32, -0.5, 1e-3]).collect();
            let bytes = encode_f32(&rows, 3);
            let header_len = u16::from_le_bytes([bytes[8], bytes[9]]) as usize;
            assert_eq!((10 + header_len) % 64, 0);
            let (r, d, v) = decode_f32(&bytes).unwrap();
            assert_eq!((r, d), (n, 3));
            assert_eq!(v, rows.concat());
            let scores: Vec<f32> = (0..n).map(|i| i as f32 * 0.25 - 1.0).collect();
            let bytes = encode_f32_vector(&scores);
            let header_len = u16::from_le_bytes([bytes[8], bytes[9]]) as usize;
            assert_eq!((10 + header_len) % 64, 0);
            let header = std::str::from_utf8(&bytes[10..10 + header_len]).unwrap();
            assert!(header.contains(&format!("'shape': ({n},)")), "{header}");
            assert_eq!(decode_f32(&bytes).unwrap(), (n, 1, scores));
        }
    }
}
