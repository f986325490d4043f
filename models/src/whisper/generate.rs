//! Greedy decoding of one 30 s window, as transformers'
//! `WhisperForConditionalGeneration.generate` does it without timestamps:
//! the forced prompt (`<|startoftranscript|>`, the language on a
//! multilingual model, the task, `<|notimestamps|>`), then at each step the
//! most likely token after the generation config's `suppress_tokens` (never)
//! and `begin_suppress_tokens` (not first) are taken out, until
//! `<|endoftext|>` or the token limit.

use super::config::GenerationSettings;
use super::model::{AudioStates, WhisperModel};
use crate::error::ModelError;

/// What to transcribe into.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WhisperTask {
    Transcribe,
    Translate,
}

impl WhisperTask {
    pub fn as_str(self) -> &'static str {
        match self {
            WhisperTask::Transcribe => "transcribe",
            WhisperTask::Translate => "translate",
        }
    }
}

/// The forced prompt: start, language (multilingual models), task, no
/// timestamps. A language the model does not know is an error naming it.
pub fn prompt(
    settings: &GenerationSettings,
    language: Option<&str>,
    task: WhisperTask,
) -> Result<Vec<u32>, String> {
    let mut ids = vec![settings.decoder_start_token_id];
    if settings.is_multilingual {
        let language = language.unwrap_or("en");
        let key = format!("<|{language}|>");
        let id = settings.lang_to_id.get(&key).ok_or_else(|| {
            format!(
                "language {language:?} is not one of the model's ({} languages, e.g. en, fr, de)",
                settings.lang_to_id.len()
            )
        })?;
        ids.push(*id);
        if let Some(id) = settings.task_to_id.get(task.as_str()) {
            ids.push(*id);
        }
    } else if task == WhisperTask::Translate {
        return Err("an English-only model cannot translate".into());
    }
    if let Some(id) = settings.no_timestamps_token_id {
        ids.push(id);
    }
    Ok(ids)
}

/// The greedy continuation of `prompt` over `audio` (the encoder's
/// states), at most `max_new_tokens` of it, ending at (and including) the
/// end-of-text token if it came; the prompt is not repeated.
pub fn greedy(
    model: &WhisperModel,
    settings: &GenerationSettings,
    audio: &AudioStates,
    prompt: &[u32],
    max_new_tokens: usize,
) -> Result<Vec<u32>, ModelError> {
    let mut state = model.start(audio)?;
    let room = model
        .config
        .max_target_positions
        .saturating_sub(prompt.len());
    let mut out = Vec::new();
    let mut logits = model.step(&mut state, prompt)?;
    while out.len() < max_new_tokens.min(room) {
        for &t in &settings.suppress_tokens {
            if let Some(l) = logits.get_mut(t as usize) {
                *l = f32::NEG_INFINITY;
            }
        }
        if out.is_empty() {
            for &t in &settings.begin_suppress_tokens {
                if let Some(l) = logits.get_mut(t as usize) {
                    *l = f32::NEG_INFINITY;
                }
            }
        }
        let next = WhisperModel::argmax(&logits);
        out.push(next);
        if next == settings.eos_token_id || out.len() == max_new_tokens.min(room) {
            break;
        }
        logits = model.step(&mut state, &[next])?;
    }
    Ok(out)
}
