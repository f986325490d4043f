//! Continuous batching for text generation. Sequences join the running set
//! at any step and leave the step they finish (freeing their KV cache at
//! once); each step is one [`Llama::forward`] over a token segment per
//! sequence: the next chunk of a prompt still being read (prefill, chunked so
//! a step's tokens stay under `max_step_tokens`) or the one token a decoding
//! sequence sampled last.

use candle_transformers::generation::{LogitsProcessor, Sampling};

use super::ModelError;
use super::gguf_tokenizer::GgufTokenizer;
use super::llama::{KvCache, Llama, Segment};

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
}

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
        }
    }
}

/// Why a sequence ended (the wire type: length, stop or eos).
pub use sluice_schemas::FinishReason;

/// What a finished sequence produced.
#[derive(Debug, Clone, PartialEq)]
pub struct Generated {
    pub text: String,
    pub finish_reason: FinishReason,
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    /// The sampled token ids (stop-sequence tokens included).
    pub tokens: Vec<u32>,
}

struct Running<K> {
    key: K,
    prompt: Vec<u32>,
    /// Prompt tokens already in the cache.
    read: usize,
    /// The token to feed next once the prompt is read.
    next: Option<u32>,
    generated: Vec<u32>,
    params: GenerationParams,
    sampler: LogitsProcessor,
    cache: KvCache,
}

struct Waiting<K> {
    key: K,
    prompt: Vec<u32>,
    params: GenerationParams,
}

/// The sequences being generated, keyed by the caller's `K`: a running set
/// that holds KV caches, and a queue of sequences waiting for KV room.
pub struct Generator<'m, K> {
    model: &'m Llama,
    tokenizer: &'m GgufTokenizer,
    eos: Vec<u32>,
    max_step_tokens: usize,
    prefill_chunk: usize,
    /// The most KV-cache bytes the running set may reserve (None: no cap).
    kv_budget: Option<u64>,
    /// The most sequences in the running set (None: no cap).
    max_running: Option<usize>,
    /// The most KV-cache bytes the running set has reserved at once.
    peak_kv: u64,
    running: Vec<Running<K>>,
    waiting: std::collections::VecDeque<Waiting<K>>,
}

impl<'m, K: Clone> Generator<'m, K> {
    /// `max_step_tokens` caps the tokens of one step (prompt chunks plus one
    /// per decoding sequence); prompts are read in chunks of half of it, so
    /// decoding sequences always have the other half.
    pub fn new(model: &'m Llama, tokenizer: &'m GgufTokenizer, max_step_tokens: usize) -> Self {
        let mut eos = vec![tokenizer.eos_id];
        for name in ["<|im_end|>", "<|endoftext|>", "<|eot_id|>"] {
            if let Some(id) = tokenizer.tokenizer.token_to_id(name)
                && !eos.contains(&id)
            {
                eos.push(id);
            }
        }
        Generator {
            model,
            tokenizer,
            eos,
            max_step_tokens: max_step_tokens.max(1),
            prefill_chunk: (max_step_tokens / 2).max(1),
            kv_budget: None,
            max_running: None,
            peak_kv: 0,
            running: Vec::new(),
            waiting: std::collections::VecDeque::new(),
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
        (prompt_tokens + max_new_tokens) as u64 * self.model.config.kv_bytes_per_token()
    }

    /// KV-cache bytes the running set holds now.
    pub fn reserved_kv_bytes(&self) -> u64 {
        let per_token = self.model.config.kv_bytes_per_token();
        self.running
            .iter()
            .map(|r| r.cache.capacity() as u64 * per_token)
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
        if prompt.is_empty() {
            return Err(ModelError::Failed("an empty prompt".into()));
        }
        params.check().map_err(ModelError::Failed)?;
        let capacity = prompt.len() + params.max_new_tokens;
        if capacity > self.model.config.context_length {
            return Err(ModelError::Failed(format!(
                "prompt ({}) + max_new_tokens ({}) exceed the model's context of {} tokens",
                prompt.len(),
                params.max_new_tokens,
                self.model.config.context_length
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
            let token = r.sampler.sample(&logits.get(row)?)?;
            if let Some(reason) = record(&self.eos, self.tokenizer, r, token) {
                finished.push((i, reason));
            }
        }
        let mut done = Vec::with_capacity(finished.len());
        // Highest index first, so the lower ones stay where they are.
        for &(i, reason) in finished.iter().rev() {
            let r = self.running.remove(i);
            done.push((r.key.clone(), self.result(&r, reason)));
        }
        done.reverse();
        Ok(done)
    }

    fn result(&self, r: &Running<K>, reason: FinishReason) -> Generated {
        let mut text = self.tokenizer.decode(&r.generated);
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
        }
    }
}

/// Records `token` and says whether the sequence is done.
fn record<K>(
    eos: &[u32],
    tokenizer: &GgufTokenizer,
    r: &mut Running<K>,
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
