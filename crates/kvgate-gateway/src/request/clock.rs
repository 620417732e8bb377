//! The request path's clock: tokio's, read as a `std` instant. In a running
//! gateway it is `Instant::now()`. Under a paused test clock, decisions,
//! bookings, first tokens, failures and the relay's stall timer all follow
//! virtual time with it, so a test drives the request path through a
//! sequence of instants it chooses (`relay/tests.rs`,
//! `forward/replay_tests.rs`). Read from `std`, the relay's check after its
//! stall sleep fired saw a deadline not yet reached, re-armed the sleep for
//! that deadline (already past on the paused clock) and spun until real
//! time caught up.

use std::time::Instant;

/// Now, on tokio's clock.
pub(crate) fn now() -> Instant {
    tokio::time::Instant::now().into_std()
}
