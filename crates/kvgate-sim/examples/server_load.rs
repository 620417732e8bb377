//! Load on the engine server: `--replicas 8 --speedup 10` style, in one
//! process, driven by an in-process HTTP client (which shares the CPU, so
//! the figure is a lower bound).
//!
//! ```sh
//! cargo run --release -p kvgate-sim --features server --example server_load -- [replicas] [speedup] [seconds] [concurrency]
//! ```
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kvgate_sim::server::{start, ServerConfig};
use kvgate_sim::EngineConfig;
use kvgate_tokenize::service::{Tokenize, TokenizeService};
use kvgate_tokenize::ChatTokenizer;
use serde_json::json;

fn arg<T: std::str::FromStr>(i: usize, default: T) -> T {
    std::env::args().nth(i).and_then(|a| a.parse().ok()).unwrap_or(default)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let replicas: usize = arg(1, 8);
    let speedup: f64 = arg(2, 10.0);
    let seconds: u64 = arg(3, 5);
    let concurrency: usize = arg(4, 64);
    let tokenizer = Arc::new(
        TokenizeService::new(Tokenize::new(ChatTokenizer::bundled().unwrap(), None), 1).unwrap(),
    );
    let mut urls = Vec::new();
    let mut keep = Vec::new();
    for _ in 0..replicas {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let config = ServerConfig {
            engine: EngineConfig { hash_seed: Some(1), ..EngineConfig::default() },
            speedup,
            ..ServerConfig::default()
        };
        let r = start(config, listener, Arc::clone(&tokenizer)).await.unwrap();
        urls.push(format!("{}/v1/completions", r.url()));
        keep.push(r);
    }
    let done = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let cpu0 = cpu_seconds();
    let t0 = Instant::now();
    let mut tasks = Vec::new();
    for w in 0..concurrency {
        let (urls, done, errors) = (urls.clone(), Arc::clone(&done), Arc::clone(&errors));
        tasks.push(tokio::spawn(async move {
            let client = reqwest::Client::new();
            let mut i = w;
            while Instant::now() < deadline {
                // Short requests: a 128-token prompt (shared 64-token prefix), 8 output tokens.
                let prompt: Vec<u32> =
                    (0..64).chain((0..64).map(|t| (t + i as u32 * 64) % 100_000)).collect();
                let body = json!({"prompt": prompt, "max_tokens": 8, "ignore_eos": true});
                match client.post(&urls[i % urls.len()]).json(&body).send().await {
                    Ok(r) if r.status().is_success() => {
                        let _ = r.bytes().await;
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                    _ => {
                        errors.fetch_add(1, Ordering::Relaxed);
                    }
                }
                i += concurrency;
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let wall = t0.elapsed().as_secs_f64();
    let cpu = cpu_seconds() - cpu0;
    let n = done.load(Ordering::Relaxed);
    println!(
        "replicas={replicas} speedup={speedup} concurrency={concurrency}: {n} requests in {wall:.2}s = {:.0} req/s, {} errors, process CPU {cpu:.2}s ({:.0}% of one core)",
        n as f64 / wall,
        errors.load(Ordering::Relaxed),
        100.0 * cpu / wall
    );
}

/// User + system CPU of this process, from /proc (Linux); 0 elsewhere.
fn cpu_seconds() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else { return 0.0 };
    let fields: Vec<&str> = stat.rsplit(')').next().unwrap_or("").split_whitespace().collect();
    let ticks: f64 = fields.get(11).and_then(|u| u.parse::<f64>().ok()).unwrap_or(0.0)
        + fields.get(12).and_then(|s| s.parse::<f64>().ok()).unwrap_or(0.0);
    ticks / 100.0
}
