//! What the endpoint picker adds to a request, measured as a gateway sees
//! it: this bench plays Envoy's side of ext_proc against the release
//! `kvgate epp` in its own process, in front of simulated replicas.
//!
//! 1. `chat4k`: distinct ~4k-token chats, one at a time: the time from
//!    opening the stream (headers and body sent) to the headers response
//!    (the pick), and the picker's whole-process CPU per request; then the
//!    same kind of requests through `kvgate serve` (non-streamed, one output
//!    token), for the proxy's CPU per request side by side.
//! 2. `long`: a 220 KB text prompt on `/v1/completions` from 150 streams
//!    at once, closed loop (the Gateway API Inference Extension's
//!    reference picker adds 1.1 s at this point, GIE #2928): the pick's
//!    p50/p99 and the picks per second.
//!
//! 3. `streamed`: whole exchanges, 4k-token chats streaming 64 tokens, the
//!    bench carrying the request to the engine named and passing every
//!    response chunk through the picker (FULL_DUPLEX_STREAMED both ways),
//!    against the same through the proxy: CPU per request of each.
//!
//! In 1 and 2 each stream is closed once the body has come back, so its
//! booking is released at once (the engines are not asked: the pick is what
//! is measured).
//!
//! ```text
//! cargo build --release -p kvgate && cargo run --release -p kvgate --example epp_latency [-- N]
//! ```

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::config::core::v3::{HeaderMap, HeaderValue};
use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_client::ExternalProcessorClient;
use envoy_types::pb::envoy::service::ext_proc::v3::processing_request::Request as Msg;
use envoy_types::pb::envoy::service::ext_proc::v3::processing_response::Response as Reply;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    body_mutation, HttpBody, HttpHeaders, ProcessingRequest,
};
use serde_json::json;
use tokio::sync::mpsc;
use tonic::transport::Channel;

use kvgate_alloc as _;

use kvgate_live::cpu_seconds;

mod bench_support;
use bench_support::{
    free_ports, long_chat, spawn_epp, spawn_gateway, start_sims, wait_ready, MODEL,
};

/// Envoy's body chunks are at most this large on the wire.
const CHUNK: usize = 64 << 10;

fn headers(path: &str) -> HttpHeaders {
    let h = [(":method", "POST"), (":path", path), ("content-type", "application/json")];
    let headers = h
        .iter()
        .map(|(k, v)| HeaderValue {
            key: (*k).to_owned(),
            value: String::new(),
            raw_value: v.as_bytes().to_vec(),
        })
        .collect();
    HttpHeaders { headers: Some(HeaderMap { headers }), ..HttpHeaders::default() }
}

/// One pick: the time from sending the headers to the headers response.
async fn pick(client: &ExternalProcessorClient<Channel>, path: &str, body: &[u8]) -> Duration {
    let (tx, rx) = mpsc::channel::<ProcessingRequest>(64);
    let out =
        futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|m| (m, rx)) });
    let mut client = client.clone();
    let t0 = Instant::now();
    let msg = |m| ProcessingRequest { request: Some(m), ..ProcessingRequest::default() };
    tx.send(msg(Msg::RequestHeaders(headers(path)))).await.unwrap();
    let chunks: Vec<&[u8]> = body.chunks(CHUNK).collect();
    for (i, c) in chunks.iter().enumerate() {
        let b = HttpBody {
            body: c.to_vec(),
            end_of_stream: i + 1 == chunks.len(),
            ..HttpBody::default()
        };
        tx.send(msg(Msg::RequestBody(b))).await.unwrap();
    }
    let mut inbound = client.process(out).await.unwrap().into_inner();
    let first = inbound.message().await.unwrap().and_then(|r| r.response);
    let dt = t0.elapsed();
    match first {
        Some(Reply::RequestHeaders(_)) => {}
        other => panic!("the picker refused: {other:?}"),
    }
    // The body comes back; then the gateway would forward it.
    loop {
        let r = inbound.message().await.unwrap().and_then(|r| r.response);
        let Some(Reply::RequestBody(b)) = r else { panic!("expected the body") };
        let m = b.response.and_then(|c| c.body_mutation).and_then(|m| m.mutation);
        let Some(body_mutation::Mutation::StreamedResponse(s)) = m else { panic!("not streamed") };
        if s.end_of_stream {
            break;
        }
    }
    drop(tx);
    dt
}

/// One whole exchange as a gateway makes it: the pick, the request to the
/// endpoint named (with the headers and body the picker gave), and the
/// engine's streamed answer passed through the picker chunk by chunk, as in
/// FULL_DUPLEX_STREAMED response mode. Returns the chunks relayed.
async fn exchange(
    client: &ExternalProcessorClient<Channel>,
    http: &reqwest::Client,
    path: &str,
    body: &[u8],
) -> usize {
    let (tx, rx) = mpsc::channel::<ProcessingRequest>(64);
    let out =
        futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|m| (m, rx)) });
    let mut client = client.clone();
    let msg = |m| ProcessingRequest { request: Some(m), ..ProcessingRequest::default() };
    tx.send(msg(Msg::RequestHeaders(headers(path)))).await.unwrap();
    let b = HttpBody { body: body.to_vec(), end_of_stream: true, ..HttpBody::default() };
    tx.send(msg(Msg::RequestBody(b))).await.unwrap();
    let mut inbound = client.process(out).await.unwrap().into_inner();
    let Some(Reply::RequestHeaders(h)) = inbound.message().await.unwrap().and_then(|r| r.response)
    else {
        panic!("the picker refused")
    };
    let set = h.response.and_then(|c| c.header_mutation).map(|m| m.set_headers).unwrap_or_default();
    let endpoint = set
        .iter()
        .filter_map(|o| o.header.as_ref())
        .find(|h| h.key == "x-gateway-destination-endpoint")
        .map(|h| String::from_utf8_lossy(&h.raw_value).split(',').next().unwrap_or("").to_owned())
        .expect("an endpoint");
    let mut forwarded = Vec::new();
    loop {
        let r = inbound.message().await.unwrap().and_then(|r| r.response);
        let Some(Reply::RequestBody(b)) = r else { panic!("expected the body") };
        let m = b.response.and_then(|c| c.body_mutation).and_then(|m| m.mutation);
        let Some(body_mutation::Mutation::StreamedResponse(s)) = m else { panic!("not streamed") };
        forwarded.extend_from_slice(&s.body);
        if s.end_of_stream {
            break;
        }
    }
    let mut resp = http
        .post(format!("http://{endpoint}{path}"))
        .header("content-type", "application/json")
        .body(forwarded)
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16().to_string();
    let h = HttpHeaders {
        headers: Some(HeaderMap {
            headers: [(":status", status.as_str()), ("content-type", "text/event-stream")]
                .iter()
                .map(|(k, v)| HeaderValue {
                    key: (*k).into(),
                    value: String::new(),
                    raw_value: v.as_bytes().to_vec(),
                })
                .collect(),
        }),
        ..HttpHeaders::default()
    };
    tx.send(msg(Msg::ResponseHeaders(h))).await.unwrap();
    inbound.message().await.unwrap();
    // Full duplex, as Envoy does it: each chunk goes to the picker as the
    // engine sends it, without waiting for the picker's echo of the last.
    let feeder = tokio::spawn(async move {
        let mut chunks = 0;
        loop {
            let c = resp.chunk().await.unwrap();
            let end = c.is_none();
            let body = c.map(|c| c.to_vec()).unwrap_or_default();
            let b = HttpBody { body, end_of_stream: end, ..HttpBody::default() };
            tx.send(msg(Msg::ResponseBody(b))).await.unwrap();
            if end {
                return (chunks, tx);
            }
            chunks += 1;
        }
    });
    loop {
        let r = inbound.message().await.unwrap().and_then(|r| r.response);
        let Some(Reply::ResponseBody(b)) = r else { panic!("expected a body echo") };
        let m = b.response.and_then(|c| c.body_mutation).and_then(|m| m.mutation);
        let Some(body_mutation::Mutation::StreamedResponse(s)) = m else { panic!("not streamed") };
        if s.end_of_stream {
            break;
        }
    }
    let (chunks, tx) = feeder.await.unwrap();
    drop(tx);
    chunks
}

/// A distinct ~4k-token chat body (as `serve_overhead` sends), one output
/// token.
fn long_chat_body(i: usize) -> serde_json::Value {
    json!({"model": MODEL, "max_tokens": 1, "messages": long_chat(i)})
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * p).round() as usize]
}

/// The picker's own measures: tokenize and decide seconds, pick seconds,
/// picks, and picks under 200 µs (its `kvgate_epp_pick_seconds` bucket).
async fn own_sums(http: &reqwest::Client, base: &str) -> [f64; 5] {
    let text = http.get(format!("{base}/metrics")).send().await.unwrap().text().await.unwrap();
    let sum = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    [
        sum("kvgate_tokenize_seconds_sum "),
        sum("kvgate_decide_seconds_sum "),
        sum("kvgate_epp_pick_seconds_sum "),
        sum("kvgate_epp_pick_seconds_count "),
        sum("kvgate_epp_pick_seconds_bucket{le=\"0.0002\"} "),
    ]
}

/// CPU of `pid` per second while nothing is asked of it.
async fn idle_rate(pid: u32) -> f64 {
    let (c0, t0) = (cpu_seconds(pid), Instant::now());
    tokio::time::sleep(Duration::from_secs(2)).await;
    (cpu_seconds(pid) - c0) / t0.elapsed().as_secs_f64()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let n: usize = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(200);
    // The 220 KB prompt is ~50k tokens: allow it.
    std::env::set_var(
        "KVGATE_BENCH_SET",
        "model.max_model_len=131072 limits.max_concurrent_requests=1024",
    );
    let sims = start_sims(4, 65_536, 1000.0).await;
    let http = reqwest::Client::builder().no_proxy().build().unwrap();

    // 1. chat4k through the picker.
    let (grpc, web) = free_ports();
    let (admin, _) = free_ports();
    let mut epp = spawn_epp(&sims, grpc, web, admin);
    wait_ready(&http, &format!("http://127.0.0.1:{web}")).await;
    // The picker's /metrics is behind no key here (loopback, no keys).
    let client =
        ExternalProcessorClient::connect(format!("http://127.0.0.1:{grpc}")).await.unwrap();
    let pid = epp.id();
    for i in 0..5 {
        pick(
            &client,
            "/v1/chat/completions",
            &serde_json::to_vec(&long_chat_body(1_000_000 + i)).unwrap(),
        )
        .await;
    }
    let idle = idle_rate(pid).await;
    let bodies: Vec<Vec<u8>> =
        (0..n).map(|i| serde_json::to_vec(&long_chat_body(i)).unwrap()).collect();
    let web_base = format!("http://127.0.0.1:{web}");
    let sums0 = own_sums(&http, &web_base).await;
    let (c0, t0) = (cpu_seconds(pid), Instant::now());
    let mut lat = Vec::new();
    for b in &bodies {
        lat.push(pick(&client, "/v1/chat/completions", b).await.as_secs_f64() * 1e3);
    }
    let wall = t0.elapsed().as_secs_f64();
    let epp_cpu = ((cpu_seconds(pid) - c0) - idle * wall) / n as f64 * 1e3;
    let sums1 = own_sums(&http, &web_base).await;
    let d: Vec<f64> = sums1.iter().zip(&sums0).map(|(a, b)| a - b).collect();
    println!(
        "(the picker's own measures: stream open → headers response mean {:.3} ms, {:.0} % under 200 µs; tokenize {:.3} ms, decide {:.3} ms per request)",
        d[2] / d[3] * 1e3,
        d[4] / d[3] * 100.0,
        d[0] / n as f64 * 1e3,
        d[1] / n as f64 * 1e3
    );
    println!(
        "chat4k through the picker ({n} distinct ~4k-token chats, one at a time): pick p50 {:.3} ms, p90 {:.3} ms, p99 {:.3} ms; picker CPU {epp_cpu:.3} ms/request",
        pct(&mut lat, 0.5),
        pct(&mut lat, 0.9),
        pct(&mut lat, 0.99)
    );

    // 2. 220 KB prompts from 150 streams at once.
    let prompt = "The history of the river valley is long and full of small events. ".repeat(3_300);
    let body = Arc::new(
        serde_json::to_vec(
            &json!({"model": MODEL, "prompt": prompt, "max_tokens": 1, "stream": true}),
        )
        .unwrap(),
    );
    println!("long: body {} bytes", body.len());
    pick(&client, "/v1/completions", &body).await;
    let total = (n * 5).max(750);
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (c0, t0) = (cpu_seconds(pid), Instant::now());
    let mut tasks = Vec::new();
    for _ in 0..150 {
        let (client, body, next) = (client.clone(), Arc::clone(&body), Arc::clone(&next));
        tasks.push(tokio::spawn(async move {
            let mut out = Vec::new();
            while next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) < total {
                out.push(pick(&client, "/v1/completions", &body).await.as_secs_f64() * 1e3);
            }
            out
        }));
    }
    let mut lat = Vec::new();
    for t in tasks {
        lat.extend(t.await.unwrap());
    }
    let wall = t0.elapsed().as_secs_f64();
    let cpu = ((cpu_seconds(pid) - c0) - idle * wall) / total as f64 * 1e3;
    println!(
        "long through the picker (220 KB prompt, 150 streams, {total} picks): pick p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms; {:.0} picks/s; picker CPU {cpu:.3} ms/pick",
        pct(&mut lat, 0.5),
        pct(&mut lat, 0.99),
        pct(&mut lat, 1.0),
        total as f64 / wall
    );
    // 3. Whole exchanges through the picker: 4k-token chats streaming 64
    // tokens, every chunk passed through the picker.
    let streamed = |i: usize| {
        let mut b = long_chat_body(i);
        b["max_tokens"] = json!(64);
        b["stream"] = json!(true);
        serde_json::to_vec(&b).unwrap()
    };
    let m = n / 2;
    let (c0, t0) = (cpu_seconds(pid), Instant::now());
    let mut relayed = 0;
    for i in 0..m {
        relayed += exchange(&client, &http, "/v1/chat/completions", &streamed(3_000_000 + i)).await;
    }
    let wall = t0.elapsed().as_secs_f64();
    let epp_full = ((cpu_seconds(pid) - c0) - idle * wall) / m as f64 * 1e3;
    println!(
        "streamed 4k-token chats through the picker ({m}, 64 output tokens, {:.0} chunks each through it): picker CPU {epp_full:.3} ms/request",
        relayed as f64 / m as f64
    );
    let _ = epp.kill();
    let _ = epp.wait();

    // 3. The same kind of chats through the proxy.
    let (port, admin) = free_ports();
    let mut gw = spawn_gateway(&sims, port, admin);
    let base = format!("http://127.0.0.1:{port}");
    wait_ready(&http, &base).await;
    let url = format!("{base}/v1/chat/completions");
    for i in 0..5 {
        http.post(&url)
            .json(&long_chat_body(2_000_000 + i))
            .send()
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap();
    }
    let pid = gw.id();
    let idle = idle_rate(pid).await;
    let (c0, t0) = (cpu_seconds(pid), Instant::now());
    for i in 0..n {
        let r = http.post(&url).json(&long_chat_body(n + i)).send().await.unwrap();
        assert!(r.status().is_success());
        r.bytes().await.unwrap();
    }
    let wall = t0.elapsed().as_secs_f64();
    let proxy_cpu = ((cpu_seconds(pid) - c0) - idle * wall) / n as f64 * 1e3;
    println!(
        "chat4k through the proxy (non-streamed, 1 output token): gateway CPU {proxy_cpu:.3} ms/request; picker ÷ proxy {:.2}",
        epp_cpu / proxy_cpu
    );
    let (c0, t0) = (cpu_seconds(pid), Instant::now());
    for i in 0..m {
        let mut b = long_chat_body(4_000_000 + i);
        b["max_tokens"] = json!(64);
        b["stream"] = json!(true);
        let r = http.post(&url).json(&b).send().await.unwrap();
        assert!(r.status().is_success());
        r.bytes().await.unwrap();
    }
    let wall = t0.elapsed().as_secs_f64();
    let proxy_full = ((cpu_seconds(pid) - c0) - idle * wall) / m as f64 * 1e3;
    println!(
        "streamed 4k-token chats through the proxy ({m}, 64 output tokens): gateway CPU {proxy_full:.3} ms/request; picker ÷ proxy {:.2}",
        epp_full / proxy_full
    );
    let _ = gw.kill();
    let _ = gw.wait();
}
