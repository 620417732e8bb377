//! The global map from block key to the replicas holding it, per tier.
//!
//! Replica slots are dense, so holders are bitsets over groups of 64 slots,
//! keyed by the block key for group 0 and by a mix of (key, group) for groups
//! 1 and up; a fleet of up to 64 replicas never pays for groups it lacks.
//!
//! The main map carries the GPU and CPU masks in a 24-byte entry. Storage
//! residency (vLLM 0.26+ FS/OBJ/STORAGE connectors) is rarer, so its masks
//! live in a side map that is consulted only when it is non-empty and the
//! main entry alone cannot decide. A key costs 24 bytes instead of 32 in the
//! common case, which matters because every key a single replica holds pays
//! one entry here.
//!
//! The group mix XORs the key with a per-group odd constant. For one group it
//! is a bijection; across groups a collision needs two random 64-bit keys to
//! differ by exactly that constant, which is as unlikely as a collision of the
//! key hash itself.

use std::collections::hash_map::Entry;

use rustc_hash::FxHashMap;

use crate::keys::BlockKey;
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

/// The map itself plus the bookkeeping for `distinct_keys`.
#[derive(Clone, Debug, Default)]
pub(crate) struct Holders {
    /// Group key → [GPU mask, CPU mask].
    main: FxHashMap<u64, [u64; 2]>,
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

    pub(crate) fn main_map(&self) -> &FxHashMap<u64, [u64; 2]> {
        &self.main
    }

    pub(crate) fn storage_map(&self) -> &FxHashMap<u64, u64> {
        &self.storage
    }

    /// [GPU mask, CPU mask] of `key` for `group` (zero when none).
    #[inline]
    pub(crate) fn gpu_cpu(&self, key: BlockKey, group: usize) -> [u64; 2] {
        self.main.get(&group_key(key, group)).copied().unwrap_or_default()
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
            match self.main.entry(map_key) {
                Entry::Occupied(mut entry) => {
                    let masks = entry.get_mut();
                    let was_set = masks[at] & bit != 0;
                    masks[at] |= bit;
                    return was_set;
                }
                Entry::Vacant(entry) => {
                    let mut masks = [0; 2];
                    masks[at] = bit;
                    entry.insert(masks);
                }
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
            let Some(masks) = self.main.get_mut(&map_key) else { return false };
            let at = tier as usize;
            let was_set = masks[at] & bit != 0;
            masks[at] &= !bit;
            let emptied = (masks[0] | masks[1]) == 0;
            if emptied {
                self.main.remove(&map_key);
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
                self.main.contains_key(&map_key)
            } else {
                storage_in_use && self.storage.contains_key(&map_key)
            };
        }
        (0..self.n_groups).any(|other| {
            let map_key = group_key(key, other);
            ((other != group || in_storage) && self.main.contains_key(&map_key))
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
    fn main_entry_is_24_bytes() {
        assert_eq!(std::mem::size_of::<(u64, [u64; 2])>(), 24);
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
