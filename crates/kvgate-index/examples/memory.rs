//! Memory per (block, replica) pair, from `IndexStats::bytes_used`.
//!
//! Builds 64 replicas holding 1M (block, replica) pairs twice: with shared
//! prefixes of varying depth, and with nothing shared (the worst case, one
//! holder entry per pair). Prints bytes used per pair. Target: at most 64.
//!
//! `cargo run --release -p kvgate-index --example memory`

#[path = "../benches/support/fleet.rs"]
mod fleet;

fn main() {
    for (label, shared) in [("shared prefixes", true), ("no sharing", false)] {
        for pairs in [1_000_000u64, 1 << 20, 1_500_000] {
            let fleet = fleet::build(64, pairs, shared, 7);
            let stats = fleet.index.stats();
            let pairs = stats.block_replica_pairs();
            println!(
                "{label:>15}: {pairs} pairs, {} distinct keys, {} holder entries, \
                 {:.1} MiB, {:.1} bytes per (block, replica)",
                stats.distinct_keys,
                stats.holder_entries,
                stats.bytes_used as f64 / (1 << 20) as f64,
                stats.bytes_used as f64 / pairs as f64
            );
        }
    }
}
