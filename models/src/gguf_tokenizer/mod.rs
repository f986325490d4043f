//! A `tokenizers::Tokenizer` built from a GGUF file's own metadata (no
//! tokenizer.json): the vocabulary, the BPE merges and the special tokens
//! that llama.cpp's converter stores as `tokenizer.ggml.*`.
//!
//! Only byte-level BPE (`tokenizer.ggml.model = "gpt2"`) is supported, with
//! the pre-tokenizers of the `pre` types whose regex we know; anything else
//! is refused by name rather than tokenized differently from the model's
//! training.

use candle_core::quantized::gguf_file::{Content, Value};
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::BPE;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::{AddedToken, PreTokenizerWrapper, Tokenizer};

/// llama.cpp's token types (`tokenizer.ggml.token_type`).
const TOKEN_TYPE_CONTROL: i32 = 3;
const TOKEN_TYPE_USER_DEFINED: i32 = 4;

/// The tokenizer and the special ids generation needs.
pub struct GgufTokenizer {
    pub tokenizer: Tokenizer,
    /// The same tokenizer with special-token texts read as plain text: chat
    /// message contents go through it, so a message cannot open or close a
    /// turn by containing `<|im_end|>`.
    literal: Tokenizer,
    pub eos_id: u32,
    pub bos_id: Option<u32>,
    /// Jinja chat template from the GGUF, if any (we apply the ChatML form
    /// it describes; see [`GgufTokenizer::chat_prompt`]).
    pub chat_template: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum GgufTokenizerError {
    #[error("GGUF metadata has no {0}")]
    Missing(&'static str),
    #[error("GGUF metadata {key} is malformed: {why}")]
    Malformed { key: &'static str, why: String },
    #[error("tokenizer.ggml.model = {0:?} is not supported (only byte-level BPE, \"gpt2\")")]
    UnsupportedModel(String),
    #[error("tokenizer.ggml.pre = {0:?} is not supported (known: smollm, gpt2, starcoder, refact)")]
    UnsupportedPre(String),
    #[error("cannot build the tokenizer: {0}")]
    Build(String),
}

fn get<'a>(content: &'a Content, key: &'static str) -> Result<&'a Value, GgufTokenizerError> {
    content
        .metadata
        .get(key)
        .ok_or(GgufTokenizerError::Missing(key))
}

fn malformed(key: &'static str) -> impl Fn(candle_core::Error) -> GgufTokenizerError {
    move |e| GgufTokenizerError::Malformed {
        key,
        why: e.to_string(),
    }
}

fn strings(content: &Content, key: &'static str) -> Result<Vec<String>, GgufTokenizerError> {
    get(content, key)?
        .to_vec()
        .map_err(malformed(key))?
        .iter()
        .map(|v| v.to_string().cloned().map_err(malformed(key)))
        .collect()
}

fn id(content: &Content, key: &'static str) -> Result<Option<u32>, GgufTokenizerError> {
    match content.metadata.get(key) {
        None => Ok(None),
        Some(v) => v.to_u32().map(Some).map_err(malformed(key)),
    }
}

impl GgufTokenizer {
    pub fn from_gguf(content: &Content) -> Result<GgufTokenizer, GgufTokenizerError> {
        let model = get(content, "tokenizer.ggml.model")?
            .to_string()
            .map_err(malformed("tokenizer.ggml.model"))?;
        if model != "gpt2" {
            return Err(GgufTokenizerError::UnsupportedModel(model.clone()));
        }
        let pre = match content.metadata.get("tokenizer.ggml.pre") {
            Some(v) => v
                .to_string()
                .map_err(malformed("tokenizer.ggml.pre"))?
                .clone(),
            None => "default".to_string(),
        };
        // llama.cpp splits digits one by one for these, then applies the
        // GPT-2 regex (which ByteLevel's `use_regex` is).
        let pre_tokenizer: PreTokenizerWrapper = match pre.as_str() {
            "smollm" | "starcoder" | "refact" => Sequence::new(vec![
                Digits::new(true).into(),
                ByteLevel::new(false, true, true).into(),
            ])
            .into(),
            "gpt2" | "default" => ByteLevel::new(false, true, true).into(),
            other => return Err(GgufTokenizerError::UnsupportedPre(other.to_string())),
        };

        let tokens = strings(content, "tokenizer.ggml.tokens")?;
        let merges_text = strings(content, "tokenizer.ggml.merges")?;
        let types: Vec<i32> = match content.metadata.get("tokenizer.ggml.token_type") {
            Some(v) => v
                .to_vec()
                .map_err(malformed("tokenizer.ggml.token_type"))?
                .iter()
                .map(|t| t.to_i32().map_err(malformed("tokenizer.ggml.token_type")))
                .collect::<Result<_, _>>()?,
            None => vec![1; tokens.len()],
        };
        if types.len() != tokens.len() {
            return Err(GgufTokenizerError::Malformed {
                key: "tokenizer.ggml.token_type",
                why: format!("{} types for {} tokens", types.len(), tokens.len()),
            });
        }
        let vocab: tokenizers::models::bpe::Vocab = tokens
            .iter()
            .enumerate()
            .map(|(i, t)| (t.clone(), i as u32))
            .collect();
        let merges = merges_text
            .iter()
            .map(|m| {
                m.split_once(' ')
                    .map(|(a, b)| (a.to_string(), b.to_string()))
                    .ok_or_else(|| GgufTokenizerError::Malformed {
                        key: "tokenizer.ggml.merges",
                        why: format!("{m:?} is not two tokens"),
                    })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let bpe = BPE::builder()
            .vocab_and_merges(vocab, merges)
            .build()
            .map_err(|e| GgufTokenizerError::Build(e.to_string()))?;
        let mut tokenizer = Tokenizer::new(bpe);
        tokenizer.with_pre_tokenizer(Some(pre_tokenizer));
        tokenizer.with_decoder(Some(ByteLevelDecoder::default()));
        // Control and user-defined tokens match whole in the text (the chat
        // template's <|im_start|>) and are never split by the BPE.
        let special: Vec<AddedToken> = tokens
            .iter()
            .zip(&types)
            .filter(|(_, t)| matches!(**t, TOKEN_TYPE_CONTROL | TOKEN_TYPE_USER_DEFINED))
            .map(|(tok, _)| AddedToken::from(tok.clone(), true))
            .collect();
        tokenizer
            .add_special_tokens(special)
            .map_err(|e| GgufTokenizerError::Build(e.to_string()))?;

        let mut literal = tokenizer.clone();
        literal.set_encode_special_tokens(true);

        let eos_id = id(content, "tokenizer.ggml.eos_token_id")?
            .ok_or(GgufTokenizerError::Missing("tokenizer.ggml.eos_token_id"))?;
        let chat_template = content
            .metadata
            .get("tokenizer.chat_template")
            .and_then(|v| v.to_string().ok().cloned());
        Ok(GgufTokenizer {
            tokenizer,
            literal,
            eos_id,
            bos_id: id(content, "tokenizer.ggml.bos_token_id")?,
            chat_template,
        })
    }

    pub fn encode(&self, text: &str) -> Result<Vec<u32>, GgufTokenizerError> {
        self.tokenizer
            .encode(text, false)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| GgufTokenizerError::Build(e.to_string()))
    }

    /// A chat as token ids, in the form [`GgufTokenizer::chat_prompt`] renders,
    /// with the turn markers as their special ids and everything the messages
    /// carry (roles, contents) tokenized as plain text: a content of
    /// `"<|im_end|>\n<|im_start|>system\n..."` stays text inside its turn.
    /// For benign contents the ids equal `encode(&chat_prompt(messages))`.
    pub fn encode_chat(&self, messages: &[ChatMessage]) -> Result<Vec<u32>, GgufTokenizerError> {
        let marker = |token: &'static str| {
            self.tokenizer
                .token_to_id(token)
                .ok_or(GgufTokenizerError::Missing(token))
        };
        let (start, end) = (marker("<|im_start|>")?, marker("<|im_end|>")?);
        let literal = |text: &str| {
            self.literal
                .encode(text, false)
                .map(|e| e.get_ids().to_vec())
                .map_err(|e| GgufTokenizerError::Build(e.to_string()))
        };
        let mut ids = Vec::new();
        let mut turn = |role: &str, content: &str| -> Result<(), GgufTokenizerError> {
            ids.push(start);
            ids.extend(literal(&format!("{role}\n{content}"))?);
            ids.push(end);
            ids.extend(literal("\n")?);
            Ok(())
        };
        for (role, content) in self.turns(messages) {
            turn(role, content)?;
        }
        ids.push(start);
        ids.extend(literal("assistant\n")?);
        Ok(ids)
    }

    /// Text of `ids`, special tokens left out.
    pub fn decode(&self, ids: &[u32]) -> String {
        self.tokenizer.decode(ids, true).unwrap_or_default()
    }

    /// A chat-style prompt in the ChatML form SmolLM2's template renders:
    /// each message as `<|im_start|>role\ncontent<|im_end|>\n`, then the
    /// assistant's turn opened. A system message is added when the template
    /// would add its default one and the caller gave none.
    pub fn chat_prompt(&self, messages: &[ChatMessage]) -> String {
        let mut out = String::new();
        for (role, content) in self.turns(messages) {
            out.push_str(&format!("<|im_start|>{role}\n{content}<|im_end|>\n"));
        }
        out.push_str("<|im_start|>assistant\n");
        out
    }

    /// The `(role, content)` turns a chat renders to: the template's default
    /// system prompt when the caller gave no system message, then the
    /// messages.
    fn turns<'a>(
        &'a self,
        messages: &'a [ChatMessage],
    ) -> impl Iterator<Item = (&'a str, &'a str)> {
        let default = messages
            .first()
            .is_none_or(|m| m.role != "system")
            .then(|| self.default_system_prompt())
            .flatten();
        default.map(|d| ("system", d)).into_iter().chain(
            messages
                .iter()
                .map(|m| (m.role.as_str(), m.content.as_str())),
        )
    }

    /// The system prompt the GGUF's template inserts when there is none.
    fn default_system_prompt(&self) -> Option<&str> {
        let template = self.chat_template.as_deref()?;
        let start = template.find("<|im_start|>system\n")? + "<|im_start|>system\n".len();
        let rest = &template[start..];
        let end = rest.find("<|im_end|>")?;
        let text = &rest[..end];
        // A literal default, not a `{{ ... }}` expression.
        (!text.contains("{{") && !text.is_empty()).then_some(text)
    }
}

/// One chat turn: its `role` (system, user or assistant) and its text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}
