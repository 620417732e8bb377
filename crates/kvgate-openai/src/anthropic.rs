//! Anthropic's Messages API (`POST /v1/messages`) on the wire, as vLLM 0.33
//! serves it (`entrypoints/anthropic/`): the error body, the streamed
//! events a relay has to recognise, and the token-id hand-over.
//!
//! vLLM converts a Messages request to a chat completion request and keeps
//! its `kv_transfer_params` on the way, so `kv_transfer_params.
//! prompt_token_ids` reaches the same renderer shortcut as on
//! `/v1/chat/completions`: the engine skips its template and tokenizer.
//! The request body itself is not modelled as a struct: kvgate reads it as
//! JSON (`kvgate_tokenize`'s conversion does the rendering's reading) and
//! forwards the client's bytes, with only the token ids added.

use serde_json::{json, Map, Value};

use crate::api_error::ErrorResponse;
use crate::chat::{append_prompt_token_ids, token_ids_value};
use crate::error::Error;
use crate::sse::SseItem;

/// The path of the Messages endpoint.
pub const MESSAGES_PATH: &str = "/v1/messages";

/// The path of the token-count endpoint.
pub const COUNT_TOKENS_PATH: &str = "/v1/messages/count_tokens";

/// The `error.type` Anthropic's SDKs dispatch on, for an HTTP status
/// (vLLM's `translate_error_type`).
pub fn error_type(status: u16) -> &'static str {
    match status {
        400 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 => "overloaded_error",
        500..=u16::MAX => "api_error",
        _ => "invalid_request_error",
    }
}

/// `e` in Anthropic's shape, `{"type":"error","error":{"type","message"}}`,
/// with the type taken from `e`'s status as vLLM does.
pub fn error_value(e: &ErrorResponse) -> Value {
    json!({
        "type": "error",
        "error": {"type": error_type(e.status()), "message": e.error.message},
    })
}

/// [`error_value`] as JSON bytes.
pub fn error_body(e: &ErrorResponse) -> Vec<u8> {
    error_value(e).to_string().into_bytes()
}

/// Appends one named event, `event: NAME\ndata: JSON\n\n`, as vLLM's
/// `wrap_data_with_event` writes them.
pub fn write_named(out: &mut Vec<u8>, name: &str, data: &Value) {
    out.extend_from_slice(b"event: ");
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(b"\ndata: ");
    out.extend_from_slice(data.to_string().as_bytes());
    out.extend_from_slice(b"\n\n");
}

/// Appends the `error` event that ends a Messages stream which failed.
pub fn write_error_event(out: &mut Vec<u8>, e: &ErrorResponse) {
    write_named(out, "error", &error_value(e));
}

/// vLLM's usage object (`_build_anthropic_usage`): `input_tokens` is the
/// prompt less what came from the prefix cache.
pub fn usage(prompt_tokens: u64, output_tokens: u64, cached_tokens: u64) -> Value {
    json!({
        "input_tokens": prompt_tokens.saturating_sub(cached_tokens),
        "output_tokens": output_tokens,
        "cache_read_input_tokens": cached_tokens,
    })
}

/// A whole answer with one text block (`messages_full_converter`).
pub fn message(
    id: &str,
    model: &str,
    text: &str,
    stop_reason: Option<&str>,
    usage: Value,
) -> Value {
    json!({
        "id": id,
        "type": "message",
        "role": "assistant",
        "content": [{"type": "text", "text": text}],
        "model": model,
        "stop_reason": stop_reason,
        "usage": usage,
    })
}

/// Appends `message_start`, which vLLM sends on the engine's first chunk.
pub fn write_message_start(out: &mut Vec<u8>, id: &str, model: &str, usage: Value) {
    let message = json!({
        "id": id, "type": "message", "role": "assistant", "content": [], "model": model,
        "stop_reason": null, "stop_sequence": null, "usage": usage,
    });
    write_named(out, "message_start", &json!({"type": "message_start", "message": message}));
}

/// Appends one token's text as a `content_block_delta` of block 0, after
/// the block's `content_block_start` when it is the first.
pub fn write_text_delta(out: &mut Vec<u8>, first: bool, text: &str) {
    if first {
        let start = json!({"type": "content_block_start", "content_block": {"type": "text", "text": ""}, "index": 0});
        write_named(out, "content_block_start", &start);
    }
    let delta = json!({"type": "content_block_delta", "delta": {"type": "text_delta", "text": text}, "index": 0});
    write_named(out, "content_block_delta", &delta);
}

/// Appends a stream's end: the text block's `content_block_stop` (when one
/// was started), `message_delta` with the stop reason and usage, and
/// `message_stop`.
pub fn write_message_end(out: &mut Vec<u8>, block_open: bool, stop_reason: &str, usage: Value) {
    if block_open {
        write_named(out, "content_block_stop", &json!({"type": "content_block_stop", "index": 0}));
    }
    let delta = json!({
        "type": "message_delta",
        "delta": {"stop_reason": stop_reason, "stop_sequence": null},
        "usage": usage,
    });
    write_named(out, "message_delta", &delta);
    write_named(out, "message_stop", &json!({"type": "message_stop"}));
}

/// Whether `item` carries output: the first `content_block_delta` of a
/// stream is its first token (text, thinking or tool arguments).
pub fn is_output_event(item: &SseItem) -> bool {
    matches!(item, SseItem::Event(e) if e.event.as_deref() == Some("content_block_delta"))
}

/// `kv_transfer_params.prompt_token_ids` of a parsed Messages body, when
/// present and well formed.
pub fn prompt_token_ids(body: &Map<String, Value>) -> Option<Vec<u32>> {
    let ids = body.get("kv_transfer_params")?.get("prompt_token_ids")?.as_array()?;
    ids.iter().map(|id| id.as_u64().and_then(|id| u32::try_from(id).ok())).collect()
}

/// The client's `body` (parsed as `parsed`) with
/// `kv_transfer_params.prompt_token_ids` added. When the body names no
/// `kv_transfer_params`, the key is appended to its bytes and every other
/// byte stays as sent; otherwise the parsed body (key order kept) gets the
/// ids merged into its `kv_transfer_params` object and is re-serialised.
pub fn body_with_prompt_token_ids(
    body: &[u8],
    parsed: &Map<String, Value>,
    token_ids: &[u32],
) -> Result<Vec<u8>, Error> {
    if let Some(spliced) = append_prompt_token_ids(body, token_ids) {
        return Ok(spliced);
    }
    let mut out = parsed.clone();
    match out.get_mut("kv_transfer_params") {
        Some(Value::Object(params)) => {
            params.insert("prompt_token_ids".into(), token_ids_value(token_ids));
        }
        None | Some(Value::Null) => {
            let mut params = Map::new();
            params.insert("prompt_token_ids".into(), token_ids_value(token_ids));
            out.insert("kv_transfer_params".into(), Value::Object(params));
        }
        Some(_) => {
            return Err(Error::invalid_request(
                "`kv_transfer_params` must be an object",
                Some("kv_transfer_params"),
            ))
        }
    }
    Ok(serde_json::to_vec(&out)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sse::SseEvent;

    #[test]
    fn error_types_follow_vllm() {
        let cases = [
            (400, "invalid_request_error"),
            (401, "authentication_error"),
            (403, "permission_error"),
            (404, "not_found_error"),
            (413, "request_too_large"),
            (422, "invalid_request_error"),
            (429, "rate_limit_error"),
            (500, "api_error"),
            (502, "api_error"),
            (503, "overloaded_error"),
            (504, "api_error"),
        ];
        for (status, want) in cases {
            assert_eq!(error_type(status), want, "{status}");
        }
    }

    #[test]
    fn an_openai_error_becomes_anthropics_shape() {
        let e = ErrorResponse::rate_limited("slow down");
        let v: Value = serde_json::from_slice(&error_body(&e)).unwrap();
        assert_eq!(
            v,
            json!({"type": "error", "error": {"type": "rate_limit_error", "message": "slow down"}})
        );
        let mut out = Vec::new();
        write_error_event(&mut out, &ErrorResponse::bad_gateway("cut"));
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"api_error\",\"message\":\"cut\"}}\n\n"
        );
    }

    #[test]
    fn only_content_deltas_are_output() {
        let named =
            |n: &str| SseItem::Event(SseEvent { event: Some(n.into()), ..SseEvent::default() });
        assert!(is_output_event(&named("content_block_delta")));
        for n in ["message_start", "content_block_start", "ping", "message_delta", "message_stop"] {
            assert!(!is_output_event(&named(n)), "{n}");
        }
        assert!(!is_output_event(&SseItem::Done));
    }

    #[test]
    fn token_ids_are_appended_or_merged() {
        let body = br#"{"model":"m","max_tokens":5,"messages":[]}"#;
        let parsed: Map<String, Value> = serde_json::from_slice(body).unwrap();
        let out = body_with_prompt_token_ids(body, &parsed, &[1, 2]).unwrap();
        assert_eq!(
            std::str::from_utf8(&out).unwrap(),
            r#"{"model":"m","max_tokens":5,"messages":[],"kv_transfer_params":{"prompt_token_ids":[1,2]}}"#
        );
        let body = br#"{"kv_transfer_params":{"x":1},"model":"m"}"#;
        let parsed: Map<String, Value> = serde_json::from_slice(body).unwrap();
        let out = body_with_prompt_token_ids(body, &parsed, &[7]).unwrap();
        let v: Map<String, Value> = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["kv_transfer_params"], json!({"x": 1, "prompt_token_ids": [7]}));
        assert_eq!(prompt_token_ids(&v), Some(vec![7]));
        let body = br#"{"kv_transfer_params":3}"#;
        let parsed: Map<String, Value> = serde_json::from_slice(body).unwrap();
        assert!(body_with_prompt_token_ids(body, &parsed, &[7]).is_err());
    }
}
