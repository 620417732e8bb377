//! vLLM's HTTP API over the driver.

use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use kvgate_events::publisher::drop_decision;
use kvgate_events::BlockHash;
use kvgate_openai::{anthropic, ChatCompletionRequest, CompletionRequest, Prompt};
use kvgate_tokenize::{ChatRequest, Endpoint};
use serde_json::{json, Map, Value};
use tokio::sync::{mpsc, oneshot};

use crate::engine::{FinishReason, RequestId, TokenOutput};
use crate::hash::CacheIdentity;
use crate::server::driver::{Command, Hop, NewRequest};
use crate::server::kv_transfer::{self, KvRole};
use crate::server::metrics::render_lora_info;
use crate::server::AppState;

pub(super) type Shared = Arc<AppState>;

pub(super) fn error(status: StatusCode, message: impl Into<String>) -> Response {
    let kind = if status == StatusCode::NOT_FOUND { "NotFoundError" } else { "BadRequestError" };
    error_typed(status, kind, message)
}

/// vLLM's error body with an explicit `type` (`create_error_response`).
pub(super) fn error_typed(status: StatusCode, kind: &str, message: impl Into<String>) -> Response {
    (
        status,
        Json(json!({"error": {"message": message.into(), "type": kind, "param": null, "code": status.as_u16()}})),
    )
        .into_response()
}

pub(super) fn bad(message: impl Into<String>) -> Response {
    error(StatusCode::BAD_REQUEST, message)
}

/// An error response not built yet (a `Response` is too large to return in
/// a `Result` cheaply).
pub(super) struct ApiError(StatusCode, String);

impl ApiError {
    /// A 400.
    pub(super) fn bad(message: impl Into<String>) -> ApiError {
        ApiError(StatusCode::BAD_REQUEST, message.into())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        error(self.0, self.1)
    }
}

pub(super) fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

pub(super) async fn health() -> StatusCode {
    StatusCode::OK
}

/// As vLLM lists them (`OpenAIServingModels.show_available_models`): one card
/// per served name (`root` the model, `max_model_len`), then each adapter in
/// load order (`root` its path, `parent` its base model or the first served
/// name, no `max_model_len`), each with one default permission.
pub(super) async fn models(State(state): State<Shared>) -> Json<Value> {
    let created = unix_now();
    let mut n = 0u64;
    let mut card = |id: &str, root: &str, parent: Option<&str>, max_len: Option<u64>| {
        n += 1;
        json!({
            "id": id,
            "object": "model",
            "created": created,
            "owned_by": "vllm",
            "root": root,
            "parent": parent,
            "max_model_len": max_len,
            "permission": [{
                "id": format!("modelperm-sim{created:x}{n:04x}"),
                "object": "model_permission",
                "created": created,
                "allow_create_engine": false,
                "allow_sampling": true,
                "allow_logprobs": true,
                "allow_search_indices": false,
                "allow_view": true,
                "allow_fine_tuning": false,
                "organization": "*",
                "group": null,
                "is_blocking": false,
            }],
        })
    };
    let max_len = Some(state.config.engine.max_model_len());
    let first = state.served_names.first().map_or(state.config.model.as_str(), String::as_str);
    let mut data: Vec<Value> = Vec::new();
    for name in &state.served_names {
        data.push(card(name, &state.config.model, None, max_len));
    }
    for a in state.adapters() {
        let base =
            a.base_model_name.as_deref().filter(|b| state.served_names.iter().any(|n| n == b));
        data.push(card(&a.name, &a.path, Some(base.unwrap_or(first)), None));
    }
    Json(json!({ "object": "list", "data": data }))
}

/// The model's name in responses and metrics: the first served name.
fn primary_name(state: &AppState) -> &str {
    state.served_names.first().map_or(state.config.model.as_str(), String::as_str)
}

pub(super) async fn metrics(State(state): State<Shared>) -> Response {
    // Each data-parallel engine's series, labelled engine="r", grouped by
    // family as vLLM serves them (one HELP and TYPE per family).
    let pages: Vec<String> = state
        .rank_metrics
        .iter()
        .enumerate()
        .map(|(rank, m)| m.render(primary_name(&state), &state.config.engine, rank))
        .collect();
    let mut text = merge_families(&pages);
    if state.config.lora_enabled() {
        // One family for all ranks: vLLM's gauge has no `engine` label.
        let series: Vec<Vec<(String, f64)>> =
            state.rank_metrics.iter().map(|m| m.lora_series()).collect();
        text.push_str(&render_lora_info(
            series.iter().map(Vec::as_slice),
            state.config.engine.max_loras,
        ));
    }
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
        )],
        text,
    )
        .into_response()
}

/// Merges Prometheus text pages of the same families: each family's comment
/// lines once (from the first page that has it), then its samples from every
/// page, in page order. A page is split into families at `# HELP` lines.
fn merge_families(pages: &[String]) -> String {
    if let [one] = pages {
        return one.clone();
    }
    // family name -> (comment lines, sample lines), in first-seen order.
    let mut order: Vec<String> = Vec::new();
    let mut families: std::collections::HashMap<String, (Vec<&str>, Vec<&str>)> =
        std::collections::HashMap::new();
    for page in pages {
        let mut current = String::new();
        let mut first_comments = false;
        for line in page.lines() {
            if let Some(rest) = line.strip_prefix("# HELP ") {
                current = rest.split(' ').next().unwrap_or_default().to_owned();
                first_comments = !families.contains_key(&current);
                if first_comments {
                    order.push(current.clone());
                }
            }
            let entry = families.entry(current.clone()).or_default();
            if line.starts_with('#') {
                if first_comments {
                    entry.0.push(line);
                }
            } else if !line.is_empty() {
                entry.1.push(line);
            }
        }
    }
    let mut out = String::new();
    for name in &order {
        if let Some((comments, samples)) = families.get(name) {
            for line in comments.iter().chain(samples) {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    out
}

/// Debug (not a vLLM endpoint): the block hashes the engine really holds,
/// per tier, as its KV events name them (ints, or 32 bytes in hex), so that
/// tests can compare a router's event-fed view with the truth.
pub(super) async fn kv_blocks(State(state): State<Shared>) -> Response {
    // Every rank's blocks (a test of one rank's view filters by its events).
    let (mut gpu, mut cpu) = (Vec::new(), Vec::new());
    for rank in &state.ranks {
        let (tx, rx) = oneshot::channel();
        if rank.send(Command::CachedBlocks(tx)).is_err() {
            return error(StatusCode::SERVICE_UNAVAILABLE, "engine stopped");
        }
        let Ok((g, c)) = rx.await else {
            return error(StatusCode::SERVICE_UNAVAILABLE, "engine stopped");
        };
        gpu.extend(g);
        cpu.extend(c);
    }
    let wire = |hashes: Vec<BlockHash>| -> Vec<Value> {
        hashes
            .into_iter()
            .map(|h| match h {
                BlockHash::Int(v) => json!(v),
                BlockHash::Bytes(b) => {
                    json!(b.iter().map(|x| format!("{x:02x}")).collect::<String>())
                }
            })
            .collect()
    };
    Json(json!({
        "block_size": state.config.engine.block_size,
        "gpu": wire(gpu),
        "cpu": wire(cpu),
    }))
    .into_response()
}

pub(super) async fn reset_prefix_cache(State(state): State<Shared>) -> Response {
    let mut all = true;
    for rank in &state.ranks {
        let (tx, rx) = oneshot::channel();
        if rank.send(Command::ResetPrefixCache(tx)).is_err() {
            return error(StatusCode::SERVICE_UNAVAILABLE, "engine stopped");
        }
        all &= rx.await.unwrap_or(false);
    }
    match Some(all) {
        Some(true) => StatusCode::OK.into_response(),
        _ => error(
            StatusCode::SERVICE_UNAVAILABLE,
            "failed to reset the prefix cache: requests are running",
        ),
    }
}

pub(super) fn parse_json(body: &Bytes) -> Result<Value, ApiError> {
    serde_json::from_slice(body)
        .map_err(|e| ApiError(StatusCode::BAD_REQUEST, format!("invalid JSON body: {e}")))
}

pub(super) fn check_model(state: &AppState, model: Option<&str>) -> Result<(), ApiError> {
    match model {
        Some(m) if !state.serves(m) => {
            Err(ApiError(StatusCode::NOT_FOUND, format!("The model `{m}` does not exist.")))
        }
        _ => Ok(()),
    }
}

/// Sampling knobs the engine model honours, and what names its blocks.
#[derive(Clone)]
pub(super) struct Sampling {
    pub(super) max_tokens: u32,
    pub(super) min_tokens: u32,
    pub(super) ignore_eos: bool,
    pub(super) identity: CacheIdentity,
    /// `X-data-parallel-rank`, if the request named one.
    pub(super) dp_rank: Option<u32>,
    /// `model` in the response: the adapter's name, else the first served
    /// name whatever alias the request used (vLLM's `model_name(lora)`).
    pub(super) model_name: String,
    /// Its part in a disaggregated request (`kv_transfer_params`).
    pub(super) kv: KvRole,
}

impl Sampling {
    /// The adapter (when `model` names one) and `cache_salt` of the request.
    pub(super) fn keyed(
        mut self,
        state: &AppState,
        headers: &HeaderMap,
        model: Option<&str>,
        cache_salt: Option<&Value>,
    ) -> Sampling {
        self.dp_rank = requested_rank(headers);
        self.identity = CacheIdentity {
            lora_name: model.filter(|m| state.has_adapter(m)).map(str::to_owned),
            cache_salt: cache_salt.and_then(Value::as_str).map(str::to_owned),
        };
        if let Some(adapter) = &self.identity.lora_name {
            self.model_name = adapter.clone();
        }
        self
    }

    /// The role the body's `kv_transfer_params` give it, on a replica with
    /// a KV connector (ignored without one, as vLLM does).
    pub(super) fn with_kv(
        mut self,
        state: &AppState,
        params: Option<Value>,
    ) -> Result<Sampling, ApiError> {
        if state.config.kv_transfer.is_some() {
            self.kv = kv_transfer::role(params.as_ref()).map_err(ApiError::bad)?;
        }
        Ok(self)
    }
}

/// A JSON body's whole sampling: [`sampling`], keyed by its model, salt and
/// rank header, with its KV-transfer role (`/v1/messages`, `/v1/responses`).
pub(super) fn body_sampling(
    state: &AppState,
    headers: &HeaderMap,
    request: &Map<String, Value>,
    max: Option<u64>,
) -> Result<Sampling, ApiError> {
    let model = request.get("model").and_then(Value::as_str);
    sampling(state, request, max)
        .keyed(state, headers, model, request.get("cache_salt"))
        .with_kv(state, request.get("kv_transfer_params").cloned())
}

pub(super) fn sampling(state: &AppState, extra: &Map<String, Value>, max: Option<u64>) -> Sampling {
    let max_tokens =
        max.map_or(state.config.default_max_tokens, |m| m.min(u64::from(u32::MAX)) as u32);
    Sampling {
        max_tokens,
        min_tokens: extra.get("min_tokens").and_then(Value::as_u64).unwrap_or(0) as u32,
        ignore_eos: extra.get("ignore_eos").and_then(Value::as_bool).unwrap_or(false),
        identity: CacheIdentity::default(),
        dp_rank: None,
        model_name: primary_name(state).to_owned(),
        kv: KvRole::Plain,
    }
}

/// A `/v1/chat/completions` body, parsed and checked; the raw JSON too.
pub(super) fn parse_chat(
    state: &AppState,
    body: &Bytes,
) -> Result<(Value, ChatCompletionRequest), ApiError> {
    let value = parse_json(body)?;
    let request: ChatCompletionRequest = serde_json::from_value(value.clone())
        .map_err(|e| ApiError::bad(format!("invalid chat request: {e}")))?;
    request.validate().map_err(|e| ApiError::bad(e.to_string()))?;
    check_model(state, request.model())?;
    Ok((value, request))
}

pub(super) async fn chat(State(state): State<Shared>, headers: HeaderMap, body: Bytes) -> Response {
    let (value, request) = match parse_chat(&state, &body) {
        Ok(r) => r,
        Err(e) => return e.into_response(),
    };
    let prompt = match chat_prompt(&state, value, &request).await {
        Ok((ids, tokenized)) => {
            if tokenized {
                state.metrics.count_tokenization();
            }
            ids
        }
        Err(e) => return e.into_response(),
    };
    let s = sampling(&state, &request.extra, request.max_output_tokens()).keyed(
        &state,
        &headers,
        request.model(),
        request.extra.get("cache_salt"),
    );
    let s = match s.with_kv(&state, request.kv_transfer_params.clone().map(Value::Object)) {
        Ok(s) => s,
        Err(e) => return e.into_response(),
    };
    let kind = Kind::Chat;
    generate(state, kind, prompt, s, request.is_stream(), request.include_usage()).await
}

/// A chat request's prompt: `kv_transfer_params.prompt_token_ids` as is, or
/// the messages rendered and tokenized by `/v1/chat/completions`' rules
/// (then `true`: the engine tokenized it).
pub(super) async fn chat_prompt(
    state: &AppState,
    value: Value,
    request: &ChatCompletionRequest,
) -> Result<(Vec<u32>, bool), Response> {
    if let Some(ids) = request.prompt_token_ids() {
        return Ok((ids, false));
    }
    let mut chat: ChatRequest =
        serde_json::from_value(value).map_err(|e| bad(format!("invalid chat request: {e}")))?;
    chat.endpoint = Endpoint::ChatCompletions;
    let ids = state.tokenizer.encode_chat(chat).await.map_err(|e| bad(e.to_string()))?;
    Ok((ids, true))
}

pub(super) async fn completions(
    State(state): State<Shared>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let request = match CompletionRequest::from_slice(&body) {
        Ok(r) => r,
        Err(e) => return bad(format!("invalid completion request: {e}")),
    };
    if let Err(r) = check_model(&state, request.model()) {
        return r.into_response();
    }
    let prompt = match &request.prompt {
        Some(Prompt::Tokens(ids)) => ids.clone(),
        Some(Prompt::Text(text)) => {
            state.metrics.count_tokenization();
            match state.tokenizer.encode_prompt(text.clone(), request.add_special_tokens()).await {
                Ok(ids) => ids,
                Err(e) => return bad(e.to_string()),
            }
        }
        Some(Prompt::Texts(texts)) => {
            let mut all = Vec::with_capacity(texts.len());
            for t in texts {
                state.metrics.count_tokenization();
                match state.tokenizer.encode_prompt(t.clone(), request.add_special_tokens()).await {
                    Ok(ids) => all.push(ids),
                    Err(e) => return bad(e.to_string()),
                }
            }
            return completions_batch(state, &headers, &request, all).await;
        }
        Some(Prompt::TokenBatches(b)) => {
            return completions_batch(state, &headers, &request, b.clone()).await
        }
        None => return bad("`prompt` is required"),
    };
    let s = sampling(&state, &request.extra, request.max_output_tokens()).keyed(
        &state,
        &headers,
        request.model(),
        request.extra.get("cache_salt"),
    );
    let s = match s.with_kv(&state, request.kv_transfer_params.clone().map(Value::Object)) {
        Ok(s) => s,
        Err(e) => return e.into_response(),
    };
    generate(state, Kind::Completion, prompt, s, request.is_stream(), request.include_usage()).await
}

/// A batch of prompts, as vLLM serves `prompt: [..]`: one engine request per
/// prompt, run together, merged into one response with `choices[i].index = i`
/// and summed usage. Streaming batches are not simulated.
async fn completions_batch(
    state: Shared,
    headers: &HeaderMap,
    request: &CompletionRequest,
    prompts: Vec<Vec<u32>>,
) -> Response {
    if request.is_stream() {
        return bad("the simulator does not stream batches of prompts");
    }
    if prompts.is_empty() {
        return bad("`prompt` must not be an empty list");
    }
    if state.config.kv_transfer.is_some() && request.kv_transfer_params.is_some() {
        // vLLM would answer only the first prompt's parameters.
        return bad("kv_transfer_params: disaggregated requests carry one prompt");
    }
    let s = sampling(&state, &request.extra, request.max_output_tokens()).keyed(
        &state,
        headers,
        request.model(),
        request.extra.get("cache_salt"),
    );
    let runs = prompts
        .into_iter()
        .map(|p| generate(Arc::clone(&state), Kind::Completion, p, s.clone(), false, false));
    let responses = futures_util::future::join_all(runs).await;
    let mut merged: Option<Value> = None;
    let mut choices = Vec::new();
    let mut totals = [0u64; 3];
    for (i, resp) in responses.into_iter().enumerate() {
        if !resp.status().is_success() {
            return resp;
        }
        let Ok(bytes) = axum::body::to_bytes(resp.into_body(), 16 << 20).await else {
            return error(StatusCode::INTERNAL_SERVER_ERROR, "batch member failed");
        };
        let Ok(mut v) = serde_json::from_slice::<Value>(&bytes) else {
            return error(StatusCode::INTERNAL_SERVER_ERROR, "batch member failed");
        };
        for (k, key) in ["prompt_tokens", "completion_tokens", "total_tokens"].iter().enumerate() {
            totals[k] += v["usage"][key].as_u64().unwrap_or(0);
        }
        if let Some(Value::Array(cs)) = v.get_mut("choices").map(Value::take) {
            for mut c in cs {
                c["index"] = json!(i);
                choices.push(c);
            }
        }
        merged.get_or_insert(v);
    }
    let Some(mut out) = merged else { return bad("empty batch") };
    out["choices"] = Value::Array(choices);
    out["usage"]["prompt_tokens"] = json!(totals[0]);
    out["usage"]["completion_tokens"] = json!(totals[1]);
    out["usage"]["total_tokens"] = json!(totals[2]);
    Json(out).into_response()
}

/// `POST /inference/v1/generate`: `{"token_ids": [...], "sampling_params":
/// {...}, "stream": bool}`; answers token ids, never text. No tokenization.
pub(super) async fn generate_tokens(
    State(state): State<Shared>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let value = match parse_json(&body) {
        Ok(v) => v,
        Err(r) => return r.into_response(),
    };
    if let Err(r) = check_model(&state, value.get("model").and_then(Value::as_str)) {
        return r.into_response();
    }
    let ids: Option<Vec<u32>> = value
        .get("token_ids")
        .and_then(Value::as_array)
        .and_then(|a| a.iter().map(|v| v.as_u64().and_then(|v| u32::try_from(v).ok())).collect());
    let Some(prompt) = ids else { return bad("`token_ids` must be an array of token ids") };
    let empty = Map::new();
    let params = value.get("sampling_params").and_then(Value::as_object).unwrap_or(&empty);
    let s = sampling(&state, params, params.get("max_tokens").and_then(Value::as_u64)).keyed(
        &state,
        &headers,
        value.get("model").and_then(Value::as_str),
        value.get("cache_salt"),
    );
    // The tokens-in route reads the parameters from `extra_args` only.
    let extra = params.get("extra_args").and_then(Value::as_object).unwrap_or(&empty);
    let s = match s.with_kv(&state, extra.get("kv_transfer_params").cloned()) {
        Ok(s) => s,
        Err(e) => return e.into_response(),
    };
    let stream = value.get("stream").and_then(Value::as_bool).unwrap_or(false);
    let include_usage = stream
        && value.pointer("/stream_options/include_usage").and_then(Value::as_bool).unwrap_or(false);
    generate(state, Kind::Generate, prompt, s, stream, include_usage).await
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Chat,
    Completion,
    /// vLLM's token-in/token-out `/inference/v1/generate`.
    Generate,
    /// Anthropic's `/v1/messages` (`messages.rs` writes its shapes).
    Messages,
}

/// Deterministic output text: one word per token id.
const WORDS: [&str; 16] = [
    " the", " quick", " brown", " fox", " jumps", " over", " a", " lazy", " dog", " and", " runs",
    " far", " away", " into", " green", " hills",
];

fn word(token: u32) -> &'static str {
    WORDS[token as usize % WORDS.len()]
}

fn finish_str(reason: Option<FinishReason>) -> Value {
    match reason {
        Some(FinishReason::Length) => json!("length"),
        Some(FinishReason::Stop) => json!("stop"),
        None => Value::Null,
    }
}

/// vLLM's `_to_anthropic_stop_reason` for what the sim finishes with; a
/// stream without a finish reads as `stop`, as vLLM's converter reads it.
fn anthropic_stop(reason: Option<FinishReason>) -> &'static str {
    match reason {
        Some(FinishReason::Length) => "max_tokens",
        Some(FinishReason::Stop) | None => "end_turn",
    }
}

fn anthropic_usage(prompt: usize, output: u64, cached: u32) -> Value {
    anthropic::usage(prompt as u64, output, u64::from(cached))
}

fn usage(prompt: usize, completion: u64, cached: u32) -> Value {
    json!({
        "prompt_tokens": prompt,
        "total_tokens": prompt as u64 + completion,
        "completion_tokens": completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    })
}

/// Aborts the request in the engine unless it finished: dropped when the
/// client goes away mid-request.
struct AbortGuard {
    state: Shared,
    rank: usize,
    id: RequestId,
    done: bool,
}

impl Drop for AbortGuard {
    fn drop(&mut self) {
        if !self.done {
            let _ = self.state.ranks[self.rank].send(Command::Abort(self.id));
        }
    }
}

/// The data-parallel rank a request asked for with `X-data-parallel-rank`
/// (vLLM reads it as an int and ignores anything else).
pub(super) fn requested_rank(headers: &HeaderMap) -> Option<u32> {
    headers.get("x-data-parallel-rank")?.to_str().ok()?.trim().parse().ok()
}

pub(super) async fn generate(
    state: Shared,
    kind: Kind,
    prompt: Vec<u32>,
    s: Sampling,
    stream: bool,
    include_usage: bool,
) -> Response {
    let id = state.next_id.fetch_add(1, Ordering::Relaxed);
    let faults = &state.config.faults;
    if faults.fail_rate > 0.0 && drop_decision(faults.fail_seed, faults.fail_rate, id) {
        return (
            StatusCode::INTERNAL_SERVER_ERROR,
            Json(json!({"error": {"message": "injected failure (--fail-rate)", "type": "InternalServerError", "param": null, "code": 500}})),
        )
            .into_response();
    }
    let size = state.ranks.len();
    let rank = match s.dp_rank {
        None => (id % size as u64) as usize,
        Some(r) if (r as usize) < size => r as usize,
        Some(r) => {
            return bad(format!("data parallel rank {r} is out of range (size {size})"));
        }
    };
    let stall_after = faults.stall_after_tokens.map_or(u64::MAX, u64::from);
    let prompt_len = prompt.len();
    let hop = match (&s.kv, &state.config.kv_transfer) {
        (KvRole::Prefill, Some(_)) => Hop::Prefill,
        (KvRole::Decode(params), Some(kv)) => {
            // Receive what this replica lacks of the prompt, then decode.
            state.kv_received.push(params);
            let (hit_tx, hit_rx) = oneshot::channel();
            let probe = Command::PrefixHit(prompt.clone(), s.identity.clone(), hit_tx);
            if state.ranks[rank].send(probe).is_err() {
                return error(StatusCode::SERVICE_UNAVAILABLE, "engine stopped");
            }
            let Ok(have) = hit_rx.await else {
                return error(StatusCode::SERVICE_UNAVAILABLE, "engine stopped");
            };
            let missing = prompt_len.saturating_sub(1).saturating_sub(have) as u64;
            let wait = kv.transfer_time(missing).div_f64(state.config.speedup);
            tokio::time::sleep(wait).await;
            if missing > 0 {
                let bytes = missing as f64 * kv.kv_bytes_per_token as f64;
                state.rank_metrics[rank].record_transfer(wait.as_secs_f64(), bytes);
            }
            Hop::Decode
        }
        _ => Hop::Whole,
    };
    let (tok_tx, mut tok_rx) = mpsc::unbounded_channel();
    let (acc_tx, acc_rx) = oneshot::channel();
    let req = NewRequest {
        id,
        prompt,
        max_tokens: s.max_tokens,
        min_tokens: s.min_tokens,
        ignore_eos: s.ignore_eos,
        identity: s.identity.clone(),
        tokens: tok_tx,
        accepted: acc_tx,
        hop,
    };
    if state.ranks[rank].send(Command::Add(req)).is_err() {
        return error(StatusCode::SERVICE_UNAVAILABLE, "engine stopped");
    }
    match acc_rx.await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return bad(e.to_string()),
        Err(_) => return error(StatusCode::SERVICE_UNAVAILABLE, "engine stopped"),
    }
    let mut guard = AbortGuard { state: Arc::clone(&state), rank, id, done: false };
    let (prefix, object, chunk_object) = match kind {
        // vLLM's Messages answers carry the chat completion's id.
        Kind::Chat | Kind::Messages => ("chatcmpl", "chat.completion", "chat.completion.chunk"),
        Kind::Completion => ("cmpl", "text_completion", "text_completion"),
        Kind::Generate => ("gen", "", ""),
    };
    let rid = format!("{prefix}-sim{id:016x}");
    let created = unix_now();
    let model = s.model_name.clone();

    if !stream {
        let mut text = String::new();
        let mut ids = Vec::new();
        let mut n = 0u64;
        let mut cached = 0;
        let mut finish = None;
        while let Some(t) = tok_rx.recv().await {
            if n >= stall_after {
                std::future::pending::<()>().await;
            }
            n += 1;
            cached = t.cached_tokens;
            text.push_str(word(t.token));
            ids.push(t.token);
            if t.finished.is_some() {
                finish = t.finished;
                break;
            }
        }
        guard.done = finish.is_some();
        if guard.done {
            finished_one(&state);
            if hop == Hop::Prefill {
                start_lease(&state, rank, id);
            }
        }
        let kv_params =
            if guard.done { kv_answer(&state, hop, &rid, prompt_len, cached) } else { Value::Null };
        let choice = match kind {
            Kind::Chat => json!({
                "index": 0,
                "message": {"role": "assistant", "content": text, "reasoning": null, "tool_calls": []},
                "logprobs": null,
                "finish_reason": finish_str(finish),
                "stop_reason": null,
            }),
            Kind::Completion => json!({
                "index": 0,
                "text": text,
                "logprobs": null,
                "finish_reason": finish_str(finish),
                "stop_reason": null,
            }),
            Kind::Messages => {
                let stop = finish.map(|f| anthropic_stop(Some(f)));
                let usage = anthropic_usage(prompt_len, n, cached);
                let mut body = anthropic::message(&rid, &model, &text, stop, usage);
                if !kv_params.is_null() {
                    body["kv_transfer_params"] = kv_params;
                }
                return Json(body).into_response();
            }
            Kind::Generate => {
                return Json(json!({
                    "request_id": rid,
                    "choices": [{"index": 0, "token_ids": ids, "logprobs": null, "finish_reason": finish_str(finish)}],
                    "prompt_logprobs": null,
                    "kv_transfer_params": kv_params,
                    "usage": usage(prompt_len, n, cached),
                }))
                .into_response();
            }
        };
        let mut body = json!({
            "id": rid,
            "object": object,
            "created": created,
            "model": model,
            "choices": [choice],
            "usage": usage(prompt_len, n, cached),
        });
        if !kv_params.is_null() {
            body["kv_transfer_params"] = kv_params;
        }
        return Json(body).into_response();
    }

    let (body_tx, body_rx) = mpsc::channel::<Bytes>(64);
    tokio::spawn(async move {
        let frame = |v: Value| Bytes::from(format!("data: {v}\n\n"));
        let chunk = |choices: Value, usage: Option<Value>| {
            let mut v = if kind == Kind::Generate {
                json!({"request_id": rid, "choices": choices})
            } else {
                json!({
                    "id": rid, "object": chunk_object, "created": created, "model": model, "choices": choices,
                })
            };
            if let Some(u) = usage {
                v["usage"] = u;
            }
            frame(v)
        };
        if kind == Kind::Messages {
            // vLLM sends message_start on the engine's first chunk.
            let Some(TokenOutput { token, finished, cached_tokens, .. }) = tok_rx.recv().await
            else {
                return;
            };
            if stall_after == 0 {
                body_tx.closed().await;
                return;
            }
            let mut frames = Vec::new();
            let usage = anthropic_usage(prompt_len, 0, cached_tokens);
            anthropic::write_message_start(&mut frames, &rid, &model, usage);
            anthropic::write_text_delta(&mut frames, true, word(token));
            let mut n = 1u64;
            let mut last = finished;
            let mut cached = cached_tokens;
            if body_tx.send(Bytes::from(frames)).await.is_err() {
                return;
            }
            while last.is_none() {
                let Some(t) = tok_rx.recv().await else { break };
                if n >= stall_after {
                    body_tx.closed().await;
                    return;
                }
                n += 1;
                cached = t.cached_tokens;
                last = t.finished;
                let mut frame = Vec::new();
                anthropic::write_text_delta(&mut frame, false, word(t.token));
                if body_tx.send(Bytes::from(frame)).await.is_err() {
                    return;
                }
            }
            if last.is_some() {
                guard.done = true;
                finished_one(&guard.state);
                if hop == Hop::Prefill {
                    start_lease(&guard.state, guard.rank, guard.id);
                }
            }
            let mut end = Vec::new();
            let usage = anthropic_usage(prompt_len, n, cached);
            anthropic::write_message_end(&mut end, true, anthropic_stop(last), usage);
            let _ = body_tx.send(Bytes::from(end)).await;
            drop(guard);
            return;
        }
        if kind == Kind::Chat {
            let first = chunk(
                json!([{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": null, "finish_reason": null}]),
                None,
            );
            if body_tx.send(first).await.is_err() {
                return;
            }
        }
        let mut n = 0u64;
        let mut cached = 0;
        while let Some(TokenOutput { token, finished, cached_tokens, .. }) = tok_rx.recv().await {
            if n >= stall_after {
                // Hold the connection open without progress until the client leaves.
                body_tx.closed().await;
                return;
            }
            n += 1;
            cached = cached_tokens;
            let choice = match kind {
                // Messages streams were answered above.
                Kind::Chat | Kind::Messages => {
                    json!({"index": 0, "delta": {"content": word(token)}, "logprobs": null, "finish_reason": finish_str(finished)})
                }
                Kind::Completion => {
                    json!({"index": 0, "text": word(token), "logprobs": null, "finish_reason": finish_str(finished), "stop_reason": null})
                }
                Kind::Generate => {
                    json!({"index": 0, "token_ids": [token], "logprobs": null, "finish_reason": finish_str(finished)})
                }
            };
            // A prefill hop's parameters ride on its finish chunk.
            let mut frame_v = chunk(json!([choice]), None);
            if finished.is_some() && hop == Hop::Prefill {
                let kv = kv_answer(&guard.state, hop, &rid, prompt_len, cached);
                frame_v = with_kv_params(&frame_v, kv);
            }
            if body_tx.send(frame_v).await.is_err() {
                return;
            }
            if finished.is_some() {
                guard.done = true;
                finished_one(&guard.state);
                if hop == Hop::Prefill {
                    start_lease(&guard.state, guard.rank, guard.id);
                }
                break;
            }
        }
        if include_usage {
            let _ = body_tx.send(chunk(json!([]), Some(usage(prompt_len, n, cached)))).await;
        }
        let _ = body_tx.send(Bytes::from_static(b"data: [DONE]\n\n")).await;
        drop(guard);
    });
    let stream = futures_util::stream::unfold(body_rx, |mut rx| async move {
        rx.recv().await.map(|b| (Ok::<_, Infallible>(b), rx))
    });
    (
        [
            (header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream; charset=utf-8")),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
        ],
        Body::from_stream(stream),
    )
        .into_response()
}

/// A finished prefill hop's `kv_transfer_params` for the decode side
/// (null for any other request).
fn kv_answer(state: &AppState, hop: Hop, rid: &str, prompt_len: usize, cached: u32) -> Value {
    match (&state.config.kv_transfer, hop) {
        (Some(kv), Hop::Prefill) => {
            let bs = state.config.engine.block_size;
            let v = kv_transfer::prefill_answer(kv, rid, state.http_addr, prompt_len, bs, cached);
            if let Value::Object(o) = &v {
                state.kv_answered.push(o);
            }
            v
        }
        _ => Value::Null,
    }
}

/// An SSE frame `data: {...}` with `kv_transfer_params` added to its object.
fn with_kv_params(frame: &Bytes, kv: Value) -> Bytes {
    let text = String::from_utf8_lossy(frame);
    let json = text.trim().strip_prefix("data: ").unwrap_or("");
    match serde_json::from_str::<Value>(json) {
        Ok(mut v) => {
            v["kv_transfer_params"] = kv;
            Bytes::from(format!("data: {v}\n\n"))
        }
        Err(_) => frame.clone(),
    }
}

/// Frees a finished prefill hop's held blocks when its lease ends (model
/// time), as vLLM's prefill side does when the decode side never reads.
fn start_lease(state: &Shared, rank: usize, id: RequestId) {
    let Some(kv) = &state.config.kv_transfer else { return };
    let wait = kv.lease.div_f64(state.config.speedup);
    let tx = state.ranks[rank].clone();
    tokio::spawn(async move {
        tokio::time::sleep(wait).await;
        let _ = tx.send(Command::ReleaseHeld(id));
    });
}

/// `GET /debug/kv_transfers`: the last prefill hops' `kv_transfer_params`
/// as answered, and the last decode hops' as received (the simulator's own
/// route).
pub(super) async fn kv_transfers(State(state): State<Shared>) -> Json<Value> {
    Json(json!({"answered": state.kv_answered.all(), "received": state.kv_received.all()}))
}

/// Counts a finished request; signals exit at `exit_after_requests`.
fn finished_one(state: &AppState) {
    let n = state.finished.fetch_add(1, Ordering::Relaxed) + 1;
    if state.config.faults.exit_after_requests.is_some_and(|limit| n >= limit) {
        let _ = state.exit.send(true);
    }
}

pub(super) async fn tokenize(State(state): State<Shared>, body: Bytes) -> Response {
    let value = match parse_json(&body) {
        Ok(v) => v,
        Err(r) => return r.into_response(),
    };
    let tokens = state.tokenizer.encode_tokenize_body(value).await;
    match tokens {
        Ok(tokens) => Json(json!({
            "count": tokens.len(),
            "max_model_len": state.config.engine.max_model_len(),
            "tokens": tokens,
            "token_strs": null,
        }))
        .into_response(),
        Err(e) => bad(e.to_string()),
    }
}

pub(super) async fn detokenize(State(state): State<Shared>, body: Bytes) -> Response {
    let value = match parse_json(&body) {
        Ok(v) => v,
        Err(r) => return r.into_response(),
    };
    match state.tokenizer.decode_detokenize_body(&value) {
        Ok(prompt) => Json(json!({"prompt": prompt})).into_response(),
        Err(e) => bad(e.to_string()),
    }
}
