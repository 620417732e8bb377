//! The router: replicas, their health and reports, the ledger, tentative
//! blocks, and the decision entry points. The decision itself (gathering
//! candidates, applying a policy, booking) is in `decide.rs`.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kvgate_index::{BlockKey, ReplicaId};
use rand::rngs::SmallRng;
use rand::SeedableRng;

use crate::approx_tree::ApproxTree;
use crate::config::RouterConfig;
use crate::error::RouterError;
use crate::explain::{Candidate, DecisionLog, Explanation};
use crate::ledger::{
    Booking, Books, LedgerChange, LedgerTotals, LoadView, Origin, Outcome, PeerId, Release,
};
use crate::replica::{EngineReport, Health, ReplicaInfo};
use crate::tentative::{Tentative, TentativeStats};

/// Decision counters, shared with whoever exports metrics.
#[derive(Debug, Default)]
pub struct RouterMetrics {
    /// Requests routed to a replica.
    pub routed: AtomicU64,
    /// Decisions that asked the caller to wait (every replica busy).
    pub waits: AtomicU64,
    /// Decisions that rejected the request.
    pub rejected: AtomicU64,
    /// Routed requests that were first asked to wait.
    pub routed_after_wait: AtomicU64,
    /// Requests routed to a replica whose GPU slots were not believed to
    /// hold their LoRA adapter (a load the engine does), where the slot
    /// count is known.
    pub adapter_loads: AtomicU64,
    /// Routed requests by the reason the winner won, in
    /// [`crate::Reason::LABELS`] order.
    pub routed_by_reason: [AtomicU64; crate::Reason::LABELS.len()],
}

impl RouterMetrics {
    pub(crate) fn inc(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// The router's per-replica state.
#[derive(Clone, Debug)]
pub(crate) struct RouterReplica {
    pub(crate) info: ReplicaInfo,
    pub(crate) health: Health,
    pub(crate) report: Option<EngineReport>,
    /// Seed of this replica's rendezvous hash (from its name).
    pub(crate) name_hash: u64,
}

/// Routing decisions for one model's fleet. Sans-IO: time is an argument.
#[derive(Debug)]
pub struct Router {
    pub(crate) config: RouterConfig,
    pub(crate) books: Books,
    pub(crate) replicas: Vec<Option<RouterReplica>>,
    /// Registered ids in registration order (candidate order).
    pub(crate) order: Vec<ReplicaId>,
    pub(crate) tentative: Tentative,
    pub(crate) rng: SmallRng,
    pub(crate) rr_cursor: usize,
    pub(crate) approx: ApproxTree,
    pub(crate) approx_tick: u64,
    pub(crate) log: DecisionLog,
    pub(crate) metrics: Arc<RouterMetrics>,
    /// Reused buffers (no allocation per decision when the log is off).
    pub(crate) scratch_matches: Vec<kvgate_index::PrefixMatch>,
    pub(crate) scratch_cands: Vec<Candidate>,
    pub(crate) scratch_costs: Vec<(usize, f64)>,
    pub(crate) scratch_approx: Vec<u32>,
    pub(crate) scratch_preds: Vec<crate::cost::Prediction>,
    pub(crate) scratch_eligible: Vec<usize>,
    /// With peers: the tentative blocks of local decisions, for peers
    /// (`None` when not sharing). Bounded; overflow is counted.
    pub(crate) tentative_outbox: Option<Vec<(ReplicaId, Vec<BlockKey>)>>,
    pub(crate) tentative_outbox_dropped: u64,
    /// Per replica index: the routed-decision count when it was last
    /// chosen (0: never), for `Selection::Rotate`.
    pub(crate) last_chosen: Vec<u64>,
    /// The future-work charge's memory: per replica, the prefill work
    /// routed there recently; for the fleet, the reuse ratio (attract.rs).
    pub(crate) attraction: crate::attract::Attraction,
    /// Routed decisions so far.
    pub(crate) decisions: u64,
    /// LoRA adapters resident in each replica's GPU slots, as believed.
    pub(crate) adapters: crate::adapters::AdapterTable,
}

/// Tentative-block additions buffered for peers between drains.
pub(crate) const TENTATIVE_OUTBOX_MAX: usize = 1 << 14;

impl Router {
    /// A router with no replicas. Fails on an invalid config.
    pub fn new(config: RouterConfig, metrics: Arc<RouterMetrics>) -> Result<Router, RouterError> {
        config.validate()?;
        // No clock in a sans-IO crate: an unseeded router takes its seed from
        // the process's randomly keyed hasher.
        let seed = config.seed.unwrap_or_else(|| RandomState::new().hash_one(0x6b76_6761_7465u64));
        let mut books = Books::new(config.clone());
        books.set_outbox(false);
        Ok(Router {
            tentative: Tentative::new(
                Duration::from_millis(config.tentative_ttl_ms),
                config.tentative_max_blocks,
            ),
            log: DecisionLog::new(config.explain_last),
            config,
            books,
            replicas: Vec::new(),
            order: Vec::new(),
            rng: SmallRng::seed_from_u64(seed),
            rr_cursor: 0,
            approx: ApproxTree::new(),
            approx_tick: 0,
            metrics,
            scratch_matches: Vec::new(),
            scratch_cands: Vec::new(),
            scratch_costs: Vec::new(),
            scratch_approx: Vec::new(),
            scratch_preds: Vec::new(),
            scratch_eligible: Vec::new(),
            tentative_outbox: None,
            tentative_outbox_dropped: 0,
            last_chosen: Vec::new(),
            attraction: crate::attract::Attraction::default(),
            decisions: 0,
            adapters: crate::adapters::AdapterTable::default(),
        })
    }

    /// The validated config.
    pub fn config(&self) -> &RouterConfig {
        &self.config
    }

    /// The shared counters.
    pub fn metrics(&self) -> &Arc<RouterMetrics> {
        &self.metrics
    }

    /// Registers a replica under the index's id for it (so that index
    /// matches line up with router state).
    pub fn add_replica(&mut self, id: ReplicaId, info: ReplicaInfo) -> Result<(), RouterError> {
        info.validate()?;
        if self.replicas.get(id.index()).is_some_and(Option::is_some) {
            return Err(RouterError::DuplicateReplica(id));
        }
        if self.replicas.len() <= id.index() {
            self.replicas.resize(id.index() + 1, None);
        }
        let name_hash = xxhash_rust::xxh3::xxh3_64(info.name.as_bytes());
        self.replicas[id.index()] =
            Some(RouterReplica { info, health: Health::Healthy, report: None, name_hash });
        self.order.push(id);
        self.books.add_replica(id);
        self.adapters.remove_replica(id);
        Ok(())
    }

    /// Removes a replica: its bookings are released (counted as
    /// `replica_removed`), its tentative blocks and prefix memory forgotten.
    pub fn remove_replica(&mut self, id: ReplicaId) -> Result<(), RouterError> {
        let slot = self.replicas.get_mut(id.index()).ok_or(RouterError::UnknownReplica(id))?;
        if slot.take().is_none() {
            return Err(RouterError::UnknownReplica(id));
        }
        self.order.retain(|&r| r != id);
        self.tentative.clear_replica(id);
        self.approx.remove_tenant(id.0);
        self.books.remove_replica(id);
        self.adapters.remove_replica(id);
        Ok(())
    }

    fn replica_mut(&mut self, id: ReplicaId) -> Result<&mut RouterReplica, RouterError> {
        self.replicas
            .get_mut(id.index())
            .and_then(Option::as_mut)
            .ok_or(RouterError::UnknownReplica(id))
    }

    /// Static facts and health of a replica.
    pub fn replica(&self, id: ReplicaId) -> Option<(&ReplicaInfo, Health)> {
        self.replicas.get(id.index())?.as_ref().map(|r| (&r.info, r.health))
    }

    /// Registered replicas in candidate order.
    pub fn replica_ids(&self) -> &[ReplicaId] {
        &self.order
    }

    /// Updates the static facts (capacity learned from the engine, say).
    pub fn update_info(&mut self, id: ReplicaId, info: ReplicaInfo) -> Result<(), RouterError> {
        info.validate()?;
        let r = self.replica_mut(id)?;
        r.name_hash = xxhash_rust::xxh3::xxh3_64(info.name.as_bytes());
        r.info = info;
        Ok(())
    }

    /// Sets a replica's health. Leaving `Healthy` drops its tentative blocks:
    /// its view is being rebuilt and must not attract traffic to ghosts.
    pub fn set_health(&mut self, id: ReplicaId, health: Health) -> Result<(), RouterError> {
        self.replica_mut(id)?.health = health;
        if health != Health::Healthy {
            self.tentative.clear_replica(id);
        }
        Ok(())
    }

    /// The engine reported its metrics: kept for KV pressure and busy checks,
    /// and compared with the ledger.
    pub fn report(&mut self, id: ReplicaId, report: EngineReport) -> Result<(), RouterError> {
        self.replica_mut(id)?.report = Some(report);
        self.books.reconcile(id, &report);
        Ok(())
    }

    /// Local booking ids start after `base` instead of 0. A shell that runs
    /// several routers (one per model pool) gives each its own range, so a
    /// booking id names one router's booking, for peers too. Only before
    /// the first booking; later calls change nothing.
    pub fn set_booking_id_base(&mut self, base: u64) {
        self.books.set_id_base(base);
    }

    /// The engine reported its LoRA slots (`vllm:lora_requests_info`): the
    /// slot count (`max_lora`) and the adapters running or waiting there,
    /// which are in a slot or about to be. Until this is called for a
    /// replica, adapters cost nothing extra there.
    pub fn report_adapters(
        &mut self,
        id: ReplicaId,
        max_loras: u32,
        running_or_waiting: &[&str],
    ) -> Result<(), RouterError> {
        self.replica_mut(id)?;
        self.adapters.observe(id, max_loras, running_or_waiting);
        Ok(())
    }

    /// Reports taken before this are stale at `now` (`None`: none is).
    /// Computed once per decision: comparing instants is cheaper than
    /// subtracting them for every replica.
    pub(crate) fn stale_before(&self, now: Instant) -> Option<Instant> {
        now.checked_sub(Duration::from_millis(self.config.report_max_age_ms))
    }

    /// The engine's last report if it is fresh (`stale_before`).
    pub(crate) fn fresh_report(
        r: &RouterReplica,
        stale_before: Option<Instant>,
    ) -> Option<&EngineReport> {
        r.report.as_ref().filter(|rep| stale_before.is_none_or(|t| rep.at >= t))
    }

    /// The ledger's view of a replica's load and calibration.
    pub fn load(&self, id: ReplicaId) -> Option<LoadView> {
        self.books.view(id)
    }

    /// The ledger's lifetime counters.
    pub fn ledger_totals(&self) -> LedgerTotals {
        self.books.totals()
    }

    /// Bookings in flight (all origins).
    pub fn in_flight(&self) -> usize {
        self.books.in_flight()
    }

    /// `booking`'s first token arrived: its prefill is done. Returns the TTFT
    /// measured from booking, the first time only (it feeds calibration).
    pub fn first_token(&mut self, booking: Booking, now: Instant) -> Option<Duration> {
        self.books.first_token((Origin::Local, booking.id()), now, true)
    }

    /// `booking`'s prefill is presumed done but its first token was not
    /// observed (a whole, non-streamed response): it moves to decoding
    /// without feeding calibration.
    pub fn first_token_unmeasured(&mut self, booking: Booking, now: Instant) {
        self.books.first_token((Origin::Local, booking.id()), now, false);
    }

    /// `booking`'s request ended. A second call is counted as a late update.
    pub fn finish(&mut self, booking: Booking, outcome: Outcome) {
        self.books.release((Origin::Local, booking.id()), Release::Outcome(outcome));
    }

    /// `booking`'s request was dropped without an outcome (the shell's guard
    /// went away): released and counted as `dropped`.
    pub fn abandon(&mut self, booking: Booking) {
        self.books.release((Origin::Local, booking.id()), Release::Dropped);
    }

    /// Tentative-block counters.
    pub fn tentative_stats(&self) -> TentativeStats {
        self.tentative.stats()
    }

    /// Size of the `approx_prefix` memory: (tree nodes, replica slots seen).
    pub fn approx_memory(&self) -> (usize, usize) {
        (self.approx.node_count(), self.approx.tenant_bound())
    }

    /// The last decisions, oldest first.
    pub fn recent_decisions(&self) -> impl DoubleEndedIterator<Item = &Arc<Explanation>> {
        self.log.iter()
    }

    /// Periodic upkeep: expires stale bookings and tentative blocks. Decisions
    /// call it too; call it from a timer when traffic may stop.
    pub fn maintain(&mut self, now: Instant, index: Option<&kvgate_index::Index>) {
        self.books.sweep(now);
        self.tentative.expire(now, index);
    }

    /// Calls `listener` whenever a booking's load drops (first token, or it
    /// leaves the ledger by any path), so that a shell can wake requests
    /// waiting for a busy replica. It runs under the ledger's lock.
    pub fn on_load_change(&mut self, listener: crate::LoadListener) {
        self.books.set_listener(listener);
    }

    /// Starts (or stops) collecting local ledger changes, and the blocks
    /// each routed request will soon cache, for peers.
    pub fn share_with_peers(&mut self, enabled: bool) {
        self.books.set_outbox(enabled);
        self.tentative_outbox = enabled.then(Vec::new);
    }

    /// Moves the tentative blocks of local decisions made since the last
    /// call into `out` (replica, the prompt's blocks it will cache). Returns
    /// how many additions were dropped because nobody drained them.
    pub fn drain_tentative_changes(&mut self, out: &mut Vec<(ReplicaId, Vec<BlockKey>)>) -> u64 {
        if let Some(o) = &mut self.tentative_outbox {
            out.append(o);
        }
        self.tentative_outbox_dropped
    }

    /// Marks blocks a peer's request will soon cache on `replica`, as this
    /// router does for its own decisions, so that a burst split over
    /// instances finds the prefix where a peer just sent it.
    pub fn apply_peer_tentative(&mut self, replica: ReplicaId, keys: &[BlockKey], now: Instant) {
        if self.config.policy == crate::PolicyKind::KvAware && self.replica(replica).is_some() {
            self.tentative.add(replica, keys, now);
        }
    }

    /// Moves the local ledger changes made since the last call into `out`.
    /// Returns how many changes were dropped because nobody drained them.
    pub fn drain_ledger_changes(&mut self, out: &mut Vec<LedgerChange>) -> u64 {
        let books = &mut self.books;
        books.drain_changes(out);
        books.outbox_overflow()
    }

    /// Applies a booking change another ingress made. Replica ids must be
    /// mapped to this router's ids by the caller. Returns false for a change
    /// that no longer applies (already finished, unknown replica); such
    /// changes are counted as late updates, never an error.
    pub fn apply_peer(&mut self, peer: PeerId, change: &LedgerChange, now: Instant) -> bool {
        let books = &mut self.books;
        let origin = crate::ledger::Origin::Peer(peer);
        match *change {
            LedgerChange::Book { id, replica, prefill_tokens, blocks } => {
                books.book_peer(peer, id, replica, prefill_tokens, blocks, now)
            }
            LedgerChange::FirstToken { id } => {
                books.first_token((origin, id), now, false).is_some()
            }
            LedgerChange::Finish { id } => books.release(
                (origin, id),
                crate::ledger::Release::Outcome(crate::ledger::Outcome::Finished),
            ),
        }
    }

    /// Drops every booking a peer made (it went away); they are counted as
    /// `peer_gone`. Returns how many.
    pub fn forget_peer(&mut self, peer: PeerId) -> usize {
        self.books.forget_peer(peer)
    }
}
