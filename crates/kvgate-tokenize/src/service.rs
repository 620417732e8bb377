//! [`Tokenize`]: one model's tokenizer plus its prefix cache, and
//! [`TokenizeService`], the same behind the worker [`Pool`] for async
//! callers. This is what the gateway holds: every request's render and
//! tokenize runs on a pool thread, re-using cached conversation prefixes.

use std::sync::Arc;

use crate::error::{Result, TokenizeError};
use crate::pool::{Pool, PoolError};
use crate::prefix_cache::{PrefixCache, PrefixCacheConfig, PrefixCacheStats};
use crate::{ChatRequest, ChatTokenizer};

/// A chat tokenizer with a prefix-tokenization cache.
#[derive(Debug)]
pub struct Tokenize {
    tokenizer: ChatTokenizer,
    cache: Option<PrefixCache>,
}

impl Tokenize {
    /// Wraps `tokenizer`; `cache: None` disables the prefix cache.
    pub fn new(tokenizer: ChatTokenizer, cache: Option<PrefixCacheConfig>) -> Tokenize {
        let cache = cache.map(|c| PrefixCache::with_rules(tokenizer.prefix_rules(), c));
        Tokenize { tokenizer, cache }
    }

    /// The wrapped tokenizer.
    pub fn tokenizer(&self) -> &ChatTokenizer {
        &self.tokenizer
    }

    /// Renders and encodes a chat, re-using cached prefixes. Identical to
    /// [`ChatTokenizer::encode_chat`] (the cache only cuts where the
    /// tokenizer cannot merge across, see [`crate::prefix_cache`]).
    pub fn encode_chat(&self, request: &ChatRequest) -> Result<Vec<u32>> {
        match &self.cache {
            // With add_special_tokens the post-processor wraps the whole
            // text (BOS), so cached pieces would not compose.
            Some(cache) if !request.add_special_tokens => {
                let text = self.tokenizer.render_chat(request)?;
                cache.encode(&text, |piece| self.tokenizer.encode_text_no_special(piece))
            }
            _ => self.tokenizer.encode_chat(request),
        }
    }

    /// Encodes a completion prompt (`add_special_tokens` as vLLM: default true).
    pub fn encode_prompt(&self, prompt: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        if add_special_tokens {
            self.tokenizer.encode_prompt(prompt)
        } else {
            self.tokenizer.encode_text_no_special(prompt)
        }
    }

    /// Prefix-cache counters (all zero when the cache is off).
    pub fn cache_stats(&self) -> PrefixCacheStats {
        self.cache.as_ref().map(PrefixCache::stats).unwrap_or_default()
    }
}

/// [`Tokenize`] on a pool of threads sized to the cores.
#[derive(Debug)]
pub struct TokenizeService {
    inner: Arc<Tokenize>,
    pool: Pool<Tokenize>,
}

impl TokenizeService {
    /// Starts `threads` workers (0: one per core).
    pub fn new(tokenize: Tokenize, threads: usize) -> Result<TokenizeService> {
        let inner = Arc::new(tokenize);
        let pool = Pool::new(threads, Arc::clone(&inner)).map_err(|e| {
            TokenizeError::Tokenizer(format!("cannot start tokenizer threads: {e}"))
        })?;
        Ok(TokenizeService { inner, pool })
    }

    /// The shared tokenizer, for cheap synchronous calls (stats, decode).
    pub fn tokenize(&self) -> &Tokenize {
        &self.inner
    }

    /// Worker threads.
    pub fn threads(&self) -> usize {
        self.pool.threads()
    }

    /// [`Tokenize::encode_chat`] on a worker.
    pub async fn encode_chat(&self, request: ChatRequest) -> Result<Vec<u32>> {
        self.pool.run(move |t: &Tokenize| t.encode_chat(&request)).await.map_err(pool_error)?
    }

    /// [`Tokenize::encode_prompt`] on a worker.
    pub async fn encode_prompt(
        &self,
        prompt: String,
        add_special_tokens: bool,
    ) -> Result<Vec<u32>> {
        self.pool
            .run(move |t: &Tokenize| t.encode_prompt(&prompt, add_special_tokens))
            .await
            .map_err(pool_error)?
    }

    /// A vLLM `/tokenize` body: `messages` (chat, rendered as the engine
    /// would) or a string `prompt` (with `add_special_tokens`, default true).
    pub async fn encode_tokenize_body(&self, body: serde_json::Value) -> Result<Vec<u32>> {
        if body.get("messages").is_some() {
            let chat: ChatRequest = serde_json::from_value(body).map_err(|e| {
                TokenizeError::InvalidRequest(format!("invalid tokenize request: {e}"))
            })?;
            self.encode_chat(chat).await
        } else if let Some(prompt) = body.get("prompt").and_then(serde_json::Value::as_str) {
            let add =
                body.get("add_special_tokens").and_then(serde_json::Value::as_bool).unwrap_or(true);
            self.encode_prompt(prompt.to_owned(), add).await
        } else {
            Err(TokenizeError::InvalidRequest(
                "the request needs `messages` or a string `prompt`".into(),
            ))
        }
    }

    /// A vLLM `/detokenize` body (`{"tokens": [...]}`) decoded to text.
    pub fn decode_detokenize_body(&self, body: &serde_json::Value) -> Result<String> {
        let ids: Option<Vec<u32>> =
            body.get("tokens").and_then(serde_json::Value::as_array).and_then(|a| {
                a.iter().map(|v| v.as_u64().and_then(|v| u32::try_from(v).ok())).collect()
            });
        let ids = ids.ok_or_else(|| {
            TokenizeError::InvalidRequest("`tokens` must be an array of token ids".into())
        })?;
        self.tokenize().tokenizer().decode(&ids, false)
    }
}

fn pool_error(e: PoolError) -> TokenizeError {
    TokenizeError::Tokenizer(e.to_string())
}
