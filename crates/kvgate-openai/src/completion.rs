//! `POST /v1/completions` requests and their `prompt`, which may be text, a
//! batch of texts, token ids, or a batch of token-id lists.
//!
//! A router that has tokenized the prompt itself replaces it with the ids
//! ([`CompletionRequest::set_prompt_token_ids`]), which vLLM accepts as-is.

use serde::de::{self, Deserialize, Deserializer, SeqAccess, Visitor};
use serde::{Serialize, Serializer};
use serde_json::{Map, Value};
use std::fmt;

use crate::chat::{self, StreamOptions};
use crate::error::Error;
use crate::wire::wire_object;

/// The `prompt` of a completion request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Prompt {
    /// One text prompt.
    Text(String),
    /// A batch of text prompts (also an empty list).
    Texts(Vec<String>),
    /// One prompt as token ids.
    Tokens(Vec<u32>),
    /// A batch of prompts as token ids.
    TokenBatches(Vec<Vec<u32>>),
}

impl Default for Prompt {
    fn default() -> Self {
        Prompt::Text(String::new())
    }
}

impl Prompt {
    /// How many prompts this is (a batch yields several choices).
    pub fn n_prompts(&self) -> usize {
        match self {
            Prompt::Text(_) | Prompt::Tokens(_) => 1,
            Prompt::Texts(texts) => texts.len(),
            Prompt::TokenBatches(batches) => batches.len(),
        }
    }

    /// The text of a single text prompt.
    pub fn as_text(&self) -> Option<&str> {
        match self {
            Prompt::Text(text) => Some(text),
            _ => None,
        }
    }

    /// The ids of a single token prompt.
    pub fn as_tokens(&self) -> Option<&[u32]> {
        match self {
            Prompt::Tokens(ids) => Some(ids),
            _ => None,
        }
    }
}

impl Serialize for Prompt {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Prompt::Text(text) => serializer.serialize_str(text),
            Prompt::Texts(texts) => texts.serialize(serializer),
            Prompt::Tokens(ids) => ids.serialize(serializer),
            Prompt::TokenBatches(batches) => batches.serialize(serializer),
        }
    }
}

/// The first element of a prompt list, which decides the list's kind.
enum FirstItem {
    Text(String),
    Token(u32),
    Tokens(Vec<u32>),
}

impl<'de> Deserialize<'de> for FirstItem {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ItemVisitor;
        impl<'de> Visitor<'de> for ItemVisitor {
            type Value = FirstItem;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string, a token id or a list of token ids")
            }
            fn visit_str<E: de::Error>(self, text: &str) -> Result<FirstItem, E> {
                Ok(FirstItem::Text(text.to_owned()))
            }
            fn visit_string<E: de::Error>(self, text: String) -> Result<FirstItem, E> {
                Ok(FirstItem::Text(text))
            }
            fn visit_u64<E: de::Error>(self, id: u64) -> Result<FirstItem, E> {
                u32::try_from(id)
                    .map(FirstItem::Token)
                    .map_err(|_| E::invalid_value(de::Unexpected::Unsigned(id), &"a u32 token id"))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<FirstItem, A::Error> {
                let mut ids = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1 << 16));
                while let Some(id) = seq.next_element::<u32>()? {
                    ids.push(id);
                }
                Ok(FirstItem::Tokens(ids))
            }
        }
        deserializer.deserialize_any(ItemVisitor)
    }
}

/// Reads the rest of a list whose first element was `first`.
fn rest<'de, A: SeqAccess<'de>, T: Deserialize<'de>>(
    first: T,
    mut seq: A,
) -> Result<Vec<T>, A::Error> {
    let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).saturating_add(1).min(1 << 16));
    items.push(first);
    while let Some(item) = seq.next_element()? {
        items.push(item);
    }
    Ok(items)
}

impl<'de> Deserialize<'de> for Prompt {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct PromptVisitor;
        impl<'de> Visitor<'de> for PromptVisitor {
            type Value = Prompt;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string, a list of strings, or a list of token ids or id lists")
            }
            fn visit_str<E: de::Error>(self, text: &str) -> Result<Prompt, E> {
                Ok(Prompt::Text(text.to_owned()))
            }
            fn visit_string<E: de::Error>(self, text: String) -> Result<Prompt, E> {
                Ok(Prompt::Text(text))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Prompt, A::Error> {
                Ok(match seq.next_element::<FirstItem>()? {
                    None => Prompt::Texts(Vec::new()),
                    Some(FirstItem::Text(text)) => Prompt::Texts(rest(text, seq)?),
                    Some(FirstItem::Token(id)) => Prompt::Tokens(rest(id, seq)?),
                    Some(FirstItem::Tokens(ids)) => Prompt::TokenBatches(rest(ids, seq)?),
                })
            }
        }
        deserializer.deserialize_any(PromptVisitor)
    }
}

wire_object! {
    /// A `POST /v1/completions` body.
    #[derive(Clone, Debug, PartialEq)]
    pub struct CompletionRequest {
        /// The served model name; vLLM allows it to be left out.
        optional model: String = "model",
        /// The prompt; vLLM allows it to be left out when `prompt_embeds`
        /// is given.
        optional prompt: Prompt = "prompt",
        /// Stream the answer as SSE.
        optional stream: bool = "stream",
        /// Streaming options.
        optional stream_options: StreamOptions = "stream_options",
        /// Add the tokenizer's special tokens (vLLM; default `true`).
        optional add_special_tokens: bool = "add_special_tokens",
        /// KV-transfer parameters (vLLM).
        optional kv_transfer_params: Map<String, Value> = "kv_transfer_params",
    }
}

impl CompletionRequest {
    /// A request for `model` with `prompt` and nothing else.
    pub fn new(model: impl Into<String>, prompt: Prompt) -> Self {
        CompletionRequest {
            model: Some(model.into()),
            prompt: Some(prompt),
            ..CompletionRequest::default()
        }
    }

    /// Parses a request body.
    pub fn from_slice(body: &[u8]) -> Result<Self, Error> {
        Ok(serde_json::from_slice(body)?)
    }

    /// The body to forward, in a buffer sized for it up front: a long token
    /// prompt would otherwise grow the buffer a dozen times, each growth a
    /// copy of everything written so far (a fifth of the endpoint picker's
    /// CPU on 50k-token prompts).
    pub fn to_vec(&self) -> Result<Vec<u8>, Error> {
        let mut out = Vec::with_capacity(self.size_hint());
        serde_json::to_writer(&mut out, self)?;
        Ok(out)
    }

    /// About how long the serialised request is: the prompt (a token id is
    /// at most 6 digits and a comma) plus room for the other fields.
    fn size_hint(&self) -> usize {
        let prompt = match &self.prompt {
            None => 0,
            Some(Prompt::Text(t)) => t.len() + 2,
            Some(Prompt::Texts(v)) => v.iter().map(|t| t.len() + 3).sum(),
            Some(Prompt::Tokens(ids)) => ids.len() * 7,
            Some(Prompt::TokenBatches(b)) => b.iter().map(|ids| ids.len() * 7 + 2).sum(),
        };
        prompt + 512
    }

    /// The `model` field, if given.
    pub fn model(&self) -> Option<&str> {
        self.model.as_deref()
    }

    /// Whether the client asked for a stream.
    pub fn is_stream(&self) -> bool {
        self.stream.unwrap_or(false)
    }

    /// Whether the stream will end with a usage chunk.
    pub fn include_usage(&self) -> bool {
        chat::include_usage(self.stream, self.stream_options.as_ref())
    }

    /// Makes a streaming request end with a usage chunk; returns whether
    /// the client had asked for it itself.
    pub fn ensure_include_usage(&mut self) -> bool {
        chat::ensure_include_usage(self.stream, &mut self.stream_options)
    }

    /// `add_special_tokens`, with vLLM's completion default.
    pub fn add_special_tokens(&self) -> bool {
        self.add_special_tokens.unwrap_or(true)
    }

    /// `max_tokens`, when an integer.
    pub fn max_output_tokens(&self) -> Option<u64> {
        chat::max_output_tokens(&self.extra)
    }

    /// Replaces the prompt with its token ids, in place; every other key,
    /// and the key order, is kept. The ids must be the whole prompt as the
    /// engine would compute it, special tokens included: vLLM adds none to
    /// a token prompt.
    pub fn set_prompt_token_ids(&mut self, token_ids: Vec<u32>) {
        self.prompt = Some(Prompt::Tokens(token_ids));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prompt(text: &str) -> Result<Prompt, serde_json::Error> {
        serde_json::from_str(text)
    }

    #[test]
    fn every_prompt_form() {
        assert_eq!(prompt(r#""hi""#).unwrap(), Prompt::Text("hi".into()));
        assert_eq!(prompt(r#"["a","b"]"#).unwrap(), Prompt::Texts(vec!["a".into(), "b".into()]));
        assert_eq!(prompt("[1,2,3]").unwrap(), Prompt::Tokens(vec![1, 2, 3]));
        assert_eq!(
            prompt("[[1],[],[2,3]]").unwrap(),
            Prompt::TokenBatches(vec![vec![1], vec![], vec![2, 3]])
        );
        assert_eq!(prompt("[]").unwrap(), Prompt::Texts(Vec::new()));
        for bad in [
            "[1,\"a\"]",
            "[\"a\",1]",
            "[[1],2]",
            "[-1]",
            "[4294967296]",
            "[1.5]",
            "3",
            "{}",
            "[[\"a\"]]",
        ] {
            assert!(prompt(bad).is_err(), "{bad}");
        }
        for text in [r#""hi""#, r#"["a","b"]"#, "[1,2,3]", "[[1],[],[2,3]]", "[]"] {
            assert_eq!(serde_json::to_string(&prompt(text).unwrap()).unwrap(), text);
        }
    }

    #[test]
    fn replacing_the_prompt_keeps_the_rest_in_place() {
        let body = r#"{"model":"m","prompt":"Hello","max_tokens":8,"stream":true,"stream_options":{"include_usage":false},"vllm_xargs":{"a":1}}"#;
        let mut request = CompletionRequest::from_slice(body.as_bytes()).unwrap();
        assert_eq!(serde_json::to_string(&request).unwrap(), body);
        assert!(request.is_stream() && !request.include_usage());
        assert_eq!(request.max_output_tokens(), Some(8));
        assert!(request.add_special_tokens());
        request.set_prompt_token_ids(vec![9, 8]);
        assert_eq!(
            String::from_utf8(request.to_vec().unwrap()).unwrap(),
            r#"{"model":"m","prompt":[9,8],"max_tokens":8,"stream":true,"stream_options":{"include_usage":false},"vllm_xargs":{"a":1}}"#
        );
        assert!(!request.ensure_include_usage());
        assert!(request.include_usage());
    }
}
