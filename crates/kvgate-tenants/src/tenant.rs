//! One tenant's state on this instance: its settings, its waiting requests
//! per band (first come, first served within the tenant), its token window
//! and its counters.
//!
//! A request that leaves a tenant's queue from the middle (cancelled) is
//! not searched for: its id stays behind as a dead entry that the next pop
//! skips, and `live` counts the rest, so leaving is O(1). Dead entries are
//! dropped when the queue empties or outnumber the live ones.

use std::collections::VecDeque;

use crate::config::TenantConfig;
use crate::counters::TenantCounters;
use crate::ids::{BandId, RequestId};
use crate::limits::TokenWindow;

/// One tenant's waiting requests in one band, oldest first.
#[derive(Clone, Debug, Default)]
pub(crate) struct Fifo {
    ids: VecDeque<RequestId>,
    live: usize,
}

impl Fifo {
    /// Whether no live request waits.
    pub(crate) fn is_empty(&self) -> bool {
        self.live == 0
    }

    pub(crate) fn push(&mut self, id: RequestId) {
        self.ids.push_back(id);
        self.live += 1;
    }

    /// The oldest live request, dropping dead entries in front of it.
    pub(crate) fn front(&mut self, is_live: impl Fn(RequestId) -> bool) -> Option<RequestId> {
        while let Some(&id) = self.ids.front() {
            if is_live(id) {
                return Some(id);
            }
            self.ids.pop_front();
        }
        None
    }

    /// Takes the front entry, which `front` just returned.
    pub(crate) fn pop_front(&mut self) {
        self.ids.pop_front();
        self.live -= 1;
        if self.live == 0 {
            self.ids.clear();
        }
    }

    /// A live request left from anywhere in the queue; its entry is dead
    /// from now on (`is_live` must already say so).
    pub(crate) fn leave(&mut self, is_live: impl Fn(RequestId) -> bool) {
        self.live -= 1;
        if self.live == 0 {
            self.ids.clear();
        } else if self.ids.len() > 2 * self.live + 16 {
            self.ids.retain(|&id| is_live(id));
        }
    }

    /// Entries held, dead ones included (for tests of the bound).
    #[cfg(test)]
    pub(crate) fn entries(&self) -> usize {
        self.ids.len()
    }
}

/// One tenant.
#[derive(Clone, Debug)]
pub(crate) struct Tenant {
    pub(crate) name: String,
    pub(crate) weight: f64,
    /// The highest band its requests may use, and their band by default.
    pub(crate) band: BandId,
    pub(crate) max_in_flight: Option<u32>,
    pub(crate) tokens_per_minute: Option<u64>,
    /// This instance's tokens of the last minute (used only with a rate).
    pub(crate) window: TokenWindow,
    /// The peers' tokens of the last minute, from their shards.
    pub(crate) peer_tokens: u64,
    /// Waiting requests, one queue per band.
    pub(crate) fifos: Vec<Fifo>,
    pub(crate) counters: TenantCounters,
}

impl Tenant {
    pub(crate) fn new(name: String, config: &TenantConfig, band: BandId, n_bands: usize) -> Self {
        Self {
            name,
            weight: config.weight,
            band,
            max_in_flight: config.max_in_flight,
            tokens_per_minute: config.tokens_per_minute,
            window: TokenWindow::default(),
            peer_tokens: 0,
            fifos: vec![Fifo::default(); n_bands],
            counters: TenantCounters::default(),
        }
    }

    /// Requests admitted and not finished: what `max_in_flight` limits.
    pub(crate) fn admitted_unfinished(&self) -> u64 {
        self.counters.queue_depth + self.counters.in_flight
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dead_entries_are_skipped_and_bounded() {
        let mut fifo = Fifo::default();
        for i in 0..100 {
            fifo.push(RequestId(i));
        }
        // Cancel every id but 0 and 99, from the middle.
        let live = |id: RequestId| id.0 == 0 || id.0 == 99;
        for _ in 1..99 {
            fifo.leave(live);
        }
        assert!(fifo.entries() <= 2 * 2 + 16);
        assert_eq!(fifo.front(live), Some(RequestId(0)));
        fifo.pop_front();
        assert_eq!(fifo.front(|id| id.0 == 99), Some(RequestId(99)));
        fifo.pop_front();
        assert!(fifo.is_empty());
        assert_eq!(fifo.entries(), 0);
    }
}
