//! Rotary embeddings' angles, per position: `angle(p, i) = p * scale *
//! base^(-2i / head_dim) / factor[i]`, where Llama 3.1+ GGUFs carry the
//! factors as `rope_freqs.weight` and linear scaling sets `scale`. Computed
//! for a step's positions as it runs (no table sized by the context, which is
//! 128k tokens for Llama 3.2), the same for both steps.

use super::config::Rope;

/// One rotary embedding's inverse frequencies.
#[derive(Clone, Debug)]
pub(crate) struct RopeAngles {
    /// `scale * base^(-2i / head_dim) / factor[i]`, `head_dim / 2` of them.
    inv_freq: Vec<f32>,
}

impl RopeAngles {
    pub(crate) fn new(rope: &Rope, head_dim: usize, factors: Option<&[f32]>) -> RopeAngles {
        let half = head_dim / 2;
        let inv_freq = (0..half)
            .map(|i| {
                let f = 1.0 / rope.base.powf(2.0 * i as f32 / head_dim as f32);
                let factor = factors.and_then(|f| f.get(i)).copied().unwrap_or(1.0);
                rope.scale * f / factor
            })
            .collect();
        RopeAngles { inv_freq }
    }

    pub(crate) fn half(&self) -> usize {
        self.inv_freq.len()
    }

    /// cos and sin of every position's angles, `[positions, head_dim / 2]`
    /// each.
    pub(crate) fn tables(&self, positions: impl Iterator<Item = usize>) -> (Vec<f32>, Vec<f32>) {
        let (mut cos, mut sin) = (Vec::new(), Vec::new());
        for p in positions {
            for f in &self.inv_freq {
                let angle = p as f32 * f;
                cos.push(angle.cos());
                sin.push(angle.sin());
            }
        }
        (cos, sin)
    }
}

/// The embeddings a decoder's layers use: the global one, and the sliding
/// window layers' where it differs (Gemma 3).
#[derive(Clone, Debug)]
pub(crate) struct Ropes {
    pub(crate) global: RopeAngles,
    pub(crate) local: Option<RopeAngles>,
}

impl Ropes {
    pub(crate) fn new(
        global: &Rope,
        local: &Rope,
        head_dim: usize,
        factors: Option<&[f32]>,
    ) -> Ropes {
        Ropes {
            global: RopeAngles::new(global, head_dim, factors),
            local: (local != global).then(|| RopeAngles::new(local, head_dim, factors)),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn angles_follow_base_scale_and_factors() {
        let rope = Rope {
            base: 10_000.0,
            scale: 0.5,
        };
        let a = RopeAngles::new(&rope, 4, Some(&[1.0, 2.0]));
        let (cos, sin) = a.tables([0usize, 3].into_iter());
        assert_eq!(&cos[..2], &[1.0, 1.0]);
        // Position 3: 3 * 0.5 * 1 / 1 and 3 * 0.5 * 10000^(-1/2) / 2.
        assert!((sin[2] - 1.5f32.sin()).abs() < 1e-6);
        assert!((sin[3] - (1.5f32 * 0.01 / 2.0).sin()).abs() < 1e-6);
        assert!(Ropes::new(&rope, &rope, 4, None).local.is_none());
    }
}
