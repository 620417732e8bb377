//! The engine server over real HTTP and ZMQ on loopback.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use kvgate_events::publisher::{loopback_endpoint, PublisherConfig};
use kvgate_events::subscriber::{Subscriber, SubscriberConfig, SubscriberMetrics, Update};
use kvgate_events::{Event, Layout};
use kvgate_sim::server::metrics::scrape;
use kvgate_sim::server::{Replica, ServerConfig};
use kvgate_sim::EngineConfig;
use serde_json::{json, Value};
use tokio::sync::mpsc;

mod support;
use support::{replica, MODEL};

fn config() -> ServerConfig {
    ServerConfig {
        engine: EngineConfig { hash_seed: Some(7), ..EngineConfig::default() },
        model: MODEL.to_owned(),
        speedup: 50.0,
        ..ServerConfig::default()
    }
}

async fn post(r: &Replica, path: &str, body: Value) -> Value {
    let resp =
        reqwest::Client::new().post(format!("{}{path}", r.url())).json(&body).send().await.unwrap();
    assert!(resp.status().is_success(), "{path}: {}", resp.status());
    resp.json().await.unwrap()
}

async fn metrics(r: &Replica) -> String {
    reqwest::get(format!("{}/metrics", r.url())).await.unwrap().text().await.unwrap()
}

fn long_text(words: usize) -> String {
    (0..words).map(|i| format!("w{} ", i % 97)).collect()
}

fn chat_body(system: &str, user: &str) -> Value {
    json!({
        "model": MODEL,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
        "max_tokens": 4,
    })
}

fn cached(resp: &Value) -> u64 {
    resp["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_prefix_is_reported_as_cached_tokens() {
    let r = replica(config()).await;
    let system = long_text(1100);
    let a = chat_body(&system, "first question?");
    let b = chat_body(&system, "a different second question?");
    let ta = post(&r, "/tokenize", a.clone()).await["tokens"].clone();
    let tb = post(&r, "/tokenize", b.clone()).await["tokens"].clone();
    let (ta, tb) = (ta.as_array().unwrap(), tb.as_array().unwrap());
    let shared = ta.iter().zip(tb).take_while(|(x, y)| x == y).count() as u64;
    assert!(shared >= 2000, "shared prefix only {shared} tokens");

    let ra = post(&r, "/v1/chat/completions", a).await;
    assert_eq!(ra["object"], "chat.completion");
    assert_eq!(ra["usage"]["prompt_tokens"].as_u64().unwrap(), ta.len() as u64);
    assert_eq!(ra["usage"]["completion_tokens"], 4);
    assert_eq!(cached(&ra), 0);
    let rb = post(&r, "/v1/chat/completions", b).await;
    let full_blocks = shared / 16 * 16;
    assert!(cached(&rb) >= full_blocks, "cached {} < {full_blocks}", cached(&rb));
    assert!(cached(&rb) <= shared);

    let m = metrics(&r).await;
    assert_eq!(scrape(&m, "vllm:prefix_cache_hits_total").unwrap() as u64, cached(&rb));
    assert_eq!(
        scrape(&m, "vllm:prefix_cache_queries_total").unwrap() as u64,
        (ta.len() + tb.len()) as u64
    );
    assert_eq!(scrape(&m, "kvgate_sim_tokenizations_total"), Some(2.0));
    assert!(m.contains("vllm:cache_config_info{block_size=\"16\""));
    assert!(m.contains("num_gpu_blocks=\"8192\""));
    assert_eq!(scrape(&m, "vllm:time_to_first_token_seconds_count"), Some(2.0));
    assert_eq!(scrape(&m, "vllm:num_requests_running"), Some(0.0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passthrough_token_ids_skip_tokenization() {
    let r = replica(config()).await;
    let ids: Vec<u32> = (0..300).collect();
    let mut body = chat_body("ignored", "ignored");
    body["kv_transfer_params"] = json!({"prompt_token_ids": ids});
    let resp = post(&r, "/v1/chat/completions", body).await;
    assert_eq!(resp["usage"]["prompt_tokens"], 300);
    let resp =
        post(&r, "/v1/completions", json!({"model": MODEL, "prompt": ids, "max_tokens": 3})).await;
    assert_eq!(resp["object"], "text_completion");
    assert_eq!(resp["usage"]["prompt_tokens"], 300);
    assert_eq!(resp["usage"]["completion_tokens"], 3);
    assert_eq!(cached(&resp), 288, "the chat request cached 18 full blocks");
    let m = metrics(&r).await;
    assert_eq!(scrape(&m, "kvgate_sim_tokenizations_total"), Some(0.0));

    // A string prompt is tokenized, and counted.
    post(&r, "/v1/completions", json!({"model": MODEL, "prompt": "hello there", "max_tokens": 1}))
        .await;
    assert_eq!(scrape(&metrics(&r).await, "kvgate_sim_tokenizations_total"), Some(1.0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streaming_with_include_usage() {
    let r = replica(config()).await;
    let ids: Vec<u32> = (0..100).collect();
    let body = json!({
        "model": MODEL,
        "messages": [{"role": "user", "content": "x"}],
        "kv_transfer_params": {"prompt_token_ids": ids},
        "stream": true,
        "stream_options": {"include_usage": true},
        "max_tokens": 5,
        "min_tokens": 5,
        "ignore_eos": true,
    });
    let resp = reqwest::Client::new()
        .post(format!("{}/v1/chat/completions", r.url()))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert!(resp.headers()["content-type"].to_str().unwrap().starts_with("text/event-stream"));
    let text = resp.text().await.unwrap();
    let events: Vec<&str> = text
        .split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|e| e.strip_prefix("data: ").unwrap())
        .collect();
    assert_eq!(*events.last().unwrap(), "[DONE]");
    let chunks: Vec<Value> =
        events[..events.len() - 1].iter().map(|e| serde_json::from_str(e).unwrap()).collect();
    // role chunk, 5 content chunks, usage chunk
    assert_eq!(chunks.len(), 7, "{text}");
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    assert_eq!(chunks[5]["choices"][0]["finish_reason"], "length");
    let usage = &chunks[6]["usage"];
    assert_eq!(chunks[6]["choices"], json!([]));
    assert_eq!(usage["prompt_tokens"], 100);
    assert_eq!(usage["completion_tokens"], 5);
    assert_eq!(usage["prompt_tokens_details"]["cached_tokens"], 0);

    // Completions stream too, without usage when not asked.
    let resp = reqwest::Client::new()
        .post(format!("{}/v1/completions", r.url()))
        .json(&json!({"model": MODEL, "prompt": ids, "stream": true, "max_tokens": 2}))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(resp.matches("data: ").count(), 3, "{resp}");
    assert!(!resp.contains("\"usage\""));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_key_is_enforced_on_v1_routes() {
    let r = replica(ServerConfig { api_key: Some("sekrit".into()), ..config() }).await;
    let client = reqwest::Client::new();
    let url = |p: &str| format!("{}{p}", r.url());
    assert_eq!(client.get(url("/v1/models")).send().await.unwrap().status(), 401);
    let wrong = client.get(url("/v1/models")).bearer_auth("nope").send().await.unwrap();
    assert_eq!(wrong.status(), 401);
    let ok = client.get(url("/v1/models")).bearer_auth("sekrit").send().await.unwrap();
    assert_eq!(ok.status(), 200);
    let models: Value = ok.json().await.unwrap();
    assert_eq!(models["data"][0]["id"], MODEL);
    let body = json!({"model": MODEL, "prompt": [1, 2, 3], "max_tokens": 1});
    let resp = client.post(url("/v1/completions")).json(&body).send().await.unwrap();
    assert_eq!(resp.status(), 401);
    let resp =
        client.post(url("/v1/completions")).bearer_auth("sekrit").json(&body).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    // vLLM exempts everything outside /v1.
    assert_eq!(client.get(url("/health")).send().await.unwrap().status(), 200);
    assert_eq!(client.get(url("/metrics")).send().await.unwrap().status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ttft_grows_with_uncached_tokens() {
    // Half speed, so that the client sees the model's step times well
    // above scheduling noise.
    let r = replica(ServerConfig { speedup: 0.5, ..config() }).await;
    async fn ttft(r: &Replica, n: u32, offset: u32) -> Duration {
        let ids: Vec<u32> = (offset..offset + n).collect();
        let body = json!({"model": MODEL, "prompt": ids, "max_tokens": 1});
        let t = std::time::Instant::now();
        post(r, "/v1/completions", body).await;
        t.elapsed()
    }
    let short = ttft(&r, 64, 0).await;
    let long = ttft(&r, 8000, 100_000).await;
    // Dynamo mocker: ~17.5 ms for 64 tokens, ~165 ms for 8000 (doubled here).
    assert!(long > short + Duration::from_millis(150), "short {short:?} long {long:?}");
    // The same long prompt again is a prefix hit: fast again.
    let again = ttft(&r, 8000, 100_000).await;
    assert!(again + Duration::from_millis(150) < long, "again {again:?} long {long:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_prefix_cache_and_model_checks() {
    let r = replica(config()).await;
    let client = reqwest::Client::new();
    let ids: Vec<u32> = (0..64).collect();
    let body = json!({"model": MODEL, "prompt": ids, "max_tokens": 1});
    post(&r, "/v1/completions", body.clone()).await;
    assert_eq!(cached(&post(&r, "/v1/completions", body.clone()).await), 48);
    let resp = client.post(format!("{}/reset_prefix_cache", r.url())).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(cached(&post(&r, "/v1/completions", body).await), 0);
    let wrong = json!({"model": "other", "prompt": [1], "max_tokens": 1});
    let resp =
        client.post(format!("{}/v1/completions", r.url())).json(&wrong).send().await.unwrap();
    assert_eq!(resp.status(), 404);
    let d = post(&r, "/detokenize", json!({"tokens": [9707, 11, 1879]})).await;
    assert!(d["prompt"].as_str().unwrap().starts_with("Hello"));
}

/// Subscribes with replay after the fact: every batch published so far
/// comes back through the replay endpoint.
async fn replayed_events(r: &Replica) -> Vec<Event> {
    let local = r.events().unwrap();
    let mut cfg = SubscriberConfig::new(loopback_endpoint(&local.events));
    cfg.replay_endpoint = local.replay.as_deref().map(loopback_endpoint);
    let (tx, mut rx) = mpsc::channel(10_000);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let sub = Subscriber::new(cfg, Arc::new(SubscriberMetrics::default()), tx);
    tokio::spawn(async move {
        sub.run(async {
            let _ = stopped.await;
        })
        .await
    });
    let mut events = Vec::new();
    loop {
        let u = tokio::time::timeout(Duration::from_secs(10), rx.recv()).await.unwrap().unwrap();
        match u {
            Update::Batch { batch, replayed: true, .. } => events.extend(batch.events),
            Update::Replayed { .. } => break,
            Update::Degraded { reason } => panic!("replay degraded: {reason}"),
            _ => {}
        }
    }
    let _ = stop.send(());
    events
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kv_events_decode_for_each_layout() {
    for layout in Layout::ALL {
        let mut pc = events_config();
        pc.layout = layout;
        let r = replica(ServerConfig {
            engine: EngineConfig {
                hash_seed: Some(7),
                num_gpu_blocks: 8,
                ..EngineConfig::default()
            },
            events: Some(pc),
            ..config()
        })
        .await;
        // 64 prompt tokens = 4 full blocks; a second, different prompt of
        // 96 tokens needs 6 more blocks and evicts the first one's.
        let first: Vec<u32> = (0..64).collect();
        post(&r, "/v1/completions", json!({"model": MODEL, "prompt": first, "max_tokens": 1}))
            .await;
        let second: Vec<u32> = (1000..1096).collect();
        post(&r, "/v1/completions", json!({"model": MODEL, "prompt": second, "max_tokens": 1}))
            .await;
        let events = replayed_events(&r).await;
        let stored: usize = events
            .iter()
            .map(|e| if let Event::Stored(s) = e { s.block_hashes.len() } else { 0 })
            .sum();
        assert!(stored >= 10, "{layout:?}: {stored} stored blocks in {events:?}");
        assert!(
            events.iter().any(|e| matches!(e, Event::Removed(_))),
            "{layout:?}: no BlockRemoved under memory pressure"
        );
        let resp = reqwest::Client::new()
            .post(format!("{}/reset_prefix_cache", r.url()))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        let events = replayed_events(&r).await;
        assert!(matches!(events.last(), Some(Event::AllCleared)), "{layout:?}");
    }
}

fn events_config() -> PublisherConfig {
    let mut pc = PublisherConfig::new("tcp://[::1]:0");
    pc.replay_endpoint = Some("tcp://127.0.0.1:0".into());
    pc
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cpu_tier_emits_cpu_medium_events_and_serves_hits() {
    let r = replica(ServerConfig {
        engine: EngineConfig {
            hash_seed: Some(7),
            num_gpu_blocks: 8,
            num_cpu_blocks: 64,
            ..EngineConfig::default()
        },
        events: Some(events_config()),
        ..config()
    })
    .await;
    let first: Vec<u32> = (0..64).collect();
    let body = json!({"model": MODEL, "prompt": first, "max_tokens": 1});
    post(&r, "/v1/completions", body.clone()).await;
    let second: Vec<u32> = (1000..1096).collect();
    post(&r, "/v1/completions", json!({"model": MODEL, "prompt": second, "max_tokens": 1})).await;
    // The first prompt's blocks were offloaded to CPU: a hit again.
    let again = post(&r, "/v1/completions", body).await;
    assert!(cached(&again) >= 16, "no CPU-tier hit: {again}");
    let events = replayed_events(&r).await;
    let cpu_stored = events
        .iter()
        .any(|e| matches!(e, Event::Stored(s) if s.medium == Some(kvgate_events::Medium::Cpu)));
    assert!(cpu_stored, "no CPU-medium BlockStored in {events:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ttft_grows_with_queue_depth() {
    // One sequence at a time: each request waits for those ahead of it.
    let r = replica(ServerConfig {
        engine: EngineConfig { hash_seed: Some(7), max_num_seqs: 1, ..EngineConfig::default() },
        speedup: 0.5,
        ..config()
    })
    .await;
    let url = format!("{}/v1/completions", r.url());
    let mut handles = Vec::new();
    for i in 0..4u32 {
        let url = url.clone();
        let ids: Vec<u32> = (i * 10_000..i * 10_000 + 1000).collect();
        handles.push(tokio::spawn(async move {
            let t = std::time::Instant::now();
            let body = json!({"model": MODEL, "prompt": ids, "max_tokens": 2});
            let resp = reqwest::Client::new().post(url).json(&body).send().await.unwrap();
            assert!(resp.status().is_success());
            resp.bytes().await.unwrap();
            t.elapsed()
        }));
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let mut times = Vec::new();
    for h in handles {
        times.push(h.await.unwrap());
    }
    // ~32 ms prefill + ~6 ms decode per request (doubled here), served one
    // after another.
    assert!(times[3] > times[0] + Duration::from_millis(60), "{times:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn faults_fail_stall_and_exit() {
    use kvgate_sim::server::Faults;
    let r = replica(ServerConfig {
        faults: Faults { fail_rate: 1.0, ..Faults::default() },
        ..config()
    })
    .await;
    let body = json!({"model": MODEL, "prompt": [1, 2, 3], "max_tokens": 2});
    let resp = reqwest::Client::new()
        .post(format!("{}/v1/completions", r.url()))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 500);

    let r = replica(ServerConfig {
        faults: Faults {
            stall_after_tokens: Some(2),
            exit_after_requests: Some(1),
            ..Faults::default()
        },
        ..config()
    })
    .await;
    let body = json!({"model": MODEL, "prompt": [1, 2, 3], "max_tokens": 5, "stream": true});
    let mut resp = reqwest::Client::new()
        .post(format!("{}/v1/completions", r.url()))
        .json(&body)
        .send()
        .await
        .unwrap();
    let mut text = String::new();
    let stalled = tokio::time::timeout(Duration::from_millis(1500), async {
        while let Some(chunk) = resp.chunk().await.unwrap() {
            text.push_str(std::str::from_utf8(&chunk).unwrap());
        }
    })
    .await;
    assert!(stalled.is_err(), "the stream ended: {text}");
    assert_eq!(text.matches("data: ").count(), 2, "{text}");
    drop(resp);

    // A request that finishes counts towards exit_after_requests.
    let r2 = replica(ServerConfig {
        faults: Faults { exit_after_requests: Some(2), ..Faults::default() },
        ..config()
    })
    .await;
    let body = json!({"model": MODEL, "prompt": [1, 2, 3], "max_tokens": 1});
    post(&r2, "/v1/completions", body.clone()).await;
    let exited = tokio::time::timeout(Duration::from_millis(200), r2.exited()).await;
    assert!(exited.is_err(), "exited after one request");
    post(&r2, "/v1/completions", body).await;
    tokio::time::timeout(Duration::from_secs(5), r2.exited()).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inference_generate_is_token_in_token_out() {
    let r = replica(config()).await;
    let body = json!({"token_ids": [5, 6, 7, 8], "sampling_params": {"max_tokens": 3, "ignore_eos": true}});
    let resp = post(&r, "/inference/v1/generate", body).await;
    let ids = resp["choices"][0]["token_ids"].as_array().unwrap();
    assert_eq!(ids.len(), 3);
    assert_eq!(resp["choices"][0]["finish_reason"], "length");
    assert_eq!(resp["usage"]["prompt_tokens"], 4);
    let body =
        json!({"token_ids": [5, 6, 7, 8], "sampling_params": {"max_tokens": 2}, "stream": true});
    let text = reqwest::Client::new()
        .post(format!("{}/inference/v1/generate", r.url()))
        .json(&body)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(text.matches("\"token_ids\"").count(), 2, "{text}");
    assert!(text.ends_with("data: [DONE]\n\n"));
    assert_eq!(scrape(&metrics(&r).await, "kvgate_sim_tokenizations_total"), Some(0.0));
}

/// `--drop-event-batches`: batches the live subscriber never receives are
/// numbered and buffered, and the subscriber gets every one of them back
/// through replay: what it applied equals what the engine published, batch
/// for batch, with gaps seen and no reset.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_event_batches_are_recovered_by_replay() {
    let mut pc = events_config();
    pc.drop_rate = 0.5;
    pc.drop_seed = 11;
    let r = replica(ServerConfig {
        engine: EngineConfig { hash_seed: Some(7), num_gpu_blocks: 24, ..EngineConfig::default() },
        events: Some(pc),
        ..config()
    })
    .await;
    let local = r.events().unwrap();
    let subscribe = || {
        let mut cfg = SubscriberConfig::new(loopback_endpoint(&local.events));
        cfg.replay_endpoint = local.replay.as_deref().map(loopback_endpoint);
        let (tx, rx) = mpsc::channel(100_000);
        let metrics = Arc::new(SubscriberMetrics::default());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let sub = Subscriber::new(cfg, Arc::clone(&metrics), tx);
        tokio::spawn(async move {
            sub.run(async {
                let _ = stopped.await;
            })
            .await
        });
        (rx, metrics, stop)
    };
    let (mut live_rx, live_metrics, live_stop) = subscribe();
    // Wait for the live subscriber's startup replay (empty) before traffic.
    loop {
        let u =
            tokio::time::timeout(Duration::from_secs(10), live_rx.recv()).await.unwrap().unwrap();
        if matches!(u, Update::Replayed { .. }) {
            break;
        }
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    for i in 0..16u32 {
        let prompt: Vec<u32> = (0..48 + 16 * (i % 4)).map(|t| 10_000 * (i % 5) + t).collect();
        post(&r, "/v1/completions", json!({"model": MODEL, "prompt": prompt, "max_tokens": 3}))
            .await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;

    let drain = |rx: &mut mpsc::Receiver<Update>| {
        let mut batches = std::collections::BTreeMap::new();
        let mut resets = 0;
        while let Ok(u) = rx.try_recv() {
            match u {
                Update::Batch { seq, batch, .. } => {
                    batches.insert(seq, batch.events);
                }
                Update::Reset { .. } => resets += 1,
                _ => {}
            }
        }
        (batches, resets)
    };
    let (live, live_resets) = drain(&mut live_rx);
    let _ = live_stop.send(());

    // A fresh subscriber's startup replay: everything published, in order.
    let (mut full_rx, _, full_stop) = subscribe();
    let mut full = std::collections::BTreeMap::new();
    loop {
        let u =
            tokio::time::timeout(Duration::from_secs(10), full_rx.recv()).await.unwrap().unwrap();
        match u {
            Update::Batch { seq, batch, replayed: true } => {
                full.insert(seq, batch.events);
            }
            Update::Replayed { .. } => break,
            _ => {}
        }
    }
    let _ = full_stop.send(());
    // The live view can only be compared up to the last batch it saw (a
    // dropped tail shows as a gap only when a later batch arrives, as with
    // vLLM).
    let last_live = *live.keys().last().unwrap();
    full.retain(|seq, _| *seq <= last_live);

    assert_eq!(live_resets, 0);
    assert!(
        live_metrics.gaps.load(std::sync::atomic::Ordering::Relaxed) > 0,
        "no batch was dropped"
    );
    assert!(live.len() > 10, "too little traffic: {} batches", live.len());
    assert_eq!(
        live.keys().collect::<Vec<_>>(),
        (0..=last_live).collect::<Vec<_>>().iter().collect::<Vec<_>>()
    );
    // Compare without printing both maps on failure (they are large).
    assert!(live == full, "the live view differs from what was published");
    let text = metrics(&r).await;
    assert!(text.contains("vllm:prefix_cache_queries_total"));
}

/// TTFT and inter-token latency histograms, with vLLM's names, count every
/// first token and every later token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn latency_histograms_count_tokens() {
    let r = replica(config()).await;
    for _ in 0..2 {
        post(
            &r,
            "/v1/completions",
            json!({"model": MODEL, "prompt": [1, 2, 3], "max_tokens": 5, "ignore_eos": true}),
        )
        .await;
    }
    let text = metrics(&r).await;
    assert_eq!(scrape(&text, "vllm:time_to_first_token_seconds_count"), Some(2.0), "{text}");
    assert_eq!(scrape(&text, "vllm:inter_token_latency_seconds_count"), Some(8.0), "{text}");
}

#[tokio::test]
async fn data_parallel_ranks_serve_one_metrics_page_grouped_by_family() {
    let r = replica(ServerConfig { data_parallel_size: 3, ..config() }).await;
    for rank in ["0", "2", "1"] {
        let resp = reqwest::Client::new()
            .post(format!("{}/v1/completions", r.url()))
            .header("x-data-parallel-rank", rank)
            .json(&json!({"model": MODEL, "prompt": [1, 2, 3, 4], "max_tokens": 1}))
            .send()
            .await
            .unwrap();
        assert!(resp.status().is_success());
    }
    let out_of_range = reqwest::Client::new()
        .post(format!("{}/v1/completions", r.url()))
        .header("x-data-parallel-rank", "3")
        .json(&json!({"model": MODEL, "prompt": [1, 2, 3, 4], "max_tokens": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(out_of_range.status(), 400);
    let text = metrics(&r).await;
    let types: Vec<&str> = text.lines().filter(|l| l.starts_with("# TYPE ")).collect();
    let mut unique = types.clone();
    unique.sort_unstable();
    unique.dedup();
    assert_eq!(types.len(), unique.len(), "a family's TYPE repeats");
    // Each family's samples follow its comments: no family appears twice.
    let mut seen = std::collections::HashSet::new();
    let mut last = String::new();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let name = line.split(['{', ' ']).next().unwrap().to_owned();
        let family = name
            .trim_end_matches("_bucket")
            .trim_end_matches("_sum")
            .trim_end_matches("_count")
            .to_owned();
        if family != last {
            assert!(seen.insert(family.clone()), "family {family} is split");
            last = family;
        }
    }
    for rank in 0..3 {
        let line = format!("vllm:num_requests_running{{engine=\"{rank}\"");
        assert!(text.lines().any(|l| l.starts_with(&line)), "no {line} in\n{text}");
    }
}
