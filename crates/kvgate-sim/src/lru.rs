//! An intrusive doubly linked LRU list over slot indices `0..n`, the shape of
//! vLLM's `FreeKVCacheBlockQueue` (`vllm/v1/core/kv_cache_utils.py`): O(1)
//! append at the tail, pop from the head (the eviction candidate) and removal
//! from the middle (a prefix hit "touches" a free cached block).

const NIL: u32 = u32::MAX;

/// LRU order of slots; the head is the least recently used.
#[derive(Clone, Debug)]
pub(crate) struct LruList {
    prev: Vec<u32>,
    next: Vec<u32>,
    linked: Vec<bool>,
    head: u32,
    tail: u32,
    len: usize,
}

impl LruList {
    /// An empty list able to hold slots `0..capacity`.
    pub(crate) fn new(capacity: usize) -> LruList {
        LruList {
            prev: vec![NIL; capacity],
            next: vec![NIL; capacity],
            linked: vec![false; capacity],
            head: NIL,
            tail: NIL,
            len: 0,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn contains(&self, slot: u32) -> bool {
        self.linked.get(slot as usize).copied().unwrap_or(false)
    }

    /// Appends `slot` as the most recently used; no-op if already linked or
    /// out of range.
    pub(crate) fn push_back(&mut self, slot: u32) {
        let i = slot as usize;
        if i >= self.linked.len() || self.linked[i] {
            return;
        }
        self.linked[i] = true;
        self.prev[i] = self.tail;
        self.next[i] = NIL;
        if self.tail == NIL {
            self.head = slot;
        } else {
            self.next[self.tail as usize] = slot;
        }
        self.tail = slot;
        self.len += 1;
    }

    /// Inserts `slot` at the head, to be taken first; no-op if already
    /// linked or out of range.
    pub(crate) fn push_front(&mut self, slot: u32) {
        let i = slot as usize;
        if i >= self.linked.len() || self.linked[i] {
            return;
        }
        self.linked[i] = true;
        self.prev[i] = NIL;
        self.next[i] = self.head;
        if self.head == NIL {
            self.tail = slot;
        } else {
            self.prev[self.head as usize] = slot;
        }
        self.head = slot;
        self.len += 1;
    }

    /// Removes and returns the least recently used slot.
    pub(crate) fn pop_front(&mut self) -> Option<u32> {
        if self.head == NIL {
            return None;
        }
        let slot = self.head;
        self.remove(slot);
        Some(slot)
    }

    /// Unlinks `slot`; returns whether it was linked.
    pub(crate) fn remove(&mut self, slot: u32) -> bool {
        if !self.contains(slot) {
            return false;
        }
        let i = slot as usize;
        let (p, n) = (self.prev[i], self.next[i]);
        if p == NIL {
            self.head = n;
        } else {
            self.next[p as usize] = n;
        }
        if n == NIL {
            self.tail = p;
        } else {
            self.prev[n as usize] = p;
        }
        self.prev[i] = NIL;
        self.next[i] = NIL;
        self.linked[i] = false;
        self.len -= 1;
        true
    }

    /// Slots from least to most recently used (tests and invariant checks).
    pub(crate) fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        let mut cur = self.head;
        std::iter::from_fn(move || {
            if cur == NIL {
                return None;
            }
            let s = cur;
            cur = self.next[s as usize];
            Some(s)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn order_and_removal() {
        let mut l = LruList::new(4);
        for s in [2, 0, 3] {
            l.push_back(s);
        }
        l.push_back(2); // already linked
        assert_eq!(l.iter().collect::<Vec<_>>(), vec![2, 0, 3]);
        assert!(l.remove(0));
        assert!(!l.remove(0));
        assert!(!l.remove(99));
        assert_eq!(l.pop_front(), Some(2));
        assert_eq!(l.pop_front(), Some(3));
        assert_eq!(l.pop_front(), None);
        assert_eq!(l.len(), 0);
    }
}
