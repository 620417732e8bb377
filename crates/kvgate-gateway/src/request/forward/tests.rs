//! The request path against the scripted fake engine (`engine_fake.rs`):
//! retries before the first byte, what a client gets when every replica
//! fails, stream error tails, first-token bookings, whole responses. No
//! socket is opened; the monitor's probes go to the fake too.

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use axum::http::HeaderMap;
use bytes::Bytes;
use kvgate_router::Health;
use kvgate_tokenize::service::{Tokenize, TokenizeService};
use kvgate_tokenize::ChatTokenizer;

use super::forward;
use crate::config::{GatewayConfig, ReplicaConfig};
use crate::doors::api::ApiContext;
use crate::request::engine_fake::{one_token_stream, Answer, End, FakeEngines};

pub(super) const TOKEN: &str = "data: {\"choices\":[{\"index\":0,\"text\":\"hi\"}]}\n\n";
pub(super) const DONE: &str = "data: [DONE]\n\n";

fn tokenizer() -> Arc<TokenizeService> {
    static T: OnceLock<Arc<TokenizeService>> = OnceLock::new();
    let make = || {
        let t = Tokenize::new(ChatTokenizer::bundled().expect("bundled tokenizer"), None);
        Arc::new(TokenizeService::new(t, 1).expect("tokenizer service"))
    };
    Arc::clone(T.get_or_init(make))
}

/// A gateway over fake engines at `engines` (`host:port`), every one in
/// rotation.
pub(super) async fn gateway(
    engines: &[&str],
    tweak: impl FnOnce(&mut GatewayConfig),
) -> (Arc<ApiContext>, Arc<FakeEngines>) {
    let replicas = engines.iter().map(|e| ReplicaConfig::new(format!("http://{e}"))).collect();
    let mut config = GatewayConfig { replicas, ..GatewayConfig::default() };
    tweak(&mut config);
    let fake = Arc::new(FakeEngines::default());
    let replicas = config.replicas.clone();
    let made = crate::state::request_path_for_tests(config, tokenizer(), fake.clone());
    let (api, registry) = made.expect("state");
    for r in replicas {
        registry.add_ranks(r).expect("replica");
    }
    let want = api.view.replicas.all().len();
    for _ in 0..400 {
        if api.fleet.with(|f| f.readiness().in_rotation) == want {
            return (api, fake);
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("replicas never came into rotation");
}

/// One token-id completion through `forward`: status, headers, body.
async fn complete(api: &ApiContext, stream: bool) -> (u16, HeaderMap, String) {
    let body = serde_json::json!({
        "model": api.pools.all()[0].model.served_name,
        "prompt": (0..64).collect::<Vec<u32>>(),
        "max_tokens": 4,
        "stream": stream,
    });
    let body = Bytes::from(body.to_string());
    let p = crate::request::prepare::completions(&api.preparer, body).await.expect("prepared");
    through_forward(api, p).await
}

/// A prepared request through `forward`: status, headers, body.
async fn through_forward(
    api: &ApiContext,
    p: crate::request::prepare::Prepared,
) -> (u16, HeaderMap, String) {
    // The permit the shedding layer would have given it (shed.rs).
    let permit =
        Arc::new(Arc::new(tokio::sync::Semaphore::new(1)).try_acquire_owned().expect("permit"));
    let resp = forward(&api.forwarder, p, &HeaderMap::new(), permit, Instant::now()).await;
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let body = axum::body::to_bytes(resp.into_body(), usize::MAX).await.expect("body");
    (status, headers, String::from_utf8(body.to_vec()).expect("utf-8"))
}

pub(super) fn metrics(api: &ApiContext) -> String {
    api.metrics.render(&api.view.snapshot(Instant::now()))
}

/// The replica named by its engine's URL.
fn replica(api: &ApiContext, engine: &str) -> Arc<crate::replicas::replica::Replica> {
    api.view.replicas.by_name(&format!("http://{engine}")).expect("replica")
}

fn failures(api: &ApiContext, engine: &str) -> u32 {
    let r = replica(api, engine);
    api.fleet.with(|f| f.status(r.id).map_or(0, |s| s.failures))
}

fn health(api: &ApiContext, engine: &str) -> Health {
    let r = replica(api, engine);
    api.fleet.with(|f| f.router().replica(r.id).map(|(_, h)| h).expect("known"))
}

#[tokio::test]
async fn a_5xx_before_the_first_byte_is_retried_on_another_replica() {
    let (api, fake) = gateway(&["a:1", "b:2"], |_| {}).await;
    fake.next([Answer::Status(503, r#"{"error":{"message":"overloaded"}}"#)]);
    let (status, headers, body) = complete(&api, true).await;
    assert_eq!(status, 200);
    assert_eq!(body, format!("{TOKEN}{DONE}"));
    let seen = fake.seen();
    assert_eq!(seen.len(), 2);
    assert_ne!(seen[0].engine, seen[1].engine, "the retry went elsewhere");
    assert_eq!(headers["x-kvgate-replica"], format!("http://{}", seen[1].engine).as_str());
    assert_eq!(failures(&api, &seen[0].engine), 1);
    assert_eq!(failures(&api, &seen[1].engine), 0);
    assert!(metrics(&api).contains(r#"kvgate_retries_total{reason="status_5xx"} 1"#));
}

#[tokio::test]
async fn a_refused_connection_takes_the_replica_out_at_once_and_is_retried() {
    let (api, fake) = gateway(&["a:1", "b:2"], |_| {}).await;
    fake.next([Answer::Refuse]);
    let (status, _, body) = complete(&api, true).await;
    assert_eq!((status, body.ends_with(DONE)), (200, true));
    let seen = fake.seen();
    assert_eq!(health(&api, &seen[0].engine), Health::Down, "out of rotation at once");
    assert_eq!(health(&api, &seen[1].engine), Health::Healthy);
    assert!(metrics(&api).contains(r#"kvgate_retries_total{reason="connect"} 1"#));
}

#[tokio::test]
async fn a_refused_connection_is_reported_to_the_fleet_once_as_unreachable() {
    // No probe after the first: only the request reports the replica.
    let (api, fake) = gateway(&["a:1", "b:2"], |c| {
        c.monitor.health_interval_ms = 86_400_000;
        c.monitor.metrics_interval_ms = 86_400_000;
    })
    .await;
    fake.next([Answer::Refuse]);
    let (status, _, _) = complete(&api, false).await;
    assert_eq!(status, 200);
    let dead = fake.seen()[0].engine.clone();
    // `Unreachable` sets the count to `unhealthy_after`; a second report of
    // the same failure (as an `Error`) would add one.
    let after = GatewayConfig::default().monitor.unhealthy_after;
    assert_eq!(failures(&api, &dead), after);
    let id = replica(&api, &dead).id;
    let last = api.fleet.with(|f| f.status(id).and_then(|s| s.last_error.clone()));
    let last = last.expect("a last error");
    assert!(last.contains("unreachable") && last.contains("connection refused"), "{last}");
    assert!(metrics(&api).contains(r#"kvgate_retries_total{reason="connect"} 1"#));
}

#[tokio::test]
async fn a_first_byte_timeout_is_retried() {
    let (api, fake) = gateway(&["a:1", "b:2"], |c| c.limits.first_byte_timeout_ms = 50).await;
    fake.next([Answer::Hang]);
    let (status, _, _) = complete(&api, true).await;
    assert_eq!(status, 200);
    assert_eq!(fake.seen().len(), 2);
    assert!(metrics(&api).contains(r#"kvgate_retries_total{reason="timeout"} 1"#));
}

#[tokio::test]
async fn when_every_replica_fails_the_client_gets_the_last_engine_error() {
    let (api, fake) = gateway(&["a:1", "b:2"], |_| {}).await;
    let overloaded = Answer::Status(503, r#"{"error":{"message":"engine overloaded"}}"#);
    fake.next([overloaded.clone(), overloaded]);
    let (status, _, body) = complete(&api, true).await;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("engine overloaded"), "{body}");
    assert_eq!(fake.seen().len(), 2, "each replica tried once");
}

#[tokio::test]
async fn a_4xx_is_passed_through_and_not_retried_or_held_against_the_replica() {
    let (api, fake) = gateway(&["a:1", "b:2"], |_| {}).await;
    let bad = r#"{"error":{"message":"bad prompt","type":"BadRequestError"}}"#;
    fake.next([Answer::Status(400, bad)]);
    let (status, _, body) = complete(&api, false).await;
    assert_eq!((status, body.as_str()), (400, bad));
    let seen = fake.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(failures(&api, &seen[0].engine), 0);
}

#[tokio::test]
async fn a_stream_passes_the_engine_bytes_unchanged_and_books_its_first_token() {
    let (api, fake) = gateway(&["a:1"], |_| {}).await;
    let chunks = vec![
        (Duration::ZERO, ": keep-alive\n\n"),
        (Duration::from_millis(5), TOKEN),
        (Duration::ZERO, "data: {\"choices\":[{\"index\":0,\"text\":\" there\"}]}\n\n"),
        (Duration::ZERO, DONE),
    ];
    let expected: String = chunks.iter().map(|(_, c)| *c).collect();
    fake.next([Answer::Sse(chunks, End::Close)]);
    let (status, _, body) = complete(&api, true).await;
    assert_eq!((status, body), (200, expected));
    let totals = api.fleet.with(|f| f.router().ledger_totals());
    assert_eq!((totals.first_tokens, totals.finished, totals.errored), (1, 1, 0));
    assert!(metrics(&api).contains("kvgate_time_to_first_token_seconds_count"));
}

/// A stream's end that is not `[DONE]` gets an error event and `[DONE]`,
/// and counts against the replica.
async fn broken_stream(end: End, tweak: impl FnOnce(&mut GatewayConfig)) -> String {
    let (api, fake) = gateway(&["a:1"], tweak).await;
    fake.next([Answer::Sse(vec![(Duration::ZERO, TOKEN)], end)]);
    let (status, _, body) = complete(&api, true).await;
    assert_eq!(status, 200, "the head was sent before the stream broke");
    assert!(body.starts_with(TOKEN), "{body}");
    assert!(body.ends_with(DONE), "{body}");
    let totals = api.fleet.with(|f| f.router().ledger_totals());
    assert_eq!((totals.first_tokens, totals.errored), (1, 1));
    assert_eq!(failures(&api, "a:1"), 1);
    body
}

#[tokio::test]
async fn a_stream_cut_before_done_gets_an_error_tail() {
    let body = broken_stream(End::Close, |_| {}).await;
    assert!(body.contains("ended the stream early"), "{body}");
}

#[tokio::test]
async fn a_broken_stream_gets_an_error_tail() {
    let body = broken_stream(End::Break, |_| {}).await;
    assert!(body.contains("connection reset"), "{body}");
}

#[tokio::test]
async fn a_stalled_stream_times_out_with_an_error_tail() {
    let body = broken_stream(End::Stall, |c| c.limits.stream_idle_timeout_ms = 50).await;
    assert!(body.contains("sent nothing for"), "{body}");
}

#[tokio::test]
async fn a_stream_longer_than_the_idle_limit_with_shorter_gaps_is_not_cut() {
    // The stall timer is armed once and re-armed from the last chunk, so
    // only a gap counts, never the stream's length.
    let (api, fake) = gateway(&["a:1"], |c| c.limits.stream_idle_timeout_ms = 80).await;
    let mut chunks = vec![(Duration::ZERO, TOKEN)];
    chunks.extend((0..6).map(|_| (Duration::from_millis(40), TOKEN)));
    chunks.push((Duration::from_millis(40), DONE));
    let expected: String = chunks.iter().map(|(_, c)| *c).collect();
    fake.next([Answer::Sse(chunks, End::Close)]);
    let (status, _, body) = complete(&api, true).await;
    assert_eq!((status, body), (200, expected));
    let totals = api.fleet.with(|f| f.router().ledger_totals());
    assert_eq!((totals.finished, totals.errored), (1, 0));
}

#[tokio::test]
async fn a_burst_of_many_chunks_passes_whole_and_in_order() {
    // More chunks at once than one gathered write holds.
    let (api, fake) = gateway(&["a:1"], |_| {}).await;
    // The fake engine takes static chunks; numbered so order shows.
    let event = |i: usize| -> &'static str {
        let text = format!("data: {{\"choices\":[{{\"index\":0,\"text\":\"{i}\"}}]}}\n\n");
        Box::leak(text.into_boxed_str())
    };
    let mut chunks: Vec<(Duration, &'static str)> =
        (0..300).map(|i| (Duration::ZERO, event(i))).collect();
    chunks.push((Duration::ZERO, DONE));
    let expected: String = chunks.iter().map(|(_, c)| *c).collect();
    fake.next([Answer::Sse(chunks, End::Close)]);
    let (status, _, body) = complete(&api, true).await;
    assert_eq!((status, body), (200, expected));
}

#[tokio::test]
async fn a_whole_response_comes_back_with_its_status_and_the_replica_header() {
    let (api, fake) = gateway(&["a:1"], |_| {}).await;
    let json = r#"{"id":"cmpl-1","choices":[{"index":0,"text":"hi"}]}"#;
    fake.next([Answer::Status(200, json)]);
    let (status, headers, body) = complete(&api, false).await;
    assert_eq!((status, body.as_str()), (200, json));
    assert_eq!(headers["x-kvgate-replica"], "http://a:1");
    assert_eq!(headers["content-type"], "application/json");
    let totals = api.fleet.with(|f| f.router().ledger_totals());
    assert_eq!(totals.finished, 1);
}

#[tokio::test]
async fn a_data_parallel_rank_is_pinned_by_header() {
    let (api, fake) = gateway(&["a:1"], |c| c.replicas[0].dp_size = 2).await;
    fake.next([one_token_stream(), one_token_stream()]);
    for _ in 0..2 {
        assert_eq!(complete(&api, true).await.0, 200);
    }
    for seen in fake.seen() {
        let rank = seen.headers.iter().find(|(n, _)| n == "x-data-parallel-rank");
        assert!(matches!(rank, Some((_, r)) if r == "0" || r == "1"), "{:?}", seen.headers);
        assert_eq!(seen.path, "/v1/completions");
        let sent: serde_json::Value = serde_json::from_slice(&seen.body).expect("JSON body");
        assert_eq!(sent["prompt"], serde_json::json!((0..64).collect::<Vec<u32>>()));
    }
}

/// Two model pools: `q` (alias `qa`, adapter `qsql`) on a and b, `l` on c.
async fn two_pools() -> (Arc<ApiContext>, Arc<FakeEngines>) {
    let text = r#"
        [[pools]]
        name = "qwen"
        model.served_name = "q"
        model.aliases = ["qa"]
        model.lora_adapters = ["qsql"]
        replicas = [{ url = "http://a:1" }, { url = "http://b:2" }]
        [[pools]]
        name = "llama"
        model.served_name = "l"
        replicas = [{ url = "http://c:3" }]
    "#;
    let config = GatewayConfig::from_toml_with_overrides(text, &[]).expect("config");
    config.validate().expect("valid");
    let fake = Arc::new(FakeEngines::default());
    let replicas = config.all_replicas();
    let made = crate::state::request_path_for_tests(config, tokenizer(), fake.clone());
    let (api, registry) = made.expect("state");
    for r in replicas {
        registry.add_ranks(r).expect("replica");
    }
    for _ in 0..400 {
        if api.fleet.with(|f| f.readiness().in_rotation) == 3 {
            return (api, fake);
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("replicas never came into rotation");
}

/// A completion for `model`: status, `Retry-After`, body.
async fn complete_model(api: &ApiContext, model: &str) -> (u16, Option<String>, String) {
    let body = serde_json::json!({ "model": model, "prompt": [1, 2, 3], "max_tokens": 2 });
    let body = Bytes::from(body.to_string());
    let p = match crate::request::prepare::completions(&api.preparer, body).await {
        Ok(p) => p,
        Err(e) => {
            let e = crate::request::request_error::RequestError::new(
                crate::request::request_error::Reason::Invalid,
                *e,
            );
            let resp = crate::request::response::answer(
                &api.metrics,
                Some(crate::request::route::Route::Completions),
                "",
                &e,
            );
            let status = resp.status().as_u16();
            let body = axum::body::to_bytes(resp.into_body(), usize::MAX).await.expect("body");
            return (status, None, String::from_utf8(body.to_vec()).expect("utf-8"));
        }
    };
    let permit =
        Arc::new(Arc::new(tokio::sync::Semaphore::new(1)).try_acquire_owned().expect("permit"));
    let resp = forward(&api.forwarder, p, &HeaderMap::new(), permit, Instant::now()).await;
    let status = resp.status().as_u16();
    let retry = resp.headers().get("retry-after").map(|v| v.to_str().unwrap_or("").to_owned());
    let body = axum::body::to_bytes(resp.into_body(), usize::MAX).await.expect("body");
    (status, retry, String::from_utf8(body.to_vec()).expect("utf-8"))
}

#[tokio::test]
async fn each_model_reaches_only_its_pool_and_aliases_are_rewritten() {
    let (api, fake) = two_pools().await;
    for model in ["q", "qa", "qsql", "l", "q", "l"] {
        let (status, _, body) = complete_model(&api, model).await;
        assert_eq!(status, 200, "{model}: {body}");
    }
    let seen = fake.seen();
    let sent_model = |s: &crate::request::engine_fake::Seen| {
        let v: serde_json::Value = serde_json::from_slice(&s.body).expect("json");
        v["model"].as_str().unwrap_or_default().to_owned()
    };
    for (s, asked) in seen.iter().zip(["q", "qa", "qsql", "l", "q", "l"]) {
        let pool_engines: &[&str] = if asked == "l" { &["c:3"] } else { &["a:1", "b:2"] };
        assert!(pool_engines.contains(&s.engine.as_str()), "{asked} went to {}", s.engine);
        let want = if asked == "qa" { "q" } else { asked };
        assert_eq!(sent_model(s), want, "the engine gets the served name for an alias");
    }
    let (status, _, body) = complete_model(&api, "nope").await;
    assert_eq!(status, 404);
    assert!(body.contains("The model `nope` does not exist."), "{body}");
    let m = metrics(&api);
    assert!(m.contains(r#"kvgate_pool_decisions_total{pool="llama",outcome="routed"} 2"#), "{m}");
    assert!(m.contains(r#"kvgate_pool_decisions_total{pool="qwen",outcome="routed"} 4"#));
    assert!(m.contains(r#"kvgate_replica_pool{replica="http://c:3",pool="llama"} 1"#));
}

#[tokio::test]
async fn a_pool_without_a_healthy_replica_is_refused_and_the_others_serve_on() {
    let (api, _fake) = two_pools().await;
    let c = replica(&api, "c:3");
    api.fleet.with(|f| f.set_draining(c.id, true, Instant::now()));
    let (status, retry, body) = complete_model(&api, "l").await;
    assert_eq!(status, 503, "{body}");
    assert!(retry.is_some_and(|r| r.parse::<u64>().is_ok_and(|s| s >= 1)), "Retry-After");
    for model in ["q", "qa", "qsql"] {
        assert_eq!(complete_model(&api, model).await.0, 200, "{model} unaffected");
    }
}

/// A pool that may load `ext`: the first request for it loads it on one
/// replica through vLLM's runtime API, then goes there; the next finds it
/// served and loads nothing. A failed load is a 503 that says why.
#[tokio::test]
async fn an_adapter_no_replica_serves_is_loaded_once_then_served() {
    let (api, fake) = gateway(&["a:1", "b:2"], |c| {
        c.model.loadable_adapters = vec!["ext=/adapters/ext".into(), "bad=/nowhere".into()];
    })
    .await;
    // Listed before any load: a client may name them.
    let axum::Json(list) = crate::doors::api::models(axum::extract::State(Arc::clone(&api))).await;
    let ids: Vec<_> =
        list["data"].as_array().expect("data").iter().map(|m| m["id"].clone()).collect();
    assert_eq!(ids, ["Qwen/Qwen3-0.6B", "bad", "ext"], "{list}");
    fake.next([Answer::Status(200, "Success: LoRA adapter 'ext' added successfully.")]);
    let (status, _, body) = complete_model(&api, "ext").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(complete_model(&api, "ext").await.0, 200);
    let seen = fake.seen();
    assert_eq!(seen.len(), 3, "one load, two generations");
    assert_eq!(seen[0].path, "/v1/load_lora_adapter");
    let load: serde_json::Value = serde_json::from_slice(&seen[0].body).expect("json");
    assert_eq!(
        (load["lora_name"].as_str(), load["lora_path"].as_str()),
        (Some("ext"), Some("/adapters/ext"))
    );
    assert!(seen[1..].iter().all(|s| s.engine == seen[0].engine), "only where it was loaded");
    fake.next([Answer::Status(404, r#"{"error":{"message":"not found"}}"#)]);
    let (status, retry, body) = complete_model(&api, "bad").await;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("could not be loaded") && retry.is_some(), "{body}");
    let m = metrics(&api);
    assert!(
        m.contains(r#"kvgate_pool_adapter_runtime_loads_total{pool="default",outcome="loaded"} 1"#),
        "{m}"
    );
    assert!(
        m.contains(r#"kvgate_pool_adapter_runtime_loads_total{pool="default",outcome="failed"} 1"#)
    );
}

// ------------------------------------------------- Anthropic Messages

/// A Messages body with a system prompt, a tool and a finished tool turn.
fn messages_body(stream: bool) -> serde_json::Value {
    serde_json::json!({
        "model": "Qwen/Qwen3-0.6B",
        "max_tokens": 8,
        "stream": stream,
        "system": [{"type": "text", "text": "You are terse."}],
        "tools": [{"name": "get_weather", "input_schema": {"properties": {"city": {"type": "string"}}}}],
        "messages": [
            {"role": "user", "content": "Weather in Oslo?"},
            {"role": "assistant", "content": [
                {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Oslo"}},
            ]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "4 C"}]},
        ],
    })
}

/// The same conversation as a chat completion request (what vLLM converts
/// it to): kvgate must route both on the same tokens.
fn equivalent_chat() -> serde_json::Value {
    serde_json::json!({
        "model": "Qwen/Qwen3-0.6B",
        "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Weather in Oslo?"},
            {"role": "assistant", "tool_calls": [{"id": "toolu_1", "type": "function",
                "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}]},
            {"role": "tool", "tool_call_id": "toolu_1", "content": "4 C"},
        ],
        "tools": [{"type": "function", "function": {"name": "get_weather", "description": null,
            "parameters": {"properties": {"city": {"type": "string"}}, "type": "object"}}}],
    })
}

/// `body` through the `/v1/messages` handler: status, headers, body.
async fn messages(api: &Arc<ApiContext>, body: &serde_json::Value) -> (u16, HeaderMap, String) {
    let permit =
        Arc::new(Arc::new(tokio::sync::Semaphore::new(1)).try_acquire_owned().expect("permit"));
    let resp = crate::doors::api::messages(
        axum::extract::State(Arc::clone(api)),
        crate::doors::shed::Admitted(permit),
        HeaderMap::new(),
        Bytes::from(body.to_string()),
    )
    .await;
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let body = axum::body::to_bytes(resp.into_body(), usize::MAX).await.expect("body");
    (status, headers, String::from_utf8(body.to_vec()).expect("utf-8"))
}

fn anthropic_error(body: &str) -> (String, String) {
    let v: serde_json::Value = serde_json::from_str(body).expect("JSON error body");
    assert_eq!(v["type"], "error", "{body}");
    let kind = v["error"]["type"].as_str().expect("error.type").to_owned();
    (kind, v["error"]["message"].as_str().expect("error.message").to_owned())
}

#[tokio::test]
async fn a_messages_request_is_routed_on_the_chat_tokens_and_relayed_whole() {
    let (api, fake) = gateway(&["a:1"], |_| {}).await;
    let answer = r#"{"id":"chatcmpl-1","type":"message","role":"assistant","content":[{"type":"text","text":"Cold."}],"model":"Qwen/Qwen3-0.6B","stop_reason":"end_turn","usage":{"input_tokens":9,"output_tokens":2}}"#;
    fake.next([Answer::Status(200, answer)]);
    let (status, headers, body) = messages(&api, &messages_body(false)).await;
    assert_eq!((status, body.as_str()), (200, answer));
    assert_eq!(headers["x-kvgate-replica"], "http://a:1");
    let seen = fake.seen();
    assert_eq!(seen[0].path, "/v1/messages");
    let sent: serde_json::Value = serde_json::from_slice(&seen[0].body).expect("JSON");
    let chat = Bytes::from(equivalent_chat().to_string());
    let chat = crate::request::prepare::chat(&api.preparer, chat).await.expect("chat");
    let ids: Vec<u32> =
        serde_json::from_value(sent["kv_transfer_params"]["prompt_token_ids"].clone())
            .expect("the engine gets the token ids");
    assert_eq!(Some(ids), chat.tokens, "Messages and chat render the same prompt");
    assert_eq!(sent["messages"], messages_body(false)["messages"], "the body is the client's");
    let totals = api.fleet.with(|f| f.router().ledger_totals());
    assert_eq!((totals.finished, totals.errored), (1, 0));
    let m = metrics(&api);
    assert!(
        m.contains(
            r#"kvgate_requests_total{route="messages",status="200",replica="http://a:1"} 1"#
        ),
        "{m}"
    );
}

const MESSAGE_START: &str = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"model\":\"q\"}}\n\n";
const BLOCK_START: &str = "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n";
const DELTA: &str = "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Cold\"}}\n\n";
const MESSAGE_END: &str = "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\nevent: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"input_tokens\":9,\"output_tokens\":1}}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";

#[tokio::test]
async fn a_messages_stream_is_relayed_unchanged_and_its_first_delta_is_the_first_token() {
    let (api, fake) = gateway(&["a:1"], |_| {}).await;
    let chunks = vec![
        (Duration::ZERO, MESSAGE_START),
        (Duration::from_millis(5), BLOCK_START),
        (Duration::ZERO, DELTA),
        (Duration::ZERO, MESSAGE_END),
    ];
    let expected: String = chunks.iter().map(|(_, c)| *c).collect();
    fake.next([Answer::Sse(chunks, End::Close)]);
    let (status, _, body) = messages(&api, &messages_body(true)).await;
    assert_eq!((status, body), (200, expected));
    let totals = api.fleet.with(|f| f.router().ledger_totals());
    assert_eq!((totals.first_tokens, totals.finished, totals.errored), (1, 1, 0));
    assert!(
        metrics(&api).contains(r#"kvgate_time_to_first_token_seconds_count{route="messages"} 1"#)
    );
    assert_eq!(failures(&api, "a:1"), 0, "message_stop ends the stream");
}

#[tokio::test]
async fn a_cut_messages_stream_ends_with_an_anthropic_error_event() {
    let (api, fake) = gateway(&["a:1"], |_| {}).await;
    fake.next([Answer::Sse(
        vec![(Duration::ZERO, MESSAGE_START), (Duration::ZERO, DELTA)],
        End::Close,
    )]);
    let (status, _, body) = messages(&api, &messages_body(true)).await;
    assert_eq!(status, 200);
    let tail =
        body.strip_prefix(&format!("{MESSAGE_START}{DELTA}")).expect("the engine's bytes first");
    let data = tail.strip_prefix("event: error\ndata: ").and_then(|t| t.strip_suffix("\n\n"));
    let (kind, message) = anthropic_error(data.expect("one error event"));
    assert_eq!(kind, "api_error");
    assert!(message.contains("ended the stream early"), "{message}");
    assert!(!body.contains("[DONE]"), "no OpenAI sentinel in an Anthropic stream");
    assert_eq!(failures(&api, "a:1"), 1);
}

#[tokio::test]
async fn messages_errors_come_in_anthropics_shape() {
    let (api, fake) = gateway(&["a:1"], |_| {}).await;
    let with = |f: &dyn Fn(&mut serde_json::Value)| {
        let mut b = messages_body(false);
        f(&mut b);
        b
    };
    let cases: [(serde_json::Value, u16, &str, &str); 5] = [
        (
            with(&|b| b["messages"][0]["content"] = serde_json::json!([{"type": "document"}])),
            400,
            "invalid_request_error",
            "unknown content block type \"document\"",
        ),
        (
            with(&|b| {
                b["messages"][0]["content"] = serde_json::json!([{"type": "image",
                    "source": {"type": "url", "url": "https://x/y.png"}}])
            }),
            400,
            "invalid_request_error",
            "unsupported content: image content",
        ),
        (with(&|b| b["model"] = "nope".into()), 404, "not_found_error", "does not exist"),
        (with(&|b| b["max_tokens"] = 0.into()), 400, "invalid_request_error", "max_tokens"),
        (
            with(&|b| b["max_tokens"] = 100_000.into()),
            400,
            "invalid_request_error",
            "maximum context length",
        ),
    ];
    for (body, want_status, want_kind, want_text) in cases {
        let (status, _, answer) = messages(&api, &body).await;
        let (kind, message) = anthropic_error(&answer);
        assert_eq!((status, kind.as_str()), (want_status, want_kind), "{answer}");
        assert!(message.contains(want_text), "{message}");
    }
    assert!(fake.seen().is_empty(), "nothing refused reached an engine");
    // Every engine fails: the last engine error, in Anthropic's shape.
    let (api, fake) = gateway(&["a:1", "b:2"], |_| {}).await;
    let busy = r#"{"type":"error","error":{"type":"overloaded_error","message":"busy"}}"#;
    fake.next([Answer::Status(503, busy), Answer::Status(503, busy)]);
    let (status, _, answer) = messages(&api, &messages_body(false)).await;
    let (kind, message) = anthropic_error(&answer);
    assert_eq!((status, kind.as_str()), (503, "overloaded_error"), "{answer}");
    assert!(message.contains("busy"), "{message}");
}

#[tokio::test]
async fn count_tokens_counts_what_the_messages_request_would_send() {
    let (api, fake) = gateway(&["a:1"], |_| {}).await;
    let mut body = messages_body(false);
    let prepared =
        crate::request::prepare::messages(&api.preparer, Bytes::from(body.to_string()), 0)
            .await
            .expect("prepared");
    if let Some(b) = body.as_object_mut() {
        b.remove("max_tokens");
        b.remove("stream");
    }
    let resp = crate::doors::api::count_tokens(
        axum::extract::State(Arc::clone(&api)),
        Bytes::from(body.to_string()),
    )
    .await;
    assert_eq!(resp.status().as_u16(), 200);
    let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX).await.expect("body");
    let v: serde_json::Value = serde_json::from_slice(&bytes).expect("JSON");
    assert_eq!(v["input_tokens"], prepared.prompt_tokens);
    assert_eq!(v["context_management"]["original_input_tokens"], prepared.prompt_tokens);
    let resp = crate::doors::api::count_tokens(
        axum::extract::State(Arc::clone(&api)),
        Bytes::from_static(
            br#"{"model":"Qwen/Qwen3-0.6B","messages":[{"role":"tool","content":"x"}]}"#,
        ),
    )
    .await;
    assert_eq!(resp.status().as_u16(), 400);
    let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX).await.expect("body");
    let (kind, _) = anthropic_error(std::str::from_utf8(&bytes).expect("utf-8"));
    assert_eq!(kind, "invalid_request_error");
    assert!(fake.seen().is_empty(), "counted without an engine");
}

/// A Responses API request through `forward`: status, headers, body.
async fn respond_to(api: &ApiContext, body: serde_json::Value) -> (u16, HeaderMap, String) {
    let body = Bytes::from(body.to_string());
    let p = crate::request::prepare::responses(&api.preparer, body).await.expect("prepared");
    through_forward(api, p).await
}

#[tokio::test]
async fn a_continued_responses_turn_goes_to_its_owner_only_and_is_not_retried_elsewhere() {
    let (api, fake) = gateway(&["a:1", "b:2"], |_| {}).await;
    let model = api.pools.all()[0].model.served_name.clone();
    let previous = api.forwarder.affinity.issue("http://b:2", "resp_engine1").expect("id");
    let body =
        serde_json::json!({"model": model, "input": "next", "previous_response_id": previous});
    for _ in 0..3 {
        fake.next([Answer::Status(
            200,
            r#"{"id":"resp_engine2","previous_response_id":"resp_engine1"}"#,
        )]);
        let (status, headers, text) = respond_to(&api, body.clone()).await;
        assert_eq!(status, 200, "{text}");
        assert_eq!(headers["x-kvgate-replica"], "http://b:2");
        // The client sees kvgate's ids, never the engine's.
        let v: serde_json::Value = serde_json::from_str(&text).expect("json");
        assert_eq!(v["previous_response_id"], previous.as_str());
        let id = v["id"].as_str().expect("id");
        let owned = api.forwarder.affinity.resolve(id).expect("issued");
        assert_eq!(
            (owned.owner.as_str(), owned.engine_id.as_str()),
            ("http://b:2", "resp_engine2")
        );
    }
    let seen = fake.seen();
    assert!(seen.iter().all(|s| s.engine == "b:2" && s.path == "/v1/responses"), "{seen:?}");
    // The engine got its own id.
    let sent: serde_json::Value = serde_json::from_slice(&seen[0].body).expect("json");
    assert_eq!(sent["previous_response_id"], "resp_engine1");
    // The owner fails: the client gets its error, no other replica is tried.
    fake.next([Answer::Status(503, r#"{"error":{"message":"overloaded"}}"#)]);
    let (status, _, _) = respond_to(&api, body.clone()).await;
    assert_eq!(status, 503);
    assert_eq!(fake.seen().len(), 4, "no retry elsewhere");
    // An id naming a replica that is not in the fleet: its state is gone.
    let gone = api.forwarder.affinity.issue("http://c:3", "resp_x").expect("id");
    let body = serde_json::json!({"model": model, "input": "next", "previous_response_id": gone});
    let (status, _, text) = respond_to(&api, body).await;
    assert_eq!(status, 404, "{text}");
    assert!(text.contains("state is gone"), "{text}");
    assert_eq!(fake.seen().len(), 4, "no engine asked");
}

#[tokio::test]
async fn a_broken_responses_stream_ends_with_a_responses_error_event_and_rewritten_ids() {
    let (api, fake) = gateway(&["a:1"], |_| {}).await;
    let model = api.pools.all()[0].model.served_name.clone();
    fake.next([Answer::Sse(
        vec![
            (Duration::ZERO, "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_e"),
            (Duration::ZERO, "ngine9\"},\"sequence_number\":0}\n\nevent: response.output_text.delta\n"),
            (Duration::ZERO, "data: {\"type\":\"response.output_text.delta\",\"delta\":\"hi\"}\n\n"),
        ],
        End::Break,
    )]);
    let body = serde_json::json!({"model": model, "input": "hello", "stream": true});
    let (status, _, text) = respond_to(&api, body).await;
    assert_eq!(status, 200);
    assert!(!text.contains("resp_engine9"), "{text}");
    let client_id = api.forwarder.affinity.issue("http://a:1", "resp_engine9").expect("id");
    assert!(text.contains(&client_id), "{text}");
    assert!(text.contains("response.output_text.delta"), "{text}");
    // Its end: a Responses `error` event, no `[DONE]`.
    assert!(text.ends_with("\n\n") && !text.contains("[DONE]"), "{text}");
    let last = text.trim_end().rsplit("\n\n").next().expect("an event");
    assert!(last.starts_with("event: error\ndata: "), "{last}");
    assert!(last.contains("\"sequence_number\":2"), "{last}");
}

#[tokio::test]
async fn a_continued_turn_whose_owner_is_out_of_rotation_is_told_to_come_back() {
    // No probe brings the owner back during the test.
    let (api, fake) = gateway(&["a:1", "b:2"], |c| c.monitor.health_interval_ms = 60_000).await;
    let model = api.pools.all()[0].model.served_name.clone();
    let previous = api.forwarder.affinity.issue("http://b:2", "resp_engine1").expect("id");
    let body =
        serde_json::json!({"model": model, "input": "next", "previous_response_id": previous});
    // The owner refuses the connection: out of rotation at once, and the
    // turn is not sent to `a`.
    fake.next([Answer::Refuse]);
    let (status, _, _) = respond_to(&api, body.clone()).await;
    assert_eq!(status, 502);
    assert_eq!(health(&api, "b:2"), Health::Down);
    // The next turn: a 503 that asks to come back, and no engine asked.
    let (status, headers, text) = respond_to(&api, body).await;
    assert_eq!(status, 503, "{text}");
    assert!(headers.contains_key("retry-after"), "{headers:?}");
    assert!(text.contains("out of rotation"), "{text}");
    assert!(fake.seen().iter().all(|s| s.engine == "b:2"), "{:?}", fake.seen());
    assert_eq!(fake.seen().len(), 1);
}

/// A split request places through the admission queue like any other:
/// while its pool's only decode replica is busy it waits, sending nothing,
/// and once the replica has room it is split (prefill hop, then decode
/// hop), not sent whole.
#[tokio::test]
async fn a_split_request_waits_in_admission_and_is_split_once_decode_has_room() {
    let (api, fake) = gateway(&["p:1", "d:2"], |c| {
        c.monitor.health_interval_ms = 86_400_000;
        c.monitor.metrics_interval_ms = 86_400_000;
        c.replicas[0].role = crate::config::Role::Prefill;
        c.replicas[1].role = crate::config::Role::Decode;
        c.disagg.mode = crate::config::SplitMode::Always;
        c.router.busy_kv_usage = 0.9;
    })
    .await;
    let scrape = |kv_usage: f64| kvgate_fleet::EngineScrape {
        kv_usage,
        block_size: Some(16),
        num_gpu_blocks: Some(1_000),
        ..kvgate_fleet::EngineScrape::default()
    };
    let decode = replica(&api, "d:2").id;
    api.fleet.with(|f| f.probe_succeeded(decode, Ok(scrape(0.95)), Instant::now()));
    fake.next([Answer::Status(
        200,
        r#"{"choices":[],"kv_transfer_params":{"remote_block_ids":[1]}}"#,
    )]);
    let client = Arc::clone(&api);
    let request = tokio::spawn(async move { complete(&client, true).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(fake.seen().is_empty(), "nothing is sent while the decode replica is busy");
    assert!(!request.is_finished());
    api.fleet.with(|f| f.probe_succeeded(decode, Ok(scrape(0.1)), Instant::now()));
    let (status, _, body) = request.await.expect("the request");
    assert_eq!(status, 200, "{body}");
    let seen = fake.seen();
    let hops: Vec<&str> = seen.iter().map(|s| s.engine.as_str()).collect();
    assert_eq!(hops, ["p:1", "d:2"], "split: the prefill hop, then the decode hop");
    let prefill: serde_json::Value = serde_json::from_slice(&seen[0].body).expect("json");
    assert_eq!(prefill["kv_transfer_params"]["do_remote_decode"], true);
    let decoded: serde_json::Value = serde_json::from_slice(&seen[1].body).expect("json");
    assert_eq!(decoded["kv_transfer_params"]["remote_block_ids"], serde_json::json!([1]));
}
