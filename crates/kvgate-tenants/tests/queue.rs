//! The admission queue's rules, one at a time, in virtual time: strict
//! bands, work conservation, each limit and its answer, expiry, cancel,
//! settlement, tenant resolution and counters merged from peers.

#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use kvgate_tenants::{
    AdmissionQueue, Admit, BandId, Cancelled, RejectReason, Rejection, TenantConfig, TenantId,
    TenantsConfig, Usage,
};

const INTERACTIVE: BandId = BandId(0);
const BATCH: BandId = BandId(1);

fn config(tenants: &[(&str, TenantConfig)]) -> TenantsConfig {
    let mut config = TenantsConfig::default();
    for (name, tenant) in tenants {
        config.tenants.insert((*name).into(), tenant.clone());
    }
    config
}

fn admit(tenant: TenantId, input_tokens: u64) -> Admit {
    Admit { tenant, band: None, may_climb: false, input_tokens, max_output_tokens: 100 }
}

/// A queue at `t0` with the default config and tenant "a" resolved.
fn queue_with_a() -> (Instant, AdmissionQueue, TenantId) {
    queue_with("a", TenantConfig::default())
}

/// A queue at `t0` with one configured tenant, resolved.
fn queue_with(name: &str, tenant: TenantConfig) -> (Instant, AdmissionQueue, TenantId) {
    let t0 = Instant::now();
    let mut q = AdmissionQueue::new(&config(&[(name, tenant)]), t0).unwrap();
    let id = q.resolve(Some(name));
    (t0, q, id)
}

fn batch_tenant() -> TenantConfig {
    TenantConfig { band: Some("batch".into()), ..TenantConfig::default() }
}

fn always(_: &kvgate_tenants::QueuedRequest) -> bool {
    true
}

#[test]
fn bands_are_strict_whatever_the_counters() {
    let (t0, mut q, bulk) = queue_with("bulk", batch_tenant());
    let chat = q.resolve(Some("chat"));
    assert_eq!(q.tenant_band(chat), INTERACTIVE);
    assert_eq!(q.tenant_band(bulk), BATCH);
    // chat has used far more than bulk.
    q.enqueue(admit(chat, 100_000), t0).unwrap();
    q.next_dispatch(t0, always).unwrap();
    for _ in 0..5 {
        q.enqueue(admit(bulk, 10), t0).unwrap();
        q.enqueue(admit(chat, 10), t0).unwrap();
    }
    let order: Vec<BandId> =
        std::iter::from_fn(|| q.next_dispatch(t0, always)).map(|d| d.band).collect();
    assert_eq!(order, [[INTERACTIVE; 5], [BATCH; 5]].concat());
}

#[test]
fn a_request_cannot_climb_above_its_tenants_band() {
    let (t0, mut q, bulk) = queue_with("bulk", batch_tenant());
    let chat = q.resolve(None);
    let asked_up = Admit { band: Some(INTERACTIVE), ..admit(bulk, 1) };
    assert_eq!(q.enqueue(asked_up, t0).unwrap().band, BATCH);
    let asked_down = Admit { band: Some(BATCH), ..admit(chat, 1) };
    assert_eq!(q.enqueue(asked_down, t0).unwrap().band, BATCH);
}

#[test]
fn a_trusted_request_may_climb_above_its_tenants_band() {
    let (t0, mut q, bulk) = queue_with("bulk", batch_tenant());
    let climbing = Admit { band: Some(INTERACTIVE), may_climb: true, ..admit(bulk, 1) };
    let ticket = q.enqueue(climbing, t0).unwrap();
    assert_eq!(ticket.band, INTERACTIVE);
    // It waits, and is dispatched, in the band it climbed to.
    q.enqueue(admit(bulk, 1), t0).unwrap();
    let first = q.next_dispatch(t0, always).unwrap();
    assert_eq!((first.id, first.band), (ticket.id, INTERACTIVE));
    assert_eq!(q.next_dispatch(t0, always).unwrap().band, BATCH);
}

#[test]
fn dispatch_is_work_conserving() {
    let (t0, mut q, bulk) = queue_with("bulk", batch_tenant());
    let chat = q.resolve(Some("chat"));
    q.enqueue(admit(chat, 10), t0).unwrap();
    q.enqueue(admit(bulk, 10), t0).unwrap();
    // No replica meets the interactive target: batch goes anyway.
    let d = q.next_dispatch(t0, |head| head.band == BATCH).unwrap();
    assert_eq!(d.tenant, bulk);
    // Nothing can be taken: nothing is dispatched, nothing is lost.
    assert!(q.next_dispatch(t0, |_| false).is_none());
    assert_eq!(q.waiting(), 1);
    // The predicate sees the head it decides on.
    let mut seen = Vec::new();
    let d = q.next_dispatch(t0, |head| {
        seen.push((head.tenant, head.input_tokens));
        true
    });
    assert_eq!(d.unwrap().tenant, chat);
    assert_eq!(seen, [(chat, 10)]);
}

#[test]
fn within_a_tenant_first_come_first_served() {
    let (t0, mut q, a) = queue_with_a();
    let ids: Vec<_> = (0..4).map(|i| q.enqueue(admit(a, 10 + i), t0).unwrap().id).collect();
    q.cancel(ids[1], t0);
    let got: Vec<_> = std::iter::from_fn(|| q.next_dispatch(t0, always)).map(|d| d.id).collect();
    assert_eq!(got, [ids[0], ids[2], ids[3]]);
}

#[test]
fn the_smaller_counter_goes_first_and_weights_divide_charges() {
    let t0 = Instant::now();
    let heavy = TenantConfig { weight: 4.0, ..TenantConfig::default() };
    let mut q = AdmissionQueue::new(&config(&[("big", heavy)]), t0).unwrap();
    let big = q.resolve(Some("big"));
    let small = q.resolve(Some("small"));
    for _ in 0..10 {
        q.enqueue(admit(big, 100), t0).unwrap();
        q.enqueue(admit(small, 100), t0).unwrap();
    }
    let first: Vec<_> = (0..10).map(|_| q.next_dispatch(t0, always).unwrap().tenant).collect();
    // Weight 4 pays a quarter per token: four of big's for one of small's.
    assert_eq!(first.iter().filter(|&&t| t == big).count(), 8);
    assert_eq!(q.virtual_counter(big), 200.0);
    assert_eq!(q.virtual_counter(small), 200.0);
}

#[test]
fn a_returning_tenant_is_lifted_to_the_backlogged_minimum() {
    let t0 = Instant::now();
    let mut q = AdmissionQueue::new(&TenantsConfig::default(), t0).unwrap();
    let busy = q.resolve(Some("busy"));
    let idle = q.resolve(Some("idle"));
    for _ in 0..50 {
        let ticket = q.enqueue(admit(busy, 1_000), t0).unwrap();
        q.next_dispatch(t0, always).unwrap();
        q.finish(ticket.id, None, t0).unwrap();
    }
    q.enqueue(admit(busy, 1_000), t0).unwrap();
    q.enqueue(admit(idle, 1_000), t0).unwrap();
    assert_eq!(q.virtual_counter(idle), q.virtual_counter(busy));
    // With the queue empty, the last tenant to leave sets the floor.
    while q.next_dispatch(t0, always).is_some() {}
    let late = q.resolve(Some("late"));
    q.enqueue(admit(late, 1), t0).unwrap();
    assert!(q.virtual_counter(late) >= 50_000.0);
}

#[test]
fn in_flight_limit_counts_waiting_and_running_requests() {
    let (t0, mut q, a) =
        queue_with("a", TenantConfig { max_in_flight: Some(2), ..TenantConfig::default() });
    let first = q.enqueue(admit(a, 1), t0).unwrap();
    q.next_dispatch(t0, always).unwrap();
    q.enqueue(admit(a, 1), t0).unwrap();
    let refused = q.enqueue(admit(a, 1), t0).unwrap_err();
    assert_eq!(refused.reason(), RejectReason::InFlightLimit);
    assert_eq!(refused.status(), 429);
    assert!(refused.retry_after().is_some());
    q.finish(first.id, None, t0).unwrap();
    q.enqueue(admit(a, 1), t0).unwrap();
    let c = q.counters(a);
    assert_eq!((c.arrived, c.rejected.in_flight_limit), (4, 1));
    assert!(c.balanced());
}

#[test]
fn token_rate_reserves_at_admission_and_settles_from_usage() {
    let (t0, mut q, a) =
        queue_with("a", TenantConfig { tokens_per_minute: Some(1_000), ..TenantConfig::default() });
    // 400 + 100 reserved twice: the window is full.
    let first = q.enqueue(admit(a, 400), t0).unwrap();
    q.enqueue(admit(a, 400), t0).unwrap();
    let refused = q.enqueue(admit(a, 400), t0).unwrap_err();
    let Rejection::TokenRate { used, requested, retry_after, .. } = refused else {
        panic!("{refused:?}");
    };
    assert_eq!((used, requested), (1_000, 500));
    assert_eq!(retry_after, Duration::from_secs(60));
    // The first used 400 + 10 of its 500: 90 come back.
    q.next_dispatch(t0, always).unwrap();
    q.on_output_tokens(first.id, 10);
    let usage = Usage { input_tokens: 400, output_tokens: 10 };
    q.finish(first.id, Some(usage), t0).unwrap();
    // 410 used and 500 reserved: 100 more do not fit, until the waiting
    // request is cancelled and its reservation refunded.
    let refused = q.enqueue(admit(a, 0), t0).unwrap_err();
    assert_eq!(refused.reason(), RejectReason::TokenRate);
    let waiting = kvgate_tenants::RequestId(1);
    assert!(matches!(q.cancel(waiting, t0), Cancelled::Left(_)));
    q.enqueue(admit(a, 0), t0).unwrap();
    // A minute later the window is empty again.
    let later = t0 + Duration::from_secs(61);
    q.enqueue(admit(a, 800), later).unwrap();
    let c = q.counters(a);
    assert_eq!(c.rejected.token_rate, 2);
    assert_eq!(c.input_tokens_served, 400);
    assert_eq!(c.output_tokens_served, 10);
    assert!(c.balanced());
}

#[test]
fn a_full_band_answers_429_and_expiry_503_with_a_reason() {
    let t0 = Instant::now();
    let mut config = TenantsConfig::default();
    config.bands[0].max_queue = 2;
    config.bands[0].queue_ttl_ms = 1_000;
    let mut q = AdmissionQueue::new(&config, t0).unwrap();
    let a = q.resolve(Some("a"));
    q.enqueue(admit(a, 1), t0).unwrap();
    q.enqueue(admit(a, 1), t0 + Duration::from_millis(500)).unwrap();
    let full = q.enqueue(admit(a, 1), t0).unwrap_err();
    assert_eq!(full.reason(), RejectReason::QueueFull);
    assert_eq!(full.retry_after(), Some(Duration::from_secs(1)));
    assert_eq!(q.next_deadline(), Some(t0 + Duration::from_secs(1)));
    assert!(q.expire(t0 + Duration::from_millis(999)).is_empty());
    let expired = q.expire(t0 + Duration::from_millis(1_200));
    assert_eq!(expired.len(), 1);
    assert_eq!(expired[0].rejection.status(), 503);
    assert_eq!(expired[0].request.waited, Duration::from_millis(1_200));
    assert!(expired[0].rejection.to_string().contains("interactive"));
    let c = q.counters(a);
    assert_eq!((c.expired, c.queue_depth, c.rejected.queue_full), (1, 1, 1));
    assert!(c.balanced());
}

#[test]
fn cancel_leaves_at_once_and_unknown_ids_are_counted() {
    let (t0, mut q, a) = queue_with_a();
    let waiting = q.enqueue(admit(a, 5), t0).unwrap();
    let left = q.cancel(waiting.id, t0 + Duration::from_secs(2));
    let Cancelled::Left(request) = left else {
        panic!("{left:?}");
    };
    assert_eq!(request.waited, Duration::from_secs(2));
    assert_eq!(q.backlogged_tenants(INTERACTIVE), 0);
    assert_eq!(q.cancel(waiting.id, t0), Cancelled::Unknown);
    // A dispatched request that is cancelled finishes with what it produced.
    let running = q.enqueue(admit(a, 5), t0).unwrap();
    q.next_dispatch(t0, always).unwrap();
    q.on_output_tokens(running.id, 3);
    let Cancelled::Finished(finished) = q.cancel(running.id, t0) else {
        panic!("not finished");
    };
    assert_eq!(finished.usage.output_tokens, 3);
    assert!(q.finish(running.id, None, t0).is_none());
    q.on_output_tokens(running.id, 1);
    assert_eq!(q.unknown_ids(), 3);
    let c = q.counters(a);
    assert_eq!((c.cancelled, c.finished, c.in_flight), (1, 1, 0));
    assert!(c.balanced());
}

#[test]
fn output_is_charged_as_reported_and_settled_at_the_end() {
    let (t0, mut q, a) = queue_with_a();
    let ticket = q.enqueue(admit(a, 100), t0).unwrap();
    q.next_dispatch(t0, always).unwrap();
    assert_eq!(q.virtual_counter(a), 100.0);
    q.on_output_tokens(ticket.id, 10);
    assert_eq!(q.virtual_counter(a), 120.0);
    // The engine counted 98 prompt tokens and 12 output tokens.
    let usage = Usage { input_tokens: 98, output_tokens: 12 };
    q.finish(ticket.id, Some(usage), t0).unwrap();
    assert_eq!(q.virtual_counter(a), 98.0 + 24.0);
    assert_eq!(q.counters(a).input_tokens_served, 98);
    assert_eq!(q.counters(a).output_tokens_served, 12);
}

#[test]
fn unlisted_tenants_take_the_defaults_up_to_max_tenants() {
    let t0 = Instant::now();
    let mut config =
        config(&[("default", TenantConfig { max_in_flight: Some(1), ..TenantConfig::default() })]);
    config.max_tenants = 3;
    let mut q = AdmissionQueue::new(&config, t0).unwrap();
    let default = q.resolve(None);
    assert_eq!(q.tenant_name(default), "default");
    let x = q.resolve(Some("x"));
    let y = q.resolve(Some("y"));
    assert_ne!(x, y);
    assert_eq!(q.resolve(Some("z")), default);
    assert_eq!(q.resolve(Some("x")), x);
    assert_eq!(q.tenant_count(), 3);
    // Each unlisted tenant has the default's limit, and its own count.
    q.enqueue(admit(x, 1), t0).unwrap();
    q.enqueue(admit(y, 1), t0).unwrap();
    assert!(q.enqueue(admit(x, 1), t0).is_err());
}

#[test]
fn peers_counters_order_dispatch_and_snapshots_round_trip() {
    let t0 = Instant::now();
    let config = TenantsConfig::default();
    let mut here = AdmissionQueue::new(&config, t0).unwrap().with_identity("here", 1);
    let mut there = AdmissionQueue::new(&config, t0).unwrap().with_identity("there", 1);
    // "a" was served on the other instance.
    let a_there = there.resolve(Some("a"));
    let ticket = there.enqueue(admit(a_there, 5_000), t0).unwrap();
    there.next_dispatch(t0, always).unwrap();
    there.on_output_tokens(ticket.id, 100);
    let snapshot = there.export_shard(true, t0);
    let wire = serde_json::to_string(&snapshot).unwrap();
    let snapshot: kvgate_tenants::ShardSnapshot = serde_json::from_str(&wire).unwrap();
    let a = here.resolve(Some("a"));
    let b = here.resolve(Some("b"));
    assert_eq!(here.merge_shard(&snapshot), 1);
    assert_eq!(here.merge_shard(&snapshot), 0);
    assert_eq!(here.virtual_counter(a), 5_200.0);
    // b waits first (a joining later is lifted to b's counter, never
    // lowered): b, far behind a fleet-wide, goes first.
    here.enqueue(admit(b, 10), t0).unwrap();
    here.enqueue(admit(a, 10), t0).unwrap();
    assert_eq!(here.next_dispatch(t0, always).unwrap().tenant, b);
    // A delta carries only what changed; forgetting the peer drops it.
    assert!(there.export_shard(false, t0).tenants.is_empty());
    assert_eq!(here.forget_peer("there"), 1);
    assert_eq!(here.virtual_counter(a), 0.0);
    assert_eq!(here.peer_count(), 0);
}

#[test]
fn token_rate_is_fleet_wide() {
    let t0 = Instant::now();
    let limited = TenantConfig { tokens_per_minute: Some(1_000), ..TenantConfig::default() };
    let config = config(&[("a", limited)]);
    let mut here = AdmissionQueue::new(&config, t0).unwrap().with_identity("here", 1);
    let mut there = AdmissionQueue::new(&config, t0).unwrap().with_identity("there", 1);
    let a_there = there.resolve(Some("a"));
    there.enqueue(admit(a_there, 700), t0).unwrap();
    here.merge_shard(&there.export_shard(false, t0));
    let a = here.resolve(Some("a"));
    // 800 reserved there: 200 + 100 do not fit here, 100 + 100 do.
    let refused = here.enqueue(admit(a, 200), t0).unwrap_err();
    assert_eq!(refused.reason(), RejectReason::TokenRate);
    here.enqueue(admit(a, 100), t0).unwrap();
    assert!(here.enqueue(admit(a, 0), t0).is_err());
    // The peer's request was cancelled: its refund travels with the next
    // delta.
    there.cancel(kvgate_tenants::RequestId(0), t0);
    here.merge_shard(&there.export_shard(false, t0));
    here.enqueue(admit(a, 700), t0).unwrap();
}
