//! One live run, from the fleet's start to its summary.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use kvgate_replay::{Distribution, RunFacts, RunSummary, Tally};

use crate::client::{send_all, wait_ready, Sent};
use crate::proc_cpu::cpu_seconds;
use crate::scrape::{decide_histograms, engine_counters, Counters, Histogram};
use crate::spawn::spawn_fleet;
use crate::{LiveError, LiveOptions, LiveRun};

/// Runs `run` live, on a runtime of its own; `progress` hears how many
/// requests have completed.
pub fn run_live(
    run: LiveRun<'_>,
    opts: &LiveOptions,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<RunSummary, LiveError> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(LiveError::Runtime)?;
    runtime.block_on(live(run, opts, progress))
}

async fn live(
    run: LiveRun<'_>,
    opts: &LiveOptions,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<RunSummary, LiveError> {
    let LiveRun { workload, spec, policy, seed, rate_scale, bounds } = run;
    if !(opts.speedup > 0.0 && opts.speedup.is_finite()) {
        return Err(LiveError::BadSpeedup(opts.speedup));
    }
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(opts.max_in_flight)
        .tcp_nodelay(true)
        .build()
        .map_err(LiveError::Client)?;
    let (bases, engines, pids, _spawned) = match &opts.target {
        Some(url) => (
            vec![url.trim_end_matches('/').to_owned()],
            Vec::new(),
            opts.target_pid.into_iter().collect(),
            None,
        ),
        None => {
            let longest = workload
                .requests
                .iter()
                .map(|r| r.prompt.len() as u64 + u64::from(r.output_tokens))
                .max()
                .unwrap_or(0);
            let (bases, engines, pids, spawned) = spawn_fleet(spec, policy, seed, longest, opts)?;
            (bases, engines, pids, Some(spawned))
        }
    };
    for base in &bases {
        wait_ready(&client, base, opts).await?;
    }
    let cpu = |pids: &[u32]| pids.iter().map(|&p| cpu_seconds(p)).sum::<f64>();

    // Idle rate of the kvgate processes, to subtract (health checks, scrapes).
    let idle_rate = if pids.is_empty() {
        0.0
    } else {
        let (c0, t0) = (cpu(&pids), Instant::now());
        tokio::time::sleep(Duration::from_secs(2)).await;
        (cpu(&pids) - c0) / t0.elapsed().as_secs_f64()
    };
    let before = engine_counters(&client, &engines).await?;
    let decide_before = decide_histograms(&client, &bases, opts).await;
    let cpu0 = cpu(&pids);

    let sent = send_all(&client, &bases, workload, rate_scale, opts, progress).await;
    let wall = sent.wall;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let ingress_cpu = (!pids.is_empty()).then(|| {
        let busy = cpu(&pids) - cpu0 - idle_rate * (wall + 0.3);
        busy.max(0.0) / workload.requests.len().max(1) as f64 * 1e6
    });
    let after = engine_counters(&client, &engines).await?;
    let decide_after = decide_histograms(&client, &bases, opts).await;

    let facts = Facts {
        policy,
        rate: workload.base_rate() * rate_scale,
        rate_scale,
        requests: workload.requests.len() as u64,
        bounds,
        engine: (!engines.is_empty()).then(|| after.delta(&before)),
        decide: decide_after.delta(&decide_before),
        ingress_cpu_us_per_req: ingress_cpu,
    };
    Ok(summarise(opts.speedup, &sent, facts))
}

/// What the run measured besides the client's outcomes.
struct Facts<'a> {
    policy: &'a str,
    rate: f64,
    rate_scale: f64,
    requests: u64,
    bounds: kvgate_replay::OracleHitRates,
    engine: Option<Counters>,
    decide: Histogram,
    ingress_cpu_us_per_req: Option<f64>,
}

/// Fast mode's summary of what the client saw: only requests that finished
/// count, their latencies read back in engine time (× `speedup`).
fn summarise(speedup: f64, sent: &Sent, f: Facts<'_>) -> RunSummary {
    let start = sent.outcomes.first().map_or(Duration::ZERO, |o| o.sent);
    let mut tally = Tally::new(start, speedup);
    let mut per_replica: HashMap<&str, (u64, f64)> = HashMap::new();
    for o in &sent.outcomes {
        let (Some(first), Some(last)) = (o.first_token, o.last_token) else { continue };
        if !o.ok {
            continue;
        }
        let cached = o.cached_tokens.unwrap_or(0);
        tally.add(o.sent, first, Some(last), o.prompt_tokens, cached, o.tokens);
        let e = per_replica.entry(o.replica.as_deref().unwrap_or("?")).or_default();
        e.0 += 1;
        e.1 += f64::from(o.prompt_tokens.saturating_sub(cached));
    }
    let replica_requests: Vec<u64> =
        sent.replicas.iter().map(|r| per_replica.get(r.as_str()).map_or(0, |e| e.0)).collect();
    let prefill: Vec<f64> =
        sent.replicas.iter().map(|r| per_replica.get(r.as_str()).map_or(0.0, |e| e.1)).collect();
    let d = &f.decide;
    let decision_us = Distribution {
        mean: if d.count > 0.0 { d.sum / d.count * 1e6 } else { f64::NAN },
        p50: d.quantile_us(0.5),
        p90: d.quantile_us(0.9),
        p99: d.quantile_us(0.99),
    };
    let completed = tally.completed();
    tally.summary(RunFacts {
        policy: f.policy.to_owned(),
        rate: f.rate,
        rate_scale: f.rate_scale,
        requests: f.requests,
        unserved: f.requests - completed,
        hit_rate: f.engine.and_then(|c| c.hit_rate()),
        bounds: f.bounds,
        prefill_per_replica: prefill,
        replica_requests,
        decision_us,
        ingress_cpu_us_per_req: f.ingress_cpu_us_per_req,
        preemptions: f.engine.map_or(0, |c| c.preemptions.max(0.0) as u64),
        wall_s: sent.wall,
        load: sent.samples.clone(),
        disagg: None,
    })
}
