//! Tenants on the request path (`[tenants]`), against the fake engine: a
//! key's tenant and the tenant header, the in-flight limit's 429, the
//! queue TTL's 503, a client that goes away, the counts, and fair dispatch
//! between a noisy and a quiet tenant on a saturated fleet, and the band a
//! request's `priority` chooses and what the engine is sent. The fleet is
//! one replica that is busy while any request is in prefill
//! (`router.busy_pending_tokens = 1`), and each request's stream is fed by
//! the test, so the fleet frees exactly when a test sends a first token.
//! Time is tokio's paused clock: waits cost nothing and nothing is asserted
//! by sleeping; every check awaits its condition.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::http::HeaderMap;
use bytes::Bytes;
use tokio::sync::mpsc::UnboundedSender;
use tokio::task::JoinHandle;

use super::forward;
use super::tests::{gateway, DONE, TOKEN};
use crate::config::{GatewayConfig, TenantKey, TenantsSection};
use crate::doors::api::ApiContext;
use crate::observe::snapshot::TenantSnapshot;
use crate::request::engine_fake::{fed, FakeEngines};
use kvgate_tenants::TenantConfig;

const ACME: &str = "key-of-acme-0";
const FRONT: &str = "key-of-front-0";
const NOISY: &str = "key-of-noisy-0";
const QUIET: &str = "key-of-quiet-0";

/// A gateway over one fake engine with tenants `acme` (at most one request
/// in flight), `noisy` and `quiet`, and a front gateway's key that may name
/// tenants; `tweak` adjusts the section.
async fn tenants_gateway(
    tweak: impl FnOnce(&mut TenantsSection),
) -> (Arc<ApiContext>, Arc<FakeEngines>) {
    tenants_gateway_on(false, tweak).await
}

/// [`tenants_gateway`] whose engine runs priority scheduling or not.
async fn tenants_gateway_on(
    priority_scheduling: bool,
    tweak: impl FnOnce(&mut TenantsSection),
) -> (Arc<ApiContext>, Arc<FakeEngines>) {
    let key = |key: &str, tenant: &str, names_tenants| TenantKey {
        key: key.into(),
        tenant: tenant.into(),
        names_tenants,
    };
    let mut section = TenantsSection {
        keys: vec![
            key(ACME, "acme", false),
            key(FRONT, "front", true),
            key(NOISY, "noisy", false),
            key(QUIET, "quiet", false),
        ],
        ..TenantsSection::default()
    };
    let limited = TenantConfig { max_in_flight: Some(1), ..TenantConfig::default() };
    section.queue.tenants.insert("acme".into(), limited);
    // Listed in this order, so a tie between their counters goes to noisy.
    section.queue.tenants.insert("noisy".into(), TenantConfig::default());
    section.queue.tenants.insert("quiet".into(), TenantConfig::default());
    tweak(&mut section);
    let setup = |c: &mut GatewayConfig| {
        c.auth.api_keys = [ACME, FRONT, NOISY, QUIET].map(str::to_owned).to_vec();
        c.router.busy_pending_tokens = 1;
        c.monitor.health_interval_ms = 86_400_000;
        c.monitor.metrics_interval_ms = 86_400_000;
        c.tenants = Some(section);
        c.replicas[0].priority_scheduling = priority_scheduling;
        c.validate().expect("a valid configuration");
    };
    gateway(&["a:1"], setup).await
}

/// A streamed completion with `key` (and the tenant header, if `named`)
/// whose prompt starts with token `first`, sent on its own task.
fn send(
    api: &Arc<ApiContext>,
    key: Option<&str>,
    named: Option<&str>,
    first: u32,
) -> JoinHandle<(u16, HeaderMap, String)> {
    send_with(api, key, named, first, None)
}

/// [`send`] with the body's `priority` set to `priority`, if given.
fn send_with(
    api: &Arc<ApiContext>,
    key: Option<&str>,
    named: Option<&str>,
    first: u32,
    priority: Option<i64>,
) -> JoinHandle<(u16, HeaderMap, String)> {
    let mut headers = HeaderMap::new();
    if let Some(k) = key {
        headers.insert("authorization", format!("Bearer {k}").parse().expect("header"));
    }
    if let Some(n) = named {
        headers.insert("x-kvgate-tenant", n.parse().expect("header"));
    }
    let api = Arc::clone(api);
    tokio::spawn(async move {
        let mut body = completion_body(&api, first);
        if let Some(p) = priority {
            body["priority"] = p.into();
        }
        let body = Bytes::from(body.to_string());
        let p = crate::request::prepare::completions(&api.preparer, body).await.expect("prepared");
        let permit =
            Arc::new(Arc::new(tokio::sync::Semaphore::new(1)).try_acquire_owned().expect("permit"));
        let resp = forward(&api.forwarder, p, &headers, permit, Instant::now()).await;
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let body = axum::body::to_bytes(resp.into_body(), usize::MAX).await.expect("body");
        (status, headers, String::from_utf8(body.to_vec()).expect("utf-8"))
    })
}

/// A streamed completion whose prompt starts with token `first`.
fn completion_body(api: &ApiContext, first: u32) -> serde_json::Value {
    serde_json::json!({
        "model": api.pools.all()[0].model.served_name,
        "prompt": (first..first + 64).collect::<Vec<u32>>(),
        "max_tokens": 4,
        "stream": true,
    })
}

/// The pool's tenants as the metrics see them.
fn tenants(api: &ApiContext) -> Vec<TenantSnapshot> {
    api.view.snapshot(Instant::now()).pools.swap_remove(0).tenants
}

fn tenant(api: &ApiContext, name: &str) -> TenantSnapshot {
    tenants(api).into_iter().find(|t| t.tenant == name).unwrap_or_default()
}

/// Waits (on the paused clock) until `cond` holds; fails after a virtual
/// minute.
async fn until(what: &str, mut cond: impl FnMut() -> bool) {
    for _ in 0..60_000 {
        if cond() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    panic!("never happened: {what}");
}

/// Every tenant's counts close: arrived is refused, dispatched, cancelled
/// or waiting (expiries are among the refused), and dispatched is finished
/// or in flight.
fn assert_balanced(api: &ApiContext) {
    for t in tenants(api) {
        let refused: u64 = t.rejected.iter().sum();
        assert_eq!(t.arrived, refused + t.dispatched + t.cancelled + t.queue_depth, "{t:?}");
        assert_eq!(t.dispatched, t.finished + t.in_flight, "{t:?}");
    }
}

/// Queues a fed answer for the next request sent to the engine.
fn feed(fake: &FakeEngines) -> UnboundedSender<&'static str> {
    let (answer, tx) = fed();
    fake.next([answer]);
    tx
}

/// A first request with `key`, at the engine and in prefill (the replica
/// busy) until the test feeds its stream.
async fn in_prefill(
    api: &Arc<ApiContext>,
    fake: &FakeEngines,
    key: &str,
) -> (UnboundedSender<&'static str>, JoinHandle<(u16, HeaderMap, String)>) {
    let tx = feed(fake);
    let first = send(api, Some(key), None, 1);
    until("the first request is at the engine", || fake.seen().len() == 1).await;
    (tx, first)
}

/// Completes each fed stream in turn once its request is at the engine
/// (the busy fleet takes one at a time); every request is answered 200.
async fn serve_one_at_a_time(
    fake: &FakeEngines,
    senders: Vec<UnboundedSender<&'static str>>,
    requests: Vec<JoinHandle<(u16, HeaderMap, String)>>,
) {
    for (k, tx) in senders.into_iter().enumerate() {
        until("the next is dispatched", || fake.seen().len() == k + 1).await;
        complete_stream(tx);
    }
    for r in requests {
        assert_eq!(r.await.expect("request").0, 200);
    }
}

/// Sends a fed stream's first token and its end.
fn complete_stream(tx: UnboundedSender<&'static str>) {
    for chunk in [TOKEN, DONE] {
        tx.send(chunk).expect("the stream is open");
    }
}

#[tokio::test(start_paused = true)]
async fn a_key_names_its_tenant_and_only_a_trusted_key_may_name_another() {
    let (api, _fake) = tenants_gateway(|_| {}).await;
    let cases = [
        (Some(ACME), None, "acme"),
        // acme's key may not name a tenant: the header is ignored.
        (Some(ACME), Some("globex"), "acme"),
        (Some(FRONT), Some("globex"), "globex"),
        (Some(FRONT), None, "front"),
        (None, Some("globex"), "default"),
    ];
    for (key, named, _) in cases {
        let (status, _, body) = send(&api, key, named, 1).await.expect("request");
        assert_eq!(status, 200, "{body}");
    }
    assert_eq!(tenant(&api, "acme").finished, 2);
    assert_eq!(tenant(&api, "globex").finished, 1);
    assert_eq!(tenant(&api, "front").finished, 1);
    assert_eq!(tenant(&api, "default").finished, 1);
    let text = super::tests::metrics(&api);
    let served = r#"kvgate_tenant_tokens_total{pool="default",tenant="acme",kind="input"} 128"#;
    assert!(text.contains(served), "{text}");
    assert!(
        text.contains(r#"kvgate_tenant_queue_wait_seconds_count{pool="default",tenant="acme"} 2"#),
        "{text}"
    );
    assert_balanced(&api);
}

#[tokio::test(start_paused = true)]
async fn over_its_in_flight_limit_a_tenant_gets_429_with_retry_after() {
    let (api, fake) = tenants_gateway(|_| {}).await;
    let (tx, first) = in_prefill(&api, &fake, ACME).await;
    // Past its prefill: the replica takes others, and it is still in flight.
    tx.send(TOKEN).expect("the stream is open");
    let (status, headers, body) = send(&api, Some(ACME), None, 2).await.expect("request");
    assert_eq!(status, 429, "{body}");
    assert_eq!(headers["retry-after"], "1");
    assert!(body.contains("1 requests in flight, its limit"), "{body}");
    // Another tenant is not held to acme's limit.
    let (status, _, _) = send(&api, Some(QUIET), None, 3).await.expect("request");
    assert_eq!(status, 200);
    tx.send(DONE).expect("the stream is open");
    drop(tx);
    assert_eq!(first.await.expect("request").0, 200);
    let (status, _, _) = send(&api, Some(ACME), None, 4).await.expect("request");
    assert_eq!(status, 200, "a slot is free again once the first finished");
    let acme = tenant(&api, "acme");
    assert_eq!((acme.arrived, acme.rejected[1], acme.finished), (3, 1, 2));
    let text = super::tests::metrics(&api);
    let counted =
        r#"kvgate_tenant_rejected_total{pool="default",tenant="acme",reason="in_flight_limit"} 1"#;
    assert!(text.contains(counted), "{text}");
    assert!(text.contains(r#"kvgate_rejected_total{reason="tenant_in_flight_limit"} 1"#));
    assert_balanced(&api);
}

#[tokio::test(start_paused = true)]
async fn a_request_that_waits_past_its_band_ttl_gets_503_saying_why() {
    let (api, fake) = tenants_gateway(|s| s.queue.bands[0].queue_ttl_ms = 500).await;
    let (tx, first) = in_prefill(&api, &fake, QUIET).await;
    let t0 = tokio::time::Instant::now();
    let (status, headers, body) = send(&api, Some(NOISY), None, 2).await.expect("request");
    assert_eq!(status, 503, "{body}");
    assert!(t0.elapsed() >= Duration::from_millis(500), "answered before its TTL");
    assert!(headers.get("retry-after").is_none());
    assert!(body.contains("queue TTL 500 ms"), "{body}");
    assert!(body.contains("priority band \\\"interactive\\\""), "{body}");
    assert_eq!(fake.seen().len(), 1, "the expired request never reached the engine");
    assert_eq!(tenant(&api, "noisy").rejected[3], 1);
    complete_stream(tx);
    assert_eq!(first.await.expect("request").0, 200);
    assert_balanced(&api);
}

#[tokio::test(start_paused = true)]
async fn a_client_that_goes_away_leaves_the_queue_at_once() {
    let (api, fake) = tenants_gateway(|_| {}).await;
    let (tx, first) = in_prefill(&api, &fake, QUIET).await;
    let waiting = send(&api, Some(NOISY), None, 2);
    until("the second waits", || tenant(&api, "noisy").queue_depth == 1).await;
    waiting.abort();
    until("the second left", || tenant(&api, "noisy").queue_depth == 0).await;
    let noisy = tenant(&api, "noisy");
    assert_eq!((noisy.cancelled, noisy.dispatched), (1, 0));
    complete_stream(tx);
    assert_eq!(first.await.expect("request").0, 200);
    assert_eq!(fake.seen().len(), 1, "the request that left never reached the engine");
    assert_balanced(&api);
}

/// Six of noisy's requests queue before two of quiet's; the fleet takes
/// one at a time. First come first served would send all of noisy's
/// first; VTC lifts quiet to noisy's counter (a tie, which goes to noisy,
/// listed first) and then alternates while both wait.
#[tokio::test(start_paused = true)]
async fn a_noisy_tenant_does_not_starve_a_quiet_one() {
    // Prompt tokens alone set the counters (no output charge), so the order
    // does not hang on when each stream's end is settled.
    let (api, fake) = tenants_gateway(|s| s.queue.output_weight = 0.0).await;
    let senders: Vec<_> = (0..8).map(|_| feed(&fake)).collect();
    let mut requests = Vec::new();
    for i in 0..6 {
        requests.push(send(&api, Some(NOISY), None, 1000 + 100 * i));
        let queued = i as u64;
        until("noisy's request is in", || tenant(&api, "noisy").arrived == queued + 1).await;
    }
    assert_eq!(fake.seen().len(), 1, "one at a time: the fleet is busy");
    for i in 0..2 {
        requests.push(send(&api, Some(QUIET), None, 2000 + 100 * i));
    }
    until("quiet's requests wait", || tenant(&api, "quiet").queue_depth == 2).await;
    serve_one_at_a_time(&fake, senders, requests).await;
    let order: Vec<&str> = fake
        .seen()
        .iter()
        .map(|s| {
            let body: serde_json::Value = serde_json::from_slice(&s.body).expect("json");
            if body["prompt"][0].as_u64().unwrap_or(0) >= 2000 {
                "quiet"
            } else {
                "noisy"
            }
        })
        .collect();
    assert_eq!(order, ["noisy", "noisy", "quiet", "noisy", "quiet", "noisy", "noisy", "noisy"]);
    // The decision log says who waited and why: quiet's requests waited for
    // their turn, then as their band's head for the busy replica.
    let log = crate::observe::decision_json::recent_decisions_json(&api.view, 64, Instant::now());
    let quiet_log: Vec<&serde_json::Value> =
        log.iter().filter(|d| d["tenant"]["name"] == "quiet").collect();
    assert_eq!(quiet_log.len(), 2, "{log:?}");
    assert!(quiet_log.iter().all(|d| d["tenant"]["waited_for"] == "busy"), "{quiet_log:?}");
    assert!(quiet_log.iter().all(|d| d["tenant"]["waited_s"].as_f64() > Some(0.0)));
    let (noisy, quiet) = (tenant(&api, "noisy"), tenant(&api, "quiet"));
    assert_eq!((noisy.finished, quiet.finished), (6, 2));
    assert_eq!((noisy.input_tokens, quiet.input_tokens), (6 * 64, 2 * 64));
    assert_eq!((noisy.output_tokens, quiet.output_tokens), (6, 2), "one token each");
    assert_balanced(&api);
}

/// Bands `interactive` (priorities up to 0) and `batch` (up to 10), with
/// `noisy` and `front` tenants of `batch`.
fn priority_bands(s: &mut TenantsSection) {
    s.queue.output_weight = 0.0;
    s.queue.bands[0].max_priority = Some(0);
    s.queue.bands[1].max_priority = Some(10);
    for tenant in ["noisy", "front"] {
        let batch = TenantConfig { band: Some("batch".into()), ..TenantConfig::default() };
        s.queue.tenants.insert(tenant.into(), batch);
    }
}

/// Each request the engine got, by the first token of its prompt: its
/// `priority` (`None`: the body has none).
fn engine_priorities(fake: &FakeEngines) -> Vec<(u64, Option<i64>)> {
    let seen = fake.seen();
    let parsed = seen.iter().map(|s| serde_json::from_slice::<serde_json::Value>(&s.body));
    parsed
        .map(|b| {
            let b = b.expect("json");
            (b["prompt"][0].as_u64().unwrap_or(0), b.get("priority").and_then(|p| p.as_i64()))
        })
        .collect()
}

/// On a busy replica with priority scheduling: acme (interactive) asks for
/// priority 5 and waits in batch; noisy (batch) asks for -1 and stays in
/// batch; the front gateway's key may climb, so its -1 waits in
/// interactive; quiet sends none and waits in its tenant's interactive.
/// The interactive two go first though they came last, and the engine gets
/// the client's priority where it chose the band, else the band's.
#[tokio::test(start_paused = true)]
async fn a_requests_priority_chooses_its_band_but_only_a_trusted_key_climbs() {
    let (api, fake) = tenants_gateway_on(true, priority_bands).await;
    let senders: Vec<_> = (0..5).map(|_| feed(&fake)).collect();
    let first = send(&api, Some(QUIET), None, 1);
    until("the first request is at the engine", || fake.seen().len() == 1).await;
    let mut requests = vec![first];
    let waiting = [(NOISY, Some(-1), 1000), (ACME, Some(5), 3000), (FRONT, Some(-1), 4000)];
    for (i, (key, priority, prompt)) in waiting.into_iter().enumerate() {
        requests.push(send_with(&api, Some(key), None, prompt, priority));
        let queued = i + 1;
        let depth = || tenants(&api).iter().map(|t| t.queue_depth).sum::<u64>() as usize;
        until("the request waits", || depth() == queued).await;
    }
    requests.push(send(&api, Some(QUIET), None, 2000));
    until("quiet's second waits", || tenant(&api, "quiet").queue_depth == 1).await;
    serve_one_at_a_time(&fake, senders, requests).await;
    let seen = engine_priorities(&fake);
    assert_eq!(seen[0], (1, Some(0)), "no priority sent: interactive's");
    let mut interactive = seen[1..3].to_vec();
    interactive.sort_unstable();
    assert_eq!(interactive, [(2000, Some(0)), (4000, Some(-1))], "{seen:?}");
    let mut batch = seen[3..].to_vec();
    batch.sort_unstable();
    assert_eq!(batch, [(1000, Some(10)), (3000, Some(5))], "{seen:?}");
    assert_balanced(&api);
}

/// Without priority scheduling the engine never sees the client's
/// `priority`; a priority beyond every band, or not an integer, is a 400.
#[tokio::test(start_paused = true)]
async fn priority_is_removed_for_other_engines_and_a_bad_one_is_refused() {
    let (api, fake) = tenants_gateway_on(false, priority_bands).await;
    let (status, _, body) = send_with(&api, Some(QUIET), None, 1, Some(5)).await.expect("request");
    assert_eq!(status, 200, "{body}");
    let (status, _, body) = send(&api, Some(QUIET), None, 100).await.expect("request");
    assert_eq!(status, 200, "{body}");
    let seen = fake.seen();
    let bodies: Vec<serde_json::Value> =
        seen.iter().map(|s| serde_json::from_slice(&s.body).expect("json")).collect();
    assert_eq!(bodies.len(), 2);
    assert!(bodies.iter().all(|b| b.get("priority").is_none()), "{bodies:?}");
    assert_eq!(tenant(&api, "quiet").finished, 2);

    let (status, _, body) = send_with(&api, Some(QUIET), None, 1, Some(11)).await.expect("request");
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("priority 11 chooses no priority band"), "{body}");
    assert!(body.contains("interactive up to 0, batch up to 10"), "{body}");
    assert_eq!(tenant(&api, "quiet").arrived, 2, "a refused priority is not offered");

    for bad in [serde_json::json!(1.5), serde_json::json!("high")] {
        let mut request = completion_body(&api, 1);
        request["priority"] = bad;
        let request = Bytes::from(request.to_string());
        let refused = crate::request::prepare::completions(&api.preparer, request).await;
        let err = refused.expect_err("a non-integer priority is refused");
        assert!(err.error.message.contains("`priority` must be an integer"), "{err:?}");
    }
    assert_balanced(&api);
}
