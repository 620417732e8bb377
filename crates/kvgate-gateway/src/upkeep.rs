//! The router's upkeep on a timer. `Router::maintain` (expiring stale
//! bookings and unconfirmed tentative blocks) used to run only inside a
//! decision, so when traffic stopped, expired state stayed in the metrics,
//! the admin API and the dashboard until the next request. This task runs it
//! every [`PERIOD`] whether or not requests come. It also finishes, in steps,
//! any replica clear begun outside a feed task.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::locks::{lock, read};
use crate::state::Shared;

/// How often upkeep runs. Bookings and tentative blocks live for seconds
/// (`router.tentative_ttl_ms`, the ledger's expiry), so a quarter second
/// keeps what is shown within that of the truth; a sweep of the ledger is
/// microseconds.
pub(crate) const PERIOD: Duration = Duration::from_millis(250);

/// Runs until `stop` turns true.
pub(crate) async fn run(shared: Arc<Shared>, mut stop: watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(PERIOD);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.wait_for(|v| *v) => return,
        }
        {
            // Lock order: index, then router (state.rs).
            let index = read(&shared.index);
            lock(&shared.router).maintain(Instant::now(), Some(&index));
        }
        // Clears begun outside a feed task (a purge of a replica long down,
        // a feed restart) are finished here, in steps.
        let replicas: Vec<_> = read(&shared.replicas).iter().map(Arc::clone).collect();
        for replica in replicas {
            if read(&shared.index).clearing(replica.id) {
                crate::feed::finish_clear(&shared, &replica).await;
            }
        }
    }
}
