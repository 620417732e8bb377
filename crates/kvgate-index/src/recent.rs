//! Engine hashes a replica removed a moment ago, still resolvable.
//!
//! vLLM 0.33 emits, within one step's batch, the KV-cache manager's events
//! first and the offloading connector's after them. A GPU `BlockRemoved` can
//! therefore precede the CPU store of the same block, and the CPU store in
//! placeholder mode names the block by its engine hash alone. Self-describing
//! chunk stores come "in any key order" and name their parent by engine hash,
//! which the GPU side may have evicted already. Without a memory of what was
//! just removed, both would be dropped (`unknown_placeholder`,
//! `unknown_parent`) although the engine does hold the block.
//!
//! The memory is bounded twice: at most [`RECENT_CAPACITY`] hashes per replica
//! and none older than [`RECENT_TTL`]. Connector stores complete within a few
//! engine steps of the GPU block's release, so seconds suffice; a placeholder
//! older than that is still counted as unknown.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use rustc_hash::FxHashMap;

use crate::keys::BlockKey;
use crate::stats::map_bytes;

/// Most removed hashes one replica remembers.
pub const RECENT_CAPACITY: usize = 4096;

/// How long a removed hash stays resolvable.
pub const RECENT_TTL: Duration = Duration::from_secs(10);

/// Removed engine hashes (folded to `u64`) with their keys, oldest first.
///
/// A hash removed twice keeps only its newest position: the older queue
/// entry stays behind, stale, and is recognised by its generation when it
/// reaches the front (no O(n) search on the hot path). A hash that is held
/// again needs no forgetting: the replica's own entry resolves it first.
#[derive(Clone, Debug, Default)]
pub(crate) struct RecentlyRemoved {
    /// (hash, removed at, generation), oldest first.
    order: VecDeque<(u64, Instant, u64)>,
    /// hash → (key, generation of its live queue entry).
    keys: FxHashMap<u64, (BlockKey, u64)>,
    next_generation: u64,
}

impl RecentlyRemoved {
    /// Remembers that `hash` (content `key`) left the replica at `now`.
    pub(crate) fn remember(&mut self, hash: u64, key: BlockKey, now: Instant) {
        self.expire(now);
        while self.order.len() >= RECENT_CAPACITY {
            self.pop_oldest();
        }
        let generation = self.next_generation;
        self.next_generation += 1;
        self.keys.insert(hash, (key, generation));
        self.order.push_back((hash, now, generation));
    }

    /// The key of `hash` if it was removed within the TTL. The entry stays:
    /// several tiers may resolve the same removed hash.
    pub(crate) fn get(&mut self, hash: u64, now: Instant) -> Option<BlockKey> {
        self.expire(now);
        self.keys.get(&hash).map(|(key, _)| *key)
    }

    /// Heap bytes held (queue plus map, by capacity).
    pub(crate) fn bytes_used(&self) -> u64 {
        let queue = self.order.capacity() * std::mem::size_of::<(u64, Instant, u64)>();
        queue as u64 + map_bytes(&self.keys)
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.keys.len()
    }

    fn expire(&mut self, now: Instant) {
        while let Some(&(_, at, _)) = self.order.front() {
            if now.saturating_duration_since(at) <= RECENT_TTL {
                break;
            }
            self.pop_oldest();
        }
    }

    fn pop_oldest(&mut self) {
        if let Some((hash, _, generation)) = self.order.pop_front() {
            if self.keys.get(&hash).is_some_and(|(_, live)| *live == generation) {
                self.keys.remove(&hash);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_removed_hash_resolves_until_its_ttl() {
        let mut recent = RecentlyRemoved::default();
        let t0 = Instant::now();
        recent.remember(7, BlockKey(70), t0);
        assert_eq!(recent.get(7, t0 + RECENT_TTL), Some(BlockKey(70)));
        assert_eq!(recent.get(8, t0), None);
        let late = t0 + RECENT_TTL + Duration::from_millis(1);
        assert_eq!(recent.get(7, late), None);
        assert_eq!(recent.len(), 0);
    }

    #[test]
    fn the_oldest_go_first_when_full() {
        let mut recent = RecentlyRemoved::default();
        let now = Instant::now();
        for h in 0..RECENT_CAPACITY as u64 + 10 {
            recent.remember(h, BlockKey(h), now);
        }
        assert_eq!(recent.len(), RECENT_CAPACITY);
        assert_eq!(recent.get(9, now), None);
        assert_eq!(recent.get(10, now), Some(BlockKey(10)));
    }

    #[test]
    fn removing_again_refreshes_one_entry() {
        let mut recent = RecentlyRemoved::default();
        let t0 = Instant::now();
        recent.remember(1, BlockKey(1), t0);
        recent.remember(1, BlockKey(2), t0 + Duration::from_secs(8));
        // The first removal's queue entry expires without taking the second.
        assert_eq!(recent.get(1, t0 + Duration::from_secs(15)), Some(BlockKey(2)));
        assert_eq!(recent.len(), 1);
        assert_eq!(recent.get(1, t0 + Duration::from_secs(19)), None);
    }
}
