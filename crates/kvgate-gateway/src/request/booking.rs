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

    /// The one rule for whole (non-streamed) answers, at both doors: their
    /// first token cannot be observed, so the booking moves to decoding
    /// when the model predicted the first token (`predicted_ttft_s` after
    /// now), unless the guard is dropped first (the answer ended). No
    /// calibration sample is taken from it. The timer runs on tokio's
    /// clock, like every wait on the request path.
    pub(crate) fn presume_first_token(&self, predicted_ttft_s: f64) -> PresumedFirstToken {
        let (fleet, booking) = (Arc::clone(&self.fleet), self.booking);
        let after = Duration::from_secs_f64(predicted_ttft_s.clamp(0.0, 3600.0));
        PresumedFirstToken(tokio::spawn(async move {
            tokio::time::sleep(after).await;
            fleet.first_token_unmeasured(booking, crate::clock::now());
        }))
    }

    /// The request ended.
    pub(crate) fn finish(mut self, outcome: Outcome) {
        self.done = true;
        self.fleet.finish(self.booking, outcome);
    }
}

/// A whole answer's presumed first token, still to come; dropping it
/// (the answer ended first) cancels it.
#[derive(Debug)]
pub(crate) struct PresumedFirstToken(tokio::task::JoinHandle<()>);

impl Drop for PresumedFirstToken {
    fn drop(&mut self) {
        self.0.abort();
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
