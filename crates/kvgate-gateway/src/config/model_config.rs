//! The model a pool serves (`[model]`, `[pools.model]`): its names, its
//! adapters and how its prompts are tokenized.

use std::path::PathBuf;

use kvgate_tokenize::EncoderChoice;
use serde::{Deserialize, Serialize};

use crate::error::ConfigError;

/// The model served.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ModelConfig {
    /// A Hugging Face model directory (tokenizer.json, tokenizer_config.json);
    /// none uses the bundled Qwen3 tokenizer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dir: Option<PathBuf>,
    /// The model name clients send and `/v1/models` lists; the engines
    /// serve it under this name.
    pub served_name: String,
    /// Other names clients may send for the model; kvgate rewrites them to
    /// `served_name` before forwarding (the engines know only that name).
    pub aliases: Vec<String>,
    /// LoRA adapters the engines serve, by the name clients send in `model`
    /// (vLLM's `--lora-modules NAME=PATH`). A request for one is matched
    /// only against blocks cached under that adapter.
    pub lora_adapters: Vec<String>,
    /// LoRA adapters kvgate may load onto an engine when a request names
    /// one that no replica serves, as `NAME=PATH` (vLLM's runtime API,
    /// `POST /v1/load_lora_adapter`; the engines need
    /// `VLLM_ALLOW_RUNTIME_LORA_UPDATING=true`).
    pub loadable_adapters: Vec<String>,
    /// Longest prompt + output accepted, tokens.
    pub max_model_len: u32,
    /// Tokenizer threads; 0 uses one per core.
    pub tokenizer_threads: usize,
    /// Token ids kept by the tokenization prefix cache (multi-turn chats
    /// re-send their history; the cache re-uses its tokens); 0 disables it.
    pub prefix_cache_tokens: usize,
    /// What encodes text: `auto` (fastokens where it is proven on the
    /// tokenizer, else tokenizers), `fastokens`, or `tokenizers`.
    pub encoder: EncoderChoice,
}

impl ModelConfig {
    /// `loadable_adapters` as `(name, path)` pairs; an entry without `=`
    /// or with an empty side is an error naming it.
    pub fn loadable(&self) -> Result<Vec<(&str, &str)>, ConfigError> {
        self.loadable_adapters
            .iter()
            .map(|e| match e.split_once('=') {
                Some((n, p)) if !n.trim().is_empty() && !p.trim().is_empty() => {
                    Ok((n.trim(), p.trim()))
                }
                _ => Err(ConfigError::Invalid(format!(
                    "model.loadable_adapters: {e:?} is not NAME=PATH"
                ))),
            })
            .collect()
    }
}

impl Default for ModelConfig {
    fn default() -> Self {
        ModelConfig {
            dir: None,
            served_name: "Qwen/Qwen3-0.6B".to_owned(),
            aliases: Vec::new(),
            lora_adapters: Vec::new(),
            loadable_adapters: Vec::new(),
            max_model_len: 40_960,
            tokenizer_threads: 0,
            prefix_cache_tokens: 16 << 20,
            encoder: EncoderChoice::Auto,
        }
    }
}
