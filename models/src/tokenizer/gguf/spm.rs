//! SentencePiece tokenization of a GGUF vocabulary
//! (`tokenizer.ggml.model = "llama"`: Llama 2, Mistral, TinyLlama, Gemma),
//! as llama.cpp's `llm_tokenizer_spm_session` does it: the text's
//! characters are merged pairwise, the pair whose merged text is the
//! vocabulary's highest-scoring token first (the leftmost on a tie), until
//! no adjacent pair is a token; a piece that is no token is split back along
//! its merges, and what is left falls back to byte tokens.

use std::collections::{BinaryHeap, HashMap};

use super::vocab::Vocab;

/// A run of the text: `start..start + len` bytes, linked to its neighbours.
#[derive(Clone, Copy)]
struct Symbol {
    start: usize,
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

/// Two adjacent symbols whose text together is a token.
#[derive(PartialEq)]
struct Bigram {
    score: f32,
    left: usize,
    right: usize,
    len: usize,
}

impl Eq for Bigram {}

impl Ord for Bigram {
    /// The highest score first; on a tie the leftmost.
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.score
            .total_cmp(&other.score)
            .then(other.left.cmp(&self.left))
    }
}

impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

/// Appends the tokens of `text` (spaces already written as `▁`) to `out`.
/// A byte that has no token of its own becomes `unknown`.
pub(crate) fn tokenize(vocab: &Vocab, text: &str, unknown: u32, out: &mut Vec<u32>) {
    let mut symbols: Vec<Symbol> = Vec::new();
    for (start, c) in text.char_indices() {
        let i = symbols.len();
        symbols.push(Symbol {
            start,
            len: c.len_utf8(),
            prev: i.checked_sub(1),
            next: None,
        });
        if i > 0 {
            symbols[i - 1].next = Some(i);
        }
    }
    if symbols.is_empty() {
        return;
    }
    let mut session = Session {
        vocab,
        text,
        symbols,
        queue: BinaryHeap::new(),
        merged_from: HashMap::new(),
    };
    for i in 1..session.symbols.len() {
        session.try_pair(Some(i - 1), Some(i));
    }
    while let Some(pair) = session.queue.pop() {
        let (left, right) = (session.symbols[pair.left], session.symbols[pair.right]);
        // One of them was merged into another pair since.
        if left.len == 0 || right.len == 0 || left.len + right.len != pair.len {
            continue;
        }
        session.symbols[pair.left].len += right.len;
        session.symbols[pair.right].len = 0;
        session.symbols[pair.left].next = right.next;
        if let Some(next) = right.next {
            session.symbols[next].prev = Some(pair.left);
        }
        session.try_pair(left.prev, Some(pair.left));
        session.try_pair(Some(pair.left), right.next);
    }
    let mut i = Some(0);
    while let Some(at) = i {
        session.resegment(at, unknown, out);
        i = session.symbols[at].next;
    }
}

struct Session<'a> {
    vocab: &'a Vocab,
    text: &'a str,
    symbols: Vec<Symbol>,
    queue: BinaryHeap<Bigram>,
    /// The last pair each merged text was made from (llama.cpp's
    /// `rev_merge`).
    merged_from: HashMap<&'a str, (usize, usize)>,
}

impl<'a> Session<'a> {
    fn try_pair(&mut self, left: Option<usize>, right: Option<usize>) {
        let (Some(left), Some(right)) = (left, right) else {
            return;
        };
        let start = self.symbols[left].start;
        let len = self.symbols[left].len + self.symbols[right].len;
        let text = &self.text[start..start + len];
        let Some(id) = self.vocab.id(text) else {
            return;
        };
        self.queue.push(Bigram {
            score: self.vocab.scores.get(id as usize).copied().unwrap_or(0.0),
            left,
            right,
            len,
        });
        self.merged_from.insert(text, (left, right));
    }

    fn resegment(&self, at: usize, unknown: u32, out: &mut Vec<u32>) {
        let symbol = self.symbols[at];
        let text = &self.text[symbol.start..symbol.start + symbol.len];
        if let Some(id) = self.vocab.id(text) {
            out.push(id);
            return;
        }
        if let Some(&(left, right)) = self.merged_from.get(text) {
            self.resegment(left, unknown, out);
            self.resegment(right, unknown, out);
            return;
        }
        out.extend(
            text.bytes()
                .map(|b| self.vocab.byte_token(b).unwrap_or(unknown)),
        );
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use crate::tokenizer::gguf::vocab::TokenKind;

    fn vocab(tokens: &[(&str, f32)]) -> Vocab {
        let mut texts: Vec<String> = tokens.iter().map(|(t, _)| t.to_string()).collect();
        let mut scores: Vec<f32> = tokens.iter().map(|(_, s)| *s).collect();
        for b in 0..=255u8 {
            texts.push(format!("<0x{b:02X}>"));
            scores.push(0.0);
        }
        let kinds = texts
            .iter()
            .map(|t| {
                if t.starts_with("<0x") {
                    TokenKind::Byte
                } else {
                    TokenKind::Normal
                }
            })
            .collect();
        Vocab::new(texts, kinds, scores)
    }

    fn ids(v: &Vocab, text: &str) -> Vec<String> {
        let mut out = Vec::new();
        tokenize(v, text, 0, &mut out);
        out.iter().map(|&i| v.texts[i as usize].clone()).collect()
    }

    /// The highest-scoring pair merges first, ties go to the leftmost, and
    /// what no token covers falls back to bytes.
    #[test]
    fn pairs_merge_by_score_and_the_rest_falls_back_to_bytes() {
        let v = vocab(&[
            ("▁", -1.0),
            ("a", -2.0),
            ("b", -2.0),
            ("c", -2.0),
            ("ab", -5.0),
            ("bc", -3.0),
            ("▁a", -4.0),
            ("abc", -1.0),
            ("aa", -1.0),
        ]);
        // "bc" (-3) beats "ab" (-5): a + bc, and "abc" is then no pair
        // (a | bc has text "abc", a token: merged).
        assert_eq!(ids(&v, "abc"), ["abc"]);
        // ▁a (-4) beats ab (-5); then ▁a | b has no token "▁ab".
        assert_eq!(ids(&v, "▁ab"), ["▁a", "b"]);
        // Two pairs of equal score: the leftmost merges first.
        assert_eq!(ids(&v, "aaa"), ["aa", "a"]);
        // A character with no token: its UTF-8 bytes.
        assert_eq!(ids(&v, "é"), ["<0xC3>", "<0xA9>"]);
        assert!(ids(&v, "").is_empty());
    }
}
