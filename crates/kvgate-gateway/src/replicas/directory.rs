//! The replica directory: who the replicas are and how to reach them (URLs,
//! keys, passthrough mode, event counters). The request path reads it on
//! every request, lock-free, from an immutable snapshot ([`ArcSwap`]);
//! adding or removing a replica publishes a new snapshot. It holds no fleet
//! state: health, load and cached blocks live in the fleet core.

use std::sync::Arc;

use arc_swap::ArcSwap;
use kvgate_index::ReplicaId;

use crate::replicas::replica::Replica;

#[derive(Debug, Default)]
pub(crate) struct Directory {
    replicas: ArcSwap<Vec<Arc<Replica>>>,
}

impl Directory {
    /// Every replica now (a snapshot: later changes do not show in it).
    pub(crate) fn all(&self) -> Arc<Vec<Arc<Replica>>> {
        self.replicas.load_full()
    }

    pub(crate) fn get(&self, id: ReplicaId) -> Option<Arc<Replica>> {
        self.replicas.load().iter().find(|r| r.id == id).cloned()
    }

    /// By display name or base URL.
    pub(crate) fn by_name(&self, name: &str) -> Option<Arc<Replica>> {
        self.replicas.load().iter().find(|r| r.name == name || r.base == name).cloned()
    }

    /// Whether some replica matches `same`.
    pub(crate) fn any(&self, same: impl Fn(&Replica) -> bool) -> bool {
        self.replicas.load().iter().any(|r| same(r))
    }

    pub(crate) fn add(&self, replica: Arc<Replica>) {
        self.replicas.rcu(|list| {
            let mut list = Vec::clone(list);
            list.push(Arc::clone(&replica));
            list
        });
    }

    pub(crate) fn remove(&self, id: ReplicaId) {
        self.replicas.rcu(|list| list.iter().filter(|r| r.id != id).cloned().collect::<Vec<_>>());
    }
}
