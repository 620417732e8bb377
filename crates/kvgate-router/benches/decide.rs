//! Criterion benches for one routing decision.
//!
//! The fleet: 64 replicas (block size 16) built from the `BlockStored`
//! events their engines would publish (about 4,100 blocks each: the full
//! copy of one of the prompts, prefixes of 4 of 16 prefix "families" at
//! varying depth, unique filler). Prompts are 256 blocks (4,100 tokens): a
//! family prefix of 64–255 blocks plus unique tokens, so for each prompt one
//! replica holds all of it, 18 hold part of it and the other 45 hold
//! nothing. Every replica carries 0–5 in-flight bookings (made through the
//! peer path, some already decoding) and a fresh engine report with KV usage
//! between 0.2 and 0.9, so the queue, interference and pressure terms are all
//! non-zero.
//!
//! - `decide_with_matches`: `Router::decide_with_matches` with the prefix
//!   matches precomputed by `Index::find_matches` (the index lookup excluded);
//!   `kv_aware` with the decision log on (default 256) and off
//!   (`explain_last = 0`), then every policy in `PolicyKind::ALL` with the
//!   default config. Target: p99 at most 20 µs (criterion reports the mean;
//!   the `decide_latency` example reports percentiles).
//! - `decide`: `Router::decide` against the populated `Index` (lookup
//!   included), log on and off, plus `find_matches` alone for reference.
//!
//! Every iteration advances the router's clock by 5 µs (it is sans-IO, time
//! is an argument), decides, and finishes the booking with
//! `Outcome::Finished`, so the ledger stays at its initial size; the finish
//! (one ledger lock and map removal) is included in the timings.
//!
//! The workload is in `support/workload.rs`, shared with
//! `examples/decide_latency.rs`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "support/workload.rs"]
mod workload;

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use kvgate_router::{Outcome, PolicyKind};
use workload::{request, router, tick, workload, PROMPTS};

fn decide_with_matches(c: &mut Criterion) {
    let w = workload();
    let mut group = c.benchmark_group("decide_with_matches");
    group.throughput(Throughput::Elements(1));
    let variants = [(PolicyKind::KvAware, 0, "kv_aware_explain_off")]
        .into_iter()
        .chain(PolicyKind::ALL.into_iter().map(|p| (p, 256, p.name())));
    for (policy, explain_last, name) in variants {
        let mut router = router(&w, policy, explain_last);
        let mut now = w.start;
        let mut n = 0u64;
        group.bench_function(name, |b| {
            b.iter(|| {
                tick(&mut router, &w, &mut now, &mut n);
                let next = n as usize % PROMPTS;
                let req = request(&w, next);
                let d = router.decide_with_matches(black_box(&req), &w.matches[next], now);
                let b = d.routed().unwrap().booking;
                router.finish(b, Outcome::Finished);
            });
        });
    }
    group.finish();
}

fn decide(c: &mut Criterion) {
    let w = workload();
    let mut group = c.benchmark_group("decide");
    group.throughput(Throughput::Elements(1));
    for (explain_last, name) in [(256, "kv_aware"), (0, "kv_aware_explain_off")] {
        let mut router = router(&w, PolicyKind::KvAware, explain_last);
        let mut now = w.start;
        let mut n = 0u64;
        group.bench_function(name, |b| {
            b.iter(|| {
                tick(&mut router, &w, &mut now, &mut n);
                let next = n as usize % PROMPTS;
                let req = request(&w, next);
                let d = router.decide(black_box(&req), &w.index, now);
                let b = d.routed().unwrap().booking;
                router.finish(b, Outcome::Finished);
            });
        });
    }
    let mut out = Vec::new();
    let mut next = 0usize;
    group.bench_function("find_matches_only", |b| {
        b.iter(|| {
            next = (next + 1) % PROMPTS;
            w.index.find_matches(black_box(&w.prompts[next]), &mut out);
            black_box(&out);
        });
    });
    group.finish();
}

criterion_group!(benches, decide_with_matches, decide);
criterion_main!(benches);
