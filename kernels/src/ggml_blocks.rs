//! GGUF's block formats read into the quantized products' two packings
//! without changing a weight: Q4_0, Q4_1 and Q4_K are `d * q + m` over
//! 4-bit `q` in blocks of 32 (the Q4_1 packing, scales in f32), Q5_0 and
//! Q8_0 are `d * q` over small signed `q` (the Q8_0 packing). The layouts are
//! ggml's (`ggml-common.h`); each format is tested against its dequantized
//! values.

use crate::layout::{BLOCK, Packed};

/// The stored formats the products take as they are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoredBlocks {
    /// 18 bytes per 32: f16 `d`, 16 bytes of nibbles; `w = d (q - 8)`.
    Q4_0,
    /// 20 bytes per 32: f16 `d`, f16 `m`, 16 bytes of nibbles; `w = d q + m`.
    Q4_1,
    /// 144 bytes per 256: f16 `d` and `dmin`, 12 bytes of 6-bit sub-block
    /// scales and minimums, 128 bytes of nibbles; `w = d sc q - dmin m` per
    /// sub-block of 32.
    Q4K,
    /// 22 bytes per 32: f16 `d`, 32 high bits, 16 bytes of low nibbles;
    /// `w = d (q - 16)`.
    Q5_0,
    /// 34 bytes per 32: f16 `d`, 32 signed bytes; `w = d q`.
    Q8_0,
}

impl StoredBlocks {
    /// Values per stored block.
    pub fn block_values(self) -> usize {
        match self {
            StoredBlocks::Q4K => 256,
            _ => BLOCK,
        }
    }

    fn block_bytes(self) -> usize {
        match self {
            StoredBlocks::Q4_0 => 18,
            StoredBlocks::Q4_1 => 20,
            StoredBlocks::Q4K => 144,
            StoredBlocks::Q5_0 => 22,
            StoredBlocks::Q8_0 => 34,
        }
    }
}

fn f16(b: &[u8]) -> f32 {
    half::f16::from_le_bytes([b[0], b[1]]).to_f32()
}

/// Q4_1's packing of 32 nibble values: value `k` in byte `k`'s low half,
/// value `k + 16` in its high half.
fn pack_nibbles(q: impl Fn(usize) -> u8) -> [u8; 16] {
    std::array::from_fn(|k| (q(k) & 0x0F) | (q(k + 16) << 4))
}

/// `data` (`values` of them, whole blocks of `kind`) in the products'
/// packing; `None` when it is not whole blocks of `values`.
pub(crate) fn unpack(kind: StoredBlocks, values: usize, data: &[u8]) -> Option<Packed> {
    let per = kind.block_values();
    if !values.is_multiple_of(per) || data.len() != values / per * kind.block_bytes() {
        return None;
    }
    let blocks = data.chunks_exact(kind.block_bytes());
    let n = values / BLOCK;
    Some(match kind {
        StoredBlocks::Q4_0 | StoredBlocks::Q4_1 => {
            let (mut d, mut m, mut qs) = (
                Vec::with_capacity(n),
                Vec::with_capacity(n),
                Vec::with_capacity(n),
            );
            for b in blocks {
                let scale = f16(&b[0..2]);
                let (min, nibbles) = match kind {
                    StoredBlocks::Q4_0 => (-8.0 * scale, &b[2..18]),
                    _ => (f16(&b[2..4]), &b[4..20]),
                };
                let mut q = [0u8; 16];
                q.copy_from_slice(nibbles);
                d.push(scale);
                m.push(min);
                qs.push(q);
            }
            Packed::Q4_1 { d, m, qs }
        }
        StoredBlocks::Q4K => {
            let (mut d, mut m, mut qs) = (
                Vec::with_capacity(n),
                Vec::with_capacity(n),
                Vec::with_capacity(n),
            );
            for b in blocks {
                let (scale, min) = (f16(&b[0..2]), f16(&b[2..4]));
                let scales = &b[4..16];
                let nibbles = &b[16..144];
                for sub in 0..8 {
                    let (sc, mn) = scale_min_k4(sub, scales);
                    // Sub-blocks 2c and 2c + 1 share 32 bytes: low nibbles,
                    // then high.
                    let bytes = &nibbles[32 * (sub / 2)..32 * (sub / 2) + 32];
                    let shift = 4 * (sub % 2);
                    d.push(scale * f32::from(sc));
                    m.push(-(min * f32::from(mn)));
                    qs.push(pack_nibbles(|i| bytes[i] >> shift));
                }
            }
            Packed::Q4_1 { d, m, qs }
        }
        StoredBlocks::Q5_0 => {
            let (mut d, mut qs) = (Vec::with_capacity(n), Vec::with_capacity(n));
            for b in blocks {
                let high = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
                let low = &b[6..22];
                let mut q = [0i8; 32];
                for j in 0..16 {
                    let h0 = ((high >> j) << 4) & 0x10;
                    let h1 = (high >> (j + 12)) & 0x10;
                    q[j] = ((u32::from(low[j] & 0x0F) | h0) as i32 - 16) as i8;
                    q[j + 16] = ((u32::from(low[j] >> 4) | h1) as i32 - 16) as i8;
                }
                d.push(f16(&b[0..2]));
                qs.push(q);
            }
            Packed::Q8_0 { d, qs }
        }
        StoredBlocks::Q8_0 => {
            let (mut d, mut qs) = (Vec::with_capacity(n), Vec::with_capacity(n));
            for b in blocks {
                d.push(f16(&b[0..2]));
                qs.push(std::array::from_fn(|j| b[2 + j] as i8));
            }
            Packed::Q8_0 { d, qs }
        }
    })
}

/// Sub-block `j`'s 6-bit scale and minimum from Q4_K's 12 packed bytes
/// (ggml's `get_scale_min_k4`).
fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// The weights of a packing, as f32 (for tests and references).
pub(crate) fn dequantize(p: &Packed) -> Vec<f32> {
    match p {
        Packed::Q4_1 { d, m, qs } => qs
            .iter()
            .zip(d.iter().zip(m))
            .flat_map(|(q, (d, m))| {
                let mut v = [0f32; 32];
                for k in 0..16 {
                    v[k] = d * f32::from(q[k] & 0x0F) + m;
                    v[k + 16] = d * f32::from(q[k] >> 4) + m;
                }
                v
            })
            .collect(),
        Packed::Q8_0 { d, qs } => qs
            .iter()
            .zip(d)
            .flat_map(|(q, d)| q.map(|x| d * f32::from(x)))
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn h(v: f32) -> [u8; 2] {
        half::f16::from_f32(v).to_le_bytes()
    }

    /// Each format's blocks, written by hand from ggml's layout, read back
    /// as the values ggml's dequantization gives.
    #[test]
    fn each_stored_format_keeps_every_weight() {
        // Q4_0: d = 0.5, nibble k = k (low) and 15 - k (high).
        let mut q4_0 = h(0.5).to_vec();
        q4_0.extend((0..16u8).map(|k| k | ((15 - k) << 4)));
        let v = dequantize(&unpack(StoredBlocks::Q4_0, 32, &q4_0).unwrap());
        assert_eq!(v[3], 0.5 * (3.0 - 8.0));
        assert_eq!(v[16 + 3], 0.5 * (12.0 - 8.0));

        // Q5_0: d = 2, high bit of value j set for odd j.
        let mut q5_0 = h(2.0).to_vec();
        let high: u32 = (0..32).filter(|j| j % 2 == 1).map(|j| 1u32 << j).sum();
        q5_0.extend(high.to_le_bytes());
        q5_0.extend((0..16u8).map(|k| (k % 16) | ((15 - k) << 4)));
        let v = dequantize(&unpack(StoredBlocks::Q5_0, 32, &q5_0).unwrap());
        for j in 0..16 {
            let hi = |i: usize| if i % 2 == 1 { 16.0 } else { 0.0 };
            assert_eq!(v[j], 2.0 * (j as f32 + hi(j) - 16.0), "{j}");
            assert_eq!(
                v[j + 16],
                2.0 * ((15 - j) as f32 + hi(j + 16) - 16.0),
                "{j}"
            );
        }

        // Q4_K: d = 0.25, dmin = 0.5, sub-block j's scale j + 1 and
        // minimum 2j + 40 (6-bit, so the upper sub-blocks' high bits are
        // used), nibble i of sub-block j = (i + j) % 16.
        let mut q4k = h(0.25).to_vec();
        q4k.extend(h(0.5));
        let (sc, mn): (Vec<u8>, Vec<u8>) = (0..8u8).map(|j| (j + 1, 2 * j + 40)).unzip();
        let mut scales = [0u8; 12];
        for j in 0..4 {
            scales[j] = sc[j] | ((sc[j + 4] >> 4) << 6);
            scales[j + 4] = mn[j] | ((mn[j + 4] >> 4) << 6);
            scales[j + 8] = (sc[j + 4] & 0x0F) | ((mn[j + 4] & 0x0F) << 4);
        }
        q4k.extend(scales);
        for c in 0..4 {
            q4k.extend((0..32u8).map(|i| {
                let lo = (i + 2 * c) % 16;
                let hi = (i + 2 * c + 1) % 16;
                lo | (hi << 4)
            }));
        }
        let v = dequantize(&unpack(StoredBlocks::Q4K, 256, &q4k).unwrap());
        for j in 0..8 {
            for i in 0..32 {
                let q = ((i + j) % 16) as f32;
                let want = 0.25 * f32::from(sc[j]) * q - 0.5 * f32::from(mn[j]);
                assert_eq!(v[32 * j + i], want, "sub-block {j}, value {i}");
            }
        }

        // Q8_0 and Q4_1 keep their bytes.
        let mut q8 = h(0.125).to_vec();
        q8.extend((0..32i8).map(|k| (k - 16) as u8));
        let v = dequantize(&unpack(StoredBlocks::Q8_0, 32, &q8).unwrap());
        assert_eq!(v[0], -2.0);
        let mut q4_1 = h(1.0).to_vec();
        q4_1.extend(h(-3.0));
        q4_1.extend([0x21u8; 16]);
        let v = dequantize(&unpack(StoredBlocks::Q4_1, 32, &q4_1).unwrap());
        assert_eq!((v[0], v[16]), (-2.0, -1.0));

        // Not whole blocks: refused.
        assert!(unpack(StoredBlocks::Q4K, 32, &q4k[..144]).is_none());
        assert!(unpack(StoredBlocks::Q8_0, 32, &q8[..33]).is_none());
    }
}
