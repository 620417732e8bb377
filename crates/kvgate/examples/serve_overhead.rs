//! What kvgate costs on the request path, measured side by side in one run:
//!
//! 1. added TTFT: streaming chat requests alternately straight to a
//!    simulated replica and through `kvgate serve`, time to the first SSE
//!    chunk at the client;
//! 2. gateway CPU per short non-streamed chat request (CPU time of the
//!    `kvgate serve` process from /proc, minus its idle CPU over the same
//!    time);
//! 3. gateway CPU per 4k-token chat against the CPU of tokenizing that same
//!    request in-process (parse + render + encode, no prefix cache), with
//!    distinct conversations so no cache can help.
//!
//! ```text
//! cargo build --release -p kvgate && cargo run --release -p kvgate --example serve_overhead [-- N]
//! ```
//!
//! The simulated replicas run in this process at speedup 1000 (engine time
//! is negligible); the gateway is the release `kvgate` binary in its own
//! process, so its CPU is its own.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use kvgate_tokenize::{ChatRequest, ChatTokenizer, Endpoint};
use serde_json::json;

// The same allocator as the `kvgate` binary (kvgate-alloc's global
// allocator, linked by this use), so that in-process baselines are not
// handicapped by glibc's malloc.
use kvgate_alloc as _;

mod bench_support;
use bench_support::{free_ports, long_chat, spawn_gateway, start_sims, wait_ready, MODEL};

use kvgate_live::{cpu_seconds, schedstat_seconds};

/// CPU seconds per thread name of `pid` (threads of one name summed).
fn cpu_by_thread(pid: &str) -> std::collections::BTreeMap<String, f64> {
    let mut m = std::collections::BTreeMap::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return m };
    for t in tasks.flatten() {
        let name = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        *m.entry(name.trim().to_string()).or_insert(0.0) +=
            schedstat_seconds(&t.path().join("schedstat"));
    }
    m
}

/// Prints where the CPU went between two `cpu_by_thread` snapshots, per
/// request.
fn print_thread_split(
    what: &str,
    before: &std::collections::BTreeMap<String, f64>,
    after: &std::collections::BTreeMap<String, f64>,
    requests: usize,
) {
    let parts: Vec<String> = after
        .iter()
        .map(|(k, v)| (k, v - before.get(k).copied().unwrap_or(0.0)))
        .filter(|(_, d)| *d > 0.0)
        .map(|(k, d)| format!("{k} {:.1} µs", d * 1e6 / requests as f64))
        .collect();
    println!("({what}, gateway CPU per request by thread: {})", parts.join(", "));
}

/// CPU seconds spent between two `cpu_by_thread` snapshots by the
/// gateway's tokenizer threads (`kvgate-tokenize*`).
fn tokenizer_thread_seconds(
    before: &std::collections::BTreeMap<String, f64>,
    after: &std::collections::BTreeMap<String, f64>,
) -> f64 {
    after
        .iter()
        .filter(|(name, _)| name.starts_with("kvgate-tokenize"))
        .map(|(name, v)| v - before.get(name).copied().unwrap_or(0.0))
        .sum()
}

/// How the raw baseline tokenizes a chat body.
#[derive(Clone, Copy)]
enum RawMode {
    /// Parse, render, then the `tokenizers` library's own `encode_fast` on
    /// the tokenizer as loaded: what any gateway must at least do.
    Library,
    /// Parse, then kvgate's `ChatTokenizer::encode_chat` (render + encode,
    /// skipping the normalizer on normalized text), no prefix cache.
    Kvgate,
}

/// Raw tokenization on threads of their own, so that their CPU time can be
/// read exactly between requests, while they wait (reading the calling
/// thread's own figure would miss up to a scheduler tick per request).
struct RawTokenizer {
    workers: Vec<RawWorker>,
}

struct RawWorker {
    requests: std::sync::mpsc::Sender<(Vec<u8>, RawMode)>,
    done: std::sync::mpsc::Receiver<usize>,
    task: std::path::PathBuf,
}

impl RawTokenizer {
    /// `threads` tokenizer threads (the gateway's pool has one per core).
    fn start(tok: ChatTokenizer, threads: usize) -> Self {
        let tok = std::sync::Arc::new(tok);
        let workers = (0..threads)
            .map(|i| {
                let name = format!("raw-tokenize-{i}");
                let tok = std::sync::Arc::clone(&tok);
                let (requests, rx) = std::sync::mpsc::channel::<(Vec<u8>, RawMode)>();
                let (tx, done) = std::sync::mpsc::channel();
                std::thread::Builder::new()
                    .name(name.clone())
                    .spawn(move || {
                        for (b, mode) in rx {
                            let mut r: ChatRequest = serde_json::from_slice(&b).unwrap();
                            r.endpoint = Endpoint::ChatCompletions;
                            let n = match mode {
                                RawMode::Library => {
                                    let text = tok.render_chat(&r).unwrap();
                                    tok.tokenizer().encode_fast(text, false).unwrap().len()
                                }
                                RawMode::Kvgate => tok.encode_chat(&r).unwrap().len(),
                            };
                            tx.send(n).unwrap();
                        }
                    })
                    .unwrap();
                let task = own_thread_task(&name);
                RawWorker { requests, done, task }
            })
            .collect();
        Self { workers }
    }

    /// Tokens of each body and the CPU seconds of all of them, tokenized
    /// concurrently over the threads (body i on thread i mod threads).
    fn tokenize(&self, bodies: &[Vec<u8>], mode: RawMode) -> (Vec<usize>, f64) {
        let c0: f64 = self.workers.iter().map(RawWorker::cpu_when_idle).sum();
        for (i, b) in bodies.iter().enumerate() {
            self.workers[i % self.workers.len()].requests.send((b.clone(), mode)).unwrap();
        }
        let tokens = (0..bodies.len())
            .map(|i| self.workers[i % self.workers.len()].done.recv().unwrap())
            .collect();
        let c1: f64 = self.workers.iter().map(RawWorker::cpu_when_idle).sum();
        (tokens, c1 - c0)
    }
}

impl RawWorker {
    fn cpu_when_idle(&self) -> f64 {
        thread_cpu_when_idle(&self.task)
    }
}

/// The /proc task directory of this process's thread named `name` (just
/// spawned: waits up to 5 s for it to appear).
fn own_thread_task(name: &str) -> std::path::PathBuf {
    let t0 = Instant::now();
    loop {
        let found = std::fs::read_dir("/proc/self/task").unwrap().flatten().find(|t| {
            std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim() == name)
        });
        if let Some(t) = found {
            return t.path();
        }
        assert!(t0.elapsed() < Duration::from_secs(5), "thread {name} not found");
        std::thread::yield_now();
    }
}

/// CPU seconds of the thread at `task` (a /proc task directory), read once
/// it sleeps, so that its schedstat is current.
fn thread_cpu_when_idle(task: &std::path::Path) -> f64 {
    loop {
        let stat = std::fs::read_to_string(task.join("stat")).unwrap();
        let state = stat.rsplit(')').next().and_then(|r| r.split_whitespace().next());
        if state == Some("S") {
            return schedstat_seconds(&task.join("schedstat"));
        }
        std::thread::yield_now();
    }
}

/// The machine's own penalty for running after a pause: the CPU time of one
/// fixed piece of kvgate's request path (render + encode of a short chat)
/// run back to back, and run once per `gap` (the spacing a one-at-a-time
/// client leaves between requests). Shared, virtualised cores lose their
/// caches while a thread sleeps; this shows by how much, side by side.
fn pause_penalty(gap: Duration) -> (f64, f64) {
    let tok = ChatTokenizer::bundled().unwrap();
    let job = move |i: usize| {
        let body = json!({"messages": [{"role": "user", "content": format!("Hello number {i}, how are you?")}]});
        let r: ChatRequest = serde_json::from_value(body).unwrap();
        std::hint::black_box(tok.encode_chat(&r).unwrap());
    };
    let (go, rx) = std::sync::mpsc::channel::<Option<Duration>>();
    let (tx, done) = std::sync::mpsc::channel::<()>();
    let name = "pause-control";
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            let mut i = 0;
            while let Ok(Some(pause)) = rx.recv() {
                for _ in 0..if pause.is_zero() { 2000 } else { 400 } {
                    std::thread::sleep(pause);
                    job(i);
                    i += 1;
                }
                tx.send(()).unwrap();
            }
        })
        .unwrap();
    let task = own_thread_task(name);
    let run = |pause: Duration, n: f64| {
        let c0 = thread_cpu_when_idle(&task);
        go.send(Some(pause)).unwrap();
        done.recv().unwrap();
        (thread_cpu_when_idle(&task) - c0) / n
    };
    let hot = run(Duration::ZERO, 2000.0);
    let paused = run(gap, 400.0);
    let _ = go.send(None);
    (hot, paused)
}

/// Whether a phase runs: `KVGATE_BENCH_PHASES` lists them (ttft, short1,
/// short16, long1, long4, stream), all by default; for profiling one at a
/// time.
fn phase(name: &str) -> bool {
    std::env::var("KVGATE_BENCH_PHASES").map_or(true, |p| p.split(',').any(|x| x.trim() == name))
}

/// Runs `KVGATE_BENCH_HOOK begin|end PHASE` around a measured phase, if
/// set: for instance to zero and dump a gateway's counters under callgrind
/// (`callgrind_control -z` / `-d`), which count instructions where this
/// machine has no hardware counters and its CPU times are noisy.
fn hook(what: &str, phase: &str) {
    if let Ok(cmd) = std::env::var("KVGATE_BENCH_HOOK") {
        let status = std::process::Command::new("sh")
            .args(["-c", &format!("{cmd} {what} {phase}")])
            .status();
        assert!(status.is_ok_and(|s| s.success()), "KVGATE_BENCH_HOOK failed");
    }
}

/// The environment variable `name` parsed, else `default`.
fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// `max_tokens` of the short requests (`KVGATE_BENCH_SHORT_MAX_TOKENS`, 2).
fn short_max_tokens() -> u32 {
    env_or("KVGATE_BENCH_SHORT_MAX_TOKENS", 2)
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * p).round() as usize]
}

/// One row of the long-chat comparison.
struct LongRow {
    name: &'static str,
    conc: usize,
    tokens: usize,
    gateway_cpu: f64,
    tokenizer_threads: f64,
    tokenize_wall: f64,
    raw_cpu: f64,
    kvgate_tokenizer_cpu: f64,
}

/// The gateway's own `kvgate_tokenize_seconds_sum` (wall time tokenizing).
async fn gateway_tokenize_seconds(client: &reqwest::Client, base: &str) -> f64 {
    let text = client.get(format!("{base}/metrics")).send().await.unwrap().text().await.unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix("kvgate_tokenize_seconds_sum "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

async fn ttft(client: &reqwest::Client, url: &str, body: &serde_json::Value) -> f64 {
    let t = Instant::now();
    let resp = client.post(url).json(body).send().await.unwrap();
    assert!(resp.status().is_success(), "{}", resp.status());
    let mut s = resp.bytes_stream();
    let mut first = None;
    while let Some(chunk) = s.next().await {
        let chunk = chunk.unwrap();
        if first.is_none() && chunk.windows(5).any(|w| w == b"data:") {
            first = Some(t.elapsed().as_secs_f64());
        }
    }
    first.unwrap()
}

#[tokio::main]
async fn main() {
    let n: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(400);
    let n_long = (n / 4).max(20);

    // 3a. Raw tokenization CPU of the long chats, before anything else runs.
    // Groups: one at a time, four at a time, and one at a time streaming
    // 200 tokens back (what a chat client does).
    let bodies: Vec<Vec<u8>> = (0..3 * n_long)
        .map(|i| {
            let body = if i < 2 * n_long {
                json!({"model": MODEL, "messages": long_chat(i), "max_tokens": 1})
            } else {
                json!({"model": MODEL, "messages": long_chat(i), "max_tokens": 200,
                       "stream": true, "ignore_eos": true})
            };
            serde_json::to_vec(&body).unwrap()
        })
        .collect();
    let tok = ChatTokenizer::bundled().unwrap();

    let sims = start_sims(2, 65_536, 1000.0).await;
    let (port, admin) = free_ports();
    let mut gw = spawn_gateway(&sims, port, admin);
    let gw_pid = gw.id();
    let gw_pid_text = gw_pid.to_string();
    let client = reqwest::Client::new();
    let base = format!("http://127.0.0.1:{port}");
    wait_ready(&client, &base).await;

    // 1. Added TTFT, interleaved.
    let short = |i: usize, stream: bool| {
        json!({"model": MODEL, "stream": stream, "max_tokens": 2,
               "messages": [{"role": "user", "content": format!("Hello number {i}, how are you?")}]})
    };
    let direct_url = format!("{}/v1/chat/completions", sims[0].url());
    let via_url = format!("{base}/v1/chat/completions");
    let n_ttft = if phase("ttft") { n } else { 1 };
    for i in 0..20 {
        ttft(&client, &direct_url, &short(i, true)).await;
        ttft(&client, &via_url, &short(i, true)).await;
    }
    let (mut direct, mut via) = (Vec::new(), Vec::new());
    for i in 0..n_ttft {
        direct.push(ttft(&client, &direct_url, &short(i, true)).await * 1e3);
        via.push(ttft(&client, &via_url, &short(i, true)).await * 1e3);
    }
    let (d50, v50) = (pct(&mut direct, 0.5), pct(&mut via, 0.5));
    let (d90, v90) = (pct(&mut direct, 0.9), pct(&mut via, 0.9));

    // 2. CPU per short non-streamed request, minus idle CPU, sequential and
    // with 16 concurrent clients (wake-ups amortise under load).
    let idle_t = Instant::now();
    let i0 = cpu_seconds(gw_pid);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let idle_rate = (cpu_seconds(gw_pid) - i0) / idle_t.elapsed().as_secs_f64();
    let mut short_cpu = [0.0; 2];
    let mut short_gap = None;
    for (k, conc) in
        [1usize, 16].into_iter().enumerate().filter(|(_, c)| phase(&format!("short{c}")))
    {
        let total = n * 4;
        hook("begin", &format!("short{conc}"));
        let threads0 = cpu_by_thread(&gw_pid_text);
        let c0 = cpu_seconds(gw_pid);
        let t = Instant::now();
        let mut tasks = Vec::new();
        for w in 0..conc {
            let (client, url) = (client.clone(), via_url.clone());
            tasks.push(tokio::spawn(async move {
                for i in (w..total).step_by(conc) {
                    let body = json!({"model": MODEL, "max_tokens": short_max_tokens(),
                        "messages": [{"role": "user", "content": format!("Hello number {i}, how are you?")}]});
                    let r = client.post(&url).json(&body).send().await.unwrap();
                    assert!(r.status().is_success());
                    r.bytes().await.unwrap();
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        let wall = t.elapsed().as_secs_f64();
        hook("end", &format!("short{conc}"));
        short_cpu[k] = ((cpu_seconds(gw_pid) - c0) - idle_rate * wall) / total as f64;
        println!("(short, {conc} at a time: {:.1} µs wall per request)", wall * 1e6 / total as f64);
        if conc == 1 {
            short_gap = Some(Duration::from_secs_f64(wall / total as f64));
        }
        print_thread_split(
            &format!("short, {conc} at a time"),
            &threads0,
            &cpu_by_thread(&gw_pid_text),
            total,
        );
    }

    // 3. Per distinct ~4k-token chat, interleaved so that both sides run
    // under the same conditions: tokenize a group of chats here (parse,
    // render, encode, on a dedicated thread; the gateway and sims idle
    // meanwhile), then send the same group through the gateway, one at a
    // time or all at once. The gateway's CPU is read once around each phase,
    // when it is idle, minus its idle rate.
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    // The reference `tokenizers` tokenizer is built on first use when the
    // fast encoder is in use: build it now, not inside the first measured
    // raw encode.
    tok.tokenizer();
    let raw = RawTokenizer::start(tok, cores);
    let mut long_rows = Vec::new();
    let groups = [
        ("long1", 1usize, &bodies[..n_long]),
        ("long4", 4, &bodies[n_long..2 * n_long]),
        ("long1s", 1, &bodies[2 * n_long..]),
    ];
    for (name, conc, group) in groups {
        if !phase(name) {
            continue;
        }
        let (mut raw_cpu, mut kvgate_cpu, mut tokens) = (0.0, 0.0, 0usize);
        let (mut lib_n, mut kvgate_n) = (0usize, 0usize);
        let tok_before = gateway_tokenize_seconds(&client, &base).await;
        let threads0 = cpu_by_thread(&gw_pid_text);
        let c0 = cpu_seconds(gw_pid);
        let t = Instant::now();
        for (chunk_no, chunk) in group.chunks(conc).enumerate() {
            // As many at a time as the gateway gets, over as many threads
            // as its tokenizer pool has (a busy neighbour core slows a
            // thread down: both sides must see the same parallelism). One
            // raw pass per group, the two raw modes taking turns, so that
            // every pass, raw or gateway, follows a pause of the other side
            // (a tokenizer that just ran has its tables in cache).
            let mode = if chunk_no % 2 == 0 { RawMode::Library } else { RawMode::Kvgate };
            let (n, cpu) = raw.tokenize(chunk, mode);
            match mode {
                RawMode::Library => {
                    tokens += n.iter().sum::<usize>();
                    lib_n += chunk.len();
                    raw_cpu += cpu;
                }
                RawMode::Kvgate => {
                    kvgate_n += chunk.len();
                    kvgate_cpu += cpu;
                }
            }
            let sends = chunk.iter().map(|b| {
                let (client, url, body) = (client.clone(), via_url.clone(), b.clone());
                async move {
                    let resp = client
                        .post(&url)
                        .header("content-type", "application/json")
                        .body(body)
                        .send()
                        .await
                        .unwrap();
                    assert!(resp.status().is_success(), "{}", resp.status());
                    resp.bytes().await.unwrap();
                }
            });
            futures_util::future::join_all(sends).await;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        let wall = t.elapsed().as_secs_f64();
        let k = group.len() as f64;
        let threads1 = cpu_by_thread(&gw_pid_text);
        print_thread_split(&format!("long, {conc} at a time"), &threads0, &threads1, group.len());
        long_rows.push(LongRow {
            name,
            conc,
            tokens: tokens / lib_n.max(1),
            gateway_cpu: (cpu_seconds(gw_pid) - c0 - idle_rate * wall) / k,
            tokenizer_threads: tokenizer_thread_seconds(&threads0, &threads1) / k,
            tokenize_wall: (gateway_tokenize_seconds(&client, &base).await - tok_before) / k,
            raw_cpu: raw_cpu / lib_n.max(1) as f64,
            kvgate_tokenizer_cpu: kvgate_cpu / kvgate_n.max(1) as f64,
        });
    }

    // 4. Gateway CPU per relayed SSE chunk: streamed token-id completions
    // (nothing to tokenize) on a fleet slow enough that each token is its
    // own event on the wire, long and short streams side by side. The
    // whole gateway's CPU (idle subtracted) is divided by the chunks the
    // client received; the marginal figure divides the difference between
    // the long and short runs by the difference in chunks, which takes out
    // what a request costs apart from its stream.
    let stream_rows = if phase("stream") {
        let _ = gw.kill();
        let _ = gw.wait();
        // KVGATE_BENCH_STREAM_SPEEDUP: the fleet's pace (25); slower
        // fleets put fewer chunks in each read from the engine.
        let slow = start_sims(2, 65_536, env_or("KVGATE_BENCH_STREAM_SPEEDUP", 25.0)).await;
        let (port, admin) = free_ports();
        gw = spawn_gateway(&slow, port, admin);
        let pid = gw.id();
        let base = format!("http://127.0.0.1:{port}");
        wait_ready(&client, &base).await;
        let url = format!("{base}/v1/completions");
        let mut rows = Vec::new();
        for (k, max_tokens) in [16u32, 256, 16, 256].into_iter().enumerate() {
            let requests = 64usize;
            // The second pair is the measured one (the first warmed up).
            let hooked = (k >= 2).then(|| format!("stream{max_tokens}"));
            if let Some(h) = &hooked {
                hook("begin", h);
            }
            let c0 = cpu_seconds(pid);
            let t = Instant::now();
            let tasks: Vec<_> = (0..16)
                .map(|w| {
                    let (client, url) = (client.clone(), url.clone());
                    tokio::spawn(async move {
                        let mut chunks = 0usize;
                        for i in (w..requests).step_by(16) {
                            let prompt: Vec<u32> = (0..64)
                                .map(|j| 1000 + ((i * 64 + j + k * 4096) % 30_000) as u32)
                                .collect();
                            let body = json!({"model": MODEL, "prompt": prompt, "stream": true,
                                "max_tokens": max_tokens, "ignore_eos": true});
                            let r = client.post(&url).json(&body).send().await.unwrap();
                            assert!(r.status().is_success(), "{}", r.status());
                            let text = r.bytes().await.unwrap();
                            chunks += text.windows(5).filter(|w| w == b"data:").count();
                        }
                        chunks
                    })
                })
                .collect();
            let mut chunks = 0;
            for t in tasks {
                chunks += t.await.unwrap();
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
            let wall = t.elapsed().as_secs_f64();
            let cpu = cpu_seconds(pid) - c0 - idle_rate * wall;
            if let Some(h) = &hooked {
                hook("end", h);
            }
            rows.push((max_tokens, requests, chunks, cpu));
        }
        rows
    } else {
        Vec::new()
    };

    println!("| What | Measured | Target |");
    println!("|---|---|---|");
    println!(
        "| TTFT p50 direct / via kvgate (added) | {d50:.3} / {v50:.3} ms (+{:.3} ms) | added p50 ≤ 0.5 ms |",
        v50 - d50
    );
    println!("| TTFT p90 direct / via kvgate | {d90:.3} / {v90:.3} ms | |");
    println!(
        "| Gateway CPU per short non-streamed chat, 1 / 16 concurrent clients | {:.1} / {:.1} µs (idle {:.2} ms/s subtracted) | ≤ 100 µs |",
        short_cpu[0] * 1e6,
        short_cpu[1] * 1e6,
        idle_rate * 1e3
    );
    if let Some(gap) = short_gap {
        let (hot, paused) = pause_penalty(gap);
        println!(
            "| Control: render + encode of one short chat in the bench process, back to back / once per {:.2} ms | {:.1} / {:.1} µs = {:.2}× | |",
            gap.as_secs_f64() * 1e3,
            hot * 1e6,
            paused * 1e6,
            paused / hot
        );
    }
    for r in &long_rows {
        println!(
            "| Gateway CPU per distinct {}-token chat{} vs raw tokenization (library encode), {} at a time | {:.0} µs vs {:.0} µs = {:.2}× (vs kvgate's own tokenizer call, {:.0} µs: {:.2}×; tokenizer threads {:.0} µs CPU = {:.2}× raw; tokenize timer {:.0} µs wall) | {} |",
            r.tokens,
            if r.name == "long1s" { ", streamed with 200 output tokens," } else { "" },
            r.conc,
            r.gateway_cpu * 1e6,
            r.raw_cpu * 1e6,
            r.gateway_cpu / r.raw_cpu,
            r.kvgate_tokenizer_cpu * 1e6,
            r.gateway_cpu / r.kvgate_tokenizer_cpu,
            r.tokenizer_threads * 1e6,
            r.tokenizer_threads / r.raw_cpu,
            r.tokenize_wall * 1e6,
            if r.name == "long1s" { "≤ 0.5×" } else { "≤ 1.1×" }
        );
    }
    // The second pair of stream runs (the first warmed the gateway up).
    if let [.., (short_tokens, _, short_chunks, short_cpu), (long_tokens, long_n, long_chunks, long_cpu)] =
        stream_rows[..]
    {
        println!(
            "| Gateway CPU per relayed SSE chunk, streams of {long_tokens} tokens (whole gateway ÷ chunks; marginal over {short_tokens}-token streams) | {:.2} µs ({long_chunks} chunks, {:.0} µs per request); marginal {:.2} µs | ≤ 2 µs |",
            long_cpu * 1e6 / long_chunks as f64,
            long_cpu * 1e6 / long_n as f64,
            (long_cpu - short_cpu) * 1e6 / (long_chunks as f64 - short_chunks as f64).max(1.0),
        );
    }
    println!("({n} TTFT pairs, {} short requests per row, {n_long} long chats per row)", n * 4);
    let _ = gw.kill();
    let _ = gw.wait();
}
