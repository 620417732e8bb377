//! Criterion benches for the two hot paths of the index.
//!
//! - `ingest`: applying chained 16-block `BlockStored` events (16 tokens per
//!   block) from 64 replicas into a fresh index, in blocks per second.
//!   Target: at least 5M blocks/s on one thread.
//! - `find_matches`: the prefix match of a 256-block prompt over 64 replicas
//!   holding 1M (block, replica) pairs with shared prefixes of varying depth.
//!   Target: p99 at most 20 µs (criterion reports the mean; the `latency`
//!   example reports percentiles).
//! - `request_keys`: the query keys of a 256-block prompt (16 tokens per
//!   block), plain, with a `cache_salt`, and with a LoRA adapter and a salt:
//!   what vLLM 0.33's extra keys cost the request path.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "support/fleet.rs"]
mod fleet;

use std::hint::black_box;
use std::time::Instant;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use kvgate_events::Event;
use kvgate_index::{request_block_keys, Index, PrefixMatch, ReplicaSpec};

const REPLICAS: usize = 64;

/// Per replica, the events of its sequences: shared family prefixes plus
/// unique suffixes, about `blocks_per_replica` blocks.
fn ingest_workload(blocks_per_replica: usize) -> Vec<Vec<Event>> {
    let families: Vec<Vec<u32>> = (0..fleet::FAMILIES).map(fleet::family_tokens).collect();
    (0..REPLICAS)
        .map(|r| {
            let mut rng = fleet::Rng(0xbe4c ^ r as u64);
            let engine_seed = rng.next_u64();
            let mut events = Vec::new();
            let mut blocks = 0;
            while blocks < blocks_per_replica {
                let family = &families[rng.skewed(fleet::FAMILIES) as usize];
                let depth = 1 + rng.below(64) as usize;
                let mut tokens = family[..depth * fleet::BLOCK_SIZE].to_vec();
                let suffix_blocks = 1 + rng.below(64) as usize;
                tokens.extend(rng.tokens(suffix_blocks * fleet::BLOCK_SIZE));
                blocks += tokens.len() / fleet::BLOCK_SIZE;
                events.extend(fleet::engine_events(&tokens, engine_seed));
            }
            events
        })
        .collect()
}

fn fresh_index() -> (Index, Vec<kvgate_index::ReplicaId>) {
    let mut index = Index::new();
    let ids = (0..REPLICAS)
        .map(|r| index.add_replica(ReplicaSpec::new(format!("r{r}"), 0, 16)).unwrap())
        .collect();
    (index, ids)
}

fn ingest(c: &mut Criterion) {
    let workload = ingest_workload(4096);
    let blocks: u64 = workload
        .iter()
        .flatten()
        .map(|e| match e {
            Event::Stored(s) => s.block_hashes.len() as u64,
            _ => 0,
        })
        .sum();
    let mut group = c.benchmark_group("ingest");
    group.throughput(Throughput::Elements(blocks));
    group.sample_size(10);
    group.bench_function("block_stored_16x16_64_replicas", |b| {
        b.iter_batched(
            fresh_index,
            |(mut index, ids)| {
                let now = Instant::now();
                for (id, events) in ids.iter().zip(&workload) {
                    for event in events {
                        black_box(index.apply(*id, event, now));
                    }
                }
                index
            },
            BatchSize::LargeInput,
        );
    });
    group.finish();
}

fn find_matches(c: &mut Criterion) {
    let fleet = fleet::build(REPLICAS, 1 << 20, true, 7);
    let prompts = fleet::prompts(4096, 256, 11);
    let mut out: Vec<PrefixMatch> = Vec::new();
    let mut next = 0usize;
    let mut group = c.benchmark_group("find_matches");
    group.throughput(Throughput::Elements(1));
    group.bench_function("prompt_256_blocks_64_replicas_1m_pairs", |b| {
        b.iter(|| {
            next = (next + 1) % prompts.len();
            fleet.index.find_matches(black_box(&prompts[next]), &mut out);
            black_box(&out);
        });
    });
    group.finish();
}

fn request_keys(c: &mut Criterion) {
    let tokens: Vec<u32> =
        (0..256 * 16).map(|t: u32| t.wrapping_mul(2_654_435_761) % 151_000).collect();
    let mut group = c.benchmark_group("request_keys");
    group.throughput(Throughput::Elements(256));
    for (name, lora, salt) in [
        ("plain_256_blocks", None, None),
        ("salted_256_blocks", None, Some("tenant-42")),
        ("lora_and_salt_256_blocks", Some("adapter-a"), Some("tenant-42")),
    ] {
        group.bench_function(name, |b| {
            b.iter(|| black_box(request_block_keys(black_box(&tokens), 16, lora, salt)));
        });
    }
    group.finish();
}

criterion_group!(benches, ingest, find_matches, request_keys);
criterion_main!(benches);
