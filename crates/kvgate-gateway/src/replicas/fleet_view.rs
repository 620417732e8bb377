//! What the metrics endpoint, the admin API and the dashboard read about
//! the fleet: a point-in-time [`FleetSnapshot`] built from the fleet core,
//! the replica directory, the peers, the admission queue and the uptime.
//! The wiring builds one `FleetView` and hands it to those readers, so none
//! of them holds the gateway's whole state.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use kvgate_index::Tier;

use crate::doors::peer_state::Peers;
use crate::observe::snapshot::{
    FleetSnapshot, PeerSnapshot, PeerTargetSnapshot, PoolSnapshot, ReplicaSnapshot, TenantSnapshot,
};
use crate::replicas::directory::Directory;
use crate::replicas::fleet_handle::FleetHandle;
use crate::replicas::pool::Pools;
use crate::replicas::replica::Replica;
use crate::request::tenant_queue::TenantQueue;
use kvgate_fleet::Fleet;
use kvgate_tenants::RejectReason;

/// The handles a snapshot reads (the decision log is in `fleet`).
#[derive(Debug)]
pub(crate) struct FleetView {
    pub(crate) fleet: Arc<FleetHandle>,
    pub(crate) replicas: Arc<Directory>,
    pub(crate) peers: Arc<Peers>,
    /// Each pool's name and admission queue.
    pub(crate) pools: Arc<Pools>,
    /// When the gateway started (`uptime_s`).
    pub(crate) started: Instant,
}

impl FleetView {
    /// Builds the snapshot for metrics and the admin API.
    pub(crate) fn snapshot(&self, now: Instant) -> FleetSnapshot {
        let replicas = self.replicas.all();
        let (peers, peer_targets) = self.peers.snapshot(now);
        // `/proc` is read before the lock: nothing under it makes a system call.
        let process = (
            crate::observe::metrics::process_cpu_seconds(),
            crate::observe::metrics::process_rss_bytes(),
        );
        // The tenant queues too: the request path takes a tenant queue's
        // lock and then the fleet's, never the other way round.
        let tenants: Vec<Vec<TenantSnapshot>> = self
            .pools
            .all()
            .iter()
            .map(|p| p.admission.tenants().map_or_else(Vec::new, |t| tenant_rows(t)))
            .collect();
        let mut snap = self
            .fleet
            .with(|fleet| self.snapshot_of(fleet, &replicas, peers, peer_targets, process, now));
        for (pool, rows) in snap.pools.iter_mut().zip(tenants) {
            pool.tenants = rows;
        }
        snap
    }

    fn snapshot_of(
        &self,
        fleet: &Fleet,
        replicas: &[Arc<Replica>],
        peers: Vec<PeerSnapshot>,
        peer_targets: Vec<PeerTargetSnapshot>,
        (cpu_seconds, rss_bytes): (f64, u64),
        now: Instant,
    ) -> FleetSnapshot {
        let index = fleet.index();
        let mut out = FleetSnapshot {
            index_bytes: index.bytes_used(),
            index_distinct_keys: index.distinct_keys(),
            in_flight: fleet.in_flight() as u64,
            cpu_seconds,
            rss_bytes,
            uptime_s: now.saturating_duration_since(self.started).as_secs_f64(),
            peer_outbox_dropped: self.peers.outbox_dropped.load(Ordering::Relaxed),
            peers_forgotten: self.peers.forgotten.load(Ordering::Relaxed),
            peer_bus: self.peers.bus_snapshot(),
            ..FleetSnapshot::default()
        };
        (out.peers, out.peer_targets) = (peers, peer_targets);
        for (id, (router, pool)) in fleet.routers().iter().zip(self.pools.all()).enumerate() {
            let m = router.metrics();
            let decisions = [&m.routed, &m.waits, &m.rejected].map(|c| c.load(Ordering::Relaxed));
            let ledger = router.ledger_totals();
            let tentative = router.tentative_stats();
            let waiting = pool.admission.waiting() as u64;
            out.ledger += ledger;
            out.tentative += tentative;
            out.admission_waiting += waiting;
            for (total, d) in out.decisions.iter_mut().zip(decisions) {
                *total += d;
            }
            out.pools.push(PoolSnapshot {
                name: pool.name.clone(),
                model: pool.model.served_name.clone(),
                in_flight: router.in_flight() as u64,
                admission_waiting: waiting,
                decisions,
                adapter_loads: m.adapter_loads.load(Ordering::Relaxed),
                adapter_runtime_loads: [&pool.loads.loaded, &pool.loads.failed]
                    .map(|c| c.load(Ordering::Relaxed)),
                prompt_tokens: pool.traffic.totals(),
                routed_by_reason: m
                    .routed_by_reason
                    .iter()
                    .map(|c| c.load(Ordering::Relaxed))
                    .collect(),
                transfer_s_per_token: fleet.transfer_s_per_token(id),
                tenants: Vec::new(),
            });
        }
        for r in replicas {
            let Some(router) = fleet.router_of(r.id) else { continue };
            let pool = fleet.pool_of(r.id).and_then(|p| self.pools.get(p));
            let tiers = [Tier::Gpu, Tier::Cpu, Tier::Storage];
            let blocks = tiers.map(|t| index.blocks_held(r.id, t).unwrap_or(0));
            let (health, capacity) = router
                .replica(r.id)
                .map(|(info, h)| (h.name(), info.capacity_blocks))
                .unwrap_or(("down", [0; 3]));
            let view = router.load(r.id).unwrap_or_default();
            let Some(s) = fleet.status(r.id) else { continue };
            let ev = &r.events;
            let e = s.engine.as_ref();
            let reason = s.reason(now);
            out.replicas.push(ReplicaSnapshot {
                name: r.name.clone(),
                pool: pool.map_or_else(String::new, |p| p.name.clone()),
                url: r.base.clone(),
                health,
                reason,
                draining: s.draining,
                problems: s.problems.clone(),
                block_size: r.config.block_size,
                index_blocks: blocks,
                capacity_blocks: capacity,
                index_anomalies: index
                    .replica_anomalies(r.id)
                    .map(|a| a.labelled().into_iter().collect())
                    .unwrap_or_default(),
                event_batches: ev.batches.load(Ordering::Relaxed),
                events: ev.events.load(Ordering::Relaxed),
                event_gaps: ev.gaps.load(Ordering::Relaxed),
                event_replayed_batches: ev.replayed_batches.load(Ordering::Relaxed),
                event_resets: ev.resets.load(Ordering::Relaxed),
                event_decode_errors: ev.decode_errors.load(Ordering::Relaxed),
                event_reconnects: ev.reconnects.load(Ordering::Relaxed),
                event_wrong_topic: ev.wrong_topic.load(Ordering::Relaxed),
                events_seen: s.events_seen,
                view_synced: s.view_synced,
                view_complete: s.view_complete,
                pending_prefill_tokens: view.load.pending_prefill_tokens,
                prefill_requests: view.load.prefill_requests,
                decoding_requests: view.load.decoding_requests,
                ledger_drift: view.drift,
                prefill_tokens_per_s: if view.prefill_s_per_token > 0.0 {
                    1.0 / view.prefill_s_per_token
                } else {
                    0.0
                },
                overhead_s: view.overhead_s,
                calibration_samples: view.calibration_samples,
                calibration_source: view.calibration_source.name(),
                decode_step_s: view.decode_step_s,
                engine_running: e.map(|e| e.running),
                engine_waiting: e.map(|e| e.waiting),
                engine_kv_usage: e.map(|e| e.kv_usage),
                engine_prefix_queries: e.map(|e| e.prefix_queries),
                engine_prefix_hits: e.map(|e| e.prefix_hits),
                routed: r.routed.load(Ordering::Relaxed),
            });
        }
        out
    }
}

/// A tenant queue's counters, one row per tenant.
fn tenant_rows(queue: &TenantQueue) -> Vec<TenantSnapshot> {
    let rows = queue.rows().into_iter();
    rows.map(|r| {
        let c = r.counters;
        TenantSnapshot {
            tenant: r.tenant,
            arrived: c.arrived,
            queue_depth: c.queue_depth,
            in_flight: c.in_flight,
            dispatched: c.dispatched,
            finished: c.finished,
            cancelled: c.cancelled,
            rejected: RejectReason::ALL.map(|reason| match reason {
                RejectReason::Expired => c.expired,
                other => c.rejected.get(other),
            }),
            input_tokens: c.input_tokens_served,
            output_tokens: c.output_tokens_served,
        }
    })
    .collect()
}
