//! How a sequence's last hidden states become one vector: sentence-transformers'
//! pooling modes that sluice runs. Pure: one sequence's rows in, one vector
//! out, the same for every forward.

/// A pooling mode of sentence-transformers' `Pooling` module
/// (`1_Pooling/config.json`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Pooling {
    /// The mean over the sequence's tokens (`pooling_mode_mean_tokens`;
    /// also what sentence-transformers does for a directory without a
    /// pooling config).
    #[default]
    Mean,
    /// The first token's state, `[CLS]` (`pooling_mode_cls_token`: bge, gte
    /// and other retrieval models).
    Cls,
    /// The element-wise maximum over the tokens (`pooling_mode_max_tokens`).
    Max,
}

impl Pooling {
    /// The mode's name in sentence-transformers' config
    /// (`pooling_mode_<name>`) and in logs.
    pub fn name(self) -> &'static str {
        match self {
            Pooling::Mean => "mean_tokens",
            Pooling::Cls => "cls_token",
            Pooling::Max => "max_tokens",
        }
    }

    /// One sequence's vector from its `[tokens, hidden]` rows, `hidden`
    /// wide. No rows give zeros.
    pub fn pool(self, rows: &[f32], hidden: usize) -> Vec<f32> {
        let mut out = vec![0f32; hidden];
        if hidden == 0 || rows.len() < hidden {
            return out;
        }
        let mut states = rows.chunks_exact(hidden);
        match self {
            Pooling::Cls => out.copy_from_slice(&rows[..hidden]),
            Pooling::Mean => {
                let n = states.len() as f32;
                for row in states {
                    for (m, v) in out.iter_mut().zip(row) {
                        *m += v;
                    }
                }
                out.iter_mut().for_each(|m| *m /= n);
            }
            Pooling::Max => {
                if let Some(first) = states.next() {
                    out.copy_from_slice(first);
                }
                for row in states {
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
        let cases = [
            (Pooling::Mean, vec![1.0, 1.0]),
            (Pooling::Cls, vec![1.0, -2.0]),
            (Pooling::Max, vec![3.0, 4.0]),
        ];
        for (mode, expected) in cases {
            assert_eq!(mode.pool(&rows, 2), expected, "{mode:?}");
        }
        for mode in [Pooling::Mean, Pooling::Cls, Pooling::Max] {
            assert_eq!(mode.pool(&[], 2), vec![0.0, 0.0], "{mode:?} of nothing");
        }
    }
}
