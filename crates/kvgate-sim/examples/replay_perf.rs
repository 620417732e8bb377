//! A quick performance check of the engine model in virtual time: replays a
//! Mooncake-style trace (JSONL with `timestamp` ms, `input_length`,
//! `output_length`, `hash_ids` of 512-token blocks) or, without a path, 12k
//! synthetic requests, through 8 engines with round-robin or sticky routing,
//! and prints the CPU seconds the simulation took plus TTFT and hit ratios.
//!
//! ```text
//! cargo run --release -p kvgate-sim --example replay_perf -- [TRACE.jsonl] [--sticky] [--replicas N]
//! ```
//!
//! Tokens are derived deterministically from each hash id (512 per id, the
//! last block cut to `input_length`), so equal ids share exactly.

use std::time::{Duration, Instant};

use kvgate_sim::{Engine, EngineConfig, TimingModel};

struct TraceRequest {
    arrival: Duration,
    input_length: usize,
    output_length: u32,
    hash_ids: Vec<u64>,
}

fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn tokens_of(r: &TraceRequest) -> Vec<u32> {
    let mut t = Vec::with_capacity(r.input_length);
    'outer: for &h in &r.hash_ids {
        for j in 0..512u64 {
            if t.len() == r.input_length {
                break 'outer;
            }
            t.push((mix(h * 512 + j) % 150_000) as u32);
        }
    }
    while t.len() < r.input_length {
        t.push((mix(u64::MAX - t.len() as u64) % 150_000) as u32);
    }
    t
}

fn load_trace(path: &str) -> Vec<TraceRequest> {
    let Ok(text) = std::fs::read_to_string(path) else {
        eprintln!("cannot read {path}");
        std::process::exit(2);
    };
    text.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .map(|v| TraceRequest {
            arrival: Duration::from_millis(v["timestamp"].as_u64().unwrap_or(0)),
            input_length: v["input_length"].as_u64().unwrap_or(1).max(1) as usize,
            output_length: v["output_length"].as_u64().unwrap_or(1).max(1) as u32,
            hash_ids: v["hash_ids"]
                .as_array()
                .map(|a| a.iter().filter_map(|x| x.as_u64()).collect())
                .unwrap_or_default(),
        })
        .collect()
}

/// 12k requests, one every 60 ms, 40% continuing an earlier conversation.
fn synthetic() -> Vec<TraceRequest> {
    let mut out: Vec<TraceRequest> = Vec::new();
    let mut next_hash = 0u64;
    for i in 0..12_000u64 {
        let r = mix(i);
        let mut hash_ids = if i > 0 && r % 10 < 4 {
            out[(mix(r) % out.len() as u64) as usize].hash_ids.clone()
        } else {
            Vec::new()
        };
        let extra = 1 + (r >> 8) % 16;
        for _ in 0..extra {
            hash_ids.push(next_hash);
            next_hash += 1;
        }
        hash_ids.truncate(48);
        let input_length = hash_ids.len() * 512 - (r >> 20) as usize % 512;
        out.push(TraceRequest {
            arrival: Duration::from_millis(i * 60),
            input_length,
            output_length: 1 + ((r >> 32) % 400) as u32,
            hash_ids,
        });
    }
    out
}

fn cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let rest = stat.rsplit_once(')')?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let utime: f64 = f.get(11)?.parse().ok()?;
    let stime: f64 = f.get(12)?.parse().ok()?;
    Some((utime + stime) / 100.0)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let sticky = args.iter().any(|a| a == "--sticky");
    let n_replicas = args
        .iter()
        .position(|a| a == "--replicas")
        .and_then(|i| args.get(i + 1))
        .and_then(|s| s.parse().ok())
        .unwrap_or(8usize)
        .max(1);
    let trace = match args.iter().find(|a| !a.starts_with("--") && a.parse::<usize>().is_err()) {
        Some(p) => load_trace(p),
        None => synthetic(),
    };
    let cpu0 = cpu_seconds();
    let wall0 = Instant::now();
    let config = EngineConfig {
        num_gpu_blocks: 32_768,
        max_num_batched_tokens: 8192,
        timing: TimingModel::llmd_qwen3_32b(),
        ..EngineConfig::default()
    };
    let mut engines: Vec<(Engine, Duration)> = Vec::new();
    for _ in 0..n_replicas {
        match Engine::new(config.clone()) {
            Ok(e) => engines.push((e, Duration::ZERO)),
            Err(err) => {
                eprintln!("{err}");
                std::process::exit(2);
            }
        }
    }
    let mut arrivals = vec![Duration::ZERO; trace.len()];
    let (mut ttft_sum, mut ttft_n, mut rejected, mut events, mut steps) =
        (0.0f64, 0u64, 0u64, 0u64, 0u64);
    let mut next = 0usize;
    loop {
        let busy = engines
            .iter()
            .enumerate()
            .filter(|(_, (e, _))| e.has_work())
            .min_by_key(|(_, (_, c))| *c)
            .map(|(i, (_, c))| (i, *c));
        let arrival = trace.get(next).map(|r| r.arrival);
        match (arrival, busy) {
            (Some(at), b) if b.is_none_or(|(_, c)| at <= c) => {
                let r = &trace[next];
                let replica = if sticky {
                    (mix(r.hash_ids.first().copied().unwrap_or(next as u64)) % n_replicas as u64)
                        as usize
                } else {
                    next % n_replicas
                };
                let (e, clock) = &mut engines[replica];
                if !e.has_work() {
                    *clock = (*clock).max(at);
                }
                arrivals[next] = at;
                if e.add_request(next as u64, tokens_of(r), r.output_length, 0, true, at).is_err() {
                    rejected += 1;
                }
                next += 1;
            }
            (_, Some((i, _))) => {
                let (e, clock) = &mut engines[i];
                let out = e.step(*clock);
                *clock += out.duration;
                steps += 1;
                events += out.events.len() as u64;
                for t in out.tokens.iter().filter(|t| t.is_first) {
                    ttft_sum += clock.saturating_sub(arrivals[t.request_id as usize]).as_secs_f64();
                    ttft_n += 1;
                }
            }
            _ => break,
        }
    }
    let wall = wall0.elapsed().as_secs_f64();
    let cpu = match (cpu0, cpu_seconds()) {
        (Some(a), Some(b)) => b - a,
        _ => wall,
    };
    let (mut q, mut h, mut pre) = (0u64, 0u64, 0u64);
    for (e, _) in &engines {
        let s = e.stats();
        q += s.prefix_cache_queries;
        h += s.prefix_cache_hits;
        pre += s.preemptions;
    }
    let virtual_end = engines.iter().map(|(_, c)| *c).max().unwrap_or_default();
    println!(
        "requests={} replicas={n_replicas} routing={} rejected={rejected} steps={steps} events={events}",
        trace.len(),
        if sticky { "sticky" } else { "round-robin" }
    );
    println!(
        "cpu_s={cpu:.2} wall_s={wall:.2} virtual_s={:.1} mean_ttft_s={:.3} token_hit_ratio={:.3} preemptions={pre}",
        virtual_end.as_secs_f64(),
        ttft_sum / ttft_n.max(1) as f64,
        h as f64 / q.max(1) as f64
    );
}
