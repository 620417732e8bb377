//! Issue 17, item 4: the router's inputs checked against the truth on a
//! loaded live fleet. Four identical `kvgate sim` replicas (timing
//! `llmd_qwen3_32b`, 4× faster than real time, so 15,928 × 4 prefill
//! tokens/s) behind `kvgate serve`; open-loop traffic of prompts of many
//! lengths keeps them busy. Then, per replica:
//! - the calibrated prefill rate, fitted from the engine's own request
//!   metrics, is within 15 % of the true rate (the TTFT fit it replaces read
//!   5.9k–60k tokens/s on such a fleet);
//! - the ledger agrees with the engine's running + waiting counts.

mod support;

use std::time::{Duration, Instant};

use serde_json::Value;
use support::{client, get_json, spawn_serve, spawn_sim, token_completion, wait_ready, Sim};

/// The sims' true prefill rate: llmd_qwen3_32b's 15.928 tokens/ms, × speedup.
const TRUE_TOKENS_PER_S: f64 = 15_928.0 * 4.0;

/// A prompt of `len` tokens no other request shares (splitmix-style ids).
fn prompt(seed: u64, len: usize) -> Vec<u32> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % 150_000) as u32
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calibration_and_ledger_match_the_engines_under_load() {
    let args = ["--timing", "llmd_qwen3_32b", "--speedup", "4", "--num-gpu-blocks", "8192"];
    let sims: Vec<Sim> = (0..4).map(|_| spawn_sim(None, true, &args)).collect();
    let serve = spawn_serve(&sims.iter().collect::<Vec<_>>(), &[]);
    wait_ready(&serve.base).await;

    // About 60 % of the fleet's prefill capacity: 20 req/s of 256..6,400
    // tokens, for 25 s.
    let url = format!("{}/v1/completions", serve.base);
    let (rate, secs) = (20.0, 25.0);
    let n = (rate * secs) as u64;
    let t0 = Instant::now();
    let mut tasks = Vec::new();
    let mut drifts = Vec::new();
    let mut next_poll = Duration::from_secs(5);
    for i in 0..n {
        let at = Duration::from_secs_f64(i as f64 / rate);
        if let Some(wait) = at.checked_sub(t0.elapsed()) {
            tokio::time::sleep(wait).await;
        }
        if t0.elapsed() >= next_poll {
            next_poll += Duration::from_secs(2);
            drifts.push(get_json(&format!("{}/admin/replicas", serve.admin)).await);
        }
        let len = 256 + ((i * 7919) % 25) as usize * 256;
        let body = token_completion(&prompt(i + 1, len), 24, false);
        let (c, url) = (client(), url.clone());
        tasks.push(tokio::spawn(async move {
            c.post(&url).json(&body).send().await.map(|r| r.status().as_u16()).unwrap_or(0)
        }));
    }
    let mut ok = 0;
    for t in tasks {
        ok += u64::from(t.await.unwrap() == 200);
    }
    assert_eq!(ok, n, "every request served");
    // One more scrape for the last finishes.
    tokio::time::sleep(Duration::from_millis(1500)).await;

    let snap = get_json(&format!("{}/admin/replicas", serve.admin)).await;
    let replicas = replicas_of(&snap);
    assert_eq!(replicas.len(), 4, "{snap}");
    for r in replicas {
        let name = &r["name"];
        // Identical replicas route on the pooled engine fit by default
        // (`calibration.per_replica`, docs/routing.md).
        assert_eq!(r["calibration_source"], "fleet", "{name}: {r}");
        let rate = r["prefill_tokens_per_s"].as_f64().unwrap();
        let err = rate / TRUE_TOKENS_PER_S - 1.0;
        eprintln!("{name}: calibrated {rate:.0} tokens/s ({:+.1} %)", err * 100.0);
        assert!(
            err.abs() <= 0.15,
            "{name}: calibrated {rate:.0} tokens/s vs true {TRUE_TOKENS_PER_S} ({:+.1} %)",
            err * 100.0
        );
    }

    // The ledger against the engines while loaded: the books count what the
    // engine runs and queues, up to requests in transit.
    let mut worst = 0.0f64;
    for snap in &drifts {
        for r in replicas_of(snap) {
            let ledger =
                r["prefill_requests"].as_f64().unwrap() + r["decoding_requests"].as_f64().unwrap();
            let engine = r["engine_running"].as_f64().unwrap_or(0.0)
                + r["engine_waiting"].as_f64().unwrap_or(0.0);
            let tolerance = 3.0 + 0.25 * engine.max(ledger);
            worst = worst.max((ledger - engine).abs() - tolerance);
        }
    }
    assert!(!drifts.is_empty());
    assert!(worst <= 0.0, "ledger and engine disagree beyond transit: {worst} over; {drifts:?}");
}

fn replicas_of(snap: &Value) -> Vec<&Value> {
    snap["replicas"]
        .as_array()
        .or_else(|| snap.as_array())
        .map(|a| a.iter().collect())
        .unwrap_or_default()
}
