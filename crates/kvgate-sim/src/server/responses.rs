//! OpenAI's Responses API as vLLM 0.33 serves it with
//! `VLLM_ENABLE_RESPONSES_API_STORE=1` (`entrypoints/openai/responses/`):
//! `POST /v1/responses` (whole or as its event stream), and the in-memory
//! store behind `previous_response_id`, `GET /v1/responses/{id}` and
//! `POST /v1/responses/{id}/cancel`.
//!
//! A request becomes the chat request vLLM renders for it
//! (`kvgate_tokenize::responses_to_chat`); with `previous_response_id` the
//! stored conversation goes before the new input (its system messages
//! dropped, the previous answer as the assistant's turn), as vLLM's
//! `construct_input_messages` does. It then runs on the engine as a chat
//! (`http::generate`), whose answer is re-shaped here: the response
//! object, or the event sequence `response.created`, `.in_progress`,
//! `.output_item.added`, `.content_part.added`, `.output_text.delta` per
//! token, `.output_text.done`, `.content_part.done`, `.output_item.done`,
//! `.completed`. Like vLLM's store, this one is the process's memory:
//! another replica does not know its ids. Background mode is not
//! simulated (refused with a 400).

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

use axum::body::{to_bytes, Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::StreamExt;
use kvgate_openai::responses::{self as wire, ResponseHead};
use kvgate_openai::{ErrorResponse, SseItem, SseParser};
use kvgate_tokenize::responses_to_chat;
use serde_json::{json, Map, Value};

use crate::server::http::{
    bad, body_sampling, check_model, error, generate, parse_json, unix_now, ApiError, Kind, Shared,
};

/// Largest chat answer re-shaped whole, bytes.
const MAX_ANSWER: usize = 64 << 20;

/// Largest SSE event of the chat stream parsed.
const MAX_EVENT: usize = 1 << 20;

/// One stored response: the object as answered, and the chat messages it
/// was rendered from (what a continuation starts from).
#[derive(Clone, Debug)]
struct Stored {
    response: Value,
    messages: Vec<Value>,
}

/// The replica's response store (vLLM's `response_store` and
/// `msg_store`): never evicted, as in vLLM.
#[derive(Debug, Default)]
pub(crate) struct Store {
    responses: Mutex<HashMap<String, Stored>>,
    next: AtomicU64,
}

impl Store {
    fn get(&self, id: &str) -> Option<Stored> {
        self.responses.lock().unwrap_or_else(PoisonError::into_inner).get(id).cloned()
    }

    fn put(&self, id: String, stored: Stored) {
        self.responses.lock().unwrap_or_else(PoisonError::into_inner).insert(id, stored);
    }

    /// A new response id, unique to this process (vLLM's is a uuid4).
    fn new_id(&self) -> String {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        format!("{}{nanos:016x}{n:016x}", wire::ID_PREFIX)
    }
}

fn openai_error(e: &ErrorResponse) -> Response {
    let status = StatusCode::from_u16(e.status()).unwrap_or(StatusCode::BAD_REQUEST);
    (status, [(header::CONTENT_TYPE, "application/json")], e.to_vec()).into_response()
}

/// `POST /v1/responses`.
pub(super) async fn create(
    State(state): State<Shared>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let request = match parse_json(&body) {
        Ok(Value::Object(o)) => o,
        Ok(_) => return ApiError::bad("the body must be a JSON object").into_response(),
        Err(e) => return e.into_response(),
    };
    let model = request.get("model").and_then(Value::as_str);
    if let Err(e) = check_model(&state, model) {
        return e.into_response();
    }
    if request.get("background").and_then(Value::as_bool) == Some(true) {
        return bad("background responses are not simulated by kvgate sim");
    }
    let previous = match request.get("previous_response_id") {
        None | Some(Value::Null) => None,
        Some(Value::String(id)) => match state.responses.get(id) {
            Some(s) => Some(s),
            None => return openai_error(&wire::not_found(id)),
        },
        Some(_) => return bad("previous_response_id must be a string"),
    };
    // The request as if it had no previous response, then the stored
    // conversation spliced in after its instructions.
    let mut own = request.clone();
    own.remove("previous_response_id");
    let mut chat = match responses_to_chat(&own) {
        Ok(chat) => chat,
        Err(e) => return bad(e.to_string()),
    };
    if let Some(prev) = &previous {
        let has_instructions =
            request.get("instructions").and_then(Value::as_str).is_some_and(|s| !s.is_empty());
        let at = usize::from(has_instructions).min(chat.messages.len());
        let mut history: Vec<Value> = prev
            .messages
            .iter()
            .filter(|m| m.get("role").and_then(Value::as_str) != Some("system"))
            .cloned()
            .collect();
        history.extend(
            output_texts(&prev.response).map(|t| json!({"role": "assistant", "content": t})),
        );
        chat.messages.splice(at..at, history);
    }
    let messages = chat.messages.clone();
    let prompt = match (wire::prompt_token_ids(&request), &previous) {
        (Some(ids), None) => ids,
        _ => {
            state.metrics.count_tokenization();
            match state.tokenizer.encode_chat(chat).await {
                Ok(ids) => ids,
                Err(e) => return bad(e.to_string()),
            }
        }
    };
    let max = request.get("max_output_tokens").and_then(Value::as_u64);
    let s = match body_sampling(&state, &headers, &request, max) {
        Ok(s) => s,
        Err(e) => return e.into_response(),
    };
    let stream = request.get("stream").and_then(Value::as_bool).unwrap_or(false);
    let model_name = s.model_name.clone();
    let answer = generate(state.clone(), Kind::Chat, prompt, s, stream, true).await;
    if !answer.status().is_success() {
        return answer;
    }
    let id = match request.get("request_id").and_then(Value::as_str) {
        Some(id) => id.to_owned(),
        None => state.responses.new_id(),
    };
    let store = request.get("store").and_then(Value::as_bool).unwrap_or(true);
    let turn = Turn { state, id, model: model_name, request, messages, store };
    if stream {
        turn.stream(answer)
    } else {
        turn.whole(answer).await
    }
}

/// The texts of a response's output messages (what a continuation sees
/// of the previous answer).
fn output_texts(response: &Value) -> impl Iterator<Item = String> + '_ {
    response["output"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|item| item["type"] == "message")
        .flat_map(|item| item["content"].as_array().into_iter().flatten())
        .filter_map(|part| part["text"].as_str().map(str::to_owned))
}

/// One response being made.
struct Turn {
    state: Shared,
    id: String,
    model: String,
    request: Map<String, Value>,
    messages: Vec<Value>,
    store: bool,
}

impl Turn {
    fn head<'a>(&'a self, status: &'a str, created_at: u64) -> ResponseHead<'a> {
        ResponseHead {
            id: &self.id,
            model: &self.model,
            created_at,
            status,
            request: &self.request,
        }
    }

    fn message_id(&self) -> String {
        format!("msg_{}", &self.id[wire::ID_PREFIX.len()..])
    }

    /// The final response object from the chat answer's text, finish
    /// reason and usage; stored unless the request said `store: false`.
    fn finish(&self, text: &str, finish: Option<&str>, usage: &Value, created_at: u64) -> Value {
        let status = if finish == Some("length") { "incomplete" } else { "completed" };
        let prompt = usage["prompt_tokens"].as_u64().unwrap_or(0);
        let output = usage["completion_tokens"].as_u64().unwrap_or(0);
        let cached = usage["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap_or(0);
        let item = wire::output_message(&self.message_id(), text, "completed");
        let response = wire::response(
            &self.head(status, created_at),
            vec![item],
            Some(wire::usage(prompt, output, cached)),
        );
        if self.store {
            let stored = Stored { response: response.clone(), messages: self.messages.clone() };
            self.state.responses.put(self.id.clone(), stored);
        }
        response
    }

    async fn whole(self, answer: Response) -> Response {
        let Ok(bytes) = to_bytes(answer.into_body(), MAX_ANSWER).await else {
            return error(StatusCode::INTERNAL_SERVER_ERROR, "the chat answer was too large");
        };
        let chat: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        let choice = &chat["choices"][0];
        let text = choice["message"]["content"].as_str().unwrap_or("");
        let response =
            self.finish(text, choice["finish_reason"].as_str(), &chat["usage"], unix_now());
        Json(response).into_response()
    }

    /// The chat stream's chunks as Responses events.
    fn stream(self, answer: Response) -> Response {
        let mut upstream = answer.into_body().into_data_stream();
        let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(64);
        tokio::spawn(async move {
            let created_at = unix_now();
            let mut seq = 0u64;
            let mut event = |mut data: Value| {
                data["sequence_number"] = json!(seq);
                seq += 1;
                let mut out = Vec::new();
                wire::write_event(&mut out, &data);
                Bytes::from(out)
            };
            let start = self.head("in_progress", created_at);
            let opening = [
                json!({"type": "response.created", "response": wire::response(&start, vec![], None)}),
                json!({"type": "response.in_progress", "response": wire::response(&start, vec![], None)}),
            ];
            for e in opening {
                if tx.send(event(e)).await.is_err() {
                    return;
                }
            }
            let item_id = self.message_id();
            let mut parser = SseParser::new(MAX_EVENT);
            let mut items = Vec::new();
            let (mut text, mut finish, mut usage, mut started) =
                (String::new(), None::<String>, Value::Null, false);
            while let Some(Ok(chunk)) = upstream.next().await {
                items.clear();
                if parser.feed(&chunk, &mut items).is_err() {
                    break;
                }
                for item in &items {
                    let SseItem::Event(e) = item else { continue };
                    let Ok(v) = serde_json::from_str::<Value>(&e.data) else { continue };
                    if !v["usage"].is_null() {
                        usage = v["usage"].clone();
                    }
                    let choice = &v["choices"][0];
                    if let Some(f) = choice["finish_reason"].as_str() {
                        finish = Some(f.to_owned());
                    }
                    let Some(delta) = choice["delta"]["content"].as_str().filter(|d| !d.is_empty())
                    else {
                        continue;
                    };
                    let mut out = Vec::new();
                    if !started {
                        started = true;
                        let item = wire::output_message(&item_id, "", "in_progress");
                        let part = json!({"type": "output_text", "text": "", "annotations": []});
                        out.push(json!({"type": "response.output_item.added", "item": item, "output_index": 0}));
                        out.push(json!({"type": "response.content_part.added", "item_id": item_id,
                            "output_index": 0, "content_index": 0, "part": part}));
                    }
                    text.push_str(delta);
                    out.push(json!({"type": "response.output_text.delta", "item_id": item_id,
                        "output_index": 0, "content_index": 0, "delta": delta, "logprobs": []}));
                    for e in out {
                        if tx.send(event(e)).await.is_err() {
                            return;
                        }
                    }
                }
            }
            let Some(finish) = finish else {
                // The engine stopped without finishing: no end event, so
                // the client (or kvgate) sees a broken stream.
                return;
            };
            let response = self.finish(&text, Some(&finish), &usage, created_at);
            let part = json!({"type": "output_text", "text": text, "annotations": []});
            let end = [
                json!({"type": "response.output_text.done", "item_id": item_id, "output_index": 0,
                    "content_index": 0, "text": text, "logprobs": []}),
                json!({"type": "response.content_part.done", "item_id": item_id, "output_index": 0,
                    "content_index": 0, "part": part}),
                json!({"type": "response.output_item.done", "output_index": 0,
                    "item": wire::output_message(&item_id, &text, "completed")}),
                json!({"type": if response["status"] == "incomplete" { "response.incomplete" } else { "response.completed" },
                    "response": response}),
            ];
            for e in end {
                if tx.send(event(e)).await.is_err() {
                    return;
                }
            }
        });
        let body = futures_util::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|b| (Ok::<_, Infallible>(b), rx))
        });
        (
            [
                (
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("text/event-stream; charset=utf-8"),
                ),
                (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
            ],
            Body::from_stream(body),
        )
            .into_response()
    }
}

/// `GET /v1/responses/{id}`: the stored response, or vLLM's not-found.
pub(super) async fn retrieve(State(state): State<Shared>, Path(id): Path<String>) -> Response {
    match state.responses.get(&id) {
        Some(s) => Json(s.response).into_response(),
        None => openai_error(&wire::not_found(&id)),
    }
}

/// `POST /v1/responses/{id}/cancel`: only a queued or running background
/// response can be cancelled; this sim's responses are all finished when
/// stored, so a known id gets vLLM's answer for a synchronous one.
pub(super) async fn cancel(State(state): State<Shared>, Path(id): Path<String>) -> Response {
    match state.responses.get(&id) {
        Some(_) => openai_error(
            &ErrorResponse::invalid_request("Cannot cancel a synchronous response.")
                .with_param("response_id"),
        ),
        None => openai_error(&wire::not_found(&id)),
    }
}
