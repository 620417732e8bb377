//! The memory bound: no replica holds more blocks per tier than it can.
//!
//! Unbounded index growth is a known failure of other routers (FIELD.md §3):
//! when `BlockRemoved` events are lost, entries pile up forever. Here every
//! replica tier has a capacity (configured, or [`DEFAULT_CAPACITY_BLOCKS`]).
//! Once a tier holds more than capacity plus [`capacity_slack`], the oldest
//! entries of that tier (by insertion sequence) are dropped in one bulk pass
//! down to the capacity. The pass is O(n) with `select_nth_unstable`, and the
//! slack spreads it over at least n/16 insertions, so it costs amortised O(1)
//! per stored block. Each dropped block is counted as an
//! `over_capacity_evictions` anomaly, because it means removals went missing.

use crate::holders::{lose_tier, Holders};
use crate::replica::Replica;
use crate::Tier;

/// Capacity of a tier whose [`ReplicaSpec`](crate::ReplicaSpec) says `None`:
/// 4M blocks, i.e. 64M tokens at block size 16, more than any single GPU of
/// today holds, so the default bounds memory without ever biting a healthy
/// stream.
pub const DEFAULT_CAPACITY_BLOCKS: u64 = 1 << 22;

/// How far a tier may overshoot its capacity before a bulk eviction:
/// `capacity / 16 + 64` blocks.
pub fn capacity_slack(capacity: u64) -> u64 {
    capacity / 16 + 64
}

impl Replica {
    /// The capacity of `tier` in blocks.
    pub(crate) fn capacity(&self, tier: Tier) -> u64 {
        self.spec.capacity_blocks[tier as usize].unwrap_or(DEFAULT_CAPACITY_BLOCKS)
    }
}

/// If `tier` of the replica in `slot` is over capacity plus slack, drops its
/// oldest entries down to capacity. Returns how many blocks were dropped.
pub(crate) fn enforce_capacity(
    replica: &mut Replica,
    holders: &mut Holders,
    slot: usize,
    tier: Tier,
) -> u64 {
    let capacity = replica.capacity(tier);
    let held = replica.counts[tier as usize];
    if held <= capacity.saturating_add(capacity_slack(capacity)) {
        return 0;
    }
    let tier_bit = 1u8 << (tier as u8);
    let mut oldest: Vec<(u32, u64)> = replica
        .entries
        .iter()
        .filter(|entry| entry.tiers() & tier_bit != 0)
        .map(|entry| (entry.seq(), entry.hash()))
        .collect();
    let excess = (held - capacity) as usize;
    if excess < oldest.len() {
        oldest.select_nth_unstable_by_key(excess, |(seq, _)| *seq);
        oldest.truncate(excess);
    }
    let mut evicted = 0;
    for (_, hash) in oldest {
        let Some(entry) = replica.entries.get_mut(hash) else { continue };
        // Every announcement goes: the removals that would have taken them
        // back are what went missing.
        replica.repeats.remove(&(hash, tier as u8));
        let key = entry.key();
        let tiers = entry.tiers() & !tier_bit;
        entry.set_tiers(tiers);
        if tiers == 0 {
            replica.entries.remove(hash);
        }
        lose_tier(holders, &mut replica.extra_holds, key, slot, tier);
        replica.counts[tier as usize] -= 1;
        evicted += 1;
    }
    evicted
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use kvgate_events::Medium;

    use crate::testutil::{placeholder, stored};
    use crate::{block_keys, capacity_slack, Index, ReplicaSpec, Tier};

    #[test]
    fn over_capacity_evicts_the_oldest_down_to_capacity() {
        let mut index = Index::new();
        let mut spec = ReplicaSpec::new("r", 0, 1);
        spec.capacity_blocks = [Some(10), Some(0), None];
        let id = index.add_replica(spec).unwrap_or(crate::ReplicaId(0));
        let now = Instant::now();
        let limit = 10 + capacity_slack(10);
        let mut evicted = 0;
        for t in 0..=limit as u32 {
            evicted += index
                .apply(id, &stored(&[u64::from(t) + 1], None, &[t], 1), now)
                .anomalies
                .over_capacity_evictions;
        }
        assert_eq!(evicted, limit + 1 - 10);
        assert_eq!(index.blocks_held(id, Tier::Gpu), Some(10));
        let mut out = Vec::new();
        // The newest ten survive, the oldest are gone.
        index.find_matches(&block_keys(&[limit as u32], 1, None), &mut out);
        assert_eq!(out[0].total, 1);
        index.find_matches(&block_keys(&[0], 1, None), &mut out);
        assert_eq!(out[0].total, 0);
        // A zero-capacity tier keeps at most its slack.
        let newest: Vec<u64> = (limit - 8..=limit + 1).collect();
        let placed = index.apply(id, &placeholder(&newest, Medium::Cpu), now);
        assert_eq!(placed.blocks_stored, 10);
        assert_eq!(index.blocks_held(id, Tier::Cpu), Some(10));
        assert_eq!(index.stats().anomalies.over_capacity_evictions, evicted);
    }

    #[test]
    fn a_lower_capacity_trims_the_oldest_at_once() {
        let mut index = Index::new();
        let id = index.add_replica(ReplicaSpec::new("r", 0, 1)).unwrap_or(crate::ReplicaId(0));
        let now = Instant::now();
        for t in 0..500u32 {
            index.apply(id, &stored(&[u64::from(t) + 1], None, &[t], 1), now);
        }
        assert_eq!(index.blocks_held(id, Tier::Gpu), Some(500));
        // Within capacity plus slack: nothing to drop.
        assert_eq!(index.set_capacity(id, [Some(450), None, None]).ok(), Some(0));
        // Below it: trimmed to the capacity now, the newest kept, counted.
        assert_eq!(index.set_capacity(id, [Some(100), None, None]).ok(), Some(400));
        assert_eq!(index.blocks_held(id, Tier::Gpu), Some(100));
        assert_eq!(index.stats().anomalies.over_capacity_evictions, 400);
        assert_eq!(index.stats().replicas[0].capacity_blocks[0], 100);
        let mut out = Vec::new();
        index.find_matches(&block_keys(&[499], 1, None), &mut out);
        assert_eq!(out[0].total, 1);
        index.find_matches(&block_keys(&[0], 1, None), &mut out);
        assert_eq!(out[0].total, 0);
        assert!(index.set_capacity(crate::ReplicaId(7), [None; 3]).is_err());
    }
}
