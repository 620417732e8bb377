//! Streaming an engine's SSE answer to the client chunk by chunk, unbuffered
//! and unchanged (the engine's `Bytes` are passed on, never copied). Its
//! first token (the booking moves to decoding, TTFT is measured) and its end
//! come from `stream_watch.rs`, which the endpoint picker's exchange uses
//! too.
//!
//! The stream never ends silently broken: an engine error, a stall longer
//! than `stream_idle_timeout_ms`, or an end without `[DONE]` appends a
//! well-formed SSE error event and `[DONE]`. An Anthropic Messages stream
//! (`Api::Anthropic`) has no `[DONE]`: its first token is its first
//! `content_block_delta`, it ends with `message_stop` (or the engine's own
//! `error` event), and a broken one gets an `error` event in Anthropic's
//! shape. A Responses stream (`Api::Responses`) ends with
//! `response.completed` (or `.incomplete`, `.failed`, `error`), its first
//! `*.delta` event is its first token, a broken one gets an OpenAI
//! Responses `error` event, and its response ids are rewritten on the way
//! (`affinity::Rewriter`; only those streams are copied).
//!
//! A traced request's stream (its span exported, `trace_context.rs`) also
//! keeps a copy of its last bytes ([`TAIL`]), read once at the end for the
//! finish reason and the output tokens (from the final usage chunk or end
//! event) recorded on the request's span; other streams keep nothing.
//! When the client goes away, the
//! relay is dropped: the booking is released as cancelled and the upstream
//! connection closes, which makes vLLM abort the request.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::stream::{Stream, StreamExt};
use kvgate_openai::sse::{write_done, write_error};
use kvgate_openai::{anthropic, responses, AnswerEnd, ErrorResponse, SseItem, SseParser};
use kvgate_router::Outcome;
use tokio::time::Sleep;

use crate::clock::now;
use crate::doors::shed::InflightPermit;
use crate::observe::metrics::Metrics;
use crate::replicas::fleet_handle::FleetHandle;
use crate::replicas::replica::Replica;
use crate::request::affinity::Rewriter;
use crate::request::booking::HeldBooking;
use crate::request::engine_client::BodyStream;
use crate::request::request_error::{Reason, RequestError};
use crate::request::route::Api;
use crate::request::stream_watch::{StreamWatch, MAX_EVENT_BYTES};
use crate::request::tenant_queue::TenantTicket;
use kvgate_tenants::Usage;

/// Bytes of a traced stream's end kept for its finish reason and output
/// tokens: OpenAI's last chunk, usage chunk and `[DONE]`, Anthropic's
/// `message_delta` and `message_stop`, and a Responses end event that
/// carries a short answer (a longer one's end is not read).
const TAIL: usize = 16 << 10;

/// Events read at a traced stream's end: enough for OpenAI's last chunk,
/// usage chunk and `[DONE]`, Anthropic's `message_delta` and
/// `message_stop`, and the `*.done` events before a Responses stream's end
/// event.
const LAST_EVENTS: usize = 6;

/// Where a relay reports, and its rules: the metrics, the fleet (a broken
/// stream counts against its replica), the stall limit, the route's label.
#[derive(Debug)]
pub(crate) struct RelayContext {
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) fleet: Arc<FleetHandle>,
    /// `limits.stream_idle_timeout_ms`.
    pub(crate) idle: Duration,
    pub(crate) route: &'static str,
    /// The route's API: how its first token and its end look.
    pub(crate) api: Api,
    /// Rewrites response ids in the stream (Responses API only).
    pub(crate) rewriter: Option<Rewriter>,
    /// The request's place in its pool's tenant queue and its prompt
    /// tokens: finished at the end with the engine's usage.
    pub(crate) tenant: Option<(TenantTicket, u64)>,
}

pub(crate) struct Relay {
    metrics: Arc<Metrics>,
    fleet: Arc<FleetHandle>,
    route: &'static str,
    api: Api,
    replica: Arc<Replica>,
    booking: Option<HeldBooking>,
    upstream: BodyStream,
    /// The first token and the end, as the picker sees them too.
    watch: StreamWatch,
    t0: Instant,
    idle: Duration,
    done: bool,
    rewriter: Option<Rewriter>,
    /// The request's span: the stream is polled outside it, so its first
    /// token and end are recorded on it by hand.
    span: tracing::Span,
    /// The stream's last bytes, when the request is traced or its tenant
    /// is charged for its output.
    tail: Option<Tail>,
    /// Its tenant ticket and prompt tokens (`RelayContext::tenant`).
    tenant: Option<(TenantTicket, u64)>,
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
        let RelayContext { metrics, fleet, idle, route, api, rewriter, tenant } = ctx;
        let keep_tail = crate::request::trace_context::in_traced_request() || tenant.is_some();
        Relay {
            metrics,
            fleet,
            route,
            api,
            replica,
            booking: Some(booking),
            upstream,
            watch: StreamWatch::new(api),
            t0,
            idle,
            done: false,
            rewriter,
            tail: keep_tail.then(Tail::default),
            tenant,
            span: tracing::Span::current(),
            _permit: permit,
        }
    }

    /// The client-facing body stream.
    pub(crate) fn into_stream(self) -> impl Stream<Item = Result<Bytes, std::convert::Infallible>> {
        RelayStream {
            relay: self,
            queue: VecDeque::new(),
            gathering: false,
            looked_again: false,
            skip: 0,
            stall: None,
        }
    }

    /// Ends the stream for `why`; returns the error tail to send, if any.
    fn close(&mut self, why: End) -> Bytes {
        let (outcome, error) = match why {
            End::Eof if self.watch.ended() => (Outcome::Finished, None),
            End::Eof => {
                let e = ErrorResponse::bad_gateway("the engine ended the stream early");
                (Outcome::Error, Some(RequestError::new(Reason::Upstream, e)))
            }
            End::Failed(err) => {
                let e = ErrorResponse::bad_gateway(format!("the engine stream failed: {err}"));
                (Outcome::Error, Some(RequestError::new(Reason::Upstream, e)))
            }
            End::Stalled => {
                let e = ErrorResponse::timeout(format!(
                    "the engine sent nothing for {} s",
                    self.idle.as_secs()
                ));
                (Outcome::Error, Some(RequestError::new(Reason::IdleTimeout, e)))
            }
        };
        self.end(outcome, error)
    }

    /// What goes to the client for `chunk`: the engine's bytes, or with a
    /// rewriter, its complete lines rewritten.
    fn outgoing(&mut self, chunk: Bytes) -> Bytes {
        match self.rewriter.as_mut() {
            Some(w) => w.chunk(&chunk),
            None => chunk,
        }
    }

    fn observe(&mut self, chunk: &[u8]) {
        if let Some(t) = self.tail.as_mut() {
            t.push(chunk);
        }
        if self.watch.feed(chunk) {
            let now = now();
            if let Some(b) = self.booking.as_ref() {
                b.first_token(now);
            }
            let ttft = now.saturating_duration_since(self.t0).as_secs_f64();
            self.metrics.ttft(self.route, ttft);
            self.span.record("ttft_s", ttft);
        }
    }

    /// Ends the stream; returns the error tail to send, if any.
    fn end(&mut self, outcome: Outcome, error: Option<RequestError>) -> Bytes {
        self.done = true;
        if let Some(b) = self.booking.take() {
            b.finish(outcome);
        }
        self.metrics.e2e(self.route, now().saturating_duration_since(self.t0).as_secs_f64());
        let label = match outcome {
            Outcome::Finished => "finished",
            Outcome::Cancelled => "cancelled",
            Outcome::Error => "error",
        };
        self.span.record("outcome", label);
        if let Some(t) = self.tail.take() {
            let end = t.read();
            if let Some(r) = &end.finish_reason {
                self.span.record("finish_reason", r.as_str());
            }
            if let Some(n) = end.output_tokens {
                self.span.record("output_tokens", crate::request::trace_context::int(n));
            }
            self.finish_tenant(end.output_tokens);
        }
        if let Some(e) = &error {
            self.span.record("error", e.reason.label());
        }
        // A line the rewriter still holds goes out before anything else.
        let held = self.rewriter.as_mut().map(Rewriter::flush).unwrap_or_default();
        let Some(error) = error else { return held };
        self.metrics.count(error.reason);
        // A stalled or broken engine stream counts against the replica like
        // a failed request, as its error says: enough in a row take it out
        // of rotation.
        if let Some(failure) = error.failure() {
            let message = error.body.error.message.clone();
            self.fleet.failed(self.replica.id, message, failure, now());
        }
        let RequestError { reason, body: e, .. } = error;
        let reason = reason.label();
        tracing::warn!(replica = %self.replica.name, reason, error = %e.error.message, "stream ended with an error");
        let mut out = held.to_vec();
        // Terminate a partial event first, so the error parses on its own.
        if self.watch.mid_event() {
            out.extend_from_slice(b"\n\n");
        }
        match self.api {
            Api::OpenAi => {
                let _ = write_error(&mut out, &e);
                write_done(&mut out);
            }
            Api::Anthropic => anthropic::write_error_event(&mut out, &e),
            Api::Responses => responses::write_error_event(&mut out, &e, self.watch.events()),
        }
        Bytes::from(out)
    }
}

/// The last [`TAIL`] bytes (up to twice that between trims) of a stream.
#[derive(Debug, Default)]
struct Tail {
    bytes: Vec<u8>,
    /// Earlier bytes were let go: the first event may be cut.
    cut: bool,
}

impl Tail {
    fn push(&mut self, chunk: &[u8]) {
        self.bytes.extend_from_slice(chunk);
        if self.bytes.len() > 2 * TAIL {
            // Trimmed once per TAIL bytes, so each byte is moved about once.
            self.bytes.drain(..self.bytes.len() - TAIL);
            self.cut = true;
        }
    }

    /// How the answer ended, from its last [`LAST_EVENTS`] whole events
    /// (found from the end, so that only they are scanned and parsed).
    fn read(self) -> AnswerEnd {
        let mut end = AnswerEnd::default();
        let b = &self.bytes;
        // Event starts, back from the end: after a blank line (`\n\n`, or
        // `\n\r\n` in a CRLF stream). The stream's own final blank line is
        // passed over.
        let (mut found, mut from) = (0, None);
        let mut i = b.len().saturating_sub(2);
        while i > 0 && found < LAST_EVENTS {
            let blank = b[i] == b'\n'
                && (b[i - 1] == b'\n' || (i >= 2 && b[i - 1] == b'\r' && b[i - 2] == b'\n'));
            if blank {
                found += 1;
                from = Some(i + 1);
            }
            i -= 1;
        }
        let from = match from {
            Some(f) if found == LAST_EVENTS || self.cut => f,
            // Fewer events than that, all of them kept.
            _ if !self.cut => 0,
            // Kept bytes within one cut event: nothing whole to read.
            _ => return end,
        };
        let mut items = Vec::new();
        // A parse failure leaves what was read before it.
        let _ = SseParser::new(MAX_EVENT_BYTES).feed(&b[from..], &mut items);
        for item in &items {
            if let SseItem::Event(e) = item {
                end.read(e.data.as_bytes());
            }
        }
        end
    }
}

impl Relay {
    /// Settles the tenant's charge: the engine's output count from the
    /// stream's final usage, else (OpenAI streams, one token per chunk as
    /// vLLM sends them by default) its events less `[DONE]`.
    fn finish_tenant(&mut self, output_tokens: Option<u64>) {
        let Some((ticket, input_tokens)) = self.tenant.take() else { return };
        let counted = || match self.api {
            Api::OpenAi => Some(self.watch.events().saturating_sub(1)),
            Api::Anthropic | Api::Responses => None,
        };
        let usage = output_tokens
            .or_else(counted)
            .map(|output_tokens| Usage { input_tokens, output_tokens });
        ticket.finish(usage);
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        // The client went away: the tenant is charged for what was streamed.
        self.finish_tenant(None);
        if let Some(b) = self.booking.take() {
            // The client went away mid-stream.
            b.finish(Outcome::Cancelled);
            self.metrics.count(Reason::ClientDisconnect);
        }
    }
}

/// Why the upstream stream ended.
enum End {
    /// It ended (cleanly if the framing saw `[DONE]`).
    Eof,
    /// It failed.
    Failed(String),
    /// Nothing came for `stream_idle_timeout_ms`.
    Stalled,
}

/// Most chunks gathered into one write to the client.
const MAX_GATHER: usize = 64;

/// Chunks passed on at once after a gather that found only one: when the
/// engine's chunks arrive one per read (a slow stream), looking for more
/// costs a scheduler round and finds nothing, so only every fourth looks.
const SKIP_AFTER_LONE: u8 = 3;

/// The relay as the client's body. Two things keep a relayed chunk cheap:
///
/// - **One write for what has already arrived.** The engine connection is
///   its own task and hands over one chunk at a time, and hyper writes to
///   the client as soon as the body has nothing ready. So chunks that came
///   in one read from the engine went out in one `writev` each, most of the
///   relay's CPU (16 loopback streams: ~4.3 chunks per engine read, one
///   write per chunk). Instead, after taking a chunk the relay returns
///   `Pending` with itself woken, so the engine connection runs and decodes
///   what it has buffered, and hands the chunks out only when the upstream
///   has had a scheduler round and still has nothing (or at `MAX_GATHER`).
///   hyper polls a pending body once more within the same poll, before the
///   connection task could run, so one further empty look is allowed before
///   giving up. The cost is a scheduler round per gather, no timer.
/// - **One stall timer per stream**, not one per chunk: it is re-armed only
///   when it fires, from the time of the last hand-out.
struct RelayStream {
    relay: Relay,
    /// Chunks taken and not yet handed to the client.
    queue: VecDeque<Bytes>,
    /// A chunk came since the last hand-out: look again before handing out.
    gathering: bool,
    /// The upstream was found empty once since the last chunk.
    looked_again: bool,
    /// Chunks still to pass on without gathering (`SKIP_AFTER_LONE`).
    skip: u8,
    /// The stall timer and the last hand-out's time, armed at the first
    /// wait.
    stall: Option<(Pin<Box<Sleep>>, Instant)>,
}

impl Stream for RelayStream {
    type Item = Result<Bytes, std::convert::Infallible>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let s = self.get_mut();
        loop {
            if !s.gathering {
                if let Some(chunk) = s.queue.pop_front() {
                    return Poll::Ready(Some(Ok(chunk)));
                }
            }
            if s.relay.done {
                return Poll::Ready(None);
            }
            let why = match s.relay.upstream.poll_next_unpin(cx) {
                Poll::Ready(Some(Ok(chunk))) => {
                    s.relay.observe(&chunk);
                    let chunk = s.relay.outgoing(chunk);
                    if !chunk.is_empty() {
                        s.queue.push_back(chunk);
                    }
                    s.looked_again = false;
                    if !s.gathering && s.skip > 0 {
                        // The last look found a lone chunk: pass this one on.
                        s.skip -= 1;
                        s.touch();
                        continue;
                    }
                    if s.queue.len() >= MAX_GATHER {
                        s.hand_out();
                        continue;
                    }
                    s.gathering = true;
                    cx.waker().wake_by_ref();
                    return Poll::Pending;
                }
                Poll::Ready(Some(Err(e))) => End::Failed(e),
                Poll::Ready(None) => End::Eof,
                Poll::Pending if s.gathering && !s.looked_again => {
                    s.looked_again = true;
                    cx.waker().wake_by_ref();
                    return Poll::Pending;
                }
                Poll::Pending if s.gathering => {
                    s.hand_out();
                    continue;
                }
                Poll::Pending => match s.poll_stall(cx) {
                    Poll::Ready(()) => End::Stalled,
                    Poll::Pending => return Poll::Pending,
                },
            };
            s.gathering = false;
            let tail = s.relay.close(why);
            if !tail.is_empty() {
                s.queue.push_back(tail);
            }
        }
    }
}

impl RelayStream {
    /// Stops gathering: the queued chunks go out.
    fn hand_out(&mut self) {
        self.gathering = false;
        self.skip = if self.queue.len() > 1 { 0 } else { SKIP_AFTER_LONE };
        self.touch();
    }

    /// Chunks are going out: the stall limit counts from now.
    fn touch(&mut self) {
        if let Some((_, last)) = &mut self.stall {
            *last = now();
        }
    }

    /// Ready when nothing has come for the idle limit.
    fn poll_stall(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let idle = self.relay.idle;
        let (sleep, last) = self.stall.get_or_insert_with(|| {
            let now = now();
            (Box::pin(tokio::time::sleep_until((now + idle).into())), now)
        });
        loop {
            ready!(sleep.as_mut().poll(cx));
            let due = *last + idle;
            if now() >= due {
                return Poll::Ready(());
            }
            // Chunks came since it was armed: wait the rest of the limit.
            sleep.as_mut().reset(due.into());
        }
    }
}

#[cfg(test)]
mod tests;
