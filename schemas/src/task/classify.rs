//! The classify task: texts, each to its label scores from a sequence
//! classifier (transformers' `text-classification` pipeline; TEI's
//! `/predict`, vLLM's `/classify`). Its items are embed's (a string or
//! `{"text": ...}`); `truncate` it shares with the other encoder tasks.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::encoder::text_item;
use super::kind::Task;
use super::parameters::ParameterGroup;

/// classify's own parameters.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClassifyParameters {
    /// Keep each text's best `top_k` labels (default: every label), best
    /// first, as the pipeline's `top_k`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_k: Option<u32>,
    /// The head's logits instead of its scores (TEI's `raw_scores`; default
    /// false: the model's activation applied, softmax or sigmoid as
    /// transformers' pipeline chooses).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub raw_scores: Option<bool>,
}

impl ParameterGroup for ClassifyParameters {
    const TASKS: &'static [Task] = &[Task::Classify];

    fn check(&self) -> Result<(), String> {
        match self.top_k {
            Some(0) => {
                Err("parameters.top_k must be 1 or more (leave it out for every label)".into())
            }
            _ => Ok(()),
        }
    }
}

/// One label's score for a text.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LabelScore {
    /// The label's name (`config.json`'s `id2label`).
    pub label: String,
    /// The label's id: its place in the head's outputs.
    pub id: u32,
    pub score: f32,
}

/// Reads one classify item: a JSON string or an object `{"text": "..."}`.
pub fn item(value: Value) -> Result<String, String> {
    text_item("a classify item", value)
}

/// A text's labels, best first (ties in id order, as the pipeline's stable
/// sort), cut to `top_k`; `labels` names the ids of `scores`.
pub fn ranked(labels: &[String], scores: &[f32], top_k: Option<u32>) -> Vec<LabelScore> {
    let mut order: Vec<usize> = (0..scores.len().min(labels.len())).collect();
    order.sort_by(|a, b| scores[*b].total_cmp(&scores[*a]));
    order.truncate(top_k.map_or(usize::MAX, |k| k as usize));
    order
        .into_iter()
        .map(|id| LabelScore {
            label: labels[id].clone(),
            id: id as u32,
            score: scores[id],
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Best first, ties in id order, cut at top_k.
    #[test]
    fn labels_rank_best_first_as_the_pipeline_sorts() {
        let labels: Vec<String> = ["a", "b", "c", "d"].map(String::from).to_vec();
        let scores = [0.1, 0.4, 0.4, 0.1];
        let names = |r: Vec<LabelScore>| r.into_iter().map(|l| (l.label, l.id)).collect::<Vec<_>>();
        let all = ranked(&labels, &scores, None);
        assert_eq!(
            names(all),
            [
                ("b".into(), 1),
                ("c".into(), 2),
                ("a".into(), 0),
                ("d".into(), 3)
            ]
        );
        assert_eq!(names(ranked(&labels, &scores, Some(1))), [("b".into(), 1)]);
        assert_eq!(ranked(&labels, &scores, Some(9)).len(), 4);
    }
}
