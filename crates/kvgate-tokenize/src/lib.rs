//! Render chat templates and tokenize exactly as vLLM does.
//!
//! KV-aware routing needs the token ids the engine will compute: one wrong
//! token early in a prompt shifts every block hash. This crate reproduces
//! vLLM 0.33's `/tokenize` and chat rendering natively:
//!
//! - [`ModelDir`] loads a Hugging Face model directory (`tokenizer.json` or
//!   `tokenizer.json.zst`, `tokenizer_config.json`, `chat_template.jinja`),
//!   or the bundled Qwen3 tokenizer.
//! - [`ChatTokenizer`] validates messages the way vLLM's request model does
//!   (module `validate`), applies vLLM's preprocessing (module `preprocess`:
//!   content-part flattening by detected content format, developer → system,
//!   tool-call argument parsing, template-kwargs filtering), renders the chat
//!   template with minijinja configured like transformers' Jinja2
//!   environment (module `template`), and encodes the result with
//!   `tokenizers`.
//! - [`messages_to_chat`] turns an Anthropic Messages request into the
//!   chat request vLLM renders for it, and [`responses_to_chat`] an OpenAI
//!   Responses request.
//! - [`prefix_cache`] re-uses the tokens of earlier conversation prefixes,
//!   and [`pool`] runs tokenization off the async runtime.
//!
//! Parity with vLLM is checked by `tests/parity.rs` against fixtures
//! generated from transformers plus vLLM's rules
//! (`tests/py/parity/gen_expected.py`, cross-checked against vLLM itself)
//! and against edge cases tokenized by vLLM 0.33.0's own `/tokenize` code
//! (`tests/vllm_probe/`). See the crate README for the known differences.
//!
//! ```no_run
//! use kvgate_tokenize::{ChatRequest, ChatTokenizer};
//!
//! let tokenizer = ChatTokenizer::bundled()?;
//! let request: ChatRequest = serde_json::from_str(
//!     r#"{"messages": [{"role": "user", "content": "Hello!"}]}"#,
//! ).unwrap();
//! let ids = tokenizer.encode_chat(&request)?;
//! assert!(!ids.is_empty());
//! # Ok::<(), kvgate_tokenize::TokenizeError>(())
//! ```

mod anthropic;
mod chat;
mod config;
mod encoder;
mod error;
mod model_dir;
mod normalized;
pub mod pool;
pub mod prefix_cache;
mod preprocess;
mod request;
mod responses;
pub mod service;
mod template;
mod validate;

pub use anthropic::{messages_to_chat, MessagesEndpoint, MessagesRules};
pub use chat::{ChatOptions, ChatTokenizer};
pub use encoder::{EncoderChoice, EncoderPath};
pub use error::{Result, TokenizeError};
pub use model_dir::{ChatTemplates, ModelDir};
pub use request::{ChatRequest, Endpoint};
pub use responses::responses_to_chat;
pub use template::ContentFormat;
