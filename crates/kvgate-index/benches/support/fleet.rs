//! Synthetic fleets for the criterion bench and the latency/memory examples.
//!
//! A fleet is N replicas (block size 16) that together hold a target number
//! of (block, replica) pairs, built by feeding the index the `BlockStored`
//! events a vLLM engine would publish. Engine hashes are chained per replica
//! with a per-replica seed, like real engines with different
//! `PYTHONHASHSEED`s, so the index has to go through its own content keys.
//!
//! - *shared*: sequences start with a prefix of one of a few "families"
//!   (system prompts, documents; popularity skewed towards low family ids) of
//!   varying depth, followed by a unique suffix, as in a chat/RAG workload.
//! - *unshared*: every replica's sequences are unique to it, the worst case
//!   for memory per (block, replica) pair.
//!
//! It lives under `benches/support/` and is pulled in with `#[path]`, because
//! it is test scaffolding, not library API.

#![allow(dead_code, unreachable_pub)]

use std::time::Instant;

use kvgate_events::{BlockHash, BlockStored, Event};
use kvgate_index::{block_keys, BlockKey, Index, ReplicaId, ReplicaSpec, Tier};
use xxhash_rust::xxh3::xxh3_64_with_seed;

/// Tokens per block, as vLLM's default.
pub const BLOCK_SIZE: usize = 16;
/// Blocks per `BlockStored` event.
pub const BLOCKS_PER_EVENT: usize = 16;
/// Length of a family's canonical token stream, in blocks.
pub const FAMILY_BLOCKS: usize = 256;
/// Number of prefix families.
pub const FAMILIES: u64 = 64;

/// splitmix64: a tiny deterministic generator, enough for workloads.
#[derive(Clone, Debug)]
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    /// Skewed towards 0: the smaller of two uniforms.
    pub fn skewed(&mut self, n: u64) -> u64 {
        self.below(n).min(self.below(n))
    }

    pub fn tokens(&mut self, n: usize) -> Vec<u32> {
        (0..n).map(|_| (self.next_u64() % 150_000) as u32).collect()
    }
}

/// The canonical token stream of family `f`.
pub fn family_tokens(f: u64) -> Vec<u32> {
    Rng(0xfa31_1e00 ^ f.wrapping_mul(0x1000_0001)).tokens(FAMILY_BLOCKS * BLOCK_SIZE)
}

/// The `BlockStored` events an engine with `engine_seed` publishes for
/// `tokens` (full blocks only), `BLOCKS_PER_EVENT` blocks per event, chained.
pub fn engine_events(tokens: &[u32], engine_seed: u64) -> Vec<Event> {
    let mut events = Vec::new();
    let mut parent: Option<u64> = None;
    let full = tokens.len() / BLOCK_SIZE * BLOCK_SIZE;
    for chunk in tokens[..full].chunks(BLOCK_SIZE * BLOCKS_PER_EVENT) {
        let mut hashes = Vec::with_capacity(chunk.len() / BLOCK_SIZE);
        let mut h = parent.unwrap_or(engine_seed);
        for block in chunk.chunks_exact(BLOCK_SIZE) {
            let bytes: Vec<u8> = block.iter().flat_map(|t| t.to_le_bytes()).collect();
            h = xxh3_64_with_seed(&bytes, h ^ engine_seed);
            hashes.push(BlockHash::Int(h));
        }
        events.push(Event::Stored(BlockStored::new(
            hashes,
            parent.map(BlockHash::Int),
            chunk.to_vec(),
            BLOCK_SIZE as u32,
        )));
        parent = Some(h);
    }
    events
}

/// A built fleet.
#[derive(Debug)]
pub struct Fleet {
    pub index: Index,
    pub ids: Vec<ReplicaId>,
    pub shared: bool,
}

/// One sequence a replica has cached: a family prefix of varying depth plus a
/// unique suffix (shared), or a unique sequence (unshared).
fn sequence(rng: &mut Rng, shared: bool, families: &[Vec<u32>]) -> Vec<u32> {
    let suffix_blocks = 1 + rng.below(32) as usize;
    let mut tokens = Vec::new();
    if shared {
        let family = &families[rng.skewed(FAMILIES) as usize];
        let depth = 1 + rng.below(192) as usize;
        tokens.extend_from_slice(&family[..depth * BLOCK_SIZE]);
        tokens.extend(rng.tokens(suffix_blocks * BLOCK_SIZE));
    } else {
        let blocks = suffix_blocks + rng.below(96) as usize;
        tokens.extend(rng.tokens(blocks * BLOCK_SIZE));
    }
    tokens
}

/// Builds `replicas` replicas holding `total_pairs` (block, replica) pairs in
/// all, all on GPU.
pub fn build(replicas: usize, total_pairs: u64, shared: bool, seed: u64) -> Fleet {
    let mut index = Index::new();
    let ids: Vec<ReplicaId> = (0..replicas)
        .filter_map(|r| index.add_replica(ReplicaSpec::new(format!("r{r}"), 0, 16)).ok())
        .collect();
    let families: Vec<Vec<u32>> = (0..FAMILIES).map(family_tokens).collect();
    let per_replica = total_pairs / replicas as u64;
    let now = Instant::now();
    for (r, id) in ids.iter().enumerate() {
        let mut rng = Rng(seed ^ (r as u64).wrapping_mul(0x51_7cc1_b727_220a));
        let engine_seed = rng.next_u64();
        while index.blocks_held(*id, Tier::Gpu).unwrap_or(u64::MAX) < per_replica {
            let tokens = sequence(&mut rng, shared, &families);
            let events = engine_events(&tokens, engine_seed);
            for event in &events {
                index.apply(*id, event, now);
                if index.blocks_held(*id, Tier::Gpu).unwrap_or(u64::MAX) >= per_replica {
                    break;
                }
            }
        }
    }
    Fleet { index, ids, shared }
}

/// Keys of query prompts of `n_blocks` blocks: a family prefix of random
/// depth (shared fleets) continued by fresh tokens.
pub fn prompts(count: usize, n_blocks: usize, seed: u64) -> Vec<Vec<BlockKey>> {
    let families: Vec<Vec<u32>> = (0..FAMILIES).map(family_tokens).collect();
    let mut rng = Rng(seed);
    (0..count)
        .map(|_| {
            let family = &families[rng.skewed(FAMILIES) as usize];
            let depth = (rng.below(FAMILY_BLOCKS as u64 + 1) as usize).min(n_blocks);
            let mut tokens = family[..depth * BLOCK_SIZE].to_vec();
            tokens.extend(rng.tokens((n_blocks - depth) * BLOCK_SIZE));
            block_keys(&tokens, BLOCK_SIZE, None)
        })
        .collect()
}
