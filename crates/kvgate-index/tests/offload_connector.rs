//! The offloading connector's event patterns (vLLM 0.33,
//! `kv_connector/v1/offloading/events.py`), each as a short script:
//! self-describing chunk stores that re-announce shared hashes, removals
//! that must be reference-counted, and stores that name a GPU block removed
//! earlier in the same batch.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use kvgate_events::{BlockHash, BlockRemoved, BlockStored, Event, Medium};
use kvgate_index::{block_keys, Index, ReplicaId, ReplicaSpec, Tier, RECENT_TTL};

const BS: u32 = 4;

fn store(hashes: &[u64], parent: Option<u64>, tokens: &[u32], medium: Medium) -> Event {
    Event::Stored(BlockStored {
        medium: Some(medium),
        ..BlockStored::new(
            hashes.iter().map(|h| BlockHash::Int(*h)).collect(),
            parent.map(BlockHash::Int),
            tokens.to_vec(),
            BS,
        )
    })
}

fn placeholder(hash: u64, medium: Medium) -> Event {
    Event::Stored(BlockStored {
        medium: Some(medium),
        ..BlockStored::new(vec![BlockHash::Int(hash)], None, Vec::new(), 0)
    })
}

fn remove(hashes: &[u64], medium: Medium) -> Event {
    Event::Removed(BlockRemoved {
        block_hashes: hashes.iter().map(|h| BlockHash::Int(*h)).collect(),
        medium: Some(medium),
        group_idx: None,
    })
}

/// Block `b` of every prompt here is four copies of `b`.
fn tokens(blocks: std::ops::Range<u32>) -> Vec<u32> {
    blocks.flat_map(|b| [b; BS as usize]).collect()
}

fn one_replica() -> (Index, ReplicaId) {
    let mut index = Index::new();
    let id = index.add_replica(ReplicaSpec::new("r", 0, BS)).unwrap();
    (index, id)
}

fn held(index: &Index, id: ReplicaId, tier: Tier) -> Vec<u64> {
    let mut hashes = index.engine_hashes(id, tier).unwrap();
    hashes.sort_unstable();
    hashes
}

fn cpu_prefix(index: &Index, prompt_blocks: u32) -> u32 {
    let mut out = Vec::new();
    index.find_matches(&block_keys(&tokens(0..prompt_blocks), BS as usize, None), &mut out);
    out[0].total
}

#[test]
fn a_shared_hash_stays_until_every_chunk_that_announced_it_is_evicted() {
    let (mut index, id) = one_replica();
    let now = Instant::now();
    // Two chunks of two blocks share block 10 (a non-chunk-aligned shared
    // prefix): each announces it.
    index.apply(id, &store(&[10, 11], None, &tokens(0..2), Medium::Cpu), now);
    let other: Vec<u32> = tokens(0..1).into_iter().chain(tokens(7..8)).collect();
    let again = index.apply(id, &store(&[10, 12], None, &other, Medium::Cpu), now);
    assert!(again.anomalies.is_empty(), "{:?}", again.anomalies);
    assert_eq!(held(&index, id, Tier::Cpu), vec![10, 11, 12]);
    assert_eq!(index.blocks_held(id, Tier::Cpu), Some(3));
    // The first chunk is evicted: its removal fans out to 10 and 11.
    let first = index.apply(id, &remove(&[10, 11], Medium::Cpu), now);
    assert!(first.anomalies.is_empty(), "{:?}", first.anomalies);
    assert_eq!(held(&index, id, Tier::Cpu), vec![10, 12]);
    assert_eq!(cpu_prefix(&index, 2), 1);
    // The second chunk goes: now block 10 goes too.
    index.apply(id, &remove(&[10, 12], Medium::Cpu), now);
    assert!(held(&index, id, Tier::Cpu).is_empty());
    assert_eq!(index.blocks_held(id, Tier::Cpu), Some(0));
    assert_eq!(cpu_prefix(&index, 2), 0);
    assert!(index.anomalies().is_empty(), "{:?}", index.anomalies());
}

#[test]
fn gpu_re_announcements_of_cache_hits_are_not_counted() {
    // vLLM re-announces reused prefix blocks on the GPU (report mode "full")
    // with no removal to match: one removal must still clear the block.
    let (mut index, id) = one_replica();
    let now = Instant::now();
    for _ in 0..3 {
        index.apply(id, &store(&[1, 2], None, &tokens(0..2), Medium::Gpu), now);
    }
    index.apply(id, &remove(&[1, 2], Medium::Gpu), now);
    assert!(held(&index, id, Tier::Gpu).is_empty());
    assert!(index.anomalies().is_empty(), "{:?}", index.anomalies());
}

#[test]
fn a_placeholder_after_the_gpu_removal_still_lands_on_the_cpu_tier() {
    // One batch: the KV-cache manager's events first (the GPU copy is
    // evicted), the connector's after them (the CPU copy, by hash alone).
    let (mut index, id) = one_replica();
    let now = Instant::now();
    index.apply(id, &store(&[1, 2], None, &tokens(0..2), Medium::Gpu), now);
    index.apply(id, &remove(&[1, 2], Medium::Gpu), now);
    for hash in [1, 2] {
        let out = index.apply(id, &placeholder(hash, Medium::Cpu), now);
        assert_eq!(out.anomalies.unknown_placeholder, 0);
        assert_eq!(out.blocks_stored, 1);
    }
    assert_eq!(held(&index, id, Tier::Cpu), vec![1, 2]);
    assert!(held(&index, id, Tier::Gpu).is_empty());
    assert_eq!(cpu_prefix(&index, 2), 2);
    // Its CPU removal then works as for any block.
    index.apply(id, &remove(&[1, 2], Medium::Cpu), now);
    assert_eq!(cpu_prefix(&index, 2), 0);
    assert!(index.anomalies().is_empty(), "{:?}", index.anomalies());
}

#[test]
fn a_placeholder_long_after_the_removal_is_unknown() {
    let (mut index, id) = one_replica();
    let now = Instant::now();
    index.apply(id, &store(&[1], None, &tokens(0..1), Medium::Gpu), now);
    index.apply(id, &remove(&[1], Medium::Gpu), now);
    let late = now + RECENT_TTL + Duration::from_millis(1);
    let out = index.apply(id, &placeholder(1, Medium::Cpu), late);
    assert_eq!(out.anomalies.unknown_placeholder, 1);
    assert!(held(&index, id, Tier::Cpu).is_empty());
}

#[test]
fn a_chunk_whose_parent_left_the_gpu_this_batch_keeps_its_chain() {
    // Chunk stores carry their own parent and come in any key order: the
    // second chunk can arrive after the GPU eviction of its parent and
    // before the first chunk's store.
    let (mut index, id) = one_replica();
    let now = Instant::now();
    index.apply(id, &store(&[1, 2, 3, 4], None, &tokens(0..4), Medium::Gpu), now);
    index.apply(id, &remove(&[1, 2, 3, 4], Medium::Gpu), now);
    let second = index.apply(id, &store(&[3, 4], Some(2), &tokens(2..4), Medium::Cpu), now);
    assert_eq!(second.anomalies.unknown_parent, 0);
    index.apply(id, &store(&[1, 2], None, &tokens(0..2), Medium::Cpu), now);
    assert_eq!(held(&index, id, Tier::Cpu), vec![1, 2, 3, 4]);
    assert_eq!(cpu_prefix(&index, 4), 4);
    assert!(index.anomalies().is_empty(), "{:?}", index.anomalies());
}

#[test]
fn storage_is_counted_apart_from_cpu() {
    let (mut index, id) = one_replica();
    let now = Instant::now();
    index.apply(id, &store(&[1], None, &tokens(0..1), Medium::Cpu), now);
    index.apply(id, &store(&[1], None, &tokens(0..1), Medium::Storage), now);
    index.apply(id, &store(&[1], None, &tokens(0..1), Medium::Storage), now);
    index.apply(id, &remove(&[1], Medium::Cpu), now);
    assert!(held(&index, id, Tier::Cpu).is_empty());
    assert_eq!(held(&index, id, Tier::Storage), vec![1]);
    index.apply(id, &remove(&[1], Medium::Storage), now);
    assert_eq!(held(&index, id, Tier::Storage), vec![1]);
    index.apply(id, &remove(&[1], Medium::Storage), now);
    assert!(held(&index, id, Tier::Storage).is_empty());
    assert!(index.anomalies().is_empty(), "{:?}", index.anomalies());
}

#[test]
fn a_clear_forgets_announcements_and_recent_removals() {
    let (mut index, id) = one_replica();
    let now = Instant::now();
    index.apply(id, &store(&[1], None, &tokens(0..1), Medium::Cpu), now);
    index.apply(id, &store(&[1], None, &tokens(0..1), Medium::Cpu), now);
    index.apply(id, &store(&[2], None, &tokens(5..6), Medium::Gpu), now);
    index.apply(id, &remove(&[2], Medium::Gpu), now);
    index.apply(id, &Event::AllCleared, now);
    assert_eq!(index.apply(id, &placeholder(2, Medium::Cpu), now).anomalies.unknown_placeholder, 1);
    // A fresh store of block 1 is announced once: one removal clears it.
    index.apply(id, &store(&[1], None, &tokens(0..1), Medium::Cpu), now);
    index.apply(id, &remove(&[1], Medium::Cpu), now);
    assert!(held(&index, id, Tier::Cpu).is_empty());
}

#[test]
fn an_offloaded_chunk_without_extra_keys_keeps_the_gpu_key() {
    // The GPU event carries the salt in the first block's extra keys; the
    // connector's chunk store of the same hashes carries none.
    let (mut index, id) = one_replica();
    let now = Instant::now();
    let salted = Event::Stored(BlockStored {
        extra_keys: Some(vec![rmpv::Value::Array(vec!["tenant-a".into()]), rmpv::Value::Nil]),
        ..BlockStored::new(vec![BlockHash::Int(1), BlockHash::Int(2)], None, tokens(0..2), BS)
    });
    index.apply(id, &salted, now);
    let chunk = index.apply(id, &store(&[1, 2], None, &tokens(0..2), Medium::Cpu), now);
    assert_eq!(chunk.anomalies.hash_conflict, 0);
    index.apply(id, &remove(&[1, 2], Medium::Gpu), now);
    assert_eq!(held(&index, id, Tier::Cpu), vec![1, 2]);
    // An unsalted prompt does not match the salted tenant's CPU copy.
    assert_eq!(cpu_prefix(&index, 2), 0);
}
