//! One replica's identity, configuration and engine-hash map.
//!
//! A replica's events name blocks by the engine's hash, which only that engine
//! understands. Each replica therefore keeps its own map from engine hash to
//! our [`BlockKey`], the set of tiers it holds the block in, and the insertion
//! sequence used to evict the oldest entries when removals were lost. The
//! entry (engine hash included, as the map's key) is packed into 20 bytes
//! (two `u64` split into `u32` halves plus a `u32` of sequence and tier
//! bits), and the map is a [`DenseMap`], because it is paid once per (block,
//! replica) pair and dominates the index's memory.

use std::time::Instant;

use rustc_hash::FxHashMap;

use crate::dense::{DenseMap, Keyed};
use crate::keys::BlockKey;
use crate::recent::RecentlyRemoved;
use crate::stats::Anomalies;

/// What the index needs to know about a replica. `(name, dp_rank)` is its
/// identity: data-parallel ranks of one server are separate caches.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplicaSpec {
    /// Stable replica name (for example `host:port`).
    pub name: String,
    /// Data-parallel rank; rank `r` publishes its own event stream.
    pub dp_rank: u32,
    /// Tokens per KV block the engine uses; events with another size are
    /// rejected and counted.
    pub block_size: u32,
    /// Blocks the replica can hold per tier (indexed by `Tier as usize`);
    /// `None` means [`DEFAULT_CAPACITY_BLOCKS`](crate::DEFAULT_CAPACITY_BLOCKS).
    pub capacity_blocks: [Option<u64>; 3],
}

impl ReplicaSpec {
    /// A spec with default capacities in every tier.
    pub fn new(name: impl Into<String>, dp_rank: u32, block_size: u32) -> ReplicaSpec {
        ReplicaSpec { name: name.into(), dp_rank, block_size, capacity_blocks: [None; 3] }
    }
}

/// Bits of [`EngineEntry::seq_tiers`] that hold the tier mask.
const TIER_BITS: u32 = 3;
/// Sequence numbers stay below this; reaching it renumbers the replica.
pub(crate) const SEQ_LIMIT: u32 = 1 << (32 - TIER_BITS);

/// An engine hash (`BlockHash::fold_u64`), stored as two `u32` halves so that
/// a map entry needs only 4-byte alignment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct EngineHash([u32; 2]);

impl EngineHash {
    pub(crate) fn new(hash: u64) -> EngineHash {
        EngineHash([hash as u32, (hash >> 32) as u32])
    }

    pub(crate) fn as_u64(self) -> u64 {
        u64::from(self.0[0]) | (u64::from(self.0[1]) << 32)
    }
}

/// What a replica knows about one engine hash: the hash itself, our key,
/// the tiers it holds the block in, and when a tier was last added (for
/// oldest-first eviction).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct EngineEntry {
    hash: EngineHash,
    key: [u32; 2],
    seq_tiers: u32,
}

impl Keyed for EngineEntry {
    #[inline]
    fn map_key(&self) -> u64 {
        self.hash.as_u64()
    }
}

impl EngineEntry {
    pub(crate) fn new(hash: u64, key: BlockKey, tiers: u8, seq: u32) -> EngineEntry {
        let mut entry = EngineEntry {
            hash: EngineHash::new(hash),
            key: [key.0 as u32, (key.0 >> 32) as u32],
            seq_tiers: 0,
        };
        entry.set(tiers, seq);
        entry
    }

    /// The engine hash, folded to `u64`.
    pub(crate) fn hash(self) -> u64 {
        self.hash.as_u64()
    }

    pub(crate) fn key(self) -> BlockKey {
        BlockKey(u64::from(self.key[0]) | (u64::from(self.key[1]) << 32))
    }

    pub(crate) fn tiers(self) -> u8 {
        (self.seq_tiers & ((1 << TIER_BITS) - 1)) as u8
    }

    pub(crate) fn seq(self) -> u32 {
        self.seq_tiers >> TIER_BITS
    }

    pub(crate) fn set(&mut self, tiers: u8, seq: u32) {
        self.seq_tiers = (seq << TIER_BITS) | (u32::from(tiers) & ((1 << TIER_BITS) - 1));
    }

    pub(crate) fn set_tiers(&mut self, tiers: u8) {
        self.set(tiers, self.seq());
    }
}

/// One registered replica and everything the index knows about it.
#[derive(Clone, Debug)]
pub(crate) struct Replica {
    pub(crate) spec: ReplicaSpec,
    /// Engine hash → our key, tiers, sequence.
    pub(crate) entries: DenseMap<EngineEntry>,
    /// Blocks held per tier (entries with that tier bit).
    pub(crate) counts: [u64; 3],
    /// `(key, tier)` → how many engine entries beyond the first hold that key
    /// in that tier. Almost always empty: it is only filled when one engine
    /// names the same content by two hashes (for example when its hash covers
    /// extra keys the events do not carry).
    pub(crate) extra_holds: FxHashMap<(u64, u8), u32>,
    /// `(engine hash, tier)` → announcements beyond the first, for the
    /// offloading tiers only. vLLM 0.33's offloading connector re-announces a
    /// shared hash once per chunk that covers it and expects consumers to
    /// count (`offloading/events.py`); each removal takes one back, and the
    /// tier bit goes with the last. GPU stores stay idempotent: vLLM
    /// re-announces prefix-cache hits there (`kv_cache_report_mode="full"`)
    /// without a matching removal.
    pub(crate) repeats: FxHashMap<(u64, u8), u32>,
    /// Hashes removed a moment ago, for late placeholders and parents.
    pub(crate) recent: RecentlyRemoved,
    /// Entries of a clear in progress ([`Index::begin_clear`]): still
    /// counted in the holder bits (with `extra_holds`) until a clear step
    /// releases them; the replica is hidden from queries meanwhile.
    ///
    /// [`Index::begin_clear`]: crate::Index::begin_clear
    pub(crate) draining: Vec<EngineEntry>,
    /// KV cache groups seen with a spec kind other than full attention.
    pub(crate) non_full_groups: Vec<u32>,
    /// Next insertion sequence number (below [`SEQ_LIMIT`]).
    pub(crate) next_seq: u32,
    pub(crate) anomalies: Anomalies,
    pub(crate) last_event_at: Option<Instant>,
}

impl Replica {
    pub(crate) fn new(spec: ReplicaSpec) -> Replica {
        Replica {
            spec,
            entries: DenseMap::default(),
            counts: [0; 3],
            extra_holds: FxHashMap::default(),
            repeats: FxHashMap::default(),
            recent: RecentlyRemoved::default(),
            draining: Vec::new(),
            non_full_groups: Vec::new(),
            next_seq: 0,
            anomalies: Anomalies::default(),
            last_event_at: None,
        }
    }

    /// Reassigns sequence numbers 0..n in the current order, O(n log n).
    pub(crate) fn renumber(&mut self) {
        let mut order: Vec<(u32, u32)> =
            self.entries.iter().enumerate().map(|(at, entry)| (entry.seq(), at as u32)).collect();
        order.sort_unstable_by_key(|(seq, _)| *seq);
        let mut ranks = vec![0u32; order.len()];
        for (rank, (_, at)) in order.iter().enumerate() {
            ranks[*at as usize] = rank as u32;
        }
        for (entry, rank) in self.entries.iter_mut().zip(ranks) {
            let tiers = entry.tiers();
            entry.set(tiers, rank);
        }
        self.next_seq = order.len() as u32;
    }

    pub(crate) fn is_non_full_group(&self, group_idx: u32) -> bool {
        self.non_full_groups.contains(&group_idx)
    }

    /// Remembers whether a KV cache group decides prefix reuse.
    pub(crate) fn note_group(&mut self, group_idx: u32, full_attention: bool) {
        let known = self.non_full_groups.iter().position(|g| *g == group_idx);
        match (known, full_attention) {
            (None, false) => self.non_full_groups.push(group_idx),
            (Some(at), true) => {
                self.non_full_groups.swap_remove(at);
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_entry_packs_key_tiers_and_seq() {
        let mut entry = EngineEntry::new(
            0x0123_4567_89ab_cdef,
            BlockKey(0xdead_beef_0123_4567),
            0b101,
            SEQ_LIMIT - 1,
        );
        assert_eq!(entry.hash(), 0x0123_4567_89ab_cdef);
        assert_eq!(entry.key(), BlockKey(0xdead_beef_0123_4567));
        assert_eq!(entry.tiers(), 0b101);
        assert_eq!(entry.seq(), SEQ_LIMIT - 1);
        entry.set_tiers(0b010);
        assert_eq!(entry.tiers(), 0b010);
        assert_eq!(entry.seq(), SEQ_LIMIT - 1);
        assert_eq!(std::mem::size_of::<EngineEntry>(), 20);
    }

    #[test]
    fn renumbering_keeps_the_order() {
        let mut replica = Replica::new(ReplicaSpec::new("r", 0, 16));
        replica.entries.get_or_insert(EngineEntry::new(1, BlockKey(1), 1, 900));
        replica.entries.get_or_insert(EngineEntry::new(2, BlockKey(2), 1, 10));
        replica.entries.get_or_insert(EngineEntry::new(3, BlockKey(3), 1, 500));
        replica.next_seq = SEQ_LIMIT - 1;
        replica.reserve_seqs(1);
        assert_eq!(replica.next_seq, 3);
        let seq = |h: u64| replica.entries.get(h).map(|e| e.seq());
        assert_eq!((seq(2), seq(3), seq(1)), (Some(0), Some(1), Some(2)));
    }

    #[test]
    fn groups_are_remembered_and_forgotten() {
        let mut replica = Replica::new(ReplicaSpec::new("r", 0, 16));
        replica.note_group(1, false);
        replica.note_group(1, false);
        assert!(replica.is_non_full_group(1));
        assert!(!replica.is_non_full_group(0));
        replica.note_group(1, true);
        assert!(!replica.is_non_full_group(1));
    }
}
