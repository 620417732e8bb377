//! A point-in-time view of the fleet and kvgate's own state, built on demand
//! for `/metrics`, `/admin/replicas` and the dashboard. Building it takes the
//! locks briefly; rendering it takes none.

use kvgate_router::{LedgerTotals, TentativeStats};
use serde::Serialize;

/// One replica.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ReplicaSnapshot {
    /// The model pool it serves.
    pub pool: String,
    /// Display name.
    pub name: String,
    /// Base URL.
    pub url: String,
    /// `healthy`, `degraded` or `down` (the router's view).
    pub health: &'static str,
    /// Why it is degraded or down, if it is.
    pub reason: Option<String>,
    /// Draining: no new requests.
    pub draining: bool,
    /// Problems found in its configuration or behaviour (block-size
    /// mismatch, no event stream, …), reported loudly.
    pub problems: Vec<String>,
    /// Configured block size.
    pub block_size: u32,
    /// Index blocks held per tier (GPU, CPU, storage).
    pub index_blocks: [u64; 3],
    /// KV capacity per tier as reported by the engine (0 unknown).
    pub capacity_blocks: [u64; 3],
    /// Events the index refused or repaired for this replica, by kind
    /// (`malformed`, `over_capacity_evictions`, `unknown_parent`, …).
    pub index_anomalies: std::collections::BTreeMap<&'static str, u64>,
    /// Event batches applied.
    pub event_batches: u64,
    /// Events in them.
    pub events: u64,
    /// Gaps detected.
    pub event_gaps: u64,
    /// Batches recovered through replay.
    pub event_replayed_batches: u64,
    /// View resets.
    pub event_resets: u64,
    /// Undecodable payloads.
    pub event_decode_errors: u64,
    /// SUB reconnects.
    pub event_reconnects: u64,
    /// Live messages on another topic than the configured one, dropped.
    pub event_wrong_topic: u64,
    /// Whether any event arrived yet.
    pub events_seen: bool,
    /// The first event sync (initial replay) is done.
    pub view_synced: bool,
    /// It reached back to the engine's first batch: nothing the engine
    /// stored before kvgate started is unknown.
    pub view_complete: bool,
    /// Ledger: pending prefill tokens.
    pub pending_prefill_tokens: u64,
    /// Ledger: requests in prefill.
    pub prefill_requests: u32,
    /// Ledger: requests decoding.
    pub decoding_requests: u32,
    /// Ledger requests minus engine requests at the last report.
    pub ledger_drift: i64,
    /// Calibrated prefill speed, tokens/s.
    pub prefill_tokens_per_s: f64,
    /// Calibrated fixed overhead, seconds.
    pub overhead_s: f64,
    /// Calibration samples.
    pub calibration_samples: u64,
    /// Where the calibration comes from: `prior`, `ttft` or `engine`.
    pub calibration_source: &'static str,
    /// The engine's measured decode step, seconds (mean inter-token
    /// latency), once measured.
    pub decode_step_s: Option<f64>,
    /// Engine-reported running requests (last scrape).
    pub engine_running: Option<u32>,
    /// Engine-reported waiting requests.
    pub engine_waiting: Option<u32>,
    /// Engine-reported KV usage, 0–1.
    pub engine_kv_usage: Option<f64>,
    /// Engine-reported prefix-cache queries (tokens, lifetime).
    pub engine_prefix_queries: Option<u64>,
    /// Engine-reported prefix-cache hits (tokens, lifetime).
    pub engine_prefix_hits: Option<u64>,
    /// Requests routed here by this ingress.
    pub routed: u64,
}

/// The whole fleet plus kvgate's counters.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct FleetSnapshot {
    /// Replicas in registration order.
    pub replicas: Vec<ReplicaSnapshot>,
    /// Index memory estimate, bytes.
    pub index_bytes: u64,
    /// Distinct block keys in the index.
    pub index_distinct_keys: u64,
    /// Ledger lifetime counters.
    #[serde(skip)]
    pub ledger: LedgerTotals,
    /// Bookings in flight.
    pub in_flight: u64,
    /// Requests waiting for a replica to stop being busy (first-come queue).
    pub admission_waiting: u64,
    /// Decisions routed / asked to wait / rejected.
    pub decisions: [u64; 3],
    /// Tentative-block counters.
    #[serde(skip)]
    pub tentative: TentativeStats,
    /// This process's CPU time, seconds (user + system).
    pub cpu_seconds: f64,
    /// Resident memory of this process, bytes (0 where it cannot be read).
    pub rss_bytes: u64,
    /// Seconds since start.
    pub uptime_s: f64,
    /// Peer instances heard from.
    pub peers: Vec<PeerSnapshot>,
    /// Peer instances sent to.
    pub peer_targets: Vec<PeerTargetSnapshot>,
    /// Local ledger changes dropped before peers got them (outbox full).
    pub peer_outbox_dropped: u64,
    /// Peers forgotten after going silent.
    pub peers_forgotten: u64,
    /// The NATS connection peers share over, when configured.
    pub peer_bus: Option<PeerBusSnapshot>,
    /// Per model pool.
    pub pools: Vec<PoolSnapshot>,
}

/// One model pool's routing.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct PoolSnapshot {
    /// Its name.
    pub name: String,
    /// The model it serves.
    pub model: String,
    /// Its bookings in flight.
    pub in_flight: u64,
    /// Its requests waiting for a replica.
    pub admission_waiting: u64,
    /// Its decisions routed / asked to wait / rejected.
    pub decisions: [u64; 3],
    /// Requests routed where the router did not believe their LoRA adapter
    /// resident in a GPU slot (a load the engine does).
    pub adapter_loads: u64,
    /// Runtime adapter loads through the engines' API: done, failed.
    pub adapter_runtime_loads: [u64; 2],
    /// Prompt tokens routed, and those predicted cached where they went.
    pub prompt_tokens: [u64; 2],
    /// Routed requests by the reason the winner won, in
    /// `kvgate_router::Reason::LABELS` order.
    pub routed_by_reason: Vec<u64>,
    /// A disaggregated pool's KV transfer time per token, seconds, as
    /// calibrated from its decode replicas' NIXL metrics (the configured
    /// bandwidth until they report); `None` for other pools.
    pub transfer_s_per_token: Option<f64>,
    /// Its tenants (`[tenants]`), by name; empty without.
    pub tenants: Vec<TenantSnapshot>,
}

/// One tenant of a pool's tenant queue, since start.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct TenantSnapshot {
    /// Its name.
    pub tenant: String,
    /// Requests offered to the queue.
    pub arrived: u64,
    /// Requests waiting now.
    pub queue_depth: u64,
    /// Dispatched and not finished now.
    pub in_flight: u64,
    /// Taken from the queue to an engine.
    pub dispatched: u64,
    /// Dispatched requests that ended.
    pub finished: u64,
    /// Left the queue because the client went away (or the router refused).
    pub cancelled: u64,
    /// Refused, by reason, in `kvgate_tenants::RejectReason::ALL` order:
    /// queue full, in-flight limit, token rate (429), expired in the queue
    /// (503).
    pub rejected: [u64; 4],
    /// Prompt tokens served (settled with the engine's count).
    pub input_tokens: u64,
    /// Output tokens served.
    pub output_tokens: u64,
}

/// A peer kvgate instance this one hears from.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct PeerSnapshot {
    /// Its instance id (random per process start).
    pub instance: String,
    /// Ledger changes received from it.
    pub changes_received: u64,
    /// Of those, bookings for a replica this instance does not know.
    pub unknown_replica: u64,
    /// Age of its last batch when it arrived (wall clocks), seconds.
    pub lag_s: f64,
    /// Since its last batch, seconds.
    pub silent_s: f64,
}

/// The NATS connection that carries peers' changes.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct PeerBusSnapshot {
    /// Connected to a server now.
    pub connected: bool,
    /// Connections lost since start.
    pub disconnects: u64,
    /// Messages on the subject that were not a batch (dropped).
    pub undecodable: u64,
}

/// A peer endpoint this instance sends to.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct PeerTargetSnapshot {
    /// Its URL.
    pub url: String,
    /// Batches it accepted.
    pub batches_sent: u64,
    /// Batches that failed (unreachable, refused).
    pub failures: u64,
    /// Batches dropped because its queue was full.
    pub dropped: u64,
}
