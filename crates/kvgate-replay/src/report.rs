//! What a replay prints: the `--json` document (schema in `docs/replay.md`)
//! and the terminal table.

use std::fmt::Write as _;

use serde::Serialize;

use crate::capacity::FleetSpec;
use crate::error::LineError;
use crate::metrics::RunSummary;
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
}

/// The whole `--json` document.
#[derive(Clone, Debug, Serialize)]
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
            },
            oracle_hit_rate: oracle.0,
            ceiling_hit_rate: oracle.1,
            levels,
            runs,
        }
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
        "{:<15} {:>7} {:>7} {:>9} {:>7} {:>7} {:>8} {:>6} {:>6} {:>8} {:>8} {:>6} {:>7} {:>6} {:>5} {:>8}",
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
            "{:<15} {:>7.3} {:>7.2} {:>9.1} {:>7.1} {:>7.1} {:>8.1} {:>6} {:>6.1} {:>8.1} {:>8.0} {:>6.3} {:>7.3} {:>6.2} {:>5} {:>8.1}",
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
            r.load_imbalance,
            r.unserved,
            r.decision_us.mean
        );
    }
    s.push_str("(ms; ÷floor = mean TTFT ÷ each request alone on a replica holding its oracle prefix; hit = engine-side hit tokens ÷ queried tokens; imbal = max ÷ mean prefill tokens per replica; shed = requests not served)\n");
    s
}
