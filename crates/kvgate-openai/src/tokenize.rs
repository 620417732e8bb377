//! vLLM's `POST /tokenize` and `POST /detokenize`.
//!
//! `/tokenize` takes one of two bodies: the chat form (`messages` plus the
//! rendering switches) or the completion form (`prompt`). vLLM tells them
//! apart by the keys present, and so does [`TokenizeRequest`]: a body with
//! `messages` is a chat. Note the defaults differ: `add_special_tokens` is
//! `false` for a chat (the template adds them) and `true` for a prompt.

use serde::de::{Deserialize, Deserializer};
use serde::{Serialize, Serializer};
use serde_json::{Map, Value};

use crate::chat::check_generation_flags;
use crate::error::Error;
use crate::message::ChatMessage;
use crate::wire::wire_object;

wire_object! {
    /// The chat form of a `/tokenize` body.
    #[derive(Clone, Debug, PartialEq)]
    pub struct TokenizeChatRequest {
        /// The served model name, optional.
        optional model: String = "model",
        /// The conversation to render.
        required messages: Vec<ChatMessage> = "messages",
        /// Append the assistant turn header (default `true`).
        optional add_generation_prompt: bool = "add_generation_prompt",
        /// Leave the last message open (default `false`).
        optional continue_final_message: bool = "continue_final_message",
        /// Add special tokens on top of the template's (default `false`).
        optional add_special_tokens: bool = "add_special_tokens",
        /// Also return each token's string (default `false`).
        optional return_token_strs: bool = "return_token_strs",
        /// A chat template overriding the model's.
        optional chat_template: String = "chat_template",
        /// Extra template variables.
        optional chat_template_kwargs: Map<String, Value> = "chat_template_kwargs",
        /// Tool definitions, kept as JSON.
        optional tools: Vec<Value> = "tools",
    }
}

impl TokenizeChatRequest {
    /// A request for `messages` with every switch at its default.
    pub fn new(messages: Vec<ChatMessage>) -> Self {
        TokenizeChatRequest { messages, ..TokenizeChatRequest::default() }
    }

    /// `add_generation_prompt`, with vLLM's default.
    pub fn add_generation_prompt(&self) -> bool {
        self.add_generation_prompt.unwrap_or(true)
    }

    /// `continue_final_message`, with vLLM's default.
    pub fn continue_final_message(&self) -> bool {
        self.continue_final_message.unwrap_or(false)
    }

    /// `add_special_tokens`, with vLLM's chat default.
    pub fn add_special_tokens(&self) -> bool {
        self.add_special_tokens.unwrap_or(false)
    }

    /// `return_token_strs`, with vLLM's default.
    pub fn return_token_strs(&self) -> bool {
        self.return_token_strs.unwrap_or(false)
    }

    /// vLLM's check: `add_generation_prompt` and `continue_final_message`
    /// may not both be explicitly `true`.
    pub fn validate(&self) -> Result<(), Error> {
        check_generation_flags(self.add_generation_prompt, self.continue_final_message)
    }
}

wire_object! {
    /// The completion form of a `/tokenize` body.
    #[derive(Clone, Debug, PartialEq)]
    pub struct TokenizeCompletionRequest {
        /// The served model name, optional.
        optional model: String = "model",
        /// The text to encode.
        required prompt: String = "prompt",
        /// Add the tokenizer's special tokens (default `true`).
        optional add_special_tokens: bool = "add_special_tokens",
        /// Also return each token's string (default `false`).
        optional return_token_strs: bool = "return_token_strs",
    }
}

impl TokenizeCompletionRequest {
    /// A request for `prompt` with every switch at its default.
    pub fn new(prompt: impl Into<String>) -> Self {
        TokenizeCompletionRequest { prompt: prompt.into(), ..TokenizeCompletionRequest::default() }
    }

    /// `add_special_tokens`, with vLLM's completion default.
    pub fn add_special_tokens(&self) -> bool {
        self.add_special_tokens.unwrap_or(true)
    }

    /// `return_token_strs`, with vLLM's default.
    pub fn return_token_strs(&self) -> bool {
        self.return_token_strs.unwrap_or(false)
    }
}

/// A `/tokenize` body, either form.
#[derive(Clone, Debug, PartialEq)]
pub enum TokenizeRequest {
    /// `{"messages": [...], ...}`
    Chat(TokenizeChatRequest),
    /// `{"prompt": "...", ...}`
    Completion(TokenizeCompletionRequest),
}

impl TokenizeRequest {
    /// Parses a body; one with `messages` is the chat form.
    pub fn from_slice(body: &[u8]) -> Result<Self, Error> {
        Ok(serde_json::from_slice(body)?)
    }

    /// The `model` field, if given.
    pub fn model(&self) -> Option<&str> {
        match self {
            TokenizeRequest::Chat(r) => r.model.as_deref(),
            TokenizeRequest::Completion(r) => r.model.as_deref(),
        }
    }

    /// `return_token_strs`, with vLLM's default.
    pub fn return_token_strs(&self) -> bool {
        match self {
            TokenizeRequest::Chat(r) => r.return_token_strs(),
            TokenizeRequest::Completion(r) => r.return_token_strs(),
        }
    }

    /// The checks vLLM applies before tokenizing.
    pub fn validate(&self) -> Result<(), Error> {
        match self {
            TokenizeRequest::Chat(r) => r.validate(),
            TokenizeRequest::Completion(_) => Ok(()),
        }
    }
}

impl Serialize for TokenizeRequest {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            TokenizeRequest::Chat(r) => r.serialize(serializer),
            TokenizeRequest::Completion(r) => r.serialize(serializer),
        }
    }
}

impl<'de> Deserialize<'de> for TokenizeRequest {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        // The form depends on which keys are present, so the object is read
        // once into a map (values are moved, not copied, on the second pass).
        let map = Map::<String, Value>::deserialize(deserializer)?;
        let is_chat = map.contains_key("messages");
        let value = Value::Object(map);
        if is_chat {
            TokenizeChatRequest::deserialize(value).map(TokenizeRequest::Chat)
        } else {
            TokenizeCompletionRequest::deserialize(value).map(TokenizeRequest::Completion)
        }
        .map_err(serde::de::Error::custom)
    }
}

/// The `/tokenize` answer.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct TokenizeResponse {
    /// How many tokens.
    pub count: usize,
    /// The model's context length.
    pub max_model_len: u64,
    /// The token ids.
    pub tokens: Vec<u32>,
    /// Each token's string, when asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_strs: Option<Vec<String>>,
}

impl TokenizeResponse {
    /// An answer for `tokens`; `count` is filled in.
    pub fn new(tokens: Vec<u32>, max_model_len: u64) -> Self {
        TokenizeResponse { count: tokens.len(), max_model_len, tokens, token_strs: None }
    }
}

wire_object! {
    /// A `/detokenize` body.
    #[derive(Clone, Debug, PartialEq)]
    pub struct DetokenizeRequest {
        /// The served model name, optional.
        optional model: String = "model",
        /// The ids to decode.
        required tokens: Vec<u32> = "tokens",
    }
}

impl DetokenizeRequest {
    /// A request for `tokens`.
    pub fn new(tokens: Vec<u32>) -> Self {
        DetokenizeRequest { tokens, ..DetokenizeRequest::default() }
    }

    /// Parses a body.
    pub fn from_slice(body: &[u8]) -> Result<Self, Error> {
        Ok(serde_json::from_slice(body)?)
    }
}

/// The `/detokenize` answer.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct DetokenizeResponse {
    /// The decoded text.
    pub prompt: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::Role;

    #[test]
    fn picks_the_form_by_keys() {
        let chat = TokenizeRequest::from_slice(
            br#"{"model":"m","messages":[{"role":"user","content":"hi"}],"chat_template_kwargs":{"enable_thinking":false},"mm_processor_kwargs":{}}"#,
        )
        .unwrap();
        let TokenizeRequest::Chat(chat) = chat else { panic!("expected the chat form") };
        assert!(chat.add_generation_prompt() && !chat.continue_final_message());
        assert!(!chat.add_special_tokens() && !chat.return_token_strs());
        assert_eq!(chat.messages[0].role, Role::User);
        assert!(chat.extra.contains_key("mm_processor_kwargs"));

        let completion =
            TokenizeRequest::from_slice(br#"{"prompt":"hi","return_token_strs":true}"#).unwrap();
        assert!(completion.return_token_strs());
        let TokenizeRequest::Completion(completion) = completion else {
            panic!("expected the prompt form")
        };
        assert!(completion.add_special_tokens());

        assert!(TokenizeRequest::from_slice(br#"{"model":"m"}"#).is_err());
        assert!(TokenizeRequest::from_slice(br#"{"messages":"x"}"#).is_err());
    }

    #[test]
    fn both_forms_round_trip() {
        for body in [
            r#"{"messages":[{"role":"user","content":"hi"}],"add_generation_prompt":false,"tools":[{"type":"function","function":{"name":"f","parameters":{"b":1,"a":2}}}],"x":null}"#,
            r#"{"z":1,"prompt":"hi","add_special_tokens":false}"#,
        ] {
            let request = TokenizeRequest::from_slice(body.as_bytes()).unwrap();
            assert_eq!(serde_json::to_string(&request).unwrap(), body);
        }
    }

    #[test]
    fn validate_rejects_both_generation_flags() {
        let request = TokenizeRequest::from_slice(
            br#"{"messages":[],"add_generation_prompt":true,"continue_final_message":true}"#,
        )
        .unwrap();
        assert!(request.validate().is_err());
    }

    #[test]
    fn responses_have_vllm_shapes() {
        let response = TokenizeResponse::new(vec![1, 2], 4096);
        assert_eq!(
            serde_json::to_string(&response).unwrap(),
            r#"{"count":2,"max_model_len":4096,"tokens":[1,2]}"#
        );
        let detok = DetokenizeRequest::from_slice(br#"{"tokens":[5,6],"model":"m"}"#).unwrap();
        assert_eq!(detok.tokens, vec![5, 6]);
        assert_eq!(serde_json::to_string(&detok).unwrap(), r#"{"tokens":[5,6],"model":"m"}"#);
        let answer: DetokenizeResponse = serde_json::from_str(r#"{"prompt":"hi"}"#).unwrap();
        assert_eq!(answer.prompt, "hi");
    }
}
