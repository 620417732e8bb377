//! The scoreboard of `kvgate replay --suite`: per workload and
//! load level, each policy's metrics as ratios to the best policy's, so one
//! table says where `kv_aware` leads and where it does not.

use std::fmt::Write as _;

use serde::Serialize;

use crate::metrics::RunSummary;
use crate::report::Report;

/// One scored metric.
struct Metric {
    name: &'static str,
    /// Higher is better (else lower).
    higher_is_better: bool,
    /// Shown as its value (already a ratio to a physical bound) rather than
    /// as a ratio to the best policy.
    absolute: bool,
    get: fn(&RunSummary) -> Option<f64>,
}

/// The metrics scored, in table order.
const METRICS: [Metric; 7] = [
    Metric {
        name: "ttft_mean",
        higher_is_better: false,
        absolute: false,
        get: |r| Some(r.ttft_ms.mean),
    },
    Metric {
        name: "ttft_p90",
        higher_is_better: false,
        absolute: false,
        get: |r| Some(r.ttft_ms.p90),
    },
    Metric {
        name: "itl_mean",
        higher_is_better: false,
        absolute: false,
        get: |r| Some(r.itl_ms.mean),
    },
    Metric {
        name: "e2e_mean",
        higher_is_better: false,
        absolute: false,
        get: |r| Some(r.e2e_ms.mean),
    },
    Metric {
        name: "hit_vs_oracle",
        higher_is_better: true,
        absolute: true,
        get: |r| Some(r.hit_rate_vs_oracle),
    },
    // The engine counters also count a preempted request's hits on its own
    // blocks when it is admitted again, so under load they rise with
    // preemptions; placement is judged by the hits at first admission.
    Metric {
        name: "first_vs_oracle",
        higher_is_better: true,
        absolute: true,
        get: |r| Some(r.first_admission_vs_oracle),
    },
    Metric {
        name: "ttft_vs_floor",
        higher_is_better: false,
        absolute: true,
        get: |r| Some(r.ttft_ms.mean / r.ttft_floor_ms.filter(|f| *f > 0.0)?),
    },
];

fn metric(r: &RunSummary, m: &Metric) -> Option<f64> {
    (m.get)(r).filter(|x| x.is_finite())
}

/// One policy at one level: its value and ratio to the best, per metric.
#[derive(Clone, Debug, Serialize)]
pub struct PolicyScore {
    /// The policy.
    pub policy: String,
    /// (metric, value, value ÷ the best policy's value) in `METRICS` order;
    /// `None` where the metric does not apply (no hits to compare, no floor).
    pub metrics: Vec<(String, Option<f64>, Option<f64>)>,
    /// Requests not served.
    pub unserved: u64,
}

/// One workload at one load level.
#[derive(Clone, Debug, Serialize)]
pub struct LevelScore {
    /// The workload's name.
    pub workload: String,
    /// The level's target (least_load TTFT ÷ unloaded), when found by search.
    pub level: Option<f64>,
    /// Its rate scale.
    pub rate_scale: f64,
    /// Every policy run at it.
    pub policies: Vec<PolicyScore>,
}

/// Scores every level of every report.
pub fn scoreboard(reports: &[Report]) -> Vec<LevelScore> {
    let mut out = Vec::new();
    for rep in reports {
        let mut scales: Vec<f64> = rep.runs.iter().map(|r| r.rate_scale).collect();
        scales.dedup();
        for scale in scales {
            let runs: Vec<&RunSummary> =
                rep.runs.iter().filter(|r| r.rate_scale == scale).collect();
            let level = rep
                .levels
                .as_ref()
                .and_then(|l| l.levels.iter().find(|x| x.rate_scale == scale).map(|x| x.target));
            let best: Vec<Option<f64>> = METRICS
                .iter()
                .map(|m| {
                    let vals = runs.iter().filter_map(|r| metric(r, m));
                    if m.higher_is_better {
                        vals.reduce(f64::max)
                    } else {
                        vals.reduce(f64::min)
                    }
                })
                .collect();
            let policies = runs
                .iter()
                .map(|r| PolicyScore {
                    policy: r.policy.clone(),
                    metrics: METRICS
                        .iter()
                        .zip(&best)
                        .map(|(m, b)| {
                            let v = metric(r, m);
                            let ratio = match (v, b) {
                                (Some(v), Some(b)) if *b > 0.0 => Some(v / b),
                                _ => None,
                            };
                            (m.name.to_owned(), v, ratio)
                        })
                        .collect(),
                    unserved: r.unserved,
                })
                .collect();
            out.push(LevelScore {
                workload: rep.workload.name.clone(),
                level,
                rate_scale: scale,
                policies,
            });
        }
    }
    out
}

/// The terminal scoreboard: one row per workload, level and policy, each
/// metric as its ratio to the best (1.000 is the best).
pub fn render_scoreboard(levels: &[LevelScore]) -> String {
    let mut s = String::new();
    let _ = write!(s, "{:<34} {:>5} {:>7} {:<15}", "workload", "level", "rate x", "policy");
    for m in &METRICS {
        let _ = write!(s, " {:>15}", m.name);
    }
    let _ = writeln!(s, " {:>5}", "shed");
    for l in levels {
        for p in &l.policies {
            let level = l.level.map_or_else(|| "-".to_owned(), |x| format!("{x}x"));
            let _ = write!(
                s,
                "{:<34} {:>5} {:>7.3} {:<15}",
                truncate(&l.workload, 34),
                level,
                l.rate_scale,
                p.policy
            );
            for (m, (_, value, ratio)) in METRICS.iter().zip(&p.metrics) {
                // Bounds are shown as themselves: their targets are absolute.
                let shown = if m.absolute { value } else { ratio };
                match shown {
                    Some(r) => {
                        let _ = write!(s, " {r:>15.3}");
                    }
                    None => {
                        let _ = write!(s, " {:>15}", "-");
                    }
                }
            }
            let _ = writeln!(s, " {:>5}", p.unserved);
        }
        s.push('\n');
    }
    s.push_str(
        "(ttft, itl, e2e: ÷ the best policy's at that level, 1.000 is the best; hit_vs_oracle: \
         engine hit rate ÷ the pooled-LRU oracle's, re-admissions after preemption \
         included; first_vs_oracle: the same at each request's first admission; ttft_vs_floor: mean TTFT ÷ the TTFT lower \
         bound; the JSON has both the values and the ratios of every metric)\n",
    );
    s
}

fn truncate(s: &str, n: usize) -> &str {
    match s.char_indices().nth(n) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capacity::FleetSpec;
    use crate::metrics::Distribution;
    use crate::report::WorkloadInfo;

    fn run(policy: &str, ttft: f64, hit: f64) -> RunSummary {
        RunSummary {
            policy: policy.into(),
            rate_scale: 2.0,
            ttft_ms: Distribution { mean: ttft, p50: ttft, p90: 2.0 * ttft, p99: 3.0 * ttft },
            itl_ms: Distribution { mean: 20.0, ..Distribution::default() },
            e2e_ms: Distribution { mean: 1000.0 + ttft, ..Distribution::default() },
            hit_rate_vs_oracle: hit,
            first_admission_vs_oracle: hit - 0.1,
            ttft_floor_ms: Some(50.0),
            ..RunSummary::default()
        }
    }

    #[test]
    fn ratios_are_to_the_best_policy_at_each_level() {
        let workload = WorkloadInfo {
            name: "w".into(),
            requests: 2,
            prompt_tokens: 0,
            base_rate: 1.0,
            skipped_lines: 0,
            skipped_examples: Vec::new(),
        };
        let runs = vec![run("kv_aware", 100.0, 0.9), run("least_load", 80.0, 0.3)];
        let rep = Report::new(1, workload, &FleetSpec::acceptance(), (0.5, 0.5), None, runs);
        let board = scoreboard(&[rep]);
        assert_eq!(board.len(), 1);
        let kv = &board[0].policies[0];
        let ratio = |name: &str| kv.metrics.iter().find(|m| m.0 == name).and_then(|m| m.2);
        assert_eq!(ratio("ttft_mean"), Some(100.0 / 80.0));
        assert_eq!(ratio("ttft_p90"), Some(200.0 / 160.0));
        assert_eq!(ratio("itl_mean"), Some(1.0));
        assert_eq!(ratio("hit_vs_oracle"), Some(1.0));
        assert_eq!(ratio("ttft_vs_floor"), Some(2.0 / 1.6));
        let value = |name: &str| kv.metrics.iter().find(|m| m.0 == name).and_then(|m| m.1);
        assert_eq!(value("first_vs_oracle"), Some(0.9 - 0.1));
        let ll = &board[0].policies[1];
        assert_eq!(ll.metrics[4].2, Some(0.3 / 0.9));
        let table = render_scoreboard(&board);
        assert!(table.contains("kv_aware") && table.contains("1.250"), "{table}");
        // Bounds show as values: kv_aware's hits ÷ oracle, TTFT ÷ floor.
        assert!(table.contains("0.900") && table.contains("2.000"), "{table}");
        assert!(table.contains("first_vs_oracle") && table.contains("0.800"), "{table}");
    }
}
