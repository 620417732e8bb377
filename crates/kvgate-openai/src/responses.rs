//! OpenAI's Responses API (`POST /v1/responses`) on the wire, as vLLM 0.33
//! serves it (`entrypoints/openai/responses/`): the paths, the streamed
//! events a relay has to recognise, the error event that ends a broken
//! stream, the response object and events `kvgate sim` writes, and the
//! token-id hand-over.
//!
//! vLLM renders a Responses request with its chat renderer, which takes
//! `kv_transfer_params.prompt_token_ids` instead of rendering
//! (`_reused_prompt_token_ids`, reached through `preprocess_chat`), so the
//! ids are handed over as on `/v1/chat/completions`. Like the Messages
//! body, the request is not modelled as a struct: it is read as JSON and
//! the client's bytes are forwarded with only the ids (and, for a
//! continued conversation, the engine's own `previous_response_id`)
//! changed.

use serde_json::{json, Map, Value};

use crate::api_error::ErrorResponse;
use crate::sse::SseItem;

/// The path of the create endpoint; a stored response is
/// `{RESPONSES_PATH}/{id}`, its cancellation `{RESPONSES_PATH}/{id}/cancel`.
pub const RESPONSES_PATH: &str = "/v1/responses";

/// The prefix of every response id (vLLM's `resp_{uuid}`).
pub const ID_PREFIX: &str = "resp_";

/// The event names that end a Responses stream (`response.failed` and
/// `error` end a failed one).
pub const END_EVENTS: [&str; 4] =
    ["response.completed", "response.incomplete", "response.failed", "error"];

/// Whether `item` carries output: any `*.delta` event (text, reasoning,
/// tool-call arguments) is the model's first token.
pub fn is_output_event(item: &SseItem) -> bool {
    matches!(item, SseItem::Event(e) if e.event.as_deref().is_some_and(|n| n.ends_with(".delta")))
}

/// Appends one named event, `event: NAME\ndata: JSON\n\n`, as vLLM's
/// `_convert_stream_to_sse_events` writes them.
pub fn write_event(out: &mut Vec<u8>, data: &Value) {
    let name = data.get("type").and_then(Value::as_str).unwrap_or("unknown");
    out.extend_from_slice(b"event: ");
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(b"\ndata: ");
    out.extend_from_slice(data.to_string().as_bytes());
    out.extend_from_slice(b"\n\n");
}

/// Appends the `error` event (`ResponseErrorEvent`) that ends a stream
/// which broke after `sequence_number` events.
pub fn write_error_event(out: &mut Vec<u8>, e: &ErrorResponse, sequence_number: u64) {
    let data = json!({
        "type": "error",
        "code": e.error.error_type,
        "message": e.error.message,
        "param": e.error.param,
        "sequence_number": sequence_number,
    });
    write_event(out, &data);
}

/// vLLM's not-found error for an unknown response id
/// (`_make_not_found_error`): 404, `param` `response_id`.
pub fn not_found(id: &str) -> ErrorResponse {
    let mut e = ErrorResponse::not_found(format!("Response with id '{id}' not found."))
        .with_param("response_id");
    e.error.error_type = "invalid_request_error".into();
    e
}

/// The usage object of a response (`ResponseUsage`).
pub fn usage(input_tokens: u64, output_tokens: u64, cached_tokens: u64) -> Value {
    json!({
        "input_tokens": input_tokens,
        "input_tokens_details": {"cached_tokens": cached_tokens},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": input_tokens + output_tokens,
    })
}

/// One assistant message output item with its text (`ResponseOutputMessage`).
pub fn output_message(id: &str, text: &str, status: &str) -> Value {
    json!({
        "id": id,
        "content": [{"annotations": [], "text": text, "type": "output_text", "logprobs": null}],
        "role": "assistant",
        "status": status,
        "type": "message",
    })
}

/// The fields of a response object that echo its request, and how it ended.
#[derive(Clone, Debug)]
pub struct ResponseHead<'a> {
    /// The response id.
    pub id: &'a str,
    /// The model's name.
    pub model: &'a str,
    /// Unix seconds.
    pub created_at: u64,
    /// `queued`, `in_progress`, `completed`, `incomplete`, `cancelled`.
    pub status: &'a str,
    /// The request's body, for the fields a response echoes.
    pub request: &'a Map<String, Value>,
}

/// A response object (`ResponsesResponse.from_request`): the echoed
/// request fields, `output` and `usage`.
pub fn response(head: &ResponseHead<'_>, output: Vec<Value>, usage: Option<Value>) -> Value {
    let echo = |key: &str, default: Value| head.request.get(key).cloned().unwrap_or(default);
    let incomplete = (head.status == "incomplete").then(|| json!({"reason": "max_output_tokens"}));
    json!({
        "id": head.id,
        "created_at": head.created_at,
        "incomplete_details": incomplete,
        "instructions": echo("instructions", Value::Null),
        "metadata": echo("metadata", Value::Null),
        "model": head.model,
        "object": "response",
        "output": output,
        "parallel_tool_calls": echo("parallel_tool_calls", Value::Bool(true)),
        "temperature": echo("temperature", json!(1.0)),
        "tool_choice": echo("tool_choice", json!("auto")),
        "tools": echo("tools", json!([])),
        "top_p": echo("top_p", json!(1.0)),
        "background": echo("background", Value::Bool(false)),
        "max_output_tokens": echo("max_output_tokens", Value::Null),
        "max_tool_calls": echo("max_tool_calls", Value::Null),
        "previous_response_id": echo("previous_response_id", Value::Null),
        "prompt": Value::Null,
        "reasoning": echo("reasoning", Value::Null),
        "service_tier": echo("service_tier", json!("auto")),
        "status": head.status,
        "text": echo("text", Value::Null),
        "top_logprobs": echo("top_logprobs", json!(0)),
        "truncation": echo("truncation", json!("disabled")),
        "usage": usage,
        "user": echo("user", Value::Null),
    })
}

/// `kv_transfer_params.prompt_token_ids` of a parsed Responses body, when
/// present and well formed.
pub fn prompt_token_ids(body: &Map<String, Value>) -> Option<Vec<u32>> {
    crate::anthropic::prompt_token_ids(body)
}

/// The client's `body` (parsed as `parsed`) with
/// `kv_transfer_params.prompt_token_ids` added (as for Messages: appended
/// to the bytes when the body has no `kv_transfer_params`).
pub fn body_with_prompt_token_ids(
    body: &[u8],
    parsed: &Map<String, Value>,
    token_ids: &[u32],
) -> Result<Vec<u8>, crate::Error> {
    crate::anthropic::body_with_prompt_token_ids(body, parsed, token_ids)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sse::SseEvent;

    #[test]
    fn deltas_are_output_and_the_error_event_parses() {
        let named =
            |n: &str| SseItem::Event(SseEvent { event: Some(n.into()), ..SseEvent::default() });
        for n in ["response.output_text.delta", "response.function_call_arguments.delta"] {
            assert!(is_output_event(&named(n)), "{n}");
        }
        for n in ["response.created", "response.in_progress", "response.output_text.done"] {
            assert!(!is_output_event(&named(n)), "{n}");
        }
        let mut out = Vec::new();
        write_error_event(&mut out, &ErrorResponse::bad_gateway("gone"), 7);
        let text = String::from_utf8(out).unwrap();
        assert!(text.starts_with("event: error\ndata: {"), "{text}");
        let data: Value = serde_json::from_str(text.lines().nth(1).unwrap()[6..].trim()).unwrap();
        assert_eq!(data["sequence_number"], 7);
        assert_eq!(data["message"], "gone");
    }

    #[test]
    fn a_response_echoes_its_request() {
        let req: Map<String, Value> = serde_json::from_value(
            json!({"instructions": "Be brief.", "previous_response_id": "resp_a"}),
        )
        .unwrap();
        let head = ResponseHead {
            id: "resp_b",
            model: "m",
            created_at: 1,
            status: "completed",
            request: &req,
        };
        let r = response(&head, vec![output_message("msg_1", "hi", "completed")], None);
        assert_eq!(r["previous_response_id"], "resp_a");
        assert_eq!(r["instructions"], "Be brief.");
        assert_eq!(r["output"][0]["content"][0]["text"], "hi");
        assert_eq!(not_found("resp_x").status(), 404);
    }
}
