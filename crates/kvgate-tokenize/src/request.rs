//! [`ChatRequest`]: the chat fields of a vLLM request body.
//!
//! The field set and defaults are those of vLLM's `POST /tokenize` chat body
//! (`TokenizeChatRequest`): `add_generation_prompt` defaults to `true`,
//! `add_special_tokens` to `false`, and a top-level `documents` is *not* a
//! field (it is ignored, like any unknown field; it reaches the template only
//! through `chat_template_kwargs`). A `/v1/chat/completions` body renders a
//! little differently (`documents` and `reasoning_effort` are fields, and a
//! message's `reasoning_content` is read as `reasoning`); set
//! [`ChatRequest::endpoint`] to [`Endpoint::ChatCompletions`] for that.
//! Unknown fields are kept in [`ChatRequest::extra`].

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// Which vLLM endpoint's rendering rules apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Endpoint {
    /// `POST /tokenize` (`TokenizeChatRequest`).
    #[default]
    Tokenize,
    /// `POST /v1/chat/completions` (`ChatCompletionRequest`).
    ChatCompletions,
}

fn default_true() -> bool {
    true
}

/// A chat request, as the JSON body of vLLM's `/tokenize`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ChatRequest {
    /// The messages, as the client sent them.
    pub messages: Vec<Value>,
    /// Append the template's generation prompt (default `true`).
    #[serde(default = "default_true")]
    pub add_generation_prompt: bool,
    /// Leave the final message open for the model to continue.
    #[serde(default)]
    pub continue_final_message: bool,
    /// Let the tokenizer add its special tokens (BOS) on top of the
    /// template's (default `false`).
    #[serde(default)]
    pub add_special_tokens: bool,
    /// Tool definitions (`[{"type": "function", "function": {...}}]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<Value>>,
    /// Extra template variables (`enable_thinking`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chat_template_kwargs: Option<Map<String, Value>>,
    /// A template (or the name of one of the model's templates) replacing
    /// the model's; refused unless the tokenizer trusts request templates.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chat_template: Option<String>,
    /// Every other field of the body, preserved.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
    /// The endpoint whose rules apply; not part of the body.
    #[serde(skip)]
    pub endpoint: Endpoint,
}

impl ChatRequest {
    /// A request with these messages and the `/tokenize` defaults.
    pub fn new(messages: Vec<Value>) -> ChatRequest {
        ChatRequest {
            messages,
            add_generation_prompt: true,
            continue_final_message: false,
            add_special_tokens: false,
            tools: None,
            chat_template_kwargs: None,
            chat_template: None,
            extra: Map::new(),
            endpoint: Endpoint::Tokenize,
        }
    }

    /// A `/v1/chat/completions` field from [`ChatRequest::extra`], when the
    /// endpoint has it.
    pub(crate) fn chat_completions_field(&self, name: &str) -> Option<&Value> {
        match self.endpoint {
            Endpoint::ChatCompletions => self.extra.get(name).filter(|v| !v.is_null()),
            Endpoint::Tokenize => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_follow_vllm_tokenize() {
        let req: ChatRequest = serde_json::from_str(
            r#"{"messages": [{"role": "user", "content": "hi"}], "model": "m"}"#,
        )
        .unwrap();
        assert!(req.add_generation_prompt);
        assert!(!req.continue_final_message);
        assert!(!req.add_special_tokens);
        assert_eq!(req.extra["model"], "m");
        assert_eq!(req.endpoint, Endpoint::Tokenize);
        let back = serde_json::to_value(&req).unwrap();
        assert_eq!(back["model"], "m");
    }

    #[test]
    fn documents_only_for_chat_completions() {
        let mut req: ChatRequest =
            serde_json::from_str(r#"{"messages": [], "documents": [{"text": "x"}]}"#).unwrap();
        assert!(req.chat_completions_field("documents").is_none());
        req.endpoint = Endpoint::ChatCompletions;
        assert!(req.chat_completions_field("documents").is_some());
    }
}
