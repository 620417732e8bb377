//! The one owner of fleet state: [`FleetHandle`] wraps the sans-IO
//! [`Fleet`] in the gateway's only lock over it. Callers pass a closure that
//! runs under the lock and returns owned values, so no guard can cross an
//! `.await` (a closure cannot await) and no caller can take two locks in the
//! wrong order (there is one).

use std::sync::Mutex;
use std::time::{Duration, Instant};

use kvgate_index::ReplicaId;
use kvgate_router::{Booking, Decision, Outcome, RouteRequest};

use crate::locks::{lock, with_fleet_lock_marked};
use kvgate_fleet::Failure;
use kvgate_fleet::{Fleet, PoolId, Reachable, Readiness};

#[derive(Debug)]
pub(crate) struct FleetHandle {
    fleet: Mutex<Fleet>,
}

impl FleetHandle {
    pub(crate) fn new(fleet: Fleet) -> FleetHandle {
        FleetHandle { fleet: Mutex::new(fleet) }
    }

    /// Runs `f` on the fleet under its lock. Keep `f` short and free of
    /// system calls: every routing decision and event batch waits for it
    /// (the code that reads `/proc` asserts it is not under it).
    pub(crate) fn with<R>(&self, f: impl FnOnce(&mut Fleet) -> R) -> R {
        let mut fleet = lock(&self.fleet);
        with_fleet_lock_marked(|| f(&mut fleet))
    }

    /// One routing decision in `pool` ([`Fleet::route`]).
    pub(crate) fn route(&self, pool: PoolId, req: &RouteRequest<'_>, now: Instant) -> Decision {
        self.with(|f| f.route(pool, req, now))
    }

    /// Plans one request of a disaggregated pool ([`Fleet::plan`]).
    pub(crate) fn plan(
        &self,
        pool: PoolId,
        req: &RouteRequest<'_>,
        now: Instant,
    ) -> Option<Result<kvgate_router::PdPlan, kvgate_router::PdRefusal>> {
        self.with(|f| f.plan(pool, req, now))
    }

    /// `booking`'s first token arrived ([`Router::first_token`](kvgate_router::Router::first_token)).
    pub(crate) fn first_token(&self, booking: Booking, now: Instant) -> Option<Duration> {
        self.with(|f| f.first_token(booking, now))
    }

    /// `booking`'s first token is presumed, not observed.
    pub(crate) fn first_token_unmeasured(&self, booking: Booking, now: Instant) {
        self.with(|f| f.first_token_unmeasured(booking, now));
    }

    /// `booking`'s request ended with `outcome`.
    pub(crate) fn finish(&self, booking: Booking, outcome: Outcome) {
        self.with(|f| f.finish(booking, outcome));
    }

    /// `booking`'s request was dropped without an outcome.
    pub(crate) fn abandon(&self, booking: Booking) {
        self.with(|f| f.abandon(booking));
    }

    /// The pool of a replica whose engine lists `model` as an adapter.
    pub(crate) fn adapter_pool(&self, model: &str) -> Option<PoolId> {
        self.with(|f| f.adapter_pool(model))
    }

    /// The healthy replica of `pool` a runtime LoRA load goes to
    /// ([`Fleet::load_target`]).
    pub(crate) fn load_target(&self, pool: PoolId, now: Instant) -> Option<ReplicaId> {
        self.with(|f| f.load_target(pool, now))
    }

    /// `id`'s engine loaded `adapter` at runtime ([`Fleet::add_adapter`]).
    pub(crate) fn add_adapter(&self, id: ReplicaId, adapter: &str) {
        self.with(|f| f.add_adapter(id, adapter));
    }

    /// Every LoRA adapter `pool` serves: `declared` (the pool-wide ones),
    /// then those its engines list, each once ([`Fleet::adapters`]).
    pub(crate) fn adapters(&self, pool: PoolId, declared: &[String]) -> Vec<String> {
        self.with(|f| f.adapters(pool, declared))
    }

    /// The replicas of `pool` that do not serve `adapter`
    /// ([`Fleet::without_adapter`]).
    pub(crate) fn without_adapter(
        &self,
        pool: PoolId,
        adapter: Option<&str>,
        declared: &[String],
    ) -> Vec<ReplicaId> {
        self.with(|f| f.without_adapter(pool, adapter, declared))
    }

    /// A request or probe to `id` failed ([`Fleet::failed`]).
    pub(crate) fn failed(&self, id: ReplicaId, error: String, failure: Failure, now: Instant) {
        self.with(|f| f.failed(id, error, failure, now));
    }

    /// What `/ready` and the endpoint picker's health service answer
    /// ([`Fleet::readiness`]).
    pub(crate) fn readiness(&self) -> Readiness {
        self.with(|f| f.readiness())
    }

    /// Whether `id` can take a request that only it can serve
    /// ([`Fleet::reachable`]).
    pub(crate) fn reachable(&self, id: ReplicaId) -> Reachable {
        self.with(|f| f.reachable(id))
    }
}
