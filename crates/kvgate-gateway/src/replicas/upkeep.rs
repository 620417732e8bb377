//! The fleet's clock: a driver task that calls [`Fleet::tick`] at the
//! fleet's next deadline (a purge due, a degraded window ending), and at
//! least every [`PERIOD`] for the router's expiries (stale bookings and
//! unconfirmed tentative blocks), whether or not requests come. Without it,
//! expired state stayed in the metrics, the admin API and the dashboard until
//! the next request. It also finishes, in steps, any replica clear begun
//! outside a feed task (a purge, a feed restart).
//!
//! [`Fleet::tick`]: kvgate_fleet::Fleet::tick

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::replicas::fleet_handle::FleetHandle;

/// The longest the driver sleeps. Bookings and tentative blocks live for
/// seconds (`router.tentative_ttl_ms`, the ledger's expiry), so a quarter
/// second keeps what is shown within that of the truth; a sweep of the
/// ledger is microseconds.
pub(crate) const PERIOD: Duration = Duration::from_millis(250);

/// Runs until `stop` turns true.
pub(crate) async fn run(fleet: Arc<FleetHandle>, mut stop: watch::Receiver<bool>) {
    loop {
        let now = crate::clock::now();
        let wake = fleet.with(|f| f.next_deadline()).map_or(now + PERIOD, |d| d.min(now + PERIOD));
        tokio::select! {
            _ = tokio::time::sleep_until(wake.max(now).into()) => {}
            _ = stop.wait_for(|v| *v) => return,
        }
        let clearing = fleet.with(|f| {
            f.tick(crate::clock::now());
            f.clearing()
        });
        // Clears begun outside a feed task are finished here, in steps. A
        // replica whose feed runs finishes its own (feed.rs); doing it here
        // too is harmless, as each step takes what is left.
        for id in clearing {
            crate::replicas::feed::finish_clear(&fleet, id).await;
        }
    }
}
