//! Streaming an engine's SSE answer to the client chunk by chunk, unbuffered
//! and unchanged (the engine's `Bytes` are passed on, never copied). Until
//! the first token, each event is parsed to see it (the booking moves to
//! decoding, TTFT is measured); from then on only the framing is scanned,
//! for the end: decoding every token's event cost more than the rest of the
//! relay together.
//!
//! The stream never ends silently broken: an engine error, a stall longer
//! than `stream_idle_timeout_ms`, or an end without `[DONE]` appends a
//! well-formed SSE error event and `[DONE]`. When the client goes away, the
//! relay is dropped: the booking is released as cancelled and the upstream
//! connection closes, which makes vLLM abort the request.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::stream::{Stream, StreamExt};
use kvgate_openai::sse::{write_done, write_error};
use kvgate_openai::{ErrorResponse, SseFraming, SseItem, SseParser, StreamTap};
use kvgate_router::Outcome;

use crate::booking::HeldBooking;
use crate::engine_client::BodyStream;
use crate::fleet_handle::FleetHandle;
use crate::metrics::Metrics;
use crate::replica::Replica;
use crate::replica_status::Failure;
use crate::request_error::{Reason, RequestError};
use crate::shed::InflightPermit;

/// Largest single SSE event the tap parses (bigger events pass through but
/// are not inspected).
const MAX_EVENT_BYTES: usize = 4 << 20;

/// Where a relay reports, and its rules: the metrics, the fleet (a broken
/// stream counts against its replica), the stall limit, the route's label.
#[derive(Debug)]
pub(crate) struct RelayContext {
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) fleet: Arc<FleetHandle>,
    /// `limits.stream_idle_timeout_ms`.
    pub(crate) idle: Duration,
    pub(crate) route: &'static str,
}

pub(crate) struct Relay {
    metrics: Arc<Metrics>,
    fleet: Arc<FleetHandle>,
    route: &'static str,
    replica: Arc<Replica>,
    booking: Option<HeldBooking>,
    upstream: BodyStream,
    parser: SseParser,
    items: Vec<SseItem>,
    tap: StreamTap,
    framing: SseFraming,
    t0: Instant,
    idle: Duration,
    first_seen: bool,
    done: bool,
    _permit: InflightPermit,
}

impl std::fmt::Debug for Relay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Relay")
            .field("replica", &self.replica.name)
            .field("done", &self.done)
            .finish()
    }
}

impl Relay {
    pub(crate) fn new(
        ctx: RelayContext,
        replica: Arc<Replica>,
        booking: HeldBooking,
        upstream: BodyStream,
        permit: InflightPermit,
        t0: Instant,
    ) -> Relay {
        let RelayContext { metrics, fleet, idle, route } = ctx;
        Relay {
            metrics,
            fleet,
            route,
            replica,
            booking: Some(booking),
            upstream,
            parser: SseParser::new(MAX_EVENT_BYTES),
            items: Vec::new(),
            tap: StreamTap::new(),
            framing: SseFraming::new(),
            t0,
            idle,
            first_seen: false,
            done: false,
            _permit: permit,
        }
    }

    /// The client-facing body stream.
    pub(crate) fn into_stream(self) -> impl Stream<Item = Result<Bytes, std::convert::Infallible>> {
        futures_util::stream::unfold(self, |mut r| async move {
            if r.done {
                return None;
            }
            match tokio::time::timeout(r.idle, r.upstream.next()).await {
                Ok(Some(Ok(chunk))) => {
                    r.observe(&chunk);
                    Some((Ok(chunk), r))
                }
                Ok(None) if r.framing.is_done() => {
                    r.end(Outcome::Finished, None);
                    None
                }
                Ok(None) => {
                    let e = ErrorResponse::bad_gateway("the engine ended the stream early");
                    let tail = r.end(Outcome::Error, Some(RequestError::new(Reason::Upstream, e)));
                    Some((Ok(tail), r))
                }
                Ok(Some(Err(err))) => {
                    let e = ErrorResponse::bad_gateway(format!("the engine stream failed: {err}"));
                    let tail = r.end(Outcome::Error, Some(RequestError::new(Reason::Upstream, e)));
                    Some((Ok(tail), r))
                }
                Err(_) => {
                    let e = ErrorResponse::timeout(format!(
                        "the engine sent nothing for {} s",
                        r.idle.as_secs()
                    ));
                    let tail =
                        r.end(Outcome::Error, Some(RequestError::new(Reason::IdleTimeout, e)));
                    Some((Ok(tail), r))
                }
            }
        })
    }

    fn observe(&mut self, chunk: &[u8]) {
        self.framing.feed(chunk);
        if self.first_seen {
            return;
        }
        self.items.clear();
        // A parse failure only stops inspection; the bytes still pass.
        if self.parser.feed(chunk, &mut self.items).is_err() {
            return;
        }
        for item in &self.items {
            self.tap.observe(item);
        }
        if !self.first_seen && self.tap.has_output() {
            self.first_seen = true;
            let now = Instant::now();
            if let Some(b) = self.booking.as_ref() {
                b.first_token(now);
            }
            self.metrics.ttft(self.route, now.saturating_duration_since(self.t0).as_secs_f64());
        }
    }

    /// Ends the stream; returns the error tail to send, if any.
    fn end(&mut self, outcome: Outcome, error: Option<RequestError>) -> Bytes {
        self.done = true;
        if let Some(b) = self.booking.take() {
            b.finish(outcome);
        }
        self.metrics.e2e(self.route, self.t0.elapsed().as_secs_f64());
        let Some(RequestError { reason, body: e, .. }) = error else { return Bytes::new() };
        self.metrics.count(reason);
        // A stalled or broken engine stream counts against the replica like
        // a failed request: enough in a row take it out of rotation.
        let error = e.error.message.clone();
        self.fleet.failed(self.replica.id, error, Failure::Error, Instant::now());
        let reason = reason.label();
        tracing::warn!(replica = %self.replica.name, reason, error = %e.error.message, "stream ended with an error");
        let mut out = Vec::new();
        // Terminate a partial event first, so the error parses on its own.
        if self.framing.mid_event() {
            out.extend_from_slice(b"\n\n");
        }
        let _ = write_error(&mut out, &e);
        write_done(&mut out);
        Bytes::from(out)
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        if let Some(b) = self.booking.take() {
            // The client went away mid-stream.
            b.finish(Outcome::Cancelled);
            self.metrics.count(Reason::ClientDisconnect);
        }
    }
}
