//! What the benches in `examples/` share: simulated replicas in the bench
//! process, and the release `kvgate serve` binary in a process of its own
//! (so that its CPU and memory are its own) in front of them.

#![allow(dead_code, unreachable_pub, clippy::unwrap_used, clippy::expect_used)]

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kvgate_events::publisher::{loopback_endpoint, PublisherConfig};
use kvgate_sim::server::{start, Replica, ServerConfig};
use kvgate_sim::EngineConfig;
use kvgate_tokenize::service::{Tokenize, TokenizeService};
use kvgate_tokenize::ChatTokenizer;

pub const MODEL: &str = "Qwen/Qwen3-0.6B";

/// `n` simulated replicas on loopback with events and replay, engine time
/// `speedup` times faster than real time.
pub async fn start_sims(n: usize, num_gpu_blocks: u32, speedup: f64) -> Vec<Replica> {
    let tok = ChatTokenizer::bundled().unwrap();
    let tok = Arc::new(TokenizeService::new(Tokenize::new(tok, None), 1).unwrap());
    let mut out = Vec::new();
    for _ in 0..n {
        let mut ev = PublisherConfig::new("tcp://127.0.0.1:0");
        ev.force_bind = true;
        ev.replay_endpoint = Some("tcp://127.0.0.1:0".into());
        let cfg = ServerConfig {
            engine: EngineConfig { num_gpu_blocks, ..EngineConfig::default() },
            model: MODEL.into(),
            speedup,
            events: Some(ev),
            default_max_tokens: 4,
            ..ServerConfig::default()
        };
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        out.push(start(cfg, l, Arc::clone(&tok)).await.unwrap());
    }
    out
}

/// The messages of a distinct ~4k-token conversation (`i` picks it), so
/// that no prefix cache can help.
pub fn long_chat(i: usize) -> serde_json::Value {
    let words = ["alpha", "kernel", "cache", "route", "token", "stream", "replica", "prefix"];
    let mut text = String::new();
    let mut x = i as u64 * 2654435761 + 1;
    while text.len() < 24_000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        text.push_str(words[(x % 8) as usize]);
        text.push_str(if x.is_multiple_of(11) { ".\n" } else { " " });
    }
    serde_json::json!([
        {"role": "system", "content": format!("Session {i}. You are a careful assistant.")},
        {"role": "user", "content": text},
    ])
}

/// Two distinct free ports (both listeners held until both are chosen).
pub fn free_ports() -> (u16, u16) {
    let a = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let b = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    (a.local_addr().unwrap().port(), b.local_addr().unwrap().port())
}

/// The release `kvgate serve` next to this example's binary, in front of
/// `sims`; `KVGATE_BENCH_SET="k=v k=v"` adds `--set` overrides.
pub fn spawn_gateway(sims: &[Replica], port: u16, admin: u16) -> Child {
    spawn_kvgate(sims, &["serve", "--listen", &format!("127.0.0.1:{port}")], admin)
}

/// The release `kvgate epp`: gRPC on `grpc`, HTTP (health, metrics) on
/// `http`, in front of `sims`.
pub fn spawn_epp(sims: &[Replica], grpc: u16, http: u16, admin: u16) -> Child {
    let (grpc, http) = (format!("127.0.0.1:{grpc}"), format!("127.0.0.1:{http}"));
    spawn_kvgate(sims, &["epp", "--listen", &grpc, "--http-listen", &http], admin)
}

/// `kvgate ARGS` with admin on `admin` and every sim as a replica.
fn spawn_kvgate(sims: &[Replica], args: &[&str], admin: u16) -> Child {
    // KVGATE_BENCH_BIN: another build of the gateway (A/B comparisons).
    let bin =
        std::env::var_os("KVGATE_BENCH_BIN").map(std::path::PathBuf::from).unwrap_or_else(|| {
            let exe = std::env::current_exe().unwrap();
            exe.parent().and_then(|p| p.parent()).unwrap().join("kvgate")
        });
    let mut cmd = Command::new(bin);
    cmd.args(args).args(["--admin-listen", &format!("127.0.0.1:{admin}")]).args(["--log", "warn"]);
    // KVGATE_BENCH_GATEWAY_ENV="K=V ...": environment for the gateway only.
    if let Ok(env) = std::env::var("KVGATE_BENCH_GATEWAY_ENV") {
        for kv in env.split_whitespace() {
            if let Some((k, v)) = kv.split_once('=') {
                cmd.env(k, v);
            }
        }
    }
    if let Ok(extra) = std::env::var("KVGATE_BENCH_SET") {
        for kv in extra.split_whitespace() {
            cmd.args(["--set", kv]);
        }
    }
    for s in sims {
        let ev = s.events().unwrap();
        let spec = format!(
            "{},events={},replay={}",
            s.url(),
            loopback_endpoint(&ev.events),
            loopback_endpoint(ev.replay.as_deref().unwrap())
        );
        cmd.args(["--replica", &spec]);
    }
    cmd.stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("run `cargo build --release -p kvgate` first")
}

/// Waits for `GET {base}/ready` to answer 200.
pub async fn wait_ready(client: &reqwest::Client, base: &str) {
    let t0 = Instant::now();
    while client.get(format!("{base}/ready")).send().await.map(|r| r.status().is_success()).ok()
        != Some(true)
    {
        // KVGATE_BENCH_READY_SECS: longer for a gateway under valgrind.
        let limit = std::env::var("KVGATE_BENCH_READY_SECS").ok().and_then(|v| v.parse().ok());
        assert!(t0.elapsed() < Duration::from_secs(limit.unwrap_or(30)), "gateway not ready");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
