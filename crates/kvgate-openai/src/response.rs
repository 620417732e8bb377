//! Non-streaming answers of `/v1/chat/completions` and `/v1/completions`,
//! and the `usage` block they share with streams.
//!
//! These are read from engines (to account tokens) and written by the
//! simulator, so every struct tolerates missing fields and keeps unknown
//! ones.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::message::ChatMessage;

/// Cached-prompt detail of [`Usage`].
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PromptTokensDetails {
    /// Prompt tokens served from the prefix cache.
    #[serde(default)]
    pub cached_tokens: Option<u64>,
    /// Anything else.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// Token accounting of one request.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Usage {
    /// Tokens in the prompt.
    #[serde(default)]
    pub prompt_tokens: u64,
    /// Tokens generated; vLLM may send `null`.
    #[serde(default)]
    pub completion_tokens: Option<u64>,
    /// Prompt plus completion.
    #[serde(default)]
    pub total_tokens: u64,
    /// Prefix-cache detail, when the engine reports it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_tokens_details: Option<PromptTokensDetails>,
    /// Anything else.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl Usage {
    /// Usage for `prompt_tokens` in and `completion_tokens` out.
    pub fn new(prompt_tokens: u64, completion_tokens: u64) -> Self {
        Usage {
            prompt_tokens,
            completion_tokens: Some(completion_tokens),
            total_tokens: prompt_tokens.saturating_add(completion_tokens),
            prompt_tokens_details: None,
            extra: Map::new(),
        }
    }

    /// Prompt tokens served from the prefix cache, when reported.
    pub fn cached_tokens(&self) -> Option<u64> {
        self.prompt_tokens_details.as_ref()?.cached_tokens
    }
}

/// One choice of a chat answer.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ChatChoice {
    /// The choice's position.
    #[serde(default)]
    pub index: u32,
    /// The assistant's message.
    #[serde(default)]
    pub message: ChatMessage,
    /// Why generation stopped: `stop`, `length`, `tool_calls`, ...
    #[serde(default)]
    pub finish_reason: Option<String>,
    /// Log-probabilities, kept as JSON.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<Value>,
    /// Anything else (vLLM's `stop_reason`, ...).
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// The envelope every answer and stream chunk shares, for chat and for
/// completions: only the choice type differs. `object` says which it is
/// (`chat.completion`, `chat.completion.chunk`, `text_completion`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(bound(
    serialize = "Choice: Serialize",
    deserialize = "Choice: serde::de::DeserializeOwned + Default"
))]
pub struct Envelope<Choice> {
    /// `chatcmpl-...` or `cmpl-...`, the same on every chunk of a stream.
    #[serde(default)]
    pub id: String,
    /// The object kind.
    #[serde(default)]
    pub object: String,
    /// Unix seconds.
    #[serde(default)]
    pub created: u64,
    /// The model that answered.
    #[serde(default)]
    pub model: String,
    /// The choices (in a stream: the ones this chunk extends; empty on the
    /// final usage chunk).
    #[serde(default)]
    pub choices: Vec<Choice>,
    /// Token accounting (in a stream: on the final chunk when asked for).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// Anything else.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// A non-streaming `/v1/chat/completions` answer.
pub type ChatCompletionResponse = Envelope<ChatChoice>;

/// One choice of a completion answer.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CompletionChoice {
    /// The choice's position.
    #[serde(default)]
    pub index: u32,
    /// The generated text.
    #[serde(default)]
    pub text: String,
    /// Why generation stopped.
    #[serde(default)]
    pub finish_reason: Option<String>,
    /// Log-probabilities, kept as JSON.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<Value>,
    /// Anything else.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// A non-streaming `/v1/completions` answer.
pub type CompletionResponse = Envelope<CompletionChoice>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_vllm_chat_answer() {
        let body = r#"{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"hi","reasoning_content":null,"tool_calls":[]},"logprobs":null,"finish_reason":"stop","stop_reason":null}],"usage":{"prompt_tokens":10,"total_tokens":12,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":8}},"prompt_logprobs":null,"kv_transfer_params":null}"#;
        let answer: ChatCompletionResponse = serde_json::from_str(body).unwrap();
        assert_eq!(answer.choices[0].finish_reason.as_deref(), Some("stop"));
        assert_eq!(answer.usage.as_ref().and_then(Usage::cached_tokens), Some(8));
        let back: Value = serde_json::to_value(&answer).unwrap();
        assert_eq!(back["choices"][0]["message"]["reasoning_content"], Value::Null);
        assert!(back.as_object().unwrap().contains_key("kv_transfer_params"));
    }

    #[test]
    fn reads_a_completion_answer() {
        let body = r#"{"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":" world","logprobs":null,"finish_reason":"length"}],"usage":{"prompt_tokens":3,"completion_tokens":null,"total_tokens":3}}"#;
        let answer: CompletionResponse = serde_json::from_str(body).unwrap();
        assert_eq!(answer.choices[0].text, " world");
        assert_eq!(answer.usage.unwrap().completion_tokens, None);
    }
}
