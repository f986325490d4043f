//! `sluice-consumer generate`: a GGUF model alone on a local file of
//! prompts, no NATS and no S3: each prompt's answer, its token ids and their
//! log-probabilities, one JSON line per prompt on stdout. For trying a model,
//! and for checking it against another engine token by token.

use std::io::Write;
use std::path::PathBuf;

use anyhow::Context;
use candle_core::Device;
use serde::Serialize;
use sluice_models::decoder::WeightFormat;
use sluice_models::decoder::generation::{Generator, MAX_TOP_LOGPROBS};
use sluice_schemas::{GenerateParameters, Item, PromptInput, Task};

use crate::fetch;
use crate::task::generate::executor::wire_finish_reason;
use crate::task::generate::logprobs::wire_logprobs;
use crate::task::generate::{chat_turns, generation_params, load};

#[derive(Debug, Clone, clap::Args)]
pub struct GenerateArgs {
    /// JSONL input, one prompt per line as a generate job's input takes it:
    /// {"prompt": "..."} (the text as is, the model's BOS added as it says)
    /// or {"messages": [...]} (through the model's chat template), each
    /// with its own parameters if it sets them.
    #[arg(long)]
    pub input: PathBuf,
    /// The GGUF file, or a directory holding one.
    #[arg(long)]
    pub model_dir: PathBuf,
    /// Tokens to generate per prompt, unless a line sets max_new_tokens.
    #[arg(long, default_value_t = 128)]
    pub max_new_tokens: u32,
    /// 0: greedy, unless a line sets temperature.
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f64,
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f64,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// How many of each step's most likely tokens to list beside the chosen
    /// one (0-20; each chosen token's logprob is always given).
    #[arg(long, default_value_t = 0)]
    pub top_logprobs: usize,
    /// The weights as the GGUF stores them, or converted (as the consumer's
    /// --weights).
    #[arg(long, default_value = "as-stored")]
    pub weights: WeightFormat,
    /// A Jinja chat template file to use instead of the GGUF's.
    #[arg(long)]
    pub chat_template: Option<PathBuf>,
}

/// One prompt's answer.
#[derive(Debug, Serialize)]
pub struct Answer {
    pub item: usize,
    pub text: String,
    pub finish_reason: sluice_schemas::FinishReason,
    pub prompt_ids: Vec<u32>,
    /// The generated ids (a stop sequence's included; not the end-of-turn
    /// token that ended it).
    pub ids: Vec<u32>,
    /// One per id: its logprob under the model's own distribution at its
    /// step, with the step's `--top-logprobs` most likely tokens.
    pub logprobs: Vec<sluice_schemas::Logprob>,
}

/// Generates for every prompt of `args.input` and writes the answers, in
/// input order, to `out`.
pub fn generate_file(args: &GenerateArgs, out: &mut impl Write) -> anyhow::Result<()> {
    if args.top_logprobs > MAX_TOP_LOGPROBS {
        anyhow::bail!(
            "--top-logprobs is {}; at most {MAX_TOP_LOGPROBS} (OpenAI's limit)",
            args.top_logprobs
        );
    }
    crate::alloc::tune();
    let (model, tokenizer) = load(
        &args.model_dir,
        args.weights,
        args.chat_template.as_deref(),
        &Device::Cpu,
    )?;
    let body = std::fs::read(&args.input)
        .with_context(|| format!("cannot read {}", args.input.display()))?;
    let mut items = Vec::new();
    fetch::parse_jsonl(Task::Generate, 0, &body, &mut items, u64::MAX)
        .map_err(|e| anyhow::anyhow!("{}: {}", args.input.display(), e.message))?;
    let defaults = GenerateParameters {
        max_new_tokens: Some(args.max_new_tokens),
        temperature: Some(args.temperature),
        top_p: Some(args.top_p),
        seed: Some(args.seed),
        // Always answered offline; a line's own `logprobs` lists its own
        // number of alternatives.
        logprobs: Some(args.top_logprobs as u32),
        ..GenerateParameters::default()
    };
    let context = model.config.context_length;
    let mut generator = Generator::new(&model, &tokenizer, 512);
    let mut prompts = Vec::with_capacity(items.len());
    for (i, item) in items.into_iter().enumerate() {
        let Item::Prompt(prompt) = item else {
            anyhow::bail!("line {}: not a prompt", i + 1);
        };
        let p = prompt.parameters.or(&defaults);
        p.check()
            .map_err(|m| anyhow::anyhow!("line {}: {m}", i + 1))?;
        if p.response_format.is_some() {
            anyhow::bail!(
                "line {}: response_format is not taken offline; run the job through a consumer",
                i + 1
            );
        }
        let ids = match &prompt.input {
            PromptInput::Text(t) => tokenizer.encode_prompt(t),
            PromptInput::Messages(m) => tokenizer.encode_chat(&chat_turns(m)),
        }
        .map_err(|e| anyhow::anyhow!("line {}: {e}", i + 1))?;
        let max_new_tokens = p.max_new_tokens.unwrap_or(args.max_new_tokens) as usize;
        let params = generation_params(p, max_new_tokens);
        params
            .check()
            .map_err(|m| anyhow::anyhow!("line {}: {m}", i + 1))?;
        if ids.is_empty() {
            anyhow::bail!("line {}: the prompt is empty", i + 1);
        }
        if ids.len() + params.max_new_tokens > context {
            anyhow::bail!(
                "line {}: the prompt's {} tokens and max_new_tokens {} exceed the model's context of {context}",
                i + 1,
                ids.len(),
                params.max_new_tokens
            );
        }
        generator.add(i, ids.clone(), params)?;
        prompts.push(ids);
    }
    let mut done = generator.run_to_end()?;
    done.sort_by_key(|(i, _)| *i);
    for (item, g) in done {
        let answer = Answer {
            item,
            text: g.text,
            finish_reason: wire_finish_reason(g.finish_reason),
            prompt_ids: std::mem::take(&mut prompts[item]),
            ids: g.tokens,
            logprobs: wire_logprobs(&tokenizer, &g.logprobs),
        };
        serde_json::to_writer(&mut *out, &answer)?;
        out.write_all(b"\n")?;
    }
    out.flush()?;
    Ok(())
}
