//! Structured outputs: a sequence whose text must be JSON (any object, or
//! valid against a JSON schema) samples each token from those that keep
//! the text a prefix of such JSON, so the finished text always parses and
//! validates unless `max_new_tokens` cuts it short.
//!
//! The grammar engine is llguidance (the library behind OpenAI's and
//! llama.cpp's structured outputs): a schema is compiled once per sequence
//! into a [`Constraint`], which computes each step's allowed tokens over
//! the model's vocabulary ([`ConstraintCompiler`] holds that vocabulary as
//! llguidance's token trie, built once per model at start-up).

use std::sync::Arc;

use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, ParserFactory};
use toktrie::{TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};

use crate::tokenizer::gguf::GgufTokenizer;

/// What a sequence's text must be.
#[derive(Debug, Clone, PartialEq)]
pub enum OutputFormat {
    /// A JSON object, any.
    JsonObject,
    /// JSON valid against this schema.
    JsonSchema(serde_json::Value),
}

/// Whitespace between JSON tokens: at most this run of spaces, newlines
/// and tabs (llguidance's default is any run, and a small model can spend
/// its whole `max_new_tokens` on newlines).
const WHITESPACE: &str = r"[\x20\x0A\x0D\x09]{1,8}";

impl OutputFormat {
    fn grammar(&self) -> TopLevelGrammar {
        let mut schema = match self {
            OutputFormat::JsonObject => serde_json::json!({"type": "object"}),
            OutputFormat::JsonSchema(schema) => schema.clone(),
        };
        // llguidance's options ride in the schema, unless it has its own.
        if let Some(object) = schema.as_object_mut() {
            object
                .entry("x-guidance")
                .or_insert_with(|| serde_json::json!({"whitespace_pattern": WHITESPACE}));
        }
        TopLevelGrammar::from_json_schema(schema)
    }
}

/// The model's vocabulary as llguidance reads it: each token's bytes
/// (control tokens marked special, so no grammar ever produces them), and
/// the tokenizer for what llguidance tokenizes itself.
struct Vocabulary {
    trie: TokTrie,
    tokenizer: Arc<GgufTokenizer>,
}

impl TokenizerEnv for Vocabulary {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        // Plain text only: special tokens spelled in it stay text.
        let text = String::from_utf8_lossy(s);
        self.tokenizer
            .tokenize(&text, false, false)
            .unwrap_or_default()
    }
}

/// Compiles output formats against one model's vocabulary.
pub struct ConstraintCompiler {
    factory: ParserFactory,
    /// Tokens that end a sequence: allowed exactly where the grammar may
    /// end.
    stops: Vec<u32>,
}

impl ConstraintCompiler {
    /// The vocabulary's trie (a few hundred milliseconds for 150k tokens).
    pub fn new(tokenizer: Arc<GgufTokenizer>) -> Result<ConstraintCompiler, String> {
        let stops = tokenizer.stop_ids().to_vec();
        let eos = *stops.first().ok_or("the tokenizer has no end token")?;
        let size = tokenizer.vocab_size() as u32;
        let words: Vec<Vec<u8>> = (0..size)
            .map(|id| match tokenizer.token_bytes(id) {
                Some(bytes) => bytes,
                None => {
                    let mut special = vec![TokTrie::SPECIAL_TOKEN_MARKER];
                    special.extend_from_slice(tokenizer.token_text(id).unwrap_or("").as_bytes());
                    special
                }
            })
            .collect();
        let info = TokRxInfo {
            tok_bos: tokenizer.bos_id,
            tok_end_of_turn: stops.get(1).copied(),
            ..TokRxInfo::new(size, eos)
        };
        let trie = TokTrie::from(&info, &words);
        let env: TokEnv = Arc::new(Vocabulary { trie, tokenizer });
        let mut factory = ParserFactory::new_simple(&env).map_err(|e| e.to_string())?;
        // Log nothing to stderr: a bad schema is the caller's error to report.
        factory.set_stderr_log_level(0);
        Ok(ConstraintCompiler { factory, stops })
    }

    /// A fresh constraint for one sequence; a schema llguidance cannot
    /// compile is refused with its reason.
    pub fn compile(&self, format: &OutputFormat) -> Result<Constraint, String> {
        let parser = self
            .factory
            .create_parser(format.grammar())
            .map_err(|e| format!("the JSON schema cannot be compiled: {e}"))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(format!("the JSON schema cannot be compiled: {e}"));
        }
        Ok(Constraint {
            format: format.clone(),
            matcher,
            stops: self.stops.clone(),
        })
    }
}

/// One sequence's constraint: which tokens may come next.
pub struct Constraint {
    format: OutputFormat,
    matcher: Matcher,
    stops: Vec<u32>,
}

impl Constraint {
    /// Sets every token that may not come next to -inf in `logits` (one
    /// per vocabulary entry, maybe more: those past the vocabulary are
    /// never allowed). Where the text may end, every end token is allowed.
    pub fn mask(&mut self, logits: &mut [f32]) -> Result<(), String> {
        let allowed = self.matcher.compute_mask().map_err(|e| e.to_string())?;
        let may_end = self.stops.iter().any(|&t| allowed.is_allowed(t));
        for (id, logit) in logits.iter_mut().enumerate() {
            let id = id as u32;
            let ok = if id < allowed.len() as u32 {
                allowed.is_allowed(id)
            } else {
                false
            };
            if !(ok || may_end && self.stops.contains(&id)) {
                *logit = f32::NEG_INFINITY;
            }
        }
        Ok(())
    }

    /// Moves past `token` (an end token needs no call).
    pub fn accept(&mut self, token: u32) -> Result<(), String> {
        self.matcher.consume_token(token).map_err(|e| e.to_string())
    }

    /// Whether the text is complete and nothing more may follow.
    pub fn is_finished(&self) -> bool {
        self.matcher.is_stopped()
    }
}

impl Clone for Constraint {
    fn clone(&self) -> Self {
        Constraint {
            format: self.format.clone(),
            matcher: self.matcher.deep_clone(),
            stops: self.stops.clone(),
        }
    }
}

/// Two constraints are equal when they constrain to the same format.
impl PartialEq for Constraint {
    fn eq(&self, other: &Self) -> bool {
        self.format == other.format
    }
}

impl std::fmt::Debug for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Constraint")
            .field("format", &self.format)
            .finish_non_exhaustive()
    }
}
