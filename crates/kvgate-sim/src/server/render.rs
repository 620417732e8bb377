//! vLLM 0.33's render routes and `/version`.
//!
//! `POST /v1/chat/completions/render` and `POST /v1/completions/render`
//! (`vllm/entrypoints/scale_out/render/`) answer what the engine would run
//! for a request without running it: a `GenerateRequest`
//! (`scale_out/token_in_token_out/protocol.py`), one for a chat and a list
//! for a completion (one per prompt). The token ids come from the very code
//! path the generation routes use, so a peer router (or a test) that renders
//! first and then generates from the ids gets the same prompt as sending the
//! request itself. Rendering is not generation: it does not count in
//! `kvgate_sim_tokenizations_total`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;
use kvgate_openai::{CompletionRequest, Prompt};
use serde_json::{json, Map, Value};

use crate::server::http::{bad, chat_prompt, check_model, parse_chat, sampling, ApiError, Shared};
use crate::server::AppState;

/// The version `/version` reports: the vLLM release whose API is served.
pub(crate) const VLLM_VERSION: &str = "0.33.0";

/// `GET /version`, as vLLM's `{"version": VLLM_VERSION}`.
pub(super) async fn version() -> Json<Value> {
    Json(json!({"version": VLLM_VERSION}))
}

/// vLLM's `RequestOutputKind`: `DELTA` when streaming, else `FINAL_ONLY`.
fn output_kind(stream: bool) -> u8 {
    if stream {
        1
    } else {
        2
    }
}

/// `SamplingParams` as vLLM serializes it (msgspec, defaults omitted):
/// `max_tokens` as the engine would apply it, the output kind, the lists
/// vLLM always fills in, and the knobs the request set to a non-default
/// value. A real vLLM also merges the model's generation-config defaults;
/// the sim has none.
fn sampling_params(extra: &Map<String, Value>, max_tokens: u64, stream: bool) -> Value {
    // (field, vLLM's default).
    let knobs = [
        ("n", json!(1)),
        ("presence_penalty", json!(0.0)),
        ("frequency_penalty", json!(0.0)),
        ("repetition_penalty", json!(1.0)),
        ("temperature", json!(1.0)),
        ("top_p", json!(1.0)),
        ("top_k", json!(0)),
        ("min_p", json!(0.0)),
        ("seed", Value::Null),
        ("ignore_eos", json!(false)),
        ("min_tokens", json!(0)),
    ];
    let mut out = Map::new();
    for (name, default) in knobs {
        let Some(v) = extra.get(name).filter(|v| !v.is_null()) else { continue };
        let is_default = match (v.as_f64(), default.as_f64()) {
            (Some(a), Some(b)) => a == b,
            _ => *v == default,
        };
        if !is_default {
            out.insert(name.to_owned(), v.clone());
        }
    }
    let stop = match extra.get("stop") {
        Some(Value::String(s)) => json!([s]),
        Some(Value::Array(a)) => Value::Array(a.clone()),
        _ => json!([]),
    };
    out.insert("stop".into(), stop);
    let stop_ids = extra.get("stop_token_ids").filter(|v| v.is_array()).cloned();
    out.insert("stop_token_ids".into(), stop_ids.unwrap_or_else(|| json!([])));
    out.insert("max_tokens".into(), json!(max_tokens));
    out.insert("output_kind".into(), json!(output_kind(stream)));
    out.insert("skip_clone".into(), json!(true));
    out.insert("bad_words".into(), json!([]));
    Value::Object(out)
}

/// vLLM's `get_max_tokens`: the request's (or the sim's default) capped by
/// the room left in the context; a prompt longer than the context is a 400.
fn max_tokens(state: &AppState, requested: u32, prompt_len: usize) -> Result<u64, ApiError> {
    let max_model_len = state.config.engine.max_model_len();
    let input = prompt_len as u64;
    if input > max_model_len {
        return Err(ApiError::bad(format!(
            "Input length ({input}) exceeds model's maximum context length ({max_model_len})."
        )));
    }
    Ok(u64::from(requested).min(max_model_len - input))
}

/// `_base_request_id`: the `X-Request-Id` header, else the body's
/// `request_id`, else a fresh id (vLLM's is a random uuid; this one is
/// unique per process, and leaves the engine's request numbering, which
/// `--fail-rate` draws on, alone).
fn base_request_id(headers: &HeaderMap, extra: &Map<String, Value>) -> String {
    if let Some(id) = headers.get("x-request-id").and_then(|v| v.to_str().ok()) {
        return id.to_owned();
    }
    if let Some(id) = extra.get("request_id").and_then(Value::as_str) {
        return id.to_owned();
    }
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    format!("{nanos:016x}{n:016x}")
}

/// The `GenerateRequest` fields shared by both routes, in vLLM's field order.
struct Generate<'a> {
    request_id: String,
    token_ids: Vec<u32>,
    sampling_params: Value,
    model: Option<&'a str>,
    stream: bool,
    extra: &'a Map<String, Value>,
    stream_options: Option<Value>,
    kv_transfer_params: Option<&'a Map<String, Value>>,
    parse_context: Value,
}

impl Generate<'_> {
    fn into_json(self) -> Value {
        let field = |name: &str| self.extra.get(name).cloned().unwrap_or(Value::Null);
        json!({
            "request_id": self.request_id,
            "token_ids": self.token_ids,
            "token_offsets": null,
            "features": null,
            "content_parts": null,
            "sampling_params": self.sampling_params,
            "model": self.model,
            "reasoning_ended": null,
            "reasoning_parser_kwargs": null,
            "return_token_ids": field("return_token_ids"),
            "output_mode": "tokens",
            "parse_context": self.parse_context,
            "stream": self.stream,
            "stream_options": if self.stream { self.stream_options } else { None },
            "cache_salt": field("cache_salt"),
            "priority": self.extra.get("priority").and_then(Value::as_i64).unwrap_or(0),
            "kv_transfer_params": self.kv_transfer_params,
            "ec_transfer_params": field("ec_transfer_params"),
        })
    }
}

/// `POST /v1/chat/completions/render`: one `GenerateRequest`.
pub(super) async fn chat(State(state): State<Shared>, headers: HeaderMap, body: Bytes) -> Response {
    let (value, request) = match parse_chat(&state, &body) {
        Ok(r) => r,
        Err(e) => return e.into_response(),
    };
    let token_ids = match chat_prompt(&state, value.clone(), &request).await {
        Ok((ids, _)) if !ids.is_empty() => ids,
        Ok(_) => return bad("No token_ids rendered"),
        Err(e) => return e.into_response(),
    };
    let extra = &request.extra;
    let s = sampling(&state, extra, request.max_output_tokens());
    let max = match max_tokens(&state, s.max_tokens, token_ids.len()) {
        Ok(m) => m,
        Err(e) => return e.into_response(),
    };
    let stream = request.is_stream();
    let tools = value.get("tools").filter(|v| !v.is_null()).cloned();
    let tool_choice = extra
        .get("tool_choice")
        .filter(|v| !v.is_null())
        .cloned()
        .unwrap_or_else(|| if tools.is_some() { json!("auto") } else { json!("none") });
    let history_tool_calls: usize = request_messages(&value)
        .iter()
        .filter(|m| m.get("role").and_then(Value::as_str) == Some("assistant"))
        .filter_map(|m| m.get("tool_calls").and_then(Value::as_array))
        .map(Vec::len)
        .sum();
    let flag = |name: &str| extra.get(name).and_then(Value::as_bool).unwrap_or(true);
    let kwargs = value.get("chat_template_kwargs").filter(|v| v.is_object()).cloned();
    // vLLM's `ParseContext`, for a generate server that parses the output.
    let parse_context = json!({
        "tools": tools,
        "tool_choice": tool_choice,
        "parallel_tool_calls": flag("parallel_tool_calls"),
        "include_reasoning": flag("include_reasoning"),
        "chat_template_kwargs": kwargs.unwrap_or_else(|| json!({})),
        "history_tool_call_cnt": history_tool_calls,
    });
    let generate = Generate {
        request_id: format!("chatcmpl-{}", base_request_id(&headers, extra)),
        sampling_params: sampling_params(extra, max, stream),
        token_ids,
        model: request.model(),
        stream,
        extra,
        stream_options: value.get("stream_options").cloned(),
        kv_transfer_params: request.kv_transfer_params.as_ref(),
        parse_context,
    };
    Json(generate.into_json()).into_response()
}

fn request_messages(value: &Value) -> &[Value] {
    value.get("messages").and_then(Value::as_array).map_or(&[], Vec::as_slice)
}

/// `POST /v1/completions/render`: a list of `GenerateRequest`s, one per
/// prompt (ids `cmpl-<id>`, or `cmpl-<id>-<i>` for a batch).
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
    let encoded = match &request.prompt {
        Some(Prompt::Tokens(ids)) => Ok(vec![ids.clone()]),
        Some(Prompt::TokenBatches(b)) => Ok(b.clone()),
        Some(Prompt::Text(t)) => encode_all(&state, &request, vec![t.clone()]).await,
        Some(Prompt::Texts(ts)) => encode_all(&state, &request, ts.clone()).await,
        None => return bad("`prompt` is required"),
    };
    let prompts = match encoded {
        Ok(p) => p,
        Err(e) => return e.into_response(),
    };
    if prompts.is_empty() {
        return bad("`prompt` must not be an empty list");
    }
    let extra = &request.extra;
    let s = sampling(&state, extra, request.max_output_tokens());
    let base = format!("cmpl-{}", base_request_id(&headers, extra));
    let n = prompts.len();
    let stream_options = body_field(&body, "stream_options");
    let mut out = Vec::with_capacity(n);
    for (i, token_ids) in prompts.into_iter().enumerate() {
        if token_ids.is_empty() {
            return bad("No token_ids rendered");
        }
        let max = match max_tokens(&state, s.max_tokens, token_ids.len()) {
            Ok(m) => m,
            Err(e) => return e.into_response(),
        };
        let generate = Generate {
            request_id: if n == 1 { base.clone() } else { format!("{base}-{i}") },
            sampling_params: sampling_params(extra, max, request.is_stream()),
            token_ids,
            model: request.model(),
            stream: request.is_stream(),
            extra,
            stream_options: stream_options.clone(),
            kv_transfer_params: request.kv_transfer_params.as_ref(),
            parse_context: Value::Null,
        };
        out.push(generate.into_json());
    }
    Json(Value::Array(out)).into_response()
}

/// Tokenizes completion prompts as `/v1/completions` does.
async fn encode_all(
    state: &AppState,
    request: &CompletionRequest,
    texts: Vec<String>,
) -> Result<Vec<Vec<u32>>, ApiError> {
    let mut out = Vec::with_capacity(texts.len());
    for text in texts {
        let ids = state
            .tokenizer
            .encode_prompt(text, request.add_special_tokens())
            .await
            .map_err(|e| ApiError::bad(e.to_string()))?;
        out.push(ids);
    }
    Ok(out)
}

/// A top-level field of a JSON body (already known to parse).
fn body_field(body: &Bytes, name: &str) -> Option<Value> {
    let value: Value = serde_json::from_slice(body).ok()?;
    value.get(name).cloned()
}
