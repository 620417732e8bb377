//! Behaviour of the decision path: health, admission, tentative blocks,
//! explanations, reconciliation, expiry, peers and each baseline.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use kvgate_index::{BlockKey, PrefixMatch, ReplicaId};
use kvgate_router::{
    AdmissionMode, Decision, EngineReport, Health, LedgerChange, Outcome, PeerId, PolicyKind,
    Reason, RejectReason, ReplicaInfo, RouteRequest, Router, RouterConfig, RouterError,
    RouterMetrics,
};

fn router_with(cfg: RouterConfig, n: u32) -> Router {
    let cfg = RouterConfig { seed: cfg.seed.or(Some(11)), ..cfg };
    let mut r = Router::new(cfg, Arc::new(RouterMetrics::default())).unwrap();
    for i in 0..n {
        let mut info = ReplicaInfo::new(format!("http://r{i}"), 16);
        info.capacity_blocks = [10_000, 0, 0];
        r.add_replica(ReplicaId(i), info).unwrap();
    }
    r
}

fn router(policy: PolicyKind, n: u32) -> Router {
    router_with(RouterConfig { policy, ..RouterConfig::default() }, n)
}

fn keys(n: u64, salt: u64) -> Vec<BlockKey> {
    (0..n).map(|i| BlockKey(salt << 32 | i)).collect()
}

fn gpu(blocks: u32) -> PrefixMatch {
    PrefixMatch { total: blocks, gpu: blocks, gpu_prefix: blocks, ..PrefixMatch::default() }
}

fn req(keys: &[BlockKey]) -> RouteRequest<'_> {
    RouteRequest { prompt_tokens: keys.len() as u64 * 16 + 5, keys, ..RouteRequest::default() }
}

fn report(running: u32, waiting: u32, kv: f64, at: Instant) -> EngineReport {
    EngineReport {
        running,
        waiting,
        kv_usage: kv,
        prefix_cache_queries: 0,
        prefix_cache_hits: 0,
        timing: None,
        at,
    }
}

#[test]
fn follows_the_cache_when_load_is_equal() {
    let mut r = router(PolicyKind::KvAware, 4);
    let k = keys(256, 1);
    let now = Instant::now();
    let matches = [gpu(0), gpu(200), gpu(10), gpu(0)];
    let routed = r.decide_with_matches(&req(&k), &matches, now).routed().unwrap();
    assert_eq!(routed.replica, ReplicaId(1));
    assert_eq!(routed.cached_blocks, 200);
    let e = routed.explanation.as_ref().unwrap();
    assert_eq!(e.reason, Reason::LowestCost);
    assert_eq!(e.candidates.len(), 4);
    let chosen = e.chosen_candidate().unwrap();
    assert_eq!(chosen.overlap_blocks, [200, 0, 0]);
    assert!(e.candidates.iter().all(|c| c.predicted_ttft_s >= chosen.predicted_ttft_s));
    // The booking holds the uncached tokens only.
    let load = r.load(ReplicaId(1)).unwrap().load;
    assert_eq!(load.pending_prefill_tokens, 56 * 16 + 5);
}

#[test]
fn lower_tiers_cost_a_transfer_not_a_recompute() {
    let mut r = router(PolicyKind::KvAware, 3);
    let k = keys(256, 2);
    let now = Instant::now();
    let cpu = PrefixMatch { total: 200, gpu: 0, cpu: 200, storage: 0, gpu_prefix: 0 };
    let e = r.decide_with_matches(&req(&k), &[gpu(0), cpu, gpu(200)], now);
    let e = e.routed().unwrap().explanation.unwrap();
    let [cold, warm_cpu, warm_gpu] = [0, 1, 2].map(|i| e.candidates[i].predicted_ttft_s);
    assert!(warm_gpu < warm_cpu && warm_cpu < cold, "{cold} {warm_cpu} {warm_gpu}");
}

#[test]
fn degraded_views_count_no_overlap_and_down_replicas_are_skipped() {
    let mut r = router(PolicyKind::KvAware, 2);
    let k = keys(128, 3);
    let now = Instant::now();
    r.set_health(ReplicaId(0), Health::Degraded).unwrap();
    let d = r.decide_with_matches(&req(&k), &[gpu(128), gpu(0)], now).routed().unwrap();
    let c0 = d.explanation.as_ref().unwrap().candidates[0];
    assert_eq!(c0.overlap_blocks, [0, 0, 0], "a rebuilding view is not evidence");
    r.set_health(ReplicaId(1), Health::Down).unwrap();
    r.set_health(ReplicaId(0), Health::Down).unwrap();
    match r.decide_with_matches(&req(&k), &[], now) {
        Decision::Reject { reason: RejectReason::NoReplica, .. } => {}
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        r.set_health(ReplicaId(9), Health::Down),
        Err(RouterError::UnknownReplica(_))
    ));
}

#[test]
fn all_busy_waits_boundedly_then_rejects() {
    let cfg = RouterConfig {
        busy_pending_tokens: 1000,
        max_queue_wait_ms: 500,
        ..RouterConfig::default()
    };
    let mut r = router_with(cfg, 2);
    let k = keys(100, 4);
    let t0 = Instant::now();
    // Two requests of 1605 tokens make both replicas busy.
    let _a = r.decide_with_matches(&req(&k), &[], t0).routed().unwrap();
    let _b = r.decide_with_matches(&req(&k), &[], t0).routed().unwrap();
    assert_ne!(_a.replica, _b.replica, "the second goes to the idle one");
    let mut q = req(&k);
    match r.decide_with_matches(&q, &[], t0) {
        Decision::Wait { retry_after } => assert_eq!(retry_after, Duration::from_millis(50)),
        other => panic!("{other:?}"),
    }
    q.queued_since = Some(t0);
    assert!(matches!(
        r.decide_with_matches(&q, &[], t0 + Duration::from_millis(400)),
        Decision::Wait { .. }
    ));
    assert!(matches!(
        r.decide_with_matches(&q, &[], t0 + Duration::from_millis(600)),
        Decision::Reject { reason: RejectReason::AllBusy, .. }
    ));
    // Finishing one frees a replica; the queued request is routed.
    r.finish(_a.booking, Outcome::Finished);
    let d = r.decide_with_matches(&q, &[], t0 + Duration::from_millis(700));
    assert!(matches!(d, Decision::Routed(_)));
    let m = r.metrics();
    assert_eq!(m.waits.load(std::sync::atomic::Ordering::Relaxed), 2);
    assert_eq!(m.rejected.load(std::sync::atomic::Ordering::Relaxed), 1);
    // The log has the first Wait, the reject and the routing, not the
    // waiter's re-poll in between.
    let reasons: Vec<&str> = r.recent_decisions().map(|e| e.reason.label()).collect();
    assert_eq!(reasons.iter().filter(|r| **r == "all_busy_wait").count(), 1, "{reasons:?}");

    let cfg = RouterConfig {
        busy_kv_usage: 0.9,
        admission: AdmissionMode::Reject,
        ..RouterConfig::default()
    };
    let mut r = router_with(cfg, 1);
    r.report(ReplicaId(0), report(10, 0, 0.95, t0)).unwrap();
    assert!(matches!(
        r.decide_with_matches(&req(&k), &[], t0),
        Decision::Reject { reason: RejectReason::AllBusy, .. }
    ));
    // A stale report no longer counts.
    let later = t0 + Duration::from_secs(60);
    assert!(matches!(r.decide_with_matches(&req(&k), &[], later), Decision::Routed(_)));
}

#[test]
fn a_request_already_running_is_booked_on_its_busy_replica_and_refused_only_when_down() {
    let cfg = RouterConfig { busy_pending_tokens: 1000, ..RouterConfig::default() };
    let mut r = router_with(cfg, 2);
    let k = keys(100, 4);
    let t0 = Instant::now();
    let _a = r.decide_with_matches(&req(&k), &[], t0).routed().unwrap();
    let _b = r.decide_with_matches(&req(&k), &[], t0).routed().unwrap();
    let other = [_b.replica];
    let pinned = RouteRequest { exclude: &other, ..req(&k) };
    assert!(
        matches!(r.decide_with_matches(&pinned, &[], t0), Decision::Wait { .. }),
        "a new request waits for the busy replica"
    );
    let running = RouteRequest { already_running: true, ..pinned };
    let d = r.decide_with_matches(&running, &[], t0).routed().expect("booked although busy");
    assert_eq!(d.replica, _a.replica);
    assert_eq!(r.load(_a.replica).unwrap().load.requests(), 2);
    r.set_health(_a.replica, Health::Down).unwrap();
    assert!(matches!(
        r.decide_with_matches(&running, &[], t0),
        Decision::Reject { reason: RejectReason::NoReplica, .. }
    ));
}

#[test]
fn a_burst_follows_its_own_tentative_blocks_until_the_queue_outweighs_them() {
    let mut r = router(PolicyKind::KvAware, 4);
    let k = keys(256, 5); // 4096-token shared prompt
    let now = Instant::now();
    let first = r.decide_with_matches(&req(&k), &[], now).routed().unwrap();
    // No events yet: the second sees the first's blocks as tentative hits.
    let second = r.decide_with_matches(&req(&k), &[], now).routed().unwrap();
    let e = second.explanation.as_ref().unwrap();
    let c = e.candidates.iter().find(|c| c.replica == first.replica).unwrap();
    assert_eq!(c.tentative_blocks, 256);
    assert!(r.tentative_stats().added >= 256);
    // Requests with the shared prefix and distinct 128-token suffixes: the
    // warm replica wins while its queue is short; once its queue outweighs
    // a cold prefill of the prefix, the cold replicas win, which warms them.
    let mut counts = [0u32; 4];
    counts[first.replica.index()] += 2;
    let mut held = vec![first, second];
    for i in 0..40u64 {
        let mut ki = k.clone();
        ki.extend(keys(8, 1000 + i));
        let d = r.decide_with_matches(&req(&ki), &[], now).routed().unwrap();
        let e = d.explanation.clone().unwrap();
        let chosen = e.chosen_candidate().unwrap();
        // Whatever it chose was predicted (near-)fastest: within the
        // selection band of the best.
        let best = e.candidates.iter().map(|c| c.score).fold(f64::INFINITY, f64::min);
        assert!(chosen.score <= best * (1.0 + r.config().epsilon) + 1e-12);
        counts[d.replica.index()] += 1;
        held.push(d);
    }
    assert!(counts.iter().all(|&c| c > 0), "{counts:?}");
    assert!(*counts.iter().max().unwrap() <= 21, "{counts:?}");
    // The TTL expires them, unconfirmed (no index to confirm).
    r.maintain(now + Duration::from_secs(31), None);
    let s = r.tentative_stats();
    assert_eq!(s.live, 0);
    assert_eq!(s.expired_unconfirmed, s.added);
}

#[test]
fn bookings_expire_and_drops_are_counted() {
    let cfg = RouterConfig { booking_timeout_ms: 10_000, ..RouterConfig::default() };
    let mut r = router_with(cfg, 2);
    let k = keys(10, 6);
    let t0 = Instant::now();
    let a = r.decide_with_matches(&req(&k), &[], t0).routed().unwrap();
    let b = r.decide_with_matches(&req(&k), &[], t0).routed().unwrap();
    r.abandon(b.booking);
    assert_eq!(r.ledger_totals().dropped, 1);
    r.maintain(t0 + Duration::from_secs(11), None);
    let t = r.ledger_totals();
    assert_eq!((t.expired, r.in_flight()), (1, 0));
    // The late finish is counted, not double-released.
    r.finish(a.booking, Outcome::Finished);
    let t = r.ledger_totals();
    assert_eq!((t.finished, t.late_updates), (0, 1));
}

#[test]
fn first_token_measures_ttft_and_feeds_calibration() {
    let mut r = router(PolicyKind::KvAware, 1);
    let t0 = Instant::now();
    let before = r.load(ReplicaId(0)).unwrap().prefill_s_per_token;
    for i in 0..10 {
        let t = t0 + Duration::from_secs(i * 10);
        // Distinct prompts: no tentative hits.
        let k = keys(512, 100 + i);
        let d = r.decide_with_matches(&req(&k), &[], t).routed().unwrap();
        // Twice as slow as the prior (16k tokens/s): about 1 s of prefill.
        let ttft = r.first_token(d.booking, t + Duration::from_millis(1020)).unwrap();
        assert_eq!(ttft, Duration::from_millis(1020));
        assert_eq!(r.first_token(d.booking, t + Duration::from_secs(2)), None);
        r.finish(d.booking, Outcome::Finished);
    }
    let after = r.load(ReplicaId(0)).unwrap();
    assert!(after.calibration_samples == 10);
    let ratio = after.prefill_s_per_token / before;
    assert!((1.8..2.2).contains(&ratio), "{ratio}");
}

#[test]
fn reconciliation_releases_lost_bookings_and_counts_foreign_load() {
    let mut r = router(PolicyKind::KvAware, 2);
    let k = keys(10, 8);
    let t0 = Instant::now();
    let held: Vec<_> = (0..10)
        .map(|_| r.decide_with_matches(&req(&k), &[gpu(10), gpu(0)], t0).routed().unwrap())
        .collect();
    let on0 = held.iter().filter(|d| d.replica == ReplicaId(0)).count() as u32;
    assert!(on0 >= 5);
    // The engine says it runs nothing: after 5 reports, the books follow.
    for i in 0..5 {
        r.report(ReplicaId(0), report(0, 0, 0.0, t0 + Duration::from_secs(i))).unwrap();
    }
    let v = r.load(ReplicaId(0)).unwrap();
    assert_eq!(v.load.requests(), 2, "tolerance of 2 in-transit requests");
    assert_eq!(r.ledger_totals().reconciled, u64::from(on0 - 2));
    // Someone else's 30 waiting requests show up as load.
    for i in 0..5 {
        r.report(ReplicaId(1), report(0, 30, 0.0, t0 + Duration::from_secs(i))).unwrap();
    }
    let v = r.load(ReplicaId(1)).unwrap();
    assert!(v.external_waiting > 20, "{v:?}");
    let d = r.decide_with_matches(&req(&k), &[], t0 + Duration::from_secs(5)).routed().unwrap();
    let c1 = d.explanation.as_ref().unwrap().candidates[1];
    assert!(c1.pending_prefill_tokens > 0);
    drop(held);
}

#[test]
fn peer_bookings_count_as_load_and_age_out() {
    let mut r = router(PolicyKind::LeastLoad, 2);
    let t0 = Instant::now();
    let book = LedgerChange::Book { id: 1, replica: ReplicaId(0), prefill_tokens: 5000, blocks: 9 };
    assert!(r.apply_peer(PeerId(3), &book, t0));
    assert!(!r.apply_peer(PeerId(3), &book, t0), "a repeat refreshes, never double-books");
    let k = keys(4, 9);
    let d = r.decide_with_matches(&req(&k), &[], t0).routed().unwrap();
    assert_eq!(d.replica, ReplicaId(1), "the peer's load steers us away");
    assert!(r.apply_peer(PeerId(3), &LedgerChange::FirstToken { id: 1 }, t0));
    assert_eq!(r.load(ReplicaId(0)).unwrap().load.decoding_requests, 1);
    r.maintain(t0 + Duration::from_secs(61), None);
    assert_eq!(r.ledger_totals().peer_gone, 1);
    assert!(r.apply_peer(PeerId(4), &book, t0));
    assert_eq!(r.forget_peer(PeerId(4)), 1);
    assert!(!r.apply_peer(PeerId(4), &LedgerChange::Finish { id: 1 }, t0));
    // Unknown replicas are refused.
    let bad = LedgerChange::Book { id: 2, replica: ReplicaId(77), prefill_tokens: 1, blocks: 1 };
    assert!(!r.apply_peer(PeerId(4), &bad, t0));
    // Local changes are offered to peers when sharing is on.
    r.share_with_peers(true);
    let d2 = r.decide_with_matches(&req(&k), &[], t0).routed().unwrap();
    r.finish(d2.booking, Outcome::Finished);
    let mut out = Vec::new();
    assert_eq!(r.drain_ledger_changes(&mut out), 0);
    assert!(matches!(out[0], LedgerChange::Book { .. }));
    assert!(matches!(out[1], LedgerChange::Finish { .. }));
    drop(d);
}

#[test]
fn a_peers_tentative_blocks_draw_the_same_prefix() {
    // Instance A routes a prompt and shares the blocks it will cache.
    let mut a = router(PolicyKind::KvAware, 4);
    a.share_with_peers(true);
    let k = keys(64, 5);
    let t0 = Instant::now();
    let first = a.decide_with_matches(&req(&k), &[gpu(0); 4], t0).routed().unwrap();
    let mut shared = Vec::new();
    a.drain_tentative_changes(&mut shared);
    assert_eq!(shared.len(), 1);
    assert_eq!(shared[0].0, first.replica);
    assert_eq!(shared[0].1, k);
    // Instance B, which has seen no KV event yet, gets the same prompt: with
    // A's tentative blocks it goes where A sent the first (and counts them),
    // as one instance would; without, it picks by load alone.
    let mut b = router(PolicyKind::KvAware, 4);
    let book =
        LedgerChange::Book { id: 1, replica: first.replica, prefill_tokens: 1029, blocks: 64 };
    b.apply_peer(PeerId(1), &book, t0);
    b.apply_peer_tentative(first.replica, &shared[0].1, t0);
    let d = b.decide_with_matches(&req(&k), &[gpu(0); 4], t0 + Duration::from_millis(1));
    let d = d.routed().unwrap();
    assert_eq!(d.replica, first.replica, "a peer's tentative prefix is followed");
    let mut c = router(PolicyKind::KvAware, 4);
    c.apply_peer(PeerId(1), &book, t0);
    let e = c.decide_with_matches(&req(&k), &[gpu(0); 4], t0).routed().unwrap();
    assert_ne!(e.replica, first.replica, "without it, the peer's load steers away");
}

#[test]
fn removing_a_replica_releases_its_bookings() {
    let mut r = router(PolicyKind::RoundRobin, 2);
    let k = keys(4, 10);
    let t0 = Instant::now();
    let a = r.decide_with_matches(&req(&k), &[], t0).routed().unwrap();
    let b = r.decide_with_matches(&req(&k), &[], t0).routed().unwrap();
    assert_ne!(a.replica, b.replica);
    r.remove_replica(a.replica).unwrap();
    assert_eq!(r.ledger_totals().replica_removed, 1);
    assert_eq!(r.in_flight(), 1);
    for _ in 0..5 {
        let d = r.decide_with_matches(&req(&k), &[], t0).routed().unwrap();
        assert_eq!(d.replica, b.replica);
    }
    assert!(matches!(r.remove_replica(a.replica), Err(RouterError::UnknownReplica(_))));
    drop((a, b));
}

#[test]
fn baselines_behave_like_their_namesakes() {
    let t0 = Instant::now();
    let k = keys(64, 11);
    // round_robin cycles.
    let mut r = router(PolicyKind::RoundRobin, 3);
    let seq: Vec<_> = (0..6)
        .map(|_| r.decide_with_matches(&req(&k), &[], t0).routed().unwrap().replica.0)
        .collect();
    assert_eq!(seq, [0, 1, 2, 0, 1, 2]);
    // session_affinity: same key, same replica; different keys spread.
    let mut r = router(PolicyKind::SessionAffinity, 4);
    let mut seen = std::collections::HashSet::new();
    for s in 0..40 {
        let key = format!("user-{s}");
        let q = RouteRequest { session_key: Some(&key), ..req(&k) };
        let a = r.decide_with_matches(&q, &[], t0).routed().unwrap().replica;
        let b = r.decide_with_matches(&q, &[], t0).routed().unwrap().replica;
        assert_eq!(a, b);
        seen.insert(a);
    }
    assert_eq!(seen.len(), 4);
    // linear_blocks: overlap wins when load is equal.
    let mut r = router(PolicyKind::LinearBlocks, 3);
    let d = r.decide_with_matches(&req(&k), &[gpu(0), gpu(0), gpu(60)], t0).routed().unwrap();
    assert_eq!(d.replica, ReplicaId(2));
    // least_load and power_of_two avoid the loaded replica.
    for policy in [PolicyKind::LeastLoad, PolicyKind::PowerOfTwo] {
        let mut r = router(policy, 2);
        let book =
            LedgerChange::Book { id: 1, replica: ReplicaId(0), prefill_tokens: 9000, blocks: 0 };
        r.apply_peer(PeerId(0), &book, t0);
        for _ in 0..5 {
            let d = r.decide_with_matches(&req(&k), &[], t0).routed().unwrap();
            assert_eq!(d.replica, ReplicaId(1), "{policy}");
            r.finish(d.booking, Outcome::Finished);
        }
    }
    // random uses everyone.
    let mut r = router(PolicyKind::Random, 3);
    let mut seen = [0; 3];
    for _ in 0..60 {
        seen[r.decide_with_matches(&req(&k), &[], t0).routed().unwrap().replica.index()] += 1;
    }
    assert!(seen.iter().all(|&c| c > 5), "{seen:?}");
}

#[test]
fn approx_prefix_follows_text_it_sent_and_rebalances() {
    let mut r = router(PolicyKind::ApproxPrefix, 3);
    let t0 = Instant::now();
    let k = keys(8, 12);
    let text = |s: &str| s.chars().map(|c| c as u32).collect::<Vec<u32>>();
    let a = text("You are a helpful assistant. Question one?");
    let b = text("You are a helpful assistant. Question two!");
    let c = text("Completely different prompt text here......");
    let qa = RouteRequest { approx_symbols: Some(&a), ..req(&k) };
    let first = r.decide_with_matches(&qa, &[], t0).routed().unwrap();
    let qb = RouteRequest { approx_symbols: Some(&b), ..req(&k) };
    let second = r.decide_with_matches(&qb, &[], t0).routed().unwrap();
    assert_eq!(second.replica, first.replica);
    assert!(matches!(
        second.explanation.as_ref().unwrap().reason,
        Reason::ApproxMatch { matched } if matched > 0.5
    ));
    // Below the threshold: the replica with the least remembered text.
    let qc = RouteRequest { approx_symbols: Some(&c), ..req(&k) };
    let third = r.decide_with_matches(&qc, &[], t0).routed().unwrap();
    assert_ne!(third.replica, first.replica);
    assert_eq!(third.explanation.as_ref().unwrap().reason, Reason::ApproxSmallestTree);
    // Imbalance beyond both thresholds: fewest requests, whatever matches.
    let mut held = Vec::new();
    for i in 0..70u64 {
        let book =
            LedgerChange::Book { id: i, replica: first.replica, prefill_tokens: 1, blocks: 0 };
        r.apply_peer(PeerId(1), &book, t0);
    }
    let d = r.decide_with_matches(&qa, &[], t0).routed().unwrap();
    assert_ne!(d.replica, first.replica);
    assert_eq!(d.explanation.as_ref().unwrap().reason, Reason::ApproxImbalance);
    held.push(d);
    assert!(r.approx_memory().0 > 0);
}

#[test]
fn the_decision_log_keeps_the_last_n() {
    let cfg = RouterConfig { explain_last: 3, ..RouterConfig::default() };
    let mut r = router_with(cfg, 2);
    let k = keys(4, 13);
    let t0 = Instant::now();
    let mut held = Vec::new();
    for _ in 0..5 {
        held.push(r.decide_with_matches(&req(&k), &[], t0).routed().unwrap());
    }
    let ids: Vec<_> = r.recent_decisions().map(|e| e.booking.unwrap()).collect();
    assert_eq!(ids, [held[2].booking.id(), held[3].booking.id(), held[4].booking.id()]);
    let cfg = RouterConfig { explain_last: 0, ..RouterConfig::default() };
    let mut r = router_with(cfg, 2);
    assert!(r.decide_with_matches(&req(&k), &[], t0).routed().unwrap().explanation.is_none());
    assert_eq!(r.recent_decisions().count(), 0);
}

#[test]
fn bad_configs_and_replicas_are_refused() {
    let cfg = RouterConfig { temperature: 0.0, ..RouterConfig::default() };
    assert!(Router::new(cfg, Arc::new(RouterMetrics::default())).is_err());
    let mut r = router(PolicyKind::KvAware, 1);
    assert!(matches!(
        r.add_replica(ReplicaId(0), ReplicaInfo::new("again", 16)),
        Err(RouterError::DuplicateReplica(_))
    ));
    assert!(matches!(
        r.add_replica(ReplicaId(1), ReplicaInfo::new("zero", 0)),
        Err(RouterError::InvalidReplica { .. })
    ));
}

#[test]
fn a_large_fleet_logs_only_its_cheapest_candidates() {
    let cfg = RouterConfig { explain_candidates: 3, ..RouterConfig::default() };
    let mut r = router_with(cfg, 8);
    let k = keys(64, 9);
    let now = Instant::now();
    // Replicas 2, 5 and 6 hold some of the prompt (cheapest), the rest none.
    let matches = [gpu(0), gpu(0), gpu(40), gpu(0), gpu(0), gpu(60), gpu(20), gpu(0)];
    let routed = r.decide_with_matches(&req(&k), &matches, now).routed().unwrap();
    assert_eq!(routed.replica, ReplicaId(5));
    let e = routed.explanation.as_ref().unwrap();
    assert_eq!(e.candidates_total, 8);
    let kept: Vec<u32> = e.candidates.iter().map(|c| c.replica.0).collect();
    assert_eq!(kept, [2, 5, 6], "the three cheapest, in replica order");
    assert_eq!(e.chosen_candidate().unwrap().overlap_blocks, [60, 0, 0]);

    // 0 keeps every row.
    let mut r = router_with(RouterConfig { explain_candidates: 0, ..RouterConfig::default() }, 8);
    let routed = r.decide_with_matches(&req(&k), &matches, now).routed().unwrap();
    let e = routed.explanation.as_ref().unwrap();
    assert_eq!((e.candidates.len(), e.candidates_total), (8, 8));
}

/// The load listener hears every drop in a booking's load, whatever its
/// path (first token once, finish, drop), and nothing else.
#[test]
fn the_load_listener_hears_first_tokens_and_releases() {
    use std::sync::atomic::{AtomicU32, Ordering};
    let mut r = router(PolicyKind::LeastLoad, 2);
    let calls = Arc::new(AtomicU32::new(0));
    let c = Arc::clone(&calls);
    r.on_load_change(Arc::new(move || {
        c.fetch_add(1, Ordering::SeqCst);
    }));
    let k = keys(4, 7);
    let now = Instant::now();
    let a = r.decide_with_matches(&req(&k), &[gpu(0), gpu(0)], now).routed().unwrap();
    let b = r.decide_with_matches(&req(&k), &[gpu(0), gpu(0)], now).routed().unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 0, "booking adds load: no call");
    r.first_token(a.booking, now);
    r.first_token(a.booking, now);
    assert_eq!(calls.load(Ordering::SeqCst), 1, "the first token once");
    r.finish(a.booking, Outcome::Finished);
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    r.abandon(b.booking);
    assert_eq!(calls.load(Ordering::SeqCst), 3, "an abandoned booking is released too");
}

/// Requests for four adapters on four replicas with one GPU slot each:
/// `kv_aware` keeps each adapter where it is resident (a load per adapter,
/// once), `least_load` does not know and loads on most requests.
#[test]
fn adapters_stay_where_their_slot_is() {
    let loads = |policy| {
        let mut r = router(policy, 4);
        for i in 0..4 {
            r.report_adapters(ReplicaId(i), 1, &[]).unwrap();
        }
        // Block keys differ per adapter (the LoRA name is in them).
        let ks: Vec<_> = (0..4).map(|a| keys(8, 20 + a)).collect();
        let now = Instant::now();
        let names = ["a", "b", "c", "d"];
        for n in 0..40 {
            let a = (n * 3 + n / 4) % 4;
            let q = RouteRequest { adapter: Some(names[a]), ..req(&ks[a]) };
            let routed = r.decide_with_matches(&q, &[], now).routed().unwrap();
            r.finish(routed.booking, Outcome::Finished);
        }
        r.metrics().adapter_loads.load(std::sync::atomic::Ordering::Relaxed)
    };
    assert_eq!(loads(PolicyKind::KvAware), 4);
    assert!(loads(PolicyKind::RoundRobin) > 20);
}

/// Every slot busy with other adapters' requests: a replica that would
/// have to wait for a slot costs more than one with a free slot, and the
/// cost is in the prediction; without a known slot count nothing changes.
#[test]
fn a_full_set_of_slots_is_a_wait() {
    let mut r = router(PolicyKind::KvAware, 2);
    let k = keys(8, 10);
    let now = Instant::now();
    let unknown = r.decide_with_matches(&RouteRequest { adapter: Some("x"), ..req(&k) }, &[], now);
    let unknown = unknown.routed().unwrap();
    r.finish(unknown.booking, Outcome::Finished);
    for i in 0..2 {
        r.report_adapters(ReplicaId(i), 1, &[]).unwrap();
    }
    // "a" runs on replica 0 (booked, not finished).
    let pin = RouteRequest { adapter: Some("a"), exclude: &[ReplicaId(1)], ..req(&k) };
    let a = r.decide_with_matches(&pin, &[], now).routed().unwrap();
    assert_eq!(a.replica, ReplicaId(0));
    // "b": replica 0 would wait for a's slot, replica 1 only loads it.
    let b = r.decide_with_matches(&RouteRequest { adapter: Some("b"), ..req(&k) }, &[], now);
    let b = b.routed().unwrap();
    assert_eq!(b.replica, ReplicaId(1));
    let e = b.explanation.unwrap();
    let [c0, c1] = [0, 1].map(|i| e.candidates[i].predicted_ttft_s);
    assert!(c0 > c1 + 0.5, "slot wait {c0} vs load {c1}");
}

/// An adapter's load time is learnt from the TTFTs of requests that had to
/// load it (like a cold prefix), and those TTFTs do not teach the prefill
/// line that the replica is slow.
#[test]
fn an_adapter_load_is_calibrated_from_ttfts() {
    let mut r = router(PolicyKind::KvAware, 2);
    for i in 0..2 {
        r.report_adapters(ReplicaId(i), 1, &[]).unwrap();
    }
    let k = keys(8, 30);
    let mut now = Instant::now();
    let predicted = |r: &mut Router, adapter: Option<&str>, now: Instant| {
        let d = r.decide_with_matches(&RouteRequest { adapter, ..req(&k) }, &[], now);
        let d = d.routed().unwrap();
        let e = d.explanation.clone().unwrap();
        let p = e.candidates.iter().find(|c| c.replica == d.replica).unwrap().predicted_ttft_s;
        (d, p)
    };
    let (first, before) = predicted(&mut r, Some("fresh-0"), now);
    r.finish(first.booking, Outcome::Finished);
    // Every request names a new adapter, so each one loads; each load
    // takes 0.4 s more than the prefill.
    for n in 1..40 {
        now += Duration::from_secs(1);
        let name = format!("fresh-{n}");
        let (d, _) = predicted(&mut r, Some(&name), now);
        r.first_token(d.booking, now + Duration::from_millis(400 + 5));
        r.finish(d.booking, Outcome::Finished);
    }
    now += Duration::from_secs(1);
    let (d, after) = predicted(&mut r, Some("fresh-new"), now);
    r.finish(d.booking, Outcome::Finished);
    assert!(before < 0.1, "the prior load is 50 ms: {before}");
    assert!((0.3..0.5).contains(&after), "a learnt 0.4 s load: {after}");
    let (d, base) = predicted(&mut r, None, now);
    r.finish(d.booking, Outcome::Finished);
    assert!(base < 0.1, "the prefill line stays fast: {base}");
}

#[test]
fn routed_decisions_are_counted_by_their_reason() {
    let t0 = Instant::now();
    let k = keys(64, 12);
    let metrics = Arc::new(RouterMetrics::default());
    let cfg = RouterConfig { seed: Some(3), ..RouterConfig::default() };
    let mut r = Router::new(cfg, Arc::clone(&metrics)).unwrap();
    let mut info = ReplicaInfo::new("http://r0".to_owned(), 16);
    info.capacity_blocks = [10_000, 0, 0];
    r.add_replica(ReplicaId(0), info.clone()).unwrap();
    // One replica: `only`.
    let d = r.decide_with_matches(&req(&k), &[gpu(0)], t0).routed().unwrap();
    assert_eq!(d.explanation.as_ref().unwrap().reason, Reason::Only);
    r.add_replica(ReplicaId(1), ReplicaInfo { name: "http://r1".to_owned(), ..info }).unwrap();
    // Two, one of them holding the prefix: `lowest_cost`, three times.
    let mut reasons = Vec::new();
    for _ in 0..3 {
        let d = r.decide_with_matches(&req(&k), &[gpu(0), gpu(60)], t0).routed().unwrap();
        reasons.push(d.explanation.as_ref().unwrap().reason.label());
    }
    let counts: Vec<(&str, u64)> = Reason::LABELS
        .iter()
        .zip(&metrics.routed_by_reason)
        .map(|(l, c)| (*l, c.load(std::sync::atomic::Ordering::Relaxed)))
        .filter(|(_, c)| *c > 0)
        .collect();
    let mut expected: Vec<(&str, u64)> = vec![("only", 1)];
    for l in reasons {
        match expected.iter_mut().find(|(e, _)| *e == l) {
            Some((_, c)) => *c += 1,
            None => expected.push((l, 1)),
        }
    }
    expected.sort_by_key(|(l, _)| Reason::LABELS.iter().position(|x| x == l));
    assert_eq!(counts, expected);
    assert_eq!(metrics.routed.load(std::sync::atomic::Ordering::Relaxed), 4);
    // Labels are distinct and each reason's index names its label.
    let labels: std::collections::HashSet<_> = Reason::LABELS.iter().collect();
    assert_eq!(labels.len(), Reason::LABELS.len());
    assert_eq!(Reason::LABELS[Reason::NearTie { among: 2 }.index()], "near_tie");
}
