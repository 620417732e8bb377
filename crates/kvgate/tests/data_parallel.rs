//! A data-parallel engine behind one URL (`kvgate sim --data-parallel-size
//! 4`, vLLM's `--data-parallel-size 4`): `kvgate serve` with `dp_size=4`
//! sees four caches, each fed by its own event stream (port + rank), uses
//! every rank, and pins each request with `X-data-parallel-rank`, so a
//! repeated prompt finds its blocks where kvgate predicted them.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::BTreeSet;

use serde_json::Value;
use support::{
    client, free_ports, get_json, kvgate_cmd, metric_with, run_sim, spawn_serve_with,
    token_completion, wait_ready,
};

const RANKS: u16 = 4;
const BLOCK: usize = 16;

/// A base port with `n` consecutive free ports after it.
fn consecutive_free_ports(n: u16) -> u16 {
    for _ in 0..50 {
        let base = free_ports(1)[0];
        if base.checked_add(n).is_none() {
            continue;
        }
        let all: Option<Vec<_>> =
            (base..base + n).map(|p| std::net::TcpListener::bind(("127.0.0.1", p)).ok()).collect();
        if all.is_some() {
            return base;
        }
    }
    panic!("no run of {n} free ports found");
}

fn prompt(i: usize) -> Vec<u32> {
    // 20 blocks, distinct from the first token on.
    (0..20 * BLOCK as u32).map(|t| 10_000 + (i as u32) * 997 + t).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_rank_is_a_cache_and_requests_are_pinned_to_theirs() {
    let http = free_ports(1)[0];
    let events = consecutive_free_ports(2 * RANKS);
    let replay = events + RANKS;
    let mut cmd = kvgate_cmd();
    cmd.args(["sim", "--port", &http.to_string(), "--log", "warn", "--bind-events"])
        .args(["--events", &format!("tcp://127.0.0.1:{events}")])
        .args(["--replay", &format!("tcp://127.0.0.1:{replay}")])
        .args(["--data-parallel-size", &RANKS.to_string(), "--speedup", "50"]);
    let sim = run_sim(&mut cmd);
    let spec = format!(
        "{},name=dp,events=tcp://127.0.0.1:{events},replay=tcp://127.0.0.1:{replay},dp_size={RANKS}",
        sim.url
    );
    let serve = spawn_serve_with(&[spec], &[]);
    wait_ready(&serve.base).await;

    let replicas = get_json(&format!("{}/admin/replicas", serve.admin)).await;
    let names: BTreeSet<String> = replicas["replicas"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap().to_owned())
        .collect();
    let want: BTreeSet<String> = (0..RANKS).map(|r| format!("dp#{r}")).collect();
    assert_eq!(names, want, "{replicas}");

    let ask = |i: usize| {
        let body = token_completion(&prompt(i), 2, false);
        let url = format!("{}/v1/completions", serve.base);
        async move {
            let r = client().post(url).json(&body).send().await.unwrap();
            assert_eq!(r.status(), 200);
            let rank = r.headers()["x-kvgate-replica"].to_str().unwrap().to_owned();
            let v: Value = r.json().await.unwrap();
            let cached = v["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap();
            (rank, cached)
        }
    };
    // Not a multiple of the ranks: without the header, the engine's own
    // rotation would put each second turn on another rank than the first.
    let n = 15;
    let mut first = Vec::new();
    for i in 0..n {
        first.push(ask(i).await);
    }
    let used: BTreeSet<&str> = first.iter().map(|(r, _)| r.as_str()).collect();
    assert_eq!(used.len(), RANKS as usize, "ranks used: {used:?}");
    // Let every rank's events arrive, then repeat each prompt.
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let (mut hit, mut oracle) = (0u64, 0u64);
    for (i, (rank, _)) in first.iter().enumerate() {
        let (again, cached) = ask(i).await;
        assert_eq!(&again, rank, "prompt {i} moved from {rank} to {again}");
        hit += cached;
        // All but the block holding the last token can be reused.
        oracle += ((prompt(i).len() - 1) / BLOCK * BLOCK) as u64;
    }
    let ratio = hit as f64 / oracle as f64;
    eprintln!("data parallel: {hit} of {oracle} tokens cached on the second turn ({ratio:.3})");
    // Without the header the engine would rotate requests over its ranks
    // and most second turns would miss.
    assert!(ratio >= 0.9, "hit rate {ratio:.3} of the oracle");
    // Each rank's engine served what kvgate sent it.
    for r in 0..RANKS {
        let served = metric_with(
            &sim.url,
            "vllm:prefix_cache_hits_total",
            &format!("engine=\"{r}\",model_name=\"Qwen/Qwen3-0.6B\""),
        )
        .await;
        assert!(served > 0.0, "rank {r} served no hit");
    }
}
