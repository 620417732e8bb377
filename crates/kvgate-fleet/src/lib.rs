//! `kvgate-fleet`: the fleet core, sans-IO (quinn-proto's style). It owns
//! the KV index, one router per model pool (and a pool's prefill side),
//! every replica's status, and the health rules, and changes them only
//! through its methods, each given the `now` it acts at. It holds no locks,
//! reads no clock and does no IO: `kvgate serve` and `kvgate epp` drive it
//! from their shell (`kvgate-gateway`'s `fleet_handle.rs` owns the one lock;
//! its tasks bring probes, events and requests in, and its upkeep task
//! calls [`Fleet::tick`] by [`Fleet::next_deadline`]).
//!
//! Code map:
//! - `fleet.rs`: [`Fleet`]: replicas in and out, routing per pool, the P/D
//!   plan, bookings' first tokens and ends, peers' changes, events, probes
//!   and failures, the timer protocol, readiness (`fleet/tests.rs`).
//! - `replica_status.rs`: one replica's status and its transitions.
//! - `rules.rs`: [`HealthRules`].
//! - `engine_scrape.rs`: what one scrape of an engine's `/metrics` says.
//! - `role.rs`: a replica's [`Role`] in a disaggregated pool.

mod engine_scrape;
mod fleet;
mod replica_status;
mod role;
mod rules;

pub use engine_scrape::{EngineScrape, LoraScrape, TransferTotals};
pub use fleet::{Fleet, PoolId, Reachable, Readiness};
pub use replica_status::{Failure, ReplicaStatus};
pub use role::Role;
pub use rules::HealthRules;
