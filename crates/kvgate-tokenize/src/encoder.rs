//! Which library turns text into token ids.
//!
//! `fastokens` encodes the byte-level BPE tokenizers of the Qwen and Llama 3
//! families 8–200× faster than `tokenizers` on one thread, with the same
//! ids (docs/benchmarks.md, "Encoders"). `tokenizers` stays the reference: it
//! loads every `tokenizer.json`, decodes, and encodes whatever the fast path
//! has not been proven on. The choice is made once, at load time, from the
//! file itself:
//!
//! - the model is BPE without dropout, byte fallback or word affixes;
//! - the normalizer is none or NFC;
//! - the pre-tokenizer is a regex split (of a pattern the differential tests
//!   cover) followed by a byte-level step that does not split again;
//! - the post-processor is none, byte-level, a template, or a sequence of
//!   those;
//! - no added token is `single_word`, `lstrip` or `rstrip`, nor matched on
//!   normalized text under a normalizer; `split_special_tokens` is off;
//! - and both libraries agree on a canary text and on every added token.
//!
//! Anything else falls back to `tokenizers`, with the reason. `encoder =
//! "fastokens"` insists (a file that cannot load is then an error), and
//! `"tokenizers"` never tries.

use serde_json::Value;
use tokenizers::Tokenizer;

use crate::config::AddedTokenSpec;
use crate::error::{Result, TokenizeError};
use crate::normalized::SkipNormalizer;

/// Which encoder to use (`model.encoder`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EncoderChoice {
    /// `fastokens` where the tokenizer is one it is proven on, else
    /// `tokenizers`.
    #[default]
    Auto,
    /// `fastokens`, or an error if it cannot load the tokenizer; the
    /// checks of `Auto` are reported but do not stop it.
    Fastokens,
    /// `tokenizers` always.
    Tokenizers,
}

impl std::str::FromStr for EncoderChoice {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "auto" => Ok(EncoderChoice::Auto),
            "fastokens" => Ok(EncoderChoice::Fastokens),
            "tokenizers" => Ok(EncoderChoice::Tokenizers),
            other => Err(format!("unknown encoder {other:?} (auto, fastokens, tokenizers)")),
        }
    }
}

/// The encoder in use, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EncoderPath {
    /// `"fastokens"` or `"tokenizers"`.
    pub name: &'static str,
    /// Why this one: `None` when the preferred one was taken.
    pub reason: Option<String>,
}

/// The pre-tokenizer regexes the differential tests cover: Qwen2/Qwen3's
/// (digits one by one) and Llama 3's (digits in threes).
const VERIFIED_SPLITS: [&str; 2] = [
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
];

/// Text both encoders must agree on before the fast one is used: scripts,
/// combining marks, digits, whitespace runs, contractions, emoji.
const CANARY: &str = "Hello, world! It's 2026-12-01 12:34:56.789 — naïve café Ångström.\n\n\
    \t  def f(x):\n        return x ** 2  # comment\n你好，世界。こんにちは。안녕하세요.\n\
    Привет, мир! مرحبا بالعالم. नमस्ते दुनिया। 🚀🎉👩‍💻 e\u{301}\u{316}  \r\n 1234567 I'LL we've";

pub(crate) enum Encoder {
    Fast(Box<fastokens::Tokenizer>),
    /// `tokenizers`, with a normalizer-less copy when it pays.
    Library(Option<Box<SkipNormalizer>>),
}

impl std::fmt::Debug for Encoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Encoder::Fast(_) => f.write_str("Encoder::Fast"),
            Encoder::Library(skip) => write!(f, "Encoder::Library(skip: {})", skip.is_some()),
        }
    }
}

/// What `Encoder::build` chose.
pub(crate) struct Built {
    pub(crate) encoder: Encoder,
    pub(crate) path: EncoderPath,
    /// The reference tokenizer, when the encoder needs it; with the fast
    /// encoder it was dropped before that one loaded, so that their tables
    /// are never resident together.
    pub(crate) reference: Option<Tokenizer>,
}

impl Encoder {
    /// Builds the encoder for `tokenizer` (loaded by `tokenizers` from
    /// `json`, with `extra` added tokens from the config). `rebuild` makes
    /// the reference again if the fast encoder loads but disagrees.
    pub(crate) fn build(
        choice: EncoderChoice,
        tokenizer: Tokenizer,
        json: &[u8],
        extra: &[&AddedTokenSpec],
        split_special_tokens: bool,
        rebuild: impl FnOnce() -> Result<Tokenizer>,
    ) -> Result<Built> {
        let library = |tokenizer: Tokenizer, reason: Option<String>| Built {
            encoder: Encoder::Library(SkipNormalizer::for_tokenizer(&tokenizer).map(Box::new)),
            path: EncoderPath { name: "tokenizers", reason },
            reference: Some(tokenizer),
        };
        if choice == EncoderChoice::Tokenizers {
            return Ok(library(tokenizer, None));
        }
        let value: Value = serde_json::from_slice(json)
            .map_err(|e| TokenizeError::InvalidModelDir(format!("tokenizer.json: {e}")))?;
        let unsupported = unsupported(&value, extra, split_special_tokens);
        if let (EncoderChoice::Auto, Some(why)) = (choice, &unsupported) {
            return Ok(library(tokenizer, Some(why.clone())));
        }
        let expected = expectations(&tokenizer);
        drop(tokenizer);
        let fast = match load_fast(value, extra) {
            Ok(fast) => fast,
            Err(e) if choice == EncoderChoice::Fastokens => {
                return Err(TokenizeError::InvalidModelDir(format!(
                    "encoder \"fastokens\" cannot load this tokenizer: {e}"
                )));
            }
            Err(e) => {
                return Ok(library(rebuild()?, Some(format!("fastokens cannot load it: {e}"))))
            }
        };
        let why = unsupported.or_else(|| disagreement(&fast, &expected));
        match (choice, why) {
            (EncoderChoice::Auto, Some(why)) => {
                drop(fast);
                Ok(library(rebuild()?, Some(why)))
            }
            (_, why) => Ok(Built {
                encoder: Encoder::Fast(Box::new(fast)),
                path: EncoderPath { name: "fastokens", reason: why },
                reference: None,
            }),
        }
    }

    /// Encodes `text`; `reference` is the `tokenizers` tokenizer, which the
    /// `Library` encoder needs (it is always there with it).
    pub(crate) fn encode(
        &self,
        reference: Option<&Tokenizer>,
        text: &str,
        add_special_tokens: bool,
    ) -> Result<Vec<u32>> {
        match self {
            Encoder::Fast(fast) => fast
                .encode_with_special_tokens(text, add_special_tokens)
                .map_err(|e| TokenizeError::Tokenizer(e.to_string())),
            Encoder::Library(skip) => {
                let Some(tokenizer) = reference else {
                    return Err(TokenizeError::Tokenizer("no reference tokenizer".into()));
                };
                let tokenizer = match skip {
                    Some(skip) if skip.is_unchanged(text) => skip.tokenizer(),
                    _ => tokenizer,
                };
                tokenizer
                    .encode_fast(text, add_special_tokens)
                    .map(|encoding| encoding.get_ids().to_vec())
                    .map_err(|e| TokenizeError::Tokenizer(e.to_string()))
            }
        }
    }
}

fn load_fast(
    value: Value,
    extra: &[&AddedTokenSpec],
) -> std::result::Result<fastokens::Tokenizer, String> {
    let mut fast = fastokens::Tokenizer::from_json(value).map_err(|e| e.to_string())?;
    let tokens: Vec<fastokens::NewToken> = extra
        .iter()
        .map(|spec| fastokens::NewToken {
            content: spec.content.clone(),
            single_word: spec.single_word,
            lstrip: spec.lstrip,
            rstrip: spec.rstrip,
            normalized: spec.normalized,
            special: spec.special,
        })
        .collect();
    if !tokens.is_empty() {
        fast.add_tokens(&tokens).map_err(|e| e.to_string())?;
    }
    // Its first encode builds tables (tens of ms): pay that here, not on
    // the first request.
    fast.encode(CANARY).map_err(|e| e.to_string())?;
    Ok(fast)
}

/// Why the fast path is not proven on this tokenizer, if it is not.
fn unsupported(json: &Value, extra: &[&AddedTokenSpec], split_special: bool) -> Option<String> {
    if split_special {
        return Some("split_special_tokens is set".into());
    }
    let model = &json["model"];
    if model["type"] != "BPE" {
        return Some(format!("model {} is not BPE", model["type"]));
    }
    let off = |v: &Value| v.is_null() || v == false || v == "";
    for key in ["dropout", "byte_fallback", "continuing_subword_prefix", "end_of_word_suffix"] {
        if !off(&model[key]) {
            return Some(format!("BPE {key} is {}", model[key]));
        }
    }
    let normalizer = &json["normalizer"];
    let has_normalizer = !normalizer.is_null();
    if has_normalizer && normalizer["type"] != "NFC" {
        return Some(format!("normalizer {} is neither none nor NFC", normalizer["type"]));
    }
    if let Some(why) = unsupported_pre_tokenizer(&json["pre_tokenizer"]) {
        return Some(why);
    }
    if let Some(why) = unsupported_post_processor(&json["post_processor"]) {
        return Some(why);
    }
    let from_file = json["added_tokens"].as_array().into_iter().flatten().map(|t| {
        let flag = |k: &str| t[k] == true;
        (
            t["content"].as_str().unwrap_or(""),
            flag("single_word"),
            flag("lstrip"),
            flag("rstrip"),
            flag("normalized"),
        )
    });
    let from_config =
        extra.iter().map(|s| (s.content.as_str(), s.single_word, s.lstrip, s.rstrip, s.normalized));
    for (content, single_word, lstrip, rstrip, normalized) in from_file.chain(from_config) {
        if single_word || lstrip || rstrip {
            return Some(format!("added token {content:?} is single_word, lstrip or rstrip"));
        }
        if normalized && has_normalizer {
            return Some(format!("added token {content:?} is matched on normalized text"));
        }
    }
    None
}

fn unsupported_pre_tokenizer(p: &Value) -> Option<String> {
    let steps = match p["type"].as_str() {
        Some("Sequence") => p["pretokenizers"].as_array().cloned().unwrap_or_default(),
        _ => vec![p.clone()],
    };
    let [split, byte_level] = &steps[..] else {
        return Some("the pre-tokenizer is not a regex split then byte-level".into());
    };
    let pattern = split["pattern"]["Regex"].as_str().unwrap_or("");
    let split_ok = split["type"] == "Split"
        && VERIFIED_SPLITS.contains(&pattern)
        && split["behavior"] == "Isolated"
        && split["invert"] == false;
    if !split_ok {
        return Some("the pre-tokenizer's split is not one the tests cover".into());
    }
    let byte_level_ok = byte_level["type"] == "ByteLevel"
        && byte_level["use_regex"] == false
        && byte_level["add_prefix_space"] == false;
    if !byte_level_ok {
        return Some("the byte-level pre-tokenizer splits again or adds a prefix space".into());
    }
    None
}

fn unsupported_post_processor(p: &Value) -> Option<String> {
    let ok =
        |p: &Value| p.is_null() || p["type"] == "ByteLevel" || p["type"] == "TemplateProcessing";
    let fine = match p["type"].as_str() {
        Some("Sequence") => p["processors"].as_array().is_some_and(|ps| ps.iter().all(ok)),
        _ => ok(p),
    };
    (!fine).then(|| format!("post-processor {} is not covered", p["type"]))
}

/// A text, whether special tokens are added, and the reference's ids.
type Expected = (String, bool, std::result::Result<Vec<u32>, String>);

/// The reference's ids for the canary and for every added token in
/// context, with and without special tokens: (text, add_special, ids).
fn expectations(
    tokenizer: &Tokenizer,
) -> Vec<(String, bool, std::result::Result<Vec<u32>, String>)> {
    let mut texts = vec![CANARY.to_owned()];
    for (_, token) in tokenizer.get_added_tokens_decoder() {
        texts.push(format!("a{}b {} ", token.content, token.content));
    }
    let mut out = Vec::with_capacity(texts.len() * 2);
    for text in texts {
        for add in [false, true] {
            let ids = tokenizer
                .encode_fast(text.as_str(), add)
                .map(|e| e.get_ids().to_vec())
                .map_err(|e| e.to_string());
            out.push((text.clone(), add, ids));
        }
    }
    out
}

/// Where the fast encoder disagrees with the reference's `expected` ids,
/// if it does.
fn disagreement(fast: &fastokens::Tokenizer, expected: &[Expected]) -> Option<String> {
    expected.iter().find_map(|(text, add, want)| {
        let got = fast.encode_with_special_tokens(text, *add).map_err(|e| e.to_string());
        (got != *want).then(|| format!("the encoders disagree on {text:?}"))
    })
}
