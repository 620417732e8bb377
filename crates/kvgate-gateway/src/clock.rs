//! The gateway's clock: tokio's, read as a `std` instant. In a running
//! gateway it is `Instant::now()`. Every instant the gateway hands the fleet
//! core (decisions, bookings, first tokens, failures, events, scrapes,
//! ticks, peers' bookings) and the relay's stall timer come from here, so
//! under a paused test clock they all follow virtual time, and a test
//! drives the gateway through a sequence of instants it chooses
//! (`request/relay/tests.rs`, `request/forward/replay_tests.rs`). Read from
//! `std`, the relay's check after its stall sleep fired saw a deadline not
//! yet reached, re-armed the sleep for that deadline (already past on the
//! paused clock) and spun until real time caught up. Wall durations that
//! only measure work (tokenizing, a decision) stay on `std`; the shell's
//! own waits (a task's backoff, the adapter refresh) use tokio's `Instant`.

use std::time::Instant;

/// Now, on tokio's clock.
pub(crate) fn now() -> Instant {
    tokio::time::Instant::now().into_std()
}
