//! A clear in steps (`begin_clear`, `clear_step`): the replica holds nothing
//! from the first call, events apply to its new view at once, and when the
//! last step is done the index equals one that only ever saw the new events,
//! although old and new blocks share keys.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Instant;

use kvgate_events::{BlockHash, BlockStored, Event};
use kvgate_index::{block_keys, Index, PrefixMatch, ReplicaSpec, Tier};

fn store(first_hash: u64, tokens: &[u32]) -> Event {
    let n = tokens.len() / 4;
    Event::Stored(BlockStored::new(
        (0..n as u64).map(|i| BlockHash::Int(first_hash + i)).collect(),
        None,
        tokens.to_vec(),
        4,
    ))
}

fn matches(index: &Index, tokens: &[u32]) -> Vec<PrefixMatch> {
    let mut out = Vec::new();
    index.find_matches(&block_keys(tokens, 4, None), &mut out);
    out
}

#[test]
fn a_stepwise_clear_ends_where_a_fresh_view_would() {
    let now = Instant::now();
    let old: Vec<u32> = (0..4000).map(|t| t / 4 % 500).collect(); // 1000 blocks
    let new: Vec<u32> = (0..400).map(|t| t / 4 % 500).collect(); // the first 100 again
    let mut index = Index::new();
    let a = index.add_replica(ReplicaSpec::new("a", 0, 4)).unwrap();
    let b = index.add_replica(ReplicaSpec::new("b", 0, 4)).unwrap();
    index.apply(a, &store(1, &old), now);
    index.apply(b, &store(1, &old[..800]), now);

    assert_eq!(index.begin_clear(a).unwrap(), 1000);
    assert!(index.clearing(a));
    // From now on `a` holds nothing, to queries and counts alike.
    assert_eq!(matches(&index, &old)[a.index()].total, 0);
    assert_eq!(index.blocks_held(a, Tier::Gpu), Some(0));
    let key = block_keys(&old, 4, None)[0];
    assert_eq!(index.fastest_tier(key, a), None);
    // New events land in the new view while the old one drains.
    index.apply(a, &store(5000, &new), now);
    assert_eq!(index.blocks_held(a, Tier::Gpu), Some(100));
    let mut left = 1000;
    let mut steps = 0;
    while left > 0 {
        left = index.clear_step(a, 64).unwrap().0;
        steps += 1;
        assert_eq!(index.clearing(a), left > 0);
    }
    assert_eq!(steps, 1000_usize.div_ceil(64));
    assert!(!index.clearing(a));
    // Now `a` shows exactly the new events' blocks; `b` kept its own.
    let m = matches(&index, &old);
    assert_eq!(m[a.index()].gpu, 100);
    assert_eq!(m[b.index()].gpu, 200);
    assert_eq!(index.fastest_tier(key, a), Some(Tier::Gpu));

    let mut fresh = Index::new();
    let fa = fresh.add_replica(ReplicaSpec::new("a", 0, 4)).unwrap();
    let fb = fresh.add_replica(ReplicaSpec::new("b", 0, 4)).unwrap();
    fresh.apply(fa, &store(5000, &new), now);
    fresh.apply(fb, &store(1, &old[..800]), now);
    assert_eq!(index.distinct_keys(), fresh.distinct_keys());
    for probe in [&old[..], &new[..], &old[..800]] {
        assert_eq!(matches(&index, probe), matches(&fresh, probe));
    }
    // Removing the new blocks leaves nothing behind (the counts were exact).
    index.apply(a, &Event::AllCleared, now);
    assert_eq!(matches(&index, &new)[a.index()].total, 0);
    assert_eq!(index.distinct_keys(), 200);
}

#[test]
fn a_second_clear_finishes_the_first_and_removal_drains_all() {
    let now = Instant::now();
    let tokens: Vec<u32> = (0..400).collect();
    let mut index = Index::new();
    let a = index.add_replica(ReplicaSpec::new("a", 0, 4)).unwrap();
    index.apply(a, &store(1, &tokens), now);
    assert_eq!(index.begin_clear(a).unwrap(), 100);
    index.clear_step(a, 10).unwrap();
    index.apply(a, &store(1000, &tokens[..40]), now);
    assert_eq!(index.begin_clear(a).unwrap(), 10);
    assert_eq!(index.distinct_keys(), 10);
    assert_eq!(index.clear_step(a, 3).unwrap().0, 7);
    index.remove_replica(a).unwrap();
    assert_eq!(index.distinct_keys(), 0);
    // An empty replica's clear is complete at once.
    let c = index.add_replica(ReplicaSpec::new("c", 0, 4)).unwrap();
    assert_eq!(index.begin_clear(c).unwrap(), 0);
    assert!(!index.clearing(c));
    assert_eq!(matches(&index, &tokens)[c.index()], PrefixMatch::default());
}
