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
use crate::api::ApiContext;
use crate::config::{GatewayConfig, ReplicaConfig};
use crate::engine_fake::{one_token_stream, Answer, End, FakeEngines};

const TOKEN: &str = "data: {\"choices\":[{\"index\":0,\"text\":\"hi\"}]}\n\n";
const DONE: &str = "data: [DONE]\n\n";

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
async fn gateway(
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
        "model": api.model.served_name,
        "prompt": (0..64).collect::<Vec<u32>>(),
        "max_tokens": 4,
        "stream": stream,
    });
    let body = Bytes::from(body.to_string());
    let p = crate::prepare::completions(&api.preparer, body).await.expect("prepared");
    // The permit the shedding layer would have given it (shed.rs).
    let permit =
        Arc::new(Arc::new(tokio::sync::Semaphore::new(1)).try_acquire_owned().expect("permit"));
    let resp = forward(&api.forwarder, p, &HeaderMap::new(), permit, Instant::now()).await;
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let body = axum::body::to_bytes(resp.into_body(), usize::MAX).await.expect("body");
    (status, headers, String::from_utf8(body.to_vec()).expect("utf-8"))
}

fn metrics(api: &ApiContext) -> String {
    api.metrics.render(&api.view.snapshot(Instant::now()))
}

/// The replica named by its engine's URL.
fn replica(api: &ApiContext, engine: &str) -> Arc<crate::replica::Replica> {
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
