//! Sequence-number bookkeeping for one publisher, sans-IO.
//!
//! vLLM numbers batches 0, 1, 2, ... per publisher process. From the numbers
//! alone the subscriber must tell apart: the next batch (apply it), a batch
//! it already has (a duplicate, expected right after a replay, since the live
//! stream and the replay overlap; delivery is at-least-once), a gap (replay
//! it, or reset), and a publisher restart (seq went backwards outside the
//! replay overlap: the engine's cache is new, so the view must be reset).

/// What to do with a live batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The expected batch (or the first one seen): apply it.
    Deliver,
    /// Already applied through a replay; drop it.
    Duplicate,
    /// Batches `from..to` were missed; this batch is `to`.
    Gap {
        /// First missing seq.
        from: u64,
        /// The seq just received.
        to: u64,
    },
    /// The seq went backwards: the publisher restarted.
    Restarted {
        /// The seq we expected next.
        expected: u64,
        /// The seq received.
        got: u64,
    },
}

/// Tracks the next expected seq of one publisher.
#[derive(Clone, Debug, Default)]
pub struct SeqTracker {
    next: Option<u64>,
    /// Set after a replay from this seq: live batches in `overlap_from..next`
    /// are duplicates until the live stream catches up.
    overlap_from: Option<u64>,
}

impl SeqTracker {
    /// A tracker that has seen nothing.
    pub fn new() -> Self {
        Self::default()
    }

    /// The next seq expected, if any batch was applied.
    pub fn next_expected(&self) -> Option<u64> {
        self.next
    }

    /// Classifies a batch from the live stream without changing state.
    pub fn classify(&self, seq: u64) -> Verdict {
        let Some(next) = self.next else { return Verdict::Deliver };
        if seq == next {
            Verdict::Deliver
        } else if seq > next {
            Verdict::Gap { from: next, to: seq }
        } else if self.overlap_from.is_some_and(|from| seq >= from) {
            Verdict::Duplicate
        } else {
            Verdict::Restarted { expected: next, got: seq }
        }
    }

    /// Records that batch `seq` was applied. Leaving the replay overlap
    /// happens on the first live batch past it.
    pub fn applied(&mut self, seq: u64, live: bool) {
        self.next = Some(seq.saturating_add(1));
        if live {
            self.overlap_from = None;
        }
    }

    /// Sets the next expected seq without a batch: after a replay from 0
    /// found the publisher's buffer empty, its first batch will be seq 0,
    /// and anything later means batches were missed.
    pub fn expect(&mut self, next: u64) {
        self.next = Some(next);
    }

    /// Records that a replay starting at `from` is about to be applied.
    pub fn replay_started(&mut self, from: u64) {
        self.overlap_from = Some(self.overlap_from.map_or(from, |f| f.min(from)));
    }

    /// Forgets everything: the next batch is taken as the first.
    pub fn reset(&mut self) {
        *self = Self::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_order_gap_and_restart() {
        let mut t = SeqTracker::new();
        assert_eq!(t.classify(5), Verdict::Deliver);
        t.applied(5, true);
        assert_eq!(t.classify(6), Verdict::Deliver);
        t.applied(6, true);
        assert_eq!(t.classify(9), Verdict::Gap { from: 7, to: 9 });
        assert_eq!(t.classify(0), Verdict::Restarted { expected: 7, got: 0 });
    }

    #[test]
    fn overlap_after_replay_is_duplicate_until_caught_up() {
        let mut t = SeqTracker::new();
        t.replay_started(0);
        for s in 0..10 {
            t.applied(s, false);
        }
        // Live messages queued during the replay.
        assert_eq!(t.classify(8), Verdict::Duplicate);
        assert_eq!(t.classify(10), Verdict::Deliver);
        t.applied(10, true);
        // Past the overlap, going backwards means a restart.
        assert_eq!(t.classify(3), Verdict::Restarted { expected: 11, got: 3 });
    }

    #[test]
    fn an_empty_buffer_means_the_first_batch_is_seq_zero() {
        let mut t = SeqTracker::new();
        t.expect(0);
        assert_eq!(t.classify(2), Verdict::Gap { from: 0, to: 2 });
        assert_eq!(t.classify(0), Verdict::Deliver);
    }

    #[test]
    fn reset_forgets() {
        let mut t = SeqTracker::new();
        t.applied(100, true);
        t.reset();
        assert_eq!(t.next_expected(), None);
        assert_eq!(t.classify(0), Verdict::Deliver);
    }
}
