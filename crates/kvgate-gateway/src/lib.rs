//! `kvgate-gateway`: `kvgate serve`, the OpenAI-compatible ingress. It
//! tokenizes once (as the engine would), routes on live KV state through
//! `kvgate-router`, hands the tokens to the engine and streams the answer
//! straight back.
//!
//! Code map, by folder (each folder's `mod.rs` lists its files):
//! - `request/`: one request's path: `prepare.rs` (parse, check, tokenize,
//!   block keys), `placement.rs` and `admission.rs` (the fleet's decision,
//!   the queue of requests waiting for a replica), `forward.rs`,
//!   `forwarder.rs` and `pd_forward.rs` (send, retry before the first byte,
//!   P/D's two hops), `relay.rs` (the answer streamed back), and what they
//!   share: `booking.rs`, `engine_client.rs` (the seam to the engines),
//!   `request_error.rs` and `response.rs` (one error type, answered in one
//!   place), `route.rs`, `trace_context.rs`, the Responses API's
//!   `affinity.rs`, `conversation.rs`, `stored_responses.rs`, and LoRA's
//!   `adapter_load.rs`.
//! - `replicas/`: `registry.rs` (add, drain, remove), `feed.rs` (KV events),
//!   `monitor.rs` and `scrape.rs` (probes, `/metrics`), `discovery.rs` (DNS),
//!   `supervise.rs`, `directory.rs` and `replica.rs` (lock-free reads),
//!   `fleet_handle.rs` (the one lock over the `kvgate-fleet` core), `fleet_view.rs`, `upkeep.rs` (the
//!   fleet's clock), `pool.rs` (model pools).
//! - `config/`: [`GatewayConfig`] (`mod.rs`), one file per section, and
//!   `settings.rs`: it validated into typed sections, every duration
//!   converted there.
//! - `doors/`: every way in: `server.rs` ([`Gateway`]: listeners, routes,
//!   shutdown), `api.rs`, `admin.rs`, `dashboard.rs`, `epp.rs`, the peers'
//!   load sharing (`peers.rs` over HTTP, `peer_bus.rs` over NATS,
//!   `peer_wire.rs` their batches, `peer_state.rs`), and what guards them: `auth.rs`, `throttle.rs`,
//!   `shed.rs`, `tls.rs`.
//! - `observe/`: `metrics.rs` (Prometheus), `snapshot.rs`, `ttft_ring.rs`,
//!   `decision_json.rs`.
//! - `state.rs`: the wiring's state (`Shared`) and the narrow context each
//!   part gets from it; `error.rs`: `ConfigError`, `StartError`; `locks.rs`:
//!   poison-tolerant lock helpers.

mod clock;
pub mod config;
mod doors;
mod error;
mod locks;
mod observe;
mod replicas;
mod request;
mod state;

pub use config::{GatewayConfig, Passthrough, ReplicaConfig};
pub use doors::server::Gateway;
pub use error::{ConfigError, StartError};
pub use observe::snapshot::{
    FleetSnapshot, PeerBusSnapshot, PeerSnapshot, PeerTargetSnapshot, PoolSnapshot,
    ReplicaSnapshot, TenantSnapshot,
};
pub use request::trace_context::{
    count_dropped_spans, set_root_sampler, RootSampler, TRACED as TRACED_TARGET,
    UNTRACED as UNTRACED_TARGET,
};
