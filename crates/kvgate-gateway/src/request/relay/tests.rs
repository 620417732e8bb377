//! The relay in virtual time (`start_paused`): the engine is a channel the
//! test writes chunks into, the client reads the relay's stream when the
//! test says, and time moves only by `tokio::time::advance` or while every
//! task waits, so each case sits exactly at the edge of the idle limit.
//! Covered: an engine stall (and a gap just short of one), a cut or broken
//! stream, a slow client, OpenAI's final usage chunk, and the named end
//! events of Anthropic Messages and OpenAI Responses streams.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::stream::{self, BoxStream, StreamExt};
use kvgate_index::ReplicaId;
use kvgate_openai::{SseItem, SseParser};
use kvgate_router::{Decision, LedgerTotals, RouteRequest, Router, RouterConfig};
use serde_json::Value;
use tokio::sync::mpsc;
use tokio::time::{advance, timeout, Instant};

use super::{Relay, RelayContext};
use crate::config::settings::HealthRules;
use crate::config::ReplicaConfig;
use crate::observe::metrics::Metrics;
use crate::observe::snapshot::FleetSnapshot;
use crate::replicas::fleet_handle::FleetHandle;
use crate::replicas::replica::Replica;
use crate::replicas::scrape::EngineScrape;
use crate::request::booking::HeldBooking;
use crate::request::route::Route;
use kvgate_fleet::Fleet;

/// `limits.stream_idle_timeout_ms`'s default.
const IDLE: Duration = Duration::from_secs(120);
const MS: Duration = Duration::from_millis(1);

const TOKEN: &str = "data: {\"choices\":[{\"index\":0,\"text\":\"hi\"}]}\n\n";
const DONE: &str = "data: [DONE]\n\n";

/// A completion chunk whose text is `i`, so order shows.
fn numbered(i: usize) -> String {
    format!("data: {{\"choices\":[{{\"index\":0,\"text\":\"{i}\"}}]}}\n\n")
}

/// A well-formed Anthropic Messages stream, as vLLM writes one.
const MESSAGES: [&str; 7] = [
    "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[]}}\n\n",
    "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n",
    "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hel\"}}\n\n",
    "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"lo\"}}\n\n",
    "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n",
    "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":2}}\n\n",
    "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
];

/// A well-formed OpenAI Responses stream.
const RESPONSES: [&str; 4] = [
    "event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\":\"resp_1\",\"status\":\"in_progress\"}}\n\n",
    "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"sequence_number\":1,\"delta\":\"Hel\"}\n\n",
    "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"sequence_number\":2,\"delta\":\"lo\"}\n\n",
    "event: response.completed\ndata: {\"type\":\"response.completed\",\"sequence_number\":3,\"response\":{\"id\":\"resp_1\",\"status\":\"completed\"}}\n\n",
];

/// The route's first chunks up to and including its first token.
fn first_token(route: Route) -> Vec<&'static str> {
    match route {
        Route::Chat | Route::Completions => vec![TOKEN],
        Route::Messages => MESSAGES[..3].to_vec(),
        Route::Responses => RESPONSES[..2].to_vec(),
    }
}

/// A relay on `route` whose engine has sent the chunks up to its first
/// token (returned).
fn started(route: Route) -> (Harness, Vec<&'static str>) {
    let h = relay(route);
    let sent = first_token(route);
    for chunk in &sent {
        h.send(*chunk);
    }
    (h, sent)
}

/// The paused clock, as the `std` instant the relay is handed.
fn clock() -> std::time::Instant {
    Instant::now().into_std()
}

/// One relayed stream: the engine's end, the client's end, and what the
/// relay reports to.
struct Harness {
    route: Route,
    engine: Option<mpsc::UnboundedSender<Result<Bytes, String>>>,
    client: BoxStream<'static, Result<Bytes, std::convert::Infallible>>,
    metrics: Arc<Metrics>,
    fleet: Arc<FleetHandle>,
    replica: ReplicaId,
}

/// A relay on `route` for a booking on the fleet's one replica, its body
/// whatever the test sends.
fn relay(route: Route) -> Harness {
    let rules = HealthRules {
        unhealthy_after: 3,
        purge_after: Duration::from_secs(600),
        rebuild: Duration::from_secs(2),
        index_bound: 1_000,
    };
    let router = Router::new(RouterConfig::default(), Default::default()).expect("router");
    let mut fleet = Fleet::new(vec![router], rules);
    let url = "http://a:1";
    let id = fleet.add(url, 0, 16, true, 0).expect("replica");
    let scrape =
        EngineScrape { block_size: Some(16), num_gpu_blocks: Some(100), ..EngineScrape::default() };
    fleet.probe_succeeded(id, Ok(scrape), clock());
    let fleet = Arc::new(FleetHandle::new(fleet));
    let req = RouteRequest { prompt_tokens: 64, ..RouteRequest::default() };
    let Decision::Routed(routed) = fleet.route(0, &req, clock()) else { panic!("not routed") };
    let (stop, _) = tokio::sync::watch::channel(false);
    let route_urls = Replica::parse_route_urls(url).expect("urls");
    let replica = Arc::new(Replica {
        id,
        config: ReplicaConfig::new(url),
        name: url.to_owned(),
        base: url.to_owned(),
        endpoint: Replica::endpoint_of(&route_urls[0]),
        route_urls,
        events: Arc::default(),
        routed: Default::default(),
        stop,
    });
    let (engine, rx) = mpsc::unbounded_channel();
    let upstream = stream::unfold(rx, |mut rx| async move { Some((rx.recv().await?, rx)) });
    let metrics = Arc::new(Metrics::new());
    let ctx = RelayContext {
        metrics: Arc::clone(&metrics),
        fleet: Arc::clone(&fleet),
        idle: IDLE,
        route: route.label(),
        api: route.api(),
        rewriter: None,
        tenant: None,
    };
    let booking = HeldBooking::new(Arc::clone(&fleet), routed.booking);
    // The permit the shedding layer would have given it (shed.rs).
    let permit =
        Arc::new(Arc::new(tokio::sync::Semaphore::new(1)).try_acquire_owned().expect("permit"));
    let relay = Relay::new(ctx, replica, booking, upstream.boxed(), permit, clock());
    let client = relay.into_stream().boxed();
    Harness { route, engine: Some(engine), client, metrics, fleet, replica: id }
}

impl Harness {
    /// The engine writes `chunk`.
    fn send(&self, chunk: impl Into<Bytes>) {
        let engine = self.engine.as_ref().expect("the engine's body is open");
        engine.send(Ok(chunk.into())).expect("the relay holds the body");
    }

    /// The engine's body fails with `error`.
    fn fail(&self, error: &str) {
        let engine = self.engine.as_ref().expect("the engine's body is open");
        engine.send(Err(error.to_owned())).expect("the relay holds the body");
    }

    /// The engine's body ends.
    fn close(&mut self) {
        self.engine = None;
    }

    /// The client's next chunk (waiting, in virtual time, as long as it
    /// takes), or `None` at the end.
    async fn read(&mut self) -> Option<String> {
        let chunk = self.client.next().await?.unwrap_or_else(|never| match never {});
        Some(String::from_utf8(chunk.to_vec()).expect("utf-8"))
    }

    /// Everything the client gets until the stream ends.
    async fn read_to_end(&mut self) -> String {
        let mut all = String::new();
        while let Some(chunk) = self.read().await {
            all.push_str(&chunk);
        }
        all
    }

    /// Whether the client, waiting for `d`, gets nothing.
    async fn quiet_for(&mut self, d: Duration) -> bool {
        timeout(d, self.client.next()).await.is_err()
    }

    fn totals(&self) -> LedgerTotals {
        self.fleet.with(|f| f.router().ledger_totals())
    }

    fn failures(&self) -> u32 {
        self.fleet.with(|f| f.status(self.replica).map_or(0, |s| s.failures))
    }

    /// The value of one series in the exposition (`name{labels}`).
    fn metric(&self, series: &str) -> Option<f64> {
        let text = self.metrics.render(&FleetSnapshot::default());
        let line =
            text.lines().find(|l| l.strip_prefix(series).is_some_and(|v| v.starts_with(' ')));
        line.and_then(|l| l[series.len()..].trim().parse().ok())
    }

    fn stream_errors(&self, reason: &str) -> f64 {
        let series = format!("kvgate_stream_errors_total{{reason=\"{reason}\"}}");
        self.metric(&series).unwrap_or(0.0)
    }

    /// Asserts the booking was released once with the outcome `ended`
    /// (`finished` or `errored`), after one measured first token.
    fn assert_released(&self, ended: &str) {
        let t = self.totals();
        let (finished, errored) = if ended == "finished" { (1, 0) } else { (0, 1) };
        assert_eq!(
            (t.first_tokens, t.finished, t.errored, t.cancelled, t.dropped),
            (1, finished, errored, 0, 0),
            "{:?}: {t:?}",
            self.route
        );
    }

    /// Asserts the stream ended broken for `reason` (`idle_timeout` or
    /// `upstream`): the booking released as an error, one failure charged
    /// to the replica, one stream error of that reason and none of the
    /// other.
    fn assert_broken(&self, reason: &str) {
        self.assert_released("errored");
        assert_eq!(self.failures(), 1, "{:?}: counts against the replica", self.route);
        let other = if reason == "upstream" { "idle_timeout" } else { "upstream" };
        assert_eq!((self.stream_errors(reason), self.stream_errors(other)), (1.0, 0.0));
    }

    /// Asserts `tail` is one error event in the route's API shape whose
    /// message contains `message` (for Responses, numbered after the
    /// `events` the engine sent), and for OpenAI then `[DONE]`.
    fn assert_error_tail(&self, tail: &str, message: &str, events: u64) {
        let mut items = Vec::new();
        SseParser::new(1 << 20).feed(tail.as_bytes(), &mut items).expect("the tail parses");
        let route = self.route;
        let (error, rest) = items.split_first().unwrap_or_else(|| panic!("{route:?}: {tail:?}"));
        let SseItem::Event(error) = error else { panic!("{route:?}: {tail:?}") };
        let data: Value = serde_json::from_str(&error.data).expect("JSON");
        let said = match route {
            Route::Chat | Route::Completions => {
                assert_eq!(error.event, None, "{tail:?}");
                assert_eq!(rest, [SseItem::Done], "{tail:?}");
                &data["error"]["message"]
            }
            Route::Messages => {
                assert_eq!(error.event.as_deref(), Some("error"), "{tail:?}");
                assert_eq!(data["type"], "error", "{tail:?}");
                assert!(rest.is_empty() && !tail.contains("[DONE]"), "{tail:?}");
                &data["error"]["message"]
            }
            Route::Responses => {
                assert_eq!(error.event.as_deref(), Some("error"), "{tail:?}");
                assert_eq!(data["type"], "error", "{tail:?}");
                assert_eq!(data["sequence_number"], events, "{tail:?}");
                assert!(rest.is_empty() && !tail.contains("[DONE]"), "{tail:?}");
                &data["message"]
            }
        };
        let said = said.as_str().unwrap_or_default();
        assert!(said.contains(message), "{route:?}: {said:?} lacks {message:?}");
    }
}

/// The engine sends its first token, then nothing: at the idle limit to
/// the millisecond, and not before, the client gets an error event in its
/// API's shape and the stream ends; the booking ends as an error, the
/// replica is charged a failure, and the stall is counted as such.
#[tokio::test(start_paused = true)]
async fn an_engine_silent_for_the_idle_limit_ends_the_stream_with_an_error_event() {
    for route in [Route::Chat, Route::Messages, Route::Responses] {
        let (mut h, sent) = started(route);
        for chunk in &sent {
            assert_eq!(h.read().await.as_deref(), Some(*chunk), "{route:?}");
        }
        let silent_since = Instant::now();
        assert!(h.quiet_for(IDLE - MS).await, "{route:?}: ended before the limit");
        let tail = h.read().await.expect("an error tail");
        let silent = silent_since.elapsed();
        assert!((IDLE..=IDLE + MS).contains(&silent), "{route:?}: at the limit, not {silent:?}");
        h.assert_error_tail(&tail, "the engine sent nothing for 120 s", sent.len() as u64);
        // The stream is over: whatever the engine sends late is not relayed.
        h.send(TOKEN);
        assert_eq!(h.read().await, None, "{route:?}");
        h.assert_broken("idle_timeout");
    }
}

/// Gaps just short of the idle limit, again and again, never end the
/// stream however long it runs: the limit counts from the last chunk, not
/// from when the timer was armed.
#[tokio::test(start_paused = true)]
async fn gaps_just_short_of_the_idle_limit_do_not_end_the_stream() {
    let mut h = relay(Route::Completions);
    h.send(TOKEN);
    assert_eq!(h.read().await.as_deref(), Some(TOKEN));
    let start = Instant::now();
    for i in 0..5 {
        assert!(h.quiet_for(IDLE - MS).await, "nothing to read yet");
        h.send(numbered(i));
        assert_eq!(h.read().await, Some(numbered(i)), "gap {i} did not end it");
    }
    assert!(start.elapsed() > 4 * IDLE, "{:?}", start.elapsed());
    h.send(DONE);
    h.close();
    assert_eq!(h.read_to_end().await, DONE);
    h.assert_released("finished");
    assert_eq!(h.failures(), 0);
    assert_eq!(h.stream_errors("idle_timeout"), 0.0);
}

/// The engine's body ends cleanly but before its API's end (mid-event
/// here): the partial event is closed with a blank line so the error event
/// after it parses on its own, and the break is counted as `upstream`.
#[tokio::test(start_paused = true)]
async fn a_stream_cut_before_its_end_gets_an_error_tail_after_the_partial_event() {
    for route in [Route::Chat, Route::Messages, Route::Responses] {
        let (mut h, sent) = started(route);
        let partial = "data: {\"choices\":[{\"index\":0,\"te";
        h.send(partial);
        h.close();
        let head: String = sent.concat();
        let body = h.read_to_end().await;
        let tail = body
            .strip_prefix(&format!("{head}{partial}\n\n"))
            .unwrap_or_else(|| panic!("{route:?}: the partial event is not ended: {body:?}"));
        // Numbered after the engine's whole events (the partial one has no
        // number a client could read).
        h.assert_error_tail(tail, "the engine ended the stream early", sent.len() as u64);
        h.assert_broken("upstream");
    }
}

/// The engine's body fails between events: the error tail says why, and
/// it is counted as `upstream`.
#[tokio::test(start_paused = true)]
async fn a_stream_whose_body_fails_gets_an_error_tail_counted_as_upstream() {
    let mut h = relay(Route::Chat);
    h.send(TOKEN);
    h.fail("connection reset by peer");
    let body = h.read_to_end().await;
    let tail = body.strip_prefix(TOKEN).unwrap_or_else(|| panic!("{body:?}"));
    h.assert_error_tail(tail, "connection reset by peer", 1);
    h.assert_broken("upstream");
}

/// A client that looks away for three idle limits at a time while the
/// engine keeps streaming (a chunk every half limit) gets every chunk once
/// and in order, and no error: chunks left queued wait for it, and after a
/// pause the limit counts from what the relay just read, though the timer
/// armed before the pause fired long ago. What the limit measures is the
/// engine's silence as the relay sees it, never the client's. A last pause
/// of five limits after the engine has sent everything ends the stream as
/// finished too.
#[tokio::test(start_paused = true)]
async fn a_slow_client_loses_nothing_and_is_not_taken_for_a_silent_engine() {
    let mut h = relay(Route::Completions);
    let mut sent = String::new();
    let mut got = String::new();
    h.send(numbered(0));
    sent.push_str(&numbered(0));
    got.push_str(&h.read().await.expect("the first chunk"));
    // The client waits on the engine once, so the stall timer is armed.
    assert!(h.quiet_for(IDLE / 2).await);
    let mut n = 1;
    for round in 0..4 {
        // The client is away: the engine streams on.
        for _ in 0..6 {
            advance(IDLE / 2).await;
            h.send(numbered(n));
            sent.push_str(&numbered(n));
            n += 1;
        }
        // It reads a few; the rest stay queued through the next pause.
        for _ in 0..3 {
            got.push_str(&h.read().await.expect("a chunk"));
        }
        if round % 2 == 1 {
            // It catches up, then waits on the engine a little.
            while got.len() < sent.len() {
                got.push_str(&h.read().await.expect("a chunk"));
            }
            assert!(h.quiet_for(IDLE / 4).await, "round {round}: {got:?}");
        }
    }
    h.send(DONE);
    sent.push_str(DONE);
    h.close();
    advance(5 * IDLE).await;
    got.push_str(&h.read_to_end().await);
    assert_eq!(got, sent, "every chunk, once, in order");
    h.assert_released("finished");
    assert_eq!(h.failures(), 0);
    assert_eq!((h.stream_errors("idle_timeout"), h.stream_errors("upstream")), (0.0, 0.0));
}

/// vLLM's chat stream with `include_usage`: a role chunk without text, the
/// text, then a usage chunk with no choices before `[DONE]`. Every byte is
/// relayed unchanged, the stream counts as finished, and TTFT is taken
/// once, at the first chunk with text (3 s in), not at the role chunk
/// (2 s) nor at the usage chunk (7 s).
#[tokio::test(start_paused = true)]
async fn a_final_usage_chunk_is_relayed_and_ttft_is_taken_at_the_first_text() {
    let chunk = |body: &str| {
        format!("data: {{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",{body}}}\n\n")
    };
    let role = chunk(
        r#""choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]"#,
    );
    let hel = chunk(r#""choices":[{"index":0,"delta":{"content":"Hel"},"finish_reason":null}]"#);
    let lo = chunk(r#""choices":[{"index":0,"delta":{"content":"lo"},"finish_reason":"stop"}]"#);
    let usage =
        chunk(r#""choices":[],"usage":{"prompt_tokens":5,"total_tokens":7,"completion_tokens":2}"#);
    let mut h = relay(Route::Chat);
    let ttft = r#"kvgate_time_to_first_token_seconds_sum{route="chat"}"#;
    let ttft_count = r#"kvgate_time_to_first_token_seconds_count{route="chat"}"#;

    advance(Duration::from_secs(2)).await;
    h.send(role.clone());
    assert_eq!(h.read().await, Some(role.clone()));
    assert_eq!(h.totals().first_tokens, 0, "a role chunk carries no token");
    assert_eq!(h.metric(ttft_count), None);

    advance(Duration::from_secs(1)).await;
    h.send(hel.clone());
    assert_eq!(h.read().await, Some(hel.clone()));
    assert_eq!(h.totals().first_tokens, 1, "booked at the first text");
    assert_eq!(h.metric(ttft), Some(3.0));

    advance(Duration::from_secs(4)).await;
    for c in [&lo, &usage] {
        h.send(c.clone());
    }
    h.send(DONE);
    h.close();
    assert_eq!(h.read_to_end().await, format!("{lo}{usage}{DONE}"), "byte for byte");
    h.assert_released("finished");
    assert_eq!((h.metric(ttft_count), h.metric(ttft)), (Some(1.0), Some(3.0)), "taken once");
    let e2e = r#"kvgate_request_duration_seconds_sum{route="chat"}"#;
    assert_eq!(h.metric(e2e), Some(7.0));
    assert_eq!((h.stream_errors("upstream"), h.stream_errors("idle_timeout")), (0.0, 0.0));
}

/// Anthropic Messages and OpenAI Responses streams have no `[DONE]`: they
/// end on `message_stop` and `response.completed`. Ended there, the
/// client gets exactly the engine's bytes (nothing appended) and the
/// booking is finished, its first token taken at the first delta.
#[tokio::test(start_paused = true)]
async fn messages_and_responses_streams_end_on_their_own_end_events() {
    for (route, events) in [(Route::Messages, &MESSAGES[..]), (Route::Responses, &RESPONSES[..])] {
        let mut h = relay(route);
        for e in events {
            h.send(*e);
        }
        h.close();
        assert_eq!(h.read_to_end().await, events.concat(), "{route:?}");
        h.assert_released("finished");
        assert_eq!(h.failures(), 0, "{route:?}");
        assert_eq!((h.stream_errors("upstream"), h.stream_errors("idle_timeout")), (0.0, 0.0));
    }
}

/// A traced stream's kept end: the finish reason and output tokens of its
/// last events, however its bytes were split, in LF or CRLF framing, with
/// the kept bytes starting mid-event after a long stream (the cut event is
/// passed over, the whole ones after it read).
#[test]
fn a_streams_kept_tail_gives_its_finish_reason_and_output_tokens() {
    let last = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"lo\"},\"finish_reason\":\"length\"}]}\n\n";
    let usage = "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":2,\"total_tokens\":7}}\n\n";
    let stream = format!("{TOKEN}{last}{usage}{DONE}");
    for split in [1, 7, stream.len()] {
        let mut t = super::Tail::default();
        for piece in stream.as_bytes().chunks(split) {
            t.push(piece);
        }
        let end = t.read();
        assert_eq!(end.finish_reason.as_deref(), Some("length"), "split {split}");
        assert_eq!(end.output_tokens, Some(2), "split {split}");
    }
    let crlf = stream.replace('\n', "\r\n");
    let mut t = super::Tail::default();
    t.push(crlf.as_bytes());
    assert_eq!(t.read().output_tokens, Some(2), "CRLF");

    // Far more than the tail keeps, every event a token, then the end.
    let mut t = super::Tail::default();
    for i in 0..10_000 {
        t.push(numbered(i).as_bytes());
    }
    assert!(t.bytes.len() <= 2 * super::TAIL && t.cut);
    t.push(last.as_bytes());
    t.push(DONE.as_bytes());
    let end = t.read();
    assert_eq!((end.finish_reason.as_deref(), end.output_tokens), (Some("length"), None));

    // Anthropic's and Responses' end events.
    for (events, reason, tokens) in
        [(&MESSAGES[..], "end_turn", Some(2)), (&RESPONSES[..], "completed", None)]
    {
        let mut t = super::Tail::default();
        for e in events {
            t.push(e.as_bytes());
        }
        let end = t.read();
        assert_eq!((end.finish_reason.as_deref(), end.output_tokens), (Some(reason), tokens));
    }
}
