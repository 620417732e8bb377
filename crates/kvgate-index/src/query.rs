//! The prefix query: how much of a prompt each replica already holds.
//!
//! Definitions, for a prompt's block keys `k_0..k_n` and one replica:
//! - `total`: the longest prefix `k_0..k_total` in which the replica holds
//!   every block in *some* tier. A block offloaded to CPU or storage continues
//!   the prefix: it costs a transfer, not a recompute.
//! - `gpu`, `cpu`, `storage`: within that prefix, each block counts toward
//!   the fastest tier the replica holds it in; they sum to `total`.
//! - `gpu_prefix`: the longest prefix held entirely on GPU (what the engine
//!   can reuse without any transfer); `gpu_prefix <= gpu`.
//!
//! Algorithm: replicas are bits of 64-slot groups, so for each group the scan
//! keeps two masks, replicas whose prefix is still alive and replicas whose
//! GPU prefix is still alive. Per block there is one map lookup (plus a read
//! of the side vector when several replicas of the group hold the block, and
//! a lookup in the storage side map only when storage is in use and some live
//! replica lacks the block on GPU and CPU) and a few mask operations; bits are iterated only for replicas whose prefix ends at
//! that block or that hold the block in a lower tier. GPU counts are derived
//! at the end (`total - cpu - storage`). A group's scan stops at the first
//! block that none of its live replicas holds.

use crate::holders::GROUP_SLOTS;
use crate::index::Index;
use crate::keys::BlockKey;
use crate::replica_id::ReplicaId;
use crate::Tier;

/// One replica's prefix match for one prompt, in blocks (see the module docs
/// for the exact definitions).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PrefixMatch {
    /// Longest prefix held in some tier.
    pub total: u32,
    /// Blocks of that prefix whose fastest tier is the GPU.
    pub gpu: u32,
    /// Blocks of that prefix whose fastest tier is CPU memory.
    pub cpu: u32,
    /// Blocks of that prefix held only in storage.
    pub storage: u32,
    /// Longest prefix held entirely on GPU.
    pub gpu_prefix: u32,
}

impl PrefixMatch {
    /// Blocks of the prefix counted toward `tier`.
    pub fn blocks_in(&self, tier: Tier) -> u32 {
        match tier {
            Tier::Gpu => self.gpu,
            Tier::Cpu => self.cpu,
            Tier::Storage => self.storage,
        }
    }
}

impl Index {
    /// For every replica, its longest prefix match of `keys` (a prompt's block
    /// keys from [`block_keys`](crate::block_keys)).
    ///
    /// `out` is cleared and refilled with [`slot_count`](Index::slot_count)
    /// entries, `out[id.index()]` for each live replica id; free slots read
    /// all zero. Reusing `out` across calls avoids allocation.
    pub fn find_matches(&self, keys: &[BlockKey], out: &mut Vec<PrefixMatch>) {
        out.clear();
        out.resize(self.replicas.len(), PrefixMatch::default());
        let keys = &keys[..keys.len().min(u32::MAX as usize)];
        for (group, &live) in self.live_masks.iter().enumerate() {
            if live != 0 {
                self.scan_group(keys, group, live, out);
            }
        }
    }

    /// The fastest tier in which replica `id` holds `key`, if any. One or two
    /// map lookups; the router uses it to confirm its tentative blocks.
    pub fn fastest_tier(&self, key: BlockKey, id: ReplicaId) -> Option<Tier> {
        let slot = id.index();
        let (group, bit) = (slot / GROUP_SLOTS, 1u64 << (slot % GROUP_SLOTS));
        // A replica being cleared (or gone) holds nothing, whatever its
        // holder bits still say.
        if self.live_masks.get(group).is_none_or(|live| live & bit == 0) {
            return None;
        }
        let [gpu, cpu] = self.holders.gpu_cpu(key, group);
        if gpu & bit != 0 {
            Some(Tier::Gpu)
        } else if cpu & bit != 0 {
            Some(Tier::Cpu)
        } else if self.holders.storage(key, group) & bit != 0 {
            Some(Tier::Storage)
        } else {
            None
        }
    }

    /// The prefix scan for one group of 64 replica slots.
    fn scan_group(&self, keys: &[BlockKey], group: usize, live: u64, out: &mut [PrefixMatch]) {
        let base = group * GROUP_SLOTS;
        let mut alive = live;
        let mut gpu_alive = live;
        let scanned = keys.len() as u32;
        for (i, key) in keys.iter().enumerate() {
            let i = i as u32;
            let [gpu, cpu] = self.holders.gpu_cpu(*key, group);
            let mut held = gpu | cpu;
            if alive & !held != 0 {
                // Only then can storage residency change the outcome.
                held |= self.holders.storage(*key, group);
            }
            for_each_bit(alive & !held, |bit| {
                if let Some(m) = out.get_mut(base + bit) {
                    m.total = i;
                }
            });
            for_each_bit(gpu_alive & !gpu, |bit| {
                if let Some(m) = out.get_mut(base + bit) {
                    m.gpu_prefix = i;
                }
            });
            alive &= held;
            gpu_alive &= gpu;
            for_each_bit(alive & !gpu, |bit| {
                if let Some(m) = out.get_mut(base + bit) {
                    if cpu & (1 << bit) != 0 {
                        m.cpu += 1;
                    } else {
                        m.storage += 1;
                    }
                }
            });
            if alive == 0 {
                break;
            }
        }
        for_each_bit(alive, |bit| {
            if let Some(m) = out.get_mut(base + bit) {
                m.total = scanned;
            }
        });
        for_each_bit(gpu_alive, |bit| {
            if let Some(m) = out.get_mut(base + bit) {
                m.gpu_prefix = scanned;
            }
        });
        for_each_bit(live, |bit| {
            if let Some(m) = out.get_mut(base + bit) {
                m.gpu = m.total.saturating_sub(m.cpu + m.storage);
            }
        });
    }
}

/// Calls `f` with the index of every set bit of `mask`, lowest first.
#[inline]
fn for_each_bit(mut mask: u64, mut f: impl FnMut(usize)) {
    while mask != 0 {
        f(mask.trailing_zeros() as usize);
        mask &= mask - 1;
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use kvgate_events::Medium;

    use crate::testutil::{index_with, placeholder, removed, stored, tokens};
    use crate::{block_keys, PrefixMatch, Tier};

    #[test]
    fn lower_tiers_continue_the_prefix_but_not_the_gpu_prefix() {
        let (mut index, ids) = index_with(1);
        let now = Instant::now();
        let toks = tokens(4, |b| b as u32 + 1);
        index.apply(ids[0], &stored(&[1, 2, 3, 4], None, &toks, 4), now);
        index.apply(ids[0], &placeholder(&[2, 3], Medium::Cpu), now);
        index.apply(ids[0], &placeholder(&[3], Medium::Storage), now);
        index.apply(ids[0], &removed(&[2, 3], None), now);
        index.apply(ids[0], &removed(&[3], Some(Medium::Cpu)), now);
        let mut out = Vec::new();
        index.find_matches(&block_keys(&toks, 4, None), &mut out);
        // Blocks: GPU, CPU, storage, GPU.
        assert_eq!(out, vec![PrefixMatch { total: 4, gpu: 2, cpu: 1, storage: 1, gpu_prefix: 1 }]);
        let keys = block_keys(&toks, 4, None);
        let tiers: Vec<_> = keys.iter().map(|k| index.fastest_tier(*k, ids[0])).collect();
        assert_eq!(tiers, [Some(Tier::Gpu), Some(Tier::Cpu), Some(Tier::Storage), Some(Tier::Gpu)]);
        assert_eq!(index.fastest_tier(crate::BlockKey(7), ids[0]), None);
    }

    #[test]
    fn each_replica_gets_its_own_prefix_across_groups() {
        let (mut index, ids) = index_with(130);
        let now = Instant::now();
        let toks = tokens(3, |b| b as u32);
        for (i, id) in ids.iter().enumerate() {
            let n = i % 4;
            if n > 0 {
                index.apply(*id, &stored(&[1, 2, 3][..n], None, &toks[..n * 4], 4), now);
            }
        }
        let mut out = Vec::new();
        index.find_matches(&block_keys(&toks, 4, None), &mut out);
        assert_eq!(out.len(), 130);
        for (i, m) in out.iter().enumerate() {
            let n = (i % 4).min(3) as u32;
            assert_eq!(
                *m,
                PrefixMatch { total: n, gpu: n, gpu_prefix: n, cpu: 0, storage: 0 },
                "{i}"
            );
        }
        assert_eq!(index.distinct_keys(), 3);
    }

    #[test]
    fn empty_queries_and_free_slots_read_zero() {
        let (mut index, ids) = index_with(3);
        let _ = index.remove_replica(ids[1]);
        let mut out = vec![PrefixMatch { total: 9, ..PrefixMatch::default() }];
        index.find_matches(&[], &mut out);
        assert_eq!(out, vec![PrefixMatch::default(); 3]);
    }
}
