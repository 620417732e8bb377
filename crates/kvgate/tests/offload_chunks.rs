//! The offloading connector's chunked CPU tier, end to end: `kvgate sim
//! --cpu-chunk-blocks 4` offloads requests in chunks as vLLM 0.33 does, and
//! prompts whose shared prefix ends inside a chunk make several chunks
//! announce the same blocks. After traffic, kvgate's view of the CPU tier
//! equals what the engine holds, exactly (self-describing events; with
//! placeholders, exactly the resident chunks' keys), with no anomaly: shared
//! blocks stay while any chunk holds them.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::HashSet;
use std::time::Duration;

use serde_json::Value;
use support::{client, get_json, spawn_serve, spawn_sim, token_completion, wait_ready, Serve, Sim};

/// 9 blocks of 16: 40 shared tokens (2.5 blocks), then the prompt's own.
fn prompt(i: u32) -> Vec<u32> {
    let shared = (0..40).map(|t| 500 + t);
    let own = (0..104).map(move |t| 20_000 + i * 211 + t);
    shared.chain(own).collect()
}

fn hashes(v: &Value) -> HashSet<u64> {
    v.as_array().unwrap().iter().map(|h| h.as_u64().expect("int hashes")).collect()
}

async fn cpu_truth(sim: &Sim) -> HashSet<u64> {
    hashes(&get_json(&format!("{}/debug/kv_blocks", sim.url)).await["cpu"])
}

async fn cpu_view(serve: &Serve, name: &str) -> HashSet<u64> {
    hashes(&get_json(&format!("{}/admin/replicas/{name}/blocks", serve.admin)).await["cpu"])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cpu_view_equals_the_engine_with_chunks_that_share_blocks() {
    let common = [
        "--num-gpu-blocks",
        "64",
        "--num-cpu-blocks",
        "64",
        "--cpu-chunk-blocks",
        "4",
        "--speedup",
        "50",
    ];
    for mode in ["self-describing", "placeholder"] {
        let extra: &[&str] =
            if mode == "placeholder" { &[] } else { &["--self-describing-cpu-events"] };
        let sim = spawn_sim(None, true, &[&common[..], extra].concat());
        let serve = spawn_serve(&[&sim], &[]);
        wait_ready(&serve.base).await;
        let url = format!("{}/v1/completions", serve.base);
        // 40 prompts sharing 2.5 blocks, then 4 unrelated ones: their 8
        // chunks evict 8 of the 16 resident ones, whose removals fan out to
        // the shared blocks that the 8 others still hold.
        let unrelated =
            |i: u32| (0..144).map(move |t| 900_000 + i * 1_000 + t).collect::<Vec<u32>>();
        let prompts = (0..40).map(prompt).chain((0..4).map(unrelated));
        for p in prompts {
            let body = token_completion(&p, 1, false);
            let r = client().post(&url).json(&body).send().await.unwrap();
            assert_eq!(r.status(), 200);
        }
        tokio::time::sleep(Duration::from_millis(800)).await;
        let (truth, view) = (cpu_truth(&sim).await, cpu_view(&serve, "r0").await);
        // 16 chunks fit: 80 were stored, most evicted.
        assert!(truth.len() >= 16, "{mode}: {} blocks offloaded", truth.len());
        if mode == "placeholder" {
            // Placeholders name each chunk by its key (last block) only:
            // the view holds exactly the 16 resident chunks' keys.
            assert!(view.is_subset(&truth), "{mode}: kvgate holds blocks the engine does not");
            assert_eq!(view.len(), 16, "{mode}: {} keys", view.len());
        } else {
            assert_eq!(view, truth, "{mode}: kvgate's CPU view differs from the engine");
        }
        let v = get_json(&format!("{}/admin/replicas", serve.admin)).await;
        let anomalies = &v["replicas"][0]["index_anomalies"];
        let total: u64 = anomalies.as_object().unwrap().values().filter_map(Value::as_u64).sum();
        assert_eq!(total, 0, "{mode}: {anomalies}");
    }
}
