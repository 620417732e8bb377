//! `cache_salt` and LoRA adapters, end to end: `kvgate serve` in front of a
//! `kvgate sim` that hashes and announces blocks as vLLM 0.33 does. Two
//! tenants with different salts and the same prompt never share a predicted
//! or an engine-reported hit; the same tenant does. An adapter's requests
//! match only blocks cached under that adapter.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::{client, get_json, spawn_serve, spawn_sim, wait_ready, Serve};

const BLOCK: u64 = 16;

/// A 40-block token prompt, the same for every tenant.
fn prompt() -> Vec<u32> {
    (0..40 * BLOCK as u32).map(|t| 1000 + t % 977).collect()
}

struct Answer {
    /// What the engine reported as cached (`usage.prompt_tokens_details`).
    engine_cached: u64,
    /// The GPU blocks kvgate's index predicted on the replica.
    predicted: u64,
}

async fn ask(serve: &Serve, model: &str, salt: Option<&str>) -> Answer {
    let mut body = json!({
        "model": model,
        "prompt": prompt(),
        "max_tokens": 2,
        "ignore_eos": true,
    });
    if let Some(s) = salt {
        body["cache_salt"] = json!(s);
    }
    let r =
        client().post(format!("{}/v1/completions", serve.base)).json(&body).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    let engine_cached =
        v["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap_or_else(|| {
            panic!("no cached_tokens in {v}");
        });
    let d = get_json(&format!("{}/admin/decisions?limit=1", serve.admin)).await;
    let predicted = d["decisions"][0]["candidates"][0]["overlap_blocks"]["gpu"]
        .as_u64()
        .unwrap_or_else(|| panic!("no overlap in {d}"));
    Answer { engine_cached, predicted }
}

/// Waits until the index holds at least `blocks` GPU blocks of replica r0:
/// the events of the last request have arrived.
async fn synced(serve: &Serve, blocks: u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let v = get_json(&format!("{}/admin/replicas", serve.admin)).await;
        let held = v["replicas"][0]["index_blocks"][0].as_u64().unwrap_or(0);
        if held >= blocks {
            return;
        }
        assert!(Instant::now() < deadline, "index holds {held} blocks, want {blocks}: {v}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn salts_and_adapters_separate_what_is_cached_and_predicted() {
    let sim = spawn_sim(None, true, &["--lora-adapter", "ad1", "--speedup", "50"]);
    let serve = spawn_serve(&[&sim], &["--set", r#"model.lora_adapters=["ad1"]"#]);
    wait_ready(&serve.base).await;
    let base = "Qwen/Qwen3-0.6B";
    let full = 39 * BLOCK; // the last prompt token is always computed

    // Tenant A warms the cache.
    let a = ask(&serve, base, Some("tenant-a")).await;
    assert_eq!((a.engine_cached, a.predicted), (0, 0));
    synced(&serve, 40).await;

    // Tenant B, same prompt: nothing shared, on either side.
    let b = ask(&serve, base, Some("tenant-b")).await;
    assert_eq!(b.engine_cached, 0, "the engine shared tenant A's blocks with tenant B");
    assert_eq!(b.predicted, 0, "kvgate predicted tenant A's blocks for tenant B");
    synced(&serve, 80).await;

    // Tenant A again: its own blocks, predicted and served (only salted
    // blocks exist yet, so an unsalted query could not find them).
    let again = ask(&serve, base, Some("tenant-a")).await;
    assert!(again.engine_cached >= full, "engine cached {} of {full}", again.engine_cached);
    assert!(again.predicted >= 39, "kvgate predicted {} blocks", again.predicted);

    // No salt at all: nothing shared either.
    let plain = ask(&serve, base, None).await;
    assert_eq!((plain.engine_cached, plain.predicted), (0, 0));
    synced(&serve, 120).await;

    // The adapter matches none of the base model's blocks, then its own.
    let lora = ask(&serve, "ad1", None).await;
    assert_eq!((lora.engine_cached, lora.predicted), (0, 0));
    synced(&serve, 160).await;
    let lora_again = ask(&serve, "ad1", None).await;
    assert!(lora_again.engine_cached >= full, "{}", lora_again.engine_cached);
    assert!(lora_again.predicted >= 39, "{}", lora_again.predicted);

    // The index saw every event as the engine meant it: no anomaly.
    let v = get_json(&format!("{}/admin/replicas", serve.admin)).await;
    let anomalies = &v["replicas"][0]["index_anomalies"];
    let total: u64 = anomalies.as_object().unwrap().values().filter_map(Value::as_u64).sum();
    assert_eq!(total, 0, "{anomalies}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_salt_vllm_would_refuse_is_refused_with_its_words() {
    let sim = spawn_sim(None, false, &[]);
    let serve = spawn_serve(&[&sim], &[]);
    wait_ready(&serve.base).await;
    for salt in [json!(""), json!(7), json!("a/b"), json!("x".repeat(129))] {
        let r = client()
            .post(format!("{}/v1/completions", serve.base))
            .json(&json!({"prompt": [1, 2, 3], "max_tokens": 1, "cache_salt": salt}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 400, "salt {salt}");
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["error"]["param"], "cache_salt", "{v}");
        assert!(v["error"]["message"].as_str().unwrap().contains("cache_salt"), "{v}");
    }
    // An unknown adapter is vLLM's 404; /v1/models lists none.
    let r = client()
        .post(format!("{}/v1/completions", serve.base))
        .json(&json!({"model": "ad1", "prompt": [1, 2, 3], "max_tokens": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    let models = get_json(&format!("{}/v1/models", serve.base)).await;
    assert_eq!(models["data"].as_array().unwrap().len(), 1, "{models}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_adapter_the_engine_lists_is_served_and_keyed_without_config() {
    let sim = spawn_sim(None, true, &["--lora-adapter", "ad2", "--speedup", "50"]);
    let serve = spawn_serve(&[&sim], &[]);
    wait_ready(&serve.base).await;
    // kvgate reads the engine's /v1/models (cards with a parent) after its
    // first good probe.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let models = get_json(&format!("{}/v1/models", serve.base)).await;
        let listed = models["data"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["id"] == "ad2" && m["parent"] == "Qwen/Qwen3-0.6B");
        if listed {
            break;
        }
        assert!(Instant::now() < deadline, "ad2 never listed: {models}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let base = ask(&serve, "Qwen/Qwen3-0.6B", None).await;
    assert_eq!((base.engine_cached, base.predicted), (0, 0));
    synced(&serve, 40).await;
    let lora = ask(&serve, "ad2", None).await;
    assert_eq!((lora.engine_cached, lora.predicted), (0, 0), "ad2 matched base-model blocks");
    synced(&serve, 80).await;
    let again = ask(&serve, "ad2", None).await;
    assert!(again.engine_cached >= 39 * BLOCK && again.predicted >= 39);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_adapter_goes_only_to_the_engines_that_list_it() {
    let with = spawn_sim(None, true, &["--lora-adapter", "ad3", "--speedup", "50"]);
    let without = spawn_sim(None, true, &["--speedup", "50"]);
    let serve = spawn_serve(&[&without, &with], &[]);
    wait_ready(&serve.base).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while !get_json(&format!("{}/v1/models", serve.base)).await.to_string().contains("ad3") {
        assert!(Instant::now() < deadline, "ad3 never listed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for i in 0..8u32 {
        let body = json!({
            "model": "ad3",
            "prompt": (0..64).map(|t| i * 1000 + t).collect::<Vec<u32>>(),
            "max_tokens": 1,
        });
        let r = client()
            .post(format!("{}/v1/completions", serve.base))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        // r1 is the sim that lists ad3 (spawn_serve names them in order).
        assert_eq!(r.headers()["x-kvgate-replica"], "r1", "request {i}");
    }
}
