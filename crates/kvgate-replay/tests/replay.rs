//! End-to-end checks of fast mode on the shipped fixture (the first 200
//! lines of the Mooncake conversation trace) and on small generated
//! workloads: determinism, bounds, accounting.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use kvgate_replay::{
    oracle_hit_rates, parse_mooncake, run_policy, run_policy_fleet, FleetSpec, RunOptions,
    SyntheticSpec, Workload,
};
use kvgate_router::{PolicyKind, RouterConfig};

const FIXTURE: &str = include_str!("fixtures/mooncake_conversation_head200.jsonl");

fn fixture(limit: usize) -> Workload {
    let mut w = parse_mooncake(FIXTURE, true, "fixture").unwrap();
    w.truncate(limit);
    w
}

fn opts() -> RunOptions {
    RunOptions { fleet: FleetSpec::acceptance(), router: RouterConfig::default(), seed: 7, jobs: 1 }
}

#[test]
fn the_fixture_parses_cleanly() {
    let w = parse_mooncake(FIXTURE, true, "fixture").unwrap();
    assert_eq!(w.requests.len(), 200);
    assert!(w.skipped.is_empty());
    assert!(w.base_rate() > 0.0);
}

#[test]
fn a_fixed_seed_gives_identical_runs() {
    let w = fixture(120);
    let f = FleetSpec::acceptance();
    let bounds = oracle_hit_rates(&w, 16, f.total_blocks() as usize, None);
    for policy in [PolicyKind::KvAware, PolicyKind::PowerOfTwo, PolicyKind::ApproxPrefix] {
        let (a, fa) = run_policy_fleet(&w, policy, 4.0, &opts(), bounds, &|_| ()).unwrap();
        let (b, fb) = run_policy_fleet(&w, policy, 4.0, &opts(), bounds, &|_| ()).unwrap();
        assert_eq!(a.ttft_ms, b.ttft_ms, "{policy}");
        assert_eq!(a.hit_rate, b.hit_rate, "{policy}");
        assert_eq!(a.replica_requests, b.replica_requests, "{policy}");
        let route = |f: &kvgate_replay::Fleet| {
            f.records.iter().map(|r| (r.replica, r.first_token_at)).collect::<Vec<_>>()
        };
        assert_eq!(route(&fa), route(&fb), "{policy}");
    }
}

#[test]
fn every_request_finishes_and_the_books_balance() {
    let w = fixture(80);
    let (s, fleet) = run_policy_fleet(
        &w,
        PolicyKind::KvAware,
        2.0,
        &opts(),
        kvgate_replay::OracleHitRates { oracle: 0.5, ceiling: 0.6, ttft_floor_ms: None },
        &|_| (),
    )
    .unwrap();
    assert_eq!(s.completed, 80);
    assert_eq!(s.unserved, 0);
    assert_eq!(s.ingress_cpu_us_per_req, None);
    assert_eq!(fleet.router().in_flight(), 0);
    let t = fleet.router().ledger_totals();
    assert_eq!(t.booked, 80);
    assert_eq!(t.finished, 80);
    assert!(s.ttft_ms.p50 <= s.ttft_ms.p90 && s.ttft_ms.p90 <= s.ttft_ms.p99);
    assert!(s.decision_us.mean > 0.0);
}

#[test]
fn the_pooled_oracle_never_beats_the_ceiling_and_equals_it_when_large() {
    let w = fixture(200);
    let small = oracle_hit_rates(&w, 16, 2_000, None);
    let big = oracle_hit_rates(&w, 16, 100_000_000, None);
    assert!(small.oracle <= small.ceiling);
    assert!(small.oracle < big.oracle);
    assert_eq!(big.oracle, big.ceiling);
    assert_eq!(small.ceiling, big.ceiling);
}

#[test]
fn no_reuse_means_no_hits_and_kv_aware_balances_like_least_load() {
    let spec: SyntheticSpec = "noreuse,requests=150,input_tokens=1024,rate=40".parse().unwrap();
    let w = spec.generate(Some(3));
    let f = FleetSpec::acceptance();
    let bounds = oracle_hit_rates(&w, 16, f.total_blocks() as usize, None);
    assert_eq!(bounds.ceiling, 0.0);
    let kv = run_policy(&w, PolicyKind::KvAware, 1.0, &opts(), bounds, &|_| ()).unwrap();
    let ll = run_policy(&w, PolicyKind::LeastLoad, 1.0, &opts(), bounds, &|_| ()).unwrap();
    assert_eq!(kv.hit_rate, 0.0);
    assert!(
        kv.ttft_ms.mean <= ll.ttft_ms.mean * 1.25,
        "{} vs {}",
        kv.ttft_ms.mean,
        ll.ttft_ms.mean
    );
}

/// kvgate-sim announces a block's CPU copy before its GPU removal (as vLLM's
/// offloading connector does), so the index fed by its events sees the CPU
/// tier: every hash-only CPU placeholder names a hash it still knows.
#[test]
fn the_index_sees_the_cpu_tier() {
    // A small GPU so that blocks move to the CPU tier quickly.
    let spec: SyntheticSpec =
        "chat,conversations=30,turns=4,system_tokens=512,think_s=30".parse().unwrap();
    let w = spec.generate(Some(1));
    let mut o = opts();
    o.fleet.replicas = 2;
    o.fleet.engine.num_gpu_blocks = 400;
    o.fleet.engine.num_cpu_blocks = 4_000;
    let bounds = kvgate_replay::OracleHitRates { oracle: 1.0, ceiling: 1.0, ttft_floor_ms: None };
    let (_, fleet) = run_policy_fleet(&w, PolicyKind::KvAware, 1.0, &o, bounds, &|_| ()).unwrap();
    let cpu_blocks: u64 = fleet
        .index()
        .stats()
        .replicas
        .iter()
        .map(|r| r.blocks[kvgate_index::Tier::Cpu as usize])
        .sum();
    assert!(cpu_blocks > 0, "no block reached the CPU tier in the index");
    assert_eq!(fleet.index().anomalies().unknown_placeholder, 0);
    assert_eq!(fleet.index().anomalies().unknown_removal, 0);
}

#[test]
fn the_level_search_brackets_its_targets() {
    let spec: SyntheticSpec = "noreuse,requests=200,input_tokens=1024,rate=40".parse().unwrap();
    let w = spec.generate(Some(5));
    let mut o = opts();
    o.fleet.replicas = 2;
    let search =
        kvgate_replay::find_load_levels(&w, &o, &[3.0, 1.5], 0.05, 8, 0.05, &|_| ()).unwrap();
    assert!(search.unloaded_ttft_ms > 0.0);
    let targets: Vec<f64> = search.levels.iter().map(|l| l.target).collect();
    assert_eq!(targets, vec![1.5, 3.0], "levels come back in target order");
    assert!(search.levels[0].rate_scale < search.levels[1].rate_scale);
    for l in &search.levels {
        assert!((l.ttft_ratio / l.target - 1.0).abs() < 0.25, "{l:?}");
    }
    assert!(search.probes.windows(2).all(|p| p[0].0 <= p[1].0), "probes sorted by scale");
}
