//! Load and soak: open-loop Poisson traffic against `kvgate serve`
//! in front of 8 simulated replicas, on this machine.
//!
//! Every arrival is a streamed chat (one of 16 system prompts of ~300
//! tokens, then a distinct user turn; a pool of bodies built before the
//! run). Half the arrivals, chosen at random, go straight to a random
//! replica, the other half through kvgate, in the same run: the difference
//! between the two TTFT distributions is what kvgate adds. The direct ones
//! carry their token ids (`kv_transfer_params.prompt_token_ids`, computed
//! before the run), exactly as kvgate forwards them, so the engines do the
//! same work on both paths and kvgate's tokenization counts against it. The
//! engines run 1000× faster than real time; everything shares the
//! machine's two cores.
//!
//! ```text
//! cargo build --release -p kvgate --examples
//! # step the rate up until kvgate's added p99 TTFT passes 5 ms
//! target/release/examples/load find-max --rates 25,50,100,150,200,300 --secs 20
//! # hold a rate for 30 minutes, sampling kvgate's memory every minute
//! target/release/examples/load soak --rate 70 --minutes 30 --out docs/img
//! ```

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout, clippy::print_stderr)]

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};
use futures_util::StreamExt;
use kvgate_replay::{line_chart, Line};
use kvgate_tokenize::{ChatRequest, ChatTokenizer, Endpoint};
use serde_json::json;
use tokio::sync::mpsc;

mod bench_support;
use bench_support::{free_ports, spawn_gateway, start_sims, wait_ready, MODEL};

// The same allocator as the `kvgate` binary (kvgate-alloc's global
// allocator, linked by this use), so that in-process baselines are not
// handicapped by glibc's malloc.
use kvgate_alloc as _;

#[derive(Parser)]
#[command(about = "Open-loop load against kvgate serve and 8 simulated replicas")]
struct Args {
    #[command(subcommand)]
    mode: Mode,
    /// Simulated replicas.
    #[arg(long, default_value_t = 8, global = true)]
    replicas: usize,
    /// GPU KV blocks per replica (small, so that caches churn and the index
    /// is exercised at its bound).
    #[arg(long, default_value_t = 4096, global = true)]
    gpu_blocks: u32,
    /// Output tokens per request.
    #[arg(long, default_value_t = 8, global = true)]
    max_tokens: u32,
    /// Distinct request bodies built before the run.
    #[arg(long, default_value_t = 20_000, global = true)]
    bodies: usize,
}

#[derive(Subcommand)]
enum Mode {
    /// Step through rates; report each, and the highest rate whose added p99
    /// TTFT stays within the limit with no errors.
    FindMax {
        /// Requests per second to try, in order.
        #[arg(long, value_delimiter = ',', default_value = "25,50,100,150,200,300")]
        rates: Vec<f64>,
        /// Seconds per rate (the first 2 are warm-up and not counted).
        #[arg(long, default_value_t = 20)]
        secs: u64,
        /// Added p99 TTFT allowed, ms.
        #[arg(long, default_value_t = 5.0)]
        limit_ms: f64,
    },
    /// Hold one rate; sample kvgate's RSS and index size every minute.
    Soak {
        /// Requests per second.
        #[arg(long)]
        rate: f64,
        /// Duration.
        #[arg(long, default_value_t = 30)]
        minutes: u64,
        /// Where `soak.csv` and `soak-rss.svg` go.
        #[arg(long, default_value = ".")]
        out: PathBuf,
        /// Seconds between samples (60 for the record; less to try it).
        #[arg(long, default_value_t = 60)]
        sample_secs: u64,
    },
}

/// One finished request.
struct Outcome {
    via: bool,
    /// Time to the first SSE data event; `None` when the request failed.
    ttft: Option<f64>,
    /// HTTP status (0: connection error).
    status: u16,
}

/// Request bodies built before the run: the client's chat, and the same
/// chat with its token ids for the direct path.
struct Prompts {
    via: Vec<Vec<u8>>,
    direct: Vec<Vec<u8>>,
}

const WORDS: [&str; 16] = [
    "kernel", "cache", "route", "token", "stream", "replica", "prefix", "block", "engine", "batch",
    "queue", "decode", "prefill", "tensor", "memory", "latency",
];

fn text(seed: u64, words: usize) -> String {
    let mut x = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407) | 1;
    let mut out = String::new();
    for _ in 0..words {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.push_str(WORDS[(x % 16) as usize]);
        out.push(' ');
    }
    out
}

impl Prompts {
    /// `n` distinct chats (used round-robin; a longer run repeats them).
    fn new(n: usize, max_tokens: u32) -> Prompts {
        let tok = ChatTokenizer::bundled().unwrap();
        let systems: Vec<String> =
            (0..16).map(|i| format!("Assistant {i}. {}", text(i, 250))).collect();
        let (mut via, mut direct) = (Vec::with_capacity(n), Vec::with_capacity(n));
        for i in 0..n as u64 {
            let mut body = json!({
                "model": MODEL,
                "stream": true,
                "max_tokens": max_tokens,
                "messages": [
                    {"role": "system", "content": systems[(i % 16) as usize]},
                    {"role": "user", "content": text(1_000_000 + i, 30)},
                ],
            });
            via.push(serde_json::to_vec(&body).unwrap());
            let mut req: ChatRequest = serde_json::from_value(body.clone()).unwrap();
            req.endpoint = Endpoint::ChatCompletions;
            let ids = tok.encode_chat(&req).unwrap();
            body["kv_transfer_params"] = json!({"prompt_token_ids": ids});
            direct.push(serde_json::to_vec(&body).unwrap());
        }
        Prompts { via, direct }
    }

    fn body(&self, n: u64, via: bool) -> Vec<u8> {
        let pool = if via { &self.via } else { &self.direct };
        pool[(n % pool.len() as u64) as usize].clone()
    }
}

async fn one(client: reqwest::Client, url: String, body: Vec<u8>, via: bool) -> Outcome {
    let t = Instant::now();
    let resp = client.post(&url).header("content-type", "application/json").body(body).send().await;
    let resp = match resp {
        Ok(r) => r,
        Err(_) => return Outcome { via, ttft: None, status: 0 },
    };
    let status = resp.status().as_u16();
    if status != 200 {
        let _ = resp.bytes().await;
        return Outcome { via, ttft: None, status };
    }
    let mut s = resp.bytes_stream();
    let mut first = None;
    let mut ok = true;
    while let Some(chunk) = s.next().await {
        match chunk {
            Ok(c) => {
                if first.is_none() && c.windows(5).any(|w| w == b"data:") {
                    first = Some(t.elapsed().as_secs_f64());
                }
                if c.windows(8).any(|w| w == b"\"error\":") {
                    ok = false;
                }
            }
            Err(_) => ok = false,
        }
    }
    Outcome { via, ttft: first.filter(|_| ok), status }
}

/// The traffic: Poisson arrivals at `rate` for `secs`, half through kvgate.
struct Traffic {
    client: reqwest::Client,
    via_url: String,
    direct_urls: Vec<String>,
    prompts: Arc<Prompts>,
}

impl Traffic {
    /// Sends for `dur`; every outcome goes to `tx`.
    async fn run(&self, rate: f64, dur: Duration, seed: u64, tx: mpsc::UnboundedSender<Outcome>) {
        let mut x = seed | 1;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 11) as f64 / (1u64 << 53) as f64
        };
        let start = tokio::time::Instant::now();
        let mut at = 0.0;
        let mut n = seed.wrapping_mul(1_000_003);
        loop {
            at += -(1.0 - next()).ln() / rate;
            if at >= dur.as_secs_f64() {
                break;
            }
            tokio::time::sleep_until(start + Duration::from_secs_f64(at)).await;
            n += 1;
            let via = next() < 0.5;
            let url = if via {
                self.via_url.clone()
            } else {
                let i = (next() * self.direct_urls.len() as f64) as usize;
                self.direct_urls[i.min(self.direct_urls.len() - 1)].clone()
            };
            let (client, body, tx) = (self.client.clone(), self.prompts.body(n, via), tx.clone());
            tokio::spawn(async move {
                let _ = tx.send(one(client, url, body, via).await);
            });
        }
    }
}

fn quantile(v: &mut [f64], q: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * q).round() as usize]
}

/// Figures of one window of outcomes.
#[derive(Clone, Copy, Debug)]
struct Window {
    sent: usize,
    errors: usize,
    shed: usize,
    direct_p50: f64,
    direct_p99: f64,
    via_p50: f64,
    via_p99: f64,
}

impl Window {
    fn of(outcomes: &[Outcome]) -> Window {
        let mut direct: Vec<f64> =
            outcomes.iter().filter(|o| !o.via).filter_map(|o| o.ttft).collect();
        let mut via: Vec<f64> = outcomes.iter().filter(|o| o.via).filter_map(|o| o.ttft).collect();
        Window {
            sent: outcomes.len(),
            errors: outcomes.iter().filter(|o| o.ttft.is_none() && o.status != 429).count(),
            shed: outcomes.iter().filter(|o| o.status == 429).count(),
            direct_p50: quantile(&mut direct, 0.5) * 1e3,
            direct_p99: quantile(&mut direct, 0.99) * 1e3,
            via_p50: quantile(&mut via, 0.5) * 1e3,
            via_p99: quantile(&mut via, 0.99) * 1e3,
        }
    }

    fn added_p50(&self) -> f64 {
        self.via_p50 - self.direct_p50
    }

    fn added_p99(&self) -> f64 {
        self.via_p99 - self.direct_p99
    }
}

fn rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
        .unwrap_or(0.0)
        / 1024.0
}

/// The sum of every sample of `name` on kvgate's `/metrics`.
async fn metric(client: &reqwest::Client, base: &str, name: &str) -> f64 {
    let Ok(r) = client.get(format!("{base}/metrics")).send().await else { return f64::NAN };
    let text = r.text().await.unwrap_or_default();
    text.lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with([' ', '{']))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Cumulative kvgate counters, read from its `/metrics`.
#[derive(Clone, Copy, Debug, Default)]
struct Gauges {
    tokenize_s: f64,
    tokenized: f64,
    decide_s: f64,
    decided: f64,
    cpu_s: f64,
}

impl Gauges {
    async fn read(client: &reqwest::Client, base: &str) -> Gauges {
        Gauges {
            tokenize_s: metric(client, base, "kvgate_tokenize_seconds_sum").await,
            tokenized: metric(client, base, "kvgate_tokenize_seconds_count").await,
            decide_s: metric(client, base, "kvgate_decide_seconds_sum").await,
            decided: metric(client, base, "kvgate_decide_seconds_count").await,
            cpu_s: metric(client, base, "kvgate_process_cpu_seconds_total").await,
        }
    }

    fn since(&self, before: &Gauges) -> Gauges {
        Gauges {
            tokenize_s: self.tokenize_s - before.tokenize_s,
            tokenized: self.tokenized - before.tokenized,
            decide_s: self.decide_s - before.decide_s,
            decided: self.decided - before.decided,
            cpu_s: self.cpu_s - before.cpu_s,
        }
    }
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    eprintln!("building {} request bodies…", args.bodies);
    let prompts = Prompts::new(args.bodies, args.max_tokens);
    let sims = start_sims(args.replicas, args.gpu_blocks, 1000.0).await;
    let (port, admin) = free_ports();
    let mut gw = spawn_gateway(&sims, port, admin);
    let pid = gw.id();
    let client = reqwest::Client::builder().pool_max_idle_per_host(1024).build().unwrap();
    let base = format!("http://127.0.0.1:{port}");
    wait_ready(&client, &base).await;
    let traffic = Traffic {
        client: client.clone(),
        via_url: format!("{base}/v1/chat/completions"),
        direct_urls: sims.iter().map(|s| format!("{}/v1/chat/completions", s.url())).collect(),
        prompts: Arc::new(prompts),
    };
    // Warm both paths (connections, the tokenizer's caches).
    let (tx, mut rx) = mpsc::unbounded_channel();
    traffic.run(20.0, Duration::from_secs(2), 99, tx).await;
    while rx.recv().await.is_some() {}

    match args.mode {
        Mode::FindMax { rates, secs, limit_ms } => {
            println!("| Rate (req/s) | Sent | Errors | 429 | TTFT p50 direct / via (ms) | TTFT p99 direct / via (ms) | Added p50 / p99 (ms) | kvgate tokenize / decide mean (µs) | kvgate CPU (cores) |");
            println!("|---|---|---|---|---|---|---|---|---|");
            let mut best = None;
            for (i, &rate) in rates.iter().enumerate() {
                let (tx, mut rx) = mpsc::unbounded_channel();
                let warmup = Duration::from_secs(2);
                let before = Gauges::read(&client, &base).await;
                let started = Instant::now();
                traffic.run(rate, Duration::from_secs(secs), 1000 + i as u64, tx).await;
                let mut outcomes = Vec::new();
                while let Some(o) = rx.recv().await {
                    outcomes.push(o);
                }
                // Counted: everything but roughly the first two seconds.
                let skip = ((warmup.as_secs_f64() / started.elapsed().as_secs_f64())
                    * outcomes.len() as f64) as usize;
                let w = Window::of(&outcomes[skip.min(outcomes.len())..]);
                let d = Gauges::read(&client, &base).await.since(&before);
                let cpu = d.cpu_s / started.elapsed().as_secs_f64();
                println!(
                    "| {rate:.0} | {} | {} | {} | {:.2} / {:.2} | {:.2} / {:.2} | {:+.2} / {:+.2} | {:.0} / {:.0} | {cpu:.2} |",
                    w.sent,
                    w.errors,
                    w.shed,
                    w.direct_p50,
                    w.via_p50,
                    w.direct_p99,
                    w.via_p99,
                    w.added_p50(),
                    w.added_p99(),
                    d.tokenize_s / d.tokenized.max(1.0) * 1e6,
                    d.decide_s / d.decided.max(1.0) * 1e6,
                );
                if w.errors > 0 || w.shed > 0 || w.added_p99() > limit_ms {
                    break;
                }
                best = Some(rate);
            }
            match best {
                Some(r) => println!("\nmaximum sustained rate with added p99 TTFT ≤ {limit_ms} ms and no errors: {r:.0} req/s"),
                None => println!("\neven the first rate missed the limit"),
            }
        }
        Mode::Soak { rate, minutes, out, sample_secs } => {
            std::fs::create_dir_all(&out).unwrap();
            let total = Duration::from_secs(minutes * 60);
            let (tx, mut rx) = mpsc::unbounded_channel();
            let started = Instant::now();
            let sender = {
                let t = Traffic {
                    client: traffic.client.clone(),
                    via_url: traffic.via_url.clone(),
                    direct_urls: traffic.direct_urls.clone(),
                    prompts: Arc::clone(&traffic.prompts),
                };
                tokio::spawn(async move { t.run(rate, total, 7, tx).await })
            };
            let mut csv = String::from(
                "minute,rss_mib,index_blocks,index_mib,sent,errors,shed,added_p50_ms,added_p99_ms\n",
            );
            let (mut rss, mut idx) = (Vec::new(), Vec::new());
            let sample = |at: f64, w: Option<Window>, rss_v: f64, blocks: f64, bytes: f64| {
                let w = w.unwrap_or(Window {
                    sent: 0,
                    errors: 0,
                    shed: 0,
                    direct_p50: f64::NAN,
                    direct_p99: f64::NAN,
                    via_p50: f64::NAN,
                    via_p99: f64::NAN,
                });
                format!(
                    "{at:.2},{rss_v:.1},{blocks:.0},{:.2},{},{},{},{:.3},{:.3}\n",
                    bytes / 1048576.0,
                    w.sent,
                    w.errors,
                    w.shed,
                    w.added_p50(),
                    w.added_p99()
                )
            };
            let mut totals = (0usize, 0usize, 0usize);
            let r0 = rss_mib(pid);
            csv.push_str(&sample(0.0, None, r0, 0.0, 0.0));
            rss.push((0.0, r0));
            let mut window = Vec::new();
            let mut tick = tokio::time::interval_at(
                tokio::time::Instant::now() + Duration::from_secs(sample_secs),
                Duration::from_secs(sample_secs),
            );
            let mut sending = true;
            loop {
                tokio::select! {
                    o = rx.recv(), if sending => match o {
                        Some(o) => window.push(o),
                        None => { sending = false; }
                    },
                    _ = tick.tick() => {
                        let at = started.elapsed().as_secs_f64() / 60.0;
                        let w = Window::of(&window);
                        totals = (totals.0 + w.sent, totals.1 + w.errors, totals.2 + w.shed);
                        window.clear();
                        let r = rss_mib(pid);
                        let blocks = metric(&client, &base, "kvgate_index_blocks").await;
                        let bytes = metric(&client, &base, "kvgate_index_bytes").await;
                        csv.push_str(&sample(at, Some(w), r, blocks, bytes));
                        rss.push((at, r));
                        idx.push((at, bytes / 1048576.0));
                        eprintln!(
                            "{at:5.1} min: RSS {r:.1} MiB, index {blocks:.0} blocks ({:.1} MiB), {} sent, {} errors, {} shed, added TTFT p50 {:+.2} / p99 {:+.2} ms",
                            bytes / 1048576.0, w.sent, w.errors, w.shed, w.added_p50(), w.added_p99()
                        );
                        if !sending && started.elapsed() >= total {
                            break;
                        }
                    }
                }
            }
            sender.await.unwrap();
            std::fs::write(out.join("soak.csv"), &csv).unwrap();
            let title = format!(
                "kvgate RSS during a {minutes}-minute soak at {rate:.0} req/s ({} replicas)",
                args.replicas
            );
            line_chart(
                &out.join("soak-rss.svg"),
                &title,
                "minutes",
                "MiB",
                &[
                    Line { label: "kvgate RSS".into(), points: rss.clone() },
                    Line { label: "index estimate".into(), points: idx },
                ],
            )
            .unwrap();
            let first = rss.get(1).map_or(r0, |p| p.1);
            let (lo, hi) =
                rss.iter().skip(1).fold((f64::MAX, 0f64), |(lo, hi), p| (lo.min(p.1), hi.max(p.1)));
            println!(
                "soak: {} requests, {} errors, {} shed; RSS at start {r0:.1} MiB, after the first sample {first:.1} MiB, min {lo:.1} / max {hi:.1} MiB over the run, last {:.1} MiB",
                totals.0,
                totals.1,
                totals.2,
                rss.last().map_or(0.0, |p| p.1)
            );
            println!(
                "wrote {} and {}",
                out.join("soak.csv").display(),
                out.join("soak-rss.svg").display()
            );
        }
    }
    let _ = gw.kill();
    let _ = gw.wait();
}
