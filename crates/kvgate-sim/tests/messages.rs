//! Anthropic's Messages API on the simulated engine, over real HTTP: the
//! whole answer, the streamed event sequence, count_tokens, token-id
//! passthrough and the error shape, as vLLM 0.33 serves them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use kvgate_sim::server::Replica;
use kvgate_tokenize::{messages_to_chat, ChatTokenizer, MessagesEndpoint};
use serde_json::{json, Value};

mod support;
use support::MODEL;

async fn replica() -> Replica {
    support::api_replica().await
}

async fn send(r: &Replica, path: &str, body: &Value) -> (u16, String) {
    let resp = reqwest::Client::new()
        .post(format!("{}{path}", r.url()))
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    (resp.status().as_u16(), resp.text().await.unwrap())
}

fn body(stream: bool) -> Value {
    json!({
        "model": MODEL,
        "max_tokens": 4,
        "stream": stream,
        "system": "You are terse.",
        "messages": [{"role": "user", "content": "Name three primes."}],
    })
}

/// The prompt tokens kvgate's conversion and renderer give `b`.
fn prompt_len(b: &Value) -> usize {
    let t = ChatTokenizer::bundled().unwrap();
    let chat =
        messages_to_chat(b.as_object().unwrap(), MessagesEndpoint::Create, &t.messages_rules(), 0)
            .unwrap();
    t.encode_chat(&chat).unwrap().len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_whole_message_in_vllms_shape() {
    let r = replica().await;
    let (status, text) = send(&r, "/v1/messages", &body(false)).await;
    assert_eq!(status, 200, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!((v["type"].as_str(), v["role"].as_str()), (Some("message"), Some("assistant")));
    assert!(v["id"].as_str().unwrap().starts_with("chatcmpl-"));
    assert_eq!(v["content"][0]["type"], "text");
    assert!(!v["content"][0]["text"].as_str().unwrap().is_empty());
    assert_eq!(v["stop_reason"], "max_tokens");
    let usage = &v["usage"];
    assert_eq!(usage["output_tokens"], 4);
    let input = usage["input_tokens"].as_u64().unwrap()
        + usage["cache_read_input_tokens"].as_u64().unwrap();
    assert_eq!(input as usize, prompt_len(&body(false)));
    let (status, text) = send(
        &r,
        "/v1/messages/count_tokens",
        &json!({
            "model": MODEL, "system": "You are terse.",
            "messages": [{"role": "user", "content": "Name three primes."}],
        }),
    )
    .await;
    assert_eq!(status, 200, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["input_tokens"].as_u64(), Some(input));
    assert_eq!(v["context_management"]["original_input_tokens"].as_u64(), Some(input));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_is_vllms_event_sequence() {
    let r = replica().await;
    let (status, text) = send(&r, "/v1/messages", &body(true)).await;
    assert_eq!(status, 200, "{text}");
    let events: Vec<(String, Value)> = text
        .split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|e| {
            let (name, data) = e.split_once('\n').unwrap();
            let name = name.strip_prefix("event: ").unwrap().to_owned();
            let data: Value = serde_json::from_str(data.strip_prefix("data: ").unwrap()).unwrap();
            assert_eq!(data["type"], name.as_str(), "each event's data names it");
            (name, data)
        })
        .collect();
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "message_start",
            "content_block_start",
            "content_block_delta",
            "content_block_delta",
            "content_block_delta",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop",
        ]
    );
    let start = &events[0].1["message"];
    assert_eq!(
        (start["type"].as_str(), start["role"].as_str()),
        (Some("message"), Some("assistant"))
    );
    assert_eq!(events[2].1["delta"]["type"], "text_delta");
    assert_eq!(events[7].1["delta"]["stop_reason"], "max_tokens");
    assert_eq!(events[7].1["usage"]["output_tokens"], 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_ids_in_kv_transfer_params_are_the_prompt() {
    let r = replica().await;
    let mut b = body(false);
    b["kv_transfer_params"] = json!({"prompt_token_ids": [1, 2, 3, 4, 5]});
    let (status, text) = send(&r, "/v1/messages", &b).await;
    assert_eq!(status, 200, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    let usage = &v["usage"];
    let input = usage["input_tokens"].as_u64().unwrap()
        + usage["cache_read_input_tokens"].as_u64().unwrap();
    assert_eq!(input, 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_are_in_anthropics_shape() {
    let r = replica().await;
    let mut unknown = body(false);
    unknown["messages"][0]["content"] = json!([{"type": "document"}]);
    let mut model = body(false);
    model["model"] = json!("nope");
    for (b, status, kind) in
        [(unknown, 400, "invalid_request_error"), (model, 404, "not_found_error")]
    {
        let (got, text) = send(&r, "/v1/messages", &b).await;
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            (got, v["type"].as_str(), v["error"]["type"].as_str()),
            (status, Some("error"), Some(kind)),
            "{text}"
        );
        assert!(!v["error"]["message"].as_str().unwrap().is_empty());
    }
}
