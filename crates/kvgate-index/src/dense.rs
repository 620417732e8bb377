//! [`DenseMap`]: a hash map whose entries lie packed in one vector, found
//! through a table of 4-byte positions.
//!
//! The index's two big maps (per replica, engine hash → entry; globally,
//! block key → holders) pay once per (block, replica) pair, so their load
//! factor is the index's memory. A hashbrown map keeps its entries in its
//! power-of-two bucket array, between 7/16 and 7/8 full, so a 20-byte entry
//! costs 24 to 48 bytes. Here only the position table (hashbrown's
//! [`HashTable`], 5 bytes a bucket with its control byte) has that load
//! factor; the entries themselves sit in a vector that grows by an eighth at
//! a time, so a 20-byte entry costs 20 to 22.5 bytes plus 5.7 to 11.4 bytes
//! of positions.
//!
//! Removal moves the last entry into the hole (`swap_remove`) and repoints
//! its position, so entries stay packed and every operation is O(1).
//! Entries carry their own key ([`Keyed`]); keys are 64-bit hashes already,
//! mixed once more with Fx so that small test keys spread too.

use std::hash::BuildHasher;

use hashbrown::hash_table::{Entry, HashTable};
use rustc_hash::FxBuildHasher;

/// An entry of a [`DenseMap`], which knows its own key.
pub(crate) trait Keyed: Copy {
    fn map_key(&self) -> u64;
}

/// A map from `u64` keys to packed entries; see the module docs.
#[derive(Clone, Debug)]
pub(crate) struct DenseMap<T> {
    entries: Vec<T>,
    positions: HashTable<u32>,
    /// The capacity of the position table's bucket count when it holds no
    /// tombstones (7/8 of the buckets): the highest `capacity()` seen.
    full: usize,
}

impl<T> Default for DenseMap<T> {
    fn default() -> DenseMap<T> {
        DenseMap { entries: Vec::new(), positions: HashTable::new(), full: 0 }
    }
}

/// Position tables smaller than this are left to hashbrown's own policy.
const REBUILD_MIN: usize = 64;

#[inline]
fn hash(key: u64) -> u64 {
    FxBuildHasher.hash_one(key)
}

impl<T: Keyed> DenseMap<T> {
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// The entries, in no particular order.
    pub(crate) fn iter(&self) -> std::slice::Iter<'_, T> {
        self.entries.iter()
    }

    /// The entries, mutable in place (their keys must not change).
    pub(crate) fn iter_mut(&mut self) -> std::slice::IterMut<'_, T> {
        self.entries.iter_mut()
    }

    /// The entries, without the position table (for a clear that only
    /// walks them).
    pub(crate) fn into_entries(self) -> Vec<T> {
        self.entries
    }

    #[inline]
    fn position(&self, key: u64) -> Option<usize> {
        let entries = &self.entries;
        self.positions
            .find(hash(key), |&at| entries.get(at as usize).is_some_and(|e| e.map_key() == key))
            .map(|&at| at as usize)
    }

    #[inline]
    pub(crate) fn get(&self, key: u64) -> Option<&T> {
        self.position(key).and_then(|at| self.entries.get(at))
    }

    #[inline]
    pub(crate) fn get_mut(&mut self, key: u64) -> Option<&mut T> {
        self.position(key).and_then(|at| self.entries.get_mut(at))
    }

    #[inline]
    pub(crate) fn contains(&self, key: u64) -> bool {
        self.position(key).is_some()
    }

    /// The entry of `entry.key()`, inserting `entry` if there is none; the
    /// flag says whether it was inserted.
    #[inline]
    pub(crate) fn get_or_insert(&mut self, entry: T) -> (&mut T, bool) {
        let key = entry.map_key();
        self.make_room();
        let entries = &mut self.entries;
        let (at, inserted) = match self.positions.entry(
            hash(key),
            |&at| entries.get(at as usize).is_some_and(|e| e.map_key() == key),
            |&at| entries.get(at as usize).map_or(0, |e| hash(e.map_key())),
        ) {
            Entry::Occupied(occupied) => (*occupied.get() as usize, false),
            Entry::Vacant(vacant) => {
                if entries.len() == entries.capacity() {
                    // An eighth more at a time (`reserve` would double).
                    entries.reserve_exact((entries.len() / 8).max(16));
                }
                vacant.insert(entries.len() as u32);
                entries.push(entry);
                (entries.len() - 1, true)
            }
        };
        // Positions always point into the entries.
        (&mut self.entries[at], inserted)
    }

    /// Keeps churn from doubling the position table.
    ///
    /// A removal in a crowded part of a hashbrown table leaves a tombstone,
    /// which uses up the table's growth budget like an entry. When the
    /// budget is gone, hashbrown rehashes in place if at most half the
    /// capacity is in use and doubles the table otherwise, so a table
    /// between 7/16 and 7/8 full under steady churn (a cache that stores as
    /// much as it evicts) ends up twice as large as it needs, for good.
    /// Here, when the budget is gone, there are tombstones, and at most 3/4
    /// of the capacity is in use, the positions are rebuilt at the same size
    /// from the entries instead: O(n), once per at least n/3 insertions.
    #[inline]
    fn make_room(&mut self) {
        let capacity = self.positions.capacity();
        self.full = self.full.max(capacity);
        let used = self.positions.len();
        if used < capacity
            || used == self.full
            || self.full < REBUILD_MIN
            || used + 1 > self.full / 4 * 3
        {
            return;
        }
        let entries = &self.entries;
        let hasher = |&at: &u32| entries.get(at as usize).map_or(0, |e| hash(e.map_key()));
        let mut positions = HashTable::with_capacity(self.full);
        for (at, e) in entries.iter().enumerate() {
            positions.insert_unique(hash(e.map_key()), at as u32, hasher);
        }
        self.positions = positions;
    }

    /// Removes and returns the entry of `key`.
    pub(crate) fn remove(&mut self, key: u64) -> Option<T> {
        let entries = &self.entries;
        let found = self
            .positions
            .find_entry(hash(key), |&at| {
                entries.get(at as usize).is_some_and(|e| e.map_key() == key)
            })
            .ok()?;
        let (at, _) = found.remove();
        let at = at as usize;
        let last = self.entries.len().checked_sub(1)?;
        let removed = self.entries.swap_remove(at);
        if at != last {
            // The last entry moved into the hole: repoint its position.
            if let Some(moved) = self.entries.get(at).map(Keyed::map_key) {
                if let Some(position) =
                    self.positions.find_mut(hash(moved), |&p| p as usize == last)
                {
                    *position = at as u32;
                }
            }
        }
        Some(removed)
    }

    /// Heap bytes: the entries' vector and the position table, by capacity.
    pub(crate) fn bytes_used(&self) -> u64 {
        let entries = self.entries.capacity() * std::mem::size_of::<T>();
        (entries as u64) + table_bytes(self.positions.capacity(), std::mem::size_of::<u32>())
    }
}

/// Heap bytes of a hashbrown table with `capacity` and `entry`-byte
/// buckets: buckets are the next power of two above capacity × 8/7, each
/// with the entry and one control byte, plus one group of trailing control
/// bytes.
pub(crate) fn table_bytes(capacity: usize, entry: usize) -> u64 {
    if capacity == 0 {
        return 0;
    }
    let buckets = if capacity < 8 {
        (capacity + 1).next_power_of_two()
    } else {
        (capacity * 8 / 7).next_power_of_two()
    };
    (buckets * (entry + 1) + 16) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    struct Pair(u64, u32);

    impl Keyed for Pair {
        fn map_key(&self) -> u64 {
            self.0
        }
    }

    #[test]
    fn insert_find_and_remove_keep_entries_packed() {
        let mut map: DenseMap<Pair> = DenseMap::default();
        for k in 0..1000u64 {
            let (entry, inserted) = map.get_or_insert(Pair(k, k as u32));
            assert!(inserted);
            assert_eq!(*entry, Pair(k, k as u32));
        }
        let (entry, inserted) = map.get_or_insert(Pair(5, 99));
        assert!(!inserted);
        entry.1 += 1;
        assert_eq!(map.get(5), Some(&Pair(5, 6)));
        // Remove every third key, from the front so that the last entries
        // keep moving into holes.
        for k in (0..1000u64).step_by(3) {
            assert_eq!(map.remove(k).map(|p| p.0), Some(k));
            assert_eq!(map.remove(k), None);
        }
        for k in 0..1000u64 {
            assert_eq!(map.contains(k), k % 3 != 0, "{k}");
            if let Some(p) = map.get_mut(k) {
                assert_eq!(p.0, k);
            }
        }
        assert_eq!(map.len(), 666);
        assert_eq!(map.iter().count(), 666);
        while let Some(k) = map.iter().next().map(|p| p.0) {
            assert!(map.remove(k).is_some());
        }
        assert_eq!(map.len(), 0);
        assert!(map.bytes_used() > 0);
    }

    #[test]
    fn entries_grow_by_an_eighth() {
        let mut map: DenseMap<Pair> = DenseMap::default();
        for k in 0..100_000u64 {
            map.get_or_insert(Pair(k.wrapping_mul(0x9e37_79b9_7f4a_7c15), 0));
        }
        assert!(map.entries.capacity() <= 100_000 + 100_000 / 8 + 16);
    }

    #[test]
    fn churn_keeps_the_position_table_size() {
        let mut map: DenseMap<Pair> = DenseMap::default();
        let key = |k: u64| k.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ (k >> 7);
        // 40,000 entries: 65,536 buckets, 61% full, within the 3/4 bound.
        for k in 0..40_000u64 {
            map.get_or_insert(Pair(key(k), 0));
        }
        let before = map.bytes_used();
        for k in 40_000..1_000_000u64 {
            assert!(map.remove(key(k - 40_000)).is_some());
            map.get_or_insert(Pair(key(k), 0));
        }
        assert_eq!(map.bytes_used(), before);
        assert_eq!(map.len(), 40_000);
        assert!((960_000..1_000_000u64).all(|k| map.contains(key(k))));
        assert!(!map.contains(key(959_999)));
    }

    #[test]
    fn table_bytes_follow_the_bucket_count() {
        assert_eq!(table_bytes(0, 4), 0);
        // 1000 entries need 2048 buckets of 16 + 1 bytes.
        assert_eq!(table_bytes(1000, 16), 2048 * 17 + 16);
    }
}
