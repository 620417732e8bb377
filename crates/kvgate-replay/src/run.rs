//! Running the comparison: one fleet per (policy, rate scale), each under
//! the same seed, workload and fleet spec; runs go to worker threads (each
//! run is single-threaded and deterministic). The automatic load levels
//! bisect on `least_load` runs for the rate scales at which its mean TTFT is
//! a given multiple of its unloaded TTFT.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use kvgate_router::{PolicyKind, RouterConfig};
use serde::Serialize;

use crate::capacity::FleetSpec;
use crate::error::ReplayError;
use crate::fleet::Fleet;
use crate::metrics::RunSummary;
use crate::oracle::OracleHitRates;
use crate::pools::{PoolBound, PoolRun};
use crate::workload::Workload;

/// Called with the number of requests replayed since the last call.
pub type Progress<'a> = &'a (dyn Fn(u64) + Sync);

/// What every run of a comparison shares.
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// The fleet.
    pub fleet: FleetSpec,
    /// Router settings; `policy` and `seed` are set per run.
    pub router: RouterConfig,
    /// The router's seed.
    pub seed: u64,
    /// Worker threads for independent runs.
    pub jobs: usize,
}

impl RunOptions {
    /// The fleet shaped for `workload`: one pool per model it names and the
    /// adapter slots it asks for ([`FleetSpec::for_workload`]); unchanged
    /// for a one-model workload without a slot count. Every policy runs on
    /// this same fleet, so every policy gets the same model filter.
    pub fn fleet_for(&self, workload: &Workload) -> Result<FleetSpec, ReplayError> {
        if workload.models.is_empty() && workload.max_loras.is_none() {
            return Ok(self.fleet.clone());
        }
        self.fleet.clone().for_workload(workload).map_err(ReplayError::InvalidFleet)
    }
}

/// Replays `workload` once under `policy` at `rate_scale`.
pub fn run_policy(
    workload: &Workload,
    policy: PolicyKind,
    rate_scale: f64,
    opts: &RunOptions,
    bounds: OracleHitRates,
    progress: Progress<'_>,
) -> Result<RunSummary, ReplayError> {
    Ok(run_policy_fleet(workload, policy, rate_scale, opts, bounds, progress)?.0)
}

/// [`run_policy`], also returning the fleet (records, index, router) for
/// diagnostics.
pub fn run_policy_fleet(
    workload: &Workload,
    policy: PolicyKind,
    rate_scale: f64,
    opts: &RunOptions,
    bounds: OracleHitRates,
    progress: Progress<'_>,
) -> Result<(RunSummary, Fleet), ReplayError> {
    if !(rate_scale.is_finite() && rate_scale > 0.0) {
        return Err(ReplayError::InvalidWorkload(format!("rate scale {rate_scale} must be > 0")));
    }
    let config =
        RouterConfig { policy, seed: Some(opts.seed), explain_last: 0, ..opts.router.clone() };
    let spec = opts.fleet_for(workload)?;
    let mut fleet = Fleet::new(&spec, config)?;
    let t0 = Instant::now();
    fleet.run(workload, rate_scale, progress);
    let wall = t0.elapsed().as_secs_f64();
    let rate = workload.base_rate() * rate_scale;
    let summary = RunSummary::from_fleet(policy.name(), rate, rate_scale, &fleet, bounds, wall);
    Ok((summary, fleet))
}

/// Runs every `(policy, scale)` pair, `opts.jobs` at a time; results come
/// back level by level, policies in the given order.
pub fn run_matrix(
    workload: &Workload,
    policies: &[PolicyKind],
    scales: &[f64],
    opts: &RunOptions,
    bounds: OracleHitRates,
    progress: Progress<'_>,
) -> Result<Vec<RunSummary>, ReplayError> {
    let runs = run_matrix_pools(workload, policies, scales, opts, bounds, None, progress)?;
    Ok(runs.into_iter().map(|r| r.0).collect())
}

/// [`run_matrix`], with each run's pool and adapter figures against
/// `pools` (from `pool_bounds`) when given.
pub fn run_matrix_pools(
    workload: &Workload,
    policies: &[PolicyKind],
    scales: &[f64],
    opts: &RunOptions,
    bounds: OracleHitRates,
    pools: Option<&[PoolBound]>,
    progress: Progress<'_>,
) -> Result<Vec<(RunSummary, Option<PoolRun>)>, ReplayError> {
    type Slot = Option<Result<(RunSummary, Option<PoolRun>), ReplayError>>;
    let pairs: Vec<(f64, PolicyKind)> =
        scales.iter().flat_map(|&s| policies.iter().map(move |&p| (s, p))).collect();
    let results: Mutex<Vec<Slot>> = Mutex::new((0..pairs.len()).map(|_| None).collect());
    let next = AtomicUsize::new(0);
    std::thread::scope(|scope| {
        for _ in 0..opts.jobs.clamp(1, pairs.len().max(1)) {
            scope.spawn(|| loop {
                let k = next.fetch_add(1, Ordering::Relaxed);
                let Some(&(scale, policy)) = pairs.get(k) else { break };
                let r = run_policy_fleet(workload, policy, scale, opts, bounds, progress)
                    .map(|(s, fleet)| (s, pools.map(|b| PoolRun::from_fleet(&fleet, workload, b))));
                if let Ok(mut guard) = results.lock() {
                    guard[k] = Some(r);
                }
            });
        }
    });
    let results = results.into_inner().unwrap_or_default();
    results
        .into_iter()
        .map(|r| r.unwrap_or_else(|| Err(ReplayError::InvalidFleet("a run did not finish".into()))))
        .collect()
}

/// How one prefill/decode comparison run is set up: `None` serves every
/// request whole on all replicas (the aggregated fleet at the same GPU
/// count), `Some(mode)` splits the fleet as `disagg` says under `mode`.
pub type DisaggSetup = Option<kvgate_router::DisaggMode>;

/// Runs `kv_aware` on every `(setup, scale)` pair, `opts.jobs` at a time:
/// the aggregated fleet and each disaggregation mode on the same replicas
/// (the first `disagg.prefill` prefill). Runs are named `aggregated` or
/// after their mode; results come back level by level, setups in order.
pub fn run_disagg_matrix(
    workload: &Workload,
    setups: &[DisaggSetup],
    disagg: &crate::capacity::DisaggSpec,
    scales: &[f64],
    opts: &RunOptions,
    bounds: OracleHitRates,
    progress: Progress<'_>,
) -> Result<Vec<RunSummary>, ReplayError> {
    let mut out = Vec::new();
    // One matrix per setup keeps `run_matrix_pools` the only scheduler;
    // the jobs of a setup share the workers.
    let mut by_setup = Vec::new();
    for setup in setups {
        let mut o = opts.clone();
        o.fleet.disagg = setup.map(|mode| crate::capacity::DisaggSpec { mode, ..disagg.clone() });
        let runs = run_matrix(workload, &[PolicyKind::KvAware], scales, &o, bounds, progress)?;
        let name = setup.map_or("aggregated", |m| m.name());
        by_setup.push(
            runs.into_iter()
                .map(|mut r| {
                    r.policy = name.to_owned();
                    r
                })
                .collect::<Vec<_>>(),
        );
    }
    for k in 0..scales.len() {
        for runs in &by_setup {
            if let Some(r) = runs.get(k) {
                out.push(r.clone());
            }
        }
    }
    Ok(out)
}

/// One automatic load level.
#[derive(Clone, Debug, Serialize)]
pub struct Level {
    /// Wanted least_load mean TTFT ÷ unloaded TTFT.
    pub target: f64,
    /// The rate scale found.
    pub rate_scale: f64,
    /// The ratio measured there.
    pub ttft_ratio: f64,
}

/// The result of the level search.
#[derive(Clone, Debug, Serialize)]
pub struct LevelSearch {
    /// Rate scale of the unloaded reference run.
    pub unloaded_rate_scale: f64,
    /// least_load's mean TTFT there, ms.
    pub unloaded_ttft_ms: f64,
    /// The levels, in target order.
    pub levels: Vec<Level>,
    /// Every probe: (rate scale, least_load mean TTFT ms).
    pub probes: Vec<(f64, f64)>,
}

/// Finds, by geometric bisection on `least_load` runs, the rate scales at
/// which least_load's mean TTFT is each of `targets` × its TTFT at
/// `unloaded_scale`. Each level stops after `iterations` probes or within
/// `tolerance` (relative) of its target. Probes are shared between levels.
pub fn find_load_levels(
    workload: &Workload,
    opts: &RunOptions,
    targets: &[f64],
    unloaded_scale: f64,
    iterations: usize,
    tolerance: f64,
    progress: Progress<'_>,
) -> Result<LevelSearch, ReplayError> {
    let none = OracleHitRates { oracle: 0.0, ceiling: 0.0, ttft_floor_ms: None };
    let probe = |scale: f64| -> Result<f64, ReplayError> {
        Ok(run_policy(workload, PolicyKind::LeastLoad, scale, opts, none, progress)?.ttft_ms.mean)
    };
    let unloaded = probe(unloaded_scale)?;
    if unloaded <= 0.0 {
        return Err(ReplayError::InvalidWorkload("no request got a first token".into()));
    }
    let mut probes: Vec<(f64, f64)> = vec![(unloaded_scale, unloaded)];
    let mut levels = Vec::new();
    let mut targets = targets.to_vec();
    targets.sort_by(f64::total_cmp);
    for &target in &targets {
        let ratio = |ttft: f64| ttft / unloaded;
        // Bracket from what is known: the largest scale below the target and
        // the smallest at or above it.
        let lo_of = |p: &[(f64, f64)]| {
            p.iter().filter(|x| ratio(x.1) < target).map(|x| x.0).fold(unloaded_scale, f64::max)
        };
        let hi_of = |p: &[(f64, f64)]| {
            p.iter().filter(|x| ratio(x.1) >= target).map(|x| x.0).fold(f64::INFINITY, f64::min)
        };
        let mut n = 0;
        while !hi_of(&probes).is_finite() && n < 12 {
            let s = lo_of(&probes) * 2.0;
            probes.push((s, probe(s)?));
            n += 1;
        }
        let best = |p: &[(f64, f64)]| {
            p.iter()
                .copied()
                .min_by(|a, b| {
                    (ratio(a.1) / target - 1.0).abs().total_cmp(&(ratio(b.1) / target - 1.0).abs())
                })
                .unwrap_or((unloaded_scale, unloaded))
        };
        for _ in 0..iterations {
            let b = best(&probes);
            if (ratio(b.1) / target - 1.0).abs() <= tolerance {
                break;
            }
            let (lo, hi) = (lo_of(&probes), hi_of(&probes));
            if !hi.is_finite() {
                break;
            }
            let s = (lo * hi).sqrt();
            probes.push((s, probe(s)?));
        }
        let (s, t) = best(&probes);
        levels.push(Level { target, rate_scale: s, ttft_ratio: ratio(t) });
    }
    probes.sort_by(|a, b| a.0.total_cmp(&b.0));
    Ok(LevelSearch {
        unloaded_rate_scale: unloaded_scale,
        unloaded_ttft_ms: unloaded,
        levels,
        probes,
    })
}
