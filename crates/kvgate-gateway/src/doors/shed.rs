//! The generation routes' outermost layer: shedding, before the key check
//! and before any parsing. While kvgate shuts down (the grace period in
//! which in-flight requests finish), a new request gets 503 at once; when
//! `limits.max_concurrent_requests` are in flight, 429 with `Retry-After: 1`,
//! so clients back off instead of queueing without bound. Both are answered
//! and counted through `response::answer`, like every other refusal.
//!
//! An admitted request carries its in-flight permit to the handler in the
//! request's extensions; the handler takes it with the [`Admitted`]
//! extractor and holds it until the answer has been streamed out.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{FromRequestParts, Request, State};
use axum::http::request::Parts;
use axum::middleware::Next;
use axum::response::Response;
use kvgate_openai::ErrorResponse;
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};

use crate::observe::metrics::Metrics;
use crate::request::request_error::{Reason, RequestError};
use crate::request::response::{answer, error_response};
use crate::request::route::Route;

/// A request's share of `limits.max_concurrent_requests`, released when the
/// last holder drops it (an `Arc`: request extensions must be `Clone`).
pub(crate) type InflightPermit = Arc<OwnedSemaphorePermit>;

/// What the shedding layer reads.
#[derive(Debug)]
pub(crate) struct Shedding {
    /// Set on shutdown.
    pub(crate) closing: watch::Receiver<bool>,
    /// Requests in flight, bounded by `limits.max_concurrent_requests`.
    pub(crate) inflight: Arc<Semaphore>,
    pub(crate) metrics: Arc<Metrics>,
}

/// The layer (`axum::middleware::from_fn_with_state`).
pub(crate) async fn shed(State(s): State<Arc<Shedding>>, mut req: Request, next: Next) -> Response {
    let route = Route::of_path(req.uri().path());
    match s.admit() {
        Ok(permit) => {
            req.extensions_mut().insert::<InflightPermit>(permit);
            next.run(req).await
        }
        Err(e) => answer(&s.metrics, route, "", &e),
    }
}

impl Shedding {
    /// A new request's permit, or why it is refused: 503 while shutting
    /// down, 429 at the in-flight limit. Both front doors (the HTTP routes
    /// through [`shed`], the EPP per stream) admit through here.
    pub(crate) fn admit(&self) -> Result<InflightPermit, Box<RequestError>> {
        if *self.closing.borrow() {
            let e = ErrorResponse::unavailable("kvgate is shutting down");
            return Err(Box::new(RequestError::new(Reason::ShuttingDown, e)));
        }
        let Ok(permit) = Arc::clone(&self.inflight).try_acquire_owned() else {
            let e = ErrorResponse::rate_limited("too many requests in flight; retry later");
            let e = RequestError::new(Reason::Overloaded, e).retry_after(Duration::from_secs(1));
            return Err(Box::new(e));
        };
        Ok(Arc::new(permit))
    }
}

/// The in-flight permit the shedding layer gave this request.
#[derive(Debug)]
pub(crate) struct Admitted(pub(crate) InflightPermit);

impl<S: Send + Sync> FromRequestParts<S> for Admitted {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Admitted, Response> {
        // Taken, not cloned: the handler is then the permit's only holder.
        parts.extensions.remove::<InflightPermit>().map(Admitted).ok_or_else(|| {
            // Only a wiring mistake gets here (a generation route without
            // the layer); refuse rather than serve unbounded.
            tracing::error!("a generation request reached its handler without the shedding layer");
            error_response(&ErrorResponse::internal("request admission is not configured"))
        })
    }
}

#[cfg(test)]
mod tests;
