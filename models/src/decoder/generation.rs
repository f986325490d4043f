//! Continuous batching for text generation. Sequences join the running set
//! at any step and leave the step they finish (freeing their KV cache at
//! once); each step is one forward ([`StepModel::forward`], the llama's in
//! the consumer) over a token segment per sequence: the next chunk of a
//! prompt still being read (prefill, chunked so a step's tokens stay under
//! `max_step_tokens`) or the one token a decoding sequence sampled last.
//!
//! The generator sees its model and tokenizer through two small traits, so
//! the scheduling (admission by KV budget, cancel, chunked prefill, finish
//! reasons) is tested with a fake model (`tests` below) as well as with the
//! real one (`tests/tests/it/generate.rs`).

use candle_core::Tensor;
use candle_transformers::generation::{LogitsProcessor, Sampling};

use super::constraint::Constraint;
use super::{Decoder, KvCache, Segment};
use crate::error::ModelError;
use crate::tokenizer::gguf::GgufTokenizer;

/// What the generator needs of a model.
pub trait StepModel {
    /// One sequence's KV cache, sized at creation for its whole life.
    type Cache;
    /// KV-cache bytes one token of one sequence costs.
    fn kv_bytes_per_token(&self) -> u64;
    /// The most tokens (prompt + generated) a sequence may hold.
    fn context_length(&self) -> usize;
    fn new_cache(&self, capacity: usize) -> Result<Self::Cache, ModelError>;
    /// The tokens a cache was made for.
    fn cache_capacity(cache: &Self::Cache) -> usize;
    /// Runs every segment's tokens, appends them to its cache, and returns
    /// the logits after each segment's last token, `[segments, vocab]`.
    fn forward(&self, segments: &mut [Segment<'_, Self::Cache>]) -> Result<Tensor, ModelError>;
}

/// What the generator needs of a tokenizer.
pub trait TokenText {
    /// Tokens that end a sequence (end of text, end of turn).
    fn stop_ids(&self) -> Vec<u32>;
    /// The bytes of `ids`' text (a token may hold part of a character).
    fn decode_bytes(&self, ids: &[u32]) -> Vec<u8>;
    /// `ids`' text; bytes that make no whole character show as U+FFFD.
    fn decode(&self, ids: &[u32]) -> String {
        String::from_utf8_lossy(&self.decode_bytes(ids)).into_owned()
    }
}

/// The consumer's model.
impl StepModel for Decoder {
    type Cache = KvCache;

    fn kv_bytes_per_token(&self) -> u64 {
        self.config.kv_bytes_per_token()
    }

    fn context_length(&self) -> usize {
        self.config.context_length
    }

    fn new_cache(&self, capacity: usize) -> Result<KvCache, ModelError> {
        Decoder::new_cache(self, capacity)
    }

    fn cache_capacity(cache: &KvCache) -> usize {
        cache.capacity()
    }

    fn forward(&self, segments: &mut [Segment<'_, KvCache>]) -> Result<Tensor, ModelError> {
        Decoder::forward(self, segments)
    }
}

impl TokenText for GgufTokenizer {
    /// EOS, EOT and the end-of-turn tokens this vocabulary has.
    fn stop_ids(&self) -> Vec<u32> {
        GgufTokenizer::stop_ids(self).to_vec()
    }

    fn decode_bytes(&self, ids: &[u32]) -> Vec<u8> {
        GgufTokenizer::decode_bytes(self, ids)
    }
}

/// Per-prompt sampling and stopping.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerationParams {
    pub max_new_tokens: usize,
    /// 0: greedy (the most likely token, always).
    pub temperature: f64,
    /// Nucleus sampling: keep the most likely tokens whose probabilities sum
    /// to `top_p` (1.0: all).
    pub top_p: f64,
    /// Same seed, same parameters, same prompt: same output.
    pub seed: u64,
    /// Generation stops before the first of these appears in the text.
    pub stop: Vec<String>,
    /// Go on past the end-of-turn token (benchmarks: fixed lengths).
    pub ignore_eos: bool,
    /// What the text must be (JSON; see [`crate::decoder::constraint`]): each token
    /// sampled from those the constraint allows.
    pub constraint: Option<Constraint>,
    /// Each generated token's log-probability, with the `k` most likely
    /// tokens of its step (`Some(0)`: the token's alone; at most
    /// [`MAX_TOP_LOGPROBS`]). See [`token_logprob`] for which distribution.
    pub logprobs: Option<usize>,
}

/// The most alternatives a token's logprobs list (OpenAI's `top_logprobs`
/// limit).
pub const MAX_TOP_LOGPROBS: usize = 20;

impl GenerationParams {
    /// Refuses values that have no meaning, saying which and why.
    pub fn check(&self) -> Result<(), String> {
        if self.max_new_tokens == 0 {
            return Err("max_new_tokens must be at least 1".into());
        }
        if !self.temperature.is_finite() || self.temperature < 0.0 {
            return Err(format!(
                "temperature must be a finite number >= 0 (0: greedy), not {}",
                self.temperature
            ));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(format!("top_p must be in (0, 1], not {}", self.top_p));
        }
        if self.stop.iter().any(String::is_empty) {
            return Err("a stop sequence is empty".into());
        }
        if let Some(k) = self.logprobs
            && k > MAX_TOP_LOGPROBS
        {
            return Err(format!(
                "top_logprobs must be at most {MAX_TOP_LOGPROBS}, not {k}"
            ));
        }
        Ok(())
    }
}

impl Default for GenerationParams {
    fn default() -> Self {
        GenerationParams {
            max_new_tokens: 128,
            temperature: 0.0,
            top_p: 1.0,
            seed: 0,
            stop: Vec::new(),
            ignore_eos: false,
            constraint: None,
            logprobs: None,
        }
    }
}

/// Why a sequence ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// `max_new_tokens` reached.
    Length,
    /// A stop sequence appeared (it is not part of the text).
    Stop,
    /// The model ended its turn.
    Eos,
}

/// What a finished sequence produced.
#[derive(Debug, Clone, PartialEq)]
pub struct Generated {
    pub text: String,
    pub finish_reason: FinishReason,
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    /// The sampled token ids (stop-sequence tokens included).
    pub tokens: Vec<u32>,
    /// One per token of `tokens` when the parameters asked for logprobs.
    pub logprobs: Vec<TokenLogprob>,
}

/// A generated token's log-probability and its step's most likely tokens.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    pub id: u32,
    pub logprob: f32,
    /// The most likely tokens of the step, most likely first (ties: the
    /// lower id first), with their log-probabilities.
    pub top: Vec<(u32, f32)>,
}

/// `chosen`'s log-probability and the `top` most likely tokens under the
/// model's own distribution at this step: the softmax of its logits, before
/// temperature, top-p and a `response_format`'s mask, as llama.cpp's
/// `n_probs` and vLLM's default (raw) logprobs report it. So the figures
/// say what the model thinks whatever the sampling, and can be checked
/// against another engine's on the same prefix. Computed in f64 (a
/// log-sum-exp over the whole vocabulary); a token of logit -inf (none in
/// a model's own row) is never listed.
pub fn token_logprob(logits: &[f32], chosen: u32, top: usize) -> TokenLogprob {
    let max = logits
        .iter()
        .copied()
        .filter(|l| l.is_finite())
        .fold(f32::NEG_INFINITY, f32::max) as f64;
    let sum: f64 = logits
        .iter()
        .filter(|l| l.is_finite())
        .map(|&l| (l as f64 - max).exp())
        .sum();
    let log_z = max + sum.ln();
    let logprob = |id: u32| {
        logits
            .get(id as usize)
            .map_or(f32::NEG_INFINITY, |&l| (l as f64 - log_z) as f32)
    };
    // The `top` largest, kept sorted as the row is read once.
    let mut best: Vec<(u32, f32)> = Vec::with_capacity(top + 1);
    if top > 0 {
        for (id, &l) in logits.iter().enumerate() {
            if !l.is_finite() || (best.len() == top && l <= best[top - 1].1) {
                continue;
            }
            let at = best.partition_point(|&(_, b)| b >= l);
            best.insert(at, (id as u32, l));
            best.truncate(top);
        }
    }
    TokenLogprob {
        id: chosen,
        logprob: logprob(chosen),
        top: best.into_iter().map(|(id, _)| (id, logprob(id))).collect(),
    }
}

struct Running<K, C> {
    key: K,
    prompt: Vec<u32>,
    /// Prompt tokens already in the cache.
    read: usize,
    /// The token to feed next once the prompt is read.
    next: Option<u32>,
    generated: Vec<u32>,
    params: GenerationParams,
    sampler: LogitsProcessor,
    cache: C,
    /// A streamed sequence's text shown so far (None: not streamed).
    shown: Option<String>,
    /// One per generated token when the parameters ask for them.
    logprobs: Vec<TokenLogprob>,
    /// How many of `logprobs` a streamed piece has carried.
    logprobs_shown: usize,
}

struct Waiting<K> {
    key: K,
    prompt: Vec<u32>,
    params: GenerationParams,
    streamed: bool,
}

/// The sequences being generated, keyed by the caller's `K`: a running set
/// that holds KV caches, and a queue of sequences waiting for KV room.
pub struct Generator<'m, K, M: StepModel = Decoder, T: TokenText = GgufTokenizer> {
    model: &'m M,
    tokenizer: &'m T,
    eos: Vec<u32>,
    max_step_tokens: usize,
    prefill_chunk: usize,
    /// The most KV-cache bytes the running set may reserve (None: no cap).
    kv_budget: Option<u64>,
    /// The most sequences in the running set (None: no cap).
    max_running: Option<usize>,
    /// The most KV-cache bytes the running set has reserved at once.
    peak_kv: u64,
    running: Vec<Running<K, M::Cache>>,
    waiting: std::collections::VecDeque<Waiting<K>>,
    /// Streamed sequences' new text from the last step (see [`Generator::take_streamed`]).
    new_text: Vec<(K, Streamed)>,
}

/// A streamed sequence's news from one step: its new text and the logprobs
/// (when its parameters ask for them) of the tokens recorded since its
/// last piece. A token's logprob comes with its text or a piece before it
/// (text is held back; logprobs are not).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Streamed {
    pub text: String,
    pub logprobs: Vec<TokenLogprob>,
}

impl<'m, K: Clone, M: StepModel, T: TokenText> Generator<'m, K, M, T> {
    /// `max_step_tokens` caps the tokens of one step (prompt chunks plus one
    /// per decoding sequence); prompts are read in chunks of half of it, so
    /// decoding sequences always have the other half.
    pub fn new(model: &'m M, tokenizer: &'m T, max_step_tokens: usize) -> Self {
        Generator {
            model,
            tokenizer,
            eos: tokenizer.stop_ids(),
            max_step_tokens: max_step_tokens.max(1),
            prefill_chunk: (max_step_tokens / 2).max(1),
            kv_budget: None,
            max_running: None,
            peak_kv: 0,
            running: Vec::new(),
            waiting: std::collections::VecDeque::new(),
            new_text: Vec::new(),
        }
    }

    /// Caps the KV-cache bytes of the running set: a sequence joins only
    /// when its whole cache (`prompt + max_new_tokens` tokens) fits beside
    /// the others', and waits in arrival order until then.
    pub fn with_kv_budget(mut self, bytes: u64) -> Self {
        self.kv_budget = Some(bytes);
        self
    }

    /// At most `n` sequences run at once (the others wait): caps a step's
    /// logits and sampling work, whatever the KV budget allows.
    pub fn with_max_running(mut self, n: usize) -> Self {
        self.max_running = Some(n.max(1));
        self
    }

    /// Drops the sequence of `key`, running or waiting (its job went away);
    /// its KV cache is freed at once. Says whether it was there.
    pub fn cancel(&mut self, key: &K) -> bool
    where
        K: PartialEq,
    {
        let before = self.len();
        self.running.retain(|r| r.key != *key);
        self.waiting.retain(|w| w.key != *key);
        self.len() != before
    }

    /// KV-cache bytes a sequence of `prompt_tokens` and `max_new_tokens`
    /// reserves for its whole life.
    pub fn kv_bytes(&self, prompt_tokens: usize, max_new_tokens: usize) -> u64 {
        (prompt_tokens + max_new_tokens) as u64 * self.model.kv_bytes_per_token()
    }

    /// KV-cache bytes the running set holds now.
    pub fn reserved_kv_bytes(&self) -> u64 {
        let per_token = self.model.kv_bytes_per_token();
        self.running
            .iter()
            .map(|r| M::cache_capacity(&r.cache) as u64 * per_token)
            .sum()
    }

    /// The most KV-cache bytes the running set has reserved at once.
    pub fn peak_kv_bytes(&self) -> u64 {
        self.peak_kv
    }

    /// Sequences running and waiting.
    pub fn len(&self) -> usize {
        self.running.len() + self.waiting.len()
    }

    /// Sequences holding a KV cache (taking part in steps).
    pub fn running(&self) -> usize {
        self.running.len()
    }

    pub fn is_empty(&self) -> bool {
        self.running.is_empty() && self.waiting.is_empty()
    }

    /// Queues a sequence; it joins the running set at the first step with
    /// KV room for it. Refused at once when it could never run: an empty
    /// prompt, more tokens than the model's context, or a KV cache larger
    /// than the whole budget.
    pub fn add(
        &mut self,
        key: K,
        prompt: Vec<u32>,
        params: GenerationParams,
    ) -> Result<(), ModelError> {
        self.queue(key, prompt, params, false)
    }

    /// [`Generator::add`] for a sequence whose text is wanted as it is
    /// generated: after each step, [`Generator::take_streamed`] holds its
    /// new text (and logprobs). Sequences not streamed cost nothing more.
    pub fn add_streamed(
        &mut self,
        key: K,
        prompt: Vec<u32>,
        params: GenerationParams,
    ) -> Result<(), ModelError> {
        self.queue(key, prompt, params, true)
    }

    /// The new text of each streamed sequence after the last step, in running
    /// order; a sequence that finished in it comes with the rest of its
    /// text. Concatenated, a sequence's pieces are its [`Generated::text`]
    /// and its [`Generated::logprobs`]: text is held back while it ends in
    /// an unfinished UTF-8 character or in what may be the start of a stop
    /// sequence.
    pub fn take_streamed(&mut self) -> Vec<(K, Streamed)> {
        std::mem::take(&mut self.new_text)
    }

    fn queue(
        &mut self,
        key: K,
        prompt: Vec<u32>,
        params: GenerationParams,
        streamed: bool,
    ) -> Result<(), ModelError> {
        if prompt.is_empty() {
            return Err(ModelError::Failed("an empty prompt".into()));
        }
        params.check().map_err(ModelError::Failed)?;
        let capacity = prompt.len() + params.max_new_tokens;
        if capacity > self.model.context_length() {
            return Err(ModelError::Failed(format!(
                "prompt ({}) + max_new_tokens ({}) exceed the model's context of {} tokens",
                prompt.len(),
                params.max_new_tokens,
                self.model.context_length()
            )));
        }
        if let Some(budget) = self.kv_budget {
            let need = self.kv_bytes(prompt.len(), params.max_new_tokens);
            if need > budget {
                return Err(ModelError::Failed(format!(
                    "prompt ({}) + max_new_tokens ({}) need {need} bytes of KV cache; the budget is {budget}",
                    prompt.len(),
                    params.max_new_tokens
                )));
            }
        }
        self.waiting.push_back(Waiting {
            key,
            prompt,
            params,
            streamed,
        });
        Ok(())
    }

    /// Moves waiting sequences into the running set, in arrival order, while
    /// their KV caches fit the budget.
    fn admit(&mut self) -> Result<(), ModelError> {
        let mut reserved = self.reserved_kv_bytes();
        while let Some(next) = self.waiting.front() {
            if self.max_running.is_some_and(|n| self.running.len() >= n) {
                break;
            }
            let need = self.kv_bytes(next.prompt.len(), next.params.max_new_tokens);
            if self
                .kv_budget
                .is_some_and(|budget| reserved + need > budget)
            {
                break;
            }
            let Some(w) = self.waiting.pop_front() else {
                break;
            };
            reserved += need;
            self.peak_kv = self.peak_kv.max(reserved);
            let params = w.params;
            let sampling = if params.temperature <= 0.0 {
                Sampling::ArgMax
            } else if params.top_p < 1.0 {
                Sampling::TopP {
                    p: params.top_p,
                    temperature: params.temperature,
                }
            } else {
                Sampling::All {
                    temperature: params.temperature,
                }
            };
            self.running.push(Running {
                key: w.key,
                read: 0,
                next: None,
                generated: Vec::new(),
                sampler: LogitsProcessor::from_sampling(params.seed, sampling),
                cache: self
                    .model
                    .new_cache(w.prompt.len() + params.max_new_tokens)?,
                prompt: w.prompt,
                params,
                shown: w.streamed.then(String::new),
                logprobs: Vec::new(),
                logprobs_shown: 0,
            });
        }
        Ok(())
    }

    /// Admits what fits, then one forward step over every running sequence;
    /// returns the sequences that finished in it (their caches are freed).
    pub fn step(&mut self) -> Result<Vec<(K, Generated)>, ModelError> {
        self.admit()?;
        if self.running.is_empty() {
            return Ok(Vec::new());
        }
        // Decoding sequences first (one token each), then prompt chunks in
        // arrival order while the step has room; at least one sequence
        // always moves. A prompt is read in chunks of `prefill_chunk` tokens
        // from its start whatever else shares the step, so its numbers (and
        // its greedy output) do not depend on the batch it lands in.
        let mut budget = self.max_step_tokens;
        let mut plan: Vec<(usize, usize)> = Vec::new(); // (index, prompt tokens)
        for (i, r) in self.running.iter().enumerate() {
            if r.next.is_some() && budget > 0 {
                plan.push((i, 0));
                budget -= 1;
            }
        }
        for (i, r) in self.running.iter().enumerate() {
            if r.next.is_none() {
                let take = (r.prompt.len() - r.read).min(self.prefill_chunk);
                if take <= budget || plan.is_empty() {
                    plan.push((i, take));
                    budget = budget.saturating_sub(take);
                }
            }
        }
        plan.sort_unstable();
        let feeds: Vec<Vec<u32>> = plan
            .iter()
            .map(|&(i, take)| {
                let r = &self.running[i];
                match r.next {
                    Some(t) => vec![t],
                    None => r.prompt[r.read..r.read + take].to_vec(),
                }
            })
            .collect();
        let logits = {
            let mut planned = plan.iter().map(|&(i, _)| i).peekable();
            let mut segments = Vec::with_capacity(plan.len());
            for (i, r) in self.running.iter_mut().enumerate() {
                if planned.peek() == Some(&i) {
                    planned.next();
                    let at = segments.len();
                    segments.push(Segment {
                        cache: &mut r.cache,
                        tokens: &feeds[at],
                    });
                }
            }
            self.model.forward(&mut segments)?
        };
        let mut finished = Vec::new();
        for (row, &(i, take)) in plan.iter().enumerate() {
            let r = &mut self.running[i];
            if r.next.is_none() {
                r.read += take;
                if r.read < r.prompt.len() {
                    continue; // more of the prompt to read first
                }
            }
            let row_logits = logits.get(row)?;
            let token = match r.params.constraint.as_mut() {
                None => r.sampler.sample(&row_logits)?,
                Some(constraint) => {
                    let mut masked = row_logits.to_vec1::<f32>()?;
                    constraint.mask(&mut masked).map_err(constraint_failed)?;
                    let n = masked.len();
                    let masked = Tensor::from_vec(masked, n, row_logits.device())?;
                    r.sampler.sample(&masked)?
                }
            };
            if let Some(constraint) = r.params.constraint.as_mut()
                && !self.eos.contains(&token)
            {
                constraint.accept(token).map_err(constraint_failed)?;
            }
            let logprob = match r.params.logprobs {
                Some(k) => Some(token_logprob(&row_logits.to_vec1::<f32>()?, token, k)),
                None => None,
            };
            let before = r.generated.len();
            let ended = record(&self.eos, self.tokenizer, r, token);
            // Kept for a token the sequence records (not the EOS that ends it).
            if let Some(logprob) = logprob
                && r.generated.len() > before
            {
                r.logprobs.push(logprob);
            }
            if let Some(reason) = ended {
                finished.push((i, reason));
            } else if r
                .params
                .constraint
                .as_ref()
                .is_some_and(Constraint::is_finished)
            {
                // The JSON is complete and nothing may follow it.
                finished.push((i, FinishReason::Eos));
            } else if let Some(shown) = r.shown.as_mut() {
                let text = self.tokenizer.decode(&r.generated);
                let show = shown_len(&text, &r.params.stop);
                if show > shown.len() && text.starts_with(shown.as_str()) {
                    let new = text[shown.len()..show].to_string();
                    shown.push_str(&new);
                    let logprobs = r.logprobs[r.logprobs_shown..].to_vec();
                    r.logprobs_shown = r.logprobs.len();
                    self.new_text.push((
                        r.key.clone(),
                        Streamed {
                            text: new,
                            logprobs,
                        },
                    ));
                }
            }
        }
        let mut done = Vec::with_capacity(finished.len());
        // Highest index first, so the lower ones stay where they are.
        for &(i, reason) in finished.iter().rev() {
            let r = self.running.remove(i);
            let generated = self.result(&r, reason);
            if let Some(shown) = &r.shown {
                match generated.text.strip_prefix(shown.as_str()) {
                    Some(rest) => self.new_text.push((
                        r.key.clone(),
                        Streamed {
                            text: rest.to_string(),
                            logprobs: r.logprobs[r.logprobs_shown..].to_vec(),
                        },
                    )),
                    None => tracing::warn!(
                        shown = %shown,
                        text = %generated.text,
                        "bug: a streamed sequence's text is not what it showed so far"
                    ),
                }
            }
            done.push((r.key.clone(), generated));
        }
        done.reverse();
        Ok(done)
    }

    /// Steps until every sequence has finished; each as it finished.
    pub fn run_to_end(&mut self) -> Result<Vec<(K, Generated)>, ModelError> {
        let mut done = Vec::new();
        while !self.is_empty() {
            done.extend(self.step()?);
        }
        Ok(done)
    }

    fn result(&self, r: &Running<K, M::Cache>, reason: FinishReason) -> Generated {
        let mut text = whole_characters(&self.tokenizer.decode_bytes(&r.generated));
        if reason == FinishReason::Stop
            && let Some(at) = r
                .params
                .stop
                .iter()
                .filter_map(|s| text.find(s.as_str()))
                .min()
        {
            text.truncate(at);
        }
        Generated {
            text,
            finish_reason: reason,
            prompt_tokens: r.prompt.len(),
            completion_tokens: r.generated.len(),
            tokens: r.generated.clone(),
            logprobs: r.logprobs.clone(),
        }
    }
}

/// A sequence's final text: its bytes without a character it ended inside
/// (`max_tokens` can stop a sequence between a character's bytes: those
/// bytes stay in its token ids, the text leaves them out rather than end in
/// U+FFFD); invalid bytes elsewhere read as U+FFFD, as in [`TokenText::decode`].
pub fn whole_characters(bytes: &[u8]) -> String {
    let n = bytes.len();
    let mut end = n;
    // The last character's lead byte is among the last four.
    for back in 1..=n.min(4) {
        let b = bytes[n - back];
        if b & 0xC0 == 0x80 {
            continue; // a continuation byte
        }
        let needs = match b {
            0xF0..=0xF7 => 4,
            0xE0..=0xEF => 3,
            0xC0..=0xDF => 2,
            _ => 1,
        };
        if needs > back {
            end = n - back;
        }
        break;
    }
    String::from_utf8_lossy(&bytes[..end]).into_owned()
}

/// A constraint that fails mid-sequence: a bug (its mask allowed the token).
fn constraint_failed(e: String) -> ModelError {
    ModelError::Failed(format!("the output constraint failed: {e}"))
}

/// How much of a streamed sequence's `text` can be shown now: all but an
/// unfinished UTF-8 character at its end (decoded as U+FFFD until its last
/// byte arrives) and the longest end of it that is the start of a stop
/// sequence (the final text is cut before a stop sequence, so that text may
/// never be part of it).
fn shown_len(text: &str, stop: &[String]) -> usize {
    let text = text.trim_end_matches('\u{FFFD}');
    let held = stop
        .iter()
        .filter_map(|s| {
            (1..s.len())
                .rev()
                .filter(|&k| s.is_char_boundary(k))
                .find(|&k| text.ends_with(&s[..k]))
        })
        .max()
        .unwrap_or(0);
    text.len() - held
}

/// Records `token` and says whether the sequence is done.
fn record<K, C>(
    eos: &[u32],
    tokenizer: &impl TokenText,
    r: &mut Running<K, C>,
    token: u32,
) -> Option<FinishReason> {
    if !r.params.ignore_eos && eos.contains(&token) {
        return Some(FinishReason::Eos);
    }
    r.generated.push(token);
    r.next = Some(token);
    if !r.params.stop.is_empty() {
        let text = tokenizer.decode(&r.generated);
        if r.params.stop.iter().any(|s| text.contains(s.as_str())) {
            return Some(FinishReason::Stop);
        }
    }
    (r.generated.len() >= r.params.max_new_tokens).then_some(FinishReason::Length)
}

/// The scheduler with a fake model: no model files, every step visible.
#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::cell::RefCell;

    use candle_core::Device;

    use super::*;

    const VOCAB: usize = 8;
    const EOS: u32 = 0;

    /// Predicts `last + 1 (mod 8)` greedily, so token 7 is followed by the
    /// end of sequence. One KV byte per token. Logs each step's segment sizes.
    struct Counting {
        steps: RefCell<Vec<Vec<usize>>>,
    }

    struct Cache {
        len: usize,
        capacity: usize,
    }

    impl StepModel for Counting {
        type Cache = Cache;
        fn kv_bytes_per_token(&self) -> u64 {
            1
        }
        fn context_length(&self) -> usize {
            64
        }
        fn new_cache(&self, capacity: usize) -> Result<Cache, ModelError> {
            Ok(Cache { len: 0, capacity })
        }
        fn cache_capacity(cache: &Cache) -> usize {
            cache.capacity
        }
        fn forward(&self, segments: &mut [Segment<'_, Cache>]) -> Result<Tensor, ModelError> {
            let mut logits = vec![0f32; segments.len() * VOCAB];
            for (row, s) in segments.iter_mut().enumerate() {
                s.cache.len += s.tokens.len();
                assert!(s.cache.len <= s.cache.capacity, "cache overflow");
                let next = (*s.tokens.last().unwrap() as usize + 1) % VOCAB;
                logits[row * VOCAB + next] = 1.0;
            }
            self.steps
                .borrow_mut()
                .push(segments.iter().map(|s| s.tokens.len()).collect());
            Ok(Tensor::from_vec(
                logits,
                (segments.len(), VOCAB),
                &Device::Cpu,
            )?)
        }
    }

    /// Token `t` reads as the letter `a + t`.
    struct Letters;

    impl TokenText for Letters {
        fn stop_ids(&self) -> Vec<u32> {
            vec![EOS]
        }
        fn decode_bytes(&self, ids: &[u32]) -> Vec<u8> {
            ids.iter().map(|t| b'a' + *t as u8).collect()
        }
    }

    fn model() -> Counting {
        Counting {
            steps: RefCell::new(Vec::new()),
        }
    }

    fn params(max_new_tokens: usize) -> GenerationParams {
        GenerationParams {
            max_new_tokens,
            ..GenerationParams::default()
        }
    }

    fn run_all<M: StepModel, T: TokenText>(
        g: &mut Generator<'_, usize, M, T>,
    ) -> Vec<(usize, Generated)> {
        let mut done = Vec::new();
        for _ in 0..1000 {
            if g.is_empty() {
                break;
            }
            done.extend(g.step().unwrap());
        }
        assert!(g.is_empty(), "did not finish");
        done.sort_by_key(|(k, _)| *k);
        done
    }

    #[test]
    fn the_kv_budget_admits_in_arrival_order_and_waiting_sequences_join_later() {
        let m = model();
        // Each sequence holds 2 + 4 = 6 KV bytes; the budget fits two.
        let mut g = Generator::new(&m, &Letters, 64).with_kv_budget(13);
        for k in 0..5 {
            g.add(k, vec![1, 1], params(4)).unwrap();
        }
        let mut most = 0;
        let mut done = Vec::new();
        while !g.is_empty() {
            done.extend(g.step().unwrap());
            assert!(g.reserved_kv_bytes() <= 13);
            most = most.max(g.running());
        }
        assert_eq!(most, 2);
        assert_eq!(g.peak_kv_bytes(), 12);
        done.sort_by_key(|(k, _)| *k);
        assert_eq!(done.len(), 5);
        for (_, out) in &done {
            // 1 -> 2 3 4 5, stopped by length.
            assert_eq!(out.tokens, vec![2, 3, 4, 5]);
            assert_eq!(out.text, "cdef");
            assert_eq!(out.finish_reason, FinishReason::Length);
        }
        // A sequence larger than the whole budget is refused when added.
        let err = g.add(9, vec![1; 10], params(10)).unwrap_err().to_string();
        assert!(err.contains("KV cache") && err.contains("budget"), "{err}");
    }

    #[test]
    fn cancel_frees_a_running_sequence_and_drops_a_waiting_one() {
        let m = model();
        let mut g = Generator::new(&m, &Letters, 64)
            .with_kv_budget(100)
            .with_max_running(1);
        g.add(1, vec![1, 1, 1], params(20)).unwrap();
        g.add(2, vec![1], params(20)).unwrap();
        assert!(g.step().unwrap().is_empty());
        assert_eq!((g.running(), g.len()), (1, 2));
        assert_eq!(g.reserved_kv_bytes(), 23);
        assert!(g.cancel(&1));
        assert_eq!((g.running(), g.reserved_kv_bytes()), (0, 0));
        assert!(g.cancel(&2));
        assert!(!g.cancel(&2), "already gone");
        assert!(g.is_empty());
    }

    #[test]
    fn prompts_are_read_in_chunks_beside_decoding_sequences() {
        let m = model();
        // Steps of at most 8 tokens: prompts in chunks of 4.
        let mut g = Generator::new(&m, &Letters, 8);
        g.add(1, vec![1; 10], params(3)).unwrap();
        let done = run_all(&mut g);
        assert_eq!(done[0].1.tokens, vec![2, 3, 4]);
        let steps = m.steps.borrow().clone();
        assert_eq!(steps, vec![vec![4], vec![4], vec![2], vec![1], vec![1]]);

        // A short prompt decodes while a long one is still being read.
        let m = model();
        let mut g = Generator::new(&m, &Letters, 8);
        g.add(1, vec![1], params(6)).unwrap();
        g.add(2, vec![1; 12], params(2)).unwrap();
        run_all(&mut g);
        let steps = m.steps.borrow().clone();
        assert_eq!(steps[0], vec![1, 4], "both start in one step");
        assert_eq!(
            steps[1],
            vec![1, 4],
            "decode 1 token beside a 4-token chunk"
        );
        assert!(
            steps.iter().all(|s| s.iter().sum::<usize>() <= 8),
            "{steps:?}"
        );
    }

    #[test]
    fn sequences_finish_by_eos_stop_sequence_or_length() {
        let m = model();
        let mut g = Generator::new(&m, &Letters, 64);
        // 5 -> 6 7 then 0 (end of sequence): not part of the output.
        g.add(0, vec![5], params(10)).unwrap();
        // 1 -> 2 3 4 ...: the text "cde" holds the stop sequence "de".
        g.add(
            1,
            vec![1],
            GenerationParams {
                stop: vec!["de".into()],
                ..params(10)
            },
        )
        .unwrap();
        g.add(2, vec![1], params(2)).unwrap();
        // ignore_eos runs through the end-of-sequence token.
        g.add(
            3,
            vec![6],
            GenerationParams {
                ignore_eos: true,
                ..params(3)
            },
        )
        .unwrap();
        let done = run_all(&mut g);
        let by = |k: usize| &done[k].1;
        assert_eq!(by(0).finish_reason, FinishReason::Eos);
        assert_eq!(
            (by(0).tokens.clone(), by(0).text.as_str()),
            (vec![6, 7], "gh")
        );
        assert_eq!(by(1).finish_reason, FinishReason::Stop);
        assert_eq!(by(1).text, "c", "the text ends before the stop sequence");
        assert_eq!(by(1).completion_tokens, 3);
        assert_eq!(by(2).finish_reason, FinishReason::Length);
        assert_eq!(by(2).tokens, vec![2, 3]);
        assert_eq!(by(3).tokens, vec![7, 0, 1]);
        assert_eq!(by(3).finish_reason, FinishReason::Length);
    }

    /// Token 2 and 3 are the two bytes of "é"; 4 to 7 read b to e.
    struct HalfChars;

    impl TokenText for HalfChars {
        fn stop_ids(&self) -> Vec<u32> {
            vec![EOS]
        }
        fn decode_bytes(&self, ids: &[u32]) -> Vec<u8> {
            ids.iter()
                .flat_map(|&t| match t {
                    2 => vec![0xC3],
                    3 => vec![0xA9],
                    t => vec![b'a' + t as u8 - 3],
                })
                .collect()
        }
    }

    #[test]
    fn streamed_text_comes_step_by_step_and_adds_up_to_the_final_text() {
        let m = model();
        let mut g = Generator::new(&m, &HalfChars, 64);
        let stop = |s: &str| GenerationParams {
            stop: vec![s.into()],
            ..params(10)
        };
        // 1 -> 2 3 4 5 6: "é" arrives in two tokens, then "bcd", cut at "cd".
        g.add_streamed(0, vec![1], stop("cd")).unwrap();
        // The same without a stop sequence: "ébcde", then the end of sequence.
        g.add_streamed(1, vec![1], params(10)).unwrap();
        // Not streamed: never in the pieces.
        g.add(2, vec![1], params(10)).unwrap();
        let mut pieces: Vec<Vec<String>> = vec![Vec::new(); 3];
        let mut done = Vec::new();
        while !g.is_empty() {
            done.extend(g.step().unwrap());
            for (k, piece) in g.take_streamed() {
                pieces[k].push(piece.text);
            }
        }
        done.sort_by_key(|(k, _)| *k);
        assert_eq!(done[0].1.text, "éb");
        assert_eq!(done[0].1.finish_reason, FinishReason::Stop);
        assert_eq!(done[1].1.text, "ébcde");
        for k in 0..2 {
            assert_eq!(pieces[k].concat(), done[k].1.text, "sequence {k}");
            assert!(
                !pieces[k].iter().any(|p| p.contains('\u{FFFD}')),
                "half a character was shown: {:?}",
                pieces[k]
            );
        }
        // Half of "é" is held, then one piece per step; "c" waits (it may
        // start "cd") and the last piece is empty once "cd" cut it off.
        assert_eq!(pieces[0], ["é", "b", ""]);
        assert_eq!(pieces[1], ["é", "b", "c", "d", "e", ""]);
        assert!(pieces[2].is_empty());
    }

    /// `max_tokens` ends a sequence between the two bytes of "é": the text
    /// leaves the half character out (its byte stays in the token ids), in
    /// the plain answer and in the stream, never U+FFFD.
    #[test]
    fn a_sequence_cut_inside_a_character_ends_before_it() {
        let m = model();
        let mut g = Generator::new(&m, &HalfChars, 64);
        // 1 -> 2 (half of "é") and stop there: 1 new token.
        g.add_streamed(0, vec![1], params(1)).unwrap();
        g.add(1, vec![1], params(1)).unwrap();
        let mut pieces = Vec::new();
        let mut done = Vec::new();
        while !g.is_empty() {
            done.extend(g.step().unwrap());
            pieces.extend(g.take_streamed().into_iter().map(|(_, p)| p.text));
        }
        for (_, generated) in &done {
            assert_eq!(generated.text, "");
            assert_eq!(generated.tokens, [2]);
            assert_eq!(generated.finish_reason, FinishReason::Length);
        }
        assert_eq!(pieces.concat(), "");
        let table: [(&[u8], &str); 8] = [
            (b"", ""),
            (b"ab", "ab"),
            ("é".as_bytes(), "é"),
            (&[b'a', 0xC3], "a"),
            (&[b'a', 0xE6, 0x97], "a"),
            (&[0xF0, 0x9F, 0x8C], ""),
            ("🌈".as_bytes(), "🌈"),
            // Invalid, not cut: still shown as U+FFFD.
            (&[b'a', 0xFF], "a\u{FFFD}"),
        ];
        for (bytes, want) in table {
            assert_eq!(whole_characters(bytes), want, "{bytes:?}");
        }
    }

    #[test]
    fn shown_text_holds_back_a_possible_stop_sequence_start() {
        let stops = |s: &[&str]| s.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(shown_len("hello wor", &stops(&["world"])), 6);
        assert_eq!(shown_len("hello", &stops(&["xyz"])), 5);
        assert_eq!(shown_len("ab\u{FFFD}", &[]), 2);
        // The longest held end of any stop sequence wins.
        assert_eq!(shown_len("xab", &stops(&["b!", "abc"])), 1);
        assert_eq!(shown_len("x日", &stops(&["日本"])), 1);
    }

    #[test]
    fn a_tokens_logprob_is_the_log_softmax_of_its_row_and_its_top_k_the_largest() {
        let row = [2.0f32, -1.0, 2.0, 0.5, f32::NEG_INFINITY, 3.0];
        let z: f64 = row
            .iter()
            .filter(|l| l.is_finite())
            .map(|&l| (l as f64).exp())
            .sum();
        let lp = |id: usize| (row[id] as f64 - z.ln()) as f32;
        let got = token_logprob(&row, 3, 3);
        assert_eq!(got.id, 3);
        assert!((got.logprob - lp(3)).abs() < 1e-6, "{got:?}");
        // Most likely first; the tie between 0 and 2 goes to the lower id.
        let ids: Vec<u32> = got.top.iter().map(|&(id, _)| id).collect();
        assert_eq!(ids, vec![5, 0, 2]);
        for &(id, logprob) in &got.top {
            assert!((logprob - lp(id as usize)).abs() < 1e-6, "{got:?}");
        }
        // More asked than there are finite logits: the -inf one is left out.
        assert_eq!(token_logprob(&row, 0, 20).top.len(), 5);
        assert!(token_logprob(&row, 0, 0).top.is_empty());
        // The probabilities of the whole row add up to one.
        let all = token_logprob(&row, 0, 20);
        let total: f64 = all.top.iter().map(|&(_, l)| (l as f64).exp()).sum();
        assert!((total - 1.0).abs() < 1e-6, "{total}");
        // Large logits do not overflow.
        let big = token_logprob(&[1000.0, 999.0], 0, 1);
        assert!((big.logprob - (-(1.0 + (-1f64).exp()).ln()) as f32).abs() < 1e-6);
    }

    #[test]
    fn logprobs_come_one_per_recorded_token_and_not_for_the_eos() {
        let model = model();
        let mut generator = Generator::new(&model, &Letters, 64);
        // 5, 6, 7, then EOS (0) ends it: three tokens, three logprobs.
        generator
            .add(
                1,
                vec![4],
                GenerationParams {
                    logprobs: Some(2),
                    ..params(10)
                },
            )
            .unwrap();
        generator.add(2, vec![4], params(10)).unwrap();
        let done = generator.run_to_end().unwrap();
        let by = |k: i32| &done.iter().find(|(key, _)| *key == k).unwrap().1;
        let asked = by(1);
        assert_eq!(asked.tokens, vec![5, 6, 7]);
        assert_eq!(asked.finish_reason, FinishReason::Eos);
        let ids: Vec<u32> = asked.logprobs.iter().map(|l| l.id).collect();
        assert_eq!(ids, asked.tokens);
        // One-hot rows of 1.0 over zeros: the likeliest at 1 - ln(e + 7).
        let z = (1f64.exp() + (VOCAB as f64 - 1.0)).ln();
        for l in &asked.logprobs {
            assert!((l.logprob - (1.0 - z) as f32).abs() < 1e-6, "{l:?}");
            assert_eq!(l.top[0].0, l.id);
            assert_eq!(l.top.len(), 2);
            assert!((l.top[1].1 - (-z) as f32).abs() < 1e-6, "{l:?}");
        }
        assert!(by(2).logprobs.is_empty(), "not asked, not computed");
        let too_many = GenerationParams {
            logprobs: Some(MAX_TOP_LOGPROBS + 1),
            ..params(1)
        };
        assert!(too_many.check().unwrap_err().contains("top_logprobs"));
    }

    /// A streamed sequence's pieces carry its logprobs as they are
    /// recorded with the next piece, never after its text, and add up to
    /// the final list: with "cd" a stop sequence, the step that adds "c"
    /// shows nothing (it may start "cd"), so the last piece carries "c"'s
    /// and "d"'s.
    #[test]
    fn streamed_logprobs_add_up_to_the_final_ones_and_never_lag_the_text() {
        let m = model();
        let mut g = Generator::new(&m, &HalfChars, 64);
        let asked = |stop: &[&str]| GenerationParams {
            stop: stop.iter().map(|s| s.to_string()).collect(),
            logprobs: Some(1),
            ..params(10)
        };
        g.add_streamed(0, vec![1], asked(&["cd"])).unwrap();
        g.add_streamed(1, vec![1], asked(&[])).unwrap();
        let mut pieces: Vec<Vec<Streamed>> = vec![Vec::new(); 2];
        let mut done = Vec::new();
        while !g.is_empty() {
            done.extend(g.step().unwrap());
            for (k, piece) in g.take_streamed() {
                pieces[k].push(piece);
            }
        }
        done.sort_by_key(|(k, _)| *k);
        for k in 0..2 {
            let streamed: Vec<TokenLogprob> = pieces[k]
                .iter()
                .flat_map(|p| p.logprobs.iter().cloned())
                .collect();
            assert_eq!(streamed, done[k].1.logprobs, "sequence {k}");
            assert_eq!(streamed.len(), done[k].1.tokens.len());
            // Each piece's text is covered by the tokens whose logprobs
            // have gone out with it or before it.
            let mut tokens = 0;
            let mut text = String::new();
            for p in &pieces[k] {
                tokens += p.logprobs.len();
                text.push_str(&p.text);
                let covered = HalfChars.decode(&done[k].1.tokens[..tokens]);
                assert!(covered.starts_with(&text), "{covered:?} vs {text:?}");
            }
        }
        // "é" (two tokens), "b", then "c" held with its logprob sent, "d" last.
        let counts: Vec<usize> = pieces[0].iter().map(|p| p.logprobs.len()).collect();
        assert_eq!(counts, [2, 1, 2]);
    }
}
