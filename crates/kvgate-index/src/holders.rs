//! The global map from block key to the replicas holding it, per tier.
//!
//! Replica slots are dense, so holders are bitsets over groups of 64 slots,
//! keyed by the block key for group 0 and by a mix of (key, group) for groups
//! 1 and up; a fleet of up to 64 replicas never pays for groups it lacks.
//!
//! The main map carries the GPU and CPU holders of a (key, group) in a
//! 12-byte [`HolderEntry`] of a [`DenseMap`]: the group key and one `u32`
//! that holds the one replica and its tiers inline when a single replica of
//! the group holds the key (always, for content nobody shares), or else
//! points at a [GPU mask, CPU mask] pair in a side vector. Storage residency
//! (vLLM 0.26+ FS/OBJ/STORAGE connectors) is rarer, so its masks live in a
//! side map that is consulted only when it is non-empty and the main entry
//! alone cannot decide. Every key a single replica holds pays one entry
//! here, so the entry's size is a large part of the index's memory.
//!
//! The group mix XORs the key with a per-group odd constant. For one group it
//! is a bijection; across groups a collision needs two random 64-bit keys to
//! differ by exactly that constant, which is as unlikely as a collision of the
//! key hash itself.

use std::collections::hash_map::Entry;

use rustc_hash::FxHashMap;

use crate::dense::{DenseMap, Keyed};
use crate::keys::BlockKey;
use crate::stats::map_bytes;
use crate::Tier;

/// The replica in `slot` holds `key` in `tier` through one engine hash fewer.
pub(crate) fn lose_tier(
    holders: &mut Holders,
    extra_holds: &mut FxHashMap<(u64, u8), u32>,
    key: BlockKey,
    slot: usize,
    tier: Tier,
) {
    if !extra_holds.is_empty() {
        if let Entry::Occupied(mut extra) = extra_holds.entry((key.0, tier as u8)) {
            if *extra.get() > 1 {
                *extra.get_mut() -= 1;
            } else {
                extra.remove();
            }
            return;
        }
    }
    holders.clear(key, slot, tier);
}

/// Replica slots per holder entry.
pub(crate) const GROUP_SLOTS: usize = 64;

/// `HolderEntry::holders` points into the side vector of masks.
const SPILLED: u32 = 1 << 31;
/// Inline holders: the replica's GPU and CPU bits, above its 6-bit slot.
const INLINE_GPU: u32 = 1 << 6;
const INLINE_CPU: u32 = 1 << 7;

/// The GPU and CPU holders of one (key, group); see the module docs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct HolderEntry {
    /// The group key, in `u32` halves for 4-byte alignment.
    key: [u32; 2],
    /// Inline (`SPILLED` clear): the holder's slot in the group (bits 0–5)
    /// and its tiers (`INLINE_GPU`, `INLINE_CPU`). Spilled: an index into
    /// `Spill::masks`.
    holders: u32,
}

impl Keyed for HolderEntry {
    #[inline]
    fn map_key(&self) -> u64 {
        u64::from(self.key[0]) | (u64::from(self.key[1]) << 32)
    }
}

/// [GPU mask, CPU mask] pairs of (key, group)s held by several replicas,
/// with a free list.
#[derive(Clone, Debug, Default)]
struct Spill {
    masks: Vec<[u64; 2]>,
    free: Vec<u32>,
}

impl Spill {
    #[inline]
    fn masks_of(&self, entry: HolderEntry) -> [u64; 2] {
        if entry.holders & SPILLED != 0 {
            return self
                .masks
                .get((entry.holders & !SPILLED) as usize)
                .copied()
                .unwrap_or_default();
        }
        let bit = 1u64 << (entry.holders & 63);
        [
            if entry.holders & INLINE_GPU != 0 { bit } else { 0 },
            if entry.holders & INLINE_CPU != 0 { bit } else { 0 },
        ]
    }

    /// Writes `masks` into `entry`, inline when one replica holds the key.
    /// Returns whether no replica holds it any more (the entry must go).
    fn store(&mut self, entry: &mut HolderEntry, masks: [u64; 2]) -> bool {
        let any = masks[0] | masks[1];
        let spilled = (entry.holders & SPILLED != 0).then_some(entry.holders & !SPILLED);
        if any.count_ones() <= 1 {
            if let Some(at) = spilled {
                self.free.push(at);
            }
            let slot = any.trailing_zeros() & 63;
            entry.holders = slot
                | if masks[0] != 0 { INLINE_GPU } else { 0 }
                | if masks[1] != 0 { INLINE_CPU } else { 0 };
            return any == 0;
        }
        let at = match spilled {
            Some(at) => at,
            None => match self.free.pop() {
                Some(at) => at,
                None => {
                    self.masks.push([0; 2]);
                    (self.masks.len() - 1) as u32
                }
            },
        };
        if let Some(slot) = self.masks.get_mut(at as usize) {
            *slot = masks;
        }
        entry.holders = SPILLED | at;
        false
    }

    fn bytes_used(&self) -> u64 {
        (self.masks.capacity() * 16 + self.free.capacity() * 4) as u64
    }
}

/// The maps plus the bookkeeping for `distinct_keys`.
#[derive(Clone, Debug, Default)]
pub(crate) struct Holders {
    /// Group key → GPU and CPU holders.
    main: DenseMap<HolderEntry>,
    /// Masks of main entries with several holders.
    spill: Spill,
    /// Group key → storage mask; usually empty.
    storage: FxHashMap<u64, u64>,
    /// Groups that may have entries (grows with the highest slot, never
    /// shrinks).
    n_groups: usize,
    /// Keys held by at least one replica in some tier.
    distinct_keys: u64,
}

/// The map key of `key`'s entry for replica group `group`.
#[inline]
pub(crate) fn group_key(key: BlockKey, group: usize) -> u64 {
    key.0 ^ (group as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

impl Holders {
    pub(crate) fn ensure_groups(&mut self, n_groups: usize) {
        self.n_groups = self.n_groups.max(n_groups);
    }

    pub(crate) fn distinct_keys(&self) -> u64 {
        self.distinct_keys
    }

    /// Entries of both maps.
    pub(crate) fn entries(&self) -> usize {
        self.main.len() + self.storage.len()
    }

    /// Heap bytes of the maps and the spilled masks.
    pub(crate) fn bytes_used(&self) -> u64 {
        self.main.bytes_used() + self.spill.bytes_used() + map_bytes(&self.storage)
    }

    /// [GPU mask, CPU mask] of `key` for `group` (zero when none).
    #[inline]
    pub(crate) fn gpu_cpu(&self, key: BlockKey, group: usize) -> [u64; 2] {
        self.main
            .get(group_key(key, group))
            .map(|entry| self.spill.masks_of(*entry))
            .unwrap_or_default()
    }

    /// Storage mask of `key` for `group` (zero when none).
    #[inline]
    pub(crate) fn storage(&self, key: BlockKey, group: usize) -> u64 {
        if self.storage.is_empty() {
            return 0;
        }
        self.storage.get(&group_key(key, group)).copied().unwrap_or(0)
    }

    /// Sets the bit of `slot` in `tier` for `key`. Returns whether it was
    /// already set.
    #[inline]
    pub(crate) fn set(&mut self, key: BlockKey, slot: usize, tier: Tier) -> bool {
        let group = slot / GROUP_SLOTS;
        let bit = 1u64 << (slot % GROUP_SLOTS);
        let map_key = group_key(key, group);
        let in_storage = tier == Tier::Storage;
        if in_storage {
            match self.storage.entry(map_key) {
                Entry::Occupied(mut entry) => {
                    let was_set = *entry.get() & bit != 0;
                    *entry.get_mut() |= bit;
                    return was_set;
                }
                Entry::Vacant(entry) => {
                    entry.insert(bit);
                }
            }
        } else {
            let at = tier as usize;
            let inline = (slot % GROUP_SLOTS) as u32 | [INLINE_GPU, INLINE_CPU][at];
            let fresh =
                HolderEntry { key: [map_key as u32, (map_key >> 32) as u32], holders: inline };
            let (entry, inserted) = self.main.get_or_insert(fresh);
            if !inserted {
                let mut masks = self.spill.masks_of(*entry);
                let was_set = masks[at] & bit != 0;
                if !was_set {
                    masks[at] |= bit;
                    self.spill.store(entry, masks);
                }
                return was_set;
            }
        }
        // A new entry: a new key unless another entry already holds it.
        if !self.held_elsewhere(key, group, in_storage) {
            self.distinct_keys += 1;
        }
        false
    }

    /// Clears the bit of `slot` in `tier` for `key`, dropping the entry when
    /// it becomes empty. Returns whether it was set.
    #[inline]
    pub(crate) fn clear(&mut self, key: BlockKey, slot: usize, tier: Tier) -> bool {
        let group = slot / GROUP_SLOTS;
        let bit = 1u64 << (slot % GROUP_SLOTS);
        let map_key = group_key(key, group);
        let in_storage = tier == Tier::Storage;
        let (was_set, emptied) = if in_storage {
            let Some(mask) = self.storage.get_mut(&map_key) else { return false };
            let was_set = *mask & bit != 0;
            *mask &= !bit;
            let emptied = *mask == 0;
            if emptied {
                self.storage.remove(&map_key);
            }
            (was_set, emptied)
        } else {
            let Some(entry) = self.main.get_mut(map_key) else { return false };
            let at = tier as usize;
            let mut masks = self.spill.masks_of(*entry);
            let was_set = masks[at] & bit != 0;
            if !was_set {
                return false;
            }
            masks[at] &= !bit;
            let emptied = self.spill.store(entry, masks);
            if emptied {
                self.main.remove(map_key);
            }
            (was_set, emptied)
        };
        if emptied && !self.held_elsewhere(key, group, in_storage) {
            self.distinct_keys = self.distinct_keys.saturating_sub(1);
        }
        was_set
    }

    /// Whether `key` has an entry other than the one of (`group`, map).
    fn held_elsewhere(&self, key: BlockKey, group: usize, in_storage: bool) -> bool {
        let storage_in_use = !self.storage.is_empty();
        if self.n_groups <= 1 {
            let map_key = group_key(key, 0);
            return if in_storage {
                self.main.contains(map_key)
            } else {
                storage_in_use && self.storage.contains_key(&map_key)
            };
        }
        (0..self.n_groups).any(|other| {
            let map_key = group_key(key, other);
            ((other != group || in_storage) && self.main.contains(map_key))
                || ((other != group || !in_storage)
                    && storage_in_use
                    && self.storage.contains_key(&map_key))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn main_entry_is_12_bytes() {
        assert_eq!(std::mem::size_of::<HolderEntry>(), 12);
    }

    #[test]
    fn holders_spill_and_come_back_inline() {
        let mut holders = Holders::default();
        holders.ensure_groups(1);
        let key = BlockKey(9);
        holders.set(key, 5, Tier::Gpu);
        holders.set(key, 5, Tier::Cpu);
        assert_eq!(holders.gpu_cpu(key, 0), [1 << 5, 1 << 5]);
        assert!(holders.spill.masks.is_empty());
        holders.set(key, 63, Tier::Cpu);
        assert_eq!(holders.gpu_cpu(key, 0), [1 << 5, 1 << 5 | 1 << 63]);
        assert_eq!(holders.spill.masks.len(), 1);
        assert!(holders.clear(key, 5, Tier::Gpu));
        assert!(holders.clear(key, 5, Tier::Cpu));
        // One holder left: inline again, its spilled masks free for reuse.
        assert_eq!(holders.gpu_cpu(key, 0), [0, 1 << 63]);
        assert_eq!(holders.spill.free, vec![0]);
        holders.set(BlockKey(10), 1, Tier::Gpu);
        holders.set(BlockKey(10), 2, Tier::Gpu);
        assert_eq!((holders.spill.masks.len(), holders.spill.free.len()), (1, 0));
        assert_eq!(holders.distinct_keys(), 2);
        assert!(holders.clear(key, 63, Tier::Cpu));
        assert!(!holders.clear(key, 63, Tier::Cpu));
        assert_eq!((holders.distinct_keys(), holders.entries()), (1, 1));
    }

    #[test]
    fn set_and_clear_track_bits_entries_and_distinct_keys() {
        let mut holders = Holders::default();
        holders.ensure_groups(3);
        let key = BlockKey(42);
        assert!(!holders.set(key, 0, Tier::Gpu));
        assert!(holders.set(key, 0, Tier::Gpu));
        assert!(!holders.set(key, 130, Tier::Cpu));
        assert!(!holders.set(key, 130, Tier::Storage));
        assert_eq!(holders.distinct_keys(), 1);
        assert_eq!(holders.entries(), 3);
        assert_eq!(holders.gpu_cpu(key, 2), [0, 1 << 2]);
        assert_eq!(holders.storage(key, 2), 1 << 2);
        assert!(holders.clear(key, 0, Tier::Gpu));
        assert!(!holders.clear(key, 0, Tier::Gpu));
        assert!(holders.clear(key, 130, Tier::Cpu));
        assert_eq!(holders.distinct_keys(), 1);
        assert!(holders.clear(key, 130, Tier::Storage));
        assert_eq!(holders.distinct_keys(), 0);
        assert_eq!(holders.entries(), 0);
    }

    #[test]
    fn storage_only_keys_count_once_in_one_group() {
        let mut holders = Holders::default();
        holders.ensure_groups(1);
        let key = BlockKey(7);
        holders.set(key, 3, Tier::Storage);
        holders.set(key, 3, Tier::Gpu);
        assert_eq!(holders.distinct_keys(), 1);
        holders.clear(key, 3, Tier::Gpu);
        assert_eq!(holders.distinct_keys(), 1);
        holders.clear(key, 3, Tier::Storage);
        assert_eq!(holders.distinct_keys(), 0);
    }
}
