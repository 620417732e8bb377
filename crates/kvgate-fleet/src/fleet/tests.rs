//! The fleet core in virtual time: every instant is `t0` plus an offset, so
//! each rule is checked at the exact edge of its window, with no sleeping.

use std::time::{Duration, Instant};

use kvgate_events::{Batch, BlockHash, BlockStored, Event};
use kvgate_index::{block_keys, ReplicaId, Tier};
use kvgate_router::{Decision, Health, Outcome, RejectReason, RouteRequest, Router, RouterConfig};

use super::{pick_target, Fleet};
use crate::replica_status::Failure;
use crate::{EngineScrape, HealthRules};

const BS: u32 = 16;

fn rules() -> HealthRules {
    HealthRules {
        unhealthy_after: 3,
        purge_after: Duration::from_millis(10_000),
        rebuild: Duration::from_millis(2_000),
        index_bound: 100_000,
    }
}

fn fleet() -> Fleet {
    let config = RouterConfig { booking_timeout_ms: 5_000, ..RouterConfig::default() };
    Fleet::new(vec![Router::new(config, Default::default()).unwrap()], rules())
}

fn ms(t0: Instant, ms: u64) -> Instant {
    t0 + Duration::from_millis(ms)
}

fn scrape() -> EngineScrape {
    EngineScrape { block_size: Some(BS), num_gpu_blocks: Some(1_000), ..EngineScrape::default() }
}

/// A replica in rotation: added and probed once at `at`.
fn up(f: &mut Fleet, name: &str, at: Instant) -> ReplicaId {
    let id = f.add(name, 0, BS, true, 0).unwrap();
    f.probe_succeeded(id, Ok(scrape()), at);
    id
}

fn health(f: &Fleet, id: ReplicaId) -> Health {
    f.router().replica(id).map(|(_, h)| h).unwrap()
}

/// `blocks` stored GPU blocks whose tokens are 0.., hashes 1..=blocks.
fn stores(blocks: u64) -> Batch {
    let hashes = (1..=blocks).map(BlockHash::Int).collect();
    let tokens = (0..blocks as u32 * BS).collect();
    let stored = BlockStored::new(hashes, None, tokens, BS);
    Batch { ts: 0.0, events: vec![Event::Stored(stored)], dp_rank: None, skipped_events: 0 }
}

fn route(f: &mut Fleet, keys: &[kvgate_index::BlockKey], now: Instant) -> Decision {
    let req = RouteRequest {
        prompt_tokens: keys.len() as u64 * BS as u64,
        keys,
        max_output_tokens: Some(8),
        session_key: None,
        approx_symbols: None,
        queued_since: None,
        exclude: &[],
        adapter: None,
        remote_kv_s_per_token: None,
        already_running: false,
    };
    f.route(0, &req, now)
}

/// One replica in rotation and a 4-block prompt's keys.
fn one_replica() -> (Instant, Fleet, ReplicaId, Vec<kvgate_index::BlockKey>) {
    let t0 = Instant::now();
    let mut f = fleet();
    let id = up(&mut f, "a", t0);
    let keys = block_keys(&(0..64).collect::<Vec<u32>>(), BS as usize, None);
    (t0, f, id, keys)
}

#[test]
fn a_new_replica_is_down_until_its_first_probe() {
    let t0 = Instant::now();
    let mut f = fleet();
    let id = f.add("a", 0, BS, true, 0).unwrap();
    assert_eq!(health(&f, id), Health::Down);
    let r = f.readiness();
    assert_eq!((r.not_seen.len(), r.not_synced.len(), r.in_rotation), (1, 1, 0));
    f.probe_succeeded(id, Ok(scrape()), t0);
    assert_eq!(health(&f, id), Health::Healthy);
    f.view_synced(id, true);
    let r = f.readiness();
    assert_eq!((r.not_seen.len(), r.not_synced.len(), r.in_rotation), (0, 0, 1));
}

#[test]
fn a_reset_view_is_degraded_until_the_rebuild_window_ends_with_no_probe() {
    let t0 = Instant::now();
    let mut f = fleet();
    let id = up(&mut f, "a", t0);
    f.apply_events(id, &stores(8), t0);
    assert_eq!(f.index().blocks_held(id, Tier::Gpu), Some(8));
    let cleared = f.view_lost(id, "view reset: test".into(), ms(t0, 100));
    assert_eq!(cleared, 8);
    assert_eq!(health(&f, id), Health::Degraded);
    assert_eq!(f.next_deadline(), Some(ms(t0, 2_100)));
    f.tick(ms(t0, 2_099));
    assert_eq!(health(&f, id), Health::Degraded, "one ms before the window ends");
    assert_eq!(f.status(id).unwrap().reason(ms(t0, 2_099)).as_deref(), Some("view reset: test"));
    f.tick(ms(t0, 2_100));
    assert_eq!(health(&f, id), Health::Healthy, "the tick ends the window, no probe needed");
    assert_eq!(f.next_deadline(), None);
}

#[test]
fn a_refused_probe_takes_a_replica_down_at_once_other_failures_after_a_run() {
    let t0 = Instant::now();
    let mut f = fleet();
    let a = up(&mut f, "a", t0);
    let b = up(&mut f, "b", t0);
    f.failed(a, "connect failed".into(), Failure::Unreachable, ms(t0, 1));
    assert_eq!(health(&f, a), Health::Down);
    for n in 1..=3 {
        f.failed(b, format!("HTTP 500 #{n}"), Failure::Error, ms(t0, n));
        let want = if n < 3 { Health::Healthy } else { Health::Down };
        assert_eq!(health(&f, b), want, "after {n} failures");
    }
    assert_eq!(f.status(b).unwrap().reason(ms(t0, 5)).as_deref(), Some("HTTP 500 #3"));
    // One success resets the count and brings both back.
    f.probe_succeeded(a, Ok(scrape()), ms(t0, 10));
    f.probe_succeeded(b, Ok(scrape()), ms(t0, 10));
    assert_eq!((health(&f, a), health(&f, b)), (Health::Healthy, Health::Healthy));
    f.failed(b, "HTTP 500".into(), Failure::Error, ms(t0, 11));
    assert_eq!(health(&f, b), Health::Healthy, "the count started over");
}

#[test]
fn a_replica_down_for_purge_after_is_purged_by_the_tick_and_comes_back_degraded() {
    let t0 = Instant::now();
    let mut f = fleet();
    let id = up(&mut f, "a", t0);
    f.apply_events(id, &stores(8), t0);
    f.failed(id, "refused".into(), Failure::Unreachable, ms(t0, 1_000));
    assert_eq!(f.next_deadline(), Some(ms(t0, 11_000)));
    f.tick(ms(t0, 10_999));
    assert!(!f.status(id).unwrap().purged);
    assert_eq!(f.index().blocks_held(id, Tier::Gpu), Some(8), "kept while it may come back");
    f.tick(ms(t0, 11_000));
    assert!(f.status(id).unwrap().purged);
    assert!(f.clearing().contains(&id));
    while f.clear_step(id, 3).0 > 0 {}
    assert!(f.clearing().is_empty());
    assert_eq!(f.index().blocks_held(id, Tier::Gpu), Some(0));
    assert_eq!(f.next_deadline(), None, "purged once");
    // It answers again: in rotation, degraded while its view is rebuilt.
    f.probe_succeeded(id, Ok(scrape()), ms(t0, 12_000));
    assert_eq!(health(&f, id), Health::Degraded);
    f.tick(ms(t0, 14_000));
    assert_eq!(health(&f, id), Health::Healthy);
}

#[test]
fn a_block_size_mismatch_is_recorded_once() {
    let t0 = Instant::now();
    let mut f = fleet();
    let id = up(&mut f, "a", t0);
    let wrong = EngineScrape { block_size: Some(32), ..scrape() };
    for n in 0..3 {
        f.probe_succeeded(id, Ok(wrong.clone()), ms(t0, n));
    }
    let mut batch = stores(2);
    if let Event::Stored(s) = &mut batch.events[0] {
        s.block_size = 32;
        s.token_ids = (0..64).collect();
    }
    for n in 0..3 {
        f.apply_events(id, &batch, ms(t0, 10 + n));
    }
    let problems = &f.status(id).unwrap().problems;
    assert_eq!(problems.len(), 2, "{problems:?}");
    assert!(problems[0].contains("engine reports block_size 32"), "{problems:?}");
    assert!(problems[1].contains("events carry a block size"), "{problems:?}");
}

#[test]
fn a_drained_replica_gets_no_new_requests_while_its_own_finish() {
    let (t0, mut f, id, keys) = one_replica();
    let Decision::Routed(first) = route(&mut f, &keys, t0) else { panic!("not routed") };
    assert_eq!(first.replica, id);
    f.set_draining(id, true, ms(t0, 1));
    assert_eq!(health(&f, id), Health::Down);
    assert!(
        matches!(
            route(&mut f, &keys, ms(t0, 2)),
            Decision::Reject { reason: RejectReason::NoReplica, .. }
        ),
        "a draining replica is not routable"
    );
    assert!(!f.idle(id), "its request is still in flight");
    f.finish(first.booking, Outcome::Finished);
    assert!(f.idle(id));
    f.set_draining(id, false, ms(t0, 3));
    assert!(matches!(route(&mut f, &keys, ms(t0, 4)), Decision::Routed(_)));
}

#[test]
fn bookings_expire_on_the_tick_with_no_traffic() {
    let (t0, mut f, id, keys) = one_replica();
    let Decision::Routed(r) = route(&mut f, &keys, t0) else { panic!("not routed") };
    assert_eq!(f.router().in_flight(), 1);
    f.tick(ms(t0, 4_999));
    assert_eq!(f.router().in_flight(), 1);
    // The ledger sweeps at most once a second: the sweep at 4,999 ms was
    // the last before 5,999 ms.
    f.tick(ms(t0, 5_001));
    assert_eq!(f.router().in_flight(), 1);
    f.tick(ms(t0, 5_999));
    assert_eq!(f.router().in_flight(), 0, "expired without another decision");
    assert_eq!(f.router().ledger_totals().expired, 1);
    assert!(f.idle(id));
    drop(r);
}

#[test]
fn a_removed_replica_leaves_the_index_the_router_and_readiness() {
    let t0 = Instant::now();
    let mut f = fleet();
    let a = up(&mut f, "a", t0);
    let b = up(&mut f, "b", t0);
    f.apply_events(a, &stores(4), t0);
    f.remove(a);
    assert!(f.router().replica(a).is_none());
    assert_eq!(f.index().blocks_held(a, Tier::Gpu), None);
    assert_eq!(f.readiness().replicas, 1);
    assert!(f.status(b).is_some());
}

#[test]
fn adapters_learnt_from_engines_exclude_the_replicas_without_them() {
    let t0 = Instant::now();
    let mut f = fleet();
    let a = up(&mut f, "a", t0);
    let b = up(&mut f, "b", t0);
    assert!(f.set_adapters(a, vec!["sql".into()]));
    assert!(!f.set_adapters(a, vec!["sql".into()]), "unchanged");
    let declared = vec!["chat".to_owned()];
    assert_eq!(f.without_adapter(0, Some("sql"), &declared), vec![b]);
    assert!(f.without_adapter(0, Some("chat"), &declared).is_empty(), "declared: served by all");
    assert!(f.without_adapter(0, None, &declared).is_empty());
    assert_eq!(f.adapters(0, &declared), ["chat", "sql"]);
    assert!(f.adapter_pool("sql") == Some(0) && f.adapter_pool("chat").is_none());
}

#[test]
fn loads_go_to_the_healthy_replica_with_the_most_room() {
    let c = [
        (ReplicaId(0), Health::Healthy, 3, 0),
        (ReplicaId(1), Health::Down, 0, 0),
        (ReplicaId(2), Health::Healthy, 1, 9),
        (ReplicaId(3), Health::Healthy, 1, 2),
    ];
    assert_eq!(pick_target(c), Some(ReplicaId(3)));
    assert_eq!(pick_target([(ReplicaId(1), Health::Degraded, 0, 0)]), None);
}

/// A decode replica's NIXL series calibrate its pool's transfer rate: each
/// scrape's difference (bytes and seconds since the previous one) is one
/// observation; a counter that goes back (the engine restarted) is none.
#[test]
fn nixl_transfer_series_calibrate_the_pools_transfer_rate() {
    use crate::TransferTotals;
    use kvgate_router::{Disagg, DisaggConfig, DisaggMode};
    let t0 = Instant::now();
    let mut f = fleet();
    let side = Router::new(RouterConfig::default(), Default::default()).unwrap();
    // 262,144 bytes per token over 64 GB/s: 4.1 µs per token configured.
    let config = DisaggConfig {
        mode: DisaggMode::conditional(),
        kv_bytes_per_token: 262_144,
        bandwidth_bytes_per_s: 64e9,
    };
    f.add_prefill_side(0, side, Disagg::new(config.clone()));
    let prior = config.prior_s_per_token();
    assert_eq!(f.transfer_s_per_token(0), Some(prior));
    let id = f.add("d", 0, BS, true, 0).unwrap();
    // The link is really 16 GB/s: 16.4 µs per token, 4× the prior.
    let mut totals = TransferTotals::default();
    let probe = |f: &mut Fleet, totals: TransferTotals, at: u64| {
        let s = EngineScrape { transfers: Some(totals), ..scrape() };
        f.probe_succeeded(id, Ok(s), ms(t0, at));
    };
    probe(&mut f, totals, 0);
    assert_eq!(f.transfer_s_per_token(0), Some(prior), "one scrape is no difference yet");
    for n in 1..=20u64 {
        let tokens = 5_000.0 * n as f64;
        totals.count += 3.0;
        totals.bytes += tokens * 262_144.0;
        totals.seconds += tokens * 262_144.0 / 16e9;
        probe(&mut f, totals, n * 1_000);
    }
    let calibrated = f.transfer_s_per_token(0).unwrap();
    let truth = 262_144.0 / 16e9;
    assert!((calibrated / truth - 1.0).abs() < 0.01, "{calibrated} vs {truth}");
    // A restart: the counters start again from 0; that scrape teaches nothing.
    probe(&mut f, TransferTotals { count: 1.0, seconds: 9.0, bytes: 1.0 }, 30_000);
    assert_eq!(f.transfer_s_per_token(0), Some(calibrated));
    // Pools that do not split have no transfer rate.
    assert_eq!(fleet().transfer_s_per_token(0), None);
}
