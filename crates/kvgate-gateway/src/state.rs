//! Shared state: the tokenizer, the KV index, the router, and per-replica
//! runtime state.
//!
//! Lock order, everywhere: `index` (RwLock) before `router` (Mutex) before a
//! replica's `status` (Mutex). All three are `std::sync` locks held for
//! microseconds and never across an `.await`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Instant;

use kvgate_events::subscriber::SubscriberMetrics;
use kvgate_index::{Index, ReplicaId, Tier};
use kvgate_router::{Health, Router};
use kvgate_tokenize::service::TokenizeService;
use tokio::sync::{watch, Semaphore};

use crate::config::{GatewayConfig, ReplicaConfig};
use crate::locks::{lock, read};
use crate::metrics::Metrics;
use crate::scrape::EngineScrape;
use crate::snapshot::{FleetSnapshot, ReplicaSnapshot};

/// What kvgate knows about one replica beyond the router.
#[derive(Debug, Default)]
pub(crate) struct ReplicaStatus {
    /// The last probe succeeded.
    pub(crate) probe_ok: bool,
    /// Some probe ever succeeded (for `/ready`).
    pub(crate) ever_seen: bool,
    /// Consecutive failures (probes or requests).
    pub(crate) failures: u32,
    /// When it left rotation.
    pub(crate) down_since: Option<Instant>,
    /// Its index entries were purged while down.
    pub(crate) purged: bool,
    /// No new requests (admin drain).
    pub(crate) draining: bool,
    /// Why its view is being rebuilt, and until when it counts as degraded.
    pub(crate) degraded: Option<(String, Instant)>,
    /// Last error, for the admin API.
    pub(crate) last_error: Option<String>,
    /// Configuration problems found at runtime (loud, persistent).
    pub(crate) problems: Vec<String>,
    /// The last scrape.
    pub(crate) engine: Option<EngineScrape>,
    /// Whether any event arrived.
    pub(crate) events_seen: bool,
    /// The event subscriber's first sync is done (initial replay applied,
    /// or no replay endpoint): `/ready` waits for it.
    pub(crate) view_synced: bool,
    /// That sync reached back to the engine's first batch.
    pub(crate) view_complete: bool,
    /// LoRA adapters the engine lists in `/v1/models` (cards with a
    /// `parent`), refreshed every [`crate::monitor::ADAPTER_REFRESH`].
    pub(crate) adapters: Vec<String>,
}

impl ReplicaStatus {
    /// Adds a problem once and logs it loudly the first time.
    pub(crate) fn problem(&mut self, name: &str, p: String) {
        if !self.problems.contains(&p) {
            tracing::error!(replica = name, problem = %p, "replica misconfigured");
            self.problems.push(p);
        }
    }
}

/// One configured replica at runtime.
#[derive(Debug)]
pub(crate) struct Replica {
    pub(crate) id: ReplicaId,
    pub(crate) config: ReplicaConfig,
    pub(crate) name: String,
    /// The URL without a trailing slash.
    pub(crate) base: String,
    /// The engine's chat and completions URLs, parsed once (parsing a URL
    /// per request was 3 % of a short request's CPU).
    pub(crate) route_urls: [reqwest::Url; 2],
    pub(crate) status: Mutex<ReplicaStatus>,
    pub(crate) events: Arc<SubscriberMetrics>,
    pub(crate) routed: AtomicU64,
    /// Stops this replica's tasks (subscriber, monitor) when set.
    pub(crate) stop: watch::Sender<bool>,
}

impl Replica {
    /// `base` + each route's path, parsed.
    pub(crate) fn parse_route_urls(base: &str) -> Result<[reqwest::Url; 2], String> {
        let parse = |route: crate::route::Route| {
            reqwest::Url::parse(&format!("{base}{}", route.path()))
                .map_err(|e| format!("invalid URL {base}: {e}"))
        };
        Ok([parse(crate::route::Route::Chat)?, parse(crate::route::Route::Completions)?])
    }

    /// The engine URL for `route`.
    pub(crate) fn route_url(&self, route: crate::route::Route) -> &reqwest::Url {
        match route {
            crate::route::Route::Chat => &self.route_urls[0],
            crate::route::Route::Completions => &self.route_urls[1],
        }
    }

    /// The router health this status implies.
    pub(crate) fn health(&self, now: Instant) -> Health {
        let s = lock(&self.status);
        if !s.probe_ok || s.draining {
            Health::Down
        } else if s.degraded.as_ref().is_some_and(|(_, until)| now < *until) {
            Health::Degraded
        } else {
            Health::Healthy
        }
    }
}

/// Everything the handlers share.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) config: GatewayConfig,
    pub(crate) tokenizer: Arc<TokenizeService>,
    pub(crate) index: RwLock<Index>,
    pub(crate) router: Mutex<Router>,
    pub(crate) replicas: RwLock<Vec<Arc<Replica>>>,
    pub(crate) client: reqwest::Client,
    pub(crate) metrics: Metrics,
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
        read(&self.replicas).iter().find(|r| r.id == id).cloned()
    }

    /// Every LoRA adapter served: the configured ones, then those the
    /// engines list, each once.
    pub(crate) fn adapters(&self) -> Vec<String> {
        let mut all = self.config.model.lora_adapters.clone();
        for r in read(&self.replicas).iter() {
            for a in &lock(&r.status).adapters {
                if !all.contains(a) {
                    all.push(a.clone());
                }
            }
        }
        all
    }

    /// The replicas that do not serve `adapter`: none for a base-model
    /// request or an adapter declared in `model.lora_adapters` (served by
    /// every replica, by declaration); for an adapter learnt from the
    /// engines, every replica whose engine does not list it.
    pub(crate) fn without_adapter(&self, adapter: Option<&str>) -> Vec<ReplicaId> {
        let Some(adapter) = adapter else { return Vec::new() };
        if self.config.model.lora_adapters.iter().any(|a| a == adapter) {
            return Vec::new();
        }
        read(&self.replicas)
            .iter()
            .filter(|r| !lock(&r.status).adapters.iter().any(|a| a == adapter))
            .map(|r| r.id)
            .collect()
    }

    /// Whether some replica's engine lists `model` as a LoRA adapter.
    pub(crate) fn engine_serves_adapter(&self, model: &str) -> bool {
        read(&self.replicas).iter().any(|r| lock(&r.status).adapters.iter().any(|a| a == model))
    }

    pub(crate) fn replica_by_name(&self, name: &str) -> Option<Arc<Replica>> {
        read(&self.replicas).iter().find(|r| r.name == name || r.base == name).cloned()
    }

    /// Pushes a replica's health to the router when it changed.
    pub(crate) fn sync_health(&self, replica: &Replica, now: Instant) {
        let h = replica.health(now);
        let mut router = lock(&self.router);
        if router.replica(replica.id).is_some_and(|(_, cur)| cur != h) {
            let _ = router.set_health(replica.id, h);
            tracing::info!(replica = %replica.name, health = h.name(), "replica health changed");
        }
    }

    /// Records a failed request or probe; enough in a row take the replica
    /// out of rotation at once.
    pub(crate) fn note_failure(&self, replica: &Replica, error: String, now: Instant) {
        {
            let mut s = lock(&replica.status);
            s.failures += 1;
            s.last_error = Some(error);
            if s.failures >= self.config.monitor.unhealthy_after && s.probe_ok {
                s.probe_ok = false;
                s.down_since = Some(now);
                tracing::warn!(replica = %replica.name, "replica left rotation");
            }
        }
        self.sync_health(replica, now);
    }

    /// Takes a replica out of rotation at once (a refused connection: no
    /// process listens). The monitor brings it back when it answers again.
    pub(crate) fn mark_down(&self, replica: &Replica, error: String, now: Instant) {
        {
            let mut s = lock(&replica.status);
            s.failures = s.failures.max(self.config.monitor.unhealthy_after);
            s.last_error = Some(error);
            if s.probe_ok {
                s.probe_ok = false;
                s.down_since = Some(now);
                tracing::warn!(replica = %replica.name, "replica left rotation: connection refused");
            }
        }
        self.sync_health(replica, now);
    }

    /// Builds the snapshot for metrics and the admin API.
    pub(crate) fn snapshot(&self, now: Instant) -> FleetSnapshot {
        let replicas = read(&self.replicas).clone();
        let index = read(&self.index);
        let router = lock(&self.router);
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
        (out.peers, out.peer_targets) = self.peers.snapshot(now);
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
            let s = lock(&r.status);
            let ev = &r.events;
            let e = s.engine.as_ref();
            let reason = if !s.probe_ok {
                Some(s.last_error.clone().unwrap_or_else(|| "not seen yet".into()))
            } else {
                s.degraded.as_ref().filter(|(_, until)| now < *until).map(|(why, _)| why.clone())
            };
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
