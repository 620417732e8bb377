//! `kvgate-index`: a sans-IO, content-hashed index of which KV-cache blocks
//! each vLLM replica holds, per residency tier (GPU, CPU, storage).
//!
//! The router feeds it the replicas' KV events ([`Index::apply`]) and asks it,
//! for a prompt's block keys ([`block_keys`]), how long a prefix each replica
//! already holds ([`Index::find_matches`]). It does no I/O and reads no clock:
//! time comes in as `now`, so tests and the simulator drive it directly.
//!
//! Code map:
//! - `keys.rs`: [`BlockKey`] and [`chain_key`], our own chained content hash,
//!   shared by the query side and event application.
//! - `replica.rs`: [`ReplicaSpec`] and a replica's own map from engine hash to
//!   our key, tiers and insertion order; `replica_id.rs`: [`ReplicaId`].
//! - `dense.rs`: `DenseMap`, entries packed in a vector behind a table of
//!   positions: the map of a replica's engine hashes and of the holders,
//!   paid once per (block, replica).
//! - `holders.rs`: the global map from key to replica bitsets per tier.
//! - `index.rs`: [`Index`] and replica management.
//! - `apply.rs`: applying events, with every anomaly counted.
//! - `capacity.rs`: the per-tier memory bound and bulk eviction.
//! - `recent.rs`: engine hashes removed a moment ago, so that a connector
//!   store that names one (placeholder or parent) still resolves.
//! - `query.rs`: [`PrefixMatch`] and the bitset prefix scan.
//! - `stats.rs`: [`ApplyOutcome`], [`Anomalies`], [`IndexStats`].
//!
//! Architecture invariants:
//! - A holder bit (key, replica, tier) is set exactly when that replica has at
//!   least one engine hash mapped to that key with that tier.
//! - Stores whose parent is unknown are dropped whole, so stores never create
//!   a block without its ancestors (the index stays prefix-closed).
//! - No replica holds more than its capacity plus slack blocks in any tier.
//! - Nothing here depends on tokio, directly or not.

mod apply;
mod capacity;
mod dense;
mod error;
mod holders;
mod index;
mod keys;
mod query;
mod recent;
mod replica;
mod replica_id;
mod stats;
#[cfg(test)]
mod testutil;

pub use capacity::{capacity_slack, DEFAULT_CAPACITY_BLOCKS};
pub use error::IndexError;
pub use index::{Index, SpentTable};
pub use keys::{
    block_keys, block_keys_with_extra, chain_key, extend_block_keys, request_block_keys, BlockKey,
    ROOT_KEY,
};
pub use kvgate_events::Tier;
pub use query::PrefixMatch;
pub use recent::{RECENT_CAPACITY, RECENT_TTL};
pub use replica::ReplicaSpec;
pub use replica_id::ReplicaId;
pub use stats::{Anomalies, ApplyOutcome, IndexStats, ReplicaStats};
