//! Model pools and LoRA adapters in fast mode (issue 23): determinism, the
//! model filter (no request leaves its model's pool, for any policy), each
//! pool's own oracle, and adapter loads under kv_aware vs least_load on the
//! acceptance shape (2 base models × 8 adapters, Zipf, 8 replicas, 4 slots).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use kvgate_replay::{
    combined_oracle, oracle_hit_rates, oracle_hit_rates_of, pool_bounds, run_policy_fleet, Fleet,
    FleetSpec, PoolRun, RunOptions, RunSummary, SyntheticSpec, Workload,
};
use kvgate_router::{PolicyKind, RouterConfig};

fn lora(spec: &str, seed: u64) -> Workload {
    spec.parse::<SyntheticSpec>().unwrap().generate(Some(seed))
}

fn opts() -> RunOptions {
    RunOptions { fleet: FleetSpec::acceptance(), router: RouterConfig::default(), seed: 7, jobs: 1 }
}

fn run(w: &Workload, policy: PolicyKind, scale: f64) -> (RunSummary, PoolRun, Fleet) {
    let o = opts();
    let spec = o.fleet_for(w).unwrap();
    let pools = pool_bounds(w, &spec);
    let bounds = oracle_hit_rates(w, 16, spec.total_blocks() as usize, None);
    let (s, fleet) = run_policy_fleet(w, policy, scale, &o, bounds, &|_| ()).unwrap();
    let p = PoolRun::from_fleet(&fleet, w, &pools);
    (s, p, fleet)
}

const SMALL: &str = "synthetic:lora,models=2,adapters=16,conversations=60,turns=3,think_s=2";

#[test]
fn a_lora_workload_and_its_runs_are_deterministic() {
    let a = lora(SMALL, 3);
    assert_eq!(a.requests, lora(SMALL, 3).requests);
    assert_ne!(a.requests, lora(SMALL, 4).requests);
    let (sa, pa, fa) = run(&a, PolicyKind::KvAware, 2.0);
    let (sb, pb, fb) = run(&a, PolicyKind::KvAware, 2.0);
    let route =
        |f: &Fleet| f.records.iter().map(|r| (r.replica, r.first_token_at)).collect::<Vec<_>>();
    assert_eq!(route(&fa), route(&fb));
    assert_eq!(sa.ttft_ms, sb.ttft_ms);
    assert_eq!(pa.adapter_loads, pb.adapter_loads);
    assert_eq!(sa.completed, a.requests.len() as u64);
    // The engines' adapter-keyed events reach each pool's index under the
    // keys the router asks with: later turns find their prefix.
    assert!(fa.records.iter().filter(|r| r.best_indexed_blocks > 0).count() > a.requests.len() / 3);
}

#[test]
fn no_request_leaves_its_models_pool_under_any_policy() {
    let w = lora(SMALL, 1);
    let spec = opts().fleet_for(&w).unwrap();
    assert_eq!(spec.pools, ["model-0", "model-1"]);
    assert_eq!(spec.engine.max_loras, 4);
    for policy in [
        PolicyKind::KvAware,
        PolicyKind::LeastLoad,
        PolicyKind::RoundRobin,
        PolicyKind::PowerOfTwo,
        PolicyKind::ApproxPrefix,
        PolicyKind::LinearBlocks,
    ] {
        let (s, p, fleet) = run(&w, policy, 4.0);
        assert_eq!(s.completed, w.requests.len() as u64, "{policy}");
        assert_eq!((p.model_violations, p.unknown_model), (0, 0), "{policy}");
        let mut per_pool = [0u64; 2];
        for (i, rec) in fleet.records.iter().enumerate() {
            let r = rec.replica.expect("served");
            let pool = fleet.pool_of(r);
            assert_eq!(pool, w.requests[i].model as usize, "{policy}: request {i} on replica {r}");
            assert_eq!(spec.pool_of(r), pool);
            per_pool[pool] += 1;
        }
        // Both pools served, and the per-pool report adds up.
        assert!(per_pool.iter().all(|&n| n > 0), "{policy}: {per_pool:?}");
        assert_eq!(p.pools.iter().map(|x| x.requests).collect::<Vec<_>>(), per_pool);
        // Each pool's router booked only its own requests.
        for (k, &n) in per_pool.iter().enumerate() {
            assert_eq!(fleet.pool_router(k).ledger_totals().booked, n, "{policy}");
        }
    }
}

#[test]
fn a_request_for_a_model_no_pool_serves_is_counted_not_served() {
    let w = lora(SMALL, 2);
    // A fleet serving only model-0 (built directly: `fleet_for` would give
    // model-1 its pool): model-1's requests have none.
    let mut spec = opts().fleet_for(&w).unwrap();
    spec.pools.truncate(1);
    let bounds = oracle_hit_rates(&w, 16, 1 << 20, None);
    let config =
        RouterConfig { policy: PolicyKind::KvAware, seed: Some(1), ..RouterConfig::default() };
    let mut fleet = Fleet::new(&spec, config).unwrap();
    fleet.run(&w, 2.0, &|_| ());
    let s = RunSummary::from_fleet("kv_aware", 1.0, 2.0, &fleet, bounds, 0.0);
    let for_1 = w.requests.iter().filter(|r| r.model == 1).count() as u64;
    assert!(for_1 > 0);
    assert_eq!(fleet.unknown_model, for_1);
    assert_eq!(s.unserved, for_1);
    assert_eq!(fleet.model_violations, 0);
}

#[test]
fn each_pool_has_its_own_oracle() {
    let w = lora(SMALL, 5);
    let spec = opts().fleet_for(&w).unwrap();
    let b = pool_bounds(&w, &spec);
    assert_eq!(b.len(), 2);
    for (p, bound) in b.iter().enumerate() {
        // The same as the plain oracle over a workload of that pool's
        // requests alone, with that pool's capacity.
        let sub = Workload {
            requests: w.requests.iter().filter(|r| r.model as usize == p).cloned().collect(),
            ..Workload::default()
        };
        let alone = oracle_hit_rates(&sub, 16, spec.pool_blocks(p) as usize, None);
        assert_eq!(bound.oracle_hit_rate, alone.oracle);
        assert_eq!(bound.requests, sub.requests.len() as u64);
        assert_eq!(bound.replicas, 4);
        assert!(bound.oracle_hit_rate > 0.3, "sessions reuse their prefix: {bound:?}");
    }
    let tokens: u64 = b.iter().map(|x| x.prompt_tokens).sum();
    let want =
        b.iter().map(|x| x.oracle_hit_rate * x.prompt_tokens as f64).sum::<f64>() / tokens as f64;
    assert!((combined_oracle(&b) - want).abs() < 1e-12);
    // A tiny pool holds less: the capacity is the pool's.
    let tiny = oracle_hit_rates_of(&w, 16, 64, None, |i| w.requests[i].model == 0);
    assert!(tiny.oracle < b[0].oracle_hit_rate);
}

/// The acceptance shape, small enough for a test: 2 models × 8 adapters
/// (Zipf 1), 20% base traffic, 8 replicas in two pools of 4, 4 slots each.
const ACCEPTANCE: &str = "synthetic:lora,models=2,adapters=16,zipf=1,base_share=0.2,max_loras=4,conversations=240,turns=4,think_s=5";

#[test]
fn kv_aware_loads_fewer_adapters_than_least_load() {
    let w = lora(ACCEPTANCE, 11);
    let (ks, kp, _) = run(&w, PolicyKind::KvAware, 1.0);
    let (ls, lp, _) = run(&w, PolicyKind::LeastLoad, 1.0);
    assert_eq!(ks.completed, w.requests.len() as u64);
    assert_eq!(ls.completed, w.requests.len() as u64);
    assert_eq!((kp.model_violations, lp.model_violations), (0, 0));
    eprintln!(
        "loads/1k kv_aware {:.1} least_load {:.1}; ÷pool oracle {:.3} {:.3}; ttft {:.1} {:.1}",
        kp.adapter_loads_per_1k,
        lp.adapter_loads_per_1k,
        kp.hit_rate_vs_pool_oracle,
        lp.hit_rate_vs_pool_oracle,
        ks.ttft_ms.mean,
        ls.ttft_ms.mean
    );
    assert!(lp.adapter_loads > 0, "least_load must load adapters: {lp:?}");
    // Lower, and by a wide margin: prefix stickiness alone (no slot
    // reports to the router) gives about a quarter of least_load's loads;
    // with them, about a tenth.
    assert!(
        kp.adapter_loads_per_1k * 5.0 < lp.adapter_loads_per_1k,
        "kv_aware {:.1}/1k vs least_load {:.1}/1k",
        kp.adapter_loads_per_1k,
        lp.adapter_loads_per_1k
    );
    // Reuse within an adapter: kv_aware is near each pool's own bound, and
    // (virtual time) its mean TTFT is below least_load's.
    assert!(kp.hit_rate_vs_pool_oracle >= 0.9, "{kp:?}");
    assert!(kp.pools.iter().all(|p| p.hit_rate_vs_oracle >= 0.9), "{kp:?}");
    assert!(kp.hit_rate_vs_pool_oracle > lp.hit_rate_vs_pool_oracle, "{kp:?} {lp:?}");
    assert!(ks.ttft_ms.mean < ls.ttft_ms.mean, "{} vs {}", ks.ttft_ms.mean, ls.ttft_ms.mean);
}
