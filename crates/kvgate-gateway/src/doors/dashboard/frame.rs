//! One dashboard frame: what the page shows at an instant, as the JSON the
//! stream sends. Replicas carry the same fields as `/admin/replicas` (one
//! vocabulary for both), plus their rates; the fleet part is the rates,
//! hit rates and TTFT percentiles over the window; decisions are
//! `/admin/decisions` entries. Built from values, so tests can make frames
//! from made-up samples.

use serde::Serialize;
use serde_json::Value;

use std::collections::BTreeMap;

use super::window::{Rates, ReplicaRates};
use crate::observe::snapshot::{FleetSnapshot, PoolSnapshot, ReplicaSnapshot};
use crate::observe::ttft_ring::TtftSummary;
use crate::request::route::Route;

/// One replica: its snapshot and how its counters moved.
#[derive(Debug, Serialize)]
pub(crate) struct ReplicaFrame {
    #[serde(flatten)]
    pub(crate) snapshot: ReplicaSnapshot,
    /// KV events applied per second.
    pub(crate) events_per_s: Option<f64>,
    /// Requests routed here per second.
    pub(crate) requests_per_s: Option<f64>,
    /// The engine's own prefix-cache hit rate over the window, 0–1.
    pub(crate) engine_hit_rate: Option<f64>,
}

/// The fleet over the window.
#[derive(Debug, Default, PartialEq, Serialize)]
pub(crate) struct FleetFrame {
    /// Requests routed per second.
    pub(crate) requests_per_s: Option<f64>,
    /// Requests answered per second by API route (`chat`, `completions`,
    /// `messages`).
    pub(crate) requests_per_s_by_route: BTreeMap<&'static str, Option<f64>>,
    /// Prompt tokens kvgate predicted cached on the chosen replica, 0–1.
    pub(crate) predicted_hit_rate: Option<f64>,
    /// Prompt tokens the engines reported as prefix-cache hits, 0–1.
    pub(crate) engine_hit_rate: Option<f64>,
    /// TTFT percentiles as the gateway saw them, seconds.
    pub(crate) ttft_p50_s: Option<f64>,
    pub(crate) ttft_p90_s: Option<f64>,
    /// First tokens in the window.
    pub(crate) ttft_samples: usize,
    /// Bookings in flight.
    pub(crate) in_flight: u64,
    /// Decisions since start: routed, asked to wait, rejected.
    pub(crate) decisions: [u64; 3],
    /// Replicas by health.
    pub(crate) healthy: usize,
    pub(crate) degraded: usize,
    pub(crate) down: usize,
}

/// Everything one frame carries.
#[derive(Debug, Serialize)]
pub(crate) struct Frame {
    /// Counts frames since the sampler started.
    pub(crate) seq: u64,
    /// Seconds since kvgate started.
    pub(crate) uptime_s: f64,
    /// Milliseconds between frames.
    pub(crate) interval_ms: u64,
    /// Seconds the rates actually cover (less than the configured window
    /// just after the sampler starts).
    pub(crate) window_s: f64,
    pub(crate) fleet: FleetFrame,
    /// Per model pool (one, `default`, for a single-model config); each
    /// replica names its pool.
    pub(crate) pools: Vec<PoolSnapshot>,
    pub(crate) replicas: Vec<ReplicaFrame>,
    /// The last decisions, newest first.
    pub(crate) decisions: Vec<Value>,
}

impl Frame {
    /// Puts a frame together. `rates.replicas` follows `snap.replicas`.
    pub(crate) fn build(
        seq: u64,
        interval_ms: u64,
        snap: FleetSnapshot,
        rates: Rates,
        ttft: TtftSummary,
        decisions: Vec<Value>,
    ) -> Frame {
        let count = |h: &str| snap.replicas.iter().filter(|r| r.health == h).count();
        let fleet = FleetFrame {
            requests_per_s: rates.requests_per_s,
            requests_per_s_by_route: Route::ALL
                .iter()
                .map(|r| (r.label(), rates.by_route_per_s[r.index()]))
                .collect(),
            predicted_hit_rate: rates.predicted_hit_rate,
            engine_hit_rate: rates.engine_hit_rate,
            ttft_p50_s: ttft.p50_s,
            ttft_p90_s: ttft.p90_s,
            ttft_samples: ttft.count,
            in_flight: snap.in_flight,
            decisions: snap.decisions,
            healthy: count("healthy"),
            degraded: count("degraded"),
            down: count("down"),
        };
        let pools = snap.pools;
        let mut per_replica = rates.replicas.into_iter();
        let replicas = snap
            .replicas
            .into_iter()
            .map(|snapshot| {
                let r: ReplicaRates = per_replica.next().unwrap_or_default();
                ReplicaFrame {
                    snapshot,
                    events_per_s: r.events_per_s,
                    requests_per_s: r.requests_per_s,
                    engine_hit_rate: r.engine_hit_rate,
                }
            })
            .collect();
        Frame {
            seq,
            uptime_s: snap.uptime_s,
            interval_ms,
            window_s: rates.span_s,
            fleet,
            pools,
            replicas,
            decisions,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replicas_keep_their_snapshot_fields_and_gain_rates() {
        let snap = FleetSnapshot {
            replicas: vec![
                ReplicaSnapshot {
                    name: "r0".into(),
                    pool: "chat".into(),
                    health: "healthy",
                    index_blocks: [7, 3, 0],
                    capacity_blocks: [100, 50, 0],
                    pending_prefill_tokens: 1234,
                    ..ReplicaSnapshot::default()
                },
                ReplicaSnapshot { name: "r1".into(), health: "down", ..ReplicaSnapshot::default() },
            ],
            in_flight: 3,
            decisions: [10, 1, 2],
            uptime_s: 42.0,
            pools: vec![PoolSnapshot {
                name: "chat".into(),
                model: "m".into(),
                in_flight: 3,
                ..PoolSnapshot::default()
            }],
            ..FleetSnapshot::default()
        };
        let rates = Rates {
            span_s: 5.0,
            requests_per_s: Some(2.0),
            by_route_per_s: [Some(1.5), None, Some(0.5), None],
            predicted_hit_rate: Some(0.5),
            engine_hit_rate: Some(0.4),
            replicas: vec![ReplicaRates { events_per_s: Some(12.5), ..ReplicaRates::default() }],
        };
        let ttft = TtftSummary { count: 4, p50_s: Some(0.1), p90_s: Some(0.3) };
        let frame = Frame::build(9, 1000, snap, rates, ttft, vec![serde_json::json!({"x": 1})]);
        let v = serde_json::to_value(&frame).unwrap();
        assert_eq!(v["seq"], 9);
        assert_eq!(v["window_s"], 5.0);
        assert_eq!(v["fleet"]["requests_per_s"], 2.0);
        assert_eq!(
            v["fleet"]["requests_per_s_by_route"],
            serde_json::json!({"chat": 1.5, "completions": null, "messages": 0.5, "responses": null})
        );
        assert_eq!(v["fleet"]["ttft_p90_s"], 0.3);
        assert_eq!(v["fleet"]["healthy"], 1);
        assert_eq!(v["fleet"]["down"], 1);
        assert_eq!(v["fleet"]["decisions"], serde_json::json!([10, 1, 2]));
        let r0 = &v["replicas"][0];
        assert_eq!(r0["name"], "r0");
        assert_eq!(r0["pool"], "chat");
        assert_eq!(v["pools"][0]["name"], "chat");
        assert_eq!(v["pools"][0]["in_flight"], 3);
        assert_eq!(r0["index_blocks"], serde_json::json!([7, 3, 0]));
        assert_eq!(r0["capacity_blocks"], serde_json::json!([100, 50, 0]));
        assert_eq!(r0["pending_prefill_tokens"], 1234);
        assert_eq!(r0["events_per_s"], 12.5);
        // A replica without rates (none in `rates`) shows none, not zeros.
        assert_eq!(v["replicas"][1]["events_per_s"], Value::Null);
        assert_eq!(v["decisions"][0]["x"], 1);
    }
}
