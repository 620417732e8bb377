//! Routing and forwarding one prepared request: decide (waiting while every
//! replica is busy), send it to the chosen replica with the engine's key,
//! retry on another replica when the connection fails or the engine answers
//! 5xx before any byte reached the client, then hand the response to the
//! relay (streams) or return it whole.

use std::sync::Arc;
use std::time::Instant;
use tracing::Instrument;

use axum::body::Body;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::Response;
use kvgate_openai::ErrorResponse;
use kvgate_router::{Outcome, Routed};

use crate::clock;
use crate::doors::shed::InflightPermit;
use crate::replicas::fleet_handle::FleetHandle;
use crate::replicas::replica::Replica;
use crate::request::booking::{HeldBooking, PresumedFirstToken};
use crate::request::conversation;
use crate::request::engine_client::EngineResponse;
pub(crate) use crate::request::forwarder::Forwarder;
use crate::request::forwarder::{read_capped, send, MAX_WHOLE_RESPONSE};
use crate::request::pd_forward::{self, Decoded, Failed};
use crate::request::placement::{Attempts, Placed};
use crate::request::prepare::Prepared;
use crate::request::relay::{Relay, RelayContext};
use crate::request::request_error::{Reason, RequestError};
use crate::request::response::answer;
use crate::request::route::Route;
use crate::request::tenant_queue::{Dispatched, TenantTicket};
use kvgate_index::ReplicaId;
use kvgate_tenants::Usage;

/// Routes and forwards `p`; `permit` bounds concurrency for the whole life
/// of the response, streaming included.
pub(crate) async fn forward(
    fwd: &Forwarder,
    p: Prepared,
    client_headers: &HeaderMap,
    permit: InflightPermit,
    t0: Instant,
) -> Response {
    let route = Some(p.route);
    let fwd_headers = crate::doors::auth::forwarded(client_headers);
    let mut exclude = match fwd.placer.not_serving(&p).await {
        Ok(x) => x,
        Err(e) => return answer(&fwd.metrics, route, "", &e),
    };
    // A continued Responses conversation goes to the replica holding it,
    // or nowhere: every other replica is excluded.
    if let Some(c) = &p.continues {
        let what = format!("previous_response_id '{}'", c.client_id);
        match conversation::owner(&fwd.replicas, &fwd.fleet, &c.owner, Some(p.pool), &what, false) {
            Ok(owner) => exclude.extend(conversation::all_but(&fwd.replicas, owner.id)),
            Err(e) => return answer(&fwd.metrics, route, &c.owner, &e),
        }
    }
    let tenant = fwd.placer.tenant_keys.in_headers(client_headers);
    let trusted = fwd.placer.tenant_keys.trusted(crate::doors::auth::bearer(client_headers));
    let mut attempts = match Attempts::new(&fwd.placer, &p, exclude, tenant, trusted) {
        Ok(a) => a,
        Err(e) => return answer(&fwd.metrics, route, "", &e),
    };
    // A disaggregated pool may split it: both hops run here
    // (`pd_forward.rs`); a continued conversation stays whole where it is.
    attempts.split =
        p.disaggregated && p.continues.is_none() && pd_forward::splittable(&p.original);
    let max_retries = fwd.limits.max_retries;
    // The one retry loop: placed (admission included), sent, and on a
    // failure before the first byte placed again without the replica that
    // failed (or, after a failed split, whole). Each failed replica is
    // reported here, once, from its error (`report`).
    loop {
        // The decision, with the admission wait when every replica is busy.
        let placed = {
            let traced = crate::request::trace_context::in_traced_request();
            let span = crate::request::trace_context::stage_span!(traced, "decide");
            fwd.placer.place_or_split(&p, &mut attempts).instrument(span).await
        };
        record_dispatch_on(&tracing::Span::current(), attempts.dispatched.as_ref());
        let routed = match placed {
            Ok(Placed::Whole(r)) => r,
            Ok(Placed::Split { prefill, decode }) => {
                let hops = pd_forward::hops(fwd, &p, &fwd_headers, prefill, decode, &mut attempts);
                let Decoded { replica, routed, booking, resp } = match hops.await {
                    Ok(decoded) => decoded,
                    Err(failed) => {
                        if let Some(Failed { replica, error, last }) = failed {
                            report(&fwd.fleet, replica, &error);
                            if last {
                                attempts.last_error = Some(error);
                            }
                        }
                        continue;
                    }
                };
                replica.routed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                fwd.placer.count_prompt(&p, 0);
                record_decision(&replica, &routed);
                let tenant = attempts.take_tenant();
                let held = Held { booking, presumed: None, tenant, permit };
                let answered = respond(fwd, &p, replica, held, resp, t0).await;
                return answered.unwrap_or_else(|u| unanswered(fwd, &p, u));
            }
            Err(e) => return answer(&fwd.metrics, route, "", &e),
        };
        // Held from here: a request dropped while the engine is asked
        // (the client went away) releases its booking on the way out.
        let booking = HeldBooking::new(Arc::clone(&fwd.fleet), routed.booking);
        let Some(replica) = fwd.replicas.get(routed.replica) else {
            // Removed between the decision and now.
            booking.finish(Outcome::Error);
            attempts.exclude.push(routed.replica);
            continue;
        };
        // A whole answer's first token is presumed from here (booking.rs).
        let presumed = (!p.stream).then(|| booking.presume_first_token(routed.predicted_ttft_s));
        match send(fwd, &p, &replica, &fwd_headers).await {
            Ok(resp) => {
                replica.routed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let cached = u64::from(routed.cached_blocks) * u64::from(fwd.block_size);
                fwd.placer.count_prompt(&p, cached);
                record_decision(&replica, &routed);
                let held = Held { booking, presumed, tenant: attempts.take_tenant(), permit };
                let answered = respond(fwd, &p, replica, held, resp, t0).await;
                return answered.unwrap_or_else(|u| unanswered(fwd, &p, u));
            }
            Err(err) => {
                drop(presumed);
                booking.finish(Outcome::Error);
                let (reason, message) = (err.reason.label(), &err.body.error.message);
                tracing::warn!(replica = %replica.name, %reason, error = %message, "engine failed; trying another replica");
                report(&fwd.fleet, replica.id, &err);
                fwd.metrics.count(err.reason);
                attempts.exclude.push(replica.id);
                // A pinned request has no other replica to try.
                if !err.reason.retryable()
                    || attempts.tried() > max_retries as usize
                    || p.continues.is_some()
                {
                    return answer(&fwd.metrics, route, &replica.name, &err);
                }
                attempts.last_error = Some(err);
            }
        }
    }
}

/// Reports to the fleet what `err` says about `replica`, if it says the
/// replica failed ([`RequestError::failure`]): a connection that found
/// nothing listening takes it out of rotation at once, any other engine
/// failure counts toward `unhealthy_after`. The request path's one report
/// of a failed attempt: the retry loop above calls it once per attempt, and
/// the endpoint picker for the attempts its gateway ran; the relay reports
/// a stream that broke after its first byte.
pub(crate) fn report(fleet: &FleetHandle, replica: ReplicaId, err: &RequestError) {
    if let Some(failure) = err.failure() {
        fleet.failed(replica, err.body.error.message.clone(), failure, clock::now());
    }
}

/// A whole answer that broke while read: its replica reported, and the
/// error answered, naming the replica as a served answer would.
fn unanswered(fwd: &Forwarder, p: &Prepared, u: Unanswered) -> Response {
    let Unanswered { replica, error } = u;
    report(&fwd.fleet, replica.id, &error);
    let mut r = answer(&fwd.metrics, Some(p.route), &replica.name, &error);
    if fwd.replica_header {
        if let Ok(v) = HeaderValue::from_str(&replica.name) {
            r.headers_mut().insert("x-kvgate-replica", v);
        }
    }
    r
}

/// The decision, on the request's span.
pub(crate) fn record_decision(replica: &Replica, routed: &Routed) {
    record_decision_on(&tracing::Span::current(), replica, routed);
    tracing::debug!("routed");
}

/// How the request left its tenant queue, on `span`.
pub(crate) fn record_dispatch_on(span: &tracing::Span, d: Option<&Dispatched>) {
    if let Some(d) = d {
        span.record("tenant", d.tenant.as_str());
        span.record("queue_wait_s", d.waited.as_secs_f64());
        span.record("waited_for", d.why.label());
    }
}

/// The decision, on `span`.
pub(crate) fn record_decision_on(span: &tracing::Span, replica: &Replica, routed: &Routed) {
    span.record("replica", replica.name.as_str());
    span.record("cached_blocks", i64::from(routed.cached_blocks));
    span.record("predicted_ttft_s", routed.predicted_ttft_s);
    if let Some(e) = &routed.explanation {
        span.record("reason", e.reason.label());
        span.record("candidates", crate::request::trace_context::int(e.candidates.len() as u64));
        // The best predicted TTFT among the replicas not chosen: how close
        // the decision was.
        let runner_up = e
            .candidates
            .iter()
            .filter(|c| c.replica != routed.replica)
            .map(|c| c.predicted_ttft_s)
            .min_by(f64::total_cmp);
        if let Some(t) = runner_up {
            span.record("runner_up_ttft_s", t);
        }
    }
}

fn response_headers(fwd: &Forwarder, replica: &Replica, upstream: &HeaderMap) -> HeaderMap {
    let mut h = HeaderMap::new();
    for name in [header::CONTENT_TYPE, header::HeaderName::from_static("x-request-id")] {
        if let Some(v) = upstream.get(&name) {
            h.insert(name, v.clone());
        }
    }
    if fwd.replica_header {
        if let Ok(v) = HeaderValue::from_str(&replica.name) {
            h.insert("x-kvgate-replica", v);
        }
    }
    h
}

/// What a routed request holds until its answer ends: its booking, its
/// place in the tenant queue (a pool with tenants) and its in-flight permit.
struct Held {
    booking: HeldBooking,
    /// A whole answer's presumed first token, until the answer ends.
    presumed: Option<PresumedFirstToken>,
    tenant: Option<TenantTicket>,
    permit: InflightPermit,
}

/// A routed request whose answer failed before any of it was sent: the
/// loop reports the replica and answers with the error.
struct Unanswered {
    replica: Arc<Replica>,
    error: RequestError,
}

/// The engine's answer to the client: a stream through the relay, or the
/// whole body. `Err` when a whole body could not be read.
async fn respond(
    fwd: &Forwarder,
    p: &Prepared,
    replica: Arc<Replica>,
    held: Held,
    resp: EngineResponse,
    t0: Instant,
) -> Result<Response, Unanswered> {
    let Held { booking, presumed, tenant, permit } = held;
    let status = StatusCode::from_u16(resp.status).unwrap_or(StatusCode::BAD_GATEWAY);
    let headers = response_headers(fwd, &replica, &resp.headers);
    let is_sse = resp
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    let label = p.route.label();
    if p.stream && status.is_success() && is_sse {
        fwd.metrics.request(label, status.as_u16(), &replica.name);
        let ctx = RelayContext {
            metrics: Arc::clone(&fwd.metrics),
            fleet: Arc::clone(&fwd.fleet),
            idle: fwd.limits.stream_idle,
            route: label,
            api: p.route.api(),
            rewriter: rewriter(fwd, p, &replica),
            tenant: tenant.map(|t| (t, p.prompt_tokens)),
        };
        let relay = Relay::new(ctx, replica, booking, resp.body, permit, t0);
        let mut r = Response::new(Body::from_stream(relay.into_stream()));
        *r.status_mut() = status;
        *r.headers_mut() = headers;
        return Ok(r);
    }
    // A whole response: its first token was presumed (booking.rs).
    let body = read_capped(resp.body, MAX_WHOLE_RESPONSE).await;
    drop(presumed);
    drop(permit);
    match body {
        Ok(bytes) => {
            let bytes = match rewriter(fwd, p, &replica) {
                Some(mut w) => w.body(&bytes),
                None => bytes,
            };
            let outcome = if status.is_success() { Outcome::Finished } else { Outcome::Error };
            booking.finish(outcome);
            let end = record_whole_end(&bytes, outcome, tenant.is_some());
            if let Some(t) = tenant {
                let output_tokens = end.and_then(|e| e.output_tokens);
                t.finish(
                    output_tokens.map(|output_tokens| Usage {
                        input_tokens: p.prompt_tokens,
                        output_tokens,
                    }),
                );
            }
            fwd.metrics.request(label, status.as_u16(), &replica.name);
            fwd.metrics.e2e(label, t0.elapsed().as_secs_f64());
            let mut r = Response::new(Body::from(bytes));
            *r.status_mut() = status;
            *r.headers_mut() = headers;
            Ok(r)
        }
        Err(e) => {
            booking.finish(Outcome::Error);
            let err = ErrorResponse::bad_gateway(format!(
                "replica {} failed while answering: {e}",
                replica.name
            ));
            Err(Unanswered { replica, error: RequestError::new(Reason::Upstream, err) })
        }
    }
}

/// Largest whole answer read for its finish reason and output tokens: a
/// longer one's are not recorded (its parse would cost more than the rest
/// of the request).
const MAX_END_READ: usize = 4 << 20;

/// Records a whole answer's end on the request's span: its outcome, and
/// when the request is traced (exported) its finish reason and output
/// tokens, read from the body (a parse only traced requests, and requests
/// whose tenant is charged for their output, pay for). Returns what was read.
fn record_whole_end(
    body: &[u8],
    outcome: Outcome,
    usage_wanted: bool,
) -> Option<kvgate_openai::AnswerEnd> {
    let span = tracing::Span::current();
    span.record("outcome", if outcome == Outcome::Finished { "finished" } else { "error" });
    let traced = crate::request::trace_context::is_traced(&span);
    if !(traced || usage_wanted) || body.len() > MAX_END_READ {
        return None;
    }
    let mut end = kvgate_openai::AnswerEnd::default();
    end.read(body);
    if let Some(r) = &end.finish_reason {
        span.record("finish_reason", r.as_str());
    }
    if let Some(n) = end.output_tokens {
        span.record("output_tokens", crate::request::trace_context::int(n));
    }
    Some(end)
}

/// The response-id rewriter of a Responses API answer from `replica`
/// (`affinity.rs`); other routes' answers pass unchanged.
fn rewriter(
    fwd: &Forwarder,
    p: &Prepared,
    replica: &Replica,
) -> Option<crate::request::affinity::Rewriter> {
    (p.route == Route::Responses).then(|| {
        let previous = p.continues.as_ref().map(|c| (c.engine_id.clone(), c.client_id.clone()));
        conversation::rewriter(&fwd.affinity, replica, previous)
    })
}

#[cfg(test)]
#[path = "forward/tests.rs"]
mod tests;

#[cfg(test)]
#[path = "forward/replay_tests.rs"]
mod replay_tests;

#[cfg(test)]
#[path = "forward/tenant_tests.rs"]
mod tenant_tests;
