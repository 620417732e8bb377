//! Processes for end-to-end tests: `kvgate sim` and `kvgate serve` started
//! from the built binary, killed when dropped, and the configuration of an
//! in-process gateway over in-process sims. Included with `mod support;`.

#![allow(dead_code, unreachable_pub, clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use std::sync::Arc;

use kvgate_events::publisher::{loopback_endpoint, PublisherConfig};
use kvgate_gateway::{Gateway, GatewayConfig, ReplicaConfig};
use kvgate_sim::server::{start, Replica, ServerConfig};
use kvgate_sim::EngineConfig;
use kvgate_tokenize::service::TokenizeService;
use serde_json::Value;

/// Kills (SIGKILL) and reaps the process when dropped.
pub struct Kill(pub Child);

impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The built `kvgate`, with the caller's `KVGATE_*` settings removed.
pub fn kvgate_cmd() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_kvgate"));
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("KVGATE_") || k == "VLLM_API_KEY" {
            cmd.env_remove(k);
        }
    }
    cmd
}

/// `n` distinct free loopback ports (listeners held until all are chosen).
pub fn free_ports(n: usize) -> Vec<u16> {
    let held: Vec<_> =
        (0..n).map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap()).collect();
    held.iter().map(|l| l.local_addr().unwrap().port()).collect()
}

/// A running `kvgate sim` (one replica).
pub struct Sim {
    pub proc: Kill,
    pub url: String,
    pub events: String,
    pub replay: Option<String>,
}

/// Fixed ports for a sim that must come back on the same addresses.
#[derive(Clone, Copy, Debug)]
pub struct SimPorts {
    pub http: u16,
    pub events: u16,
    pub replay: u16,
}

impl SimPorts {
    pub fn pick() -> SimPorts {
        let p = free_ports(3);
        SimPorts { http: p[0], events: p[1], replay: p[2] }
    }
}

/// Starts `kvgate sim` on loopback with events (and replay, if `replay`),
/// on `ports` or on ports the OS picks; `args` are extra flags.
pub fn spawn_sim(ports: Option<SimPorts>, replay: bool, args: &[&str]) -> Sim {
    let p = ports.map_or(("0".to_owned(), 0, 0), |p| (p.http.to_string(), p.events, p.replay));
    let mut cmd = kvgate_cmd();
    cmd.args(["sim", "--port", &p.0, "--log", "warn"]).args([
        "--events",
        &format!("tcp://127.0.0.1:{}", p.1),
        "--bind-events",
    ]);
    if replay {
        cmd.args(["--replay", &format!("tcp://127.0.0.1:{}", p.2)]);
    }
    cmd.args(args);
    run_sim(&mut cmd)
}

/// Starts a prepared `kvgate sim` command (one replica) and reads its
/// addresses from the first line it prints.
pub fn run_sim(cmd: &mut Command) -> Sim {
    let child = cmd.stdout(Stdio::piped()).stderr(Stdio::null()).spawn().unwrap();
    let mut child = Kill(child);
    let mut lines = BufReader::new(child.0.stdout.take().unwrap()).lines();
    let line = lines.next().expect("kvgate sim printed nothing").unwrap();
    let field = |name: &str| {
        line.split(&format!("{name}="))
            .nth(1)
            .unwrap_or_else(|| panic!("no {name} in {line:?}"))
            .split(' ')
            .next()
            .unwrap()
            .to_owned()
    };
    let replay = Some(field("replay")).filter(|r| r != "-");
    Sim { url: field("http"), events: field("events"), replay, proc: child }
}

/// A running `kvgate serve`.
pub struct Serve {
    pub proc: Kill,
    pub base: String,
    pub admin: String,
}

/// Starts `kvgate serve` on loopback ports the OS picks, in front of `sims`
/// (named r0, r1, ...); `args` are extra flags (`--set k=v`, ...).
pub fn spawn_serve(sims: &[&Sim], args: &[&str]) -> Serve {
    let specs: Vec<String> = sims
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let mut spec = format!("{},name=r{i},events={}", s.url, s.events);
            if let Some(r) = &s.replay {
                spec.push_str(&format!(",replay={r}"));
            }
            spec
        })
        .collect();
    spawn_serve_with(&specs, args)
}

/// Starts `kvgate serve` on loopback ports the OS picks with these
/// `--replica` specs.
pub fn spawn_serve_with(replicas: &[String], args: &[&str]) -> Serve {
    let mut cmd = kvgate_cmd();
    cmd.args([
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--admin-listen",
        "127.0.0.1:0",
        "--log",
        "warn",
    ]);
    for spec in replicas {
        cmd.args(["--replica", spec]);
    }
    let child = cmd.args(args).stdout(Stdio::piped()).stderr(Stdio::null()).spawn().unwrap();
    let mut child = Kill(child);
    let mut lines = BufReader::new(child.0.stdout.take().unwrap()).lines();
    let line = lines.next().expect("kvgate serve printed nothing").unwrap();
    // "kvgate serving on http://A (admin: http://B) with N replicas"
    let base = line
        .strip_prefix("kvgate serving on ")
        .and_then(|r| r.split(' ').next())
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .to_owned();
    let admin = line
        .split("(admin: ")
        .nth(1)
        .and_then(|r| r.split(')').next())
        .unwrap_or_else(|| panic!("no admin address in {line:?}"))
        .to_owned();
    Serve { proc: child, base, admin }
}

/// Resident memory of a process, KiB.
pub fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

pub fn client() -> reqwest::Client {
    reqwest::Client::builder().timeout(Duration::from_secs(30)).build().unwrap()
}

/// Waits until `GET {base}/ready` answers 200.
pub async fn wait_ready(base: &str) {
    let t0 = Instant::now();
    loop {
        let ok =
            client().get(format!("{base}/ready")).send().await.is_ok_and(|r| r.status() == 200);
        if ok {
            return;
        }
        assert!(t0.elapsed() < Duration::from_secs(30), "{base} never became ready");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub async fn get_json(url: &str) -> Value {
    let r = client().get(url).send().await.unwrap_or_else(|e| panic!("GET {url}: {e}"));
    assert!(r.status().is_success(), "GET {url}: {}", r.status());
    r.json().await.unwrap()
}

/// The sample of `name{labels}` on a Prometheus page (0 when absent);
/// `labels` as exposed, e.g. `outcome="added"`.
pub async fn metric_with(url: &str, name: &str, labels: &str) -> f64 {
    let text = client().get(format!("{url}/metrics")).send().await.unwrap().text().await.unwrap();
    let prefix = format!("{name}{{{labels}}} ");
    text.lines().find_map(|l| l.strip_prefix(prefix.as_str())?.parse::<f64>().ok()).unwrap_or(0.0)
}

/// The sum of every sample of `name` on a Prometheus page.
pub async fn metric(url: &str, name: &str) -> f64 {
    let text = client().get(format!("{url}/metrics")).send().await.unwrap().text().await.unwrap();
    text.lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with([' ', '{']))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// A completion with a token-id prompt (no tokenization anywhere).
pub fn token_completion(prompt: &[u32], max_tokens: u32, stream: bool) -> Value {
    serde_json::json!({
        "model": "Qwen/Qwen3-0.6B",
        "prompt": prompt,
        "max_tokens": max_tokens,
        "ignore_eos": true,
        "stream": stream,
    })
}

/// An in-process gateway's replica entry for simulated replica `sim`, with
/// its KV event and replay endpoints on loopback.
pub fn replica_cfg(name: &str, sim: &Replica) -> ReplicaConfig {
    let mut r = ReplicaConfig::new(sim.url());
    r.name = Some(name.to_owned());
    let ep = sim.events().unwrap();
    r.events = Some(loopback_endpoint(&ep.events));
    r.replay = ep.replay.as_deref().map(loopback_endpoint);
    r
}

/// An in-process gateway on loopback (and an admin listener) in front of
/// `replicas`, with fast health and metrics probes and one tokenizer thread.
pub fn gw_config(replicas: Vec<ReplicaConfig>) -> GatewayConfig {
    let mut c = GatewayConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        admin_listen: Some("127.0.0.1:0".parse().unwrap()),
        replicas,
        ..GatewayConfig::default()
    };
    c.monitor.health_interval_ms = 200;
    c.monitor.metrics_interval_ms = 200;
    c.monitor.probe_timeout_ms = 1_000;
    c.model.tokenizer_threads = 1;
    c
}

/// A client for in-process servers: no proxy, 30 s per request.
pub fn local_client() -> reqwest::Client {
    reqwest::Client::builder().no_proxy().timeout(Duration::from_secs(30)).build().unwrap()
}

/// An in-process simulated replica at 20x speed, its KV events and replay
/// on loopback.
pub async fn inproc_sim(tok: &Arc<TokenizeService>) -> Replica {
    let mut events = PublisherConfig::new("tcp://127.0.0.1:0");
    events.force_bind = true;
    events.replay_endpoint = Some("tcp://127.0.0.1:0".to_owned());
    let config = ServerConfig {
        engine: EngineConfig::default(),
        speedup: 20.0,
        events: Some(events),
        ..ServerConfig::default()
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    start(config, listener, Arc::clone(tok)).await.unwrap()
}

/// Starts an in-process gateway and waits until it is ready; its base URL.
pub async fn start_gateway(c: GatewayConfig) -> (Gateway, String) {
    let gw = Gateway::start(c).await.unwrap();
    let base = format!("http://{}", gw.local_addr());
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if let Ok(r) = local_client().get(format!("{base}/ready")).send().await {
            if r.status() == 200 {
                return (gw, base);
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("kvgate never became ready");
}

/// Sends `req`: (status, `x-kvgate-replica`, body).
pub async fn exchange(req: reqwest::RequestBuilder) -> (u16, String, String) {
    let r = req.send().await.unwrap();
    let status = r.status().as_u16();
    let replica = r
        .headers()
        .get("x-kvgate-replica")
        .map_or(String::new(), |v| v.to_str().unwrap().to_owned());
    (status, replica, r.text().await.unwrap())
}

/// Sends a short chat completion to `base` with `headers` and reads the
/// whole answer, which must be a 200.
pub async fn chat_ok(base: &str, content: &str, stream: bool, headers: &[(&str, String)]) {
    let body = serde_json::json!({
        "model": "Qwen/Qwen3-0.6B",
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 4,
        "stream": stream,
    });
    let mut req = client().post(format!("{base}/v1/chat/completions")).json(&body);
    for (k, v) in headers {
        req = req.header(*k, v);
    }
    let r = req.send().await.unwrap();
    assert_eq!(r.status(), 200);
    r.bytes().await.unwrap();
}

/// Peers' tests: requests a replica's ledger holds, over every replica, as
/// `admin` sees it (its own and its peers' bookings).
pub async fn booked(admin: &str) -> u64 {
    let v = get_json(&format!("{admin}/admin/replicas")).await;
    v["replicas"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["prefill_requests"].as_u64().unwrap() + r["decoding_requests"].as_u64().unwrap())
        .sum()
}

pub async fn wait_for(what: &str, within: Duration, mut check: impl AsyncFnMut() -> bool) {
    let t0 = Instant::now();
    while !check().await {
        assert!(t0.elapsed() < within, "{what}: not within {within:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Starts `n` long streams on `base` (prompts from `seed`); returns their tasks.
pub fn long_streams(base: &str, n: u32, seed: u32) -> Vec<tokio::task::JoinHandle<usize>> {
    (0..n)
        .map(|i| {
            let url = format!("{base}/v1/completions");
            let prompt: Vec<u32> = (0..64).map(|t| 100 + seed * 10_000 + i * 1000 + t).collect();
            let body = token_completion(&prompt, 120, true);
            tokio::spawn(async move {
                let Ok(r) = client().post(&url).json(&body).send().await else { return 0 };
                r.bytes().await.map_or(0, |b| b.len())
            })
        })
        .collect()
}
