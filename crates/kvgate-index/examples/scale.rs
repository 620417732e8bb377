//! A whole fleet's index from its events: M engines × B blocks of unique
//! content (default 256 × 150,000, a 32B model's GPU cache per engine),
//! bounded by each engine's reported capacity.
//!
//! Every engine's batches go through the wire as `kvgate serve` receives
//! them (msgpack encoded in vLLM 0.33's layout, then decoded by kvgate's
//! decoder and applied), engines taking turns one sequence (1–128 blocks of
//! 16 tokens, 16 blocks per `BlockStored`) at a time. Three phases:
//!
//! 1. *fill*: every engine stores B blocks, from empty.
//! 2. *churn*: every engine stores B more (CHURN percent of B) and, as vLLM
//!    does when its cache is full, removes its oldest sequences in the same
//!    batches: one turnover of every cache, the steady state.
//! 3. *lost removals*: B/10 more stores whose removals never arrive; the
//!    index's capacity bound drops the oldest.
//!
//! After each phase it prints the (block, replica) pairs, the index's own
//! estimate of its heap bytes per pair, the process's `VmRSS` and `VmHWM`,
//! and the time spent decoding and applying (the rest of the wall time is
//! this example's own engines: tokens, engine hashes, encoding).
//!
//! `cargo run --release -p kvgate-index --example scale [-- ENGINES BLOCKS [CHURN]]`

#[path = "../benches/support/fleet.rs"]
mod fleet;

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use fleet::{engine_events, Rng, BLOCK_SIZE};
use kvgate_events::{decode_batch, encode_batch, Batch, BlockRemoved, Event, Layout};
use kvgate_index::{Index, ReplicaId, ReplicaSpec, Tier};
// The process allocator of `kvgate serve` (mimalloc), for a faithful RSS.
use kvgate_alloc as _;

/// One simulated engine: a generator of unique sequences, and a second
/// generator on the same seed that replays them oldest first, to name the
/// blocks an eviction removes without keeping them in memory.
struct Engine {
    id: ReplicaId,
    seed: u64,
    store: Rng,
    evict: Rng,
    /// Blocks of each stored sequence still cached, oldest first.
    lengths: VecDeque<u32>,
    held: u64,
}

/// Tokens of one unique sequence, 1–128 blocks.
fn sequence(rng: &mut Rng) -> Vec<u32> {
    let blocks = 1 + rng.below(128) as usize;
    rng.tokens(blocks * BLOCK_SIZE)
}

/// Bytes of a `/proc/self/status` field given in kB.
fn status_bytes(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix(field)?.trim().strip_suffix("kB")?.trim().parse().ok())
        .map_or(0, |kb: u64| kb * 1024)
}

#[derive(Default)]
struct Totals {
    batches: u64,
    events: u64,
    blocks: u64,
    index_time: Duration,
}

fn main() {
    let mut args = std::env::args().skip(1).map(|a| a.parse::<u64>().ok());
    let engines = args.next().flatten().unwrap_or(256) as usize;
    let capacity = args.next().flatten().unwrap_or(150_000);
    let churn_percent = args.next().flatten().unwrap_or(100);
    let base_rss = status_bytes("VmRSS:");
    println!(
        "{engines} engines × {capacity} blocks of unique content (block size {BLOCK_SIZE}), \
         GPU capacity {capacity} each; process RSS before: {:.0} MiB",
        mib(base_rss)
    );

    let mut index = Index::new();
    let mut fleet: Vec<Engine> = (0..engines)
        .filter_map(|e| {
            let mut spec = ReplicaSpec::new(format!("engine-{e}"), 0, BLOCK_SIZE as u32);
            spec.capacity_blocks = [Some(capacity), Some(0), Some(0)];
            let id = index.add_replica(spec).ok()?;
            let seed = 0x5ca1_e000 ^ (e as u64).wrapping_mul(0x51_7cc1_b727_220a);
            Some(Engine {
                id,
                seed,
                store: Rng(seed),
                evict: Rng(seed),
                lengths: VecDeque::new(),
                held: 0,
            })
        })
        .collect();

    let started = Instant::now();
    let fill = run_phase(&mut index, &mut fleet, capacity, capacity, Phase::Fill);
    report(&index, "fill", &fill, started.elapsed(), base_rss);
    let turnover = capacity * churn_percent / 100;
    let started = Instant::now();
    let churn = run_phase(&mut index, &mut fleet, turnover, capacity, Phase::Churn);
    report(&index, "churn", &churn, started.elapsed(), base_rss);
    let started = Instant::now();
    let extra = (capacity / 10).max(1);
    let lost = run_phase(&mut index, &mut fleet, extra, capacity, Phase::LostRemovals);
    report(&index, "lost removals", &lost, started.elapsed(), base_rss);
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Phase {
    Fill,
    Churn,
    LostRemovals,
}

/// Every engine stores `blocks` more blocks, taking turns by sequence.
fn run_phase(
    index: &mut Index,
    fleet: &mut [Engine],
    blocks: u64,
    capacity: u64,
    phase: Phase,
) -> Totals {
    let mut totals = Totals::default();
    let mut left: Vec<u64> = vec![blocks; fleet.len()];
    let mut busy = fleet.len();
    while busy > 0 {
        busy = 0;
        for (engine, left) in fleet.iter_mut().zip(left.iter_mut()) {
            if *left == 0 {
                continue;
            }
            busy += 1;
            let mut tokens = sequence(&mut engine.store);
            let n = ((tokens.len() / BLOCK_SIZE) as u64).min(*left);
            tokens.truncate(n as usize * BLOCK_SIZE);
            *left -= n;
            let mut events = engine_events(&tokens, engine.seed);
            engine.lengths.push_back(n as u32);
            engine.held += n;
            if phase == Phase::Churn {
                events.extend(evict(engine, capacity));
            }
            let batch = Batch { ts: 0.0, events, dp_rank: None, skipped_events: 0 };
            totals.events += batch.events.len() as u64;
            totals.blocks += n;
            totals.batches += 1;
            let payload = encode_batch(&batch, Layout::V0_26);
            let t = Instant::now();
            if let Ok(decoded) = decode_batch(&payload) {
                index.apply_batch(engine.id, &decoded, t);
            }
            totals.index_time += t.elapsed();
        }
    }
    totals
}

/// Removal events for the engine's oldest sequences, until it holds at most
/// `capacity` blocks.
fn evict(engine: &mut Engine, capacity: u64) -> Vec<Event> {
    let mut removed = Vec::new();
    while engine.held > capacity {
        let Some(n) = engine.lengths.pop_front() else { break };
        let mut tokens = sequence(&mut engine.evict);
        tokens.truncate(n as usize * BLOCK_SIZE);
        for event in engine_events(&tokens, engine.seed) {
            if let Event::Stored(stored) = event {
                removed.push(Event::Removed(BlockRemoved {
                    block_hashes: stored.block_hashes,
                    medium: None,
                    group_idx: None,
                }));
            }
        }
        engine.held -= u64::from(n);
    }
    removed
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / f64::from(1 << 20)
}

fn report(index: &Index, phase: &str, totals: &Totals, wall: Duration, base_rss: u64) {
    let stats = index.stats();
    let pairs = stats.block_replica_pairs();
    let held_max = stats.replicas.iter().map(|r| r.blocks[Tier::Gpu as usize]).max().unwrap_or(0);
    let rss = status_bytes("VmRSS:");
    let secs = totals.index_time.as_secs_f64();
    println!(
        "{phase:>13}: {pairs} pairs ({} distinct keys, at most {held_max} per engine), \
         index estimate {:.0} MiB = {:.1} B/pair; VmRSS {:.0} MiB ({:.1} B/pair over the \
         {:.0} MiB before), VmHWM {:.0} MiB",
        stats.distinct_keys,
        mib(stats.bytes_used),
        stats.bytes_used as f64 / pairs.max(1) as f64,
        mib(rss),
        rss.saturating_sub(base_rss) as f64 / pairs.max(1) as f64,
        mib(base_rss),
        mib(status_bytes("VmHWM:")),
    );
    println!(
        "{:>13}  {} batches, {} events, {} blocks stored; decode + apply {:.1} s \
         ({:.2}M blocks/s, {:.0}k events/s), wall {:.1} s; anomalies {:?}",
        "",
        totals.batches,
        totals.events,
        totals.blocks,
        secs,
        totals.blocks as f64 / secs / 1e6,
        totals.events as f64 / secs / 1e3,
        wall.as_secs_f64(),
        stats.anomalies.labelled().iter().filter(|(_, n)| *n > 0).collect::<Vec<_>>(),
    );
}
