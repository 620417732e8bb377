//! OpenAI / vLLM wire types and SSE framing for kvgate.
//!
//! kvgate sits between OpenAI-style clients and vLLM engines, so it reads
//! and writes the engines' HTTP bodies: chat and completion requests
//! ([`chat`], [`completion`], [`message`]), their answers and streamed
//! chunks ([`response`], [`stream`]), `/v1/models` ([`models`]), vLLM's
//! `/tokenize` and `/detokenize` ([`tokenize`]), and the error body
//! ([`api_error`]); Anthropic's Messages API where it differs
//! ([`anthropic`]). [`sse`] frames and parses event streams.
//!
//! Two rules shape the request types. First, **a request is forwarded as the
//! client wrote it**: engines keep adding fields, so every request object
//! keeps the keys it does not model in a public `extra` map, and writes
//! back the same keys, values, explicit nulls and key order it read (the private
//! `wire` module says how). Only what kvgate reads or edits is typed: the model,
//! the messages and rendering switches the tokenizer needs, streaming, and
//! the prompt or `kv_transfer_params.prompt_token_ids` a router rewrites.
//! Second, **nothing here trusts its input**: malformed bodies and streams
//! give an [`Error`], never a panic, and the SSE parser's memory is bounded.
//!
//! This crate is sans-IO: no sockets, no runtime, no clock.

pub mod anthropic;
pub mod api_error;
pub mod chat;
pub mod completion;
pub mod error;
pub mod message;
pub mod models;
pub mod response;
pub mod responses;
pub mod sse;
pub mod stream;
pub mod tokenize;
mod wire;

pub use api_error::{ErrorCode, ErrorInfo, ErrorKind, ErrorResponse};
pub use chat::{ChatCompletionRequest, StreamOptions};
pub use completion::{CompletionRequest, Prompt};
pub use error::Error;
pub use message::{
    ChatMessage, ContentPart, FunctionCall, MessageContent, PartKind, Role, ToolCall,
};
pub use models::{ModelCard, ModelList};
pub use response::{
    ChatChoice, ChatCompletionResponse, CompletionChoice, CompletionResponse, Envelope,
    PromptTokensDetails, Usage,
};
pub use sse::{SseEvent, SseFraming, SseItem, SseParser};
pub use stream::{
    summarize_chunk, AnswerEnd, ChatCompletionChunk, ChatDelta, ChunkSummary, CompletionChunk,
    Observation, StreamTap,
};
pub use tokenize::{
    DetokenizeRequest, DetokenizeResponse, TokenizeChatRequest, TokenizeCompletionRequest,
    TokenizeRequest, TokenizeResponse,
};
