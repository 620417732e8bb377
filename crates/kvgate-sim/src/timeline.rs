//! What happens next in virtual time: the event loops that drive simulated
//! engines (fast-mode replay's fleet, the fleet core's scenario tests)
//! deliver a step's outputs through it, at the step's end or later. Items
//! come out in time order and, at equal times, in the order they were
//! scheduled, so a run is deterministic.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::Duration;

use rustc_hash::FxHashMap;

/// Items scheduled at points of virtual time.
#[derive(Debug)]
pub struct Timeline<T> {
    order: BinaryHeap<Reverse<(Duration, u64)>>,
    items: FxHashMap<u64, T>,
    next_seq: u64,
}

impl<T> Default for Timeline<T> {
    fn default() -> Self {
        Timeline { order: BinaryHeap::new(), items: FxHashMap::default(), next_seq: 0 }
    }
}

impl<T> Timeline<T> {
    /// `item` happens at `at`, after anything already scheduled at `at`.
    pub fn schedule(&mut self, at: Duration, item: T) {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.order.push(Reverse((at, seq)));
        self.items.insert(seq, item);
    }

    /// When the next item happens.
    pub fn next_at(&self) -> Option<Duration> {
        self.order.peek().map(|Reverse((at, _))| *at)
    }

    /// The next item and its time.
    pub fn pop(&mut self) -> Option<(Duration, T)> {
        let Reverse((at, seq)) = self.order.pop()?;
        self.items.remove(&seq).map(|item| (at, item))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_time_order_then_in_scheduling_order() {
        let ms = Duration::from_millis;
        let mut t = Timeline::default();
        t.schedule(ms(5), "c");
        t.schedule(ms(1), "a");
        t.schedule(ms(5), "d");
        t.schedule(ms(1), "b");
        assert_eq!(t.next_at(), Some(ms(1)));
        let order: Vec<_> = std::iter::from_fn(|| t.pop()).collect();
        assert_eq!(order, [(ms(1), "a"), (ms(1), "b"), (ms(5), "c"), (ms(5), "d")]);
        assert_eq!(t.next_at(), None);
    }
}
