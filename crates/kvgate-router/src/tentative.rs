//! Tentative blocks: a routed prompt's blocks count as cached on the chosen
//! replica until the engine's events confirm them or a TTL expires them.
//!
//! Without this, a burst of requests sharing a prefix scatters: each one is
//! decided before the first one's BlockStored events arrive, so every replica
//! looks equally cold. The chosen replica will compute those blocks before it
//! serves anything queued behind, so later requests may count them as hits.
//!
//! Entries are inserted only when absent (a refresh would let hot prefixes
//! grow the expiry queue without bound), and the total is capped.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use kvgate_index::{BlockKey, Index, ReplicaId};
use rustc_hash::FxHashMap;

/// Counts of what happened to tentative blocks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TentativeStats {
    /// Blocks added.
    pub added: u64,
    /// Expired after events confirmed them (the index holds them).
    pub confirmed: u64,
    /// Expired with no event confirming them.
    pub expired_unconfirmed: u64,
    /// Not added because the cap was reached.
    pub overflow: u64,
    /// Live now.
    pub live: u64,
}

/// Totals of several routers (a gateway with several model pools).
impl std::ops::AddAssign for TentativeStats {
    fn add_assign(&mut self, o: TentativeStats) {
        let TentativeStats { added, confirmed, expired_unconfirmed, overflow, live } = o;
        self.added += added;
        self.confirmed += confirmed;
        self.expired_unconfirmed += expired_unconfirmed;
        self.overflow += overflow;
        self.live += live;
    }
}

#[derive(Debug)]
pub(crate) struct Tentative {
    per_replica: Vec<FxHashMap<BlockKey, Instant>>,
    queue: VecDeque<(Instant, ReplicaId, BlockKey)>,
    ttl: Duration,
    max_total: usize,
    total: usize,
    stats: TentativeStats,
}

impl Tentative {
    pub(crate) fn new(ttl: Duration, max_total: usize) -> Tentative {
        Tentative {
            per_replica: Vec::new(),
            queue: VecDeque::new(),
            ttl,
            max_total,
            total: 0,
            stats: TentativeStats::default(),
        }
    }

    pub(crate) fn stats(&self) -> TentativeStats {
        TentativeStats { live: self.total as u64, ..self.stats }
    }

    /// Tentative blocks of `replica` continuing the prefix at `keys[from..]`.
    pub(crate) fn extension(&self, replica: ReplicaId, keys: &[BlockKey], from: usize) -> u32 {
        let Some(map) = self.per_replica.get(replica.index()) else { return 0 };
        if map.is_empty() {
            return 0;
        }
        keys.get(from..).unwrap_or(&[]).iter().take_while(|k| map.contains_key(k)).count() as u32
    }

    /// Marks `keys` as soon-to-be cached on `replica`.
    pub(crate) fn add(&mut self, replica: ReplicaId, keys: &[BlockKey], now: Instant) {
        if self.per_replica.len() <= replica.index() {
            self.per_replica.resize_with(replica.index() + 1, FxHashMap::default);
        }
        let expiry = now + self.ttl;
        let map = &mut self.per_replica[replica.index()];
        for key in keys {
            if self.total >= self.max_total {
                self.stats.overflow += 1;
                continue;
            }
            if let std::collections::hash_map::Entry::Vacant(v) = map.entry(*key) {
                v.insert(expiry);
                self.queue.push_back((expiry, replica, *key));
                self.total += 1;
                self.stats.added += 1;
            }
        }
    }

    /// Drops entries whose TTL passed; with the index at hand, counts those
    /// the engine confirmed.
    pub(crate) fn expire(&mut self, now: Instant, index: Option<&Index>) {
        while let Some(&(expiry, replica, key)) = self.queue.front() {
            if expiry > now {
                break;
            }
            self.queue.pop_front();
            let Some(map) = self.per_replica.get_mut(replica.index()) else { continue };
            if map.get(&key) == Some(&expiry) {
                map.remove(&key);
                self.total -= 1;
                if index.is_some_and(|ix| ix.fastest_tier(key, replica).is_some()) {
                    self.stats.confirmed += 1;
                } else {
                    self.stats.expired_unconfirmed += 1;
                }
            }
        }
    }

    /// Forgets a replica's tentative blocks (reset, degraded, removed).
    pub(crate) fn clear_replica(&mut self, replica: ReplicaId) {
        if let Some(map) = self.per_replica.get_mut(replica.index()) {
            self.total -= map.len();
            map.clear();
        }
    }
}
