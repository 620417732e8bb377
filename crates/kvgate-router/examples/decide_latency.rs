//! Per-decision latency percentiles of `Router::decide_with_matches` and
//! `Router::decide` (criterion only reports means).
//!
//! Same fleet and load as `benches/decide.rs` (64 replicas of about 4,100
//! blocks, 256-block prompts with one full holder, 18 partial holders and
//! the rest cold; 0–5 in-flight bookings per replica; KV usage 0.2–0.9).
//! Each decision is timed alone with `Instant`, including finishing its
//! booking (`Outcome::Finished`); the router's clock advances 5 µs per
//! decision. Prints mean/p50/p99/p99.9/max per scenario. Target: p99 at most
//! 20 µs without the index lookup, and within the index's own 20 µs lookup
//! target with it.
//!
//! It also runs long prompts and large fleets (the same construction, one
//! replica holding each prompt whole): 2,048 and 8,192 blocks on 64
//! replicas, and 256 blocks on 1,024 replicas. Targets, p99 of `kv_aware`
//! with matches given: ≤ 20 µs, ≤ 50 µs and ≤ 30 µs.
//!
//! `cargo run --release -p kvgate-router --example decide_latency [-- DECISIONS [SHAPES]]`
//! where SHAPES is a comma-separated list of `REPLICASxBLOCKS` (default
//! `64x256,64x2048,64x8192,1024x256`).
//!
//! The workload is `benches/support/workload.rs`, shared with the bench.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../benches/support/workload.rs"]
mod workload;

use std::time::{Duration, Instant};

use kvgate_index::Tier;
use kvgate_router::{Outcome, PolicyKind};
use workload::*;

#[derive(Clone, Copy)]
enum Scenario {
    /// `decide_with_matches` (lookup excluded) with this policy and log size.
    Matches(PolicyKind, usize),
    /// `decide` (lookup included), `kv_aware`, this log size.
    Index(usize),
    /// `Index::find_matches` alone.
    Lookup,
}

impl Scenario {
    fn label(self) -> String {
        let log = |n: usize| if n == 0 { "log off" } else { "log 256" };
        match self {
            Scenario::Matches(p, n) => format!("{p}, matches given, {}", log(n)),
            Scenario::Index(n) => format!("kv_aware + index lookup, {}", log(n)),
            Scenario::Lookup => "find_matches alone".to_string(),
        }
    }
}

struct Row {
    label: String,
    latencies: Vec<Duration>,
    cached: f64,
}

fn run(w: &Workload, s: Scenario, decisions: usize) -> Row {
    let (policy, explain_last) = match s {
        Scenario::Matches(p, n) => (p, n),
        Scenario::Index(n) => (PolicyKind::KvAware, n),
        Scenario::Lookup => (PolicyKind::KvAware, 0),
    };
    let mut router = router(w, policy, explain_last);
    let mut now = w.start;
    let mut n = 0u64;
    let mut out = Vec::new();
    let mut latencies = Vec::with_capacity(decisions);
    let mut cached = 0u64;
    let warm_up = decisions / 10;
    for i in 0..warm_up + decisions {
        tick(&mut router, w, &mut now, &mut n);
        let p = n as usize % PROMPTS;
        let req = request(w, p);
        let t0 = Instant::now();
        let blocks = match s {
            Scenario::Lookup => {
                w.index.find_matches(&w.prompts[p], &mut out);
                0
            }
            Scenario::Matches(..) | Scenario::Index(_) => {
                let d = match s {
                    Scenario::Index(_) => router.decide(&req, &w.index, now),
                    _ => router.decide_with_matches(&req, &w.matches[p], now),
                };
                let routed = d.routed().unwrap();
                let blocks = routed.cached_blocks;
                router.finish(routed.booking, Outcome::Finished);
                blocks
            }
        };
        let dt = t0.elapsed();
        if i >= warm_up {
            latencies.push(dt);
            cached += u64::from(blocks);
        }
    }
    latencies.sort_unstable();
    Row { label: s.label(), latencies, cached: cached as f64 / decisions as f64 }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let decisions: usize = args.next().map_or(200_000, |a| a.parse().unwrap());
    let shapes = args.next().unwrap_or_else(|| "64x256,64x2048,64x8192,1024x256".to_owned());
    for shape in shapes.split(',') {
        let (r, b) = shape.split_once('x').expect("a shape is REPLICASxBLOCKS");
        shape_rows(r.parse().unwrap(), b.parse().unwrap(), decisions);
    }
}

fn shape_rows(replicas: usize, prompt_blocks: usize, decisions: usize) {
    let started = Instant::now();
    let w = workload_shaped(replicas, prompt_blocks);
    let pairs: u64 = w.ids.iter().map(|&id| w.index.blocks_held(id, Tier::Gpu).unwrap()).sum();
    let (mut cold, mut partial, mut full) = (0usize, 0usize, 0usize);
    for m in w.matches.iter().flatten() {
        match m.total as usize {
            0 => cold += 1,
            x if x == prompt_blocks => full += 1,
            _ => partial += 1,
        }
    }
    let per = |x: usize| x as f64 / PROMPTS as f64;
    println!(
        "\nfleet: {replicas} replicas, {pairs} (block, replica) pairs, {PROMPTS} prompts of \
         {prompt_blocks} blocks; per prompt {:.1} cold, {:.1} partial, {:.1} full replicas; \
         built in {:?}",
        per(cold),
        per(partial),
        per(full),
        started.elapsed()
    );
    // Long prompts and large fleets: fewer decisions keep a row short.
    let work = (replicas * prompt_blocks) as f64 / (64.0 * 256.0);
    let decisions = ((decisions as f64 / work.max(1.0)) as usize).max(2_000);
    let scenarios = [
        Scenario::Matches(PolicyKind::KvAware, 256),
        Scenario::Matches(PolicyKind::KvAware, 0),
        Scenario::Index(256),
        Scenario::Index(0),
        Scenario::Lookup,
        Scenario::Matches(PolicyKind::LeastLoad, 256),
    ];
    println!("{decisions} timed decisions per row (after {} warm-up):", decisions / 10);
    println!(
        "| {:<40} | {:>9} | {:>9} | {:>9} | {:>9} | {:>9} | {:>13} |",
        "scenario", "mean", "p50", "p99", "p99.9", "max", "cached blocks"
    );
    for s in scenarios {
        let row = run(&w, s, decisions);
        let l = &row.latencies;
        let at = |q: f64| l[((l.len() as f64 * q) as usize).min(l.len() - 1)];
        let mean = l.iter().sum::<Duration>() / l.len() as u32;
        let us = |d: Duration| format!("{:.2} µs", d.as_secs_f64() * 1e6);
        println!(
            "| {:<40} | {:>9} | {:>9} | {:>9} | {:>9} | {:>9} | {:>13.1} |",
            row.label,
            us(mean),
            us(at(0.50)),
            us(at(0.99)),
            us(at(0.999)),
            us(at(1.0)),
            row.cached
        );
    }
}
