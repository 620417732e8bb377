//! Prefill/decode disaggregation end to end (issue 24): `kvgate serve` in
//! front of `kvgate sim` processes started with `--kv-transfer-config`,
//! replicas given `role=prefill` / `role=decode`. The prefill hop's
//! `kv_transfer_params` must reach the decode hop unchanged; a prefill
//! replica killed mid-request is replaced by another and the client sees
//! one clean stream; a decode replica killed before its first byte leaves
//! the request served whole elsewhere, without the stale parameters.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::{client, get_json, metric_with, spawn_serve_with, spawn_sim, token_completion, Sim};

const CONNECTOR: &str = r#"{"kv_connector":"NixlConnector","kv_role":"kv_both"}"#;

/// A sim with a KV connector; `extra` flags (speed, bandwidth) after.
fn pd_sim(extra: &[&str]) -> Sim {
    let mut args = vec!["--kv-transfer-config", CONNECTOR, "--timing", "dynamo_mocker"];
    args.extend_from_slice(extra);
    spawn_sim(None, false, &args)
}

fn spec(sim: &Sim, name: &str, role: &str) -> String {
    format!("{},name={name},events={},role={role}", sim.url, sim.events)
}

/// `kvgate serve` splitting every request, probing every 200 ms.
fn serve(specs: &[String]) -> support::Serve {
    spawn_serve_with(
        specs,
        &[
            "--set",
            "disagg.mode=\"always\"",
            "--set",
            "monitor.health_interval_ms=200",
            "--set",
            "monitor.metrics_interval_ms=200",
        ],
    )
}

async fn transfers(sim: &Sim) -> Value {
    get_json(&format!("{}/debug/kv_transfers", sim.url)).await
}

/// Posts `body` and reads the whole streamed answer; status and the data
/// frames (without `[DONE]`), and whether `[DONE]` ended it.
async fn stream(base: &str, path: &str, body: &Value) -> (u16, Vec<Value>, bool) {
    let r = client().post(format!("{base}{path}")).json(body).send().await.unwrap();
    let status = r.status().as_u16();
    let text = r.text().await.unwrap();
    let data: Vec<&str> = text.lines().filter_map(|l| l.strip_prefix("data: ")).collect();
    let done = data.last() == Some(&"[DONE]");
    let frames = data.iter().filter_map(|d| serde_json::from_str(d).ok()).collect();
    (status, frames, done)
}

/// Adds a replica through the admin API and waits until it is in rotation.
async fn add_replica(admin: &str, sim: &Sim, name: &str, role: &str) {
    let body = json!({"url": sim.url, "name": name, "events": sim.events, "role": role});
    let r = client().post(format!("{admin}/admin/replicas")).json(&body).send().await.unwrap();
    assert_eq!(r.status(), 201, "{}", r.text().await.unwrap());
    let t0 = Instant::now();
    loop {
        let list = get_json(&format!("{admin}/admin/replicas")).await;
        let healthy = list["replicas"].as_array().is_some_and(|rs| {
            rs.iter().any(|r| r["name"] == json!(name) && r["health"] != json!("down"))
        });
        if healthy {
            return;
        }
        assert!(t0.elapsed() < Duration::from_secs(20), "{name} never in rotation: {list}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn prompt(n: u32, salt: u32) -> Vec<u32> {
    (0..n).map(|i| 200 + (i * 31 + salt * 7919) % 20_000).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_prefill_answer_reaches_the_decode_hop_unchanged() {
    let (p, d) = (pd_sim(&["--speedup", "20"]), pd_sim(&["--speedup", "20"]));
    let gw = serve(&[spec(&p, "p", "prefill"), spec(&d, "d", "decode")]);
    support::wait_ready(&gw.base).await;
    // Before any transfer, the configured link: 114,688 bytes per token
    // over 64 GB/s.
    let prior = 114_688.0 / 64e9;
    let gauge = "kvgate_pool_kv_transfer_per_token_seconds";
    assert_eq!(metric_with(&gw.base, gauge, "pool=\"default\"").await, prior);

    // A streamed token-id completion.
    let body = token_completion(&prompt(900, 1), 12, true);
    let (status, frames, done) = stream(&gw.base, "/v1/completions", &body).await;
    assert_eq!(status, 200);
    assert!(done, "the stream did not end with [DONE]");
    let tokens = frames.iter().filter(|f| f["choices"][0]["text"].is_string()).count();
    assert_eq!(tokens, 12);
    let (answered, received) = (transfers(&p).await, transfers(&d).await);
    assert_eq!(answered["answered"].as_array().unwrap().len(), 1, "{answered}");
    assert_eq!(received["received"], answered["answered"], "the parameters changed on the way");

    // A chat: the decode hop also gets the prompt's token ids, the rest
    // of the prefill's answer verbatim.
    let chat = json!({"model": "Qwen/Qwen3-0.6B", "max_tokens": 4, "stream": true,
        "messages": [{"role": "user", "content": "disaggregate this, please"}]});
    let (status, _, done) = stream(&gw.base, "/v1/chat/completions", &chat).await;
    assert_eq!((status, done), (200, true));
    let (answered, received) = (transfers(&p).await, transfers(&d).await);
    let mut got = received["received"][1].clone();
    let ids = got.as_object_mut().unwrap().remove("prompt_token_ids").expect("no token ids");
    assert!(ids.as_array().is_some_and(|a| !a.is_empty()));
    assert_eq!(got, answered["answered"][1]);
    let split = metric_with(&gw.base, "kvgate_disagg_plans_total", "plan=\"split\"").await;
    assert_eq!(split, 2.0);

    // The decode sim reports its pulls as vLLM's NIXL series, in wall time
    // (20× faster than the model's link at --speedup 20): the gateway's
    // transfer rate leaves its prior (114,688 bytes per token over 64 GB/s)
    // for the faster one it observed.
    let t0 = Instant::now();
    loop {
        let rate = metric_with(&gw.base, gauge, "pool=\"default\"").await;
        if rate > 0.0 && rate < prior * 0.99 {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "the transfer rate stayed at {rate}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prefill_replica_killed_mid_request_is_replaced() {
    // p1 prefills ~50× slower than real time: the prefill hop of a
    // 3,000-token prompt takes seconds there.
    let mut p1 = pd_sim(&["--speedup", "0.02"]);
    let (p2, d) = (pd_sim(&["--speedup", "20"]), pd_sim(&["--speedup", "20"]));
    let gw = serve(&[spec(&p1, "p1", "prefill"), spec(&d, "d", "decode")]);
    support::wait_ready(&gw.base).await;
    let base = gw.base.clone();
    let request = tokio::spawn(async move {
        stream(&base, "/v1/completions", &token_completion(&prompt(3000, 2), 8, true)).await
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    add_replica(&gw.admin, &p2, "p2", "prefill").await;
    assert!(!request.is_finished(), "the prefill hop finished before the kill");
    p1.proc.0.kill().unwrap();
    let (status, frames, done) = request.await.unwrap();
    assert_eq!(status, 200);
    assert!(done, "the stream did not end cleanly");
    let tokens = frames.iter().filter(|f| f["choices"][0]["text"].is_string()).count();
    assert_eq!(tokens, 8);
    // The decode hop got p2's answer.
    let received = transfers(&d).await;
    let port: u16 = p2.url.rsplit(':').next().unwrap().parse().unwrap();
    assert_eq!(received["received"][0]["remote_port"], json!(port));
    assert_eq!(received["received"].as_array().unwrap().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decode_replica_killed_before_its_first_byte_falls_back_to_whole() {
    // d1's link is so slow that the transfer takes far longer than the test.
    let p = pd_sim(&["--speedup", "20"]);
    let mut d1 = pd_sim(&["--speedup", "20", "--kv-transfer-bandwidth", "0.0001"]);
    let d2 = pd_sim(&["--speedup", "20"]);
    let gw = serve(&[spec(&p, "p", "prefill"), spec(&d1, "d1", "decode")]);
    support::wait_ready(&gw.base).await;
    let base = gw.base.clone();
    let request = tokio::spawn(async move {
        stream(&base, "/v1/completions", &token_completion(&prompt(2000, 3), 6, true)).await
    });
    // Wait until d1 has the decode hop (it is waiting for the transfer).
    let t0 = Instant::now();
    while transfers(&d1).await["received"].as_array().is_none_or(Vec::is_empty) {
        assert!(t0.elapsed() < Duration::from_secs(20), "d1 never got the decode hop");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    add_replica(&gw.admin, &d2, "d2", "decode").await;
    d1.proc.0.kill().unwrap();
    let (status, frames, done) = request.await.unwrap();
    assert_eq!(status, 200);
    assert!(done);
    assert_eq!(frames.iter().filter(|f| f["choices"][0]["text"].is_string()).count(), 6);
    // d2 served it whole: no stale parameters reached it.
    assert_eq!(transfers(&d2).await["received"], json!([]));
    let fallback =
        metric_with(&gw.base, "kvgate_disagg_plans_total", "plan=\"decode_fallback\"").await;
    assert_eq!(fallback, 1.0);
}

/// `disagg.whole_on_prefill`: with every decode replica down, the prefill
/// replica serves requests whole (no `kv_transfer_params`, one hop); the
/// planner counts them as `on_prefill`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_whole_on_prefill_a_prefill_replica_serves_whole_when_decode_is_down() {
    let (p, mut d) = (pd_sim(&["--speedup", "20"]), pd_sim(&["--speedup", "20"]));
    let gw = spawn_serve_with(
        &[spec(&p, "p", "prefill"), spec(&d, "d", "decode")],
        &["--set", "disagg.whole_on_prefill=true", "--set", "monitor.health_interval_ms=200"],
    );
    support::wait_ready(&gw.base).await;
    d.proc.0.kill().unwrap();
    let t0 = Instant::now();
    loop {
        let list = get_json(&format!("{}/admin/replicas", gw.admin)).await;
        let down = list["replicas"].as_array().is_some_and(|rs| {
            rs.iter().any(|r| r["name"] == json!("d") && r["health"] == json!("down"))
        });
        if down {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(20), "d never marked down: {list}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (status, frames, done) =
        stream(&gw.base, "/v1/completions", &token_completion(&prompt(800, 4), 5, true)).await;
    assert_eq!((status, done), (200, true));
    assert_eq!(frames.iter().filter(|f| f["choices"][0]["text"].is_string()).count(), 5);
    assert_eq!(transfers(&p).await["answered"], json!([]), "a prefill hop was sent");
    let on_p = metric_with(&gw.base, "kvgate_disagg_plans_total", "plan=\"on_prefill\"").await;
    assert_eq!(on_p, 1.0);
}
