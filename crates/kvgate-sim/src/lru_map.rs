//! A bounded map from block hash to a value that evicts its least recently
//! used entry: the CPU tier's store, block by block (`pool.rs`) or chunk by
//! chunk (`chunks.rs`).

use rustc_hash::FxHashMap;

use crate::hash::Hash32;
use crate::lru::LruList;

/// At most `capacity` entries; inserting into a full map evicts the least
/// recently used one.
#[derive(Clone, Debug)]
pub(crate) struct LruMap<V> {
    slots: Vec<Option<(Hash32, V)>>,
    map: FxHashMap<Hash32, u32>,
    lru: LruList,
    free_slots: Vec<u32>,
}

impl<V> LruMap<V> {
    pub(crate) fn new(capacity: usize) -> LruMap<V> {
        LruMap {
            slots: (0..capacity).map(|_| None).collect(),
            map: FxHashMap::default(),
            lru: LruList::new(capacity),
            free_slots: (0..capacity as u32).rev().collect(),
        }
    }

    pub(crate) fn capacity(&self) -> usize {
        self.slots.len()
    }

    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    pub(crate) fn contains(&self, key: &Hash32) -> bool {
        self.map.contains_key(key)
    }

    /// Marks `key` most recently used.
    pub(crate) fn touch(&mut self, key: &Hash32) {
        if let Some(&slot) = self.map.get(key) {
            self.lru.remove(slot);
            self.lru.push_back(slot);
        }
    }

    /// Stores `value` under `key`. Returns whether it is new, and the entry
    /// evicted to make room, if any. A key already present is only touched.
    /// A map of capacity 0 stores nothing.
    pub(crate) fn insert(&mut self, key: Hash32, value: V) -> (bool, Option<(Hash32, V)>) {
        if self.map.contains_key(&key) {
            self.touch(&key);
            return (false, None);
        }
        let mut evicted = None;
        let slot = match self.free_slots.pop() {
            Some(s) => s,
            None => {
                let Some(s) = self.lru.pop_front() else { return (false, None) };
                if let Some(old) = self.slots[s as usize].take() {
                    self.map.remove(&old.0);
                    evicted = Some(old);
                }
                s
            }
        };
        self.slots[slot as usize] = Some((key, value));
        self.map.insert(key, slot);
        self.lru.push_back(slot);
        (true, evicted)
    }

    pub(crate) fn clear(&mut self) {
        *self = LruMap::new(self.capacity());
    }

    pub(crate) fn keys(&self) -> impl Iterator<Item = &Hash32> {
        self.map.keys()
    }

    /// The keys, least recently used first.
    #[cfg(test)]
    pub(crate) fn keys_by_age(&self) -> Vec<Hash32> {
        self.lru.iter().filter_map(|s| self.slots[s as usize].as_ref().map(|(k, _)| *k)).collect()
    }

    pub(crate) fn values(&self) -> impl Iterator<Item = &V> {
        self.slots.iter().flatten().map(|(_, v)| v)
    }

    pub(crate) fn check(&self) -> Result<(), String> {
        if self.map.len() > self.slots.len() || self.map.len() != self.lru.len() {
            return Err("lru map size mismatch".into());
        }
        if self.map.len() + self.free_slots.len() != self.slots.len() {
            return Err("lru map slots leak".into());
        }
        for (k, &s) in &self.map {
            if self.slots.get(s as usize).and_then(Option::as_ref).map(|(key, _)| key) != Some(k) {
                return Err("lru map index and slots disagree".into());
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(n: u8) -> Hash32 {
        [n; 32]
    }

    #[test]
    fn the_least_recently_used_goes_first() {
        let mut c = LruMap::new(2);
        assert_eq!(c.insert(h(1), 'a'), (true, None));
        assert_eq!(c.insert(h(2), 'b'), (true, None));
        c.touch(&h(1));
        assert_eq!(c.insert(h(3), 'c'), (true, Some((h(2), 'b'))));
        assert_eq!(c.insert(h(3), 'x'), (false, None));
        assert!(c.check().is_ok());
        let mut values: Vec<char> = c.values().copied().collect();
        values.sort_unstable();
        assert_eq!(values, vec!['a', 'c']);
        c.clear();
        assert_eq!(c.len(), 0);
        let mut z = LruMap::new(0);
        assert_eq!(z.insert(h(1), ()), (false, None));
    }
}
