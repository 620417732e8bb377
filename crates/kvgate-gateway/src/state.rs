//! Shared state: the tokenizer, the fleet's one handle, the replicas' shell
//! side (URLs, event counters, task stops) and the request path's limits.
//!
//! Fleet state (index, router, replica status) sits behind one lock,
//! [`FleetHandle`], taken through closures: none is held across an `.await`.
//! The replica directory is read lock-free (`directory.rs`).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use kvgate_index::{ReplicaId, Tier};
use kvgate_tokenize::service::TokenizeService;
use tokio::sync::{watch, Semaphore};

use crate::config::GatewayConfig;
use kvgate_router::Router;

use crate::admission::Admission;
use crate::directory::Directory;
use crate::engine_client::EngineClient;
use crate::error::{ConfigError, StartError};
use crate::fleet::Fleet;
use crate::fleet_handle::FleetHandle;
use crate::metrics::Metrics;
use crate::prepare::Preparer;
use crate::replica::Replica;
use crate::settings::Settings;
use crate::snapshot::{FleetSnapshot, PeerSnapshot, PeerTargetSnapshot, ReplicaSnapshot};
use crate::throttle::KeyThrottle;

/// Everything the handlers share.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) config: GatewayConfig,
    /// `config` in typed sections (`settings.rs`).
    pub(crate) settings: Settings,
    pub(crate) tokenizer: Arc<TokenizeService>,
    /// The request path's first stage (parse, tokenize, keys).
    pub(crate) preparer: Preparer,
    /// The index, the router and every replica's status: the one owner of
    /// fleet state (`fleet.rs`).
    pub(crate) fleet: Arc<FleetHandle>,
    /// Who the replicas are and how to reach them, read lock-free.
    pub(crate) replicas: Directory,
    /// HTTP to the engines (`HttpEngines`; a fake in unit tests).
    pub(crate) engines: Arc<dyn EngineClient>,
    /// HTTP to peer instances.
    pub(crate) client: reqwest::Client,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) inflight: Arc<Semaphore>,
    /// Requests waiting for a replica to stop being busy, first come first
    /// served.
    pub(crate) admission: Arc<crate::admission::Admission>,
    /// Client connections open, bounded by `limits.max_connections`.
    pub(crate) connections: Arc<Semaphore>,
    pub(crate) started: Instant,
    /// Wrong keys per client address (`limits.key_failures_per_minute`).
    pub(crate) key_throttle: crate::throttle::KeyThrottle,
    /// The fleet's one block size (validated at startup).
    pub(crate) block_size: u32,
    /// Set on shutdown: new requests get 503.
    pub(crate) closing: watch::Sender<bool>,
    /// Peer instances (load sharing).
    pub(crate) peers: crate::peer_state::Peers,
}

impl Shared {
    /// The state for `config` with no replica registered yet
    /// (`registry::add` registers them and starts their tasks).
    pub(crate) fn new(
        config: GatewayConfig,
        tokenizer: Arc<TokenizeService>,
        engines: Arc<dyn EngineClient>,
        client: reqwest::Client,
    ) -> Result<Shared, StartError> {
        let mut router = Router::new(config.router.clone(), Arc::default())
            .map_err(|e| StartError::Config(ConfigError::Invalid(e.to_string())))?;
        // Any drop in a booking's load (first token, end, expiry...) wakes
        // the head of the admission queue.
        let admission = Arc::new(Admission::default());
        let waiters = Arc::clone(&admission);
        router.on_load_change(Arc::new(move || waiters.load_changed()));
        let block_size =
            config.replicas.first().map_or(config.discovery.block_size, |r| r.block_size);
        let (closing, _) = watch::channel(false);
        let settings = Settings::from_config(&config);
        let fleet = Arc::new(FleetHandle::new(Fleet::new(router, settings.health)));
        let metrics = Arc::new(Metrics::new());
        let preparer = Preparer {
            tokenizer: Arc::clone(&tokenizer),
            model: config.model.clone(),
            max_messages: config.limits.max_messages,
            block_size,
            metrics: Arc::clone(&metrics),
            fleet: Arc::clone(&fleet),
        };
        Ok(Shared {
            settings,
            preparer,
            inflight: Arc::new(Semaphore::new(config.limits.max_concurrent_requests)),
            admission,
            connections: Arc::new(Semaphore::new(config.limits.max_connections)),
            tokenizer,
            fleet,
            replicas: Directory::default(),
            engines,
            client,
            metrics,
            started: Instant::now(),
            key_throttle: KeyThrottle::new(config.limits.key_failures_per_minute),
            block_size,
            closing,
            peers: crate::peer_state::Peers::new(),
            config,
        })
    }

    /// The key check of one request, through the wrong-key throttle
    /// (`throttle::verdict` with this gateway's throttle and metrics).
    pub(crate) fn key_verdict(
        &self,
        addr: Option<&crate::throttle::ClientAddr>,
        kind: crate::throttle::KeyKind,
        presented: bool,
        ok: bool,
    ) -> crate::throttle::KeyVerdict {
        crate::throttle::verdict(&self.key_throttle, &self.metrics, addr, kind, presented, ok)
    }

    pub(crate) fn replica(&self, id: ReplicaId) -> Option<Arc<Replica>> {
        self.replicas.get(id)
    }

    /// Every LoRA adapter served: the configured ones, then those the
    /// engines list, each once.
    pub(crate) fn adapters(&self) -> Vec<String> {
        self.fleet.with(|f| f.adapters(&self.config.model.lora_adapters))
    }

    /// The replicas that do not serve `adapter` ([`Fleet::without_adapter`]).
    pub(crate) fn without_adapter(&self, adapter: Option<&str>) -> Vec<ReplicaId> {
        self.fleet.with(|f| f.without_adapter(adapter, &self.config.model.lora_adapters))
    }

    pub(crate) fn replica_by_name(&self, name: &str) -> Option<Arc<Replica>> {
        self.replicas.by_name(name)
    }

    /// Builds the snapshot for metrics and the admin API.
    pub(crate) fn snapshot(&self, now: Instant) -> FleetSnapshot {
        let replicas = self.replicas.all();
        let (peers, peer_targets) = self.peers.snapshot(now);
        self.fleet.with(|fleet| self.snapshot_of(fleet, &replicas, peers, peer_targets, now))
    }

    fn snapshot_of(
        &self,
        fleet: &Fleet,
        replicas: &[Arc<Replica>],
        peers: Vec<PeerSnapshot>,
        peer_targets: Vec<PeerTargetSnapshot>,
        now: Instant,
    ) -> FleetSnapshot {
        let (index, router) = (fleet.index(), fleet.router());
        let mut out = FleetSnapshot {
            index_bytes: index.bytes_used(),
            index_distinct_keys: index.distinct_keys(),
            ledger: router.ledger_totals(),
            in_flight: router.in_flight() as u64,
            admission_waiting: self.admission.len() as u64,
            tentative: router.tentative_stats(),
            cpu_seconds: crate::metrics::process_cpu_seconds(),
            uptime_s: now.saturating_duration_since(self.started).as_secs_f64(),
            peer_outbox_dropped: self.peers.outbox_dropped.load(Ordering::Relaxed),
            peers_forgotten: self.peers.forgotten.load(Ordering::Relaxed),
            ..FleetSnapshot::default()
        };
        (out.peers, out.peer_targets) = (peers, peer_targets);
        let m = router.metrics();
        out.decisions = [&m.routed, &m.waits, &m.rejected].map(|c| c.load(Ordering::Relaxed));
        for r in replicas {
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
