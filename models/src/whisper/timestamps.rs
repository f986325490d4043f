//! The rules a window decoded with timestamps follows, as transformers'
//! `WhisperTimeStampLogitsProcessor` (openai-whisper's `ApplyTimestampRules`)
//! applies them to each step's logits, after the generation config's
//! suppressions:
//!
//! 1. `<|notimestamps|>` never comes;
//! 2. timestamps come in pairs (a segment's end, the next one's start),
//!    except the last before the end of text: after a timestamp that
//!    follows text, only a timestamp or the end; after two, only text;
//! 3. timestamps never go back (and the first one, `<|0.00|>`, is not
//!    repeated), and the first token is a timestamp, at most
//!    `max_initial_timestamp_index` steps in;
//! 4. when the timestamps together are likelier than the best text token,
//!    a timestamp it is.

/// One model's timestamp tokens and the rules' settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimestampRules {
    pub no_timestamps: u32,
    /// `<|0.00|>`; each later id is 0.02 s more.
    pub timestamp_begin: u32,
    /// `<|endoftext|>`.
    pub eos: u32,
    pub max_initial_index: Option<u32>,
}

/// Seconds per timestamp step.
pub const TIME_PRECISION: f64 = 0.02;

impl TimestampRules {
    pub fn is_timestamp(&self, token: u32) -> bool {
        token >= self.timestamp_begin
    }

    /// The seconds `token` (a timestamp) stands for in its window.
    pub fn seconds(&self, token: u32) -> f64 {
        f64::from(token.saturating_sub(self.timestamp_begin)) * TIME_PRECISION
    }

    /// Masks what may not come after `generated` (this window's tokens
    /// after its prompt) in `logits`, in place.
    pub fn apply(&self, generated: &[u32], logits: &mut [f32]) {
        let vocab = logits.len();
        let begin = (self.timestamp_begin as usize).min(vocab);
        let mask = |logits: &mut [f32], range: std::ops::Range<usize>| {
            for l in &mut logits[range] {
                *l = f32::NEG_INFINITY;
            }
        };
        if let Some(l) = logits.get_mut(self.no_timestamps as usize) {
            *l = f32::NEG_INFINITY;
        }
        let last = generated.last().is_some_and(|&t| self.is_timestamp(t));
        let penultimate = generated.len() < 2 || self.is_timestamp(generated[generated.len() - 2]);
        if last {
            if penultimate {
                mask(logits, begin..vocab);
            } else {
                mask(logits, 0..(self.eos as usize).min(vocab));
            }
        }
        if let Some(&latest) = generated.iter().rev().find(|&&t| self.is_timestamp(t)) {
            // Not below the latest; not the latest again unless it closes a
            // segment (a timestamp right after text).
            let floor = if last && !penultimate {
                latest
            } else {
                latest + 1
            };
            mask(logits, begin..(floor as usize).min(vocab));
        }
        if generated.is_empty() {
            mask(logits, 0..begin);
            if let Some(max) = self.max_initial_index {
                let last_allowed = (self.timestamp_begin + max) as usize + 1;
                mask(logits, last_allowed.min(vocab)..vocab);
            }
        }
        // The timestamps' total probability against the best text token's.
        let logprobs = log_softmax(logits);
        let timestamps = log_sum_exp(&logprobs[begin..]);
        let best_text = logprobs[..begin]
            .iter()
            .fold(f32::NEG_INFINITY, |a, &b| a.max(b));
        if timestamps > best_text {
            mask(logits, 0..begin);
        }
    }
}

/// `log(softmax(x))`, in f32 as the reference computes it.
pub fn log_softmax(x: &[f32]) -> Vec<f32> {
    let total = log_sum_exp(x);
    x.iter().map(|&v| v - total).collect()
}

fn log_sum_exp(x: &[f32]) -> f32 {
    let max = x.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
    if max == f32::NEG_INFINITY {
        return max;
    }
    let sum: f32 = x.iter().map(|&v| (v - max).exp()).sum();
    max + sum.ln()
}

#[cfg(test)]
mod tests {
    use super::*;

    const RULES: TimestampRules = TimestampRules {
        no_timestamps: 5,
        timestamp_begin: 6,
        eos: 4,
        max_initial_index: Some(2),
    };
    /// Token ids 0..=3 are text, 4 the end, 5 `<|notimestamps|>`, 6.. the
    /// timestamps 0.00, 0.02, ...
    const VOCAB: usize = 12;

    /// What may come next after `generated`, all logits equal but text
    /// made likelier than any timestamp alone (so rule 4 decides only
    /// where noted).
    fn allowed(generated: &[u32], text_logit: f32) -> Vec<usize> {
        let mut logits: Vec<f32> = (0..VOCAB)
            .map(|i| if i < 4 { text_logit } else { 0.0 })
            .collect();
        RULES.apply(generated, &mut logits);
        (0..VOCAB).filter(|&i| logits[i].is_finite()).collect()
    }

    #[test]
    fn each_rule_masks_what_it_says() {
        let cases: &[(&[u32], f32, &[usize], &str)] = &[
            (
                &[],
                5.0,
                &[6, 7, 8],
                "first: a timestamp, within the initial limit",
            ),
            (
                &[6],
                5.0,
                &[0, 1, 2, 3, 4],
                "after an opening one: text (or the end)",
            ),
            (
                &[6, 1],
                5.0,
                &[0, 1, 2, 3, 4, 7, 8, 9, 10, 11],
                "after text: anything but <|0.00|> again",
            ),
            (
                &[6, 1, 8],
                5.0,
                &[8, 9, 10, 11],
                "a closing one: the next opens at or after it (the end, here less likely than the timestamps together)",
            ),
            (&[6, 1, 8, 8], 5.0, &[0, 1, 2, 3, 4], "after a pair: text"),
            (
                &[6, 1, 8, 8, 2],
                5.0,
                &[0, 1, 2, 3, 4, 9, 10, 11],
                "never back before the last",
            ),
            (
                &[6, 1],
                0.5,
                &[7, 8, 9, 10, 11],
                "timestamps likelier together than the best text: a timestamp",
            ),
        ];
        for (generated, text_logit, want, why) in cases {
            assert_eq!(
                allowed(generated, *text_logit),
                *want,
                "{why}: {generated:?}"
            );
        }
    }

    #[test]
    fn a_timestamp_counts_its_steps_of_twenty_milliseconds() {
        assert_eq!(RULES.seconds(6), 0.0);
        assert!((RULES.seconds(6 + 150) - 3.0).abs() < 1e-12);
        assert!(RULES.is_timestamp(6) && !RULES.is_timestamp(5));
    }
}
