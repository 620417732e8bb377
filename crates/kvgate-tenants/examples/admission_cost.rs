//! Percentiles of the admission cost: the time of one `enqueue` plus one
//! `next_dispatch` with 1,000 tenants backlogged (the workload of
//! `benches/admission.rs`), over a million requests, each timed alone.
//! The target is at most 20 µs per request at p99.
//!
//! `cargo run --release -p kvgate-tenants --example admission_cost [-- REQUESTS]`

#![allow(clippy::unwrap_used, clippy::print_stdout)]

#[path = "../benches/support/workload.rs"]
mod workload;

use std::hint::black_box;
use std::time::Instant;

use workload::{Workload, TENANTS};

fn main() {
    let requests: usize = std::env::args().nth(1).map_or(1_000_000, |n| n.parse().unwrap());
    let mut w = Workload::new();
    // Warm up: caches, allocator, the tenants' queues at their steady size.
    for _ in 0..requests / 10 {
        w.enqueue();
        w.dispatch();
        w.settle();
    }
    let mut ns = Vec::with_capacity(requests);
    for _ in 0..requests {
        let start = Instant::now();
        w.enqueue();
        black_box(w.dispatch());
        ns.push(start.elapsed().as_nanos() as u64);
        w.settle();
    }
    ns.sort_unstable();
    let at = |q: f64| ns[((ns.len() - 1) as f64 * q) as usize];
    let mean = ns.iter().sum::<u64>() as f64 / ns.len() as f64;
    println!(
        "admission (enqueue + dispatch), {TENANTS} tenants, {} waiting, {requests} requests: \
         mean {mean:.0} ns, p50 {} ns, p99 {} ns, p99.9 {} ns, max {} ns",
        w.queue.waiting(),
        at(0.5),
        at(0.99),
        at(0.999),
        ns[ns.len() - 1]
    );
    let totals = w.queue.totals();
    assert!(totals.balanced());
}
