//! The admission queue: strict priority bands first, VTC between tenants
//! within a band, first come first served within a tenant.
//!
//! The caller (the gateway's admission path) owns one queue per model pool
//! and serialises access to it; nothing here blocks, reads a clock or does
//! I/O. A request's life:
//!
//! ```text
//! enqueue ──▶ Rejection (429: queue full, in-flight limit, token rate)
//!    │
//!    ▼ Ticket
//! waiting ──▶ cancel (client gone)      ──▶ counted, tokens refunded
//!    │    ──▶ expire (band's TTL, 503)  ──▶ counted, tokens refunded
//!    ▼ next_dispatch (the caller's predicate says a replica can take it)
//! in flight ── on_output_tokens ──▶ finish (usage settles the charges)
//! ```
//!
//! `next_dispatch` is work-conserving: it asks the predicate about the head
//! of each band in order (the VTC pick of that band) and dispatches the
//! first the predicate accepts, so a band that cannot place its head never
//! holds back a band below it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rustc_hash::FxHashMap;

use crate::config::{TenantConfig, TenantsConfig};
use crate::counters::TenantCounters;
use crate::error::ConfigError;
use crate::ids::{BandId, RequestId, TenantId};
use crate::limits::{Reservation, SlotClock};
use crate::rejection::Rejection;
use crate::shards::{Exported, Peers, ShardSnapshot, ShardValues};
use crate::tenant::Tenant;
use crate::vtc::Vtc;

/// The `Retry-After` hint of an in-flight refusal: a slot frees as soon as
/// any of the tenant's requests finishes.
const IN_FLIGHT_RETRY_AFTER: Duration = Duration::from_secs(1);
/// The shortest `Retry-After` hint of a full queue.
const MIN_QUEUE_RETRY_AFTER: Duration = Duration::from_secs(1);
/// Weight of the latest wait in a band's running mean wait.
const WAIT_EWMA_ALPHA: f64 = 0.1;

/// A band's validated settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Band {
    /// The band's name.
    pub name: Arc<str>,
    /// The TTFT target the caller's dispatch predicate applies.
    pub ttft_target: Duration,
    /// The most requests that wait in the band.
    pub max_queue: usize,
    /// How long a request may wait in the band.
    pub queue_ttl: Duration,
}

/// A request offered to the queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Admit {
    /// Its tenant ([`AdmissionQueue::resolve`]).
    pub tenant: TenantId,
    /// The band it asks for ([`TenantsConfig::band_for_priority`]); never
    /// above its tenant's band (a higher one is lowered to the tenant's)
    /// unless `may_climb`. `None`: the tenant's band.
    pub band: Option<BandId>,
    /// Its band may be above its tenant's: a trusted front gateway (a key
    /// that names tenants) chose it.
    pub may_climb: bool,
    /// Prompt tokens, as kvgate counted them.
    pub input_tokens: u64,
    /// The most output tokens it may produce (its `max_tokens`, or an
    /// estimate): reserved against the tenant's token rate until it ends.
    pub max_output_tokens: u64,
}

/// An admitted request's receipt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ticket {
    /// The id every later call names.
    pub id: RequestId,
    /// Its tenant.
    pub tenant: TenantId,
    /// The band it waits in.
    pub band: BandId,
}

/// A waiting request as the queue sees it: the head a dispatch predicate
/// is asked about, and what a dispatch, an expiry or a cancel hands back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueuedRequest {
    /// The request.
    pub id: RequestId,
    /// Its tenant.
    pub tenant: TenantId,
    /// Its band.
    pub band: BandId,
    /// Its prompt tokens.
    pub input_tokens: u64,
    /// How long it has waited (for the wait-time histogram).
    pub waited: Duration,
}

/// A request that waited too long, to be answered 503 with the rejection's
/// message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Expired {
    /// The request.
    pub request: QueuedRequest,
    /// Always [`Rejection::Expired`].
    pub rejection: Rejection,
}

/// What `cancel` did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cancelled {
    /// It was waiting and has left the queue.
    Left(QueuedRequest),
    /// It was already dispatched; it is finished as if the engine had
    /// stopped with the output reported so far.
    Finished(Finished),
    /// No request has that id (already answered).
    Unknown,
}

/// The engine's final count of a request's tokens.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// Prompt tokens.
    pub input_tokens: u64,
    /// Generated tokens.
    pub output_tokens: u64,
}

/// A dispatched request that ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Finished {
    /// The request.
    pub id: RequestId,
    /// Its tenant.
    pub tenant: TenantId,
    /// Its band.
    pub band: BandId,
    /// The tokens it was charged for, settled.
    pub usage: Usage,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Waiting,
    Dispatched { output_seen: u64 },
}

#[derive(Clone, Copy, Debug)]
struct Request {
    tenant: TenantId,
    band: BandId,
    input_tokens: u64,
    max_output_tokens: u64,
    enqueued_at: Instant,
    reservation: Option<Reservation>,
    state: State,
}

#[derive(Clone, Debug)]
struct BandState {
    band: Band,
    depth: usize,
    /// (deadline, id) in admission order; entries of requests that already
    /// left are skipped.
    deadlines: std::collections::VecDeque<(Instant, RequestId)>,
    mean_wait_s: f64,
}

/// The admission queue of one pool. See the module docs.
#[derive(Debug)]
pub struct AdmissionQueue {
    bands: Vec<BandState>,
    default_tenant: TenantId,
    default_config: TenantConfig,
    max_tenants: usize,
    names: FxHashMap<String, TenantId>,
    tenants: Vec<Tenant>,
    vtc: Vtc,
    requests: FxHashMap<RequestId, Request>,
    next_id: u64,
    unknown_ids: u64,
    defer_to_peers: bool,
    deferred_to_peers: u64,
    clock: SlotClock,
    identity: (String, u64),
    peers: Peers,
    exported: Exported,
}

impl AdmissionQueue {
    /// A queue for the validated configuration; `now` starts its token
    /// windows.
    pub fn new(config: &TenantsConfig, now: Instant) -> Result<Self, ConfigError> {
        config.validate()?;
        let n_bands = config.bands.len();
        let bands = config
            .bands
            .iter()
            .map(|b| BandState {
                band: Band {
                    name: b.name.as_str().into(),
                    ttft_target: Duration::from_millis(b.ttft_target_ms),
                    max_queue: b.max_queue,
                    queue_ttl: Duration::from_millis(b.queue_ttl_ms),
                },
                depth: 0,
                deadlines: Default::default(),
                mean_wait_s: 0.0,
            })
            .collect();
        let band_named = |name: Option<&str>, or: BandId| {
            name.and_then(|n| config.band_index(n)).map_or(or, |index| BandId(index as u8))
        };
        let default_band = band_named(config.default_band.as_deref(), BandId(0));
        let default_config = config.default_tenant_config();
        let mut queue = Self {
            bands,
            default_tenant: TenantId(0),
            default_config: default_config.clone(),
            max_tenants: config.max_tenants,
            names: FxHashMap::default(),
            tenants: Vec::new(),
            vtc: Vtc::new(config.input_weight, config.output_weight, n_bands),
            requests: FxHashMap::default(),
            next_id: 0,
            unknown_ids: 0,
            defer_to_peers: config.defer_to_peers,
            deferred_to_peers: 0,
            clock: SlotClock::new(now),
            identity: ("local".to_owned(), 0),
            peers: Peers::default(),
            exported: Exported::default(),
        };
        let band = band_named(default_config.band.as_deref(), default_band);
        queue.default_tenant =
            queue.add_tenant(config.default_tenant.clone(), &default_config, band);
        for (name, tenant) in &config.tenants {
            if *name != config.default_tenant {
                let band = band_named(tenant.band.as_deref(), default_band);
                queue.add_tenant(name.clone(), tenant, band);
            }
        }
        Ok(queue)
    }

    /// Names this instance in the shards it exports: its name among the
    /// instances, and a number that changes with every start.
    pub fn with_identity(mut self, instance: impl Into<String>, incarnation: u64) -> Self {
        self.identity = (instance.into(), incarnation);
        self
    }

    fn add_tenant(&mut self, name: String, config: &TenantConfig, band: BandId) -> TenantId {
        let id = TenantId(self.tenants.len() as u32);
        let tenant = Tenant::new(name.clone(), config, band, self.bands.len());
        self.vtc.add_tenant(tenant.weight, band);
        self.tenants.push(tenant);
        self.names.insert(name, id);
        self.pull_peer_values(id);
        id
    }

    /// The tenant a request belongs to: the named one, a new one with the
    /// default tenant's settings while there is room, or the default tenant
    /// (no name, or `max_tenants` reached).
    pub fn resolve(&mut self, name: Option<&str>) -> TenantId {
        let Some(name) = name else {
            return self.default_tenant;
        };
        if let Some(&id) = self.names.get(name) {
            return id;
        }
        if self.tenants.len() >= self.max_tenants {
            return self.default_tenant;
        }
        let config = self.default_config.clone();
        let band = self.tenants[self.default_tenant.index()].band;
        self.add_tenant(name.to_owned(), &config, band)
    }

    /// The id of a tenant the queue knows.
    pub fn tenant_id(&self, name: &str) -> Option<TenantId> {
        self.names.get(name).copied()
    }

    /// A tenant's name.
    pub fn tenant_name(&self, tenant: TenantId) -> &str {
        &self.tenants[tenant.index()].name
    }

    /// A tenant's band (the highest its requests may use).
    pub fn tenant_band(&self, tenant: TenantId) -> BandId {
        self.tenants[tenant.index()].band
    }

    /// How many tenants the queue knows.
    pub fn tenant_count(&self) -> usize {
        self.tenants.len()
    }

    /// The bands, highest first.
    pub fn bands(&self) -> impl ExactSizeIterator<Item = &Band> {
        self.bands.iter().map(|b| &b.band)
    }

    /// A band's settings.
    pub fn band(&self, band: BandId) -> &Band {
        &self.bands[band.index()].band
    }

    /// The id of a band by name.
    pub fn band_id(&self, name: &str) -> Option<BandId> {
        let index = self.bands.iter().position(|b| &*b.band.name == name)?;
        Some(BandId(index as u8))
    }

    /// Offers a request. Admitted, it waits for `next_dispatch`; refused,
    /// the rejection says why and when to retry. Tenant limits are checked
    /// before the band's queue length.
    pub fn enqueue(&mut self, admit: Admit, now: Instant) -> Result<Ticket, Rejection> {
        let tenant_id = admit.tenant;
        let last_band = self.bands.len() - 1;
        let tenant = &mut self.tenants[tenant_id.index()];
        let band = match admit.band {
            Some(b) if admit.may_climb => b,
            Some(b) => b.max(tenant.band),
            None => tenant.band,
        };
        let band = BandId(band.0.min(last_band as u8));
        tenant.counters.arrived += 1;
        let tokens = admit.input_tokens.saturating_add(admit.max_output_tokens);
        if let Err(rejection) = self.check(tenant_id, band, tokens, now) {
            let counters = &mut self.tenants[tenant_id.index()].counters;
            counters.rejected.count(rejection.reason());
            return Err(rejection);
        }
        let tenant = &mut self.tenants[tenant_id.index()];
        let reservation = tenant.tokens_per_minute.map(|_| {
            let slot = self.clock.slot(now);
            tenant.window.add(slot, tokens);
            Reservation { slot, tokens }
        });
        let id = RequestId(self.next_id);
        self.next_id += 1;
        self.requests.insert(
            id,
            Request {
                tenant: tenant_id,
                band,
                input_tokens: admit.input_tokens,
                max_output_tokens: admit.max_output_tokens,
                enqueued_at: now,
                reservation,
                state: State::Waiting,
            },
        );
        let fifo = &mut tenant.fifos[band.index()];
        let was_idle = fifo.is_empty();
        fifo.push(id);
        tenant.counters.queued += 1;
        tenant.counters.queue_depth += 1;
        if was_idle {
            self.vtc.backlog(tenant_id, band);
        }
        let b = &mut self.bands[band.index()];
        b.depth += 1;
        b.deadlines.push_back((now + b.band.queue_ttl, id));
        Ok(Ticket { id, tenant: tenant_id, band })
    }

    fn check(
        &self,
        tenant_id: TenantId,
        band: BandId,
        tokens: u64,
        now: Instant,
    ) -> Result<(), Rejection> {
        let tenant = &self.tenants[tenant_id.index()];
        if let Some(max) = tenant.max_in_flight {
            if tenant.admitted_unfinished() >= u64::from(max) {
                return Err(Rejection::InFlightLimit {
                    max_in_flight: max,
                    retry_after: IN_FLIGHT_RETRY_AFTER,
                });
            }
        }
        if let Some(limit) = tenant.tokens_per_minute {
            if let Err(refused) =
                tenant.window.admit(&self.clock, now, limit, tenant.peer_tokens, tokens)
            {
                return Err(Rejection::TokenRate {
                    tokens_per_minute: limit,
                    used: refused.used,
                    requested: tokens,
                    retry_after: refused.retry_after,
                });
            }
        }
        let b = &self.bands[band.index()];
        if b.depth >= b.band.max_queue {
            let mean_wait = Duration::from_secs_f64(b.mean_wait_s);
            return Err(Rejection::QueueFull {
                band: b.band.name.clone(),
                max_queue: b.band.max_queue,
                retry_after: mean_wait
                    .clamp(MIN_QUEUE_RETRY_AFTER, b.band.queue_ttl.max(MIN_QUEUE_RETRY_AFTER)),
            });
        }
        Ok(())
    }

    /// Dispatches the next request: in band order, the band's VTC pick
    /// (its oldest request), if `can_take` accepts it; a band whose head is
    /// refused is passed over for the bands below. `None` when nothing
    /// waiting can be taken.
    ///
    /// With peers, one more rule: when a tenant waiting on a peer is behind
    /// the pick by more than twice the pick's cost, this instance leaves the
    /// capacity to that peer and dispatches nothing now (counted in
    /// [`deferred_to_peers`](Self::deferred_to_peers)); call again after the
    /// next merge. `defer_to_peers = false` turns the rule off.
    pub fn next_dispatch(
        &mut self,
        now: Instant,
        mut can_take: impl FnMut(&QueuedRequest) -> bool,
    ) -> Option<QueuedRequest> {
        for index in 0..self.bands.len() {
            let band = BandId(index as u8);
            let Some(head) = self.head(band, now) else {
                continue;
            };
            if !can_take(&head) {
                continue;
            }
            if self.defer_to_peers && self.peer_is_behind(head) {
                self.deferred_to_peers += 1;
                return None;
            }
            self.dispatch(head);
            return Some(head);
        }
        None
    }

    fn peer_is_behind(&self, head: QueuedRequest) -> bool {
        if self.peers.len() == 0 {
            return false;
        }
        let max_output = self.requests.get(&head.id).map_or(0, |r| r.max_output_tokens);
        let slack = 2.0 * self.vtc.cost(head.tenant, head.input_tokens, max_output);
        self.vtc.peer_is_behind(head.band, head.tenant, slack)
    }

    /// Dispatches `next_dispatch` left to a peer.
    pub fn deferred_to_peers(&self) -> u64 {
        self.deferred_to_peers
    }

    /// The request `next_dispatch` would offer from a band.
    pub fn head(&mut self, band: BandId, now: Instant) -> Option<QueuedRequest> {
        let tenant_id = self.vtc.pick(band)?;
        let requests = &self.requests;
        let fifo = &mut self.tenants[tenant_id.index()].fifos[band.index()];
        let id = fifo.front(|id| is_waiting(requests, id))?;
        let request = &requests[&id];
        Some(QueuedRequest {
            id,
            tenant: tenant_id,
            band,
            input_tokens: request.input_tokens,
            waited: now.saturating_duration_since(request.enqueued_at),
        })
    }

    fn dispatch(&mut self, head: QueuedRequest) {
        let tenant = &mut self.tenants[head.tenant.index()];
        let fifo = &mut tenant.fifos[head.band.index()];
        fifo.pop_front();
        let now_idle = fifo.is_empty();
        if let Some(request) = self.requests.get_mut(&head.id) {
            request.state = State::Dispatched { output_seen: 0 };
        }
        let counters = &mut tenant.counters;
        counters.dispatched += 1;
        counters.queue_depth -= 1;
        counters.in_flight += 1;
        counters.input_tokens_served += head.input_tokens;
        self.vtc.charge_input(head.tenant, head.input_tokens as f64);
        if now_idle {
            self.vtc.idle(head.tenant, head.band);
        }
        let b = &mut self.bands[head.band.index()];
        b.depth -= 1;
        let waited = head.waited.as_secs_f64();
        b.mean_wait_s += WAIT_EWMA_ALPHA * (waited - b.mean_wait_s);
        // Entries of requests that already left sit in front of the
        // deadlines most of the time (dispatch is roughly in arrival
        // order): drop them here, so the list stays about as long as the
        // queue.
        while let Some(&(_, id)) = b.deadlines.front() {
            if is_waiting(&self.requests, id) {
                break;
            }
            b.deadlines.pop_front();
        }
    }

    /// A waiting request leaves without being served: out of its tenant's
    /// queue and its band, its reserved tokens refunded.
    fn leave_queue(&mut self, id: RequestId, request: Request, now: Instant) -> QueuedRequest {
        let requests = &self.requests;
        let tenant = &mut self.tenants[request.tenant.index()];
        let fifo = &mut tenant.fifos[request.band.index()];
        fifo.leave(|id| is_waiting(requests, id));
        let now_idle = fifo.is_empty();
        tenant.counters.queue_depth -= 1;
        if let Some(reservation) = request.reservation {
            tenant.window.refund(reservation.slot, self.clock.slot(now), reservation.tokens);
        }
        if now_idle {
            self.vtc.idle(request.tenant, request.band);
        }
        self.bands[request.band.index()].depth -= 1;
        QueuedRequest {
            id,
            tenant: request.tenant,
            band: request.band,
            input_tokens: request.input_tokens,
            waited: now.saturating_duration_since(request.enqueued_at),
        }
    }

    /// The client went away: a waiting request leaves at once; a
    /// dispatched one is finished with the output reported so far.
    pub fn cancel(&mut self, id: RequestId, now: Instant) -> Cancelled {
        match self.requests.get(&id).map(|r| r.state) {
            None => {
                self.unknown_ids += 1;
                Cancelled::Unknown
            }
            Some(State::Waiting) => {
                let Some(request) = self.requests.remove(&id) else {
                    return Cancelled::Unknown;
                };
                let left = self.leave_queue(id, request, now);
                self.tenants[request.tenant.index()].counters.cancelled += 1;
                Cancelled::Left(left)
            }
            Some(State::Dispatched { .. }) => match self.finish(id, None, now) {
                Some(finished) => Cancelled::Finished(finished),
                None => Cancelled::Unknown,
            },
        }
    }

    /// Removes every request whose band's TTL has passed; the caller
    /// answers each 503 with its rejection.
    pub fn expire(&mut self, now: Instant) -> Vec<Expired> {
        let mut expired = Vec::new();
        for index in 0..self.bands.len() {
            while let Some(&(deadline, id)) = self.bands[index].deadlines.front() {
                if deadline > now {
                    break;
                }
                self.bands[index].deadlines.pop_front();
                if !is_waiting(&self.requests, id) {
                    continue;
                }
                let Some(request) = self.requests.remove(&id) else {
                    continue;
                };
                let left = self.leave_queue(id, request, now);
                self.tenants[request.tenant.index()].counters.expired += 1;
                let band = &self.bands[index].band;
                expired.push(Expired {
                    request: left,
                    rejection: Rejection::Expired {
                        band: band.name.clone(),
                        waited: left.waited,
                        queue_ttl: band.queue_ttl,
                    },
                });
            }
        }
        expired
    }

    /// When `expire` next has work (possibly a little early): the caller's
    /// timer.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.bands.iter().filter_map(|b| b.deadlines.front().map(|&(deadline, _)| deadline)).min()
    }

    /// The engine produced `n` more output tokens for a dispatched request:
    /// its tenant is charged as they come.
    pub fn on_output_tokens(&mut self, id: RequestId, n: u64) {
        let Some(request) = self.requests.get_mut(&id) else {
            self.unknown_ids += 1;
            return;
        };
        let State::Dispatched { output_seen } = &mut request.state else {
            self.unknown_ids += 1;
            return;
        };
        *output_seen += n;
        let tenant = request.tenant;
        self.tenants[tenant.index()].counters.output_tokens_served += n;
        self.vtc.charge_output(tenant, n as f64);
    }

    /// A dispatched request ended. With the engine's `usage`, the charges
    /// and the token reservation are settled to it; without (the stream
    /// broke), to the prompt and the output reported so far. A waiting
    /// request named here is cancelled instead.
    pub fn finish(
        &mut self,
        id: RequestId,
        usage: Option<Usage>,
        now: Instant,
    ) -> Option<Finished> {
        let Some(request) = self.requests.get(&id).copied() else {
            self.unknown_ids += 1;
            return None;
        };
        let State::Dispatched { output_seen } = request.state else {
            self.cancel(id, now);
            return None;
        };
        self.requests.remove(&id);
        let usage = usage
            .unwrap_or(Usage { input_tokens: request.input_tokens, output_tokens: output_seen });
        let tenant_id = request.tenant;
        let input_delta = usage.input_tokens as f64 - request.input_tokens as f64;
        let output_delta = usage.output_tokens as f64 - output_seen as f64;
        self.vtc.charge_input(tenant_id, input_delta);
        self.vtc.charge_output(tenant_id, output_delta);
        let tenant = &mut self.tenants[tenant_id.index()];
        let counters = &mut tenant.counters;
        counters.input_tokens_served =
            settle(counters.input_tokens_served, request.input_tokens, usage.input_tokens);
        counters.output_tokens_served =
            settle(counters.output_tokens_served, output_seen, usage.output_tokens);
        counters.finished += 1;
        counters.in_flight -= 1;
        if let Some(reservation) = request.reservation {
            let actual = usage.input_tokens.saturating_add(usage.output_tokens);
            tenant.window.settle(reservation, actual, self.clock.slot(now));
        }
        Some(Finished { id, tenant: tenant_id, band: request.band, usage })
    }

    /// A tenant's counters.
    pub fn counters(&self, tenant: TenantId) -> &TenantCounters {
        &self.tenants[tenant.index()].counters
    }

    /// Every tenant's counters, with its id and name.
    pub fn all_counters(&self) -> impl Iterator<Item = (TenantId, &str, &TenantCounters)> {
        self.tenants
            .iter()
            .enumerate()
            .map(|(i, t)| (TenantId(i as u32), t.name.as_str(), &t.counters))
    }

    /// All tenants' counters added up.
    pub fn totals(&self) -> TenantCounters {
        let mut totals = TenantCounters::default();
        for tenant in &self.tenants {
            totals += &tenant.counters;
        }
        totals
    }

    /// Calls naming a request the queue does not hold (already answered).
    pub fn unknown_ids(&self) -> u64 {
        self.unknown_ids
    }

    /// Requests waiting in a band.
    pub fn band_depth(&self, band: BandId) -> usize {
        self.bands[band.index()].depth
    }

    /// Requests waiting in every band.
    pub fn waiting(&self) -> usize {
        self.bands.iter().map(|b| b.depth).sum()
    }

    /// Tenants with a request waiting in a band.
    pub fn backlogged_tenants(&self, band: BandId) -> usize {
        self.vtc.backlogged_len(band)
    }

    /// A tenant's fleet-wide virtual counter: the weighted service that
    /// orders dispatch within a band.
    pub fn virtual_counter(&self, tenant: TenantId) -> f64 {
        self.vtc.counter(tenant)
    }

    /// The weighted cost the counters charge for a request of this size.
    pub fn cost(&self, tenant: TenantId, input_tokens: u64, output_tokens: u64) -> f64 {
        self.vtc.cost(tenant, input_tokens, output_tokens)
    }

    /// This instance's shard for its peers: every tenant with anything to
    /// say when `full`, else only the tenants whose values changed since
    /// the last export. Send a full one at start and now and then, deltas
    /// in between.
    pub fn export_shard(&mut self, full: bool, now: Instant) -> ShardSnapshot {
        let slot = self.clock.slot(now);
        let (vtc, tenants) = (&self.vtc, &self.tenants);
        let rows = tenants.iter().enumerate().map(|(i, t)| {
            let (service, lift) = vtc.own(TenantId(i as u32));
            let window_tokens = match t.tokens_per_minute {
                Some(_) => t.window.used(slot),
                None => 0,
            };
            let values =
                ShardValues { service, lift, window_tokens, waiting: t.counters.queue_depth };
            (t.name.as_str(), values)
        });
        self.exported.next((&self.identity.0, self.identity.1), full, rows)
    }

    /// Adds a peer's shard to the fleet-wide counters (this instance's own
    /// snapshots are ignored). Returns how many known tenants changed.
    pub fn merge_shard(&mut self, snapshot: &ShardSnapshot) -> usize {
        if snapshot.instance == self.identity.0 {
            return 0;
        }
        let changed = self.peers.apply(snapshot);
        self.pull_peer_names(&changed)
    }

    /// A peer left: its shard no longer counts.
    pub fn forget_peer(&mut self, instance: &str) -> usize {
        let changed = self.peers.forget(instance);
        self.pull_peer_names(&changed)
    }

    /// How many peers' shards are merged.
    pub fn peer_count(&self) -> usize {
        self.peers.len()
    }

    fn pull_peer_names(&mut self, names: &[String]) -> usize {
        let mut n = 0;
        for name in names {
            if let Some(&id) = self.names.get(name) {
                self.pull_peer_values(id);
                n += 1;
            }
        }
        n
    }

    fn pull_peer_values(&mut self, tenant: TenantId) {
        let t = &mut self.tenants[tenant.index()];
        let sums = self.peers.sums(&t.name);
        t.peer_tokens = sums.window_tokens;
        self.vtc.set_peer(tenant, sums.service, sums.lift, sums.waiting > 0);
    }
}

fn is_waiting(requests: &FxHashMap<RequestId, Request>, id: RequestId) -> bool {
    requests.get(&id).is_some_and(|r| r.state == State::Waiting)
}

/// A served-token counter moved from the count it holds for a request to
/// the engine's.
fn settle(total: u64, counted: u64, actual: u64) -> u64 {
    if actual >= counted {
        total.saturating_add(actual - counted)
    } else {
        total.saturating_sub(counted - actual)
    }
}
