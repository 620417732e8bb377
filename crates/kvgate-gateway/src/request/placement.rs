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
use kvgate_router::{Decision, PdPlan, PdRefusal, RejectReason, Routed};

use crate::clock;
use crate::observe::metrics::Metrics;
use crate::replicas::fleet_handle::FleetHandle;
use crate::replicas::pool::Pools;
use crate::request::adapter_load::AdapterLoader;
use crate::request::admission::{Admission, Ticket};
use crate::request::prepare::Prepared;
use crate::request::request_error::{Reason, RequestError};
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
    /// The last failure of a replica tried.
    pub(crate) last_error: Option<RequestError>,
}

impl Attempts {
    /// A new request's attempts, excluding `exclude` from the start. When
    /// someone is already waiting for a replica, it queues behind them
    /// rather than take the next free one first (`admission.rs`).
    pub(crate) fn new(placer: &Placer, pool: PoolId, exclude: Vec<ReplicaId>) -> Attempts {
        let admission = placer.admission(pool);
        let mut queued_since = None;
        let ticket = (!admission.is_empty()).then(|| {
            queued_since = Some(clock::now());
            admission.join()
        });
        let not_serving = exclude.len();
        Attempts {
            exclude,
            not_serving,
            split: false,
            pool,
            admission,
            queued_since,
            ticket,
            last_error: None,
        }
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
        if self.fleet.with(|f| f.adapter_pool(adapter)).is_some() {
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
        loop {
            if let Some(t) = &a.ticket {
                a.admission.turn(t).await;
            }
            let (now, t0) = (clock::now(), Instant::now());
            let req = p.route_request(a.queued_since, &a.exclude);
            let plan = if a.split { self.fleet.plan(a.pool, &req, now) } else { None };
            let decision = match plan {
                Some(Ok(PdPlan::Split { prefill, decode })) => {
                    self.metrics.decide_time(t0.elapsed().as_secs_f64());
                    drop(a.ticket.take());
                    return Ok(Placed::Split { prefill, decode });
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
                    let e = match (reason, a.last_error.take()) {
                        // Every replica tried failed: report the last failure.
                        (RejectReason::NoReplica, Some(e)) if a.tried() > 0 => {
                            RequestError::new(Reason::NoReplica, e.body)
                        }
                        (RejectReason::NoReplica, _) => RequestError::new(
                            Reason::NoReplica,
                            ErrorResponse::unavailable(
                                "no replica is available to serve this request",
                            ),
                        ),
                        // Load shedding: 429, so that clients back off and retry.
                        (RejectReason::AllBusy, _) => RequestError::new(
                            Reason::AllBusy,
                            ErrorResponse::rate_limited("every replica is busy; retry later"),
                        ),
                    };
                    return Err(e.retry_after(retry_after));
                }
            }
        }
    }
}
