//! `kvgate-gateway`: `kvgate serve`, the OpenAI-compatible ingress. It
//! tokenizes once (as the engine would), routes on live KV state through
//! `kvgate-router`, hands the tokens to the engine and streams the answer
//! straight back.
//!
//! Code map:
//! - `config.rs`: [`GatewayConfig`], the one source of `serve` settings;
//!   `settings.rs`: it validated into typed sections.
//! - `server.rs`: [`Gateway`]: listeners (hyper, with header limits), routes,
//!   auth middleware, graceful shutdown.
//! - `api.rs`: generation entry points, models, tokenize, health, ready, metrics.
//! - `prepare.rs`: parse, check, tokenize, block keys, passthrough bodies.
//! - `pool.rs`, `pool_config.rs`: model pools (a request's `model` picks one;
//!   each has its tokenizer, admission queue and router) and `[[pools]]`.
//! - `forward.rs`: decide, send, retry before the first byte, whole responses;
//!   `admission.rs`: the first-come queue of requests waiting for a replica.
//! - `relay.rs`: SSE streaming with first-token detection and error tails.
//! - `engine_client.rs`: the seam to the engines (reqwest in production,
//!   `engine_fake.rs` in unit tests).
//! - `fleet.rs`, `replica_status.rs`: the sans-IO fleet core (index, router,
//!   replica status, health rules, `tick`); `fleet_handle.rs`: its one lock.
//! - `feed.rs`: one KV-event subscriber per replica into the fleet.
//! - `monitor.rs`, `scrape.rs`: health probes and `/metrics` scraping.
//! - `directory.rs`, `replica.rs`: the replica directory (lock-free reads)
//!   and one replica's shell side.
//! - `registry.rs`: adding, draining and removing replicas; `supervise.rs`:
//!   their tasks restarted (and the replica made safe) when one ends.
//! - `admin.rs`: `/admin/replicas`, `/admin/decisions`.
//! - `dashboard.rs`, `dashboard/`: `/dashboard`, its live stream and login.
//! - `auth.rs`: constant-time keys, forwarded-header allow-list.
//! - `peers.rs`, `peer_state.rs`: load sharing between instances (protocol
//!   and tasks; what is known about each peer).
//! - `throttle.rs`: the wrong-key throttle.
//! - `route.rs`: the two generation routes; `response.rs`: errors as HTTP
//!   answers, in one place.
//! - `state.rs`: the wiring's state (`Shared`), and the narrow context each
//!   component gets from it; `fleet_view.rs`, `snapshot.rs`, `metrics.rs`,
//!   `ttft_ring.rs`: what the snapshot reads, the snapshot, Prometheus
//!   exposition, recent TTFTs.
//! - `locks.rs`: poison-tolerant lock helpers; `upkeep.rs`: the router's
//!   the fleet's clock (`Fleet::tick` at its next deadline).

mod adapter_load;
mod admin;
mod admission;
mod affinity;
mod api;
mod auth;
mod booking;
mod cluster_config;
pub mod config;
mod conversation;
mod dashboard;
mod decision_json;
mod directory;
mod disagg_config;
mod discovery;
mod engine_client;
#[cfg(test)]
mod engine_fake;
mod epp;
mod epp_config;
mod error;
mod feed;
mod fleet;
mod fleet_handle;
mod fleet_view;
mod forward;
mod forwarder;
mod locks;
mod metrics;
mod model_config;
mod monitor;
mod pd_forward;
mod peer_state;
mod peers;
mod placement;
mod pool;
mod pool_config;
mod prepare;
mod registry;
mod relay;
mod replica;
mod replica_config;
mod replica_status;
mod request_error;
mod response;
mod route;
mod scrape;
mod server;
mod settings;
mod shed;
mod snapshot;
mod state;
mod stored_responses;
mod supervise;
mod throttle;
mod tls;
mod tls_config;
mod trace_context;
mod ttft_ring;
mod upkeep;

pub use config::{GatewayConfig, Passthrough, ReplicaConfig};
pub use error::{ConfigError, StartError};
pub use server::Gateway;
pub use snapshot::{
    FleetSnapshot, PeerSnapshot, PeerTargetSnapshot, PoolSnapshot, ReplicaSnapshot,
};
pub use trace_context::{
    count_dropped_spans, set_root_sampler, RootSampler, TRACED as TRACED_TARGET,
    UNTRACED as UNTRACED_TARGET,
};
