//! A booking held by the request path: the router's [`Booking`] value and
//! the fleet handle it is reported through. The router is sans-IO and holds
//! no lock, so the guard lives here, in the shell: whatever ends a request
//! (its finish, an engine error, or the future being dropped because the
//! client went away) reaches the ledger exactly once. Dropped without an
//! outcome, it abandons the booking, counted as `dropped`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use kvgate_router::{Booking, Outcome};

use crate::replicas::fleet_handle::FleetHandle;

#[derive(Debug)]
pub(crate) struct HeldBooking {
    fleet: Arc<FleetHandle>,
    booking: Booking,
    done: bool,
}

impl HeldBooking {
    pub(crate) fn new(fleet: Arc<FleetHandle>, booking: Booking) -> HeldBooking {
        HeldBooking { fleet, booking, done: false }
    }

    /// The first token arrived: the prefill is done. Returns the TTFT
    /// measured from booking, the first time only.
    pub(crate) fn first_token(&self, now: Instant) -> Option<Duration> {
        self.fleet.first_token(self.booking, now)
    }

    /// The prefill is presumed done but its first token was not observed (a
    /// whole, non-streamed response).
    pub(crate) fn first_token_unmeasured(&self, now: Instant) {
        self.fleet.first_token_unmeasured(self.booking, now);
    }

    /// The request ended.
    pub(crate) fn finish(mut self, outcome: Outcome) {
        self.done = true;
        self.fleet.finish(self.booking, outcome);
    }
}

impl Drop for HeldBooking {
    fn drop(&mut self) {
        if !self.done {
            self.fleet.abandon(self.booking);
        }
    }
}

#[cfg(test)]
mod tests;
