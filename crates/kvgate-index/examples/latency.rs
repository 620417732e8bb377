//! Per-query latency percentiles of `Index::find_matches`.
//!
//! Builds 64 replicas holding 1M (block, replica) pairs with shared prefixes
//! of varying depth (see `benches/support/fleet.rs`), then times 100k
//! queries of 256-block prompts one by one with `Instant` and prints
//! p50/p99/p999. Target: p99 at most 20 µs.
//!
//! `cargo run --release -p kvgate-index --example latency`

#[path = "../benches/support/fleet.rs"]
mod fleet;

use std::time::{Duration, Instant};

use kvgate_index::PrefixMatch;

fn main() {
    let started = Instant::now();
    let fleet = fleet::build(64, 1 << 20, true, 7);
    let prompts = fleet::prompts(4096, 256, 11);
    let stats = fleet.index.stats();
    println!(
        "fleet: {} replicas, {} pairs, {} distinct keys, built in {:?}",
        stats.replicas.len(),
        stats.block_replica_pairs(),
        stats.distinct_keys,
        started.elapsed()
    );
    let mut out: Vec<PrefixMatch> = Vec::new();
    // Warm up caches and the branch predictor.
    for keys in &prompts {
        fleet.index.find_matches(keys, &mut out);
    }
    let queries = 100_000;
    let mut rng = fleet::Rng(3);
    let mut latencies: Vec<Duration> = Vec::with_capacity(queries);
    let mut matched_blocks = 0u64;
    for _ in 0..queries {
        let keys = &prompts[rng.below(prompts.len() as u64) as usize];
        let t0 = Instant::now();
        fleet.index.find_matches(keys, &mut out);
        latencies.push(t0.elapsed());
        matched_blocks += out.iter().map(|m| u64::from(m.total)).max().unwrap_or(0);
    }
    latencies.sort_unstable();
    let at = |q: f64| latencies[((latencies.len() as f64 * q) as usize).min(latencies.len() - 1)];
    let mean = latencies.iter().sum::<Duration>() / latencies.len() as u32;
    println!(
        "find_matches, 256-block prompts, {queries} queries: mean {mean:?} p50 {:?} p99 {:?} \
         p999 {:?} max {:?}; mean best-replica match {:.1} blocks",
        at(0.50),
        at(0.99),
        at(0.999),
        at(1.0),
        matched_blocks as f64 / queries as f64
    );
}
