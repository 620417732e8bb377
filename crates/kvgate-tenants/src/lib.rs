//! `kvgate-tenants`: who is served next when the fleet is full. Requests
//! wait in strict priority bands; within a band, tenants take turns by the
//! Virtual Token Counter (VTC, Sheng et al., OSDI 2024), so a tenant that
//! floods the fleet gets its share and no more; within a tenant, first come
//! first served. Per-tenant limits (requests in flight, tokens per minute)
//! and per-band limits (queue length, queue TTL) answer what cannot wait.
//!
//! Sans-IO, as `kvgate-router`: no sockets, no clock, no tokio, no locks;
//! time is a `now: Instant` argument and the caller serialises access, so
//! the gateway's admission path and virtual-time replays drive the same
//! code.
//!
//! Code map, from the top floor down (a file uses only those below it):
//! - `queue.rs`: [`AdmissionQueue`]: enqueue, dispatch, cancel, expire,
//!   output and finish; the shard export and merge.
//! - `tenant.rs`: one tenant's state: settings, per-band FIFOs, counters.
//! - `vtc.rs`: the counters, the lift, the per-band backlogged sets.
//! - `limits.rs`: the tokens-per-minute window: reserve, settle, refund.
//! - `shards.rs`: [`ShardSnapshot`]: one instance's counters for its peers,
//!   and the sums over peers.
//! - `counters.rs`: [`TenantCounters`]: every outcome, per tenant.
//! - `rejection.rs`: [`Rejection`]: why a request was answered unserved.
//! - `config.rs`: [`TenantsConfig`], its defaults and validation.
//! - `ids.rs`, `error.rs`: [`TenantId`], [`BandId`], [`RequestId`];
//!   [`ConfigError`], [`PriorityError`].
//!
//! Invariants:
//! - Every request offered is rejected, or admitted and then dispatched,
//!   expired or cancelled; every dispatched one finishes. The per-tenant
//!   counts close ([`TenantCounters::balanced`]) after every call.
//! - Dispatch is work-conserving: if any band's head would be accepted by
//!   the caller's predicate, something is dispatched; with peers, unless a
//!   tenant waiting on a peer is far behind the pick (`defer_to_peers`,
//!   counted), so that the peer takes the capacity.
//! - Every operation is O(log n) in the number of backlogged tenants
//!   (amortised over dead queue entries).

mod config;
mod counters;
mod error;
mod ids;
mod limits;
mod queue;
mod rejection;
mod shards;
mod tenant;
mod vtc;

pub use config::{BandConfig, TenantConfig, TenantsConfig, MAX_BANDS};
pub use counters::{RejectCounts, TenantCounters};
pub use error::{ConfigError, PriorityError};
pub use ids::{BandId, RequestId, TenantId};
pub use queue::{
    AdmissionQueue, Admit, Band, Cancelled, Expired, Finished, QueuedRequest, Ticket, Usage,
};
pub use rejection::{RejectReason, Rejection};
pub use shards::{ShardSnapshot, TenantShard};
