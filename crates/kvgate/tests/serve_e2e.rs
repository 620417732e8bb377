//! `kvgate serve` end to end, over real HTTP and ZMQ, against simulated vLLM
//! replicas: in-process `kvgate_sim::server` replicas (KV events bound on
//! 127.0.0.1) for most tests, spawned `kvgate sim` / `kvgate serve`
//! processes where a process has to die or exit.
//!
//! Nothing binds a non-loopback address: in-process publishers use
//! `force_bind` on 127.0.0.1, spawned sims bind `tcp://[::1]:0` (vLLM's rule
//! binds endpoints containing `::`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kvgate_events::publisher::PublisherConfig;
use kvgate_gateway::{Gateway, GatewayConfig, Passthrough};
use kvgate_sim::server::{start, Replica, ServerConfig};
use kvgate_sim::{EngineConfig, TimingModel};
use kvgate_tokenize::service::{Tokenize, TokenizeService};
use kvgate_tokenize::ChatTokenizer;
use serde_json::{json, Value};
use support::{gw_config, kvgate_cmd, replica_cfg, run_sim, Kill};
use tokio::net::TcpListener;

const MODEL: &str = "Qwen/Qwen3-0.6B";
const CLIENT_KEY: &str = "test-key-123456";
const ADMIN_KEY: &str = "admin-key-654321";

// ---------------------------------------------------------------- helpers

fn client() -> reqwest::Client {
    reqwest::Client::builder().no_proxy().timeout(Duration::from_secs(30)).build().unwrap()
}

fn tokenizer() -> Arc<TokenizeService> {
    let t = ChatTokenizer::bundled().unwrap();
    Arc::new(TokenizeService::new(Tokenize::new(t, None), 1).unwrap())
}

#[derive(Clone, Debug)]
struct SimOpts {
    speedup: f64,
    timing: &'static str,
    drop_rate: f64,
    replay: bool,
}

impl Default for SimOpts {
    fn default() -> Self {
        SimOpts { speedup: 20.0, timing: "dynamo_mocker", drop_rate: 0.0, replay: true }
    }
}

/// One in-process simulated replica with KV events bound on loopback.
async fn start_sim(tok: &Arc<TokenizeService>, o: &SimOpts) -> Replica {
    let mut events = PublisherConfig::new("tcp://127.0.0.1:0");
    events.force_bind = true;
    events.replay_endpoint = o.replay.then(|| "tcp://127.0.0.1:0".to_owned());
    events.drop_rate = o.drop_rate;
    let config = ServerConfig {
        engine: EngineConfig {
            timing: TimingModel::preset(o.timing).unwrap(),
            ..Default::default()
        },
        speedup: o.speedup,
        events: Some(events),
        ..ServerConfig::default()
    };
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    start(config, listener, Arc::clone(tok)).await.unwrap()
}

async fn start_sims(n: usize, o: &SimOpts) -> Vec<Replica> {
    let tok = tokenizer();
    let mut v = Vec::new();
    for _ in 0..n {
        v.push(start_sim(&tok, o).await);
    }
    v
}

fn names(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("sim-{i}")).collect()
}

struct Gw {
    _gw: Gateway,
    base: String,
    admin: String,
}

async fn start_gw(c: GatewayConfig, key: Option<&str>) -> Gw {
    let gw = Gateway::start(c).await.unwrap();
    let base = format!("http://{}", gw.local_addr());
    let admin = gw.admin_addr().map_or_else(|| base.clone(), |a| format!("http://{a}"));
    wait_ready(&base, key).await;
    Gw { _gw: gw, base, admin }
}

/// Polls `/ready` until it answers 200.
async fn wait_ready(base: &str, key: Option<&str>) {
    let c = client();
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut last = String::new();
    while Instant::now() < deadline {
        let mut rb = c.get(format!("{base}/ready"));
        if let Some(k) = key {
            rb = rb.bearer_auth(k);
        }
        if let Ok(r) = rb.send().await {
            let ok = r.status() == 200;
            last = r.text().await.unwrap_or_default();
            if ok {
                return;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("kvgate at {base} never became ready: {last}");
}

/// `/admin/replicas` (`replicas` array), with the admin key when given.
async fn admin_replicas(admin: &str, key: Option<&str>) -> Vec<Value> {
    let mut rb = client().get(format!("{admin}/admin/replicas"));
    if let Some(k) = key {
        rb = rb.header("x-kvgate-admin-key", k);
    }
    let r = rb.send().await.unwrap();
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    v["replicas"].as_array().unwrap().clone()
}

fn by_name<'a>(replicas: &'a [Value], name: &str) -> &'a Value {
    replicas.iter().find(|r| r["name"] == name).unwrap_or_else(|| panic!("no {name}: {replicas:?}"))
}

/// One sample of a replica's `/metrics` (vLLM exposition).
async fn sim_metric(url: &str, name: &str) -> f64 {
    let text = client().get(format!("{url}/metrics")).send().await.unwrap().text().await.unwrap();
    kvgate_sim::server::metrics::scrape(&text, name)
        .unwrap_or_else(|| panic!("{name} missing at {url}/metrics"))
}

struct Answer {
    status: u16,
    replica: Option<String>,
    content_type: String,
    body: String,
}

impl Answer {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", self.body))
    }
}

async fn post_raw(url: &str, key: Option<&str>, body: Vec<u8>) -> Answer {
    let mut rb = client().post(url).header("content-type", "application/json").body(body.clone());
    if let Some(k) = key {
        rb = rb.bearer_auth(k);
    }
    let r = rb.send().await.unwrap();
    let status = r.status().as_u16();
    let replica = r.headers().get("x-kvgate-replica").map(|v| v.to_str().unwrap().to_owned());
    let content_type =
        r.headers().get("content-type").map(|v| v.to_str().unwrap().to_owned()).unwrap_or_default();
    let body = r.text().await.unwrap();
    Answer { status, replica, content_type, body }
}

async fn post(url: &str, body: &Value) -> Answer {
    post_raw(url, None, serde_json::to_vec(body).unwrap()).await
}

/// The `data:` payloads of an SSE body, one per event.
fn sse_data(body: &str) -> Vec<String> {
    body.split("\n\n")
        .filter(|e| !e.trim().is_empty())
        .map(|e| {
            e.lines()
                .filter_map(|l| l.strip_prefix("data:"))
                .map(|d| d.strip_prefix(' ').unwrap_or(d))
                .collect::<Vec<_>>()
                .join("\n")
        })
        .collect()
}

/// A well-formed SSE body: every event a JSON object, ending with exactly
/// one `data: [DONE]`. Returns the JSON events.
fn check_sse(body: &str) -> Vec<Value> {
    assert!(body.ends_with("data: [DONE]\n\n"), "SSE body does not end with [DONE]: {body:?}");
    let data = sse_data(body);
    assert_eq!(data.iter().filter(|d| *d == "[DONE]").count(), 1, "{body:?}");
    data[..data.len() - 1]
        .iter()
        .map(|d| {
            let v: Value = serde_json::from_str(d)
                .unwrap_or_else(|e| panic!("SSE event is not JSON ({e}): {d:?} in {body:?}"));
            assert!(v.is_object(), "{d}");
            v
        })
        .collect()
}

/// Why `a` is not an OpenAI-style 4xx error, if it is not.
fn openai_error_problem(a: &Answer) -> Option<String> {
    if !(400..500).contains(&a.status) {
        return Some(format!("expected 4xx, got {}", a.status));
    }
    let Ok(v) = serde_json::from_str::<Value>(&a.body) else {
        return Some("the error body is not JSON".into());
    };
    if v["error"]["message"].as_str().is_none_or(str::is_empty) {
        return Some("no error.message".into());
    }
    if v["error"]["type"].as_str().is_none_or(str::is_empty) {
        return Some("no error.type".into());
    }
    None
}

fn chat_body(messages: Value, max_tokens: u32) -> Value {
    json!({"model": MODEL, "messages": messages, "max_tokens": max_tokens})
}

/// A `kvgate sim` process: (process, http url, events endpoint, replay endpoint).
fn spawn_sim(args: &[&str]) -> (Kill, String, String, String) {
    let mut cmd = kvgate_cmd();
    cmd.args(["sim", "--port", "0", "--events", "tcp://[::1]:0", "--replay", "tcp://127.0.0.1:0"])
        .args(args);
    let sim = run_sim(&mut cmd);
    (sim.proc, sim.url, sim.events, sim.replay.expect("the sim was given --replay"))
}

// ------------------------------------------------------------------ tests

/// 1. The official request shapes, streaming and not, through kvgate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_and_completions_in_official_shapes() {
    let sims = start_sims(2, &SimOpts::default()).await;
    let names = names(2);
    let cfgs = sims.iter().zip(&names).map(|(s, n)| replica_cfg(n, s)).collect();
    let gw = start_gw(gw_config(cfgs), None).await;
    let chat_url = format!("{}/v1/chat/completions", gw.base);
    let cmpl_url = format!("{}/v1/completions", gw.base);
    let named = |a: &Answer| {
        let r = a.replica.clone().unwrap_or_else(|| panic!("no x-kvgate-replica: {}", a.body));
        assert!(names.contains(&r), "x-kvgate-replica {r:?} names no replica");
    };
    let messages = json!([
        {"role": "system", "content": "You are a terse assistant."},
        {"role": "user", "content": "Say hello to the world."}
    ]);

    // Chat, whole response.
    let a = post(&chat_url, &chat_body(messages.clone(), 5)).await;
    assert_eq!(a.status, 200, "{}", a.body);
    named(&a);
    assert!(a.content_type.starts_with("application/json"), "{}", a.content_type);
    let v = a.json();
    assert_eq!(v["object"], "chat.completion", "{v}");
    assert_eq!(v["model"], MODEL);
    assert_eq!(v["choices"][0]["message"]["role"], "assistant", "{v}");
    assert!(v["choices"][0]["message"]["content"].as_str().is_some_and(|c| !c.is_empty()), "{v}");
    assert_eq!(v["choices"][0]["finish_reason"], "length", "{v}");
    assert_eq!(v["usage"]["completion_tokens"], 5, "{v}");
    let chat_prompt_tokens = v["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(chat_prompt_tokens > 10, "{v}");

    // Chat, streamed, with the usage chunk.
    let mut body = chat_body(messages.clone(), 5);
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let a = post(&chat_url, &body).await;
    assert_eq!(a.status, 200, "{}", a.body);
    named(&a);
    assert!(a.content_type.starts_with("text/event-stream"), "{}", a.content_type);
    let events = check_sse(&a.body);
    assert!(events.iter().all(|e| e["object"] == "chat.completion.chunk"), "{}", a.body);
    let text: String =
        events.iter().filter_map(|e| e["choices"][0]["delta"]["content"].as_str()).collect();
    assert!(!text.is_empty(), "{}", a.body);
    let usage: Vec<&Value> = events.iter().filter(|e| !e["usage"].is_null()).collect();
    assert_eq!(usage.len(), 1, "exactly one usage chunk expected: {}", a.body);
    assert_eq!(usage[0]["usage"]["completion_tokens"], 5, "{}", a.body);
    assert_eq!(usage[0]["usage"]["prompt_tokens"], chat_prompt_tokens, "{}", a.body);
    assert_eq!(usage[0]["choices"], json!([]), "{}", a.body);
    assert!(events.last().unwrap()["usage"].is_object(), "usage chunk must come last");

    // Chat, streamed, no usage asked: no usage chunk.
    body["stream_options"] = json!({"include_usage": false});
    let a = post(&chat_url, &body).await;
    assert_eq!(a.status, 200, "{}", a.body);
    let events = check_sse(&a.body);
    assert!(events.iter().all(|e| e["usage"].is_null()), "{}", a.body);

    // Completions, text prompt, whole response; prompt tokens as /tokenize says.
    let prompt = "The capital of France is";
    let a = post(&cmpl_url, &json!({"model": MODEL, "prompt": prompt, "max_tokens": 4})).await;
    assert_eq!(a.status, 200, "{}", a.body);
    named(&a);
    let v = a.json();
    assert_eq!(v["object"], "text_completion", "{v}");
    assert!(v["choices"][0]["text"].as_str().is_some_and(|t| !t.is_empty()), "{v}");
    assert_eq!(v["usage"]["completion_tokens"], 4, "{v}");
    let t =
        post(&format!("{}/tokenize", gw.base), &json!({"model": MODEL, "prompt": prompt})).await;
    assert_eq!(t.status, 200, "{}", t.body);
    assert_eq!(v["usage"]["prompt_tokens"], t.json()["count"], "{v}");

    // Completions, text prompt, streamed with usage.
    let a = post(
        &cmpl_url,
        &json!({"model": MODEL, "prompt": prompt, "max_tokens": 4, "stream": true,
                "stream_options": {"include_usage": true}}),
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.body);
    named(&a);
    assert!(a.content_type.starts_with("text/event-stream"), "{}", a.content_type);
    let events = check_sse(&a.body);
    assert!(events.iter().all(|e| e["object"] == "text_completion"), "{}", a.body);
    let text: String = events.iter().filter_map(|e| e["choices"][0]["text"].as_str()).collect();
    assert!(!text.is_empty(), "{}", a.body);
    let usage: Vec<&Value> = events.iter().filter(|e| !e["usage"].is_null()).collect();
    assert_eq!(usage.len(), 1, "{}", a.body);
    assert_eq!(usage[0]["usage"]["completion_tokens"], 4, "{}", a.body);

    // Completions, token prompt.
    let ids: Vec<u32> = (1000..1040).collect();
    let a = post(&cmpl_url, &json!({"model": MODEL, "prompt": ids, "max_tokens": 3})).await;
    assert_eq!(a.status, 200, "{}", a.body);
    named(&a);
    let v = a.json();
    assert_eq!(v["usage"]["prompt_tokens"], 40, "{v}");
    assert_eq!(v["usage"]["completion_tokens"], 3, "{v}");

    // Completions, token prompt, streamed.
    let a =
        post(&cmpl_url, &json!({"model": MODEL, "prompt": ids, "max_tokens": 3, "stream": true}))
            .await;
    assert_eq!(a.status, 200, "{}", a.body);
    named(&a);
    let events = check_sse(&a.body);
    assert_eq!(events.len(), 3, "one chunk per token: {}", a.body);
}

/// 1b. A batch of two text prompts in one completions request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completions_batch_of_two_prompts() {
    let sims = start_sims(2, &SimOpts::default()).await;
    let names = names(2);
    let cfgs = sims.iter().zip(&names).map(|(s, n)| replica_cfg(n, s)).collect();
    let gw = start_gw(gw_config(cfgs), None).await;
    let a = post(
        &format!("{}/v1/completions", gw.base),
        &json!({"model": MODEL, "prompt": ["Hello there", "General Kenobi, you are"],
                "max_tokens": 3}),
    )
    .await;
    assert_eq!(a.status, 200, "batch completions: {}", a.body);
    assert!(a.replica.as_ref().is_some_and(|r| names.contains(r)));
    let v = a.json();
    let choices = v["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 2, "{v}");
    let mut idx: Vec<u64> = choices.iter().map(|c| c["index"].as_u64().unwrap()).collect();
    idx.sort_unstable();
    assert_eq!(idx, [0, 1], "{v}");
}

/// 2. Turn 2 of a conversation lands on the replica holding turn 1's prefix
/// and hits its prefix cache; concurrent distinct conversations spread.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_turn_conversations_stick_to_their_prefix() {
    // Real-time llmd timing so that concurrent requests overlap.
    let opts = SimOpts { speedup: 1.0, timing: "llmd_qwen3_32b", ..SimOpts::default() };
    let sims = start_sims(4, &opts).await;
    let names = names(4);
    let cfgs = sims.iter().zip(&names).map(|(s, n)| replica_cfg(n, s)).collect();
    let gw = start_gw(gw_config(cfgs), None).await;
    let chat_url = format!("{}/v1/chat/completions", gw.base);
    let url_of = |name: &str| sims[names.iter().position(|n| n == name).unwrap()].url();

    let system = |conv: usize| -> String {
        let mut s = format!("Conversation {conv}. You are the support assistant of shop {conv}.");
        for i in 0..150 {
            s.push_str(&format!(
                " Rule {i} of shop {conv}: answer questions about item {} politely.",
                i * 7 + conv
            ));
        }
        s
    };
    let turn1 = |conv: usize| {
        json!([
            {"role": "system", "content": system(conv)},
            {"role": "user", "content": format!("Hi, I am customer {conv}. Where is my order?")}
        ])
    };

    // Turn 1 of three conversations at once.
    let futs = (0..3).map(|c| {
        let body = chat_body(turn1(c), 16);
        let url = chat_url.clone();
        async move { post(&url, &body).await }
    });
    let first: Vec<Answer> = futures_util::future::join_all(futs).await;
    let mut placed = Vec::new();
    for (c, a) in first.iter().enumerate() {
        assert_eq!(a.status, 200, "conversation {c} turn 1: {}", a.body);
        placed.push(a.replica.clone().unwrap());
    }
    let mut distinct = placed.clone();
    distinct.sort();
    distinct.dedup();
    assert!(
        distinct.len() >= 2,
        "3 concurrent distinct conversations all landed on one of 4 idle replicas: {placed:?}"
    );

    for c in 0..3 {
        // The system prompt's own token count, as a lower bound of the reuse.
        let t = post(
            &format!("{}/tokenize", gw.base),
            &json!({"prompt": system(c), "add_special_tokens": false}),
        )
        .await;
        let sys_tokens = t.json()["count"].as_u64().unwrap();
        assert!(sys_tokens > 1000, "system prompt too short: {sys_tokens}");
        let reply =
            first[c].json()["choices"][0]["message"]["content"].as_str().unwrap().to_owned();
        let mut messages = turn1(c);
        let m = messages.as_array_mut().unwrap();
        m.push(json!({"role": "assistant", "content": reply}));
        m.push(json!({"role": "user", "content": "Thanks. And when will it arrive?"}));
        let home = &placed[c];
        let hits_before = sim_metric(&url_of(home), "vllm:prefix_cache_hits_total").await;
        let a = post(&chat_url, &chat_body(messages, 8)).await;
        assert_eq!(a.status, 200, "conversation {c} turn 2: {}", a.body);
        assert_eq!(
            a.replica.as_deref(),
            Some(home.as_str()),
            "conversation {c}: turn 2 left the replica holding its prefix"
        );
        let hits_after = sim_metric(&url_of(home), "vllm:prefix_cache_hits_total").await;
        assert!(
            hits_after - hits_before >= (sys_tokens - 16) as f64,
            "conversation {c}: prefix hits rose by {} only (system prompt {sys_tokens} tokens)",
            hits_after - hits_before
        );
        // The choice came from the KV view fed by the replica's events.
        let d: Value = client()
            .get(format!("{}/admin/decisions?limit=1", gw.admin))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let d = &d["decisions"][0];
        assert_eq!(d["chosen"], home.as_str(), "{d}");
        let cand = d["candidates"].as_array().unwrap().iter().find(|c| c["replica"] == *home);
        let overlap = cand.and_then(|c| c["overlap_blocks"]["gpu"].as_u64()).unwrap_or(0);
        assert!(
            overlap + 1 >= sys_tokens / 16,
            "conversation {c}: the index saw {overlap} blocks of {home}'s prefix: {d}"
        );
        let cached = a.json()["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64();
        assert!(cached.is_some_and(|n| n + 16 >= sys_tokens), "cached_tokens {cached:?}");
    }
}

/// 3. With passthrough, the engines never tokenize; with `passthrough=none`
/// they do (the counter works).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passthrough_means_no_tokenization_at_the_engines() {
    let sims = start_sims(3, &SimOpts::default()).await;
    let cfgs = vec![replica_cfg("sim-0", &sims[0]), replica_cfg("sim-1", &sims[1])];
    let gw = start_gw(gw_config(cfgs), None).await;
    let mut none = replica_cfg("sim-2", &sims[2]);
    none.passthrough = Passthrough::None;
    let gw_none = start_gw(gw_config(vec![none]), None).await;

    let traffic = |base: String| async move {
        let chat = format!("{base}/v1/chat/completions");
        let cmpl = format!("{base}/v1/completions");
        let messages = json!([{"role": "user", "content": "Count to three, please."}]);
        for i in 0..3 {
            let mut b = chat_body(messages.clone(), 2);
            b["stream"] = json!(i % 2 == 1);
            let a = post(&chat, &b).await;
            assert_eq!(a.status, 200, "{}", a.body);
            let a = post(
                &cmpl,
                &json!({"model": MODEL, "prompt": format!("Once upon a time {i}"),
                        "max_tokens": 2, "stream": i % 2 == 1}),
            )
            .await;
            assert_eq!(a.status, 200, "{}", a.body);
        }
    };
    traffic(gw.base.clone()).await;
    for (i, s) in sims[..2].iter().enumerate() {
        let n = sim_metric(&s.url(), "kvgate_sim_tokenizations_total").await;
        assert_eq!(n, 0.0, "sim-{i} tokenized {n} prompts despite passthrough");
    }
    let served: f64 = {
        let mut t = 0.0;
        for s in &sims[..2] {
            t += sim_metric(&s.url(), "vllm:generation_tokens_total").await;
        }
        t
    };
    assert!(served >= 12.0, "the traffic did not reach the sims: {served} tokens");

    traffic(gw_none.base.clone()).await;
    let n = sim_metric(&sims[2].url(), "kvgate_sim_tokenizations_total").await;
    assert!(n >= 6.0, "passthrough=none: the engine tokenized only {n} of 6 prompts");
}

/// 4. A replica killed mid-stream: the stream ends with an SSE error event
/// and `[DONE]`; new requests succeed on the survivor; the dead replica is
/// shown `down` within seconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_replica_mid_stream() {
    let sim_args = ["--timing", "llmd_qwen3_32b", "--speedup", "1"];
    let (proc_a, url_a, ev_a, rp_a) = spawn_sim(&sim_args);
    let (proc_b, url_b, ev_b, rp_b) = spawn_sim(&sim_args);
    let mut procs = vec![Some(proc_a), Some(proc_b)];
    // The gateway's log, named in failure messages.
    let log = format!("{}/serve_e2e_killed_replica.log", env!("CARGO_TARGET_TMPDIR"));
    let serve = kvgate_cmd()
        .args(["serve", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"])
        .args(["--replica", &format!("{url_a},events={ev_a},replay={rp_a},name=a")])
        .args(["--replica", &format!("{url_b},events={ev_b},replay={rp_b},name=b")])
        .args([
            "--set",
            "monitor.health_interval_ms=200",
            "--set",
            "monitor.metrics_interval_ms=200",
        ])
        // A generous probe timeout: a loaded test machine must not take the
        // survivor out of rotation (the dead one refuses connections at once).
        .args(["--set", "monitor.probe_timeout_ms=2000", "--set", "model.tokenizer_threads=1"])
        .stdout(Stdio::piped())
        .stderr(Stdio::from(std::fs::File::create(&log).unwrap()))
        .spawn()
        .unwrap();
    let mut serve = Kill(serve);
    let mut lines = BufReader::new(serve.0.stdout.take().unwrap()).lines();
    let line = lines.next().unwrap().unwrap();
    // "kvgate serving on http://ADDR (admin: http://ADDR) with 2 replicas"
    let base = line.split("serving on ").nth(1).unwrap().split(' ').next().unwrap().to_owned();
    let admin = line.split("(admin: ").nth(1).unwrap().split(')').next().unwrap().trim().to_owned();
    assert!(base.starts_with("http://127.0.0.1:") && admin.starts_with("http://127.0.0.1:"));
    wait_ready(&base, None).await;

    // A stream of ~8 s (400 tokens at ~20 ms per step).
    let body = json!({"model": MODEL, "stream": true, "max_tokens": 400,
                      "messages": [{"role": "user", "content": "Tell me a long story."}]});
    let mut resp =
        client().post(format!("{base}/v1/chat/completions")).json(&body).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let victim = resp.headers()["x-kvgate-replica"].to_str().unwrap().to_owned();
    let (dead, alive) = if victim == "a" { (0, "b") } else { (1, "a") };
    assert!(victim == "a" || victim == "b", "{victim}");
    let mut got = Vec::new();
    while sse_data(&String::from_utf8_lossy(&got)).len() < 4 {
        let chunk = tokio::time::timeout(Duration::from_secs(10), resp.chunk())
            .await
            .expect("no stream progress")
            .unwrap()
            .expect("stream ended before the kill");
        got.extend_from_slice(&chunk);
    }
    drop(procs[dead].take()); // SIGKILL, then reaped.
    let killed_at = Instant::now();
    let rest = tokio::time::timeout(Duration::from_secs(10), async {
        let mut rest = Vec::new();
        while let Ok(Some(c)) = resp.chunk().await {
            rest.extend_from_slice(&c);
        }
        rest
    })
    .await
    .expect("the stream did not end after its replica was killed");
    got.extend_from_slice(&rest);
    let text = String::from_utf8(got).unwrap();
    let events = check_sse(&text);
    let last = events.last().unwrap();
    assert!(
        last["error"]["message"].as_str().is_some_and(|m| !m.is_empty()),
        "the stream must end with an error event before [DONE]: {text} (log: {log})"
    );
    assert!(
        events[..events.len() - 1].iter().all(|e| e.get("error").is_none()),
        "one error event only: {text}"
    );
    assert!(
        events.iter().all(|e| e["choices"][0]["finish_reason"] != "length"),
        "the stream was not cut short: {text}"
    );

    // New requests all succeed, on the survivor.
    for i in 0..6 {
        let a = post(
            &format!("{base}/v1/chat/completions"),
            &chat_body(json!([{"role": "user", "content": format!("Question {i}?")}]), 2),
        )
        .await;
        assert_eq!(a.status, 200, "request {i} after the kill: {} (log: {log})", a.body);
        assert_eq!(a.replica.as_deref(), Some(alive), "request {i} (log: {log})");
    }

    // The dead replica is shown down within ~3 s of the kill.
    let deadline = killed_at + Duration::from_secs(3);
    loop {
        let reps = admin_replicas(&admin, None).await;
        let d = by_name(&reps, &victim);
        if d["health"] == "down" {
            assert!(d["reason"].as_str().is_some_and(|r| !r.is_empty()), "{d}");
            assert_eq!(by_name(&reps, alive)["health"], "healthy", "{reps:?} (log: {log})");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{victim} not down 3 s after its kill: {d} (log: {log})"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(procs);
}

/// 5. Lost event batches without replay reset a replica's view: it is shown
/// `degraded` with a reason, and `healthy` again after `monitor.rebuild_ms`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn event_reset_degrades_then_recovers() {
    let tok = tokenizer();
    let good = start_sim(&tok, &SimOpts::default()).await;
    let lossy =
        start_sim(&tok, &SimOpts { drop_rate: 0.5, replay: false, ..SimOpts::default() }).await;
    let mut c = gw_config(vec![replica_cfg("good", &good), replica_cfg("lossy", &lossy)]);
    c.monitor.rebuild_ms = 500;
    c.monitor.health_interval_ms = 100;
    let gw = start_gw(c, None).await;
    let reps = admin_replicas(&gw.admin, None).await;
    assert_eq!(by_name(&reps, "lossy")["health"], "healthy", "{reps:?}");

    // Traffic straight to the lossy engine makes it publish (and lose) batches.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut i = 0u32;
    let degraded = loop {
        let ids: Vec<u32> = (0..48).map(|k| 5000 + i * 100 + k).collect();
        let a = post(
            &format!("{}/v1/completions", lossy.url()),
            &json!({"model": MODEL, "prompt": ids, "max_tokens": 2}),
        )
        .await;
        assert_eq!(a.status, 200, "{}", a.body);
        i += 1;
        let reps = admin_replicas(&gw.admin, None).await;
        let l = by_name(&reps, "lossy").clone();
        if l["health"] == "degraded" {
            assert_eq!(by_name(&reps, "good")["health"], "healthy", "{reps:?}");
            break l;
        }
        assert!(Instant::now() < deadline, "never degraded after {i} requests: {l}");
    };
    let reason = degraded["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("reset"), "degraded without a reset reason: {degraded}");
    assert!(degraded["event_resets"].as_u64().unwrap() >= 1, "{degraded}");

    // Still served while degraded.
    let a = post(
        &format!("{}/v1/completions", gw.base),
        &json!({"model": MODEL, "prompt": "hello", "max_tokens": 2}),
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.body);

    // Quiet now: healthy once rebuild_ms has passed.
    let seen_at = Instant::now();
    loop {
        let reps = admin_replicas(&gw.admin, None).await;
        let l = by_name(&reps, "lossy");
        if l["health"] == "healthy" {
            assert!(l["reason"].is_null(), "{l}");
            break;
        }
        assert_eq!(l["health"], "degraded", "{l}");
        assert!(
            seen_at.elapsed() < Duration::from_millis(500 + 2_000),
            "still degraded {:?} after the last reset (rebuild_ms 500): {l}",
            seen_at.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// 6. Keys on every endpoint.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_on_every_endpoint() {
    let sims = start_sims(1, &SimOpts::default()).await;
    let mut c = gw_config(vec![replica_cfg("sim-0", &sims[0])]);
    c.auth.api_keys = vec![CLIENT_KEY.to_owned()];
    c.auth.admin_key = Some(ADMIN_KEY.to_owned());
    let gw = start_gw(c.clone(), Some(CLIENT_KEY)).await;
    // The same with admin on the API listener.
    c.admin_listen = None;
    let gw_shared = start_gw(c, Some(CLIENT_KEY)).await;
    let http = client();

    let chat = chat_body(json!([{"role": "user", "content": "hi"}]), 2);
    let cmpl = json!({"model": MODEL, "prompt": "hi", "max_tokens": 2});
    let tok = json!({"model": MODEL, "prompt": "hi"});
    let detok = json!({"tokens": [9707]});
    let client_eps: Vec<(&str, &str, Option<Value>)> = vec![
        ("POST", "/v1/chat/completions", Some(chat)),
        ("POST", "/v1/completions", Some(cmpl)),
        ("GET", "/v1/models", None),
        ("POST", "/tokenize", Some(tok)),
        ("POST", "/detokenize", Some(detok)),
        ("GET", "/metrics", None),
    ];
    let send = |method: &str, url: String, body: Option<Value>, auth: Vec<(&str, String)>| {
        let mut rb = match method {
            "GET" => http.get(url),
            "POST" => http.post(url),
            "DELETE" => http.delete(url),
            _ => unreachable!(),
        };
        if let Some(b) = body {
            rb = rb.json(&b);
        }
        for (k, v) in auth {
            rb = rb.header(k, v);
        }
        async move {
            let r = rb.send().await.unwrap();
            let s = r.status().as_u16();
            let www = r.headers().get("www-authenticate").is_some();
            (s, www, r.text().await.unwrap())
        }
    };
    let bearer = |k: &str| vec![("authorization", format!("Bearer {k}"))];
    for base in [&gw.base, &gw_shared.base] {
        for (m, path, body) in &client_eps {
            let url = format!("{base}{path}");
            for (what, auth) in [
                ("no key", vec![]),
                ("wrong key", bearer("test-key-654321")),
                ("admin key", bearer(ADMIN_KEY)),
                ("key not bearer", vec![("authorization", CLIENT_KEY.to_owned())]),
            ] {
                let (s, www, b) = send(m, url.clone(), body.clone(), auth).await;
                assert_eq!(s, 401, "{m} {path} with {what}: {b}");
                assert!(www, "{m} {path} 401 without www-authenticate");
                let v: Value = serde_json::from_str(&b).unwrap();
                assert!(v["error"]["message"].is_string(), "{b}");
            }
            let (s, _, b) = send(m, url, body.clone(), bearer(CLIENT_KEY)).await;
            assert!((200..300).contains(&s), "{m} {path} with the key: {s} {b}");
        }
        for path in ["/health", "/ready"] {
            let (s, _, b) = send("GET", format!("{base}{path}"), None, vec![]).await;
            assert_eq!(s, 200, "{path} without a key: {b}");
        }
    }

    // Admin, on its own listener and on the API listener.
    let add = json!({"url": "http://127.0.0.1:9", "name": "extra"});
    for admin in [&gw.admin, &gw_shared.admin] {
        let eps: Vec<(&str, &str, Option<Value>)> = vec![
            ("GET", "/admin/replicas", None),
            ("GET", "/admin/decisions", None),
            ("POST", "/admin/replicas", Some(add.clone())),
            ("POST", "/admin/replicas/extra/drain", None),
            ("DELETE", "/admin/replicas/extra", None),
        ];
        for (m, path, body) in &eps {
            let url = format!("{admin}{path}");
            for (what, auth) in [
                ("no key", vec![]),
                ("client key", bearer(CLIENT_KEY)),
                ("wrong admin key", vec![("x-kvgate-admin-key", "admin-key-000000".to_owned())]),
            ] {
                let (s, _, b) = send(m, url.clone(), body.clone(), auth).await;
                assert_eq!(s, 401, "{m} {path} with {what}: {b}");
            }
        }
        // In order: list, decisions, add, drain, remove; both header forms.
        for (i, (m, path, body)) in eps.iter().enumerate() {
            let auth = if i % 2 == 0 {
                vec![("x-kvgate-admin-key", ADMIN_KEY.to_owned())]
            } else {
                bearer(ADMIN_KEY)
            };
            let (s, _, b) = send(m, format!("{admin}{path}"), body.clone(), auth).await;
            assert!((200..300).contains(&s), "{m} {path} with the admin key: {s} {b}");
        }
        let reps = admin_replicas(admin, Some(ADMIN_KEY)).await;
        assert!(reps.iter().all(|r| r["name"] != "extra"), "{reps:?}");
    }
}

/// 6b. Exposed without keys: refused at startup, naming the escape hatch.
#[test]
fn serve_on_all_interfaces_without_keys_is_refused() {
    let mut child = kvgate_cmd()
        .args(["serve", "--listen", "0.0.0.0:0", "--admin-listen", "127.0.0.1:0"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("kvgate serve --listen 0.0.0.0:0 without keys kept running");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    assert!(!status.success(), "exited successfully: {err}");
    assert!(err.contains("--allow-unauthenticated"), "stderr: {err}");
}

/// 7. Malformed requests get OpenAI-style 4xx errors, never 5xx.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_requests_get_openai_4xx() {
    let sims = start_sims(1, &SimOpts::default()).await;
    let mut c = gw_config(vec![replica_cfg("sim-0", &sims[0])]);
    c.model.max_model_len = 64;
    c.limits.max_messages = 4;
    let gw = start_gw(c, None).await;
    let chat = format!("{}/v1/chat/completions", gw.base);
    let cmpl = format!("{}/v1/completions", gw.base);
    let user = |t: &str| json!({"role": "user", "content": t});
    let long_text = "word ".repeat(200);
    let raw = |s: &str| s.as_bytes().to_vec();
    let j = |v: Value| serde_json::to_vec(&v).unwrap();
    let mut invalid_utf8 = br#"{"model": "Qwen/Qwen3-0.6B", "max_tokens": 2, "messages": [{"role": "user", "content": "caf"#.to_vec();
    invalid_utf8.extend_from_slice(&[0xff, 0xfe, 0xe9]);
    invalid_utf8.extend_from_slice(br#""}]}"#);
    let mut invalid_utf8_cmpl =
        br#"{"model": "Qwen/Qwen3-0.6B", "max_tokens": 2, "prompt": "caf"#.to_vec();
    invalid_utf8_cmpl.extend_from_slice(&[0xc3, 0x28]);
    invalid_utf8_cmpl.extend_from_slice(br#""}"#);

    // (what, url, body, exact status if it is fixed)
    let cases: Vec<(&str, &String, Vec<u8>, Option<u16>)> = vec![
        (
            "chat: invalid JSON",
            &chat,
            raw(r#"{"model": "Qwen/Qwen3-0.6B", "messages": ["#),
            Some(400),
        ),
        ("chat: empty body", &chat, Vec::new(), Some(400)),
        ("chat: body is an array", &chat, raw("[1, 2, 3]"), Some(400)),
        (
            "chat: messages is a string",
            &chat,
            j(json!({"model": MODEL, "messages": "hi"})),
            Some(400),
        ),
        (
            "chat: max_tokens is a string",
            &chat,
            j(json!({"model": MODEL, "messages": [user("hi")], "max_tokens": "ten"})),
            Some(400),
        ),
        (
            "chat: max_tokens is negative",
            &chat,
            j(json!({"model": MODEL, "messages": [user("hi")], "max_tokens": -5})),
            Some(400),
        ),
        (
            "completions: max_tokens is a string",
            &cmpl,
            j(json!({"model": MODEL, "prompt": "hi", "max_tokens": "ten"})),
            Some(400),
        ),
        (
            "chat: stream is a string",
            &chat,
            j(json!({"model": MODEL, "messages": [user("hi")], "stream": "yes"})),
            Some(400),
        ),
        (
            "chat: message without role",
            &chat,
            j(json!({"model": MODEL, "messages": [{"content": "hi"}], "max_tokens": 2})),
            None,
        ),
        ("chat: missing messages", &chat, j(json!({"model": MODEL, "max_tokens": 2})), Some(400)),
        (
            "chat: unknown model",
            &chat,
            j(json!({"model": "no-such-model", "messages": [user("hi")], "max_tokens": 2})),
            Some(404),
        ),
        (
            "chat: prompt longer than max_model_len",
            &chat,
            j(json!({"model": MODEL, "messages": [user(&long_text)], "max_tokens": 2})),
            Some(400),
        ),
        (
            "chat: max_tokens beyond max_model_len",
            &chat,
            j(json!({"model": MODEL, "messages": [user("hi")], "max_tokens": 1000})),
            Some(400),
        ),
        ("chat: invalid UTF-8", &chat, invalid_utf8, Some(400)),
        (
            "chat: too many messages",
            &chat,
            j(json!({"model": MODEL, "max_tokens": 2,
                     "messages": [user("a"), user("b"), user("c"), user("d"), user("e")]})),
            Some(400),
        ),
        ("completions: invalid JSON", &cmpl, raw(r#"{"prompt": "#), Some(400)),
        (
            "completions: missing prompt",
            &cmpl,
            j(json!({"model": MODEL, "max_tokens": 2})),
            Some(400),
        ),
        (
            "completions: prompt is a number",
            &cmpl,
            j(json!({"model": MODEL, "prompt": 5})),
            Some(400),
        ),
        ("completions: empty prompt", &cmpl, j(json!({"model": MODEL, "prompt": ""})), Some(400)),
        (
            "completions: unknown model",
            &cmpl,
            j(json!({"model": "no-such-model", "prompt": "hi", "max_tokens": 2})),
            Some(404),
        ),
        (
            "completions: text prompt longer than max_model_len",
            &cmpl,
            j(json!({"model": MODEL, "prompt": long_text, "max_tokens": 2})),
            Some(400),
        ),
        (
            "completions: token prompt longer than max_model_len",
            &cmpl,
            j(json!({"model": MODEL, "prompt": (0..100).collect::<Vec<u32>>(), "max_tokens": 2})),
            Some(400),
        ),
        ("completions: invalid UTF-8", &cmpl, invalid_utf8_cmpl, Some(400)),
    ];
    let mut failures = Vec::new();
    for (what, url, body, exact) in cases {
        let a = post_raw(url, None, body).await;
        let problem = openai_error_problem(&a).or_else(|| {
            exact.filter(|&s| s != a.status).map(|s| format!("expected {s}, got {}", a.status))
        });
        if let Some(p) = problem {
            failures.push(format!("{what}: {p}: {}", a.body));
        }
    }
    assert!(failures.is_empty(), "malformed requests answered wrongly:\n{}", failures.join("\n"));

    // The gateway still serves a good request.
    let a = post(&chat, &chat_body(json!([user("hi")]), 2)).await;
    assert_eq!(a.status, 200, "{}", a.body);
}

/// 8. kvgate's `/tokenize` equals the engine's for chat and text bodies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokenize_matches_the_engine() {
    let sims = start_sims(1, &SimOpts::default()).await;
    let gw = start_gw(gw_config(vec![replica_cfg("sim-0", &sims[0])]), None).await;
    let bodies = [
        json!({"model": MODEL, "messages": [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "What is 2 + 2?"},
            {"role": "assistant", "content": "4."},
            {"role": "user", "content": "And times 3? Ünïcödé ✓"}
        ], "add_generation_prompt": true}),
        json!({"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
               "add_generation_prompt": false}),
        json!({"model": MODEL, "prompt": "Hello, world! ✓", "add_special_tokens": true}),
    ];
    for body in &bodies {
        let ours = post(&format!("{}/tokenize", gw.base), body).await;
        let theirs = post(&format!("{}/tokenize", sims[0].url()), body).await;
        assert_eq!(ours.status, 200, "{}", ours.body);
        assert_eq!(theirs.status, 200, "{}", theirs.body);
        let (o, t) = (ours.json(), theirs.json());
        assert!(o["tokens"].as_array().is_some_and(|a| !a.is_empty()), "{o}");
        assert_eq!(o["tokens"], t["tokens"], "tokens differ for {body}");
        assert_eq!(o["count"], t["count"]);
    }
}
