//! A GGUF's vocabulary as llama.cpp reads it (`tokenizer.ggml.tokens`,
//! `.token_type`, `.scores`): each token's text, kind and score, and the
//! lookups the tokenizers need.

use std::collections::HashMap;

/// llama.cpp's token types (`tokenizer.ggml.token_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TokenKind {
    Normal,
    Unknown,
    /// Markup of the model's formats (`<|im_start|>`, `<s>`): matched in a
    /// text only when special tokens are parsed, left out of decoded text.
    Control,
    /// Added by the model's authors: always matched whole in a text, kept in
    /// decoded text.
    UserDefined,
    Unused,
    /// SentencePiece's byte fallback, `<0xAB>`.
    Byte,
}

impl TokenKind {
    pub(crate) fn from_gguf(t: i32) -> TokenKind {
        match t {
            2 => TokenKind::Unknown,
            3 => TokenKind::Control,
            4 => TokenKind::UserDefined,
            5 => TokenKind::Unused,
            6 => TokenKind::Byte,
            // 1, and llama.cpp's "undefined" (0 or anything else), read as
            // normal text.
            _ => TokenKind::Normal,
        }
    }

    /// Whether the token is cut out of a text before the tokenizer sees it:
    /// user-defined tokens always, control and unknown ones when special
    /// tokens are parsed (llama.cpp's `tokenizer_st_partition`).
    pub(crate) fn is_matched(self, parse_special: bool) -> bool {
        match self {
            TokenKind::UserDefined => true,
            TokenKind::Control | TokenKind::Unknown => parse_special,
            _ => false,
        }
    }
}

/// Token texts that end a generation, as llama.cpp's end-of-generation
/// set has them (`special_eog_ids`: the families' end-of-turn and
/// end-of-text markers, and the FIM pad / repo / file-separator tokens).
pub(crate) const END_OF_GENERATION: [&str; 29] = [
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<\u{ff5c}end\u{2581}of\u{2581}sentence\u{ff5c}>",
    "[e~[",
    "<|fim_pad|>",
    "<fim-pad>",
    "<fim_pad>",
    "<|fim_repo|>",
    "<|repo_name|>",
    "<fim-repo>",
    "<|file_sep|>",
];

/// Token texts llama.cpp reads as control tokens whatever their stored
/// type (its end-of-turn and fill-in-the-middle detection), beside
/// [`END_OF_GENERATION`]: in a text they match only where special tokens
/// are parsed.
const ALSO_CONTROL: [&str; 21] = [
    "<|fim_prefix|>",
    "<fim-prefix>",
    "<fim_prefix>",
    "<PRE>",
    "\u{2581}<PRE>",
    "<|code_prefix|>",
    "<|prefix|>",
    "<|fim_suffix|>",
    "<fim-suffix>",
    "<fim_suffix>",
    "<SUF>",
    "\u{2581}<SUF>",
    "<|code_suffix|>",
    "<|suffix|>",
    "<|fim_middle|>",
    "<fim-middle>",
    "<fim_middle>",
    "<MID>",
    "\u{2581}<MID>",
    "<|code_middle|>",
    "<|middle|>",
];

pub(crate) struct Vocab {
    pub(crate) texts: Vec<String>,
    pub(crate) kinds: Vec<TokenKind>,
    pub(crate) scores: Vec<f32>,
    ids: HashMap<String, u32>,
    /// SentencePiece's `<0xAB>` token of each byte, where the vocabulary has
    /// one.
    byte_tokens: [Option<u32>; 256],
}

impl Vocab {
    pub(crate) fn new(texts: Vec<String>, mut kinds: Vec<TokenKind>, scores: Vec<f32>) -> Vocab {
        let ids: HashMap<String, u32> = texts
            .iter()
            .enumerate()
            .map(|(i, t)| (t.clone(), i as u32))
            .collect();
        for name in END_OF_GENERATION.iter().chain(&ALSO_CONTROL) {
            if let Some(&id) = ids.get(*name) {
                kinds[id as usize] = TokenKind::Control;
            }
        }
        let mut byte_tokens = [None; 256];
        for (b, slot) in byte_tokens.iter_mut().enumerate() {
            *slot = ids.get(&format!("<0x{b:02X}>")).copied();
        }
        Vocab {
            texts,
            kinds,
            scores,
            ids,
            byte_tokens,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.texts.len()
    }

    pub(crate) fn id(&self, text: &str) -> Option<u32> {
        self.ids.get(text).copied()
    }

    pub(crate) fn kind(&self, id: u32) -> TokenKind {
        self.kinds
            .get(id as usize)
            .copied()
            .unwrap_or(TokenKind::Unused)
    }

    /// The token for one byte SentencePiece could not cover: its `<0xAB>`
    /// token, else the byte's own one-character token (llama.cpp's
    /// `byte_to_token`).
    pub(crate) fn byte_token(&self, byte: u8) -> Option<u32> {
        self.byte_tokens[byte as usize]
            .or_else(|| std::str::from_utf8(&[byte]).ok().and_then(|s| self.id(s)))
    }

    /// The byte a `<0xAB>` token stands for.
    pub(crate) fn byte_of(&self, id: u32) -> Option<u8> {
        let text = self.texts.get(id as usize)?;
        let hex = text.strip_prefix("<0x")?.strip_suffix('>')?;
        u8::from_str_radix(hex, 16).ok()
    }
}
