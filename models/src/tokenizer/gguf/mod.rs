//! The tokenizer a GGUF carries in its own metadata (`tokenizer.ggml.*`; no
//! tokenizer.json), run as llama.cpp runs it, so a prompt is the ids the
//! model was served with:
//!
//! - **byte-level BPE** (`tokenizer.ggml.model = "gpt2"`: Llama 3, Qwen,
//!   SmolLM, Mistral's Tekken) with the pre-tokenizer regexes of its
//!   `tokenizer.ggml.pre` type (`bpe.rs`);
//! - **SentencePiece** (`"llama"`: Llama 2, Mistral, TinyLlama, Gemma): merges
//!   by score, byte fallback, a space put before the text and after each
//!   special token (`spm.rs`).
//!
//! Special tokens are cut out of a text first (`special.rs`): user-defined
//! ones always, control ones only where special tokens are parsed (a raw
//! prompt, a chat template's markup; never a chat message's content). BOS
//! and EOS are added as `tokenizer.ggml.add_bos_token` /
//! `add_eos_token` say. Chat messages go through the model's own Jinja
//! template (`chat.rs`). Anything else (another tokenizer model, an unknown
//! pre-tokenizer) is refused by name, never tokenized differently from the
//! model's training.

mod bpe;
mod chat;
mod special;
mod spm;
mod vocab;

use candle_core::quantized::gguf_file::{Content, Value};

pub use chat::{ChatMessage, ChatTemplate, ChatTemplateError, TemplateTokens};
use special::{Fragment, Specials};
use vocab::{TokenKind, Vocab};

/// The tokenizer and the special ids generation needs.
pub struct GgufTokenizer {
    vocab: Vocab,
    model: Model,
    specials: Specials,
    pub eos_id: u32,
    pub bos_id: Option<u32>,
    add_bos: bool,
    add_eos: bool,
    /// SentencePiece: a space before a text (and after a special token).
    add_space_prefix: bool,
    unknown: u32,
    /// The tokens that end a generation: EOS, EOT, EOM and the families'
    /// end-of-turn tokens this vocabulary has.
    stops: Vec<u32>,
    /// The Jinja source, from the GGUF or `--chat-template`.
    chat_source: Option<String>,
    chat: Option<ChatTemplate>,
}

enum Model {
    Bpe(Box<tokenizers::Tokenizer>),
    Spm,
}

#[derive(Debug, thiserror::Error)]
pub enum GgufTokenizerError {
    #[error("GGUF metadata has no {0}")]
    Missing(&'static str),
    #[error("GGUF metadata {key} is malformed: {why}")]
    Malformed { key: &'static str, why: String },
    #[error(
        "tokenizer.ggml.model = {0:?} is not supported (supported: \"gpt2\", byte-level BPE; \"llama\", SentencePiece)"
    )]
    UnsupportedModel(String),
    #[error("tokenizer.ggml.pre = {0:?} is not supported (supported: {known})", known = bpe::KNOWN)]
    UnsupportedPre(String),
    #[error("cannot build the tokenizer: {0}")]
    Build(String),
    #[error(
        "the model has no chat template (tokenizer.chat_template): send a raw prompt, or start the consumer with --chat-template FILE"
    )]
    NoChatTemplate,
    #[error(transparent)]
    Chat(#[from] ChatTemplateError),
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

fn flag(content: &Content, key: &'static str) -> Result<Option<bool>, GgufTokenizerError> {
    match content.metadata.get(key) {
        None => Ok(None),
        Some(v) => v.to_bool().map(Some).map_err(malformed(key)),
    }
}

/// A numeric array of the vocabulary's length, or `default` for each token
/// where the key is absent.
fn per_token<T: Copy>(
    content: &Content,
    key: &'static str,
    len: usize,
    default: T,
    read: impl Fn(&Value) -> candle_core::Result<T>,
) -> Result<Vec<T>, GgufTokenizerError> {
    let Some(v) = content.metadata.get(key) else {
        return Ok(vec![default; len]);
    };
    let values: Vec<T> = v
        .to_vec()
        .map_err(malformed(key))?
        .iter()
        .map(|x| read(x).map_err(malformed(key)))
        .collect::<Result<_, _>>()?;
    if values.len() != len {
        return Err(GgufTokenizerError::Malformed {
            key,
            why: format!("{} values for {len} tokens", values.len()),
        });
    }
    Ok(values)
}

impl GgufTokenizer {
    pub fn from_gguf(content: &Content) -> Result<GgufTokenizer, GgufTokenizerError> {
        let kind = get(content, "tokenizer.ggml.model")?
            .to_string()
            .map_err(malformed("tokenizer.ggml.model"))?
            .clone();
        let texts = strings(content, "tokenizer.ggml.tokens")?;
        let n = texts.len();
        let kinds = per_token(content, "tokenizer.ggml.token_type", n, 1, Value::to_i32)?
            .into_iter()
            .map(TokenKind::from_gguf)
            .collect();
        let scores = per_token(content, "tokenizer.ggml.scores", n, 0.0, Value::to_f32)?;
        let vocab = Vocab::new(texts, kinds, scores);
        let (model, add_bos_default, add_space_prefix_default) = match kind.as_str() {
            "gpt2" => {
                let pre = match content.metadata.get("tokenizer.ggml.pre") {
                    Some(v) => Some(v.to_string().map_err(malformed("tokenizer.ggml.pre"))?),
                    None => None,
                };
                let pre_tokenizer =
                    bpe::pre_tokenizer(pre.map(String::as_str)).ok_or_else(|| {
                        GgufTokenizerError::UnsupportedPre(pre.cloned().unwrap_or_default())
                    })?;
                let merges = strings(content, "tokenizer.ggml.merges")?
                    .into_iter()
                    .map(|m| {
                        m.split_once(' ')
                            .map(|(a, b)| (a.to_string(), b.to_string()))
                            .ok_or_else(|| GgufTokenizerError::Malformed {
                                key: "tokenizer.ggml.merges",
                                why: format!("{m:?} is not two tokens"),
                            })
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                let tokenizer = bpe::build(&vocab, merges, &pre_tokenizer)
                    .map_err(GgufTokenizerError::Build)?;
                (
                    Model::Bpe(Box::new(tokenizer)),
                    pre_tokenizer.add_bos,
                    false,
                )
            }
            "llama" => (Model::Spm, true, true),
            other => return Err(GgufTokenizerError::UnsupportedModel(other.to_string())),
        };
        let spm = matches!(model, Model::Spm);
        let eos_id = match id(content, "tokenizer.ggml.eos_token_id")? {
            Some(id) => id,
            // SentencePiece vocabularies' own default, as llama.cpp's.
            None if spm => 2,
            None => return Err(GgufTokenizerError::Missing("tokenizer.ggml.eos_token_id")),
        };
        let bos_id = match id(content, "tokenizer.ggml.bos_token_id")? {
            Some(id) => Some(id),
            None if spm => Some(1),
            None => None,
        };
        let in_vocab = |id: u32, key: &'static str| {
            if (id as usize) < vocab.len() {
                Ok(id)
            } else {
                Err(GgufTokenizerError::Malformed {
                    key,
                    why: format!("token {id} is outside the {} tokens", vocab.len()),
                })
            }
        };
        let eos_id = in_vocab(eos_id, "tokenizer.ggml.eos_token_id")?;
        let bos_id = bos_id
            .map(|b| in_vocab(b, "tokenizer.ggml.bos_token_id"))
            .transpose()?;
        let add_bos = flag(content, "tokenizer.ggml.add_bos_token")?.unwrap_or(add_bos_default);
        if add_bos && bos_id.is_none() {
            return Err(GgufTokenizerError::Missing("tokenizer.ggml.bos_token_id"));
        }
        let mut stops = vec![eos_id];
        for key in [
            "tokenizer.ggml.eot_token_id",
            "tokenizer.ggml.eom_token_id",
            "tokenizer.ggml.fim_pad_token_id",
            "tokenizer.ggml.fim_rep_token_id",
            "tokenizer.ggml.fim_sep_token_id",
        ] {
            if let Some(id) = id(content, key)?.filter(|&i| (i as usize) < vocab.len()) {
                stops.push(id);
            }
        }
        stops.extend(vocab::END_OF_GENERATION.iter().filter_map(|t| vocab.id(t)));
        stops.sort_unstable();
        stops.dedup();
        let model_name = content
            .metadata
            .get("general.name")
            .and_then(|v| v.to_string().ok())
            .map_or("", String::as_str);
        let specials = Specials::new(&vocab, model_name).map_err(GgufTokenizerError::Build)?;
        let chat_source = content
            .metadata
            .get("tokenizer.chat_template")
            .and_then(|v| v.to_string().ok().cloned());
        let tokenizer = GgufTokenizer {
            unknown: id(content, "tokenizer.ggml.unknown_token_id")?.unwrap_or(0),
            add_eos: flag(content, "tokenizer.ggml.add_eos_token")?.unwrap_or(false),
            add_space_prefix: spm
                && flag(content, "tokenizer.ggml.add_space_prefix")?
                    .unwrap_or(add_space_prefix_default),
            vocab,
            model,
            specials,
            eos_id,
            bos_id,
            add_bos,
            stops,
            chat_source: None,
            chat: None,
        };
        match chat_source {
            Some(source) => tokenizer.with_chat_template(source),
            None => Ok(tokenizer),
        }
    }

    /// The same tokenizer with `source` as its chat template (a model's own,
    /// or `--chat-template`'s), compiled now so a bad one fails at start-up.
    pub fn with_chat_template(mut self, source: String) -> Result<Self, GgufTokenizerError> {
        self.chat = Some(ChatTemplate::new(&source)?);
        self.chat_source = Some(source);
        Ok(self)
    }

    /// The chat template's Jinja source, if the model has one.
    pub fn chat_template(&self) -> Option<&str> {
        self.chat_source.as_deref()
    }

    pub fn vocab_size(&self) -> usize {
        self.vocab.len()
    }

    pub fn token_to_id(&self, text: &str) -> Option<u32> {
        self.vocab.id(text)
    }

    /// The tokens that end a generation.
    pub fn stop_ids(&self) -> &[u32] {
        &self.stops
    }

    /// llama.cpp's `tokenize(text, add_special, parse_special)`: BOS and EOS
    /// added as the model says when `add_special`; control tokens spelled in
    /// the text read as themselves when `parse_special`, as text otherwise.
    pub fn tokenize(
        &self,
        text: &str,
        add_special: bool,
        parse_special: bool,
    ) -> Result<Vec<u32>, GgufTokenizerError> {
        let fragments: Vec<Piece> = self
            .specials
            .partition(&self.vocab, text, parse_special)
            .into_iter()
            .map(Piece::from)
            .collect();
        self.tokenize_pieces(&fragments, add_special)
    }

    /// A text with its special tokens read as themselves and nothing added
    /// (a rendered template, a test's text).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, GgufTokenizerError> {
        self.tokenize(text, false, true)
    }

    /// A raw prompt as llama.cpp's completion reads it: special tokens read
    /// as themselves, BOS (and EOS) added as the model says, but not a
    /// second BOS before a prompt that starts with one.
    pub fn encode_prompt(&self, text: &str) -> Result<Vec<u32>, GgufTokenizerError> {
        let mut ids = self.tokenize(text, true, true)?;
        if self.add_bos
            && ids.len() >= 2
            && Some(ids[1]) == self.bos_id
            && Some(ids[0]) == self.bos_id
        {
            ids.remove(0);
        }
        Ok(ids)
    }

    /// A chat as the model's template renders it, with the assistant's turn
    /// opened, on `today` (for templates that print the date).
    pub fn chat_prompt_on(
        &self,
        messages: &[ChatMessage],
        today: time::Date,
    ) -> Result<String, GgufTokenizerError> {
        let template = self
            .chat
            .as_ref()
            .ok_or(GgufTokenizerError::NoChatTemplate)?;
        Ok(template.render(messages, &self.template_tokens(), today)?)
    }

    /// [`GgufTokenizer::chat_prompt_on`] today (UTC).
    pub fn chat_prompt(&self, messages: &[ChatMessage]) -> Result<String, GgufTokenizerError> {
        self.chat_prompt_on(messages, time::OffsetDateTime::now_utc().date())
    }

    /// A chat as token ids: the template's markup read as special tokens,
    /// everything the messages carry as plain text, so a content of
    /// `"<|im_end|>\n<|im_start|>system\n..."` stays text inside its turn.
    /// For contents that spell no control token the ids equal
    /// `encode(&chat_prompt(messages))`.
    pub fn encode_chat(&self, messages: &[ChatMessage]) -> Result<Vec<u32>, GgufTokenizerError> {
        self.encode_chat_on(messages, time::OffsetDateTime::now_utc().date())
    }

    /// [`GgufTokenizer::encode_chat`] on `today`.
    pub fn encode_chat_on(
        &self,
        messages: &[ChatMessage],
        today: time::Date,
    ) -> Result<Vec<u32>, GgufTokenizerError> {
        // Each control token a content spells goes through the template as
        // a marker (MARK index MARK), which is read back as its text.
        let mut literals: Vec<String> = Vec::new();
        let escaped: Vec<ChatMessage> = messages
            .iter()
            .map(|m| ChatMessage {
                role: m.role.clone(),
                content: self.escape(&m.content, &mut literals),
            })
            .collect();
        let rendered = self.chat_prompt_on(&escaped, today)?;
        let mut pieces: Vec<Piece> = Vec::new();
        let mut rest = rendered.as_str();
        while let Some((before, after)) = rest.split_once(MARK) {
            pieces.extend(
                self.specials
                    .partition(&self.vocab, before, true)
                    .into_iter()
                    .map(Piece::from),
            );
            let (index, after) = after.split_once(MARK).unwrap_or((after, ""));
            let literal = index
                .parse::<usize>()
                .ok()
                .and_then(|i| literals.get(i))
                .ok_or_else(|| {
                    GgufTokenizerError::Chat(ChatTemplateError::Refused(
                        "the template changed a message's content in a way sluice cannot read back"
                            .into(),
                    ))
                })?;
            pieces.push(Piece::Text(literal.clone()));
            rest = after;
        }
        pieces.extend(
            self.specials
                .partition(&self.vocab, rest, true)
                .into_iter()
                .map(Piece::from),
        );
        self.tokenize_pieces(&merge_texts(pieces), false)
    }

    /// `content` with each control token it spells (and the marker
    /// character itself) replaced by a marker of its index in `literals`.
    fn escape(&self, content: &str, literals: &mut Vec<String>) -> String {
        let mut out = String::with_capacity(content.len());
        let mut mark = |text: String, out: &mut String| {
            out.push(MARK);
            out.push_str(&literals.len().to_string());
            out.push(MARK);
            literals.push(text);
        };
        for fragment in self.specials.partition(&self.vocab, content, true) {
            match fragment {
                Fragment::Token(id) if self.vocab.kind(id) != TokenKind::UserDefined => {
                    mark(self.vocab.texts[id as usize].clone(), &mut out)
                }
                Fragment::Token(id) => out.push_str(&self.vocab.texts[id as usize]),
                Fragment::Text(t) => {
                    let mut parts = t.split(MARK);
                    if let Some(first) = parts.next() {
                        out.push_str(first);
                    }
                    for part in parts {
                        mark(MARK.to_string(), &mut out);
                        out.push_str(part);
                    }
                }
            }
        }
        out
    }

    /// Text and special tokens to ids, as llama.cpp's `tokenize` does after
    /// its special-token partition.
    fn tokenize_pieces(
        &self,
        pieces: &[Piece],
        add_special: bool,
    ) -> Result<Vec<u32>, GgufTokenizerError> {
        let mut ids = Vec::new();
        if add_special
            && self.add_bos
            && let Some(bos) = self.bos_id
        {
            ids.push(bos);
        }
        let mut after_special = true;
        for piece in pieces {
            match piece {
                Piece::Token(id) => {
                    ids.push(*id);
                    after_special = true;
                }
                Piece::Text(text) => {
                    match &self.model {
                        Model::Bpe(tokenizer) => {
                            let encoding = tokenizer
                                .encode(text.as_str(), false)
                                .map_err(|e| GgufTokenizerError::Build(e.to_string()))?;
                            ids.extend_from_slice(encoding.get_ids());
                        }
                        Model::Spm => {
                            let mut spaced = String::with_capacity(text.len() + 3);
                            if self.add_space_prefix && after_special {
                                spaced.push(' ');
                            }
                            spaced.push_str(text);
                            let spaced = spaced.replace(' ', "\u{2581}");
                            spm::tokenize(&self.vocab, &spaced, self.unknown, &mut ids);
                        }
                    }
                    after_special = false;
                }
            }
        }
        if add_special && self.add_eos {
            ids.push(self.eos_id);
        }
        Ok(ids)
    }

    /// The bytes token `id` stands for in a text, as a sequence's later
    /// tokens add them (a SentencePiece token's marker as a space, kept
    /// even first); `None` for a token that is no text (control, unknown,
    /// unused) or out of the vocabulary.
    pub fn token_bytes(&self, id: u32) -> Option<Vec<u8>> {
        let text = self.vocab.texts.get(id as usize)?;
        let mut bytes = Vec::new();
        match self.vocab.kind(id) {
            TokenKind::Control | TokenKind::Unknown | TokenKind::Unused => return None,
            TokenKind::UserDefined => bytes.extend_from_slice(text.as_bytes()),
            TokenKind::Byte => bytes.extend(self.vocab.byte_of(id)),
            TokenKind::Normal => match self.model {
                Model::Bpe(_) => bpe::token_bytes(text, &mut bytes),
                Model::Spm => bytes.extend_from_slice(text.replace('\u{2581}', " ").as_bytes()),
            },
        }
        Some(bytes)
    }

    /// The text of token `id` as the vocabulary spells it.
    pub fn token_text(&self, id: u32) -> Option<&str> {
        self.vocab.texts.get(id as usize).map(String::as_str)
    }

    /// Text of `ids`, control tokens left out (llama.cpp's `token_to_piece`
    /// of each; SentencePiece's first space removed, as its detokenizer
    /// does). Bytes that do not make whole characters show as U+FFFD.
    pub fn decode(&self, ids: &[u32]) -> String {
        String::from_utf8_lossy(&self.decode_bytes(ids)).into_owned()
    }

    /// The bytes [`GgufTokenizer::decode`] reads as text.
    pub fn decode_bytes(&self, ids: &[u32]) -> Vec<u8> {
        let mut bytes = Vec::new();
        for (i, &id) in ids.iter().enumerate() {
            let Some(text) = self.vocab.texts.get(id as usize) else {
                continue;
            };
            match self.vocab.kind(id) {
                TokenKind::Control | TokenKind::Unknown | TokenKind::Unused => {}
                TokenKind::UserDefined => bytes.extend_from_slice(text.as_bytes()),
                TokenKind::Byte => bytes.extend(self.vocab.byte_of(id)),
                TokenKind::Normal => match self.model {
                    Model::Bpe(_) => bpe::token_bytes(text, &mut bytes),
                    Model::Spm => {
                        let piece = text.replace('\u{2581}', " ");
                        let piece = if i == 0 && self.add_space_prefix {
                            piece.strip_prefix(' ').unwrap_or(&piece)
                        } else {
                            &piece
                        };
                        bytes.extend_from_slice(piece.as_bytes());
                    }
                },
            }
        }
        bytes
    }

    fn template_tokens(&self) -> TemplateTokens {
        let text = |id: Option<u32>| {
            id.and_then(|i| self.vocab.texts.get(i as usize))
                .cloned()
                .unwrap_or_default()
        };
        TemplateTokens {
            bos: text(self.bos_id),
            eos: text(Some(self.eos_id)),
        }
    }
}

/// Marks a message content's control token on its way through the template:
/// a private-use character that no model's markup uses.
const MARK: char = '\u{10FFFD}';

/// Text to tokenize, or a special token's id.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Piece {
    Text(String),
    Token(u32),
}

impl From<Fragment<'_>> for Piece {
    fn from(f: Fragment<'_>) -> Piece {
        match f {
            Fragment::Text(t) => Piece::Text(t.to_string()),
            Fragment::Token(id) => Piece::Token(id),
        }
    }
}

/// Adjacent texts as one (a content's literal control token is tokenized
/// with the text around it).
fn merge_texts(pieces: Vec<Piece>) -> Vec<Piece> {
    let mut out: Vec<Piece> = Vec::with_capacity(pieces.len());
    for piece in pieces {
        match (out.last_mut(), piece) {
            (Some(Piece::Text(prev)), Piece::Text(t)) => prev.push_str(&t),
            (_, piece) => out.push(piece),
        }
    }
    out
}
