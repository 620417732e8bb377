//! Where a policy's hits go: replays a trace under one policy and prints, per
//! request class, what the index showed, what the router counted on the
//! replica it chose, and what the engine served from cache, plus the index's
//! anomaly counters.
//!
//! ```text
//! cargo run --release -p kvgate-replay --example diagnose -- TRACE.jsonl [POLICY] [RATE_SCALE] [LIMIT]
//! ```

use kvgate_replay::{parse_mooncake, run_policy_fleet, FleetSpec, OracleHitRates, RunOptions};
use kvgate_router::{PolicyKind, RouterConfig};

/// Router defaults; `WORK_WEIGHT=x` and `EPSILON=x` override `cost.work_weight`
/// and `epsilon` (what-if only).
fn router_config() -> RouterConfig {
    let mut c = RouterConfig::default();
    if let Some(w) = std::env::var("WORK_WEIGHT").ok().and_then(|w| w.parse().ok()) {
        c.cost.work_weight = w;
    }
    if let Some(e) = std::env::var("EPSILON").ok().and_then(|e| e.parse().ok()) {
        c.epsilon = e;
    }
    c
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let path = args.first().ok_or("usage: diagnose TRACE [POLICY] [RATE_SCALE] [LIMIT]")?;
    let policy: PolicyKind = args.get(1).map_or("kv_aware", String::as_str).parse()?;
    let scale: f64 = args.get(2).map_or(Ok(1.0), |s| s.parse())?;
    let mut w = parse_mooncake(&std::fs::read_to_string(path)?, false, path)?;
    if let Some(n) = args.get(3) {
        w.truncate(n.parse()?);
    }
    let fleet = FleetSpec::acceptance();
    let opts = RunOptions { fleet, router: router_config(), seed: 42, jobs: 1 };
    let none = OracleHitRates { oracle: 0.0, ceiling: 0.0, ttft_floor_ms: None };
    let (summary, fleet) = run_policy_fleet(&w, policy, scale, &opts, none, &|_| ())?;
    let recs = &fleet.records;
    let sum = |f: &dyn Fn(&kvgate_replay::Record) -> u64| recs.iter().map(f).sum::<u64>();
    let prompt = sum(&|r| u64::from(r.prompt_tokens));
    let best = sum(&|r| u64::from(r.best_indexed_blocks) * 16);
    let routed = sum(&|r| u64::from(r.routed_cached_blocks) * 16);
    let served = sum(&|r| u64::from(r.cached_tokens));
    let missed = recs.iter().filter(|r| r.routed_cached_blocks < r.best_indexed_blocks).count();
    println!(
        "policy={policy} scale={scale} requests={} ttft_mean_ms={:.1} hit_rate={:.3}",
        recs.len(),
        summary.ttft_ms.mean,
        summary.hit_rate
    );
    println!(
        "tokens: prompt={prompt} best_indexed={:.3} routed_counted={:.3} engine_served={:.3}; decisions below the best overlap: {missed}",
        best as f64 / prompt as f64,
        routed as f64 / prompt as f64,
        served as f64 / prompt as f64
    );
    println!("index anomalies: {:?}", fleet.index().anomalies());
    println!("index stats: {:?}", fleet.index().stats());
    println!("tentative: {:?}", fleet.router().tentative_stats());
    for (i, s) in fleet.engine_stats().iter().enumerate() {
        println!(
            "replica {i}: queries={} gpu_hits={} cpu_hits={} preemptions={} gpu_cached={} cpu_cached={}",
            s.prefix_cache_queries, s.prefix_cache_hits, s.external_hit_tokens, s.preemptions, s.gpu_cached_blocks, s.cpu_cached_blocks
        );
    }
    Ok(())
}
