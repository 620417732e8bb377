//! Where a prepared request goes: one routing decision through the fleet,
//! waiting in the admission queue while every replica is busy, and a refusal
//! turned into the request path's error. Both front doors place through
//! here: the HTTP proxy (`forward.rs`, which then sends and retries) and the
//! endpoint picker (`epp/`, which answers with the endpoint and lets the
//! gateway carry the bytes), so both make the same decisions on the same
//! ledger.

use std::sync::Arc;
use std::time::Instant;

use kvgate_index::ReplicaId;
use kvgate_openai::ErrorResponse;
use kvgate_router::{Decision, RejectReason, Routed};

use crate::admission::{Admission, Ticket};
use crate::fleet_handle::FleetHandle;
use crate::metrics::Metrics;
use crate::prepare::Prepared;
use crate::request_error::{Reason, RequestError};

/// What a placement uses: the fleet (the decision), the admission queue
/// (waiting for a busy fleet in arrival order), the metrics (decision
/// time), and the adapters every replica serves.
#[derive(Debug)]
pub(crate) struct Placer {
    pub(crate) fleet: Arc<FleetHandle>,
    pub(crate) admission: Arc<Admission>,
    pub(crate) metrics: Arc<Metrics>,
    /// `model.lora_adapters`: adapters every replica serves.
    pub(crate) lora_adapters: Vec<String>,
}

/// One request's placement across its attempts: the replicas it must not
/// go to, its place in the admission queue, and the last failure (reported
/// if every replica fails it).
#[derive(Debug)]
pub(crate) struct Attempts {
    /// Replicas excluded: those that do not serve the request's adapter
    /// (or are outside the gateway's subset), then those that failed it.
    pub(crate) exclude: Vec<ReplicaId>,
    /// How many of `exclude` were excluded before any attempt.
    pub(crate) not_serving: usize,
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
    pub(crate) fn new(placer: &Placer, exclude: Vec<ReplicaId>) -> Attempts {
        let mut queued_since = None;
        let ticket = (!placer.admission.is_empty()).then(|| {
            queued_since = Some(Instant::now());
            placer.admission.join()
        });
        let not_serving = exclude.len();
        Attempts { exclude, not_serving, queued_since, ticket, last_error: None }
    }

    /// Replicas tried and failed so far.
    pub(crate) fn tried(&self) -> usize {
        self.exclude.len() - self.not_serving
    }
}

impl Placer {
    /// The replicas that do not serve `adapter`: an adapter an engine listed
    /// (not one declared for the whole fleet) is served only by the replicas
    /// that list it.
    pub(crate) fn without_adapter(&self, adapter: Option<&str>) -> Vec<ReplicaId> {
        self.fleet.without_adapter(adapter, &self.lora_adapters)
    }

    /// Decides where `p` goes, waiting while every replica is busy (only the
    /// head of the admission queue asks the router). `Err` is the refusal
    /// to answer with: no replica (503, with the last replica's failure when
    /// every one tried failed) or every replica busy (429).
    pub(crate) async fn place(
        &self,
        p: &Prepared,
        a: &mut Attempts,
    ) -> Result<Routed, RequestError> {
        loop {
            if let Some(t) = &a.ticket {
                self.admission.turn(t).await;
            }
            let now = Instant::now();
            let decision = self.fleet.route(&p.route_request(a.queued_since, &a.exclude), now);
            self.metrics.decide_time(now.elapsed().as_secs_f64());
            if !matches!(decision, Decision::Wait { .. }) {
                // Routed or refused: the next in line goes now.
                drop(a.ticket.take());
            }
            match decision {
                Decision::Routed(r) => return Ok(r),
                Decision::Wait { retry_after } => {
                    a.queued_since.get_or_insert(now);
                    if a.ticket.is_none() {
                        a.ticket = Some(self.admission.join());
                    }
                    // Only the head of the queue gets here; the others wait
                    // in `turn` without asking the router.
                    self.admission.pause(retry_after).await;
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
