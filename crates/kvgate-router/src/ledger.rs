//! The in-flight ledger: kvgate's own account of the load it (and its peers)
//! put on each replica, and the per-replica calibration fed by it.
//!
//! A request is booked at decision time with its uncached prefill tokens and
//! its KV blocks (prompt plus expected output). It moves to "decoding" at its
//! first token and leaves at finish, cancel or error, or as `dropped` when
//! the shell's guard is dropped without an outcome. Bookings whose completion never
//! arrives expire after a long timeout, and engine reports that persistently
//! disagree with the books correct them; both are counted, never silent.
//!
//! Conservation, checked by property tests: `booked - released == in flight`
//! for requests, and `booked prefill tokens - started - released while
//! pending == pending prefill tokens`.
//!
//! The books are plain state inside the [`Router`](crate::Router), changed
//! through its `&mut self` methods: no lock here. A [`Booking`] is a value
//! (which booking, on which replica); the shell that owns the router wraps it
//! in its own guard, whose drop reports [`Router::abandon`](crate::Router::abandon),
//! so that no code path can leak load.

use std::sync::Arc;
use std::time::{Duration, Instant};

use kvgate_index::ReplicaId;
use rustc_hash::FxHashMap;

use crate::adapters::AdapterId;
use crate::calibrate::{
    Calibrated, CalibrationSource, FleetCalibration, ReplicaCalibration, SampleBasis,
};
use crate::config::RouterConfig;
use crate::replica::EngineReport;

/// Who made a booking.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Origin {
    /// This ingress.
    Local,
    /// Another kvgate instance, by its peer id.
    Peer(PeerId),
}

/// A peer ingress's id (assigned by the transport).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PeerId(pub u32);

/// How a request ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The engine finished it.
    Finished,
    /// The client went away or the caller aborted it.
    Cancelled,
    /// The engine or the connection failed.
    Error,
}

/// Why a booking left the ledger, for the counters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Release {
    Outcome(Outcome),
    /// The guard was dropped without an outcome.
    Dropped,
    /// No news for `booking_timeout_ms`.
    Expired,
    /// Engine reports showed it gone.
    Reconciled,
    /// Its replica was removed.
    ReplicaRemoved,
    /// Its peer was forgotten or went silent.
    PeerGone,
}

/// Load on one replica as the ledger sees it (all origins).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReplicaLoad {
    /// Uncached prompt tokens of requests not yet at their first token.
    pub pending_prefill_tokens: u64,
    /// Requests not yet at their first token.
    pub prefill_requests: u32,
    /// Requests decoding.
    pub decoding_requests: u32,
    /// KV blocks the in-flight requests need (prompt + expected output).
    pub booked_blocks: u64,
}

impl ReplicaLoad {
    /// Requests in flight.
    pub fn requests(&self) -> u32 {
        self.prefill_requests + self.decoding_requests
    }
}

/// Lifetime counters of the ledger.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LedgerTotals {
    /// Bookings made (all origins).
    pub booked: u64,
    /// Bookings that reached their first token.
    pub first_tokens: u64,
    /// Released with an outcome: finished.
    pub finished: u64,
    /// Released with an outcome: cancelled.
    pub cancelled: u64,
    /// Released with an outcome: error.
    pub errored: u64,
    /// Released because the guard was dropped without an outcome.
    pub dropped: u64,
    /// Expired after `booking_timeout_ms` without completion.
    pub expired: u64,
    /// Released by reconciliation with engine reports.
    pub reconciled: u64,
    /// Released because their replica was removed.
    pub replica_removed: u64,
    /// Peer bookings aged out or forgotten.
    pub peer_gone: u64,
    /// Completions or first tokens for bookings no longer in the ledger.
    pub late_updates: u64,
    /// Prefill tokens booked.
    pub prefill_tokens_booked: u64,
    /// Prefill tokens whose request reached its first token.
    pub prefill_tokens_started: u64,
    /// Prefill tokens released before their first token.
    pub prefill_tokens_released: u64,
}

/// Totals of several routers (a gateway with several model pools).
impl std::ops::AddAssign for LedgerTotals {
    fn add_assign(&mut self, o: LedgerTotals) {
        let LedgerTotals {
            booked,
            first_tokens,
            finished,
            cancelled,
            errored,
            dropped,
            expired,
            reconciled,
            replica_removed,
            peer_gone,
            late_updates,
            prefill_tokens_booked,
            prefill_tokens_started,
            prefill_tokens_released,
        } = o;
        self.booked += booked;
        self.first_tokens += first_tokens;
        self.finished += finished;
        self.cancelled += cancelled;
        self.errored += errored;
        self.dropped += dropped;
        self.expired += expired;
        self.reconciled += reconciled;
        self.replica_removed += replica_removed;
        self.peer_gone += peer_gone;
        self.late_updates += late_updates;
        self.prefill_tokens_booked += prefill_tokens_booked;
        self.prefill_tokens_started += prefill_tokens_started;
        self.prefill_tokens_released += prefill_tokens_released;
    }
}

impl LedgerTotals {
    /// All releases, whatever the reason.
    pub fn released(&self) -> u64 {
        self.finished
            + self.cancelled
            + self.errored
            + self.dropped
            + self.expired
            + self.reconciled
            + self.replica_removed
            + self.peer_gone
    }
}

/// A ledger change for peers (issue: many ingresses).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum LedgerChange {
    /// A booking was made.
    Book {
        /// Booking id, unique per origin.
        id: u64,
        /// The replica.
        replica: ReplicaId,
        /// Uncached prefill tokens.
        prefill_tokens: u64,
        /// KV blocks booked.
        blocks: u64,
    },
    /// The booking reached its first token.
    FirstToken {
        /// Booking id.
        id: u64,
    },
    /// The booking left the ledger.
    Finish {
        /// Booking id.
        id: u64,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    Prefill,
    Decoding,
}

#[derive(Clone, Debug)]
struct Entry {
    replica: ReplicaId,
    stage: Stage,
    booked_at: Instant,
    last_news: Instant,
    prefill_tokens: u64,
    blocks: u64,
    basis: Option<SampleBasis>,
    /// Its LoRA adapter (local bookings only; peers do not say).
    adapter: Option<AdapterId>,
}

/// Reconciliation state of one replica.
#[derive(Clone, Copy, Debug, Default)]
struct Reconcile {
    over_streak: u32,
    under_streak: u32,
    /// Requests the engine runs that no ingress booked (persistent).
    external_requests: u32,
    external_waiting: u32,
    drift: i64,
}

#[derive(Clone, Debug)]
struct ReplicaBooks {
    load: ReplicaLoad,
    calibration: ReplicaCalibration,
    reconcile: Reconcile,
    /// Bookings in flight per adapter: which adapters hold the engine's
    /// batch slots (`adapters.rs`).
    adapters: Vec<(AdapterId, u32)>,
}

/// What one decision reads of one candidate (`Books::route_view`): its
/// books and the calibration it routes on.
pub(crate) struct RouteView<'a> {
    books: &'a ReplicaBooks,
    pub(crate) cal: Calibrated,
}

impl RouteView<'_> {
    pub(crate) fn load(&self) -> &ReplicaLoad {
        &self.books.load
    }

    /// Requests the engine runs beyond the ledger, and of those, waiting.
    pub(crate) fn external(&self) -> (u32, u32) {
        (self.books.reconcile.external_requests, self.books.reconcile.external_waiting)
    }

    /// Whether `adapter` has requests in flight here, and how many other
    /// adapters do (each holds one of the engine's batch slots).
    pub(crate) fn adapters_in_flight(&self, adapter: AdapterId) -> (bool, u32) {
        let a = &self.books.adapters;
        let has = a.iter().any(|&(x, _)| x == adapter);
        (has, a.len() as u32 - u32::from(has))
    }

    /// Seconds per block from CPU and from storage; read only for a
    /// candidate that would load blocks from them.
    pub(crate) fn transfer_s_per_block(&self) -> [f64; 2] {
        let c = &self.books.calibration;
        [c.cpu.estimate(), c.storage.estimate()]
    }
}

/// Per-replica view exported for decisions and explanations.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LoadView {
    /// The ledger's load.
    pub load: ReplicaLoad,
    /// Requests the engine runs beyond the ledger (persistent disagreement).
    pub external_requests: u32,
    /// Of those, waiting for prefill.
    pub external_waiting: u32,
    /// Ledger requests minus engine requests at the last report.
    pub drift: i64,
    /// Calibrated seconds per prefill token.
    pub prefill_s_per_token: f64,
    /// Calibrated fixed seconds of a request's first step.
    pub overhead_s: f64,
    /// Calibrated seconds per block loaded from CPU, and from storage.
    pub transfer_s_per_block: [f64; 2],
    /// Calibration samples taken.
    pub calibration_samples: u64,
    /// Where the prefill line comes from.
    pub calibration_source: CalibrationSource,
    /// Seconds of one decode step as the engine measured it (its mean
    /// inter-token latency); `None` until measured, when the configured
    /// `decode_step_ms` applies.
    pub decode_step_s: Option<f64>,
}

/// The ledger proper (inside the mutex).
#[derive(Debug)]
pub(crate) struct Books {
    config: RouterConfig,
    entries: FxHashMap<(Origin, u64), Entry>,
    replicas: Vec<Option<ReplicaBooks>>,
    /// Every replica's engine samples, pooled.
    fleet_calibration: FleetCalibration,
    next_id: u64,
    totals: LedgerTotals,
    /// Average uncached prefill tokens per booking (EWMA), to size load the
    /// engine reports but nobody booked.
    avg_prefill_tokens: f64,
    outbox: Vec<LedgerChange>,
    outbox_enabled: bool,
    outbox_overflow: u64,
    next_sweep: Option<Instant>,
    listener: Option<Listener>,
}

/// Called whenever a booking's load on its replica drops: its prefill is
/// done, or it left the ledger (any way: finished, dropped, expired, peer
/// gone...). The shell uses it to wake requests waiting for a busy replica;
/// it runs under the ledger's lock, so it must be quick and take no lock of
/// the router's.
pub type LoadListener = Arc<dyn Fn() + Send + Sync>;

struct Listener(LoadListener);

impl std::fmt::Debug for Listener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LoadListener")
    }
}

/// Most ledger changes buffered for peers between drains.
const OUTBOX_MAX: usize = 1 << 16;

impl Books {
    pub(crate) fn new(config: RouterConfig) -> Books {
        let c = &config.cost;
        let fleet_calibration = FleetCalibration::new(
            1.0 / c.prefill_tokens_per_s,
            c.step_overhead_ms / 1000.0,
            c.decode_step_ms / 1000.0,
            c.adapter_load_ms / 1000.0,
        );
        Books {
            fleet_calibration,
            config,
            entries: FxHashMap::default(),
            replicas: Vec::new(),
            next_id: 1,
            totals: LedgerTotals::default(),
            avg_prefill_tokens: 0.0,
            outbox: Vec::new(),
            outbox_enabled: false,
            outbox_overflow: 0,
            next_sweep: None,
            listener: None,
        }
    }

    pub(crate) fn set_outbox(&mut self, enabled: bool) {
        self.outbox_enabled = enabled;
        if !enabled {
            self.outbox.clear();
        }
    }

    pub(crate) fn add_replica(&mut self, id: ReplicaId) {
        let c = &self.config.cost;
        let cal = ReplicaCalibration::new(
            1.0 / c.prefill_tokens_per_s,
            c.step_overhead_ms / 1000.0,
            c.cpu_block_ms / 1000.0,
            c.storage_block_ms / 1000.0,
            c.decode_step_ms / 1000.0,
        );
        if self.replicas.len() <= id.index() {
            self.replicas.resize(id.index() + 1, None);
        }
        self.replicas[id.index()] = Some(ReplicaBooks {
            load: ReplicaLoad::default(),
            calibration: cal,
            reconcile: Reconcile::default(),
            adapters: Vec::new(),
        });
    }

    /// Releases every booking on `id` and forgets its calibration.
    pub(crate) fn remove_replica(&mut self, id: ReplicaId) {
        let keys: Vec<_> =
            self.entries.iter().filter(|(_, e)| e.replica == id).map(|(k, _)| *k).collect();
        for k in keys {
            self.release(k, Release::ReplicaRemoved);
        }
        if let Some(slot) = self.replicas.get_mut(id.index()) {
            *slot = None;
        }
    }

    pub(crate) fn totals(&self) -> LedgerTotals {
        self.totals
    }

    pub(crate) fn in_flight(&self) -> usize {
        self.entries.len()
    }

    pub(crate) fn outbox_overflow(&self) -> u64 {
        self.outbox_overflow
    }

    pub(crate) fn view(&self, id: ReplicaId) -> Option<LoadView> {
        let v = self.route_view(id, None)?;
        let (r, cal) = (v.books, v.cal);
        Some(LoadView {
            load: r.load,
            external_requests: r.reconcile.external_requests,
            external_waiting: r.reconcile.external_waiting,
            drift: r.reconcile.drift,
            prefill_s_per_token: cal.prefill_s_per_token,
            overhead_s: cal.overhead_s,
            transfer_s_per_block: v.transfer_s_per_block(),
            calibration_samples: r.calibration.samples(),
            calibration_source: cal.source,
            decode_step_s: cal.decode_step_s,
        })
    }

    /// Seconds a LoRA adapter load is expected to take (calibrated).
    pub(crate) fn adapter_load_s(&self) -> f64 {
        self.fleet_calibration.adapter_load_s()
    }

    /// The pooled calibration, when every replica routes on it
    /// (`FleetCalibration::pooled`).
    pub(crate) fn pooled_calibration(&self) -> Option<Calibrated> {
        self.fleet_calibration.pooled(&self.config.calibration)
    }

    /// The part of `view` a decision reads for every candidate, with the
    /// pooled calibration passed in when there is one (one lookup per
    /// decision instead of one per replica; large fleets pay per replica).
    pub(crate) fn route_view(
        &self,
        id: ReplicaId,
        pooled: Option<&Calibrated>,
    ) -> Option<RouteView<'_>> {
        let r = self.replicas.get(id.index())?.as_ref()?;
        let cal = match pooled {
            Some(c) => *c,
            None => r.calibration.calibrated(&self.fleet_calibration, &self.config.calibration),
        };
        Some(RouteView { books: r, cal })
    }

    pub(crate) fn avg_prefill_tokens(&self) -> f64 {
        self.avg_prefill_tokens
    }

    /// Local booking ids start after `base` (before any booking).
    pub(crate) fn set_id_base(&mut self, base: u64) {
        if self.totals.booked == 0 {
            self.next_id = base + 1;
        }
    }

    /// Books a local request; returns its id.
    pub(crate) fn book_local(
        &mut self,
        replica: ReplicaId,
        prefill_tokens: u64,
        blocks: u64,
        basis: Option<SampleBasis>,
        adapter: Option<AdapterId>,
        now: Instant,
    ) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        self.insert((Origin::Local, id), replica, prefill_tokens, blocks, (basis, adapter), now);
        self.push_change(LedgerChange::Book { id, replica, prefill_tokens, blocks });
        let a = 0.05;
        self.avg_prefill_tokens = if self.totals.booked == 1 {
            prefill_tokens as f64
        } else {
            (1.0 - a) * self.avg_prefill_tokens + a * prefill_tokens as f64
        };
        id
    }

    /// Books a peer's request (a repeated id refreshes nothing but its news).
    pub(crate) fn book_peer(
        &mut self,
        peer: PeerId,
        id: u64,
        replica: ReplicaId,
        prefill_tokens: u64,
        blocks: u64,
        now: Instant,
    ) -> bool {
        let key = (Origin::Peer(peer), id);
        if let Some(e) = self.entries.get_mut(&key) {
            e.last_news = now;
            return false;
        }
        if self.replicas.get(replica.index()).and_then(Option::as_ref).is_none() {
            return false;
        }
        self.insert(key, replica, prefill_tokens, blocks, (None, None), now);
        true
    }

    fn insert(
        &mut self,
        key: (Origin, u64),
        replica: ReplicaId,
        prefill_tokens: u64,
        blocks: u64,
        (basis, adapter): (Option<SampleBasis>, Option<AdapterId>),
        now: Instant,
    ) {
        if let Some(Some(r)) = self.replicas.get_mut(replica.index()) {
            if let Some(a) = adapter {
                match r.adapters.iter_mut().find(|(x, _)| *x == a) {
                    Some(e) => e.1 += 1,
                    None => r.adapters.push((a, 1)),
                }
            }
            if let Some(b) = &basis {
                r.calibration.note_booking(b.other_s);
            }
            r.load.pending_prefill_tokens += prefill_tokens;
            r.load.prefill_requests += 1;
            r.load.booked_blocks += blocks;
        }
        self.totals.booked += 1;
        self.totals.prefill_tokens_booked += prefill_tokens;
        self.entries.insert(
            key,
            Entry {
                replica,
                stage: Stage::Prefill,
                booked_at: now,
                last_news: now,
                prefill_tokens,
                blocks,
                basis,
                adapter,
            },
        );
    }

    /// Moves a booking to decoding; returns its TTFT when it was pending.
    pub(crate) fn first_token(
        &mut self,
        key: (Origin, u64),
        now: Instant,
        measured: bool,
    ) -> Option<Duration> {
        let Some(e) = self.entries.get_mut(&key) else {
            self.totals.late_updates += 1;
            return None;
        };
        e.last_news = now;
        if e.stage == Stage::Decoding {
            return None;
        }
        e.stage = Stage::Decoding;
        if let Some(l) = &self.listener {
            (l.0)();
        }
        let ttft = now.saturating_duration_since(e.booked_at);
        let (replica, tokens, basis) = (e.replica, e.prefill_tokens, e.basis);
        self.totals.first_tokens += 1;
        self.totals.prefill_tokens_started += tokens;
        let cal_cfg = self.config.calibration.clone();
        if let Some(Some(r)) = self.replicas.get_mut(replica.index()) {
            r.load.pending_prefill_tokens -= tokens;
            r.load.prefill_requests -= 1;
            r.load.decoding_requests += 1;
            if let Some(basis) = basis.filter(|_| measured) {
                let got = r.calibration.observe(&basis, ttft.as_secs_f64(), &cal_cfg);
                if let Some((x, y)) = got.line {
                    self.fleet_calibration.observe_ttft(x, y, &cal_cfg);
                }
                if let Some(s) = got.adapter_load_s {
                    self.fleet_calibration.observe_adapter_load(s, &cal_cfg);
                }
            }
        }
        if key.0 == Origin::Local {
            self.push_change(LedgerChange::FirstToken { id: key.1 });
        }
        Some(ttft)
    }

    /// Removes a booking; false when it was already gone (counted as late).
    pub(crate) fn release(&mut self, key: (Origin, u64), why: Release) -> bool {
        let Some(e) = self.entries.remove(&key) else {
            if matches!(why, Release::Outcome(_)) {
                self.totals.late_updates += 1;
            }
            return false;
        };
        if let Some(Some(r)) = self.replicas.get_mut(e.replica.index()) {
            match e.stage {
                Stage::Prefill => {
                    r.load.pending_prefill_tokens -= e.prefill_tokens;
                    r.load.prefill_requests -= 1;
                }
                Stage::Decoding => r.load.decoding_requests -= 1,
            }
            r.load.booked_blocks -= e.blocks;
            if let Some(at) = e.adapter.and_then(|a| r.adapters.iter().position(|(x, _)| *x == a)) {
                r.adapters[at].1 -= 1;
                if r.adapters[at].1 == 0 {
                    r.adapters.swap_remove(at);
                }
            }
        }
        if e.stage == Stage::Prefill {
            self.totals.prefill_tokens_released += e.prefill_tokens;
        }
        let t = &mut self.totals;
        match why {
            Release::Outcome(Outcome::Finished) => t.finished += 1,
            Release::Outcome(Outcome::Cancelled) => t.cancelled += 1,
            Release::Outcome(Outcome::Error) => t.errored += 1,
            Release::Dropped => t.dropped += 1,
            Release::Expired => t.expired += 1,
            Release::Reconciled => t.reconciled += 1,
            Release::ReplicaRemoved => t.replica_removed += 1,
            Release::PeerGone => t.peer_gone += 1,
        }
        if key.0 == Origin::Local {
            self.push_change(LedgerChange::Finish { id: key.1 });
        }
        if let Some(l) = &self.listener {
            (l.0)();
        }
        true
    }

    pub(crate) fn set_listener(&mut self, listener: LoadListener) {
        self.listener = Some(Listener(listener));
    }

    fn push_change(&mut self, c: LedgerChange) {
        if !self.outbox_enabled {
            return;
        }
        if self.outbox.len() >= OUTBOX_MAX {
            self.outbox_overflow += 1;
            return;
        }
        self.outbox.push(c);
    }

    pub(crate) fn drain_changes(&mut self, out: &mut Vec<LedgerChange>) {
        out.append(&mut self.outbox);
    }

    /// Releases every booking of `peer`; returns how many.
    pub(crate) fn forget_peer(&mut self, peer: PeerId) -> usize {
        let keys: Vec<_> =
            self.entries.keys().filter(|(o, _)| *o == Origin::Peer(peer)).copied().collect();
        for k in &keys {
            self.release(*k, Release::PeerGone);
        }
        keys.len()
    }

    /// Expires stale bookings, at most once per second of `now`.
    pub(crate) fn sweep(&mut self, now: Instant) {
        if self.next_sweep.is_some_and(|t| now < t) {
            return;
        }
        self.next_sweep = Some(now + Duration::from_secs(1));
        let local = Duration::from_millis(self.config.booking_timeout_ms);
        let peer = Duration::from_millis(self.config.peer_booking_timeout_ms);
        let stale: Vec<_> = self
            .entries
            .iter()
            .filter_map(|(k, e)| {
                let age = now.saturating_duration_since(e.last_news);
                match k.0 {
                    Origin::Local if age >= local => Some((*k, Release::Expired)),
                    Origin::Peer(_) if age >= peer => Some((*k, Release::PeerGone)),
                    _ => None,
                }
            })
            .collect();
        for (k, why) in stale {
            self.release(k, why);
        }
    }

    /// Compares the books with an engine report. A persistent surplus in the
    /// books releases the oldest bookings (their completions were lost); a
    /// persistent deficit is load someone else put there, added to the view.
    pub(crate) fn reconcile(&mut self, id: ReplicaId, report: &EngineReport) {
        let need = self.config.reconcile_reports.max(1);
        let Some(Some(r)) = self.replicas.get_mut(id.index()) else { return };
        if let Some(t) = &report.timing {
            let sample = r.calibration.observe_engine(t, &self.config.calibration);
            self.fleet_calibration.observe(&sample, &self.config.calibration);
        }
        let ledger = i64::from(r.load.requests());
        let engine = i64::from(report.running) + i64::from(report.waiting);
        let drift = ledger - engine;
        // Requests in transit (sent but not yet seen, finished but not yet
        // told) make small disagreements normal.
        let tolerance = 2 + engine / 10;
        let rc = &mut r.reconcile;
        rc.drift = drift;
        rc.over_streak = if drift > tolerance { rc.over_streak + 1 } else { 0 };
        rc.under_streak = if drift < -tolerance { rc.under_streak + 1 } else { 0 };
        if rc.under_streak >= need {
            let ext = (-drift) as u32;
            rc.external_requests = ext;
            rc.external_waiting = report.waiting.saturating_sub(r.load.prefill_requests).min(ext);
        } else if rc.under_streak == 0 {
            rc.external_requests = 0;
            rc.external_waiting = 0;
        }
        if rc.over_streak >= need {
            rc.over_streak = 0;
            let excess = (drift - tolerance).max(0) as usize;
            let mut mine: Vec<_> = self
                .entries
                .iter()
                .filter(|(_, e)| e.replica == id)
                .map(|(k, e)| (e.last_news, *k))
                .collect();
            mine.sort_unstable();
            for (_, k) in mine.into_iter().take(excess) {
                self.release(k, Release::Reconciled);
            }
        }
    }
}

/// A local booking: which one, and on which replica. A plain value; pass it
/// to [`Router::first_token`](crate::Router::first_token) when the engine's
/// first token arrives and to [`Router::finish`](crate::Router::finish) at the
/// end ([`Router::abandon`](crate::Router::abandon) when the request is
/// dropped without an outcome). Copying it does not copy the booking.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Booking {
    id: u64,
    replica: ReplicaId,
}

impl Booking {
    pub(crate) fn new(id: u64, replica: ReplicaId) -> Booking {
        Booking { id, replica }
    }

    /// The booking's id (unique within this router).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The replica it is booked on.
    pub fn replica(&self) -> ReplicaId {
        self.replica
    }
}
