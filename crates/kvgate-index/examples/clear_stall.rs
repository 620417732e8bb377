//! Decision-path latency while a replica holding 1M blocks is cleared.
//!
//! The gateway keeps the index behind a `RwLock`: routing decisions read it,
//! event feeds and clears write it. A clear in one piece (`clear_replica`)
//! holds the write lock for the whole walk of the replica's blocks; a
//! stepwise clear (`begin_clear` + `clear_step` of 16,384 entries, the
//! gateway's `CLEAR_STEP`) releases it between steps. This example measures
//! what a reader pays: one thread runs prefix matches of a 256-block prompt
//! under the read lock back to back, timing each from asking for the lock to
//! the answer, while another clears a replica of 1M blocks, both ways, in one
//! run. Target: p99 at most 1 ms during the clear.
//!
//! `cargo run --release -p kvgate-index --example clear_stall`

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::thread;
use std::time::{Duration, Instant};

use kvgate_events::{BlockHash, BlockStored, Event};
use kvgate_index::{block_keys, Index, PrefixMatch, ReplicaId, ReplicaSpec};

const BLOCKS: u32 = 1 << 20;
const STEP: usize = 4_096;
/// The pause between steps: a reader blocked on the lock must get it before
/// the next step (a writer that re-locks at once starves it).
const PAUSE: Duration = Duration::from_millis(1);

/// Two replicas: `big` with 1M blocks in chains of 64, `other` with a
/// 256-block prompt the reader asks about.
fn fleet() -> (Index, ReplicaId, Vec<kvgate_index::BlockKey>) {
    let now = Instant::now();
    let mut index = Index::new();
    let big = index.add_replica(ReplicaSpec::new("big", 0, 16)).unwrap_or(ReplicaId(0));
    let other = index.add_replica(ReplicaSpec::new("other", 0, 16)).unwrap_or(ReplicaId(1));
    let chain = 64u32;
    for c in 0..BLOCKS / chain {
        let tokens: Vec<u32> = (0..chain * 16).map(|t| c * 1_000_003 + t).collect();
        let hashes = (0..chain).map(|i| BlockHash::Int(u64::from(c * chain + i) + 1)).collect();
        index.apply(big, &Event::Stored(BlockStored::new(hashes, None, tokens, 16)), now);
    }
    let prompt: Vec<u32> = (0..256 * 16).map(|t| 7_000_000 + t).collect();
    let hashes = (0..256).map(|i| BlockHash::Int(u64::from(BLOCKS) + 10 + i)).collect();
    index.apply(other, &Event::Stored(BlockStored::new(hashes, None, prompt.clone(), 16)), now);
    (index, big, block_keys(&prompt, 16, None))
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p) as usize]
}

/// Latencies of the reads that overlapped the clear, sorted, and how long
/// the clear took.
fn measure(stepwise: bool) -> (Vec<Duration>, Duration) {
    let (index, big, keys) = fleet();
    let index = Arc::new(RwLock::new(index));
    let done = Arc::new(AtomicBool::new(false));
    let reader = {
        let (index, done) = (Arc::clone(&index), Arc::clone(&done));
        thread::spawn(move || {
            let mut out: Vec<PrefixMatch> = Vec::new();
            let mut lat = Vec::new();
            while !done.load(Ordering::Relaxed) {
                let t0 = Instant::now();
                if let Ok(i) = index.read() {
                    i.find_matches(&keys, &mut out);
                }
                lat.push((t0, Instant::now()));
            }
            lat
        })
    };
    thread::sleep(Duration::from_millis(50));
    let t0 = Instant::now();
    if stepwise {
        if let Ok(mut i) = index.write() {
            let _ = i.begin_clear(big);
        }
        let mut slowest = (Duration::ZERO, 0u64);
        loop {
            let s0 = Instant::now();
            // The old table is freed after the lock is released.
            let (left, _spent) = index
                .write()
                .map(|mut i| i.clear_step(big, STEP).unwrap_or((0, None)))
                .unwrap_or((0, None));
            slowest = slowest.max((s0.elapsed(), left));
            if left == 0 {
                break;
            }
            thread::sleep(PAUSE);
        }
        println!(
            "  slowest step (lock wait included): {:.1} µs, {} entries left after it",
            slowest.0.as_secs_f64() * 1e6,
            slowest.1
        );
    } else if let Ok(mut i) = index.write() {
        let _ = i.clear_replica(big);
    }
    let end = Instant::now();
    thread::sleep(Duration::from_millis(20));
    done.store(true, Ordering::Relaxed);
    let reads = reader.join().unwrap_or_default();
    // The reads that overlapped the clear: the fast ones before and after it
    // would only dilute the percentiles.
    let mut lat: Vec<Duration> = reads
        .into_iter()
        .filter(|(start, stop)| *stop >= t0 && *start <= end)
        .map(|(start, stop)| stop - start)
        .collect();
    lat.sort_unstable();
    (lat, end - t0)
}

fn main() {
    println!("1M-block replica cleared while another thread routes (256-block prompts)");
    for stepwise in [false, true] {
        let (lat, took) = measure(stepwise);
        let name = if stepwise { "stepwise (4,096 per lock)" } else { "one piece" };
        println!(
            "{name:28} clear {:>7.1} ms | reads {:>7} | p50 {:>8.1} µs p99 {:>8.1} µs max {:>8.1} µs",
            took.as_secs_f64() * 1e3,
            lat.len(),
            percentile(&lat, 0.5).as_secs_f64() * 1e6,
            percentile(&lat, 0.99).as_secs_f64() * 1e6,
            lat.last().copied().unwrap_or_default().as_secs_f64() * 1e6,
        );
    }
}
