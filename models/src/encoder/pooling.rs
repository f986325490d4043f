//! How a sequence's last hidden states become one vector: sentence-transformers'
//! pooling modes that sluice runs. Pure: one sequence's rows in, one vector
//! out, the same for every forward.

/// A pooling mode of sentence-transformers' `Pooling` module
/// (`1_Pooling/config.json`): every single mode it has. (Several modes at
/// once, their vectors concatenated, are refused at load.)
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Pooling {
    /// The mean over the sequence's tokens (`mean`; also what
    /// sentence-transformers does for a directory without a pooling config).
    #[default]
    Mean,
    /// The first token's state, `[CLS]` (`cls`: bge, gte and other
    /// retrieval models).
    Cls,
    /// The element-wise maximum over the tokens (`max`).
    Max,
    /// The sum over the tokens divided by the square root of their count
    /// (`mean_sqrt_len_tokens`).
    MeanSqrtLen,
    /// The mean weighted by each token's position, 1 for the first
    /// (`weightedmean`: SGPT-style models).
    WeightedMean,
    /// The last token's state (`lasttoken`: decoder-style embedders; on a
    /// BERT, the closing `[SEP]`).
    LastToken,
}

impl Pooling {
    /// Every mode, in sentence-transformers' order.
    pub const ALL: [Pooling; 6] = [
        Pooling::Cls,
        Pooling::Max,
        Pooling::Mean,
        Pooling::MeanSqrtLen,
        Pooling::WeightedMean,
        Pooling::LastToken,
    ];

    /// The mode's name in sentence-transformers 6's `pooling_mode` (and in
    /// logs).
    pub fn name(self) -> &'static str {
        match self {
            Pooling::Mean => "mean",
            Pooling::Cls => "cls",
            Pooling::Max => "max",
            Pooling::MeanSqrtLen => "mean_sqrt_len_tokens",
            Pooling::WeightedMean => "weightedmean",
            Pooling::LastToken => "lasttoken",
        }
    }

    /// The older boolean key that turns the mode on
    /// (`pooling_mode_<...>: true`).
    pub fn legacy_key(self) -> &'static str {
        match self {
            Pooling::Mean => "pooling_mode_mean_tokens",
            Pooling::Cls => "pooling_mode_cls_token",
            Pooling::Max => "pooling_mode_max_tokens",
            Pooling::MeanSqrtLen => "pooling_mode_mean_sqrt_len_tokens",
            Pooling::WeightedMean => "pooling_mode_weightedmean_tokens",
            Pooling::LastToken => "pooling_mode_lasttoken",
        }
    }

    /// The mode `pooling_mode` names, if any.
    pub fn from_name(name: &str) -> Option<Pooling> {
        Pooling::ALL.into_iter().find(|p| p.name() == name)
    }

    /// One sequence's vector from its `[tokens, hidden]` rows, `hidden`
    /// wide. No rows give zeros.
    pub fn pool(self, rows: &[f32], hidden: usize) -> Vec<f32> {
        let mut out = vec![0f32; hidden];
        if hidden == 0 || rows.len() < hidden {
            return out;
        }
        let states = rows.chunks_exact(hidden);
        let tokens = states.len();
        // The weighted sum of the rows, divided by `divisor`.
        let weighted = |out: &mut [f32], weight: &dyn Fn(usize) -> f32, divisor: f32| {
            for (i, row) in states.clone().enumerate() {
                let w = weight(i);
                for (m, v) in out.iter_mut().zip(row) {
                    *m += w * v;
                }
            }
            out.iter_mut().for_each(|m| *m /= divisor);
        };
        match self {
            Pooling::Cls => out.copy_from_slice(&rows[..hidden]),
            Pooling::LastToken => out.copy_from_slice(&rows[(tokens - 1) * hidden..]),
            Pooling::Mean => weighted(&mut out, &|_| 1.0, tokens as f32),
            Pooling::MeanSqrtLen => weighted(&mut out, &|_| 1.0, (tokens as f32).sqrt()),
            Pooling::WeightedMean => {
                // Weights 1..=n sum to n (n + 1) / 2.
                let total = (tokens * (tokens + 1) / 2) as f32;
                weighted(&mut out, &|i| (i + 1) as f32, total)
            }
            Pooling::Max => {
                out.copy_from_slice(&rows[..hidden]);
                for row in states.skip(1) {
                    for (m, v) in out.iter_mut().zip(row) {
                        *m = m.max(*v);
                    }
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_mode_pools_the_rows_as_sentence_transformers_does() {
        // Three tokens, two wide.
        let rows = [1.0, -2.0, 3.0, 4.0, -1.0, 1.0];
        let sqrt3 = 3f32.sqrt();
        let cases = [
            (Pooling::Mean, vec![1.0, 1.0]),
            (Pooling::Cls, vec![1.0, -2.0]),
            (Pooling::Max, vec![3.0, 4.0]),
            (Pooling::MeanSqrtLen, vec![3.0 / sqrt3, 3.0 / sqrt3]),
            // (1 x row0 + 2 x row1 + 3 x row2) / 6
            (Pooling::WeightedMean, vec![4.0 / 6.0, 9.0 / 6.0]),
            (Pooling::LastToken, vec![-1.0, 1.0]),
        ];
        for (mode, expected) in cases {
            let got = mode.pool(&rows, 2);
            for (g, e) in got.iter().zip(&expected) {
                assert!((g - e).abs() < 1e-6, "{mode:?}: {got:?} vs {expected:?}");
            }
        }
        for mode in Pooling::ALL {
            assert_eq!(mode.pool(&[], 2), vec![0.0, 0.0], "{mode:?} of nothing");
            assert_eq!(Pooling::from_name(mode.name()), Some(mode));
        }
        // One token: every mode but the sqrt one is that token.
        for mode in Pooling::ALL {
            if mode != Pooling::MeanSqrtLen {
                assert_eq!(mode.pool(&[5.0, 6.0], 2), vec![5.0, 6.0], "{mode:?}");
            }
        }
    }
}
