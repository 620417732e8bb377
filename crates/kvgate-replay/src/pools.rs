//! Model pools in a replay: each pool's own oracle, and what a
//! run did per pool and with LoRA adapters.
//!
//! A pool only ever serves its model's requests, with only its replicas'
//! memory, so the fleet-wide pooled LRU (`oracle.rs`) is a bound no router
//! can reach when models differ: the fair bound is the pooled LRU of each
//! pool over that pool's requests and capacity. The fleet figure combines
//! them weighted by prompt tokens (Σ oracle hit tokens ÷ Σ prompt tokens).

use std::sync::atomic::Ordering;

use serde::Serialize;

use crate::capacity::FleetSpec;
use crate::fleet::Fleet;
use crate::oracle::oracle_hit_rates_of;
use crate::workload::Workload;

/// One pool's bound.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PoolBound {
    /// The base model it serves (`""`: every request, a one-pool fleet).
    pub model: String,
    /// Its replicas.
    pub replicas: usize,
    /// Requests for its model.
    pub requests: u64,
    /// Their prompt tokens.
    pub prompt_tokens: u64,
    /// Pooled LRU of the pool's GPU + CPU blocks over its requests.
    pub oracle_hit_rate: f64,
    /// Unlimited cache over its requests.
    pub ceiling_hit_rate: f64,
}

/// The pool of request `i` as [`Fleet::pool_for`] picks it, from the spec.
fn pool_of_request(spec: &FleetSpec, w: &Workload, i: usize) -> Option<usize> {
    if spec.pools.is_empty() {
        return Some(0);
    }
    spec.pools.iter().position(|m| m == w.model_name(i))
}

/// Every pool's oracle over its own requests and capacity. `spec` is the
/// fleet as run (after [`FleetSpec::for_workload`]).
pub fn pool_bounds(w: &Workload, spec: &FleetSpec) -> Vec<PoolBound> {
    let bs = spec.engine.block_size as usize;
    let pool: Vec<Option<usize>> =
        (0..w.requests.len()).map(|i| pool_of_request(spec, w, i)).collect();
    (0..spec.pool_count())
        .map(|p| {
            let keep = |i: usize| pool[i] == Some(p);
            let b = oracle_hit_rates_of(w, bs, spec.pool_blocks(p) as usize, None, keep);
            let mine = (0..w.requests.len()).filter(|&i| keep(i));
            let (requests, prompt_tokens) =
                mine.fold((0, 0), |(n, t), i| (n + 1, t + w.requests[i].prompt.len() as u64));
            PoolBound {
                model: spec.pools.get(p).cloned().unwrap_or_default(),
                replicas: spec.pool_replicas(p),
                requests,
                prompt_tokens,
                oracle_hit_rate: b.oracle,
                ceiling_hit_rate: b.ceiling,
            }
        })
        .collect()
}

/// The pools' oracles combined: Σ oracle hit tokens ÷ Σ prompt tokens.
pub fn combined_oracle(bounds: &[PoolBound]) -> f64 {
    let tokens: u64 = bounds.iter().map(|b| b.prompt_tokens).sum();
    let hits: f64 = bounds.iter().map(|b| b.oracle_hit_rate * b.prompt_tokens as f64).sum();
    if tokens == 0 {
        0.0
    } else {
        hits / tokens as f64
    }
}

/// One pool in one run.
#[derive(Clone, Debug, Default, Serialize)]
pub struct PoolRunStat {
    /// The base model it serves.
    pub model: String,
    /// Requests it served.
    pub requests: u64,
    /// Its engines' counters: (GPU + CPU-tier hits) ÷ queries.
    pub hit_rate: f64,
    /// Its own pooled-LRU oracle.
    pub oracle_hit_rate: f64,
    /// `hit_rate ÷ oracle_hit_rate`.
    pub hit_rate_vs_oracle: f64,
    /// Σ cached tokens at first admission ÷ Σ prompt tokens, ÷ the oracle.
    pub first_admission_vs_oracle: f64,
    /// LoRA adapter loads of its engines.
    pub adapter_loads: u64,
}

/// What a run did with pools and adapters (the JSON puts these fields in
/// the run's object).
#[derive(Clone, Debug, Default, Serialize)]
pub struct PoolRun {
    /// Adapters made resident in a GPU slot, fleet-wide (the engines' own
    /// counters: a load the request waited for).
    pub adapter_loads: u64,
    /// `adapter_loads` per 1,000 requests of the workload.
    pub adapter_loads_per_1k: f64,
    /// Resident adapters evicted by another's load.
    pub adapter_evictions: u64,
    /// Routes to a replica the router did not believe held the adapter
    /// (`RouterMetrics::adapter_loads`, every pool; kv_aware counts them).
    pub router_adapter_loads: u64,
    /// Requests routed to a replica not serving their model (must be 0).
    pub model_violations: u64,
    /// Requests naming a model no pool serves.
    pub unknown_model: u64,
    /// The pools' oracles combined (token-weighted).
    pub pool_oracle_hit_rate: f64,
    /// The run's fleet `hit_rate` ÷ `pool_oracle_hit_rate`.
    pub hit_rate_vs_pool_oracle: f64,
    /// `first_admission_hit_rate` ÷ `pool_oracle_hit_rate`.
    pub first_admission_vs_pool_oracle: f64,
    /// Per pool.
    pub pools: Vec<PoolRunStat>,
}

fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 {
        a / b
    } else {
        0.0
    }
}

impl PoolRun {
    /// Of a finished run of `w` on `fleet`, against `bounds` (from
    /// [`pool_bounds`] for the same spec).
    pub fn from_fleet(fleet: &Fleet, w: &Workload, bounds: &[PoolBound]) -> PoolRun {
        let stats = fleet.engine_stats();
        let n = fleet.pool_count();
        let (mut queries, mut hits, mut loads) = (vec![0u64; n], vec![0u64; n], vec![0u64; n]);
        for (r, s) in stats.iter().enumerate() {
            let p = fleet.pool_of(r);
            queries[p] += s.prefix_cache_queries;
            hits[p] += s.prefix_cache_hits + s.external_hit_tokens;
            loads[p] += s.lora_loads;
        }
        let (mut requests, mut prompt, mut cached) = (vec![0u64; n], vec![0u64; n], vec![0u64; n]);
        for rec in &fleet.records {
            let Some(r) = rec.replica else { continue };
            let p = fleet.pool_of(r);
            requests[p] += 1;
            if rec.first_token_at.is_some() {
                prompt[p] += u64::from(rec.prompt_tokens);
                cached[p] += u64::from(rec.cached_tokens);
            }
        }
        let pools: Vec<PoolRunStat> = (0..n)
            .map(|p| {
                let oracle = bounds.get(p).map_or(0.0, |b| b.oracle_hit_rate);
                let hit = ratio(hits[p] as f64, queries[p] as f64);
                PoolRunStat {
                    model: bounds.get(p).map_or_else(String::new, |b| b.model.clone()),
                    requests: requests[p],
                    hit_rate: hit,
                    oracle_hit_rate: oracle,
                    hit_rate_vs_oracle: ratio(hit, oracle),
                    first_admission_vs_oracle: ratio(
                        ratio(cached[p] as f64, prompt[p] as f64),
                        oracle,
                    ),
                    adapter_loads: loads[p],
                }
            })
            .collect();
        let total_loads: u64 = loads.iter().sum();
        let oracle = combined_oracle(bounds);
        let hit = ratio(hits.iter().sum::<u64>() as f64, queries.iter().sum::<u64>() as f64);
        let first = ratio(cached.iter().sum::<u64>() as f64, prompt.iter().sum::<u64>() as f64);
        PoolRun {
            adapter_loads: total_loads,
            adapter_loads_per_1k: ratio(total_loads as f64 * 1000.0, w.requests.len() as f64),
            adapter_evictions: stats.iter().map(|s| s.lora_evictions).sum(),
            router_adapter_loads: (0..n)
                .map(|p| fleet.pool_router(p).metrics().adapter_loads.load(Ordering::Relaxed))
                .sum(),
            model_violations: fleet.model_violations,
            unknown_model: fleet.unknown_model,
            pool_oracle_hit_rate: oracle,
            hit_rate_vs_pool_oracle: ratio(hit, oracle),
            first_admission_vs_pool_oracle: ratio(first, oracle),
            pools,
        }
    }
}

/// Whether `w` calls for the pool report: it names models or adapters.
pub fn wants_pools(w: &Workload) -> bool {
    !w.models.is_empty() || w.has_adapters()
}
