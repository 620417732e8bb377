//! Anthropic's Messages API as vLLM 0.33 serves it
//! (`entrypoints/anthropic/`): `POST /v1/messages` (whole or streamed) and
//! `POST /v1/messages/count_tokens`. A request is converted to the chat
//! request vLLM renders for it (`kvgate_tokenize::messages_to_chat`), or
//! takes `kv_transfer_params.prompt_token_ids` as is, and runs on the
//! engine like a chat (`http::generate` writes the answer in vLLM's
//! Anthropic shapes: the message object, or the event sequence
//! `message_start`, `content_block_start` / `_delta` / `_stop`,
//! `message_delta`, `message_stop`); errors are re-shaped here as
//! `{"type": "error", "error": {...}}`.

use axum::body::{to_bytes, Bytes};
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::Json;
use kvgate_openai::{anthropic, ErrorResponse};
use kvgate_tokenize::{messages_to_chat, MessagesEndpoint};
use serde_json::{json, Map, Value};

use crate::server::http::{
    bad, body_sampling, check_model, generate, parse_json, unix_now, ApiError, Kind, Shared,
};

/// Largest error body re-shaped (the sim's own are a few hundred bytes).
const MAX_ERROR_BODY: usize = 64 << 10;

/// `POST /v1/messages`.
pub(super) async fn messages(
    State(state): State<Shared>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    anthropic_errors(create(state, headers, body).await).await
}

async fn create(state: Shared, headers: HeaderMap, body: Bytes) -> Response {
    let request = match object(&body) {
        Ok(r) => r,
        Err(e) => return e.into_response(),
    };
    let model = request.get("model").and_then(Value::as_str);
    if let Err(e) = check_model(&state, model) {
        return e.into_response();
    }
    let prompt = match anthropic::prompt_token_ids(&request) {
        Some(ids) => ids,
        None => {
            let rules = state.tokenizer.tokenize().tokenizer().messages_rules();
            let chat =
                match messages_to_chat(&request, MessagesEndpoint::Create, &rules, unix_now()) {
                    Ok(chat) => chat,
                    Err(e) => return bad(e.to_string()),
                };
            state.metrics.count_tokenization();
            match state.tokenizer.encode_chat(chat).await {
                Ok(ids) => ids,
                Err(e) => return bad(e.to_string()),
            }
        }
    };
    let max = request.get("max_tokens").and_then(Value::as_u64);
    let s = match body_sampling(&state, &headers, &request, max) {
        Ok(s) => s,
        Err(e) => return e.into_response(),
    };
    let stream = request.get("stream").and_then(Value::as_bool).unwrap_or(false);
    generate(state, Kind::Messages, prompt, s, stream, true).await
}

/// `POST /v1/messages/count_tokens`: the rendered prompt's length.
pub(super) async fn count_tokens(State(state): State<Shared>, body: Bytes) -> Response {
    let r = async {
        let request = match object(&body) {
            Ok(r) => r,
            Err(e) => return e.into_response(),
        };
        if let Err(e) = check_model(&state, request.get("model").and_then(Value::as_str)) {
            return e.into_response();
        }
        let rules = state.tokenizer.tokenize().tokenizer().messages_rules();
        let chat =
            match messages_to_chat(&request, MessagesEndpoint::CountTokens, &rules, unix_now()) {
                Ok(chat) => chat,
                Err(e) => return bad(e.to_string()),
            };
        match state.tokenizer.encode_chat(chat).await {
            Ok(ids) => Json(json!({
                "input_tokens": ids.len(),
                "context_management": {"original_input_tokens": ids.len()},
            }))
            .into_response(),
            Err(e) => bad(e.to_string()),
        }
    };
    anthropic_errors(r.await).await
}

fn object(body: &Bytes) -> Result<Map<String, Value>, ApiError> {
    match parse_json(body)? {
        Value::Object(o) => Ok(o),
        _ => Err(ApiError::bad("the body must be a JSON object")),
    }
}

/// An error answer of the chat machinery in Anthropic's shape, as vLLM's
/// router translates it (`translate_error_response`); others unchanged.
async fn anthropic_errors(r: Response) -> Response {
    let status = r.status();
    if !(status.is_client_error() || status.is_server_error()) {
        return r;
    }
    let bytes = to_bytes(r.into_body(), MAX_ERROR_BODY).await.unwrap_or_default();
    let e = ErrorResponse::from_upstream(status.as_u16(), &bytes);
    let body = anthropic::error_body(&e);
    (status, [(header::CONTENT_TYPE, HeaderValue::from_static("application/json"))], body)
        .into_response()
}
