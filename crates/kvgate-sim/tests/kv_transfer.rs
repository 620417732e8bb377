//! Prefill/decode disaggregation over HTTP (`--kv-transfer-config`): a
//! prefill hop answers the decode side's `kv_transfer_params` and holds its
//! blocks until its lease ends; a decode hop with those parameters computes
//! only its last prompt token and keeps what it received for inspection.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use kvgate_sim::server::metrics::scrape;
use kvgate_sim::server::{KvTransferConfig, Replica, ServerConfig};
use kvgate_sim::EngineConfig;
use serde_json::{json, Value};

mod support;
use support::{replica, MODEL};

fn config(engine_id: &str, lease_s: f64) -> ServerConfig {
    let json = format!(
        r#"{{"kv_connector":"NixlConnector","kv_role":"kv_both","kv_connector_extra_config":{{"kv_lease_duration":{lease_s}}}}}"#
    );
    ServerConfig {
        engine: EngineConfig { hash_seed: Some(7), ..EngineConfig::default() },
        model: MODEL.to_owned(),
        speedup: 50.0,
        kv_transfer: Some(
            KvTransferConfig::from_vllm_json(&json, engine_id, 114_688, 64e9).unwrap(),
        ),
        ..ServerConfig::default()
    }
}

async fn post(r: &Replica, path: &str, body: &Value) -> (u16, Value) {
    let resp =
        reqwest::Client::new().post(format!("{}{path}", r.url())).json(body).send().await.unwrap();
    (resp.status().as_u16(), resp.json().await.unwrap_or(Value::Null))
}

async fn kv_usage(r: &Replica) -> f64 {
    let text = reqwest::get(format!("{}/metrics", r.url())).await.unwrap().text().await.unwrap();
    scrape(&text, "vllm:kv_cache_usage_perc").unwrap()
}

fn prompt(n: u32) -> Vec<u32> {
    (0..n).map(|i| 100 + i % 5000).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prefill_hop_hands_its_kv_to_a_decode_hop() {
    // A lease of 20 s of model time: 0.4 s here at speedup 50.
    let p = replica(config("engine-p", 20.0)).await;
    let d = replica(config("engine-d", 20.0)).await;
    let ids = prompt(700);
    let body = json!({
        "model": MODEL, "prompt": ids, "max_tokens": 1, "stream": false,
        "kv_transfer_params": {"do_remote_decode": true, "do_remote_prefill": false,
            "remote_engine_id": null, "remote_block_ids": null, "remote_host": null, "remote_port": null},
    });
    let (status, first) = post(&p, "/v1/completions", &body).await;
    assert_eq!(status, 200, "{first}");
    let params = first["kv_transfer_params"].clone();
    assert_eq!(params["do_remote_prefill"], json!(true));
    assert_eq!(params["remote_engine_id"], json!("engine-p"));
    assert_eq!(params["remote_port"], json!(p.http_addr().port()));
    assert_eq!(params["remote_num_tokens"], json!(700));
    // 700 tokens in 16-token blocks: 44 block ids.
    assert_eq!(params["remote_block_ids"][0].as_array().unwrap().len(), 44);
    // The prefill side holds the blocks for the decode side.
    assert!(kv_usage(&p).await > 0.0);

    let decode =
        json!({"model": MODEL, "prompt": ids, "max_tokens": 5, "kv_transfer_params": params});
    let (status, out) = post(&d, "/v1/completions", &decode).await;
    assert_eq!(status, 200, "{out}");
    assert_eq!(out["usage"]["completion_tokens"], json!(5));
    // Everything but the last prompt token was received, not computed.
    assert_eq!(out["usage"]["prompt_tokens_details"]["cached_tokens"], json!(699));
    // What the decode side received is what the prefill side answered.
    let seen: Value = reqwest::get(format!("{}/debug/kv_transfers", d.url()))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(seen["received"], json!([params]));
    let answered: Value = reqwest::get(format!("{}/debug/kv_transfers", p.url()))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(answered["answered"], json!([params]));
    // The receipt is one NIXL transfer on the decode side (vLLM's series):
    // 699 tokens × 114,688 bytes, in 699 × 114,688 ÷ 64e9 s of model time,
    // reported in wall seconds (÷ speedup 50). The prefill side pulled none.
    let text = reqwest::get(format!("{}/metrics", d.url())).await.unwrap().text().await.unwrap();
    assert_eq!(scrape(&text, "vllm:nixl_xfer_time_seconds_count"), Some(1.0));
    assert_eq!(scrape(&text, "vllm:nixl_bytes_transferred_sum"), Some(699.0 * 114_688.0));
    let secs = scrape(&text, "vllm:nixl_xfer_time_seconds_sum").unwrap();
    let want = 699.0 * 114_688.0 / 64e9 / 50.0;
    assert!((secs / want - 1.0).abs() < 1e-3, "{secs} vs {want}");
    let text = reqwest::get(format!("{}/metrics", p.url())).await.unwrap().text().await.unwrap();
    assert_eq!(scrape(&text, "vllm:nixl_xfer_time_seconds_count"), Some(0.0));
    // The lease ends: the prefill side frees the blocks (they stay cached).
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(kv_usage(&p).await, 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_prefill_hop_answers_on_its_finish_chunk() {
    let p = replica(config("engine-p", 30.0)).await;
    let body = json!({
        "model": MODEL, "prompt": prompt(50), "max_tokens": 1, "stream": true,
        "kv_transfer_params": {"do_remote_decode": true},
    });
    let text = reqwest::Client::new()
        .post(format!("{}/v1/completions", p.url()))
        .json(&body)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let finish = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|v| !v["choices"][0]["finish_reason"].is_null())
        .unwrap();
    assert_eq!(finish["kv_transfer_params"]["remote_engine_id"], json!("engine-p"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_parameters_get_a_clear_400_and_no_connector_ignores_them() {
    let d = replica(config("engine-d", 30.0)).await;
    for (params, says) in [
        (json!({"do_remote_prefill": true, "remote_engine_id": "e"}), "remote_request_id"),
        (json!({"do_remote_prefill": true, "do_remote_decode": true}), "exclusive"),
        (json!("yes"), "expected a map"),
    ] {
        let body = json!({"model": MODEL, "prompt": prompt(20), "max_tokens": 2, "kv_transfer_params": params});
        let (status, out) = post(&d, "/v1/completions", &body).await;
        assert_eq!(status, 400);
        assert!(out["error"]["message"].as_str().unwrap().contains(says), "{out}");
    }
    // A replica without a connector serves the request whole.
    let plain = replica(ServerConfig { kv_transfer: None, ..config("x", 30.0) }).await;
    let body = json!({"model": MODEL, "prompt": prompt(20), "max_tokens": 2,
        "kv_transfer_params": {"do_remote_decode": true}});
    let (status, out) = post(&plain, "/v1/completions", &body).await;
    assert_eq!(status, 200);
    assert!(out.get("kv_transfer_params").is_none(), "{out}");
    assert_eq!(out["usage"]["completion_tokens"], json!(2));
}
