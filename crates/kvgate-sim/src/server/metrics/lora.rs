//! `vllm:lora_requests_info` as vLLM 0.33 exposes it, and the sim's own
//! counters of GPU slot loads and evictions (vLLM exports none).
//!
//! vLLM (`vllm/v1/metrics/loggers.py`, `PrometheusStatLogger`) declares a
//! gauge with the label names `max_lora`, `waiting_lora_adapters`,
//! `running_lora_adapters` (exposed in that order, no `engine` or
//! `model_name` label), and at every stats update sets the child for the
//! current label values to the current Unix time (`set_to_current_time`).
//! Children are never removed, so every combination ever seen stays in the
//! exposition with the time it was last current: a reader takes the series
//! with the largest value.
//!
//! The adapter lists are the keys of per-adapter dicts joined with `,`.
//! In 0.33 both dicts are filled from one map of adapters that have any
//! live request (`vllm/v1/metrics/stats.py`, `LoRARequestStates
//! .update_scheduler_stats` writes every adapter into both, with its count,
//! zero included), so both labels list the same adapters: those with a
//! request waiting or running, in the order each became live. The sim
//! reproduces that; `Engine::running_loras` / `waiting_loras` keep the real
//! split for callers that want it.

use std::fmt::Write as _;

/// Label combinations kept; vLLM keeps all of them (unbounded), the sim
/// drops the least recently current beyond this.
const MAX_SERIES: usize = 256;

/// One engine's view behind `vllm:lora_requests_info`.
#[derive(Debug, Default)]
pub(crate) struct LoraInfo {
    pub(crate) enabled: bool,
    /// Adapters with a live request, in the order they became live (vLLM's
    /// map drops an adapter when its last request ends).
    live: Vec<String>,
    /// (adapter list label, Unix time it was last current), least recently
    /// current first.
    series: Vec<(String, f64)>,
}

impl LoraInfo {
    /// The engine's running and waiting adapters at Unix time `now`.
    pub(crate) fn update(&mut self, running: &[String], waiting: &[String], now: f64) {
        let is_live = |n: &String| running.contains(n) || waiting.contains(n);
        self.live.retain(|n| is_live(n));
        for n in running.iter().chain(waiting) {
            if !self.live.contains(n) {
                self.live.push(n.clone());
            }
        }
        let label = self.live.join(",");
        self.series.retain(|(l, _)| *l != label);
        self.series.push((label, now));
        if self.series.len() > MAX_SERIES {
            self.series.remove(0);
        }
    }

    pub(crate) fn series(&self) -> &[(String, f64)] {
        &self.series
    }
}

/// The gauge's family from every rank's series (one label set once, at its
/// latest time). Nothing when LoRA is off, as vLLM registers no gauge then.
pub(crate) fn render_info<'a>(
    ranks: impl Iterator<Item = &'a [(String, f64)]>,
    max_lora: u32,
) -> String {
    let mut merged: Vec<(String, f64)> = Vec::new();
    for series in ranks {
        for (label, t) in series {
            match merged.iter_mut().find(|(l, _)| l == label) {
                Some(m) => m.1 = m.1.max(*t),
                None => merged.push((label.clone(), *t)),
            }
        }
    }
    let mut out = String::from(
        "# HELP vllm:lora_requests_info Running stats on lora requests.\n\
         # TYPE vllm:lora_requests_info gauge\n",
    );
    for (label, t) in merged {
        let label = super::escape(&label);
        let _ = writeln!(
            out,
            "vllm:lora_requests_info{{max_lora=\"{max_lora}\",waiting_lora_adapters=\"{label}\",running_lora_adapters=\"{label}\"}} {}",
            go_float(t)
        );
    }
    out
}

/// prometheus_client's `floatToGoString`: Python's repr, switched to Go's
/// exponent form once the integer part has more than six digits (a Unix
/// time reads `1.7648e+09`).
pub(crate) fn go_float(v: f64) -> String {
    if !v.is_finite() {
        return if v.is_nan() {
            "NaN".into()
        } else if v > 0.0 {
            "+Inf".into()
        } else {
            "-Inf".into()
        };
    }
    let repr = if v.fract() == 0.0 && v.abs() < 1e16 { format!("{v:.1}") } else { format!("{v}") };
    match repr.find('.') {
        Some(dot) if v > 0.0 && dot > 6 => {
            let digits: String = repr.chars().filter(|c| *c != '.').collect();
            let mantissa = format!("{}.{}", &digits[..1], &digits[1..]);
            let mantissa = mantissa.trim_end_matches('0').trim_end_matches('.');
            format!("{mantissa}e+0{}", dot - 1)
        }
        _ => repr,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_float_matches_prometheus_client() {
        assert_eq!(go_float(1_739_557_565.758_985_5), "1.7395575657589855e+09");
        assert_eq!(go_float(1_700_000_000.0), "1.7e+09");
        assert_eq!(go_float(12.5), "12.5");
        assert_eq!(go_float(3.0), "3.0");
    }

    #[test]
    fn both_labels_list_live_adapters_in_arrival_order() {
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        let mut info = LoraInfo::default();
        info.update(&s(&[]), &s(&[]), 1.0);
        info.update(&s(&["b"]), &s(&["a"]), 2.0);
        info.update(&s(&["a", "b"]), &s(&[]), 3.0);
        info.update(&s(&[]), &s(&[]), 4.0);
        let labels: Vec<&str> = info.series().iter().map(|(l, _)| l.as_str()).collect();
        // "b,a" was current at 2 and 3 (b became live first): one series.
        assert_eq!(labels, ["b,a", ""]);
        assert_eq!(info.series()[0].1, 3.0);
        let text = render_info([info.series()].into_iter(), 2);
        assert!(text.contains(
            "vllm:lora_requests_info{max_lora=\"2\",waiting_lora_adapters=\"b,a\",running_lora_adapters=\"b,a\"} 3.0\n"
        ));
        assert!(text.contains("waiting_lora_adapters=\"\",running_lora_adapters=\"\"} 4.0\n"));
    }
}
