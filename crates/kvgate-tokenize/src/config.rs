//! `tokenizer_config.json`: the fields of it that change what gets rendered
//! or encoded.
//!
//! Special tokens may be strings or `AddedToken` dicts (`{"content": ...}`);
//! both are reduced to the string, as transformers' `special_tokens_map`
//! does. Unknown fields are ignored.
//!
//! `add_bos_token` / `add_eos_token` are deliberately not read: transformers
//! 5 drops them when a `tokenizer.json` exists
//! (`PreTrainedTokenizerBase._from_pretrained`), so the tokenizer's own
//! post-processor alone decides whether a prompt gets BOS/EOS.

use serde::Deserialize;

use crate::error::{Result, TokenizeError};

/// The names transformers passes to the chat template as variables, in
/// `SPECIAL_TOKENS_ATTRIBUTES` order (transformers 5.x).
pub(crate) const SPECIAL_TOKEN_NAMES: [&str; 7] =
    ["bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"];

/// An added token as `added_tokens_decoder` describes it.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
pub(crate) struct AddedTokenSpec {
    pub content: String,
    #[serde(default)]
    pub lstrip: bool,
    #[serde(default)]
    pub rstrip: bool,
    #[serde(default)]
    pub single_word: bool,
    #[serde(default = "default_true")]
    pub normalized: bool,
    #[serde(default)]
    pub special: bool,
}

fn default_true() -> bool {
    true
}

/// A special token: a string or an `AddedToken` dict.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
enum TokenValue {
    Text(String),
    Added { content: String },
}

impl TokenValue {
    fn into_string(self) -> String {
        match self {
            TokenValue::Text(s) | TokenValue::Added { content: s } => s,
        }
    }
}

#[derive(Debug, Default, Deserialize)]
struct RawConfig {
    #[serde(default)]
    chat_template: serde_json::Value,
    bos_token: Option<TokenValue>,
    eos_token: Option<TokenValue>,
    unk_token: Option<TokenValue>,
    sep_token: Option<TokenValue>,
    pad_token: Option<TokenValue>,
    cls_token: Option<TokenValue>,
    mask_token: Option<TokenValue>,
    #[serde(default)]
    added_tokens_decoder: serde_json::Map<String, serde_json::Value>,
    clean_up_tokenization_spaces: Option<bool>,
    split_special_tokens: Option<bool>,
}

/// The parsed `tokenizer_config.json`.
#[derive(Debug, Clone, Default)]
pub(crate) struct TokenizerConfig {
    /// The raw `chat_template` value (string, list or null).
    pub chat_template: serde_json::Value,
    /// The named special tokens that are set, as (name, string), in
    /// [`SPECIAL_TOKEN_NAMES`] order.
    pub special_tokens: Vec<(&'static str, String)>,
    /// `added_tokens_decoder`, by id.
    pub added_tokens: Vec<(u32, AddedTokenSpec)>,
    /// `clean_up_tokenization_spaces` (decode only).
    pub clean_up_tokenization_spaces: bool,
    /// `split_special_tokens`: encode special tokens as plain text.
    pub split_special_tokens: bool,
}

impl TokenizerConfig {
    /// Parses the bytes of `tokenizer_config.json`.
    pub(crate) fn from_slice(bytes: &[u8]) -> Result<TokenizerConfig> {
        let raw: RawConfig = serde_json::from_slice(bytes)
            .map_err(|e| TokenizeError::InvalidModelDir(format!("tokenizer_config.json: {e}")))?;
        let mut special_tokens = Vec::new();
        let tokens = [
            raw.bos_token,
            raw.eos_token,
            raw.unk_token,
            raw.sep_token,
            raw.pad_token,
            raw.cls_token,
            raw.mask_token,
        ];
        for (name, token) in SPECIAL_TOKEN_NAMES.iter().zip(tokens) {
            if let Some(token) = token {
                special_tokens.push((*name, token.into_string()));
            }
        }
        let mut added_tokens = Vec::with_capacity(raw.added_tokens_decoder.len());
        for (id, spec) in raw.added_tokens_decoder {
            let id: u32 = id.parse().map_err(|_| {
                TokenizeError::InvalidModelDir(format!("added_tokens_decoder id {id:?}"))
            })?;
            let spec: AddedTokenSpec = serde_json::from_value(spec).map_err(|e| {
                TokenizeError::InvalidModelDir(format!("added_tokens_decoder {id}: {e}"))
            })?;
            added_tokens.push((id, spec));
        }
        added_tokens.sort_by_key(|(id, _)| *id);
        Ok(TokenizerConfig {
            chat_template: raw.chat_template,
            special_tokens,
            added_tokens,
            clean_up_tokenization_spaces: raw.clean_up_tokenization_spaces.unwrap_or(false),
            split_special_tokens: raw.split_special_tokens.unwrap_or(false),
        })
    }

    /// The string of a named special token, if set.
    #[cfg(test)]
    pub(crate) fn special_token(&self, name: &str) -> Option<&str> {
        self.special_tokens.iter().find(|(n, _)| *n == name).map(|(_, s)| s.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_as_strings_or_dicts() {
        let cfg = TokenizerConfig::from_slice(
            br#"{"bos_token": {"content": "<s>", "lstrip": false}, "eos_token": "</s>",
                "unk_token": null, "add_bos_token": true, "some_other": [1, 2]}"#,
        )
        .unwrap();
        assert_eq!(cfg.special_token("bos_token"), Some("<s>"));
        assert_eq!(cfg.special_token("eos_token"), Some("</s>"));
        assert_eq!(cfg.special_token("unk_token"), None);
        assert_eq!(
            cfg.special_tokens.iter().map(|(n, _)| *n).collect::<Vec<_>>(),
            ["bos_token", "eos_token"]
        );
    }

    #[test]
    fn added_tokens_decoder_parses() {
        let cfg = TokenizerConfig::from_slice(
            br#"{"added_tokens_decoder": {"7": {"content": "<x>", "special": true}, "3": {"content": "<y>"}}}"#,
        )
        .unwrap();
        assert_eq!(cfg.added_tokens.len(), 2);
        assert_eq!(cfg.added_tokens[0].0, 3);
        assert!(cfg.added_tokens[0].1.normalized);
        assert!(cfg.added_tokens[1].1.special);
    }

    #[test]
    fn malformed_config_is_an_error() {
        assert!(TokenizerConfig::from_slice(b"[").is_err());
        assert!(TokenizerConfig::from_slice(br#"{"added_tokens_decoder": {"x": {}}}"#).is_err());
    }
}
