//! The precision of the packed BERT forward's linear layers, decided by a
//! rule on the CPU.

/// The precision of the packed BERT forward's linear layers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum EmbedWeights {
    /// bf16 where [`sluice_kernels::encoder::bf16_by_rule`] says the CPU
    /// runs it faster (AMX tiles; AVX512_BF16 on an AMD core), f32
    /// elsewhere: a rule, so every start on one CPU answers alike.
    #[default]
    Auto,
    /// f32 weights and sums.
    F32,
    /// bf16 weights and activations, f32 sums (`vdpbf16ps`), where the CPU
    /// has AVX512_BF16; f32 elsewhere.
    Bf16,
}

impl std::str::FromStr for EmbedWeights {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(EmbedWeights::Auto),
            "f32" => Ok(EmbedWeights::F32),
            "bf16" => Ok(EmbedWeights::Bf16),
            other => Err(format!("unknown embed weights {other:?} (auto, f32, bf16)")),
        }
    }
}

impl EmbedWeights {
    /// `Auto` decided by [`sluice_kernels::encoder::bf16_by_rule`] (what
    /// the CPU is, never a timing: the same vectors at every start on one
    /// CPU; logged once per process); the others as they are.
    pub fn resolve(self) -> EmbedWeights {
        if self != EmbedWeights::Auto {
            return self;
        }
        static LOGGED: std::sync::Once = std::sync::Once::new();
        let (weights, why) = match sluice_kernels::encoder::bf16_by_rule() {
            Some((true, why)) => (EmbedWeights::Bf16, why),
            Some((false, why)) => (EmbedWeights::F32, why),
            None => (EmbedWeights::F32, "this process runs no bf16 layers"),
        };
        LOGGED.call_once(|| {
            tracing::info!(
                weights = weights.name(),
                why,
                "--embed-weights auto (a rule on the CPU, the same at every start)"
            );
        });
        weights
    }

    pub fn name(self) -> &'static str {
        match self {
            EmbedWeights::Auto => "auto",
            EmbedWeights::F32 => "f32",
            EmbedWeights::Bf16 => "bf16",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `auto` becomes bf16 exactly where the rule says so; an explicit
    /// choice stays as asked.
    #[test]
    fn auto_weights_follow_the_rule() {
        let expected = match sluice_kernels::encoder::bf16_by_rule() {
            Some((true, _)) => EmbedWeights::Bf16,
            _ => EmbedWeights::F32,
        };
        assert_eq!(EmbedWeights::Auto.resolve(), expected);
        assert_eq!(EmbedWeights::F32.resolve(), EmbedWeights::F32);
        assert_eq!(EmbedWeights::Bf16.resolve(), EmbedWeights::Bf16);
    }
}
