//! Byte-level BPE from a GGUF (`tokenizer.ggml.model = "gpt2"`: Llama 3,
//! Qwen 2/3, SmolLM, GPT-2, Mistral's Tekken): the pre-tokenizer regexes
//! llama.cpp applies for each `tokenizer.ggml.pre`, then the bytes mapped
//! to GPT-2's printable characters and merged by the BPE ranks
//! (`tokenizer.ggml.merges`), run by the `tokenizers` crate. Each regex of a
//! type splits the pieces the previous one left, its matches and the text
//! between them both kept (llama.cpp's `unicode_regex_split`).

use std::sync::OnceLock;

use tokenizers::models::bpe::BPE;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{PreTokenizerWrapper, SplitDelimiterBehavior, Tokenizer};

use super::vocab::Vocab;

/// GPT-2's word regex, as llama.cpp writes it.
const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
/// Llama 3's, with digits in runs of up to three.
const LLAMA3: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen 2's: Llama 3's with single digits.
const QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Mistral's Tekken.
const TEKKEN: &str = r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// How llama.cpp pre-tokenizes one `tokenizer.ggml.pre` type.
#[derive(Debug, PartialEq)]
pub(crate) struct PreTokenizer {
    pub(crate) regexes: &'static [&'static str],
    /// A piece that is a token as a whole is that token, whatever the merges
    /// (Llama 3, Tekken).
    pub(crate) ignore_merges: bool,
    /// Whether a BOS token is added when the GGUF does not say
    /// (`tokenizer.ggml.add_bos_token`).
    pub(crate) add_bos: bool,
}

/// The pre-tokenizer types sluice runs, for errors.
pub(crate) const KNOWN: &str = "default, gpt-2, phi-2, mpt, olmo, llama-bpe, llama3, llama-v3, falcon3, pixtral, dbrx, smaug-bpe, qwen2, deepseek-r1-qwen, stablelm2, smollm, starcoder, refact, command-r, codeshell, tekken";

/// The pre-tokenizer of `pre` (`None` for the GGUF's missing key:
/// llama.cpp's default), or `None` for a type sluice does not run.
pub(crate) fn pre_tokenizer(pre: Option<&str>) -> Option<PreTokenizer> {
    let plain = |regexes| PreTokenizer {
        regexes,
        ignore_merges: false,
        add_bos: false,
    };
    Some(match pre.unwrap_or("default") {
        "default" => plain(&[r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"]),
        "gpt-2" | "phi-2" | "mpt" | "olmo" => plain(&[GPT2]),
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "pixtral" => PreTokenizer {
            regexes: &[LLAMA3],
            ignore_merges: true,
            add_bos: true,
        },
        "dbrx" | "smaug-bpe" => plain(&[LLAMA3]),
        "qwen2" | "deepseek-r1-qwen" | "stablelm2" => plain(&[QWEN2]),
        "smollm" | "starcoder" | "refact" | "command-r" | "codeshell" => plain(&[r"\p{N}", GPT2]),
        "tekken" => PreTokenizer {
            regexes: &[TEKKEN],
            ignore_merges: true,
            add_bos: true,
        },
        _ => return None,
    })
}

/// The BPE over `vocab` and `merges` with `pre`'s regexes, no added tokens
/// (special tokens are cut out before it: `special.rs`).
pub(crate) fn build(
    vocab: &Vocab,
    merges: Vec<(String, String)>,
    pre: &PreTokenizer,
) -> Result<Tokenizer, String> {
    let ids: tokenizers::models::bpe::Vocab = vocab
        .texts
        .iter()
        .enumerate()
        .map(|(i, t)| (t.clone(), i as u32))
        .collect();
    let bpe = BPE::builder()
        .vocab_and_merges(ids, merges)
        .ignore_merges(pre.ignore_merges)
        .build()
        .map_err(|e| e.to_string())?;
    let mut steps: Vec<PreTokenizerWrapper> = Vec::new();
    for regex in pre.regexes {
        let split = Split::new(
            SplitPattern::Regex((*regex).to_string()),
            SplitDelimiterBehavior::Isolated,
            false,
        )
        .map_err(|e| e.to_string())?;
        steps.push(split.into());
    }
    steps.push(ByteLevel::new(false, false, false).into());
    let mut tokenizer = Tokenizer::new(bpe);
    tokenizer.with_pre_tokenizer(Some(Sequence::new(steps)));
    Ok(tokenizer)
}

/// The bytes of a byte-level BPE token's text: GPT-2's printable stand-ins
/// mapped back (`bytes_to_unicode`'s inverse); a character that stands for
/// no byte is kept as its UTF-8.
pub(crate) fn token_bytes(text: &str, out: &mut Vec<u8>) {
    for c in text.chars() {
        match byte_of(c) {
            Some(b) => out.push(b),
            None => out.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes()),
        }
    }
}

/// GPT-2's `bytes_to_unicode`, inverted: the printable bytes stand for
/// themselves, the other 68 for U+0100 onwards in byte order.
fn byte_of(c: char) -> Option<u8> {
    static TABLE: OnceLock<Vec<Option<u8>>> = OnceLock::new();
    let table = TABLE.get_or_init(|| {
        let printable =
            |b: u8| (0x21..=0x7E).contains(&b) || (0xA1..=0xAC).contains(&b) || b >= 0xAE;
        let mut table = vec![None; 0x100 + 68];
        let mut next = 0x100;
        for b in 0..=255u8 {
            if printable(b) {
                table[b as usize] = Some(b);
            } else {
                table[next] = Some(b);
                next += 1;
            }
        }
        table
    });
    table.get(c as usize).copied().flatten()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    /// Every byte has one stand-in, and each maps back.
    #[test]
    fn byte_stand_ins_map_back_to_their_bytes() {
        let mut seen = std::collections::HashSet::new();
        for c in (0u32..0x200).filter_map(char::from_u32) {
            if let Some(b) = byte_of(c) {
                assert!(seen.insert(b), "two stand-ins for {b}");
            }
        }
        assert_eq!(seen.len(), 256);
        // ' ' is U+0120 (Ġ), '\n' U+010A (Ċ).
        assert_eq!(byte_of('Ġ'), Some(b' '));
        assert_eq!(byte_of('Ċ'), Some(b'\n'));
        let mut out = Vec::new();
        token_bytes("ĠcafÃ©", &mut out);
        assert_eq!(String::from_utf8(out).unwrap(), " café");
    }

    #[test]
    fn each_known_type_has_regexes_and_others_are_refused() {
        for name in KNOWN.split(", ") {
            assert!(pre_tokenizer(Some(name)).is_some(), "{name}");
        }
        assert!(pre_tokenizer(None).is_some());
        assert!(pre_tokenizer(Some("deepseek-coder")).is_none());
        assert!(pre_tokenizer(Some("llama-bpe")).unwrap().ignore_merges);
    }
}
