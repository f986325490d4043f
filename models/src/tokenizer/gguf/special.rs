//! Cutting a text at the special tokens it spells before the tokenizer sees
//! it, as llama.cpp's `tokenizer_st_partition` does: each special token in
//! turn, the longest first, splits every text fragment left at each of its
//! occurrences, left to right. User-defined tokens are always cut out,
//! control (and unknown) ones only when special tokens are parsed. An
//! Aho-Corasick pass first finds which special tokens occur at all, so a
//! vocabulary of thousands of them costs one scan of the text.

use aho_corasick::AhoCorasick;

use super::vocab::{TokenKind, Vocab};

/// A piece of a text: plain text for the tokenizer, or a special token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fragment<'t> {
    Text(&'t str),
    Token(u32),
}

pub(crate) struct Specials {
    /// All special tokens' texts (pattern `i` is `ids[i]`'s text).
    matcher: Option<AhoCorasick>,
    ids: Vec<u32>,
    /// Tokens that eat the whitespace after them (llama.cpp's
    /// `LLAMA_TOKEN_ATTR_RSTRIP`, which it sets for Phi-3's vocabulary).
    rstrip: Vec<u32>,
}

impl Specials {
    /// The special tokens of `vocab`; `model_name` is the GGUF's
    /// `general.name`, which tells llama.cpp which tokens strip whitespace.
    pub(crate) fn new(vocab: &Vocab, model_name: &str) -> Result<Specials, String> {
        let ids: Vec<u32> = (0..vocab.len() as u32)
            .filter(|&id| {
                matches!(
                    vocab.kind(id),
                    TokenKind::Control | TokenKind::UserDefined | TokenKind::Unknown
                ) && !vocab.texts[id as usize].is_empty()
            })
            .collect();
        let matcher = if ids.is_empty() {
            None
        } else {
            let patterns = ids.iter().map(|&id| vocab.texts[id as usize].as_str());
            Some(AhoCorasick::new(patterns).map_err(|e| e.to_string())?)
        };
        // llama.cpp's rule for Phi-3: every special token but <unk>, <s>
        // and <|endoftext|> (and </s> whatever its type) strips the
        // whitespace to its right.
        let name = model_name.to_lowercase();
        let rstrip = if name.contains("phi-3") || name.contains("phi3") {
            ids.iter()
                .copied()
                .chain(vocab.id("</s>"))
                .filter(|&id| {
                    !["<unk>", "<s>", "<|endoftext|>"].contains(&vocab.texts[id as usize].as_str())
                })
                .collect()
        } else {
            Vec::new()
        };
        Ok(Specials {
            matcher,
            ids,
            rstrip,
        })
    }

    /// `text` cut at the special tokens it spells (the control ones only
    /// when `parse_special`).
    pub(crate) fn partition<'t>(
        &self,
        vocab: &Vocab,
        text: &'t str,
        parse_special: bool,
    ) -> Vec<Fragment<'t>> {
        if text.is_empty() {
            return Vec::new();
        }
        let mut found: Vec<u32> = match &self.matcher {
            Some(m) => m
                .find_overlapping_iter(text)
                .map(|hit| self.ids[hit.pattern().as_usize()])
                .filter(|&id| vocab.kind(id).is_matched(parse_special))
                .collect(),
            None => Vec::new(),
        };
        found.sort_by(|a, b| {
            let (ta, tb) = (&vocab.texts[*a as usize], &vocab.texts[*b as usize]);
            tb.len().cmp(&ta.len()).then(a.cmp(b))
        });
        found.dedup();
        let mut fragments = vec![Fragment::Text(text)];
        for id in found {
            let special = vocab.texts[id as usize].as_str();
            let strips = self.rstrip.contains(&id);
            let mut next = Vec::with_capacity(fragments.len() + 2);
            for fragment in fragments {
                let Fragment::Text(t) = fragment else {
                    next.push(fragment);
                    continue;
                };
                let mut rest = 0;
                for (at, _) in t.match_indices(special) {
                    if at > rest {
                        next.push(Fragment::Text(&t[rest..at]));
                    }
                    next.push(Fragment::Token(id));
                    rest = at + special.len();
                    if strips {
                        // C's isspace, as llama.cpp strips.
                        let kept =
                            t[rest..].trim_start_matches([' ', '\t', '\n', '\x0b', '\x0c', '\r']);
                        rest = t.len() - kept.len();
                    }
                }
                if rest < t.len() {
                    next.push(Fragment::Text(&t[rest..]));
                }
            }
            fragments = next;
        }
        fragments
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    /// Longer tokens first, user-defined always, control only when parsed.
    #[test]
    fn texts_are_cut_at_the_special_tokens_they_spell() {
        let texts = ["a", "<s>", "<|im|>", "<|im|>x", "[u]"]
            .map(String::from)
            .to_vec();
        let kinds = vec![
            TokenKind::Normal,
            TokenKind::Control,
            TokenKind::Control,
            TokenKind::Control,
            TokenKind::UserDefined,
        ];
        let vocab = Vocab::new(texts, kinds, vec![0.0; 5]);
        let specials = Specials::new(&vocab, "test").unwrap();
        use Fragment::{Text, Token};
        assert_eq!(
            specials.partition(&vocab, "hi<|im|>x<s> [u]!", true),
            [
                Text("hi"),
                Token(3),
                Token(1),
                Text(" "),
                Token(4),
                Text("!")
            ]
        );
        assert_eq!(
            specials.partition(&vocab, "<s>[u]<s>", false),
            [Text("<s>"), Token(4), Text("<s>")]
        );
        assert_eq!(specials.partition(&vocab, "", true), []);
        assert_eq!(specials.partition(&vocab, "plain", true), [Text("plain")]);
    }
}
