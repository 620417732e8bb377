//! Prometheus histograms with vLLM 0.33's bucket families
//! (`vllm/v1/metrics/buckets.py`).

use std::fmt::Write as _;

use super::float;

/// vLLM's `time_to_first_token` family (`vllm:time_to_first_token_seconds`).
pub const TTFT_BUCKETS: [f64; 22] = [
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];

/// vLLM's `inter_token_latency` family (`vllm:inter_token_latency_seconds`
/// and `vllm:request_time_per_output_token_seconds`).
pub const ITL_BUCKETS: [f64; 19] = [
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0,
];

/// vLLM's `request_latency` family: e2e, queue, inference, prefill and
/// decode times.
pub const REQUEST_LATENCY_BUCKETS: [f64; 21] = [
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
];

/// vLLM's `iteration_tokens` family (`vllm:iteration_tokens_total`).
pub const ITERATION_TOKENS_BUCKETS: [f64; 13] =
    [1.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0];

/// vLLM's `request_num_preemptions` family.
pub const REQUEST_NUM_PREEMPTIONS_BUCKETS: [f64; 7] = [1.0, 2.0, 3.0, 4.0, 5.0, 10.0, 20.0];

/// vLLM's `request_tokens` family: 1, 2, 5, 10, 20, 50, ... up to
/// `max_model_len` (`build_1_2_5_buckets`).
pub fn request_tokens_buckets(max_model_len: u64) -> Vec<f64> {
    let mut out = Vec::new();
    let mut scale = 1u64;
    loop {
        for m in [1u64, 2, 5] {
            match m.checked_mul(scale) {
                Some(v) if v <= max_model_len => out.push(v as f64),
                _ => return out,
            }
        }
        scale = match scale.checked_mul(10) {
            Some(s) => s,
            None => return out,
        };
    }
}

#[derive(Debug)]
pub(super) struct Histogram {
    name: &'static str,
    help: &'static str,
    buckets: Vec<f64>,
    counts: Vec<u64>,
    count: u64,
    sum: f64,
}

impl Histogram {
    pub(super) fn new(name: &'static str, help: &'static str, buckets: &[f64]) -> Histogram {
        Histogram {
            name,
            help,
            buckets: buckets.to_vec(),
            counts: vec![0; buckets.len()],
            count: 0,
            sum: 0.0,
        }
    }

    pub(super) fn observe(&mut self, value: f64) {
        for (count, le) in self.counts.iter_mut().zip(&self.buckets) {
            if value <= *le {
                *count += 1;
            }
        }
        self.count += 1;
        self.sum += value;
    }

    pub(super) fn render(&self, out: &mut String, labels: &str) {
        let (name, help) = (self.name, self.help);
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        for (le, count) in self.buckets.iter().zip(&self.counts) {
            let _ = writeln!(
                out,
                "{name}_bucket{{{labels},le=\"{}\"}} {}",
                float(*le),
                float(*count as f64)
            );
        }
        let count = float(self.count as f64);
        let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {count}");
        let _ = writeln!(out, "{name}_count{{{labels}}} {count}");
        let _ = writeln!(out, "{name}_sum{{{labels}}} {}", float(self.sum));
    }
}

#[cfg(test)]
mod tests {
    use super::request_tokens_buckets;

    #[test]
    fn request_token_buckets_follow_vllms_1_2_5_series() {
        assert_eq!(request_tokens_buckets(100), [1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0]);
        assert_eq!(request_tokens_buckets(0), Vec::<f64>::new());
        assert_eq!(request_tokens_buckets(u64::MAX).len(), 58);
    }
}
