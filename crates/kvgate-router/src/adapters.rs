//! LoRA adapters as the router sees them: which are resident in each
//! replica's GPU adapter slots.
//!
//! vLLM keeps at most `--max-loras` adapters in GPU slots (least recently
//! used out) and schedules at most that many distinct adapters per batch: a
//! request whose adapter is not resident waits for its weights to load, and
//! one whose adapter would be one too many in the batch waits for a slot.
//! The engine does not export its slots, so the router keeps its own LRU of
//! the adapters it routed to each replica, refreshed by what the engine
//! reports running and waiting (`vllm:lora_requests_info`, through
//! [`Router::report_adapters`](crate::Router::report_adapters)). Which
//! adapters have requests in flight comes from the ledger (exact, unlike the
//! LRU guess).
//!
//! Names are interned to small ids. The table is bounded
//! ([`MAX_ADAPTERS`]): an adapter beyond it is routed as if it were the base
//! model (no slot cost) and counted, never an error.

use std::sync::Arc;

use kvgate_index::ReplicaId;
use rustc_hash::FxHashMap;

/// Distinct adapter names the router tracks.
pub(crate) const MAX_ADAPTERS: usize = 4096;

/// An interned adapter name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct AdapterId(pub(crate) u32);

/// One replica's slots as believed: `(adapter, last use)`, at most `max`.
#[derive(Clone, Debug, Default)]
struct Slots {
    /// The engine's `max_loras`; 0 until known (no slot model then).
    max: u32,
    resident: Vec<(AdapterId, u64)>,
}

/// Adapter names and every replica's believed slots.
#[derive(Debug, Default)]
pub(crate) struct AdapterTable {
    ids: FxHashMap<Arc<str>, AdapterId>,
    replicas: Vec<Slots>,
    /// Use counter for the LRU order (no clock in a sans-IO crate).
    tick: u64,
    /// Names not interned because the table was full.
    pub(crate) overflow: u64,
}

impl AdapterTable {
    /// The id of `name`, interning it; `None` when the table is full.
    pub(crate) fn intern(&mut self, name: &str) -> Option<AdapterId> {
        if let Some(&id) = self.ids.get(name) {
            return Some(id);
        }
        if self.ids.len() >= MAX_ADAPTERS {
            self.overflow += 1;
            return None;
        }
        let id = AdapterId(self.ids.len() as u32);
        self.ids.insert(Arc::from(name), id);
        Some(id)
    }

    /// The id of `name` if it was interned (no insertion).
    pub(crate) fn id(&self, name: &str) -> Option<AdapterId> {
        self.ids.get(name).copied()
    }

    fn slots_mut(&mut self, replica: ReplicaId) -> &mut Slots {
        let i = replica.index();
        if self.replicas.len() <= i {
            self.replicas.resize_with(i + 1, Slots::default);
        }
        &mut self.replicas[i]
    }

    /// The replica's `max_loras` (0: unknown).
    pub(crate) fn max_loras(&self, replica: ReplicaId) -> u32 {
        self.replicas.get(replica.index()).map_or(0, |s| s.max)
    }

    /// Whether `adapter` is believed resident on `replica`.
    pub(crate) fn resident(&self, replica: ReplicaId, adapter: AdapterId) -> bool {
        self.replicas
            .get(replica.index())
            .is_some_and(|s| s.resident.iter().any(|&(a, _)| a == adapter))
    }

    /// A request for `adapter` was routed to `replica` (or the engine
    /// reported it running or waiting there): it is now the most recently
    /// used, evicting the least recently used beyond `max`. Returns whether
    /// it was not resident (a load the engine has to do).
    pub(crate) fn touch(&mut self, replica: ReplicaId, adapter: AdapterId) -> bool {
        self.tick += 1;
        let tick = self.tick;
        let s = self.slots_mut(replica);
        if let Some(e) = s.resident.iter_mut().find(|(a, _)| *a == adapter) {
            e.1 = tick;
            return false;
        }
        if s.max > 0 && s.resident.len() >= s.max as usize {
            if let Some(lru) = (0..s.resident.len()).min_by_key(|&i| s.resident[i].1) {
                s.resident.swap_remove(lru);
            }
        }
        s.resident.push((adapter, tick));
        true
    }

    /// What the engine reported: its slot count, and the adapters it runs
    /// and queues (resident, or about to be).
    pub(crate) fn observe(&mut self, replica: ReplicaId, max_loras: u32, names: &[&str]) {
        let max = max_loras;
        let s = self.slots_mut(replica);
        s.max = max;
        if max > 0 && s.resident.len() > max as usize {
            s.resident.sort_unstable_by_key(|&(_, t)| std::cmp::Reverse(t));
            s.resident.truncate(max as usize);
        }
        for name in names {
            if let Some(id) = self.intern(name) {
                self.touch(replica, id);
            }
        }
    }

    /// Forgets a replica's slots.
    pub(crate) fn remove_replica(&mut self, replica: ReplicaId) {
        if let Some(s) = self.replicas.get_mut(replica.index()) {
            *s = Slots::default();
        }
    }

    /// Adapters believed resident on `replica`.
    #[cfg(test)]
    pub(crate) fn resident_count(&self, replica: ReplicaId) -> usize {
        self.replicas.get(replica.index()).map_or(0, |s| s.resident.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(i: u32) -> ReplicaId {
        ReplicaId(i)
    }

    #[test]
    fn slots_evict_the_least_recently_used() {
        let mut t = AdapterTable::default();
        t.observe(r(0), 2, &[]);
        let [a, b, c] = ["a", "b", "c"].map(|n| t.intern(n).unwrap());
        assert!(t.touch(r(0), a), "first use loads");
        assert!(t.touch(r(0), b));
        assert!(!t.touch(r(0), a), "resident: no load");
        assert!(t.touch(r(0), c), "evicts b, the least recently used");
        assert!(t.resident(r(0), a) && t.resident(r(0), c) && !t.resident(r(0), b));
        assert_eq!(t.resident_count(r(0)), 2);
        assert!(!t.resident(r(1), a), "per replica");
    }

    #[test]
    fn reports_refresh_and_shrink_the_slots() {
        let mut t = AdapterTable::default();
        let [a, b, c] = ["a", "b", "c"].map(|n| t.intern(n).unwrap());
        t.observe(r(0), 3, &[]);
        for x in [a, b, c] {
            t.touch(r(0), x);
        }
        // The engine runs `a` (most recent now) and has only 2 slots.
        t.observe(r(0), 2, &["a"]);
        assert_eq!(t.max_loras(r(0)), 2);
        assert!(t.resident(r(0), a) && t.resident(r(0), c) && !t.resident(r(0), b));
        t.remove_replica(r(0));
        assert_eq!((t.max_loras(r(0)), t.resident_count(r(0))), (0, 0));
    }

    #[test]
    fn the_table_is_bounded() {
        let mut t = AdapterTable::default();
        for i in 0..MAX_ADAPTERS {
            assert!(t.intern(&format!("a{i}")).is_some());
        }
        assert!(t.intern("one-too-many").is_none());
        assert!(t.intern("a7").is_some(), "known names still resolve");
        assert_eq!(t.overflow, 1);
    }
}
