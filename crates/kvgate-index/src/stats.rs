//! Counted outcomes and index statistics.
//!
//! Everything that can go wrong while applying events is a counter here, not
//! an error (HOUSE-STYLE "hot-path outcomes are values that get counted"):
//! [`ApplyOutcome`] says what one call did, and the same [`Anomalies`] are
//! accumulated per replica and globally so that metrics can show a replica
//! whose stream is damaged. [`IndexStats`] is the snapshot a metrics exporter
//! or admin page reads, including an estimate of the memory in use.

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::ops::AddAssign;
use std::time::Instant;

use crate::replica_id::ReplicaId;

/// Anomalies seen while applying events. Event-level rejections count
/// events; per-block problems count blocks (each field says which).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Anomalies {
    /// Stores (events) dropped whole because their parent hash was unknown to
    /// the replica; dropping keeps the index prefix-closed, replay repairs it.
    pub unknown_parent: u64,
    /// Removed blocks the replica did not hold in that tier.
    pub unknown_removal: u64,
    /// Blocks of hashless CPU placeholder stores whose hash was unknown.
    pub unknown_placeholder: u64,
    /// Events rejected because their block size differs from the replica's.
    pub block_size_mismatch: u64,
    /// Events rejected as inconsistent (token count not `block_size` times
    /// the block count, tokens with block size 0, extra keys of another
    /// length than the blocks).
    pub malformed: u64,
    /// Blocks whose engine hash was re-stored with different contents; the
    /// new contents replace the old.
    pub hash_conflict: u64,
    /// Events of a KV cache group that is not full attention (hybrid models),
    /// ignored because full attention decides prefix reuse.
    pub non_full_group_ignored: u64,
    /// Blocks dropped because a tier went over capacity (removals were lost).
    pub over_capacity_evictions: u64,
    /// Events for a replica id that is not registered.
    pub unknown_replica: u64,
}

impl Anomalies {
    /// Every counter with its metric label, in declaration order.
    pub fn labelled(&self) -> [(&'static str, u64); 9] {
        [
            ("unknown_parent", self.unknown_parent),
            ("unknown_removal", self.unknown_removal),
            ("unknown_placeholder", self.unknown_placeholder),
            ("block_size_mismatch", self.block_size_mismatch),
            ("malformed", self.malformed),
            ("hash_conflict", self.hash_conflict),
            ("non_full_group_ignored", self.non_full_group_ignored),
            ("over_capacity_evictions", self.over_capacity_evictions),
            ("unknown_replica", self.unknown_replica),
        ]
    }

    /// Sum of all counters.
    pub fn total(&self) -> u64 {
        self.labelled().iter().map(|(_, n)| n).sum()
    }

    /// Whether no anomaly was counted.
    pub fn is_empty(&self) -> bool {
        self.total() == 0
    }
}

impl AddAssign for Anomalies {
    fn add_assign(&mut self, other: Anomalies) {
        self.unknown_parent += other.unknown_parent;
        self.unknown_removal += other.unknown_removal;
        self.unknown_placeholder += other.unknown_placeholder;
        self.block_size_mismatch += other.block_size_mismatch;
        self.malformed += other.malformed;
        self.hash_conflict += other.hash_conflict;
        self.non_full_group_ignored += other.non_full_group_ignored;
        self.over_capacity_evictions += other.over_capacity_evictions;
        self.unknown_replica += other.unknown_replica;
    }
}

/// What one [`Index::apply`](crate::Index::apply) (or `apply_batch`) did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ApplyOutcome {
    /// Block residencies stored: blocks of accepted stores, including
    /// idempotent re-stores and placeholders applied to known hashes.
    pub blocks_stored: u64,
    /// Block residencies removed: by `BlockRemoved` (known blocks only) and
    /// by `AllBlocksCleared` (one per block and tier dropped).
    pub blocks_removed: u64,
    /// Anomalies seen.
    pub anomalies: Anomalies,
}

impl AddAssign for ApplyOutcome {
    fn add_assign(&mut self, other: ApplyOutcome) {
        self.blocks_stored += other.blocks_stored;
        self.blocks_removed += other.blocks_removed;
        self.anomalies += other.anomalies;
    }
}

/// One replica's share of [`IndexStats`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplicaStats {
    /// Its id.
    pub id: ReplicaId,
    /// Its name.
    pub name: String,
    /// Its data-parallel rank.
    pub dp_rank: u32,
    /// Its block size in tokens.
    pub block_size: u32,
    /// Blocks held per tier (indexed by `Tier as usize`).
    pub blocks: [u64; 3],
    /// Effective capacity per tier (configured or default).
    pub capacity_blocks: [u64; 3],
    /// Distinct engine hashes known (a block in two tiers counts once).
    pub engine_hashes: u64,
    /// Cumulative anomalies of this replica.
    pub anomalies: Anomalies,
    /// The `now` of the last event applied to it, if any.
    pub last_event_at: Option<Instant>,
}

/// A snapshot of the whole index.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IndexStats {
    /// Live replicas, in id order.
    pub replicas: Vec<ReplicaStats>,
    /// Distinct block keys held by some replica in some tier.
    pub distinct_keys: u64,
    /// Entries of the global holder maps (a key has one per 64-replica group
    /// it is held in, and one more per group where it is in storage).
    pub holder_entries: u64,
    /// Estimated heap bytes, from map capacities times entry sizes.
    pub bytes_used: u64,
    /// Cumulative anomalies of every replica, plus events for unknown ids.
    pub anomalies: Anomalies,
}

impl IndexStats {
    /// (block, replica) residency pairs: the sum over replicas of their
    /// distinct engine hashes.
    pub fn block_replica_pairs(&self) -> u64 {
        self.replicas.iter().map(|r| r.engine_hashes).sum()
    }
}

/// Estimated heap bytes of a hashbrown-backed map (see
/// [`table_bytes`](crate::dense::table_bytes)).
pub(crate) fn map_bytes<K, V, S: BuildHasher>(map: &HashMap<K, V, S>) -> u64 {
    crate::dense::table_bytes(map.capacity(), std::mem::size_of::<(K, V)>())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn anomalies_add_and_total() {
        let mut a = Anomalies { unknown_parent: 1, unknown_replica: 2, ..Anomalies::default() };
        a += Anomalies { malformed: 3, unknown_replica: 1, ..Anomalies::default() };
        assert_eq!(a.total(), 7);
        assert_eq!(a.labelled()[8], ("unknown_replica", 3));
        assert!(!a.is_empty());
        assert!(Anomalies::default().is_empty());
    }

    #[test]
    fn map_bytes_follows_bucket_count() {
        let mut map: rustc_hash::FxHashMap<u64, u64> = rustc_hash::FxHashMap::default();
        assert_eq!(map_bytes(&map), 0);
        map.reserve(1000);
        // 1000 entries need 2048 buckets of 16 + 1 bytes.
        assert_eq!(map_bytes(&map), 2048 * 17 + 16);
    }
}
