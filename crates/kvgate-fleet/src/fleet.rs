//! The fleet core, sans-IO: the KV index, the router and every replica's
//! status, owned together, changed only through the methods here, each
//! given the `now` it acts at (quinn-proto's style). It holds no locks and
//! does no IO; the shell (`kvgate-gateway`'s `fleet_handle.rs`) owns the one lock, the tasks
//! bring probes, events and requests in, and the upkeep task calls
//! [`Fleet::tick`] by [`Fleet::next_deadline`].
//!
//! The health rules live here and nowhere else: a refused connection takes a
//! replica out of rotation at once, other failures after
//! `monitor.unhealthy_after` in a row; out of rotation for
//! `monitor.purge_after_ms` its index entries are purged (stepwise); a
//! rebuilt view is degraded for `monitor.rebuild_ms`; a drained replica gets
//! no new requests while its own finish.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use kvgate_events::Batch;
use kvgate_index::{BlockKey, Index, ReplicaId, ReplicaSpec, SpentTable};
use kvgate_router::{
    Booking, Decision, Disagg, EngineReport, Health, LedgerChange, Outcome, PdCounts, PdPlan,
    PdRefusal, PeerId, RejectReason, ReplicaInfo, RouteRequest, Router,
};

use crate::replica_status::{Failure, ReplicaStatus};
use crate::{EngineScrape, HealthRules, Role};

/// A model pool's index into the fleet's routers (the gateway's `pool.rs`
/// names them).
pub type PoolId = usize;

/// Booking ids carry their pool above this bit: each pool's router books
/// from its own range, so a booking (or a peer's change naming one) finds
/// its router by its id alone, even after its replica is gone.
const POOL_ID_SHIFT: u32 = 48;

/// The pool whose router made booking `id`.
fn pool_of_booking(id: u64) -> PoolId {
    (id >> POOL_ID_SHIFT) as PoolId
}

/// One replica as the fleet tracks it.
#[derive(Debug)]
struct Tracked {
    name: String,
    /// Its router: `routers[pool]`, the pool's own, or for a prefill
    /// replica the pool's prefill side (`Fleet::add_prefill_side`).
    pool: usize,
    /// The model pool it serves.
    model_pool: PoolId,
    block_size: u32,
    /// It has a KV event stream (readiness waits for its first sync).
    has_events: bool,
    status: ReplicaStatus,
}

/// What `/ready` needs.
#[derive(Debug, Default, PartialEq)]
pub struct Readiness {
    pub replicas: usize,
    /// Replicas no probe has reached yet.
    pub not_seen: Vec<String>,
    /// Replicas with an event stream whose first sync is not done.
    pub not_synced: Vec<String>,
    /// Replicas in rotation.
    pub in_rotation: usize,
}

impl Readiness {
    /// Ready to route: every replica seen, every event stream synced, one
    /// in rotation (`/ready` and the endpoint picker's gRPC health).
    pub fn ready(&self) -> bool {
        self.not_seen.is_empty() && self.not_synced.is_empty() && self.in_rotation > 0
    }
}

/// The fleet's state. See the module docs.
#[derive(Debug)]
pub struct Fleet {
    index: Index,
    /// One router per model pool: its own ledger, calibration and
    /// settings. The index is shared: its views are per replica, and a
    /// replica serves one pool.
    routers: Vec<Router>,
    replicas: BTreeMap<ReplicaId, Tracked>,
    rules: HealthRules,
    /// Pools with a prefill side: its router's place in `routers` (after
    /// every pool's own) and the planner that splits their requests.
    disagg: BTreeMap<PoolId, (usize, Disagg)>,
}

impl Fleet {
    /// A fleet of `routers.len()` pools (at least one), in pool order.
    pub fn new(mut routers: Vec<Router>, rules: HealthRules) -> Fleet {
        for (pool, r) in routers.iter_mut().enumerate() {
            r.set_booking_id_base((pool as u64) << POOL_ID_SHIFT);
        }
        Fleet {
            index: Index::new(),
            routers,
            replicas: BTreeMap::new(),
            rules,
            disagg: BTreeMap::new(),
        }
    }

    /// Gives `pool` a prefill side: `router` over its `role = "prefill"`
    /// replicas (booking from its own id range, like a pool's), and the
    /// `planner` that decides, per request, whether to split it.
    pub fn add_prefill_side(&mut self, pool: PoolId, mut router: Router, planner: Disagg) {
        let slot = self.routers.len();
        router.set_booking_id_base((slot as u64) << POOL_ID_SHIFT);
        self.routers.push(router);
        self.disagg.insert(pool, (slot, planner));
    }

    /// Plans one request of a disaggregated pool (`kvgate_router::Disagg`):
    /// served whole on a decode replica, or split, booked on both sides.
    /// `None` when the pool has no prefill side.
    pub fn plan(
        &mut self,
        pool: PoolId,
        req: &RouteRequest<'_>,
        now: Instant,
    ) -> Option<Result<PdPlan, PdRefusal>> {
        let (slot, planner) = self.disagg.get_mut(&pool)?;
        if pool >= *slot {
            return None;
        }
        let (head, tail) = self.routers.split_at_mut(*slot);
        let (decode, prefill) = (head.get_mut(pool)?, tail.first_mut()?);
        Some(planner.plan((prefill, &self.index), (decode, &self.index), req, now))
    }

    pub fn index(&self) -> &Index {
        &self.index
    }

    /// Every pool's router, in pool order.
    pub fn routers(&self) -> &[Router] {
        &self.routers
    }

    /// The first pool's router (the only one without `[[pools]]`).
    pub fn router(&self) -> &Router {
        &self.routers[0]
    }

    /// The router of `id`'s pool.
    pub fn router_of(&self, id: ReplicaId) -> Option<&Router> {
        self.routers.get(self.replicas.get(&id)?.pool)
    }

    fn router_of_mut(&mut self, id: ReplicaId) -> Option<&mut Router> {
        self.routers.get_mut(self.replicas.get(&id)?.pool)
    }

    /// The pool `id` serves.
    pub fn pool_of(&self, id: ReplicaId) -> Option<PoolId> {
        self.replicas.get(&id).map(|t| t.model_pool)
    }

    /// Whether `id` can take a request that only it can serve (a
    /// conversation whose state it holds), and its pool.
    pub fn reachable(&self, id: ReplicaId) -> Reachable {
        let Some(t) = self.replicas.get(&id) else { return Reachable::Gone };
        let (pool, s) = (t.model_pool, &t.status);
        if s.draining {
            Reachable::Draining(pool)
        } else if !s.probe_ok {
            Reachable::Down(pool, s.last_error.clone().unwrap_or_else(|| "not seen yet".into()))
        } else {
            Reachable::Up(pool)
        }
    }

    /// The router that made `booking`.
    fn booking_router(&mut self, booking: &Booking) -> Option<&mut Router> {
        self.routers.get_mut(pool_of_booking(booking.id()))
    }

    /// `booking`'s first token arrived; its TTFT when it was pending.
    pub fn first_token(&mut self, booking: Booking, now: Instant) -> Option<Duration> {
        self.booking_router(&booking)?.first_token(booking, now)
    }

    /// `booking`'s first token is presumed, not observed.
    pub fn first_token_unmeasured(&mut self, booking: Booking, now: Instant) {
        if let Some(r) = self.booking_router(&booking) {
            r.first_token_unmeasured(booking, now);
        }
    }

    /// `booking`'s request ended with `outcome`.
    pub fn finish(&mut self, booking: Booking, outcome: Outcome) {
        if let Some(r) = self.booking_router(&booking) {
            r.finish(booking, outcome);
        }
    }

    /// `booking`'s request was dropped without an outcome.
    pub fn abandon(&mut self, booking: Booking) {
        if let Some(r) = self.booking_router(&booking) {
            r.abandon(booking);
        }
    }

    /// Every router's bookings in flight.
    pub fn in_flight(&self) -> usize {
        self.routers.iter().map(Router::in_flight).sum()
    }

    /// Peers: every router keeps the changes peers need.
    pub fn share_with_peers(&mut self) {
        for r in &mut self.routers {
            r.share_with_peers(true);
        }
    }

    /// Peers: every router's ledger and tentative changes since the last
    /// call; returns the changes dropped because nobody drained them.
    pub fn drain_peer_changes(
        &mut self,
        changes: &mut Vec<LedgerChange>,
        tentative: &mut Vec<(ReplicaId, Vec<BlockKey>)>,
    ) -> u64 {
        let mut dropped = 0;
        for r in &mut self.routers {
            dropped += r.drain_ledger_changes(changes) + r.drain_tentative_changes(tentative);
        }
        dropped
    }

    /// Peers: one change a peer made, applied by the router it concerns (a
    /// booking by its replica's pool; its later news by the pool in its id,
    /// the same on every instance of one configuration).
    pub fn apply_peer(&mut self, peer: PeerId, change: &LedgerChange, now: Instant) {
        let router = match *change {
            LedgerChange::Book { replica, .. } => self.router_of_mut(replica),
            LedgerChange::FirstToken { id } | LedgerChange::Finish { id } => {
                self.routers.get_mut(pool_of_booking(id))
            }
        };
        if let Some(r) = router {
            r.apply_peer(peer, change, now);
        }
    }

    /// Peers: blocks a peer routed to `replica` and expects to be cached.
    pub fn apply_peer_tentative(&mut self, replica: ReplicaId, keys: &[BlockKey], now: Instant) {
        if let Some(r) = self.router_of_mut(replica) {
            r.apply_peer_tentative(replica, keys, now);
        }
    }

    /// Peers: a peer went silent; its bookings are released everywhere.
    pub fn forget_peer(&mut self, peer: PeerId) -> usize {
        self.routers.iter_mut().map(|r| r.forget_peer(peer)).sum()
    }

    pub fn status(&self, id: ReplicaId) -> Option<&ReplicaStatus> {
        self.replicas.get(&id).map(|t| &t.status)
    }

    /// Registers a replica: in the index (bounded by the rules' bound until
    /// the engine reports its size) and in the router, down until its first
    /// probe answers.
    pub fn add(
        &mut self,
        name: &str,
        dp_rank: u32,
        block_size: u32,
        has_events: bool,
        pool: PoolId,
    ) -> Result<ReplicaId, String> {
        self.add_with_role(name, dp_rank, block_size, has_events, pool, Role::Both)
    }

    /// [`Fleet::add`] for a replica with a disaggregation role: a prefill
    /// replica joins its pool's prefill side, which must exist.
    pub fn add_with_role(
        &mut self,
        name: &str,
        dp_rank: u32,
        block_size: u32,
        has_events: bool,
        model_pool: PoolId,
        role: Role,
    ) -> Result<ReplicaId, String> {
        let first_side = self.disagg.values().map(|d| d.0).min().unwrap_or(self.routers.len());
        if model_pool >= first_side {
            return Err(format!("no pool #{model_pool}"));
        }
        let pool = match (role, self.disagg.get(&model_pool)) {
            (Role::Prefill, Some((slot, _))) => *slot,
            (Role::Prefill, None) => {
                return Err(format!(
                    "replica {name}: role prefill in pool #{model_pool}, which has no prefill \
                     side (declare its prefill replicas in the configuration)"
                ))
            }
            _ => model_pool,
        };
        let mut spec = ReplicaSpec::new(name, dp_rank, block_size);
        spec.capacity_blocks = [Some(self.rules.index_bound); 3];
        let id = self.index.add_replica(spec).map_err(|e| e.to_string())?;
        let router = &mut self.routers[pool];
        if let Err(e) = router.add_replica(id, ReplicaInfo::new(name, block_size)) {
            let _ = self.index.remove_replica(id);
            return Err(e.to_string());
        }
        let _ = router.set_health(id, Health::Down);
        let mut status = ReplicaStatus::default();
        if !has_events {
            status.problem(
                name,
                "no KV event stream configured (events=tcp://…): routed by load only".into(),
            );
        }
        let tracked =
            Tracked { name: name.to_owned(), pool, model_pool, block_size, has_events, status };
        self.replicas.insert(id, tracked);
        Ok(id)
    }

    /// Forgets a replica: its bookings are released, its index entries
    /// dropped.
    pub fn remove(&mut self, id: ReplicaId) {
        if let Some(r) = self.router_of_mut(id) {
            let _ = r.remove_replica(id);
        }
        let _ = self.index.remove_replica(id);
        self.replicas.remove(&id);
    }

    /// One routing decision (bookings included: a `Routed` carries its
    /// booking, which the shell's `HeldBooking` finishes or abandons).
    /// A pool that does not exist has no replica.
    pub fn route(&mut self, pool: PoolId, req: &RouteRequest<'_>, now: Instant) -> Decision {
        match self.routers.get_mut(pool) {
            Some(r) => r.decide(req, &self.index, now),
            None => Decision::Reject {
                reason: RejectReason::NoReplica,
                retry_after: Duration::from_secs(1),
            },
        }
    }

    /// Pushes `id`'s health to the router when it changed.
    fn sync(&mut self, id: ReplicaId, now: Instant) {
        let Some(t) = self.replicas.get(&id) else { return };
        let h = t.status.health(now);
        let Some(router) = self.routers.get_mut(t.pool) else { return };
        if router.replica(id).is_some_and(|(_, cur)| cur != h) {
            let _ = router.set_health(id, h);
            tracing::info!(replica = %t.name, health = h.name(), "replica health changed");
        }
    }

    /// A probe answered `/health`; `scrape` is what its `/metrics` said.
    /// Returns how many index blocks a smaller reported cache dropped.
    pub fn probe_succeeded(
        &mut self,
        id: ReplicaId,
        scrape: Result<EngineScrape, String>,
        now: Instant,
    ) -> u64 {
        let rules = self.rules;
        let Some(t) = self.replicas.get_mut(&id) else { return 0 };
        let s = &mut t.status;
        if !s.probe_ok {
            tracing::info!(replica = %t.name, "replica in rotation");
            if s.purged {
                s.degraded =
                    Some(("view purged while down; rebuilding".into(), now + rules.rebuild));
                s.purged = false;
            }
        }
        s.probe_ok = true;
        s.ever_seen = true;
        s.failures = 0;
        s.down_since = None;
        let pool = t.model_pool;
        let mut transferred = None;
        match &scrape {
            Ok(e) => {
                if let Some(bs) = e.block_size.filter(|&b| b != t.block_size) {
                    let p = format!(
                        "engine reports block_size {bs} but kvgate is configured with {}",
                        t.block_size
                    );
                    s.problem(&t.name, p);
                }
                let before = s.engine.as_ref().and_then(|prev| prev.transfers);
                transferred = e.transfers.zip(before).and_then(|(now, was)| now.since(&was));
                s.engine = Some(e.clone());
            }
            Err(err) => s.last_error = Some(err.clone()),
        }
        self.sync(id, now);
        if let Some((bytes, seconds)) = transferred {
            self.observe_transfer(pool, bytes, seconds);
        }
        let Ok(e) = scrape else { return 0 };
        let report = EngineReport {
            running: e.running,
            waiting: e.waiting,
            kv_usage: e.kv_usage,
            prefix_cache_queries: e.prefix_queries,
            prefix_cache_hits: e.prefix_hits,
            timing: e.timing,
            at: now,
        };
        let mut resized = None;
        let Some(router) = self.router_of_mut(id) else { return 0 };
        if let Some((info, _)) = router.replica(id) {
            let cpu = e.num_cpu_blocks.unwrap_or(0);
            resized = e
                .num_gpu_blocks
                .filter(|&cap| info.capacity_blocks[0] != cap || info.capacity_blocks[1] != cpu)
                .map(|cap| (cap, cpu));
            let budget = e.step_budget.filter(|&b| b != info.max_num_batched_tokens);
            // Cloned only when something changed (a scrape a second per replica).
            if resized.is_some() || budget.is_some() {
                let mut info = info.clone();
                if let Some((cap, cpu)) = resized {
                    info.capacity_blocks[0] = cap;
                    info.capacity_blocks[1] = cpu;
                }
                if let Some(b) = budget {
                    info.max_num_batched_tokens = b;
                }
                let _ = router.update_info(id, info);
            }
        }
        let _ = router.report(id, report);
        if let Some(lora) = &e.lora {
            let names: Vec<&str> = lora.adapters.iter().map(String::as_str).collect();
            let _ = router.report_adapters(id, lora.max_loras, &names);
        }
        // The index's memory bound follows the engine's real size. A CPU
        // tier the engine does not report (0: offloading connectors count
        // their blocks elsewhere) keeps the configured bound.
        let Some((gpu, cpu)) = resized else { return 0 };
        let bound = rules.index_bound;
        let cpu = if cpu > 0 { cpu } else { bound };
        let dropped = self.index.set_capacity(id, [Some(gpu), Some(cpu), Some(bound)]).unwrap_or(0);
        if dropped > 0 {
            let name = self.replicas.get(&id).map_or("", |t| t.name.as_str());
            tracing::warn!(
                replica = name,
                dropped,
                capacity = gpu,
                "the index held more blocks than the engine can; the oldest were dropped"
            );
        }
        dropped
    }

    /// KV pulled by a decode replica of `pool` since its last scrape
    /// (vLLM's NIXL series): it calibrates the pool's transfer rate, which
    /// otherwise stays at `disagg.bandwidth_gbps`.
    fn observe_transfer(&mut self, pool: PoolId, bytes: f64, seconds: f64) {
        let Some((_, planner)) = self.disagg.get_mut(&pool) else { return };
        let per_token = planner.config().kv_bytes_per_token.max(1) as f64;
        planner.observe_transfer((bytes / per_token).round() as u64, seconds);
    }

    /// What `pool`'s planner decided so far; `None` when it is not
    /// disaggregated.
    pub fn pd_counts(&self, pool: PoolId) -> Option<PdCounts> {
        self.disagg.get(&pool).map(|(_, planner)| planner.counts())
    }

    /// The calibrated seconds per transferred token of `pool`'s planner;
    /// `None` when it is not disaggregated.
    pub fn transfer_s_per_token(&self, pool: PoolId) -> Option<f64> {
        self.disagg.get(&pool).map(|(_, planner)| planner.transfer_s_per_token())
    }

    /// A probe or a request to `id` failed.
    pub fn failed(&mut self, id: ReplicaId, error: String, failure: Failure, now: Instant) {
        let rules = self.rules;
        let Some(t) = self.replicas.get_mut(&id) else { return };
        if t.status.fail(error, failure, &rules, now) {
            match failure {
                Failure::Unreachable => {
                    tracing::warn!(replica = %t.name, "replica left rotation: connection refused")
                }
                Failure::Error => tracing::warn!(replica = %t.name, "replica left rotation"),
            }
        }
        self.sync(id, now);
        // A purge already due (a replica long down) starts now, not at the
        // next tick.
        self.purge_if_due(id, now);
    }

    /// Drain on or off: a draining replica gets no new requests; those in
    /// flight finish.
    pub fn set_draining(&mut self, id: ReplicaId, draining: bool, now: Instant) {
        let Some(t) = self.replicas.get_mut(&id) else { return };
        t.status.draining = draining;
        self.sync(id, now);
    }

    /// Whether `id` has no request in flight (none booked).
    pub fn idle(&self, id: ReplicaId) -> bool {
        self.router_of(id)
            .and_then(|r| r.load(id))
            .is_none_or(|v| v.load.prefill_requests == 0 && v.load.decoding_requests == 0)
    }

    /// The LoRA adapters `id`'s engine lists now; returns whether they
    /// changed.
    pub fn set_adapters(&mut self, id: ReplicaId, adapters: Vec<String>) -> bool {
        let Some(t) = self.replicas.get_mut(&id) else { return false };
        if t.status.adapters == adapters {
            return false;
        }
        tracing::info!(replica = %t.name, ?adapters, "LoRA adapters listed by the engine");
        t.status.adapters = adapters;
        true
    }

    /// Every adapter `pool` serves: `declared` (every replica of it serves
    /// those), then those its engines list, each once.
    pub fn adapters(&self, pool: PoolId, declared: &[String]) -> Vec<String> {
        let mut all = declared.to_vec();
        for t in self.replicas.values().filter(|t| t.model_pool == pool) {
            for a in &t.status.adapters {
                if !all.contains(a) {
                    all.push(a.clone());
                }
            }
        }
        all
    }

    /// The replicas of `pool` that do not serve `adapter`: none for a
    /// base-model request or a declared adapter; for an adapter learnt from
    /// the engines, every replica whose engine does not list it.
    pub fn without_adapter(
        &self,
        pool: PoolId,
        adapter: Option<&str>,
        declared: &[String],
    ) -> Vec<ReplicaId> {
        let Some(adapter) = adapter else { return Vec::new() };
        if declared.iter().any(|a| a == adapter) {
            return Vec::new();
        }
        self.replicas
            .iter()
            .filter(|(_, t)| {
                t.model_pool == pool && !t.status.adapters.iter().any(|a| a == adapter)
            })
            .map(|(&id, _)| id)
            .collect()
    }

    /// Where a runtime adapter load in `pool` goes (`adapter_load.rs`).
    pub fn load_target(&self, pool: PoolId, now: Instant) -> Option<ReplicaId> {
        let router = self.routers.get(pool)?;
        let candidates = self.replicas.iter().filter(|(_, t)| t.pool == pool).map(|(&id, t)| {
            let in_flight = router.load(id).map_or(0, |v| v.load.requests());
            (id, t.status.health(now), t.status.adapters.len(), in_flight)
        });
        pick_target(candidates)
    }

    /// `id`'s engine now serves `adapter` (a runtime load succeeded; the
    /// next `/v1/models` refresh confirms it).
    pub fn add_adapter(&mut self, id: ReplicaId, adapter: &str) {
        if let Some(t) = self.replicas.get_mut(&id) {
            if !t.status.adapters.iter().any(|a| a == adapter) {
                t.status.adapters.push(adapter.to_owned());
            }
        }
    }

    /// The pool of a replica whose engine lists `model` as an adapter.
    pub fn adapter_pool(&self, model: &str) -> Option<PoolId> {
        self.replicas
            .values()
            .find(|t| t.status.adapters.iter().any(|a| a == model))
            .map(|t| t.model_pool)
    }

    /// Applies one event batch of `id`'s.
    pub fn apply_events(&mut self, id: ReplicaId, batch: &Batch, now: Instant) {
        let outcome = self.index.apply_batch(id, batch, now);
        let Some(t) = self.replicas.get_mut(&id) else { return };
        t.status.events_seen = true;
        if outcome.anomalies.block_size_mismatch > 0 {
            let p = format!(
                "its events carry a block size other than the configured {} \
                 (set block_size to the engine's --block-size)",
                t.block_size
            );
            t.status.problem(&t.name, p);
        }
    }

    /// `id`'s view is lost (a reset, an undecodable batch, a restarted
    /// feed): its entries are cleared (stepwise: see [`Fleet::clear_step`])
    /// and it is degraded until the view has been rebuilt. Returns the
    /// blocks being cleared.
    pub fn view_lost(&mut self, id: ReplicaId, why: String, now: Instant) -> u64 {
        let cleared = self.index.begin_clear(id).unwrap_or(0);
        self.view_degraded(id, why, now);
        cleared
    }

    /// `id`'s view may miss blocks: degraded until rebuilt.
    pub fn view_degraded(&mut self, id: ReplicaId, why: String, now: Instant) {
        let rebuild = self.rules.rebuild;
        let Some(t) = self.replicas.get_mut(&id) else { return };
        t.status.degraded = Some((why, now + rebuild));
        self.sync(id, now);
    }

    /// `id`'s event subscriber finished its first sync.
    pub fn view_synced(&mut self, id: ReplicaId, complete: bool) {
        let Some(t) = self.replicas.get_mut(&id) else { return };
        t.status.view_synced = true;
        t.status.view_complete = complete;
    }

    /// Records a configuration problem of `id`'s (once).
    pub fn problem(&mut self, id: ReplicaId, p: String) {
        if let Some(t) = self.replicas.get_mut(&id) {
            t.status.problem(&t.name, p);
        }
    }

    /// Releases up to `budget` entries of a clear begun on `id`; returns
    /// what is left and the spent table to drop outside the lock.
    pub fn clear_step(&mut self, id: ReplicaId, budget: usize) -> (u64, Option<SpentTable>) {
        self.index.clear_step(id, budget).unwrap_or((0, None))
    }

    /// The replicas with a clear in progress.
    pub fn clearing(&self) -> Vec<ReplicaId> {
        self.replicas.keys().copied().filter(|&id| self.index.clearing(id)).collect()
    }

    /// Time passes: the router's bookings and tentative blocks expire,
    /// replicas out of rotation too long are purged, degraded windows that
    /// ended end.
    pub fn tick(&mut self, now: Instant) {
        for r in &mut self.routers {
            r.maintain(now, Some(&self.index));
        }
        let ids: Vec<ReplicaId> = self.replicas.keys().copied().collect();
        for id in ids {
            self.purge_if_due(id, now);
            if let Some(t) = self.replicas.get_mut(&id) {
                if t.status.degraded_until().is_some_and(|until| until <= now) {
                    t.status.degraded = None;
                }
            }
            self.sync(id, now);
        }
    }

    /// The earliest instant at which [`Fleet::tick`] has something of the
    /// fleet's own to do (a purge, the end of a degraded window). The
    /// router's expiries are seconds long and need no exact deadline: the
    /// driver also ticks on a short period.
    pub fn next_deadline(&self) -> Option<Instant> {
        let rules = &self.rules;
        self.replicas
            .values()
            .flat_map(|t| [t.status.purge_due(rules), t.status.degraded_until()])
            .flatten()
            .min()
    }

    fn purge_if_due(&mut self, id: ReplicaId, now: Instant) {
        let rules = self.rules;
        let Some(t) = self.replicas.get_mut(&id) else { return };
        if t.status.purge_due(&rules).is_some_and(|at| at <= now) {
            let n = self.index.begin_clear(id).unwrap_or(0);
            t.status.purged = true;
            tracing::warn!(replica = %t.name, blocks = n, "purged the index entries of a replica out of rotation");
        }
    }

    /// What `/ready` reports.
    pub fn readiness(&self) -> Readiness {
        let mut r = Readiness { replicas: self.replicas.len(), ..Readiness::default() };
        for t in self.replicas.values() {
            if !t.status.ever_seen {
                r.not_seen.push(t.name.clone());
            }
            if t.has_events && !t.status.view_synced {
                r.not_synced.push(t.name.clone());
            }
            if t.status.probe_ok {
                r.in_rotation += 1;
            }
        }
        r
    }
}

/// The replica of a pool a runtime load goes to, among `(id, health,
/// adapters registered, requests in flight)`.
fn pick_target(
    candidates: impl IntoIterator<Item = (ReplicaId, Health, usize, u32)>,
) -> Option<ReplicaId> {
    candidates
        .into_iter()
        .filter(|c| c.1 == Health::Healthy)
        .min_by_key(|c| (c.2, c.3, c.0))
        .map(|c| c.0)
}

/// What [`Fleet::reachable`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reachable {
    /// In rotation, in this pool.
    Up(PoolId),
    /// Being drained: it takes no new requests and will go away.
    Draining(PoolId),
    /// Out of rotation (failed probes or requests), with the last error.
    Down(PoolId, String),
    /// Not (or no longer) in the fleet.
    Gone,
}

#[cfg(test)]
#[path = "fleet/tests.rs"]
mod tests;
