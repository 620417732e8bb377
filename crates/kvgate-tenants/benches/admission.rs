//! Criterion bench of admission: one request offered (`enqueue`) and one
//! dispatched (`next_dispatch`) with 1,000 tenants backlogged in two bands
//! (about 10,000 waiting, 256 in flight). Output reports and finishes keep
//! the state steady between iterations and are timed apart
//! (`output_and_finish`). The target is
//! at most 20 µs per request at p99; criterion reports the mean, and
//! `examples/admission_cost.rs` reports percentiles.
//!
//! `cargo bench -p kvgate-tenants --bench admission`

#![allow(clippy::unwrap_used)]

#[path = "support/workload.rs"]
mod workload;

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use workload::Workload;

fn admission(c: &mut Criterion) {
    let mut group = c.benchmark_group("admission_1000_tenants");
    let mut w = Workload::new();
    group.bench_function("enqueue_and_dispatch", |b| {
        b.iter_custom(|iters| {
            let mut spent = Duration::ZERO;
            for _ in 0..iters {
                let start = Instant::now();
                w.enqueue();
                black_box(w.dispatch());
                spent += start.elapsed();
                w.settle();
            }
            spent
        })
    });
    let mut w = Workload::new();
    group.bench_function("output_and_finish", |b| {
        b.iter_custom(|iters| {
            let mut spent = Duration::ZERO;
            for _ in 0..iters {
                w.enqueue();
                w.dispatch();
                let start = Instant::now();
                w.settle();
                spent += start.elapsed();
            }
            spent
        })
    });
    group.finish();
}

criterion_group!(benches, admission);
criterion_main!(benches);
