//! One pool's tenant admission queue in the shell: `kvgate-tenants`'
//! sans-IO [`AdmissionQueue`] behind a mutex, with what its owner adds:
//! the waiting requests' wake-ups, expiries handed to the requests they
//! end, strict band order between band heads that route themselves, and
//! the guard ([`TenantTicket`]) that gives a request's place back however
//! it ends.
//!
//! Every request of a pool with tenants is offered to the queue
//! (`enqueue`: admitted, or refused by a tenant or band limit). An admitted
//! request waits until it is its band's VTC pick and no band above holds a
//! head that could still go; then it asks the router itself, under the
//! queue's lock ([`TenantQueue::step`]), so the pick and its decision are
//! one step. Routed, it is dispatched; told to wait (every replica busy),
//! its band is marked blocked until the next load change, which lets the
//! heads of lower bands try. Lock order: this queue's lock, then the fleet
//! lock (inside `route`); the router's load listener only touches atomics
//! and `Notify`s, so it never takes this lock under the fleet's.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kvgate_tenants::{
    AdmissionQueue, Admit, BandId, ConfigError, PriorityError, Rejection, RequestId,
    TenantCounters, TenantsConfig, Usage,
};
use tokio::sync::Notify;

use crate::locks::lock;

/// A pool's tenant queue. See the module docs.
#[derive(Debug)]
pub(crate) struct TenantQueue {
    inner: Mutex<Inner>,
    /// Woken when the heads may have changed: a dispatch, a request
    /// leaving or expiring, a band found blocked.
    turn: Notify,
    /// Woken on a load change (a first token, a booking's end).
    load: Notify,
    /// Load changes so far: a band blocked at an older count may go now.
    epoch: AtomicU64,
    /// Requests waiting, readable without the lock (written under it).
    waiting: AtomicUsize,
    /// How the last routed requests left the queue, by booking id, for the
    /// decision log (`decision_json.rs`); its own lock, taken alone.
    notes: Mutex<VecDeque<(u64, Dispatched)>>,
    /// The configuration: which band a request's `priority` chooses, and
    /// each band's engine priority.
    config: TenantsConfig,
}

/// A request offered to the queue.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Offer<'a> {
    /// Its tenant (`None`: the default tenant).
    pub(crate) tenant: Option<&'a str>,
    /// Its client key names tenants (a trusted front gateway): its
    /// `priority` may choose a band above its tenant's.
    pub(crate) trusted: bool,
    /// The client's vLLM `priority`.
    pub(crate) priority: Option<i64>,
    /// Prompt tokens.
    pub(crate) input_tokens: u64,
    /// Output tokens reserved (`max_tokens`).
    pub(crate) max_output_tokens: u64,
}

/// Why the queue did not admit a request.
#[derive(Debug)]
pub(crate) enum Refused {
    /// Its `priority` chooses no band (400).
    Priority(PriorityError),
    /// A tenant or band limit (429).
    Limit(Rejection),
}

/// Notes kept for the decision log: more than it shows (`router.explain_last`
/// is 64 by default, the dashboard's list at most 200).
const NOTES: usize = 256;

#[derive(Debug)]
struct Inner {
    queue: AdmissionQueue,
    /// Per band, the load epoch at which its head last found every replica
    /// busy: until the next load change, the bands below may go first.
    blocked: Vec<Option<u64>>,
    /// Requests the queue expired, until their own tasks read it.
    expired: HashMap<RequestId, Rejection>,
}

/// Why a head may not ask the router yet, or what it got.
#[derive(Debug)]
enum Step<T> {
    /// Another request is its band's pick (its tenant is further ahead in
    /// service, or it is behind its own tenant's older requests).
    NotHead,
    /// A band above holds a head that has not found every replica busy.
    HigherBand,
    /// The request waited its band's TTL: answer 503 with this.
    Expired(Rejection),
    /// The router's decision: dispatched (`Some` wait, the time it waited)
    /// unless the caller's verdict was to wait or leave.
    Decided(T, Option<Dispatched>),
}

/// A request taken from the queue to an engine.
#[derive(Debug, Clone)]
pub(crate) struct Dispatched {
    /// Its tenant's name.
    pub(crate) tenant: String,
    /// How long it waited in the queue.
    pub(crate) waited: Duration,
    /// The strongest reason it waited, if it did.
    pub(crate) why: Waited,
}

/// Why a request waited in the tenant queue, weakest first (the decision
/// log and the request's span say the strongest it met).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Waited {
    /// It did not wait.
    Not,
    /// Other tenants' turns came first (VTC), or its tenant's older requests.
    FairShare,
    /// A higher priority band's head could still go.
    HigherBand,
    /// Every replica was busy (the router's admission rules).
    Busy,
}

impl Waited {
    /// The label in logs and spans.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Waited::Not => "none",
            Waited::FairShare => "fair_share",
            Waited::HigherBand => "higher_band",
            Waited::Busy => "busy",
        }
    }
}

/// What the caller's decision means for the queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Routed: dispatch it.
    Dispatch,
    /// Every replica busy: it stays, its band blocked until load changes;
    /// it asks again after this long at the latest.
    Wait(Duration),
    /// Refused by the router: it leaves the queue.
    Leave,
}

/// One tenant's counters, named, for the metrics snapshot.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct TenantRow {
    pub(crate) tenant: String,
    pub(crate) counters: TenantCounters,
}

/// A request's place in the queue: waiting, then dispatched. Dropped before
/// [`TenantTicket::finish`] (the client went away, an error), a waiting
/// request leaves the queue at once and a dispatched one is finished with
/// the output counted so far.
#[derive(Debug)]
pub(crate) struct TenantTicket {
    queue: Arc<TenantQueue>,
    pub(crate) id: RequestId,
    pub(crate) band: BandId,
    /// The `priority` engines with priority scheduling are sent: the
    /// client's when it chose the band the request waits in, else the
    /// band's ([`TenantsConfig::band_priority`]).
    pub(crate) engine_priority: i64,
    /// When its band's TTL runs out.
    pub(crate) deadline: Instant,
    /// Taken from the queue to an engine.
    pub(crate) dispatched: bool,
    done: bool,
}

impl TenantQueue {
    /// A queue for `config` (validated by the configuration already; a
    /// refusal here is reported at start-up).
    pub(crate) fn new(config: &TenantsConfig, now: Instant) -> Result<TenantQueue, ConfigError> {
        let queue = AdmissionQueue::new(config, now)?;
        let bands = queue.bands().len();
        Ok(TenantQueue {
            inner: Mutex::new(Inner { blocked: vec![None; bands], queue, expired: HashMap::new() }),
            turn: Notify::new(),
            load: Notify::new(),
            epoch: AtomicU64::new(0),
            waiting: AtomicUsize::new(0),
            notes: Mutex::new(VecDeque::with_capacity(NOTES)),
            config: config.clone(),
        })
    }

    /// Requests waiting now.
    pub(crate) fn len(&self) -> usize {
        self.waiting.load(Ordering::Relaxed)
    }

    /// Load changed (the router's load listener): blocked bands may go.
    /// Costs one atomic load when nobody waits.
    pub(crate) fn load_changed(&self) {
        if self.len() > 0 {
            self.epoch.fetch_add(1, Ordering::Relaxed);
            self.load.notify_waiters();
        }
    }

    /// Offers a request. Its `priority` chooses its band (lowered to its
    /// tenant's band unless `trusted`); none, its tenant's band.
    pub(crate) fn enqueue(
        self: &Arc<Self>,
        offer: Offer<'_>,
        now: Instant,
    ) -> Result<TenantTicket, Refused> {
        let asked = match offer.priority {
            Some(p) => self.config.band_for_priority(p).map_err(Refused::Priority)?,
            None => None,
        };
        let band = asked.map(|b| BandId(b as u8));
        let mut inner = lock(&self.inner);
        let tenant = inner.queue.resolve(offer.tenant);
        let admit = Admit {
            tenant,
            band,
            may_climb: offer.trusted,
            input_tokens: offer.input_tokens,
            max_output_tokens: offer.max_output_tokens,
        };
        let ticket = inner.queue.enqueue(admit, now).map_err(Refused::Limit)?;
        let deadline = now + inner.queue.band(ticket.band).queue_ttl;
        self.waiting.store(inner.queue.waiting(), Ordering::Relaxed);
        let engine_priority = match offer.priority {
            Some(p) if band == Some(ticket.band) => p,
            _ => self.config.band_priority(ticket.band.index()),
        };
        Ok(TenantTicket {
            queue: Arc::clone(self),
            id: ticket.id,
            band: ticket.band,
            engine_priority,
            deadline,
            dispatched: false,
            done: false,
        })
    }

    /// One try of a waiting request: expiries first, then, if it is its
    /// band's pick and no band above may still go, `decide` (the router's
    /// decision and what it means), all under the queue's lock.
    fn step<T>(
        &self,
        t: &mut TenantTicket,
        now: Instant,
        decide: impl FnOnce(Instant) -> (T, Verdict),
    ) -> Step<T> {
        let mut inner = lock(&self.inner);
        let expired = inner.queue.expire(now);
        if !expired.is_empty() {
            for e in expired {
                inner.expired.insert(e.request.id, e.rejection);
            }
            self.after_change(&inner);
        }
        if let Some(rejection) = inner.expired.remove(&t.id) {
            t.done = true;
            return Step::Expired(rejection);
        }
        if inner.queue.head(t.band, now).map(|h| h.id) != Some(t.id) {
            return Step::NotHead;
        }
        let epoch = self.epoch.load(Ordering::Relaxed);
        for b in 0..t.band.index() {
            let band = BandId(b as u8);
            if inner.queue.head(band, now).is_some() && inner.blocked[b] != Some(epoch) {
                return Step::HigherBand;
            }
        }
        let (decided, verdict) = decide(now);
        let dispatched = match verdict {
            Verdict::Dispatch => {
                let head = inner.queue.next_dispatch(now, |h| h.id == t.id);
                t.dispatched = head.is_some();
                inner.blocked[t.band.index()] = None;
                head.map(|h| Dispatched {
                    tenant: inner.queue.tenant_name(h.tenant).to_owned(),
                    waited: h.waited,
                    why: Waited::Not,
                })
            }
            Verdict::Wait(_) => {
                // Lower bands' heads may go now: woken only when that is
                // news to them (not on every re-poll of this head, which
                // would wake itself too).
                let newly = inner.blocked[t.band.index()].replace(epoch) != Some(epoch);
                let bands = inner.queue.bands().len();
                let below = (t.band.index() + 1..bands)
                    .any(|b| inner.queue.head(BandId(b as u8), now).is_some());
                if newly && below {
                    self.turn.notify_waiters();
                }
                return Step::Decided(decided, None);
            }
            Verdict::Leave => {
                inner.queue.cancel(t.id, now);
                t.done = true;
                None
            }
        };
        self.after_change(&inner);
        Step::Decided(decided, dispatched)
    }

    /// Publishes the waiting count and wakes the waiters to re-check.
    fn after_change(&self, inner: &Inner) {
        self.waiting.store(inner.queue.waiting(), Ordering::Relaxed);
        self.turn.notify_waiters();
    }

    /// Steps a waiting request until it is decided: `decide` is the
    /// router's decision at `now` and what it means for the queue. Between
    /// tries it sleeps until the heads change (or, as a head that found
    /// every replica busy, until load changes or its `Wait`'s poll), and
    /// never past its band's TTL. `Err`: it expired.
    pub(crate) async fn until_decided<T>(
        &self,
        t: &mut TenantTicket,
        mut decide: impl FnMut(Instant) -> (T, Verdict),
    ) -> Result<(T, Option<Dispatched>), Rejection> {
        let mut why = Waited::Not;
        loop {
            // Registered before the step, so a wake-up in between is kept.
            let turn = self.turn.notified();
            let load = self.load.notified();
            tokio::pin!(turn, load);
            turn.as_mut().enable();
            load.as_mut().enable();
            let deadline = tokio::time::sleep_until(t.deadline.into());
            let mut poll = None;
            let step = self.step(t, crate::clock::now(), |now| {
                let (decided, verdict) = decide(now);
                if let Verdict::Wait(p) = verdict {
                    poll = Some(p);
                }
                (decided, verdict)
            });
            match step {
                Step::Expired(rejection) => return Err(rejection),
                Step::Decided(decided, dispatched) if poll.is_none() => {
                    let dispatched = dispatched.map(|d| Dispatched { why, ..d });
                    return Ok((decided, dispatched));
                }
                Step::Decided(_, _) => why = Waited::Busy,
                Step::NotHead => why = why.max(Waited::FairShare),
                Step::HigherBand => why = why.max(Waited::HigherBand),
            }
            match poll {
                Some(poll) => tokio::select! {
                    () = turn => {}
                    () = load => {}
                    () = tokio::time::sleep(poll) => {}
                    () = deadline => {}
                },
                None => tokio::select! {
                    () = turn => {}
                    () = deadline => {}
                },
            }
        }
    }

    /// Keeps how the request booked as `booking` left the queue.
    pub(crate) fn note(&self, booking: u64, d: &Dispatched) {
        let mut notes = lock(&self.notes);
        if notes.len() == NOTES {
            notes.pop_front();
        }
        notes.push_back((booking, d.clone()));
    }

    /// How the request booked as `booking` left the queue, if still kept.
    pub(crate) fn note_of(&self, booking: u64) -> Option<Dispatched> {
        let notes = lock(&self.notes);
        notes.iter().rev().find(|(b, _)| *b == booking).map(|(_, d)| d.clone())
    }

    /// Every tenant's counters (the metrics snapshot).
    pub(crate) fn rows(&self) -> Vec<TenantRow> {
        let inner = lock(&self.inner);
        let rows = inner.queue.all_counters();
        rows.map(|(_, name, c)| TenantRow { tenant: name.to_owned(), counters: *c }).collect()
    }

    fn release(&self, id: RequestId, usage: Option<Usage>, now: Instant) {
        let mut inner = lock(&self.inner);
        // A request the queue expired has no entry left; its notice goes.
        if inner.expired.remove(&id).is_none() {
            inner.queue.finish(id, usage, now);
        }
        self.after_change(&inner);
    }
}

impl TenantTicket {
    /// The request ended; `usage` is the engine's count when it gave one.
    pub(crate) fn finish(mut self, usage: Option<Usage>) {
        self.done = true;
        self.queue.release(self.id, usage, crate::clock::now());
    }
}

impl Drop for TenantTicket {
    fn drop(&mut self) {
        if !self.done {
            // Waiting: it leaves (cancelled); dispatched: finished with the
            // output counted so far.
            self.queue.release(self.id, None, crate::clock::now());
        }
    }
}
