//! Why the slowest requests were slow: replays a Mooncake trace under one
//! policy in front of the peer bench's simulated fleet (4 replicas, the
//! `llmd_qwen3_32b` timing, 4,096 GPU blocks of 16 tokens, no CPU tier) and
//! prints the slowest requests with what the router predicted, what it
//! counted as cached, what the engine served from cache, and how far the
//! prediction missed, then the miss summed over the slow tail.
//!
//! ```text
//! cargo run --release -p kvgate-replay --example tail -- TRACE.jsonl [POLICY] [RATE_SCALE] [SHOW]
//! ```

use kvgate_replay::{parse_mooncake, run_policy_fleet, FleetSpec, OracleHitRates, RunOptions};
use kvgate_router::{PolicyKind, RouterConfig};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let path = args.first().ok_or("usage: tail TRACE [POLICY] [RATE_SCALE] [SHOW]")?;
    let policy: PolicyKind = args.get(1).map_or("kv_aware", String::as_str).parse()?;
    let scale: f64 = args.get(2).map_or(Ok(2.0), |s| s.parse())?;
    let show: usize = args.get(3).map_or(Ok(25), |s| s.parse())?;
    let w = parse_mooncake(&std::fs::read_to_string(path)?, false, path)?;
    let router = RouterConfig::default();
    // The acceptance fleet's engines (llmd_qwen3_32b, vLLM's step limits),
    // sized as the peer bench's: 4 replicas of 4,096 GPU blocks, no CPU tier.
    let mut fleet = FleetSpec::acceptance();
    fleet.replicas = 4;
    fleet.engine.num_gpu_blocks = 4096;
    fleet.engine.num_cpu_blocks = 0;
    let bs = fleet.engine.block_size;
    let opts = RunOptions { fleet, router, seed: 42, jobs: 1 };
    let none = OracleHitRates { oracle: 0.0, ceiling: 0.0, ttft_floor_ms: None };
    let (summary, fleet) = run_policy_fleet(&w, policy, scale, &opts, none, &|_| ())?;
    println!(
        "policy={policy} scale={scale} requests={} ttft mean={:.1} p50={:.1} p99={:.1} hit={:.3}",
        fleet.records.len(),
        summary.ttft_ms.mean,
        summary.ttft_ms.p50,
        summary.ttft_ms.p99,
        summary.hit_rate
    );
    let mut recs: Vec<_> = fleet
        .records
        .iter()
        .enumerate()
        .filter_map(|(i, r)| {
            let ttft = r.first_token_at?.saturating_sub(r.arrival).as_secs_f64() * 1e3;
            Some((i, ttft, r))
        })
        .collect();
    recs.sort_by(|a, b| b.1.total_cmp(&a.1));
    println!(
        "{:>5} {:>8} {:>3} {:>6} {:>6} {:>6} {:>6} {:>8} {:>8} {:>8}",
        "req",
        "arrive_s",
        "rep",
        "prompt",
        "best",
        "routed",
        "served",
        "pred_ms",
        "ttft_ms",
        "miss_ms"
    );
    for (i, ttft, r) in recs.iter().take(show) {
        let pred = r.predicted_ttft_s * 1e3;
        println!(
            "{:>5} {:>8.2} {:>3} {:>6} {:>6} {:>6} {:>6} {:>8.1} {:>8.1} {:>8.1}",
            i,
            r.arrival.as_secs_f64(),
            r.replica.map_or(-1, |x| x as i64),
            r.prompt_tokens,
            r.best_indexed_blocks * bs,
            r.routed_cached_blocks * bs,
            r.cached_tokens,
            pred,
            ttft,
            ttft - pred
        );
    }
    let tail = recs.len().div_ceil(20).max(1);
    let (mut miss, mut lost) = (0.0, 0usize);
    for (_, ttft, r) in recs.iter().take(tail) {
        miss += ttft - r.predicted_ttft_s * 1e3;
        if r.routed_cached_blocks < r.best_indexed_blocks {
            lost += 1;
        }
    }
    println!(
        "slowest 5 % ({tail}): mean miss {:.1} ms; {lost} routed below the best indexed prefix",
        miss / tail as f64
    );
    // Requests in each engine (running + waiting) around the slowest one.
    if let Some((_, _, worst)) = recs.first() {
        let at = worst.arrival.as_secs_f64();
        for x in fleet.samples.iter().filter(|x| (x.at_s - at).abs() <= 6.0) {
            println!("t={:>6.1}s requests per replica {:?}", x.at_s, x.requests);
        }
    }
    for (r, st) in fleet.engine_stats().iter().enumerate() {
        println!(
            "replica {r}: preemptions {}, finished {}, steps {}",
            st.preemptions, st.finished, st.steps
        );
    }
    Ok(())
}
