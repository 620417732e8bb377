//! One ext_proc stream: one HTTP request through the gateway, in
//! `FULL_DUPLEX_STREAMED` mode for the request body.
//!
//! Request side: the headers are held unanswered until the whole body has
//! arrived (bodies over 1 MB come in many chunks), then the request is
//! parsed once, prepared and placed, and the answers go out in the order the
//! gateway needs: the headers response (endpoints, header changes, route
//! cache clear), then the body re-emitted in streamed chunks, then the
//! trailers if the gateway sent any. A refusal is an immediate response.
//!
//! Response side: the served endpoint corrects the booking after a gateway
//! retry; the status and content type say how to watch the body; an SSE
//! body is scanned for its first token (the booking moves to decoding, TTFT
//! measured) and its end (the booking is finished). Response chunks are
//! echoed back unchanged.
//!
//! Traps handled (each has a test in `epp/tests.rs`): a second, empty
//! end-of-stream body chunk after the end (GIE #2988) is ignored; trailers
//! end the body when it had no end-of-stream chunk; a gateway that closes
//! the stream mid-body or before the response leaves no booking behind.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;
use tracing::Instrument;

use bytes::{Bytes, BytesMut};
use envoy_types::pb::envoy::config::core::v3::Metadata;
use envoy_types::pb::envoy::service::ext_proc::v3::processing_request::Request as Msg;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    HttpBody, HttpHeaders, ProcessingRequest, ProcessingResponse,
};
use kvgate_index::ReplicaId;
use kvgate_openai::ErrorResponse;
use kvgate_router::{Outcome, Routed};
use tonic::{Status, Streaming};

use super::wire;
use super::EppContext;
use crate::clock;
use crate::doors::shed::InflightPermit;
use crate::replicas::replica::Replica;
use crate::request::booking::{HeldBooking, PresumedFirstToken};
use crate::request::forward::report;
use crate::request::placement::Attempts;
use crate::request::prepare::{self, Prepared};
use crate::request::request_error::{Reason, RequestError};
use crate::request::route::{Api, Route};
use crate::request::stream_watch::StreamWatch;
use crate::request::tenant_queue::TenantTicket;
use kvgate_tenants::Usage;

/// The answers to one stream, as the stream tonic sends: each message from
/// the gateway is handled as the answers are asked for, on the task that
/// sends them (no task or channel of its own: a hop per response chunk cost
/// more than handling the chunk). It ends when the gateway closes its side;
/// a booking still held then (the client went away, or the gateway does
/// not send responses to the picker) is released as dropped, by
/// `HeldBooking`'s drop when the stream is dropped.
pub(super) fn answers(
    ctx: Arc<EppContext>,
    inbound: Streaming<ProcessingRequest>,
) -> impl futures_util::Stream<Item = Result<ProcessingResponse, Status>> + Send + 'static {
    let state = Answers { ex: Exchange::new(ctx), inbound, queued: VecDeque::new(), failed: false };
    futures_util::stream::unfold(state, |mut st| async move {
        loop {
            if let Some(r) = st.queued.pop_front() {
                return Some((Ok(r), st));
            }
            if st.failed {
                return None;
            }
            let msg = match st.inbound.message().await {
                Ok(Some(m)) => m,
                Ok(None) => return None,
                Err(status) => {
                    tracing::debug!(%status, "the gateway ended the ext_proc stream");
                    return None;
                }
            };
            match st.ex.on_message(msg).await {
                Ok(replies) => st.queued.extend(replies),
                Err(status) => {
                    tracing::warn!(%status, "ext_proc protocol error");
                    st.failed = true;
                    return Some((Err(status), st));
                }
            }
        }
    })
}

/// One stream's state between the answers tonic asks for.
struct Answers {
    ex: Exchange,
    inbound: Streaming<ProcessingRequest>,
    queued: VecDeque<ProcessingResponse>,
    failed: bool,
}

/// Where the request side stands.
#[derive(Debug, PartialEq, Eq)]
enum Stage {
    /// Waiting for the request headers.
    Headers,
    /// Headers held; reading the body.
    Body,
    /// Answered (placed or refused); the response may follow.
    Answered,
}

/// The placed request: its replica, its booking, its route's label.
#[derive(Debug)]
struct Placed {
    replica: Arc<Replica>,
    booking: Option<HeldBooking>,
    /// A whole answer's presumed first token (booking.rs), until it ends.
    presumed: Option<PresumedFirstToken>,
    /// Its place in the pool's tenant queue (`[tenants]`), finished with
    /// the booking; dropped with the stream, it is finished as cancelled.
    tenant: Option<TenantTicket>,
    label: &'static str,
    /// Its route's API: how the answer's first token and end look.
    api: Api,
    /// Prompt block keys etc., kept to re-place after a gateway retry.
    prepared: Prepared,
}

/// What the response side has seen.
#[derive(Debug, Default)]
struct Watch {
    status: u16,
    /// An SSE answer's first token and end, as the proxy's relay sees them;
    /// `None` for a whole answer.
    stream: Option<StreamWatch>,
}

struct Exchange {
    ctx: Arc<EppContext>,
    /// When the stream opened, on `std`'s clock: it only times the pick,
    /// the TTFT and the whole exchange for the metrics. Every instant the
    /// fleet or a booking gets is `clock::now()`.
    t0: Instant,
    stage: Stage,
    headers: Option<HttpHeaders>,
    /// The request headers' metadata (the gateway's subset hint).
    metadata: Option<Metadata>,
    body: BytesMut,
    /// The in-flight place of a placed request, held to the end of the
    /// stream.
    permit: Option<InflightPermit>,
    placed: Option<Placed>,
    /// The gateway's body modes, when it announced them.
    request_mode: Option<i32>,
    response_mode: i32,
    watch: Watch,
}

impl Exchange {
    fn new(ctx: Arc<EppContext>) -> Exchange {
        Exchange {
            ctx,
            t0: Instant::now(),
            stage: Stage::Headers,
            headers: None,
            metadata: None,
            body: BytesMut::new(),
            permit: None,
            placed: None,
            request_mode: None,
            response_mode: wire::MODE_FULL_DUPLEX_STREAMED,
            watch: Watch::default(),
        }
    }

    async fn on_message(
        &mut self,
        msg: ProcessingRequest,
    ) -> Result<Vec<ProcessingResponse>, Status> {
        if let Some(p) = &msg.protocol_config {
            self.request_mode = Some(p.request_body_mode);
            self.response_mode = p.response_body_mode;
        }
        let Some(request) = msg.request else {
            return Ok(Vec::new());
        };
        match request {
            Msg::RequestHeaders(h) => self.request_headers(h, msg.metadata_context).await,
            Msg::RequestBody(b) => self.request_body(b).await,
            Msg::RequestTrailers(_) => {
                let mut replies = Vec::new();
                if self.stage == Stage::Body {
                    // Trailers end the body.
                    replies = self.answer_request().await;
                }
                replies.push(wire::trailers(true));
                Ok(replies)
            }
            Msg::ResponseHeaders(h) => {
                Ok(vec![self.response_headers(&h, msg.metadata_context.as_ref())])
            }
            Msg::ResponseBody(b) => Ok(vec![self.response_body(b)]),
            Msg::ResponseTrailers(_) => {
                self.finish_response();
                Ok(vec![wire::trailers(false)])
            }
        }
    }

    async fn request_headers(
        &mut self,
        h: HttpHeaders,
        metadata: Option<Metadata>,
    ) -> Result<Vec<ProcessingResponse>, Status> {
        if self.stage != Stage::Headers {
            return Err(Status::invalid_argument("request headers arrived twice on one stream"));
        }
        if let Some(mode) = self.request_mode {
            if mode != wire::MODE_FULL_DUPLEX_STREAMED {
                // Other modes need the headers answered before the body is
                // sent; the endpoint cannot be picked without the body.
                self.stage = Stage::Answered;
                let e = ErrorResponse::internal(format!(
                    "kvgate's endpoint picker needs the ext_proc filter's request_body_mode \
                     FULL_DUPLEX_STREAMED (the gateway sent mode {mode})"
                ));
                return Ok(vec![self.refuse(None, RequestError::new(Reason::Invalid, e))]);
            }
        }
        let end = h.end_of_stream;
        self.headers = Some(h);
        self.metadata = metadata;
        self.stage = Stage::Body;
        if end {
            // No body will come: place it as it is.
            return Ok(self.answer_request().await);
        }
        Ok(Vec::new())
    }

    async fn request_body(&mut self, b: HttpBody) -> Result<Vec<ProcessingResponse>, Status> {
        match self.stage {
            Stage::Headers => {
                Err(Status::invalid_argument("a request body arrived before its headers"))
            }
            // A repeated end-of-stream chunk after the end (GIE #2988).
            Stage::Answered if b.body.is_empty() => Ok(Vec::new()),
            // Refused (an immediate response is on its way): the gateway
            // may have sent more of the body before it read the refusal.
            Stage::Answered if self.placed.is_none() => Ok(Vec::new()),
            Stage::Answered => {
                Err(Status::invalid_argument("request body bytes arrived after the body ended"))
            }
            Stage::Body => {
                if self.body.len() + b.body.len() > self.ctx.max_body_bytes {
                    self.stage = Stage::Answered;
                    let e = ErrorResponse::invalid_request(format!(
                        "the request body is larger than {} bytes (limits.max_body_bytes)",
                        self.ctx.max_body_bytes
                    ));
                    let route = self.route();
                    return Ok(vec![self.refuse(route, RequestError::new(Reason::Invalid, e))]);
                }
                self.body.extend_from_slice(&b.body);
                if b.end_of_stream {
                    return Ok(self.answer_request().await);
                }
                Ok(Vec::new())
            }
        }
    }

    fn route(&self) -> Option<Route> {
        let h = self.headers.as_ref()?;
        let path = wire::header_str(h, ":path")?;
        Route::of_path(path.split('?').next().unwrap_or(path))
    }

    fn label(&self) -> &'static str {
        self.route().map_or("other", Route::label)
    }

    /// An immediate response for `e`, counted as the proxy counts it.
    fn refuse(&self, route: Option<Route>, e: RequestError) -> ProcessingResponse {
        crate::request::response::immediate(&self.ctx.metrics, route, "", &e)
    }

    /// The whole request has arrived: admit, check, prepare, place, answer.
    async fn answer_request(&mut self) -> Vec<ProcessingResponse> {
        self.stage = Stage::Answered;
        let ctx = Arc::clone(&self.ctx);
        let route = self.route();
        let label = self.label();
        // Held while the request is checked and placed, and kept once it
        // is placed; a refusal below gives it back at once.
        let permit = match ctx.shedding.admit() {
            Ok(p) => p,
            Err(e) => return vec![self.refuse(route, *e)],
        };
        let headers = self.headers.take().unwrap_or_default();
        let token =
            wire::header_str(&headers, "authorization").and_then(crate::doors::auth::bearer_of);
        if !crate::doors::auth::client_token_allowed(&ctx.api_keys, token) {
            let e = ErrorResponse::authentication("invalid or missing API key");
            return vec![self.refuse(route, RequestError::new(Reason::Unauthorized, e))];
        }
        // The pick's request span, continuing the client's trace from the headers
        // Envoy passes on; the engine's span becomes its child through the
        // header set on the request Envoy forwards.
        let mut trace_headers = axum::http::HeaderMap::new();
        for name in ["traceparent", "tracestate"] {
            if let Some(v) = wire::header_str(&headers, name)
                .and_then(|v| axum::http::HeaderValue::from_str(v).ok())
            {
                trace_headers.insert(name, v);
            }
        }
        let span = crate::request::trace_context::request_span("epp", label, &trace_headers);
        let traced = crate::request::trace_context::is_traced(&span);
        let body = std::mem::take(&mut self.body).freeze();
        let prepare = async {
            match route {
            Some(Route::Chat) => prepare::chat(&ctx.preparer, body).await,
            Some(Route::Completions) => prepare::completions(&ctx.preparer, body).await,
            Some(Route::Messages) => {
                prepare::messages(&ctx.preparer, body, crate::doors::api::unix_now()).await
            }
            // Its response ids must be rewritten to carry their owner
            // (`affinity.rs`), and here the gateway carries the bytes.
            Some(Route::Responses) => Err(Box::new(ErrorResponse::with_status(
                501,
                "the Responses API is served by `kvgate serve` only: the endpoint picker cannot \
                 rewrite its response ids to keep conversations on their replica",
            ))),
            None => Ok(unkeyed(body)),
            }
        };
        let prepared = prepare
            .instrument(crate::request::trace_context::stage_span!(
                traced,
                parent: &span,
                "render_and_tokenize"
            ))
            .await;
        let p = match prepared {
            Ok(p) => p,
            Err(e) => return vec![self.refuse(route, RequestError::new(Reason::Invalid, *e))],
        };
        let mut exclude = match ctx.placer.not_serving(&p).await {
            Ok(x) => x,
            Err(e) => return vec![self.refuse(route, e)],
        };
        if let Some(subset) = wire::subset_hint(self.metadata.as_ref()) {
            for r in ctx.replicas.all().iter() {
                if !subset.contains(&r.endpoint) && !exclude.contains(&r.id) {
                    exclude.push(r.id);
                }
            }
        }
        // The tenant as the proxy takes it: the key's, or the header's from
        // a key that may name tenants.
        let named = wire::header_str(&headers, ctx.placer.tenant_keys.header());
        let tenant = ctx.placer.tenant_keys.tenant_of(token, named);
        let trusted = ctx.placer.tenant_keys.trusted(token);
        let mut attempts = match Attempts::new(&ctx.placer, &p, exclude, tenant, trusted) {
            Ok(a) => a,
            Err(e) => return vec![self.refuse(route, *e)],
        };
        let (routed, replica) = loop {
            let decide =
                crate::request::trace_context::stage_span!(traced, parent: &span, "decide");
            let routed = match ctx.placer.place(&p, &mut attempts).instrument(decide).await {
                Ok(r) => r,
                Err(e) => return vec![self.refuse(route, e)],
            };
            match ctx.replicas.get(routed.replica) {
                Some(replica) => break (routed, replica),
                None => {
                    // Removed between the decision and now.
                    HeldBooking::new(Arc::clone(&ctx.fleet), routed.booking).finish(Outcome::Error);
                    attempts.exclude.push(routed.replica);
                }
            }
        };
        replica.routed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        crate::request::forward::record_dispatch_on(&span, attempts.dispatched.as_ref());
        let cached = u64::from(routed.cached_blocks) * u64::from(ctx.block_size);
        ctx.placer.count_prompt(&p, cached);
        let endpoints = endpoint_list(&ctx, &replica.endpoint, &routed, &attempts.exclude);
        let forwarded = if ctx.config.token_passthrough && route.is_some() {
            p.body_for(&replica.config)
        } else {
            p.original.clone()
        };
        let mut set: Vec<(&str, Vec<u8>)> = Vec::new();
        let mut remove: Vec<&str> = Vec::new();
        // A request without a body keeps its headers as they are.
        if !(headers.end_of_stream && forwarded.is_empty()) {
            set.push(("content-length", forwarded.len().to_string().into_bytes()));
        }
        if let Some(rank) = replica.config.dp_rank {
            // vLLM pins the request to this data-parallel engine.
            set.push(("x-data-parallel-rank", rank.to_string().into_bytes()));
        }
        // The engine gets its own key, never the client's.
        match &replica.config.api_key {
            Some(k) => set.push(("authorization", format!("Bearer {k}").into_bytes())),
            None if wire::header(&headers, "authorization").is_some() => {
                remove.push("authorization")
            }
            None => {}
        }
        span.record("prompt_tokens", crate::request::trace_context::int(p.prompt_tokens));
        crate::request::forward::record_decision_on(&span, &replica, &routed);
        let trace = crate::request::trace_context::headers_for(&span);
        for (name, value) in &trace {
            set.push((name.as_str(), value.as_bytes().to_vec()));
        }
        tracing::debug!(parent: &span, replica = %replica.name, cached_blocks = routed.cached_blocks, endpoints = %endpoints, "picked");
        let mut replies = vec![wire::routed_headers(&endpoints, &set, &remove)];
        ctx.metrics.epp_pick(self.t0.elapsed().as_secs_f64());
        if !headers.end_of_stream {
            replies.extend(wire::request_body_chunks(&forwarded));
        }
        let booking = HeldBooking::new(Arc::clone(&ctx.fleet), routed.booking);
        let api = route.map_or(Api::OpenAi, Route::api);
        let tenant = attempts.take_tenant();
        let presumed = (!p.stream).then(|| booking.presume_first_token(routed.predicted_ttft_s));
        self.placed = Some(Placed {
            replica,
            booking: Some(booking),
            presumed,
            tenant,
            label,
            api,
            prepared: p,
        });
        self.permit = Some(permit);
        replies
    }

    fn response_headers(
        &mut self,
        h: &HttpHeaders,
        metadata: Option<&Metadata>,
    ) -> ProcessingResponse {
        if let Some(served) = wire::served_endpoint(metadata) {
            self.served_by(served);
        }
        let status = wire::header_str(h, ":status").and_then(|s| s.parse().ok()).unwrap_or(200);
        self.watch.status = status;
        let sse =
            wire::header_str(h, "content-type").is_some_and(|v| v.starts_with("text/event-stream"));
        let api = self.placed.as_ref().map_or(Api::OpenAi, |p| p.api);
        self.watch.stream = sse.then(|| StreamWatch::new(api));
        let mut set = Vec::new();
        if let Some(p) = &self.placed {
            // A whole answer's first token was presumed from the placement
            // on (booking.rs), as the proxy presumes it.
            if status >= 500 {
                let error = format!("the engine answered {status} through the gateway");
                let error = RequestError::new(Reason::Status5xx, ErrorResponse::bad_gateway(error));
                report(&self.ctx.fleet, p.replica.id, &error);
            }
            if self.ctx.replica_header {
                set.push(("x-kvgate-replica", p.replica.name.clone().into_bytes()));
            }
        }
        if h.end_of_stream {
            self.finish_response();
        }
        wire::response_headers(&set)
    }

    /// The gateway says `served` answered: after a retry on a fallback, the
    /// booking moves there (the first endpoint is charged an error, as the
    /// proxy's retry does). The new booking is placed through `Placer`
    /// like every booking, as a request already running there
    /// (`Placer::rebook`): the gateway has sent it and it is answering, so
    /// that replica's load cannot make it wait. Refused (the fleet has it
    /// down or gone), the request runs on without a booking, logged; the
    /// first replica's is finished either way, since its first token and
    /// end would calibrate the wrong replica.
    fn served_by(&mut self, served: &str) {
        let ctx = Arc::clone(&self.ctx);
        let Some(p) = self.placed.as_mut() else { return };
        if p.replica.endpoint == served {
            return;
        }
        let Some(other) = ctx.replicas.all().iter().find(|r| r.endpoint == served).cloned() else {
            tracing::warn!(served, "the gateway names a served endpoint kvgate does not know");
            return;
        };
        p.presumed = None;
        if let Some(b) = p.booking.take() {
            b.finish(Outcome::Error);
        }
        let error = format!("the gateway retried on {served}");
        let error = RequestError::new(Reason::Status5xx, ErrorResponse::bad_gateway(error));
        report(&ctx.fleet, p.replica.id, &error);
        ctx.metrics.count(error.reason);
        let all = ctx.replicas.all().iter().map(|r| r.id).collect::<Vec<_>>();
        match ctx.placer.rebook(&p.prepared, other.id, all.into_iter()) {
            Ok(r) => p.booking = Some(HeldBooking::new(Arc::clone(&ctx.fleet), r.booking)),
            Err(e) => {
                let why = &e.body.error.message;
                tracing::warn!(replica = %other.name, %why, "the gateway's fallback runs the request unbooked");
            }
        }
        p.replica = other;
    }

    fn response_body(&mut self, b: HttpBody) -> ProcessingResponse {
        let first = self.watch.stream.as_mut().is_some_and(|w| w.feed(&b.body));
        if first {
            if let Some(p) = &self.placed {
                if let Some(b) = &p.booking {
                    b.first_token(clock::now());
                }
                self.ctx.metrics.ttft(p.label, self.t0.elapsed().as_secs_f64());
            }
        }
        let end = b.end_of_stream;
        let reply = wire::response_body(b.body, end, self.response_mode);
        if end {
            self.finish_response();
        }
        reply
    }

    /// The response ended: the booking is finished, the request counted.
    fn finish_response(&mut self) {
        let Some(p) = self.placed.as_mut() else { return };
        p.presumed = None;
        let Some(b) = p.booking.take() else { return };
        let status = self.watch.status;
        let stream = self.watch.stream.as_ref();
        let ok = (200..300).contains(&status) && stream.is_none_or(StreamWatch::ended);
        b.finish(if ok { Outcome::Finished } else { Outcome::Error });
        if let Some(t) = p.tenant.take() {
            // The gateway carries the bytes and only the framing is
            // scanned: an OpenAI stream's events less `[DONE]`, one token
            // each as vLLM sends them by default; else the prompt alone.
            let output =
                stream.filter(|_| p.api == Api::OpenAi).map(|w| w.events().saturating_sub(1));
            let input_tokens = p.prepared.prompt_tokens;
            t.finish(output.map(|output_tokens| Usage { input_tokens, output_tokens }));
        }
        let m = &self.ctx.metrics;
        m.request(p.label, status, &p.replica.name);
        m.e2e(p.label, self.t0.elapsed().as_secs_f64());
        self.permit = None;
    }
}

/// A request kvgate does not key (not a generation route): placed by load
/// alone in the first pool, its body passed on as it came.
fn unkeyed(body: Bytes) -> Prepared {
    Prepared::unkeyed(body)
}

/// The chosen endpoint, then up to `epp.fallbacks` others from the
/// decision's candidates, cheapest first: healthy, not busy, not excluded,
/// each endpoint once.
fn endpoint_list(ctx: &EppContext, chosen: &str, routed: &Routed, exclude: &[ReplicaId]) -> String {
    let mut list = vec![chosen.to_owned()];
    if ctx.config.fallbacks == 0 {
        return list.join(",");
    }
    if let Some(e) = &routed.explanation {
        let mut others: Vec<_> = e
            .candidates
            .iter()
            .filter(|c| {
                c.replica != routed.replica
                    && !c.busy
                    && c.health != kvgate_router::Health::Down
                    && !exclude.contains(&c.replica)
            })
            .collect();
        others.sort_by(|a, b| a.score.total_cmp(&b.score));
        for c in others {
            if list.len() > ctx.config.fallbacks {
                break;
            }
            if let Some(r) = ctx.replicas.get(c.replica) {
                if !list.contains(&r.endpoint) {
                    list.push(r.endpoint.clone());
                }
            }
        }
    }
    list.join(",")
}
