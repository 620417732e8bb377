//! The forwarder (what routing and forwarding share) and sending one body
//! to one engine: the first-byte timeout, an unreachable engine's error
//! marked as such, a 5xx read for its message. `forward.rs` (whole requests) and
//! `pd_forward.rs` (a disaggregated request's two hops) both send here.

use std::sync::Arc;

use tracing::Instrument;

use axum::http::{header, HeaderValue};
use futures_util::StreamExt;
use kvgate_openai::ErrorResponse;

use crate::config::settings::RequestLimits;
use crate::observe::metrics::Metrics;
use crate::replicas::directory::Directory;
use crate::replicas::fleet_handle::FleetHandle;
use crate::replicas::replica::Replica;
use crate::request::engine_client::{
    BodyStream, EngineClient, EngineRequest, EngineResponse, SendError,
};
use crate::request::placement::Placer;
use crate::request::prepare::Prepared;
use crate::request::request_error::{Reason, RequestError};

/// Largest engine error body read to relay its message, bytes.
const MAX_ERROR_BODY: usize = 64 << 10;

/// What routing and forwarding a request use: the placement (the fleet's
/// decision and the admission queue), the fleet handle (the retry loop
/// reports failures, the relay gets it),
/// the directory (where the chosen replica is), the engines, the metrics,
/// and the request path's settings. Built once by the wiring.
#[derive(Debug)]
pub(crate) struct Forwarder {
    pub(crate) placer: Placer,
    pub(crate) fleet: Arc<FleetHandle>,
    pub(crate) replicas: Arc<Directory>,
    pub(crate) engines: Arc<dyn EngineClient>,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) limits: RequestLimits,
    /// The fleet's block size, to count cached prompt tokens.
    pub(crate) block_size: u32,
    /// `replica_header`: name the replica in `x-kvgate-replica`.
    pub(crate) replica_header: bool,
    /// Issues the response ids Responses API answers carry (`affinity.rs`).
    pub(crate) affinity: crate::request::affinity::AffinityKey,
}

/// Sends the request; `Err` when another replica should be tried (what
/// the error says about this replica, [`RequestError::failure`], is for
/// the caller to report).
pub(crate) async fn send(
    fwd: &Forwarder,
    p: &Prepared,
    replica: &Replica,
    fwd_headers: &[(header::HeaderName, HeaderValue)],
) -> Result<EngineResponse, RequestError> {
    send_body(fwd, p, replica, fwd_headers, p.body_for(&replica.config)).await
}

/// [`send`] with `body` instead of the request's own (a disaggregated
/// request's hops, `pd_forward.rs`).
pub(crate) async fn send_body(
    fwd: &Forwarder,
    p: &Prepared,
    replica: &Replica,
    fwd_headers: &[(header::HeaderName, HeaderValue)],
    body: bytes::Bytes,
) -> Result<EngineResponse, RequestError> {
    let traced = crate::request::trace_context::in_traced_request();
    let span = crate::request::trace_context::stage_span!(
        traced,
        "send",
        replica = replica.name.as_str(),
        route = p.route.label()
    );
    send_in(fwd, p, replica, fwd_headers, body).instrument(span).await
}

async fn send_in(
    fwd: &Forwarder,
    p: &Prepared,
    replica: &Replica,
    fwd_headers: &[(header::HeaderName, HeaderValue)],
    body: bytes::Bytes,
) -> Result<EngineResponse, RequestError> {
    let mut headers = fwd_headers.to_vec();
    // The engine's span becomes this hop's child.
    crate::request::trace_context::inject_current(&mut headers);
    if let Some(rank) = replica.config.dp_rank {
        // vLLM's server pins the request to this data-parallel engine
        // (`_get_data_parallel_rank` in entrypoints/generate/base/serving.py).
        headers.push((header::HeaderName::from_static("x-data-parallel-rank"), rank.into()));
    }
    let req = EngineRequest {
        url: replica.route_url(p.route).clone(),
        body,
        headers,
        bearer: replica.config.api_key.clone(),
    };
    let first_byte = fwd.limits.first_byte;
    let resp = match tokio::time::timeout(first_byte, fwd.engines.post(req)).await {
        Err(_) => {
            let e =
                ErrorResponse::timeout(format!("replica {} did not answer in time", replica.name));
            return Err(RequestError::new(Reason::Timeout, e));
        }
        Ok(Err(err)) => {
            // Nothing listens there (refused, unreachable): the replica is
            // gone, not slow, and the error says so (out of rotation at once
            // when the retry loop reports it).
            let gone = matches!(err, SendError::Unreachable(_));
            let e =
                ErrorResponse::bad_gateway(format!("replica {} unreachable: {err}", replica.name));
            let e = RequestError::new(Reason::Connect, e).caused_by(err);
            return Err(if gone { e.unreachable() } else { e });
        }
        Ok(Ok(r)) => r,
    };
    if resp.status >= 500 {
        let status = resp.status;
        // Enough of an engine's error body for its message, even if cut.
        let body = read_up_to(resp.body, MAX_ERROR_BODY).await.map(|(b, _)| b).unwrap_or_default();
        let e = ErrorResponse::from_upstream(status, &body);
        return Err(RequestError::new(Reason::Status5xx, e));
    }
    Ok(resp)
}

/// Largest whole (non-streamed) engine response relayed, bytes: an engine
/// cannot make kvgate buffer without bound.
pub(crate) const MAX_WHOLE_RESPONSE: usize = 256 << 20;

/// Reads the body up to `max` bytes. `Ok((bytes, true))` when it all fit,
/// `Ok((first max bytes, false))` when it did not; the rest is not read.
async fn read_up_to(mut body: BodyStream, max: usize) -> Result<(bytes::Bytes, bool), String> {
    let mut out = bytes::BytesMut::new();
    while let Some(chunk) = body.next().await {
        let chunk = chunk?;
        let room = max.saturating_sub(out.len());
        out.extend_from_slice(&chunk[..chunk.len().min(room)]);
        if chunk.len() > room {
            return Ok((out.freeze(), false));
        }
    }
    Ok((out.freeze(), true))
}

/// The whole body, or an error past `max` bytes.
pub(crate) async fn read_capped(body: BodyStream, max: usize) -> Result<bytes::Bytes, String> {
    match read_up_to(body, max).await {
        Ok((body, true)) => Ok(body),
        Ok((_, false)) => Err(format!("response larger than {max} bytes")),
        Err(e) => Err(e),
    }
}
