//! Where a prepared request goes: one routing decision through the fleet
//! (for a request of a disaggregated pool that may be split, the pool's
//! P/D plan), waiting in the admission queue while every replica is busy,
//! and a refusal turned into the request path's error. Both front doors
//! place through here: the HTTP proxy (`forward.rs`, which then sends,
//! runs a split's hops and retries, in one loop) and the endpoint picker
//! (`epp/`, which answers with the endpoint and lets the gateway carry the
//! bytes), so both make the same decisions on the same ledger.

use std::sync::Arc;
use std::time::Instant;

use kvgate_index::ReplicaId;
use kvgate_openai::ErrorResponse;
use kvgate_router::{Decision, PdPlan, PdRefusal, RejectReason, RouteRequest, Routed};

use crate::clock;
use crate::doors::tenant_keys::TenantKeys;
use crate::observe::metrics::Metrics;
use crate::replicas::fleet_handle::FleetHandle;
use crate::replicas::pool::Pools;
use crate::request::adapter_load::AdapterLoader;
use crate::request::admission::{Admission, Ticket};
use crate::request::prepare::Prepared;
use crate::request::request_error::{Reason, RequestError};
use crate::request::tenant_queue::{Dispatched, Offer, Refused, TenantTicket, Verdict};
use kvgate_fleet::PoolId;

/// What a placement uses: the fleet (the decision), the pools (each with
/// its admission queue, for waiting on a busy pool in arrival order, and
/// the adapters all its replicas serve), the metrics (decision time).
#[derive(Debug)]
pub(crate) struct Placer {
    pub(crate) fleet: Arc<FleetHandle>,
    pub(crate) pools: Arc<Pools>,
    pub(crate) metrics: Arc<Metrics>,
    /// Runtime loads of adapters no replica serves yet.
    pub(crate) loader: Arc<AdapterLoader>,
    /// Which tenant a request belongs to (`[tenants]`; empty without).
    pub(crate) tenant_keys: Arc<TenantKeys>,
}

/// Where a request goes.
#[derive(Debug)]
pub(crate) enum Placed {
    /// Whole, on one replica.
    Whole(Routed),
    /// Split: its prefill hop on a prefill replica, its decode hop on a
    /// decode replica (`pd_forward.rs` runs them).
    Split { prefill: Routed, decode: Routed },
}

/// One request's placement across its attempts: the replicas it must not
/// go to, whether it may still be split, its place in the admission queue,
/// and the last failure (reported if every replica fails it).
#[derive(Debug)]
pub(crate) struct Attempts {
    /// Replicas excluded: those that do not serve the request's adapter
    /// (or are outside the gateway's subset), then those that failed it.
    pub(crate) exclude: Vec<ReplicaId>,
    /// How many of `exclude` were excluded before any attempt.
    pub(crate) not_serving: usize,
    /// Its disaggregated pool may split it (off for other pools, for
    /// requests vLLM cannot split, and once a split has failed in a way
    /// that another split would not mend).
    pub(crate) split: bool,
    /// The request's pool and its admission queue.
    pool: PoolId,
    admission: Arc<Admission>,
    /// When it first had to wait, if it did.
    queued_since: Option<Instant>,
    /// Its place in the admission queue, taken on arrival when others were
    /// already waiting; dropped once routed or refused.
    ticket: Option<Ticket>,
    /// Its place in the pool's tenant queue (a pool with `[tenants]`):
    /// waiting until dispatched, then held until the request ends
    /// ([`Attempts::take_tenant`] hands it to the response).
    tenant: Option<TenantTicket>,
    /// How it left the tenant queue, once dispatched.
    pub(crate) dispatched: Option<Dispatched>,
    /// The last failure of a replica tried.
    pub(crate) last_error: Option<RequestError>,
}

impl Attempts {
    /// A new request's attempts, excluding `exclude` from the start. In a
    /// pool with tenants it is offered to the tenant queue as a request of
    /// `tenant` (`None`: the default tenant; `trusted`: its key names
    /// tenants, so its `priority` may choose a band above its tenant's),
    /// which may refuse it (400 for a `priority` that chooses no band, 429 over
    /// a limit). Otherwise, when someone is already waiting for a replica,
    /// it queues behind them rather than take the next free one first
    /// (`admission.rs`).
    pub(crate) fn new(
        placer: &Placer,
        p: &Prepared,
        exclude: Vec<ReplicaId>,
        tenant: Option<&str>,
        trusted: bool,
    ) -> Result<Attempts, Box<RequestError>> {
        let admission = placer.admission(p.pool);
        let mut queued_since = None;
        let now = clock::now();
        let tenant = match admission.tenants() {
            Some(q) => {
                let offer = Offer {
                    tenant,
                    trusted,
                    priority: p.priority,
                    input_tokens: p.prompt_tokens,
                    max_output_tokens: p.max_output.map_or(0, u64::from),
                };
                let t = q.enqueue(offer, now).map_err(|r| match r {
                    Refused::Priority(e) => {
                        let body = ErrorResponse::invalid_request(e.to_string());
                        Box::new(RequestError::new(Reason::Invalid, body.with_param("priority")))
                    }
                    Refused::Limit(r) => Box::new(placer.tenant_refused(p.pool, &r)),
                })?;
                p.set_engine_priority(t.engine_priority);
                Some(t)
            }
            None => None,
        };
        let ticket = (tenant.is_none() && !admission.is_empty()).then(|| {
            queued_since = Some(now);
            admission.join()
        });
        let not_serving = exclude.len();
        Ok(Attempts {
            exclude,
            not_serving,
            split: false,
            pool: p.pool,
            admission,
            queued_since,
            ticket,
            tenant,
            dispatched: None,
            last_error: None,
        })
    }

    /// Its tenant ticket, for the response to finish with the engine's
    /// usage (dropped, it finishes with the output counted so far).
    pub(crate) fn take_tenant(&mut self) -> Option<TenantTicket> {
        self.tenant.take()
    }

    /// Replicas tried and failed so far.
    pub(crate) fn tried(&self) -> usize {
        self.exclude.len() - self.not_serving
    }
}

impl Placer {
    /// `p` went to a replica where `predicted_cached` of its prompt tokens
    /// were predicted cached: counted fleet-wide and in its pool.
    pub(crate) fn count_prompt(&self, p: &Prepared, predicted_cached: u64) {
        let cached = predicted_cached.min(p.prompt_tokens);
        self.metrics.prompt_tokens(p.prompt_tokens, cached);
        if let Some(pool) = self.pools.get(p.pool) {
            pool.traffic.add(p.prompt_tokens, cached);
        }
    }

    /// The replicas that do not serve `adapter`: an adapter an engine listed
    /// (not one declared for the whole fleet) is served only by the replicas
    /// that list it.
    pub(crate) fn without_adapter(&self, pool: PoolId, adapter: Option<&str>) -> Vec<ReplicaId> {
        let declared = self.pools.get(pool).map_or(&[][..], |p| &p.model.lora_adapters[..]);
        self.fleet.without_adapter(pool, adapter, declared)
    }

    /// The replicas of the request's pool that cannot serve it (as
    /// [`Placer::without_adapter`]). An adapter the pool may load and no
    /// replica serves is loaded first (`adapter_load.rs`); a failed load is
    /// a 503 that says why.
    pub(crate) async fn not_serving(&self, p: &Prepared) -> Result<Vec<ReplicaId>, RequestError> {
        let exclude = self.without_adapter(p.pool, p.adapter.as_deref());
        let (Some(adapter), Some(pool)) = (p.adapter.as_deref(), self.pools.get(p.pool)) else {
            return Ok(exclude);
        };
        let Some(path) = pool.loadable.get(adapter) else { return Ok(exclude) };
        if self.fleet.adapter_pool(adapter).is_some() {
            return Ok(exclude);
        }
        match self.loader.ensure(p.pool, adapter, path, &pool.loads).await {
            Ok(()) => Ok(self.without_adapter(p.pool, Some(adapter))),
            Err(why) => Err(RequestError::new(
                Reason::NoReplica,
                ErrorResponse::unavailable(format!(
                    "LoRA adapter {adapter} could not be loaded: {why}"
                )),
            )
            .retry_after(std::time::Duration::from_secs(1))),
        }
    }

    /// `pool`'s admission queue (a detached one for a pool that does not
    /// exist, whose decisions are refusals anyway).
    fn admission(&self, pool: PoolId) -> Arc<Admission> {
        self.pools.get(pool).map_or_else(Arc::default, |p| Arc::clone(&p.admission))
    }

    /// [`Placer::place_or_split`] for a request sent whole (the endpoint
    /// picker names one endpoint).
    pub(crate) async fn place(
        &self,
        p: &Prepared,
        a: &mut Attempts,
    ) -> Result<Routed, RequestError> {
        a.split = false;
        match self.place_or_split(p, a).await? {
            Placed::Whole(r) => Ok(r),
            // Never planned with `split` off; released if it were.
            Placed::Split { prefill, decode } => {
                self.fleet.abandon(prefill.booking);
                self.fleet.abandon(decode.booking);
                Err(RequestError::new(
                    Reason::NoReplica,
                    ErrorResponse::unavailable("a split request needs the proxy's two hops"),
                ))
            }
        }
    }

    /// Books `p` on `served`, where it already runs (the endpoint picker's
    /// gateway retried it there): the same decision as any placement, with
    /// every other replica of `all` excluded and the replica's load no reason to
    /// wait (`RouteRequest::already_running`), so nothing holds back an
    /// answer that is already coming. `Err` when the fleet refuses it
    /// (`served` is down or unknown): the request runs on unbooked, and
    /// the refusal is counted like any other (`kvgate_decisions_total`).
    pub(crate) fn rebook(
        &self,
        p: &Prepared,
        served: ReplicaId,
        all: impl Iterator<Item = ReplicaId>,
    ) -> Result<Routed, Box<RequestError>> {
        let exclude: Vec<ReplicaId> = all.filter(|id| *id != served).collect();
        let req = RouteRequest { already_running: true, ..p.route_request(None, &exclude) };
        let t0 = Instant::now();
        let decision = self.fleet.route(p.pool, &req, clock::now());
        self.metrics.decide_time(t0.elapsed().as_secs_f64());
        match decision {
            Decision::Routed(r) => Ok(r),
            Decision::Reject { reason, .. } => {
                let why =
                    format!("the fleet refused a booking on the replica serving it: {reason:?}");
                Err(Box::new(RequestError::new(Reason::NoReplica, ErrorResponse::unavailable(why))))
            }
            // `already_running` never waits; refused the same if it did.
            Decision::Wait { .. } => Err(Box::new(RequestError::new(
                Reason::AllBusy,
                ErrorResponse::unavailable("the fleet asked a running request to wait"),
            ))),
        }
    }

    /// Decides where `p` goes (a disaggregated pool's plan while
    /// [`Attempts::split`] allows one), waiting while every replica is busy
    /// (only the head of the admission queue asks the router). `Err` is the
    /// refusal to answer with: no replica (503, with the last replica's
    /// failure when every one tried failed) or every replica busy (429).
    pub(crate) async fn place_or_split(
        &self,
        p: &Prepared,
        a: &mut Attempts,
    ) -> Result<Placed, RequestError> {
        if a.tenant.as_ref().is_some_and(|t| !t.dispatched) {
            if let Some(placed) = self.wait_in_tenant_queue(p, a).await? {
                return Ok(placed);
            }
        }
        loop {
            if let Some(t) = &a.ticket {
                a.admission.turn(t).await;
            }
            let now = clock::now();
            let decision = match self.one_decision(p, a, now, a.queued_since) {
                Decided::Split(placed) => {
                    drop(a.ticket.take());
                    return Ok(placed);
                }
                Decided::Decision(d) => d,
            };
            if !matches!(decision, Decision::Wait { .. }) {
                // Routed or refused: the next in line goes now.
                drop(a.ticket.take());
            }
            match decision {
                Decision::Routed(r) => return Ok(Placed::Whole(r)),
                Decision::Wait { retry_after } => {
                    a.queued_since.get_or_insert(now);
                    if a.ticket.is_none() {
                        a.ticket = Some(a.admission.join());
                    }
                    // Only the head of the queue gets here; the others wait
                    // in `turn` without asking the router.
                    a.admission.pause(retry_after).await;
                }
                Decision::Reject { reason, retry_after } => {
                    return Err(refusal(reason, retry_after, a));
                }
            }
        }
    }

    /// One decision for `p` at `now`: a disaggregated pool's plan while
    /// [`Attempts::split`] allows one, else the pool router's.
    fn one_decision(
        &self,
        p: &Prepared,
        a: &Attempts,
        now: Instant,
        queued_since: Option<Instant>,
    ) -> Decided {
        let t0 = Instant::now();
        let req = p.route_request(queued_since, &a.exclude);
        let plan = if a.split { self.fleet.plan(a.pool, &req, now) } else { None };
        let decision = match plan {
            Some(Ok(PdPlan::Split { prefill, decode })) => {
                self.metrics.decide_time(t0.elapsed().as_secs_f64());
                return Decided::Split(Placed::Split { prefill, decode });
            }
            Some(Ok(PdPlan::Aggregated(whole))) => {
                self.metrics.disagg_plan("bypass");
                Decision::Routed(whole)
            }
            Some(Ok(PdPlan::OnPrefill(whole))) => {
                self.metrics.disagg_plan("on_prefill");
                Decision::Routed(whole)
            }
            // No decode replica now: waits or is refused as any request.
            Some(Err(PdRefusal::Decode(d))) => d,
            None => self.fleet.route(a.pool, &req, now),
        };
        self.metrics.decide_time(t0.elapsed().as_secs_f64());
        Decided::Decision(decision)
    }

    /// Waits in the pool's tenant queue until `p` is dispatched (placed
    /// there, `Some`), refused (the router's refusal, or 503 when its
    /// band's TTL ran out), or dispatched without a place (`None`: it
    /// places again as any dispatched request).
    async fn wait_in_tenant_queue(
        &self,
        p: &Prepared,
        a: &mut Attempts,
    ) -> Result<Option<Placed>, RequestError> {
        let Some(mut ticket) = a.tenant.take() else { return Ok(None) };
        let Some(queue) = a.admission.tenants().cloned() else { return Ok(None) };
        // The band's TTL bounds the wait, not the router's
        // `max_queue_wait_ms`: a head that waited before asks as one that
        // has just begun to (its re-polls stay out of the decision log).
        let mut waited = false;
        let decided = queue
            .until_decided(&mut ticket, |now| {
                let decided = self.one_decision(p, a, now, waited.then_some(now));
                waited |= matches!(decided, Decided::Decision(Decision::Wait { .. }));
                let verdict = match &decided {
                    Decided::Split(_) | Decided::Decision(Decision::Routed(_)) => Verdict::Dispatch,
                    Decided::Decision(Decision::Wait { retry_after }) => {
                        Verdict::Wait(*retry_after)
                    }
                    Decided::Decision(Decision::Reject { .. }) => Verdict::Leave,
                };
                (decided, verdict)
            })
            .await;
        let (decided, dispatched) = match decided {
            Ok(d) => d,
            Err(rejection) => return Err(self.tenant_refused(a.pool, &rejection)),
        };
        if let Some(d) = &dispatched {
            self.metrics.tenant_wait(self.pool_name(a.pool), &d.tenant, d.waited.as_secs_f64());
            tracing::debug!(tenant = %d.tenant, waited_s = d.waited.as_secs_f64(), waited_for = d.why.label(), "dispatched from the tenant queue");
        }
        if let Some(d) = &dispatched {
            let booked = match &decided {
                Decided::Split(Placed::Split { prefill, decode }) => {
                    vec![prefill.booking.id(), decode.booking.id()]
                }
                Decided::Decision(Decision::Routed(r)) => vec![r.booking.id()],
                _ => Vec::new(),
            };
            for b in booked {
                queue.note(b, d);
            }
        }
        a.dispatched = dispatched;
        a.tenant = Some(ticket);
        match decided {
            Decided::Split(placed) => Ok(Some(placed)),
            Decided::Decision(Decision::Routed(r)) => Ok(Some(Placed::Whole(r))),
            Decided::Decision(Decision::Reject { reason, retry_after }) => {
                Err(refusal(reason, retry_after, a))
            }
            // Not a verdict that ends the wait.
            Decided::Decision(Decision::Wait { .. }) => Ok(None),
        }
    }

    /// The pool's name (metrics labels).
    fn pool_name(&self, pool: PoolId) -> &str {
        self.pools.get(pool).map_or("", |p| p.name.as_str())
    }

    /// A tenant queue's refusal as the request path's error, counted per
    /// tenant by the queue itself.
    pub(crate) fn tenant_refused(
        &self,
        pool: PoolId,
        r: &kvgate_tenants::Rejection,
    ) -> RequestError {
        tracing::debug!(
            pool = self.pool_name(pool),
            reason = r.reason().as_str(),
            "tenant queue refused"
        );
        RequestError::from_tenant(r)
    }
}

/// A decision: a split placed at once, or the router's.
enum Decided {
    Split(Placed),
    Decision(Decision),
}

/// The router's refusal as the request path's error: 503 when no replica
/// can serve (with the last replica's failure when every one tried failed),
/// 429 when every replica is busy.
fn refusal(
    reason: RejectReason,
    retry_after: std::time::Duration,
    a: &mut Attempts,
) -> RequestError {
    let e = match (reason, a.last_error.take()) {
        // Every replica tried failed: report the last failure.
        (RejectReason::NoReplica, Some(e)) if a.tried() > 0 => {
            RequestError::new(Reason::NoReplica, e.body)
        }
        (RejectReason::NoReplica, _) => RequestError::new(
            Reason::NoReplica,
            ErrorResponse::unavailable("no replica is available to serve this request"),
        ),
        // Load shedding: 429, so that clients back off and retry.
        (RejectReason::AllBusy, _) => RequestError::new(
            Reason::AllBusy,
            ErrorResponse::rate_limited("every replica is busy; retry later"),
        ),
    };
    e.retry_after(retry_after)
}
