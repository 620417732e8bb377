//! What a replay prints: the `--json` document (schema in `docs/replay.md`)
//! and the terminal table.

use std::fmt::Write as _;

use serde::Serialize;

use crate::capacity::FleetSpec;
use crate::error::LineError;
use crate::metrics::RunSummary;
use crate::pools::{combined_oracle, PoolBound, PoolRun};
use crate::run::LevelSearch;
use crate::workload::Workload;

/// The workload, as reported.
#[derive(Clone, Debug, Serialize)]
pub struct WorkloadInfo {
    /// File name or generator spec.
    pub name: String,
    /// Requests replayed.
    pub requests: u64,
    /// Prompt tokens in all.
    pub prompt_tokens: u64,
    /// Its own request rate, requests/s.
    pub base_rate: f64,
    /// Lines skipped as malformed.
    pub skipped_lines: u64,
    /// The first few skipped lines, `line N: why`.
    pub skipped_examples: Vec<String>,
}

impl WorkloadInfo {
    /// Of `w`.
    pub fn of(w: &Workload) -> WorkloadInfo {
        WorkloadInfo {
            name: w.name.clone(),
            requests: w.requests.len() as u64,
            prompt_tokens: w.prompt_tokens(),
            base_rate: w.base_rate(),
            skipped_lines: w.skipped.len() as u64,
            skipped_examples: w.skipped.iter().take(10).map(LineError::to_string).collect(),
        }
    }
}

/// The fleet, as reported.
#[derive(Clone, Debug, Serialize)]
struct FleetInfo {
    replicas: usize,
    block_size: u32,
    gpu_blocks_per_replica: u32,
    cpu_blocks_per_replica: u32,
    max_num_batched_tokens: u32,
    max_num_seqs: u32,
    event_delay_ms: f64,
    /// GPU LoRA adapter slots per engine.
    max_loras: u32,
    /// The model of each pool, in order (empty: one pool for every request).
    pools: Vec<String>,
}

/// The whole `--json` document (serialised through `ReportJson`, which
/// puts each run's pool figures into the run's object).
#[derive(Clone, Debug)]
pub struct Report {
    /// `fast` (or `live`).
    pub mode: String,
    /// The router seed of every run.
    pub seed: u64,
    /// The workload.
    pub workload: WorkloadInfo,
    fleet: FleetInfo,
    /// The pooled-LRU oracle's hit rate.
    pub oracle_hit_rate: f64,
    /// The unlimited cache's hit rate.
    pub ceiling_hit_rate: f64,
    /// The automatic load-level search, when it ran.
    pub levels: Option<LevelSearch>,
    /// One entry per (rate, policy).
    pub runs: Vec<RunSummary>,
    /// Each model pool's own oracle, for a workload with models or
    /// adapters ([`Report::with_pools`]).
    pub pools: Option<Vec<PoolBound>>,
    /// Per run (same order as `runs`), its pool and adapter figures.
    pub pool_runs: Vec<Option<PoolRun>>,
}

/// One run in the JSON: the summary's fields, then the pool figures.
#[derive(Serialize)]
struct RunJson<'a> {
    #[serde(flatten)]
    run: &'a RunSummary,
    #[serde(flatten)]
    pools: Option<&'a PoolRun>,
}

#[derive(Serialize)]
struct ReportJson<'a> {
    mode: &'a str,
    seed: u64,
    workload: &'a WorkloadInfo,
    fleet: &'a FleetInfo,
    oracle_hit_rate: f64,
    ceiling_hit_rate: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pool_oracle_hit_rate: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pools: Option<&'a [PoolBound]>,
    levels: &'a Option<LevelSearch>,
    runs: Vec<RunJson<'a>>,
}

impl Serialize for Report {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        ReportJson {
            mode: &self.mode,
            seed: self.seed,
            workload: &self.workload,
            fleet: &self.fleet,
            oracle_hit_rate: self.oracle_hit_rate,
            ceiling_hit_rate: self.ceiling_hit_rate,
            pool_oracle_hit_rate: self.pools.as_deref().map(combined_oracle),
            pools: self.pools.as_deref(),
            levels: &self.levels,
            runs: self
                .runs
                .iter()
                .enumerate()
                .map(|(i, run)| RunJson {
                    run,
                    pools: self.pool_runs.get(i).and_then(Option::as_ref),
                })
                .collect(),
        }
        .serialize(s)
    }
}

impl Report {
    /// Assembles a report.
    pub fn new(
        seed: u64,
        workload: WorkloadInfo,
        fleet: &FleetSpec,
        oracle: (f64, f64),
        levels: Option<LevelSearch>,
        runs: Vec<RunSummary>,
    ) -> Report {
        Report {
            mode: "fast".into(),
            seed,
            workload,
            fleet: FleetInfo {
                replicas: fleet.replicas,
                block_size: fleet.engine.block_size,
                gpu_blocks_per_replica: fleet.engine.num_gpu_blocks,
                cpu_blocks_per_replica: fleet.engine.num_cpu_blocks,
                max_num_batched_tokens: fleet.engine.max_num_batched_tokens,
                max_num_seqs: fleet.engine.max_num_seqs,
                event_delay_ms: fleet.event_delay.as_secs_f64() * 1000.0,
                max_loras: fleet.engine.max_loras,
                pools: fleet.pools.clone(),
            },
            oracle_hit_rate: oracle.0,
            ceiling_hit_rate: oracle.1,
            levels,
            runs,
            pools: None,
            pool_runs: Vec::new(),
        }
    }

    /// Adds each pool's oracle and every run's pool figures (in `runs`
    /// order).
    pub fn with_pools(mut self, pools: Vec<PoolBound>, pool_runs: Vec<Option<PoolRun>>) -> Report {
        self.pools = Some(pools);
        self.pool_runs = pool_runs;
        self
    }

    /// Pretty JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
    }
}

/// The terminal table: one row per run, grouped by rate.
pub fn render_table(report: &Report) -> String {
    let mut s = String::new();
    let w = &report.workload;
    let _ = writeln!(
        s,
        "workload {}: {} requests, {:.2} req/s, {} skipped lines; oracle hit rate {:.3} (pooled LRU), ceiling {:.3}",
        w.name, w.requests, w.base_rate, w.skipped_lines, report.oracle_hit_rate, report.ceiling_hit_rate
    );
    if let Some(l) = &report.levels {
        let _ = writeln!(
            s,
            "least_load unloaded TTFT {:.1} ms at rate x{:.3}; levels: {}",
            l.unloaded_ttft_ms,
            l.unloaded_rate_scale,
            l.levels
                .iter()
                .map(|x| format!("{}x→rate x{:.3} ({:.2}x)", x.target, x.rate_scale, x.ttft_ratio))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    let _ = writeln!(
        s,
        "{:<15} {:>7} {:>7} {:>9} {:>7} {:>7} {:>8} {:>6} {:>6} {:>8} {:>8} {:>6} {:>7} {:>7} {:>6} {:>5} {:>8}",
        "policy",
        "rate x",
        "req/s",
        "ttft mean",
        "p50",
        "p90",
        "p99",
        "÷floor",
        "itl",
        "itl p90",
        "e2e mean",
        "hit",
        "÷oracle",
        "1st÷orc",
        "imbal",
        "shed",
        "decide µs"
    );
    let mut last_scale = None;
    for r in &report.runs {
        if last_scale.is_some_and(|x: f64| x != r.rate_scale) {
            s.push('\n');
        }
        last_scale = Some(r.rate_scale);
        let floor = r.ttft_floor_ms.filter(|f| *f > 0.0).map(|f| r.ttft_ms.mean / f);
        let _ = writeln!(
            s,
            "{:<15} {:>7.3} {:>7.2} {:>9.1} {:>7.1} {:>7.1} {:>8.1} {:>6} {:>6.1} {:>8.1} {:>8.0} {:>6.3} {:>7.3} {:>7.3} {:>6.2} {:>5} {:>8.1}",
            r.policy,
            r.rate_scale,
            r.rate,
            r.ttft_ms.mean,
            r.ttft_ms.p50,
            r.ttft_ms.p90,
            r.ttft_ms.p99,
            floor.map_or_else(|| "-".to_owned(), |x| format!("{x:.2}")),
            r.itl_ms.mean,
            r.itl_ms.p90,
            r.e2e_ms.mean,
            r.hit_rate,
            r.hit_rate_vs_oracle,
            r.first_admission_vs_oracle,
            r.load_imbalance,
            r.unserved,
            r.decision_us.mean
        );
    }
    s.push_str("(ms; ÷floor = mean TTFT ÷ each request alone on a replica holding its oracle prefix; hit = engine-side hit tokens ÷ queried tokens (re-admissions after preemption included); 1st÷orc = hits at first admission ÷ the oracle's; imbal = max ÷ mean prefill tokens per replica; shed = requests not served)\n");
    if let Some(pools) = &report.pools {
        render_pools(&mut s, report, pools);
    }
    render_disagg(&mut s, report);
    s
}

/// Prefill/decode runs' plans, below the main table.
fn render_disagg(s: &mut String, report: &Report) {
    let runs: Vec<_> =
        report.runs.iter().filter_map(|r| r.disagg.as_ref().map(|d| (r, d))).collect();
    if runs.is_empty() {
        return;
    }
    let _ = writeln!(
        s,
        "\n{:<15} {:>7} {:>7} {:>9} {:>7} {:>8} {:>11} {:>11} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}",
        "p/d plans",
        "rate x",
        "split",
        "bypassed",
        "bypass",
        "on P",
        "transfer ms",
        "tokens/xfer",
        "split ttft",
        "predicted",
        "bypass ttft",
        "predicted",
        "on P ttft",
        "predicted"
    );
    for (r, d) in runs {
        let _ = writeln!(
            s,
            "{:<15} {:>7.3} {:>7} {:>9} {:>7.3} {:>8} {:>11.1} {:>11.0} {:>10.1} {:>10.1} {:>10.1} {:>10.1} {:>10.1} {:>10.1}",
            r.policy,
            r.rate_scale,
            d.split,
            d.bypassed,
            d.bypass_rate,
            d.on_prefill,
            d.transfer_ms.mean,
            d.transfer_tokens_mean,
            d.split_ttft.measured_ms,
            d.split_ttft.predicted_ms,
            d.bypassed_ttft.measured_ms,
            d.bypassed_ttft.predicted_ms,
            d.on_prefill_ttft.measured_ms,
            d.on_prefill_ttft.predicted_ms,
        );
    }
}

/// The pool and adapter table, below the main one.
fn render_pools(s: &mut String, report: &Report, pools: &[PoolBound]) {
    let list: Vec<String> = pools
        .iter()
        .map(|b| {
            let name = if b.model.is_empty() { "all" } else { &b.model };
            format!(
                "{name}: {} replicas, {} requests, oracle {:.3}",
                b.replicas, b.requests, b.oracle_hit_rate
            )
        })
        .collect();
    let _ = writeln!(
        s,
        "\npools ({}); combined pool oracle {:.3}",
        list.join("; "),
        combined_oracle(pools)
    );
    let _ = write!(
        s,
        "{:<15} {:>7} {:>9} {:>9} {:>8} {:>5} {:>9} {:>9}",
        "policy", "rate x", "loads/1k", "evictions", "rt loads", "viol", "÷pool orc", "1st÷pool"
    );
    for b in pools {
        let name = if b.model.is_empty() { "all" } else { &b.model };
        let _ = write!(s, " {:>12}", format!("{name} ÷orc"));
    }
    s.push('\n');
    for (r, p) in report.runs.iter().zip(&report.pool_runs) {
        let Some(p) = p else { continue };
        let _ = write!(
            s,
            "{:<15} {:>7.3} {:>9.1} {:>9} {:>8} {:>5} {:>9.3} {:>9.3}",
            r.policy,
            r.rate_scale,
            p.adapter_loads_per_1k,
            p.adapter_evictions,
            p.router_adapter_loads,
            p.model_violations,
            p.hit_rate_vs_pool_oracle,
            p.first_admission_vs_pool_oracle
        );
        for x in &p.pools {
            let _ = write!(s, " {:>12.3}", x.hit_rate_vs_oracle);
        }
        s.push('\n');
    }
    s.push_str("(loads/1k = engine adapter loads per 1,000 requests; rt loads = routes the router knew would load; viol = requests routed outside their model's pool; ÷pool orc = engine hit rate ÷ the pools' own pooled-LRU oracles, token-weighted; 1st÷pool = first-admission hit rate ÷ the same)\n");
}
