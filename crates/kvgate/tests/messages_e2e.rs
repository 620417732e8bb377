//! Anthropic's Messages API end to end: `kvgate serve` in front of two
//! in-process simulated replicas (KV events on loopback), over real HTTP.
//! A multi-turn Messages conversation goes back to the replica that holds
//! its prefix and is served from its cache; streams arrive as vLLM's event
//! sequence; count_tokens and errors come in Anthropic's shapes.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use kvgate_gateway::Gateway;
use kvgate_sim::server::Replica;
use kvgate_tokenize::service::{Tokenize, TokenizeService};
use kvgate_tokenize::ChatTokenizer;
use serde_json::{json, Value};
use support::{exchange, gw_config, inproc_sim, local_client, replica_cfg, start_gateway};

mod support;

const MODEL: &str = "Qwen/Qwen3-0.6B";

async fn gateway(sims: &[Replica]) -> (Gateway, String) {
    let replicas =
        sims.iter().enumerate().map(|(i, s)| replica_cfg(&format!("sim-{i}"), s)).collect();
    start_gateway(gw_config(replicas)).await
}

async fn post(url: &str, body: &Value) -> (u16, String, String) {
    exchange(local_client().post(url).json(body)).await
}

fn system() -> String {
    "You are a careful coding agent working in a large repository. ".repeat(40)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_through_kvgate_follow_their_prefix_and_keep_anthropics_shapes() {
    let tok = Arc::new(
        TokenizeService::new(Tokenize::new(ChatTokenizer::bundled().unwrap(), None), 1).unwrap(),
    );
    let sims = [inproc_sim(&tok).await, inproc_sim(&tok).await];
    let (_gw, base) = gateway(&sims).await;
    let url = format!("{base}/v1/messages");
    let mut messages = vec![json!({"role": "user", "content": "List the crates."})];
    let mut served_by = Vec::new();
    for turn in 0..3 {
        let body =
            json!({"model": MODEL, "max_tokens": 8, "system": system(), "messages": messages});
        let (status, replica, text) = post(&url, &body).await;
        assert_eq!(status, 200, "turn {turn}: {text}");
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["type"], "message");
        if turn > 0 {
            let cached = v["usage"]["cache_read_input_tokens"].as_u64().unwrap();
            assert!(cached > 200, "turn {turn} reuses the conversation's prefix: {text}");
        }
        served_by.push(replica);
        let answer = v["content"][0]["text"].as_str().unwrap().to_owned();
        messages.push(json!({"role": "assistant", "content": answer}));
        messages.push(json!({"role": "user", "content": format!("And then step {turn}?")}));
        // Let the engine's KV events reach kvgate before the next turn.
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert!(served_by.iter().all(|r| *r == served_by[0]), "one replica holds it: {served_by:?}");

    // Streamed: vLLM's event sequence, ending with message_stop.
    let body = json!({"model": MODEL, "max_tokens": 3, "stream": true, "messages": messages});
    let (status, _, text) = post(&url, &body).await;
    assert_eq!(status, 200, "{text}");
    let names: Vec<&str> =
        text.split("\n\n").filter_map(|e| e.strip_prefix("event: ")?.split('\n').next()).collect();
    assert_eq!(names.first(), Some(&"message_start"), "{text}");
    assert_eq!(names.last(), Some(&"message_stop"), "{text}");
    assert_eq!(names.iter().filter(|n| **n == "content_block_delta").count(), 3, "{text}");
    assert!(!text.contains("[DONE]"));

    // count_tokens and an error, in Anthropic's shapes.
    let (status, _, text) = post(
        &format!("{base}/v1/messages/count_tokens"),
        &json!({"model": MODEL, "messages": [{"role": "user", "content": "Hi"}]}),
    )
    .await;
    assert_eq!(status, 200, "{text}");
    assert!(serde_json::from_str::<Value>(&text).unwrap()["input_tokens"].as_u64().unwrap() > 0);
    let (status, _, text) = post(&url, &json!({"model": MODEL, "messages": []})).await;
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(
        (status, v["type"].as_str(), v["error"]["type"].as_str()),
        (400, Some("error"), Some("invalid_request_error"))
    );

    let metrics =
        local_client().get(format!("{base}/metrics")).send().await.unwrap().text().await.unwrap();
    assert!(metrics.contains(r#"route="messages""#), "{metrics}");
}
