//! [`Index`]: the whole index, and replica management.
//!
//! Replicas live in dense slots so that the global holder map can use
//! bitsets (see `holders.rs`); a slot freed by `remove_replica` is reused by
//! the next `add_replica`. Removing or clearing a replica walks only that
//! replica's own engine-hash map, so it costs O(its blocks), never O(index).
//! Event application is in `apply.rs`, the prefix query in `query.rs`.

use crate::capacity::enforce_capacity;
use crate::error::IndexError;
use crate::holders::{lose_tier, Holders, GROUP_SLOTS};
use crate::replica::{EngineEntry, Replica, ReplicaSpec};
use crate::replica_id::ReplicaId;
use crate::stats::{map_bytes, Anomalies, IndexStats, ReplicaStats};
use crate::Tier;

/// The emptied table of a finished stepwise clear ([`Index::clear_step`]):
/// dropping it frees the memory, which is best done outside a lock.
#[derive(Debug)]
pub struct SpentTable(#[allow(dead_code)] Vec<EngineEntry>);

/// A content-hashed KV block index over a fleet of replicas. See the crate
/// docs for the model; it does no I/O and takes `&mut self` to change, so a
/// router shares it as immutable snapshots (it is `Clone + Send + Sync`).
#[derive(Clone, Debug, Default)]
pub struct Index {
    /// Replica slots; `None` is a free slot.
    pub(crate) replicas: Vec<Option<Replica>>,
    /// Key → holder bitsets per tier.
    pub(crate) holders: Holders,
    /// Per group of 64 slots, the bits of live replicas.
    pub(crate) live_masks: Vec<u64>,
    /// Cumulative anomalies, all replicas plus unknown ids.
    pub(crate) anomalies: Anomalies,
}

impl Index {
    /// An empty index.
    pub fn new() -> Index {
        Index::default()
    }

    /// Registers a replica and returns its id (the lowest free slot).
    pub fn add_replica(&mut self, spec: ReplicaSpec) -> Result<ReplicaId, IndexError> {
        if spec.block_size == 0 {
            return Err(IndexError::ZeroBlockSize { name: spec.name });
        }
        if let Some(existing) = self.replica_id(&spec.name, spec.dp_rank) {
            return Err(IndexError::DuplicateReplica {
                name: spec.name,
                dp_rank: spec.dp_rank,
                existing,
            });
        }
        let slot = match self.replicas.iter().position(Option::is_none) {
            Some(slot) => slot,
            None if self.replicas.len() < u32::MAX as usize => {
                self.replicas.push(None);
                self.replicas.len() - 1
            }
            None => return Err(IndexError::TooManyReplicas),
        };
        self.replicas[slot] = Some(Replica::new(spec));
        let group = slot / GROUP_SLOTS;
        if self.live_masks.len() <= group {
            self.live_masks.resize(group + 1, 0);
        }
        self.live_masks[group] |= 1 << (slot % GROUP_SLOTS);
        self.holders.ensure_groups(self.live_masks.len());
        Ok(ReplicaId(slot as u32))
    }

    /// Unregisters a replica and drops everything it holds, in O(its blocks).
    /// Its id may be handed out again by a later `add_replica`.
    pub fn remove_replica(&mut self, id: ReplicaId) -> Result<(), IndexError> {
        self.clear_replica(id)?;
        let slot = id.index();
        // Its anomalies stay in the global counters, which count as they go.
        if let Some(entry) = self.replicas.get_mut(slot) {
            *entry = None;
        }
        if let Some(mask) = self.live_masks.get_mut(slot / GROUP_SLOTS) {
            *mask &= !(1 << (slot % GROUP_SLOTS));
        }
        while self.replicas.last().is_some_and(Option::is_none) {
            self.replicas.pop();
        }
        Ok(())
    }

    /// Drops every block a replica holds, in every tier, in O(its blocks).
    /// Returns how many (block, tier) residencies were dropped.
    pub fn clear_replica(&mut self, id: ReplicaId) -> Result<u64, IndexError> {
        let slot = id.index();
        let Some(replica) = self.replicas.get_mut(slot).and_then(Option::as_mut) else {
            return Err(IndexError::UnknownReplica(id));
        };
        let drained = drain_entries(replica, &mut self.holders, slot, usize::MAX);
        let dropped = clear_slot(replica, &mut self.holders, slot);
        self.set_live(slot, true);
        Ok(drained + dropped)
    }

    /// Starts clearing a replica without walking its blocks: in O(1) its
    /// blocks leave its view (it reads as holding nothing, to queries and
    /// counts alike), and new events apply to an empty view at once. The old
    /// blocks still occupy the holder map until [`clear_step`] has released
    /// them, a bounded number per call, so that a clear of millions of
    /// blocks never holds the caller's write lock for long. Returns how many
    /// engine entries wait to be released (a clear already in progress is
    /// finished first).
    ///
    /// [`clear_step`]: Index::clear_step
    pub fn begin_clear(&mut self, id: ReplicaId) -> Result<u64, IndexError> {
        let slot = id.index();
        let Some(replica) = self.replicas.get_mut(slot).and_then(Option::as_mut) else {
            return Err(IndexError::UnknownReplica(id));
        };
        drain_entries(replica, &mut self.holders, slot, usize::MAX);
        replica.draining = std::mem::take(&mut replica.entries).into_entries();
        replica.counts = [0; 3];
        replica.repeats = Default::default();
        replica.recent = Default::default();
        let pending = replica.draining.len() as u64;
        self.set_live(slot, pending == 0);
        Ok(pending)
    }

    /// Releases up to `budget` engine entries of a clear in progress, and
    /// shows the replica to queries again once none is left. Returns how many
    /// are left (0: the clear is complete) and, with the last step, the old
    /// table's memory: drop it after releasing any lock around the index
    /// (freeing tens of megabytes takes milliseconds).
    pub fn clear_step(
        &mut self,
        id: ReplicaId,
        budget: usize,
    ) -> Result<(u64, Option<SpentTable>), IndexError> {
        let slot = id.index();
        let Some(replica) = self.replicas.get_mut(slot).and_then(Option::as_mut) else {
            return Err(IndexError::UnknownReplica(id));
        };
        drain_entries(replica, &mut self.holders, slot, budget);
        let left = replica.draining.len() as u64;
        let mut spent = None;
        if left == 0 {
            if replica.draining.capacity() > 0 {
                spent = Some(SpentTable(std::mem::take(&mut replica.draining)));
            }
            self.set_live(slot, true);
        }
        Ok((left, spent))
    }

    /// Whether a clear of the replica is in progress.
    pub fn clearing(&self, id: ReplicaId) -> bool {
        self.replica(id).is_some_and(|r| !r.draining.is_empty())
    }

    fn set_live(&mut self, slot: usize, live: bool) {
        if let Some(mask) = self.live_masks.get_mut(slot / GROUP_SLOTS) {
            let bit = 1u64 << (slot % GROUP_SLOTS);
            if live {
                *mask |= bit;
            } else {
                *mask &= !bit;
            }
        }
    }

    /// Sets a replica's capacity per tier (`None`: the default bound), for
    /// example once the engine has reported its cache size. A tier already
    /// over the new capacity plus slack is trimmed now, oldest first, and the
    /// dropped blocks are counted as `over_capacity_evictions`. Returns how
    /// many blocks were dropped.
    pub fn set_capacity(
        &mut self,
        id: ReplicaId,
        capacity_blocks: [Option<u64>; 3],
    ) -> Result<u64, IndexError> {
        let slot = id.index();
        let Some(replica) = self.replicas.get_mut(slot).and_then(Option::as_mut) else {
            return Err(IndexError::UnknownReplica(id));
        };
        replica.spec.capacity_blocks = capacity_blocks;
        let mut dropped = 0;
        for tier in Tier::ALL {
            dropped += enforce_capacity(replica, &mut self.holders, slot, tier);
        }
        replica.anomalies.over_capacity_evictions += dropped;
        self.anomalies.over_capacity_evictions += dropped;
        Ok(dropped)
    }

    /// The id of the replica `(name, dp_rank)`, if registered.
    pub fn replica_id(&self, name: &str, dp_rank: u32) -> Option<ReplicaId> {
        self.replicas.iter().enumerate().find_map(|(slot, replica)| {
            replica
                .as_ref()
                .filter(|r| r.spec.dp_rank == dp_rank && r.spec.name == name)
                .map(|_| ReplicaId(slot as u32))
        })
    }

    /// Ids of every live replica, ascending.
    pub fn replica_ids(&self) -> impl Iterator<Item = ReplicaId> + '_ {
        self.replicas
            .iter()
            .enumerate()
            .filter(|(_, replica)| replica.is_some())
            .map(|(slot, _)| ReplicaId(slot as u32))
    }

    /// The spec a live replica was registered with.
    pub fn replica_spec(&self, id: ReplicaId) -> Option<&ReplicaSpec> {
        self.replica(id).map(|r| &r.spec)
    }

    /// Number of live replicas.
    pub fn replica_count(&self) -> usize {
        self.replicas.iter().filter(|r| r.is_some()).count()
    }

    /// Length of [`find_matches`](Index::find_matches)' output: one past the
    /// highest live id.
    pub fn slot_count(&self) -> usize {
        self.replicas.len()
    }

    /// Blocks a replica holds in `tier`.
    pub fn blocks_held(&self, id: ReplicaId, tier: Tier) -> Option<u64> {
        self.replica(id).map(|r| r.counts[tier as usize])
    }

    /// The engine hashes (folded to `u64` as [`BlockHash::fold_u64`] does)
    /// a replica holds in `tier`, in no particular order: what the index
    /// believes, to compare with the engine's own contents.
    ///
    /// [`BlockHash::fold_u64`]: kvgate_events::BlockHash::fold_u64
    pub fn engine_hashes(&self, id: ReplicaId, tier: Tier) -> Option<Vec<u64>> {
        let bit = 1u8 << (tier as u8);
        self.replica(id)
            .map(|r| r.entries.iter().filter(|e| e.tiers() & bit != 0).map(|e| e.hash()).collect())
    }

    /// Distinct block keys held by some replica in some tier.
    pub fn distinct_keys(&self) -> u64 {
        self.holders.distinct_keys()
    }

    /// Anomalies counted for one live replica since it was registered.
    pub fn replica_anomalies(&self, id: ReplicaId) -> Option<Anomalies> {
        self.replica(id).map(|r| r.anomalies)
    }

    /// Cumulative anomalies over all replicas (including removed ones) and
    /// events for unknown ids.
    pub fn anomalies(&self) -> Anomalies {
        self.anomalies
    }

    /// A statistics snapshot; O(replicas), not O(blocks).
    pub fn stats(&self) -> IndexStats {
        let replicas: Vec<ReplicaStats> = self
            .replicas
            .iter()
            .enumerate()
            .filter_map(|(slot, replica)| {
                let replica = replica.as_ref()?;
                Some(ReplicaStats {
                    id: ReplicaId(slot as u32),
                    name: replica.spec.name.clone(),
                    dp_rank: replica.spec.dp_rank,
                    block_size: replica.spec.block_size,
                    blocks: replica.counts,
                    capacity_blocks: Tier::ALL.map(|tier| replica.capacity(tier)),
                    engine_hashes: replica.entries.len() as u64,
                    anomalies: replica.anomalies,
                    last_event_at: replica.last_event_at,
                })
            })
            .collect();
        IndexStats {
            replicas,
            distinct_keys: self.holders.distinct_keys(),
            holder_entries: self.holders.entries() as u64,
            bytes_used: self.bytes_used(),
            anomalies: self.anomalies,
        }
    }

    /// Estimated heap bytes in use (map capacities × entry sizes).
    pub fn bytes_used(&self) -> u64 {
        let slots = (self.replicas.capacity() * std::mem::size_of::<Option<Replica>>()) as u64;
        let masks = (self.live_masks.capacity() * 8) as u64;
        let per_replica: u64 = self
            .replicas
            .iter()
            .flatten()
            .map(|r| {
                r.entries.bytes_used()
                    + (r.draining.capacity() * std::mem::size_of::<EngineEntry>()) as u64
                    + map_bytes(&r.extra_holds)
                    + map_bytes(&r.repeats)
                    + r.recent.bytes_used()
                    + r.spec.name.capacity() as u64
                    + (r.non_full_groups.capacity() * 4) as u64
            })
            .sum();
        slots + masks + per_replica + self.holders.bytes_used()
    }

    pub(crate) fn replica(&self, id: ReplicaId) -> Option<&Replica> {
        self.replicas.get(id.index()).and_then(Option::as_ref)
    }
}

/// Drops everything the replica in `slot` holds; returns the (block, tier)
/// residencies dropped. Duplicate-content bookkeeping goes with it.
/// Releases up to `budget` entries of `replica.draining` from the holder
/// map, through `lose_tier` (so that entries of the new view holding the same
/// keys keep their bits). Returns the residencies released.
///
pub(crate) fn drain_entries(
    replica: &mut Replica,
    holders: &mut Holders,
    slot: usize,
    budget: usize,
) -> u64 {
    if replica.draining.is_empty() {
        return 0;
    }
    let mut released = 0;
    let keep = replica.draining.len().saturating_sub(budget);
    for entry in replica.draining.drain(keep..) {
        for tier in Tier::ALL {
            if entry.tiers() & (1 << tier as u8) != 0 {
                lose_tier(holders, &mut replica.extra_holds, entry.key(), slot, tier);
                released += 1;
            }
        }
    }
    released
}

pub(crate) fn clear_slot(replica: &mut Replica, holders: &mut Holders, slot: usize) -> u64 {
    let mut dropped = 0;
    for entry in replica.entries.iter() {
        let tiers = entry.tiers();
        for tier in Tier::ALL {
            if tiers & (1 << tier as u8) != 0 {
                holders.clear(entry.key(), slot, tier);
                dropped += 1;
            }
        }
    }
    // Release the memory: a cleared replica refills from scratch.
    replica.entries = Default::default();
    replica.extra_holds = Default::default();
    replica.repeats = Default::default();
    replica.recent = Default::default();
    replica.counts = [0; 3];
    dropped
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use crate::testutil::{index_with, stored};
    use crate::{block_keys, Index, IndexError, ReplicaId, ReplicaSpec, Tier};

    #[test]
    fn name_and_rank_identify_a_replica() {
        let mut index = Index::new();
        let a = index.add_replica(ReplicaSpec::new("a", 0, 16));
        let b = index.add_replica(ReplicaSpec::new("a", 1, 16));
        assert_eq!((a, b), (Ok(ReplicaId(0)), Ok(ReplicaId(1))));
        let dup = index.add_replica(ReplicaSpec::new("a", 1, 16));
        assert_eq!(
            dup,
            Err(IndexError::DuplicateReplica {
                name: "a".into(),
                dp_rank: 1,
                existing: ReplicaId(1)
            })
        );
        assert!(matches!(
            index.add_replica(ReplicaSpec::new("z", 0, 0)),
            Err(IndexError::ZeroBlockSize { .. })
        ));
        assert_eq!(index.replica_id("a", 1), Some(ReplicaId(1)));
        assert_eq!(index.replica_count(), 2);
    }

    #[test]
    fn removal_drops_holdings_and_frees_the_id() {
        let (mut index, ids) = index_with(3);
        let now = Instant::now();
        index.apply(ids[1], &stored(&[1], None, &[1; 4], 4), now);
        assert_eq!(index.blocks_held(ids[1], Tier::Gpu), Some(1));
        assert_eq!(index.remove_replica(ids[1]), Ok(()));
        assert_eq!(index.remove_replica(ids[1]), Err(IndexError::UnknownReplica(ids[1])));
        assert_eq!(index.distinct_keys(), 0);
        let mut out = Vec::new();
        index.find_matches(&block_keys(&[1; 4], 4, None), &mut out);
        assert!(out.iter().all(|m| m.total == 0));
        let reused = index.add_replica(ReplicaSpec::new("new", 0, 4));
        assert_eq!(reused, Ok(ids[1]));
        assert_eq!(index.blocks_held(ids[1], Tier::Gpu), Some(0));
        assert_eq!(index.replica_ids().collect::<Vec<_>>(), ids);
    }

    #[test]
    fn clear_keeps_the_replica() {
        let (mut index, ids) = index_with(1);
        index.apply(ids[0], &stored(&[1, 2], None, &[1; 8], 4), Instant::now());
        assert_eq!(index.clear_replica(ids[0]), Ok(2));
        assert_eq!(index.blocks_held(ids[0], Tier::Gpu), Some(0));
        assert_eq!(index.replica_count(), 1);
        assert_eq!(
            index.clear_replica(ReplicaId(5)),
            Err(IndexError::UnknownReplica(ReplicaId(5)))
        );
    }

    #[test]
    fn stats_report_blocks_keys_and_bytes() {
        let (mut index, ids) = index_with(2);
        let now = Instant::now();
        index.apply(ids[0], &stored(&[1, 2], None, &[1; 8], 4), now);
        index.apply(ids[1], &stored(&[7], None, &[1; 4], 4), now);
        let stats = index.stats();
        assert_eq!(stats.replicas.len(), 2);
        assert_eq!(stats.replicas[0].blocks, [2, 0, 0]);
        assert_eq!(stats.replicas[0].last_event_at, Some(now));
        assert_eq!(stats.distinct_keys, 2);
        assert_eq!(stats.holder_entries, 2);
        assert_eq!(stats.block_replica_pairs(), 3);
        assert!(stats.bytes_used > 0);
        assert!(stats.anomalies.is_empty());
    }
}
