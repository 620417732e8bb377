//! From a client body to what routing and forwarding need: parse, check the
//! model and limits, render and tokenize (on the tokenizer pool), compute
//! block keys, and build the body with the prompt tokens for engines that
//! take them.

use std::sync::{Arc, OnceLock};
use std::time::Instant;

use bytes::Bytes;
use kvgate_index::{request_block_keys, BlockKey, ReplicaId};
use kvgate_openai::{
    anthropic, responses, ChatCompletionRequest, CompletionRequest, ErrorResponse, Prompt,
};
use kvgate_router::RouteRequest;
use kvgate_tokenize::{
    messages_to_chat, responses_to_chat, ChatRequest, Endpoint, MessagesEndpoint, TokenizeError,
};
use serde_json::{Map, Value};

use crate::config::{Passthrough, ReplicaConfig};
use crate::observe::metrics::Metrics;
use crate::replicas::fleet_handle::FleetHandle;
use crate::replicas::pool::{Pool, Pools, Resolved};
use crate::request::affinity::{AffinityKey, IdError};
use crate::request::route::Route;
use kvgate_fleet::PoolId;

/// What preparing a request needs: the pools (each with its model and
/// tokenizer), the message limit, the fleet's block size, the metrics, and
/// the fleet (only to ask which adapters its engines list).
#[derive(Debug)]
pub(crate) struct Preparer {
    pub(crate) pools: Arc<Pools>,
    /// `limits.max_messages`.
    pub(crate) max_messages: usize,
    pub(crate) block_size: u32,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) fleet: Arc<FleetHandle>,
    /// Verifies the response ids Responses API clients send back.
    pub(crate) affinity: AffinityKey,
}

/// Bodies (or prompts) up to this size are tokenized on the request's own
/// task (tens of microseconds); larger ones go to the tokenizer pool so that
/// they never stall the async workers.
const INLINE_TOKENIZE_BYTES: usize = 2048;

/// A request ready to route.
#[derive(Debug)]
pub(crate) struct Prepared {
    pub(crate) route: Route,
    /// Prompt token ids, when kvgate could compute them.
    pub(crate) tokens: Option<Vec<u32>>,
    pub(crate) prompt_tokens: u64,
    pub(crate) keys: Vec<BlockKey>,
    pub(crate) max_output: Option<u32>,
    pub(crate) stream: bool,
    pub(crate) session_key: Option<String>,
    /// The model pool it goes to.
    pub(crate) pool: PoolId,
    /// That pool splits requests between prefill and decode ([`Pool::disaggregated`]).
    pub(crate) disaggregated: bool,
    /// The LoRA adapter the request names, if any.
    pub(crate) adapter: Option<String>,
    /// The client's body, byte for byte.
    pub(crate) original: Bytes,
    /// The body carrying the prompt tokens (chat and Messages:
    /// `kv_transfer_params`).
    pub(crate) with_tokens: Option<Bytes>,
    /// A Responses API request that continues a stored response: it must
    /// go to the replica holding it.
    pub(crate) continues: Option<Continuation>,
    /// The client's vLLM `priority` (an integer; lower is more urgent).
    pub(crate) priority: Option<i64>,
    /// The body has a `priority` key (`null` included), which engines
    /// without priority scheduling must not get.
    priority_key: bool,
    /// What engines with priority scheduling are sent as `priority`, set
    /// once when the request is admitted (the client's, or its band's);
    /// unset, they get the client's body as it is.
    engine_priority: OnceLock<i64>,
    /// The bodies rewritten for `priority`, each built once on first use:
    /// (client's body, body with tokens) × (priority set, priority removed).
    rewritten: [OnceLock<Bytes>; 4],
}

/// The stored response a Responses request continues (its
/// `previous_response_id`), as its id told: which replica holds it and
/// under which id.
#[derive(Clone, Debug)]
pub(crate) struct Continuation {
    /// The owner's name.
    pub(crate) owner: String,
    /// The id the engine knows it by.
    pub(crate) engine_id: String,
    /// The id the client sent.
    pub(crate) client_id: String,
}

impl Prepared {
    /// What the router is asked for this request, with the request's wait
    /// so far and the replicas it must not go to.
    pub(crate) fn route_request<'a>(
        &'a self,
        queued_since: Option<Instant>,
        exclude: &'a [ReplicaId],
    ) -> RouteRequest<'a> {
        RouteRequest {
            prompt_tokens: self.prompt_tokens,
            keys: &self.keys,
            max_output_tokens: self.max_output,
            session_key: self.session_key.as_deref(),
            approx_symbols: self.tokens.as_deref(),
            queued_since,
            exclude,
            adapter: self.adapter.as_deref(),
            remote_kv_s_per_token: None,
            already_running: false,
        }
    }

    /// The body `replica` gets: with the prompt tokens as its `passthrough`
    /// takes them, and with `priority` set to the request's engine priority
    /// when it runs priority scheduling, else with no `priority`.
    pub(crate) fn body_for(&self, replica: &ReplicaConfig) -> Bytes {
        let use_tokens = match (self.route, replica.passthrough) {
            (_, Passthrough::None) => false,
            (Route::Chat | Route::Messages | Route::Responses, Passthrough::TokenPrompt) => false,
            (_, _) => true,
        };
        let (base, slot) = match (&self.with_tokens, use_tokens) {
            (Some(b), true) => (b, 2),
            _ => (&self.original, 0),
        };
        let set = match (replica.priority_scheduling, self.engine_priority.get()) {
            (true, Some(&p)) if self.priority != Some(p) => Some(p),
            (true, _) => return base.clone(),
            (false, _) if !self.priority_key => return base.clone(),
            (false, _) => None,
        };
        let slot = slot + usize::from(set.is_none());
        self.rewritten[slot].get_or_init(|| with_priority(base, set, self.priority_key)).clone()
    }

    /// A body kvgate does not key (not a generation route), as it came:
    /// no tokens, no prompt count, the first pool.
    pub(crate) fn unkeyed(body: Bytes) -> Prepared {
        Prepared {
            pool: 0,
            disaggregated: false,
            route: Route::Completions,
            tokens: None,
            prompt_tokens: 0,
            keys: Vec::new(),
            max_output: Some(0),
            stream: false,
            session_key: None,
            adapter: None,
            original: body,
            with_tokens: None,
            continues: None,
            priority: None,
            priority_key: false,
            engine_priority: OnceLock::new(),
            rewritten: Default::default(),
        }
    }

    /// Sets what engines with priority scheduling are sent as `priority`
    /// (once; a later call changes nothing).
    pub(crate) fn set_engine_priority(&self, priority: i64) {
        let _ = self.engine_priority.set(priority);
    }

    /// Takes the client's `priority` from its body's top-level fields:
    /// absent or `null` is none; anything but an integer is refused.
    fn with_client_priority(mut self, fields: &Map<String, Value>) -> Result<Prepared, Reject> {
        self.priority_key = fields.contains_key("priority");
        self.priority = match fields.get("priority") {
            None | Some(Value::Null) => None,
            Some(v) => Some(v.as_i64().ok_or_else(|| {
                Box::new(
                    invalid(format!(
                        "`priority` must be an integer (lower is more urgent), not {}",
                        json_kind(v)
                    ))
                    .with_param("priority"),
                )
            })?),
        };
        Ok(self)
    }
}

/// The JSON type of a value, for messages.
fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number that is not an integer in range",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// `body` with `priority` set to `set`, or removed when `set` is none.
/// A body without the key gets it spliced in after its opening brace (no
/// second parse of a long prompt); otherwise the object is rewritten. A
/// body that is not a JSON object (it was parsed as one already) goes as
/// it is.
fn with_priority(body: &Bytes, set: Option<i64>, has_key: bool) -> Bytes {
    if let (Some(p), false) = (set, has_key) {
        let start = body.iter().position(|b| !b.is_ascii_whitespace());
        if let Some(i) = start.filter(|&i| body[i] == b'{') {
            let rest = &body[i + 1..];
            let empty = rest.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'}');
            let field = format!("\"priority\":{p}{}", if empty { "" } else { "," });
            let mut out = Vec::with_capacity(body.len() + field.len());
            out.extend_from_slice(&body[..=i]);
            out.extend_from_slice(field.as_bytes());
            out.extend_from_slice(rest);
            return Bytes::from(out);
        }
    }
    let Ok(mut fields) = serde_json::from_slice::<Map<String, Value>>(body) else {
        return body.clone();
    };
    match set {
        Some(p) => fields.insert("priority".into(), Value::from(p)),
        None => fields.shift_remove("priority"),
    };
    serde_json::to_vec(&fields).map_or_else(|_| body.clone(), Bytes::from)
}

/// A client error, already in OpenAI's shape (boxed: it is large and
/// travels in `Result`s).
pub(crate) type Reject = Box<ErrorResponse>;

fn invalid(msg: impl Into<String>) -> ErrorResponse {
    ErrorResponse::invalid_request(msg)
}

fn bad(msg: impl Into<String>) -> Reject {
    Box::new(invalid(msg))
}

/// The pool and LoRA adapter the request's `model` names (`pool.rs`); an
/// unknown model is vLLM's 404.
fn check_model<'a>(prep: &'a Preparer, model: Option<&str>) -> Result<Resolved<'a>, Reject> {
    prep.pools.resolve(model, &prep.fleet)
}

/// Characters vLLM 0.33 refuses in `cache_salt`, and its longest salt
/// (`validate_cache_salt` in `entrypoints/generate/base/protocol.py`).
const SALT_FORBIDDEN: [char; 4] = ['@', '/', '\\', '\0'];
const SALT_MAX_CHARS: usize = 128;

/// `cache_salt`, checked as vLLM checks it: the engine would refuse the
/// request, so kvgate refuses it first, with the engine's words.
fn cache_salt(
    extra: &serde_json::Map<String, serde_json::Value>,
) -> Result<Option<String>, Reject> {
    let salt = match extra.get("cache_salt") {
        None | Some(serde_json::Value::Null) => return Ok(None),
        Some(serde_json::Value::String(s)) if !s.is_empty() => s,
        Some(_) => {
            let e = invalid("Parameter 'cache_salt' must be a non-empty string if provided.");
            return Err(Box::new(e.with_param("cache_salt")));
        }
    };
    if salt.chars().count() > SALT_MAX_CHARS || salt.contains(SALT_FORBIDDEN) {
        let e = invalid(
            "Parameter 'cache_salt' must be at most 128 characters and must not contain \
             '@', '/', '\\\\', or NUL.",
        );
        return Err(Box::new(e.with_param("cache_salt")));
    }
    Ok(Some(salt.clone()))
}

/// The body to forward: the client's, or for a model alias, the request
/// with the served name the engines know (`write` sets it and
/// re-serialises).
fn aliased(
    body: Bytes,
    served: Option<&str>,
    write: impl FnOnce(&str) -> Result<Vec<u8>, String>,
) -> Result<Bytes, Reject> {
    match served {
        Some(name) => write(name).map(Bytes::from).map_err(bad),
        None => Ok(body),
    }
}

/// What besides the tokens names a request's KV blocks in the engine, and
/// the pool whose engines hold them.
#[derive(Debug)]
struct CacheIdentity<'a> {
    pool: &'a Pool,
    lora: Option<String>,
    salt: Option<String>,
}

impl<'a> CacheIdentity<'a> {
    fn new(model: Resolved<'a>, salt: Option<String>) -> CacheIdentity<'a> {
        CacheIdentity { pool: model.pool, lora: model.adapter, salt }
    }
}

fn check_length(pool: &Pool, prompt: usize, max_output: Option<u32>) -> Result<(), Reject> {
    let max = pool.model.max_model_len as usize;
    let out = max_output.unwrap_or(0) as usize;
    if prompt + out > max {
        return Err(Box::new(
            invalid(format!(
                "This model's maximum context length is {max} tokens. However, you requested \
             {} tokens ({prompt} in the messages, {out} in the completion). Please reduce the \
             length of the messages or completion.",
                prompt + out
            ))
            .with_param("messages"),
        ));
    }
    Ok(())
}

/// `max_tokens` / `max_completion_tokens`, when given, must be positive
/// integers (vLLM rejects anything else); a wrong type must not slip past the
/// context-length check.
fn check_output_limit(extra: &serde_json::Map<String, serde_json::Value>) -> Result<(), Reject> {
    for key in ["max_tokens", "max_completion_tokens"] {
        match extra.get(key) {
            None | Some(serde_json::Value::Null) => {}
            Some(v) if v.as_u64().is_some_and(|n| n >= 1) => {}
            Some(v) => {
                let e = invalid(format!("`{key}` must be a positive integer, got {v}"));
                return Err(Box::new(e.with_param(key)));
            }
        }
    }
    Ok(())
}

fn session_key(extra: &serde_json::Map<String, serde_json::Value>) -> Option<String> {
    extra.get("user").and_then(|v| v.as_str()).map(str::to_owned)
}

fn max_output(v: Option<u64>) -> Option<u32> {
    v.map(|n| u32::try_from(n).unwrap_or(u32::MAX))
}

/// The renderer's view of a parsed chat request. Built from the typed
/// request, which serialises back to the client's body field for field
/// (`kvgate_openai`'s round-trip tests), instead of parsing the body a
/// second time: a copy of each field costs a fifth of a parse (2 against
/// 11 µs for a 24 KB chat).
fn chat_view(req: &ChatCompletionRequest) -> Result<ChatRequest, Reject> {
    let value = serde_json::to_value(req).map_err(|e| bad(e.to_string()))?;
    let mut chat: ChatRequest = serde_json::from_value(value).map_err(|e| bad(e.to_string()))?;
    chat.endpoint = Endpoint::ChatCompletions;
    Ok(chat)
}

/// Renders and tokenizes `chat` with `pool`'s tokenizer, timed. Small
/// requests (`body_len` bytes) tokenize in place: a hop to the pool and back
/// costs more CPU (two thread wake-ups) than their tokenization.
async fn encode_chat(
    prep: &Preparer,
    pool: &Pool,
    chat: ChatRequest,
    body_len: usize,
) -> Result<Vec<u32>, TokenizeError> {
    let t = Instant::now();
    let r = if body_len <= INLINE_TOKENIZE_BYTES {
        pool.tokenizer.tokenize().encode_chat(&chat)
    } else {
        pool.tokenizer.encode_chat(chat).await
    };
    prep.metrics.tokenize_time(t.elapsed().as_secs_f64());
    r
}

/// Chat: the engine's own rendering rules, then the tokens.
pub(crate) async fn chat(prep: &Preparer, body: Bytes) -> Result<Prepared, Reject> {
    let mut req = ChatCompletionRequest::from_slice(&body).map_err(|e| bad(e.to_string()))?;
    req.validate().map_err(|e| bad(e.to_string()))?;
    let model = check_model(prep, req.model())?;
    let body = aliased(body, model.rewrite, |served| {
        req.model = Some(served.to_owned());
        req.to_vec().map_err(|e| e.to_string())
    })?;
    let identity = CacheIdentity::new(model, cache_salt(&req.extra)?);
    check_output_limit(&req.extra)?;
    if req.messages.len() > prep.max_messages {
        return Err(Box::new(
            invalid(format!(
                "too many messages: {} (at most {})",
                req.messages.len(),
                prep.max_messages
            ))
            .with_param("messages"),
        ));
    }
    let max_out = max_output(req.max_output_tokens());
    // Token ids the client passed itself need no tokenization and no new body.
    let client_ids = req.prompt_token_ids();
    let passed_by_client = client_ids.is_some();
    let tokens = match client_ids {
        Some(ids) => Some(ids),
        None => {
            let chat = chat_view(&req)?;
            match encode_chat(prep, identity.pool, chat, body.len()).await {
                Ok(ids) => Some(ids),
                // Content kvgate cannot render (images, audio): the engine
                // renders it; kvgate routes by load.
                Err(TokenizeError::Unsupported(why)) => {
                    tracing::debug!(%why, "not tokenized by kvgate; forwarded as is");
                    prep.metrics.unmatched("unrendered_content");
                    None
                }
                Err(e) => return Err(bad(e.to_string())),
            }
        }
    };
    if let Some(t) = &tokens {
        check_length(identity.pool, t.len(), max_out)?;
    }
    let with_tokens = match &tokens {
        Some(ids) if !passed_by_client => Some(Bytes::from(
            req.body_with_prompt_token_ids(&body, ids).map_err(|e| bad(e.to_string()))?,
        )),
        _ => None,
    };
    finish(
        prep,
        Route::Chat,
        &identity,
        tokens,
        max_out,
        req.is_stream(),
        session_key(&req.extra),
        body,
        with_tokens,
    )
    .with_client_priority(&req.extra)
}

/// Anthropic Messages (`/v1/messages`): converted to the chat request vLLM
/// renders for it (`kvgate_tokenize::messages_to_chat`), rendered and
/// tokenized like chat, and forwarded as the client's body with
/// `kv_transfer_params.prompt_token_ids` (vLLM carries `kv_transfer_params`
/// into the converted request, where its renderer takes the ids).
/// Content kvgate cannot render is refused, never routed blind.
pub(crate) async fn messages(
    prep: &Preparer,
    body: Bytes,
    now_unix: u64,
) -> Result<Prepared, Reject> {
    let mut req: Map<String, Value> = match serde_json::from_slice(&body) {
        Ok(Value::Object(o)) => o,
        Ok(_) => return Err(bad("the body must be a JSON object")),
        Err(e) => return Err(bad(format!("invalid JSON body: {e}"))),
    };
    let model = check_model(prep, req.get("model").and_then(Value::as_str))?;
    let body = aliased(body, model.rewrite, |served| {
        req.insert("model".into(), Value::String(served.to_owned()));
        serde_json::to_vec(&req).map_err(|e| e.to_string())
    })?;
    let identity = CacheIdentity::new(model, cache_salt(&req)?);
    let tokenizer = &identity.pool.tokenizer;
    let n_messages = req.get("messages").and_then(Value::as_array).map_or(0, Vec::len);
    if n_messages > prep.max_messages {
        return Err(Box::new(
            invalid(format!("too many messages: {n_messages} (at most {})", prep.max_messages))
                .with_param("messages"),
        ));
    }
    let max_out = max_output(req.get("max_tokens").and_then(Value::as_u64));
    let client_ids = anthropic::prompt_token_ids(&req);
    let passed_by_client = client_ids.is_some();
    let tokens = match client_ids {
        Some(ids) => ids,
        None => {
            let rules = tokenizer.tokenize().tokenizer().messages_rules();
            let chat = messages_to_chat(&req, MessagesEndpoint::Create, &rules, now_unix)
                .map_err(|e| refusal(&e))?;
            encode_chat(prep, identity.pool, chat, body.len()).await.map_err(|e| refusal(&e))?
        }
    };
    check_length(identity.pool, tokens.len(), max_out)?;
    // Ids the client passed itself need no new body.
    let with_tokens = if passed_by_client {
        None
    } else {
        let b = anthropic::body_with_prompt_token_ids(&body, &req, &tokens);
        Some(Bytes::from(b.map_err(|e| bad(e.to_string()))?))
    };
    let stream = req.get("stream").and_then(Value::as_bool).unwrap_or(false);
    // Anthropic's per-user field, as `user` is chat's.
    let session = req.get("metadata").and_then(|m| m.get("user_id")).and_then(Value::as_str);
    finish(
        prep,
        Route::Messages,
        &identity,
        Some(tokens),
        max_out,
        stream,
        session.map(str::to_owned),
        body,
        with_tokens,
    )
    .with_client_priority(&req)
}

/// `/v1/messages/count_tokens`: the prompt tokens vLLM would count for
/// the body (its `count_tokens` renders the converted chat request and
/// counts), computed here as `/tokenize` is, without an engine.
pub(crate) async fn count_tokens(
    prep: &Preparer,
    body: &[u8],
    now_unix: u64,
) -> Result<usize, Reject> {
    let req: Map<String, Value> = match serde_json::from_slice(body) {
        Ok(Value::Object(o)) => o,
        Ok(_) => return Err(bad("the body must be a JSON object")),
        Err(e) => return Err(bad(format!("invalid JSON body: {e}"))),
    };
    let model = check_model(prep, req.get("model").and_then(Value::as_str))?;
    let tokenizer = &model.pool.tokenizer;
    let rules = tokenizer.tokenize().tokenizer().messages_rules();
    let chat = messages_to_chat(&req, MessagesEndpoint::CountTokens, &rules, now_unix)
        .map_err(|e| refusal(&e))?;
    let ids = tokenizer.encode_chat(chat).await.map_err(|e| refusal(&e))?;
    Ok(ids.len())
}

/// A conversion or rendering failure on `/v1/messages` as the client's
/// error: what vLLM refuses keeps its words; what kvgate cannot render
/// (images) says so, rather than being routed without its tokens.
fn refusal(e: &TokenizeError) -> Reject {
    match e {
        TokenizeError::Unsupported(why) => bad(format!("unsupported content: {why}")),
        e => bad(e.to_string()),
    }
}

/// OpenAI Responses (`/v1/responses`). A new conversation is converted to
/// the chat request vLLM renders for it (`kvgate_tokenize::
/// responses_to_chat`), tokenized like chat and forwarded with
/// `kv_transfer_params.prompt_token_ids` (vLLM's Responses renderer takes
/// them as its chat renderer does). A continued one (`previous_response_id`)
/// names its owner in the id (`affinity.rs`): the id is verified, the
/// engine's own id put in its place, and the request goes to that replica
/// with the body as sent otherwise; its history lives only in that engine,
/// so kvgate cannot render it and does not try.
pub(crate) async fn responses(prep: &Preparer, body: Bytes) -> Result<Prepared, Reject> {
    let mut req: Map<String, Value> = match serde_json::from_slice(&body) {
        Ok(Value::Object(o)) => o,
        Ok(_) => return Err(bad("the body must be a JSON object")),
        Err(e) => return Err(bad(format!("invalid JSON body: {e}"))),
    };
    let model = check_model(prep, req.get("model").and_then(Value::as_str))?;
    let rewrite = model.rewrite.map(str::to_owned);
    let identity = CacheIdentity::new(model, cache_salt(&req)?);
    let max_out = max_output(req.get("max_output_tokens").and_then(Value::as_u64));
    let stream = req.get("stream").and_then(Value::as_bool).unwrap_or(false);
    let session = req.get("user").and_then(Value::as_str).map(str::to_owned);
    let continues = match req.get("previous_response_id") {
        None | Some(Value::Null) => None,
        Some(Value::String(id)) => Some(continuation(&prep.affinity, id)?),
        Some(_) => {
            let e = invalid("`previous_response_id` must be a string");
            return Err(Box::new(e.with_param("previous_response_id")));
        }
    };
    if let Some(c) = &continues {
        // The engine's own id, and the served name for an alias; the rest
        // as the client sent it.
        req.insert("previous_response_id".into(), Value::String(c.engine_id.clone()));
        if let Some(served) = &rewrite {
            req.insert("model".into(), Value::String(served.clone()));
        }
        let body = Bytes::from(serde_json::to_vec(&req).map_err(|e| bad(e.to_string()))?);
        prep.metrics.unmatched("previous_response");
        let mut p =
            finish(prep, Route::Responses, &identity, None, max_out, stream, session, body, None);
        p.continues = continues;
        return p.with_client_priority(&req);
    }
    let body = aliased(body, rewrite.as_deref(), |served| {
        req.insert("model".into(), Value::String(served.to_owned()));
        serde_json::to_vec(&req).map_err(|e| e.to_string())
    })?;
    let client_ids = responses::prompt_token_ids(&req);
    let passed_by_client = client_ids.is_some();
    let tokens = match client_ids {
        Some(ids) => ids,
        None => {
            let chat = responses_to_chat(&req).map_err(|e| refusal(&e))?;
            encode_chat(prep, identity.pool, chat, body.len()).await.map_err(|e| refusal(&e))?
        }
    };
    check_length(identity.pool, tokens.len(), max_out)?;
    let with_tokens = if passed_by_client {
        None
    } else {
        let b = responses::body_with_prompt_token_ids(&body, &req, &tokens);
        Some(Bytes::from(b.map_err(|e| bad(e.to_string()))?))
    };
    finish(
        prep,
        Route::Responses,
        &identity,
        Some(tokens),
        max_out,
        stream,
        session,
        body,
        with_tokens,
    )
    .with_client_priority(&req)
}

/// The stored response `id` names, verified: an id kvgate did not issue,
/// or one whose tag does not verify, names nothing this fleet holds.
fn continuation(key: &AffinityKey, id: &str) -> Result<Continuation, Reject> {
    match key.resolve(id) {
        Ok(owned) => Ok(Continuation {
            owner: owned.owner,
            engine_id: owned.engine_id,
            client_id: id.to_owned(),
        }),
        Err(why @ (IdError::Foreign | IdError::Forged)) => {
            let e = invalid(format!(
                "previous_response_id '{id}' names no response this kvgate fleet holds: {why}"
            ));
            Err(Box::new(e.with_param("previous_response_id")))
        }
    }
}

/// Completions: text prompts are tokenized as vLLM does (special tokens per
/// `add_special_tokens`); token prompts are taken as they are.
pub(crate) async fn completions(prep: &Preparer, body: Bytes) -> Result<Prepared, Reject> {
    let mut req = CompletionRequest::from_slice(&body).map_err(|e| bad(e.to_string()))?;
    let model = check_model(prep, req.model())?;
    let body = aliased(body, model.rewrite, |served| {
        req.model = Some(served.to_owned());
        req.to_vec().map_err(|e| e.to_string())
    })?;
    let identity = CacheIdentity::new(model, cache_salt(&req.extra)?);
    let tokenizer = &identity.pool.tokenizer;
    check_output_limit(&req.extra)?;
    let max_out = max_output(req.max_output_tokens());
    if req.extra.get("prompt_embeds").is_some_and(|v| !v.is_null()) {
        // vLLM hashes embedding blocks by their digest (`prompt_embeds` in
        // the extra keys), which kvgate cannot compute: route by load and
        // forward the body as it came.
        prep.metrics.unmatched("prompt_embeds");
        return finish(
            prep,
            Route::Completions,
            &identity,
            None,
            max_out,
            req.is_stream(),
            session_key(&req.extra),
            body,
            None,
        )
        .with_client_priority(&req.extra);
    }
    let add_special = req.add_special_tokens();
    // Taken, not copied (a long prompt is hundreds of kilobytes); the token
    // ids take its place below.
    let prompt = req
        .prompt
        .take()
        .ok_or_else(|| Box::new(invalid("`prompt` is required").with_param("prompt")))?;
    let encode = |text: String| async move {
        let t = Instant::now();
        let r = if text.len() <= INLINE_TOKENIZE_BYTES {
            tokenizer.tokenize().encode_prompt(&text, add_special)
        } else {
            tokenizer.encode_prompt(text, add_special).await
        };
        prep.metrics.tokenize_time(t.elapsed().as_secs_f64());
        r.map_err(|e| bad(e.to_string()))
    };
    // Batches route by their first prompt; all are forwarded as tokens.
    let (mut tokens, batch): (Vec<u32>, Option<Vec<Vec<u32>>>) = match prompt {
        Prompt::Text(t) => (encode(t).await?, None),
        Prompt::Tokens(ids) => (ids, None),
        Prompt::Texts(texts) => {
            let mut all = Vec::with_capacity(texts.len());
            for t in texts {
                all.push(encode(t).await?);
            }
            (all.first().cloned().unwrap_or_default(), Some(all))
        }
        Prompt::TokenBatches(b) => (b.first().cloned().unwrap_or_default(), Some(b)),
    };
    if tokens.is_empty() {
        return Err(Box::new(invalid("the prompt is empty").with_param("prompt")));
    }
    for t in batch.iter().flatten().chain(std::iter::once(&tokens)) {
        check_length(identity.pool, t.len(), max_out)?;
    }
    // The ids lent to the request for its serialisation, then taken back.
    req.prompt = Some(match batch {
        Some(b) => Prompt::TokenBatches(b),
        None => Prompt::Tokens(std::mem::take(&mut tokens)),
    });
    let written = req.to_vec().map_err(|e| bad(e.to_string()))?;
    if let Some(Prompt::Tokens(ids)) = req.prompt.take() {
        tokens = ids;
    }
    let with_tokens = Some(Bytes::from(written));
    finish(
        prep,
        Route::Completions,
        &identity,
        Some(tokens),
        max_out,
        req.is_stream(),
        session_key(&req.extra),
        body,
        with_tokens,
    )
    .with_client_priority(&req.extra)
}

#[allow(clippy::too_many_arguments)]
fn finish(
    prep: &Preparer,
    route: Route,
    identity: &CacheIdentity<'_>,
    tokens: Option<Vec<u32>>,
    max_output: Option<u32>,
    stream: bool,
    session_key: Option<String>,
    original: Bytes,
    with_tokens: Option<Bytes>,
) -> Prepared {
    let (prompt_tokens, keys) = match &tokens {
        Some(t) => (
            t.len() as u64,
            request_block_keys(
                t,
                prep.block_size as usize,
                identity.lora.as_deref(),
                identity.salt.as_deref(),
            ),
        ),
        // Unknown length: estimate from the body (about 4 bytes per token).
        None => ((original.len() / 4).max(1) as u64, Vec::new()),
    };
    Prepared {
        route,
        tokens,
        prompt_tokens,
        keys,
        max_output,
        stream,
        session_key,
        pool: identity.pool.id,
        disaggregated: identity.pool.disaggregated,
        adapter: identity.lora.clone(),
        original,
        with_tokens,
        continues: None,
        priority: None,
        priority_key: false,
        engine_priority: OnceLock::new(),
        rewritten: Default::default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The renderer sees the same request whether it is read from the
    /// typed request or parsed from the body: every field kvgate knows, the
    /// ones it does not, nulls, nesting, numbers and escapes.
    #[test]
    fn the_chat_view_equals_a_second_parse_of_the_body() {
        let bodies = [
            r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#,
            r#"{"messages":[{"role":"system","content":"be \"brief\"\n\u00e9"},{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"u"}}],"name":null,"x":1.5}],"stream":true,"max_tokens":7}"#,
            r#"{"messages":[{"role":"assistant","content":null,"tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{}"}}]},{"role":"tool","tool_call_id":"c","content":"42"}],"tools":[{"type":"function","function":{"name":"f","parameters":{}}}],"tool_choice":"auto"}"#,
            r#"{"messages":[{"role":"user","content":"q","reasoning_content":"r"}],"chat_template_kwargs":{"enable_thinking":false},"add_generation_prompt":false,"continue_final_message":true,"add_special_tokens":true,"documents":[{"text":"d"}],"reasoning_effort":"low","seed":-3,"temperature":0.1,"kv_transfer_params":{"a":null}}"#,
            r#"{"messages":[],"chat_template":"{{ messages }}","top_k":null,"logit_bias":{"12":-100}}"#,
        ];
        for body in bodies {
            let req = ChatCompletionRequest::from_slice(body.as_bytes()).expect(body);
            let view = chat_view(&req).expect(body);
            let mut parsed: ChatRequest = serde_json::from_str(body).expect(body);
            parsed.endpoint = Endpoint::ChatCompletions;
            assert_eq!(
                serde_json::to_string(&view).expect("view"),
                serde_json::to_string(&parsed).expect("parsed"),
                "{body}"
            );
            assert_eq!(view.endpoint, parsed.endpoint);
        }
    }

    #[test]
    fn priority_is_spliced_in_replaced_or_removed() {
        let body = |s: &str| Bytes::from(s.to_owned());
        let text = |b: Bytes| String::from_utf8(b.to_vec()).expect("utf-8");
        let spliced = with_priority(&body(r#" {"model":"m","prompt":[1]}"#), Some(-2), false);
        assert_eq!(text(spliced), r#" {"priority":-2,"model":"m","prompt":[1]}"#);
        assert_eq!(text(with_priority(&body("{ }"), Some(3), false)), r#"{"priority":3 }"#);
        let asked = body(r#"{"model":"m","priority":7,"prompt":[1]}"#);
        assert_eq!(
            text(with_priority(&asked, Some(3), true)),
            r#"{"model":"m","priority":3,"prompt":[1]}"#
        );
        assert_eq!(text(with_priority(&asked, None, true)), r#"{"model":"m","prompt":[1]}"#);
        assert_eq!(text(with_priority(&body("[1]"), None, true)), "[1]");
    }
}
