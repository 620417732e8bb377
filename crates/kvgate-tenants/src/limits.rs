//! Per-tenant limits: requests in flight and tokens per minute.
//!
//! In flight counts a tenant's requests that are admitted and not finished
//! (waiting in the queue or at an engine) on this instance.
//!
//! Tokens per minute is a sliding window of twelve 5-second slots. A request
//! reserves its own token count (prompt plus the output it may produce) in
//! the current slot at admission; at the end the engine's actual usage
//! settles it: a shortfall is refunded to the slot it was reserved in (if
//! that slot is still in the window), an excess is charged to the current
//! slot. A request that never reached an engine (expired, cancelled) refunds
//! all of it. The window's total is what other instances read (`shards.rs`),
//! so the limit holds across the instances that share counters.
//!
//! A request larger than the whole limit is admitted when the window is
//! empty, so a limit below a tenant's largest request slows it rather than
//! locking it out.

use std::time::{Duration, Instant};

/// Slots in the window.
const SLOTS: usize = 12;
/// One slot's length.
const SLOT: Duration = Duration::from_secs(5);
/// The window's length: the "minute" of tokens per minute.
pub(crate) const WINDOW: Duration = Duration::from_secs(60);

/// Slot numbers: whole slots since the queue's base instant.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SlotClock {
    base: Instant,
}

impl SlotClock {
    pub(crate) fn new(base: Instant) -> Self {
        Self { base }
    }

    /// The slot `now` falls in (instants before the base fall in slot 0).
    pub(crate) fn slot(&self, now: Instant) -> u64 {
        let since = now.saturating_duration_since(self.base);
        (since.as_nanos() / SLOT.as_nanos()) as u64
    }

    /// How long from `now` until slot `slot` has left the window.
    fn until_gone(&self, slot: u64, now: Instant) -> Duration {
        let slots = u32::try_from(slot + SLOTS as u64).unwrap_or(u32::MAX);
        match self.base.checked_add(SLOT.saturating_mul(slots)) {
            Some(gone_at) => gone_at.saturating_duration_since(now),
            None => WINDOW,
        }
    }
}

/// Tokens reserved by one request, and the slot they went into.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Reservation {
    pub(crate) slot: u64,
    pub(crate) tokens: u64,
}

/// One tenant's tokens of the last minute on this instance.
#[derive(Clone, Debug, Default)]
pub(crate) struct TokenWindow {
    tokens: [u64; SLOTS],
    slot_of: [u64; SLOTS],
}

impl TokenWindow {
    fn live(&self, i: usize, now_slot: u64) -> bool {
        self.slot_of[i] <= now_slot && self.slot_of[i] + SLOTS as u64 > now_slot
    }

    /// Tokens in the window at `now_slot`.
    pub(crate) fn used(&self, now_slot: u64) -> u64 {
        (0..SLOTS).filter(|&i| self.live(i, now_slot)).map(|i| self.tokens[i]).sum()
    }

    /// Adds tokens to the current slot.
    pub(crate) fn add(&mut self, now_slot: u64, tokens: u64) {
        let i = (now_slot % SLOTS as u64) as usize;
        if self.slot_of[i] != now_slot {
            self.slot_of[i] = now_slot;
            self.tokens[i] = 0;
        }
        self.tokens[i] = self.tokens[i].saturating_add(tokens);
    }

    /// Takes tokens back from the slot they were reserved in, if it is
    /// still in the window.
    pub(crate) fn refund(&mut self, slot: u64, now_slot: u64, tokens: u64) {
        let i = (slot % SLOTS as u64) as usize;
        if self.slot_of[i] == slot && self.live(i, now_slot) {
            self.tokens[i] = self.tokens[i].saturating_sub(tokens);
        }
    }

    /// Settles a reservation against the tokens actually used.
    pub(crate) fn settle(&mut self, reserved: Reservation, actual: u64, now_slot: u64) {
        if actual < reserved.tokens {
            self.refund(reserved.slot, now_slot, reserved.tokens - actual);
        } else {
            self.add(now_slot, actual - reserved.tokens);
        }
    }

    /// Whether `tokens` more fit under `limit`, given what peers use; if
    /// not, how long until enough of this instance's slots have left the
    /// window (the whole window when only peers' usage stands in the way).
    pub(crate) fn admit(
        &self,
        clock: &SlotClock,
        now: Instant,
        limit: u64,
        peer_tokens: u64,
        tokens: u64,
    ) -> Result<(), Refused> {
        let now_slot = clock.slot(now);
        let used = self.used(now_slot).saturating_add(peer_tokens);
        if used == 0 || used.saturating_add(tokens) <= limit {
            return Ok(());
        }
        // Oldest slot first; slots out of the window sort last and hold 0.
        let mut live = [(u64::MAX, 0u64); SLOTS];
        for (i, entry) in live.iter_mut().enumerate() {
            if self.live(i, now_slot) {
                *entry = (self.slot_of[i], self.tokens[i]);
            }
        }
        live.sort_unstable();
        let mut left = used;
        let mut retry_after = WINDOW;
        for (slot, slot_tokens) in live {
            left -= slot_tokens;
            if left == 0 || left.saturating_add(tokens) <= limit {
                retry_after = clock.until_gone(slot, now);
                break;
            }
        }
        Err(Refused { used, retry_after })
    }
}

/// A token-rate refusal: the fleet's usage and when to retry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Refused {
    pub(crate) used: u64,
    pub(crate) retry_after: Duration,
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn the_window_forgets_after_a_minute() {
        let base = Instant::now();
        let clock = SlotClock::new(base);
        let mut w = TokenWindow::default();
        w.add(clock.slot(base), 100);
        w.add(clock.slot(base + Duration::from_secs(30)), 50);
        assert_eq!(w.used(clock.slot(base + Duration::from_secs(59))), 150);
        assert_eq!(w.used(clock.slot(base + Duration::from_secs(60))), 50);
        assert_eq!(w.used(clock.slot(base + Duration::from_secs(90))), 0);
    }

    #[test]
    fn refusal_says_when_enough_tokens_leave() {
        let base = Instant::now();
        let clock = SlotClock::new(base);
        let mut w = TokenWindow::default();
        w.add(0, 600);
        w.add(clock.slot(base + Duration::from_secs(20)), 300);
        let now = base + Duration::from_secs(22);
        assert!(w.admit(&clock, now, 1_000, 0, 100).is_ok());
        let refused = w.admit(&clock, now, 1_000, 0, 200).unwrap_err();
        assert_eq!(refused.used, 900);
        // The first slot (600 tokens) leaves at 60 s.
        assert_eq!(refused.retry_after, Duration::from_secs(38));
        // Peers' usage alone in the way: the whole window.
        let refused = w.admit(&clock, now, 1_000, 5_000, 1).unwrap_err();
        assert_eq!(refused.retry_after, WINDOW);
    }

    #[test]
    fn a_request_above_the_limit_passes_an_empty_window() {
        let clock = SlotClock::new(Instant::now());
        let w = TokenWindow::default();
        assert!(w.admit(&clock, Instant::now(), 10, 0, 1_000).is_ok());
    }

    #[test]
    fn settle_refunds_the_reserved_slot_and_charges_excess_now() {
        let mut w = TokenWindow::default();
        w.add(3, 500);
        w.settle(Reservation { slot: 3, tokens: 500 }, 200, 5);
        assert_eq!(w.used(5), 200);
        w.add(5, 100);
        w.settle(Reservation { slot: 5, tokens: 100 }, 150, 6);
        assert_eq!(w.used(6), 350);
        // A reservation whose slot left the window refunds nothing.
        w.settle(Reservation { slot: 3, tokens: 200 }, 0, 20);
        assert_eq!(w.used(20), 0);
    }
}
