//! `/metrics` in the Prometheus text format with vLLM's metric names.
//!
//! Hand-written: vLLM's names contain `:` (`vllm:num_requests_running`),
//! which is legal in the exposition format but reserved for recording rules
//! by convention, and the exposition here is a dozen lines.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use crate::engine::EngineStats;
use crate::EngineConfig;

/// vLLM's `vllm:time_to_first_token_seconds` buckets.
pub const TTFT_BUCKETS: [f64; 22] = [
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];

/// vLLM's `vllm:inter_token_latency_seconds` buckets.
pub const ITL_BUCKETS: [f64; 19] = [
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0,
];

#[derive(Debug)]
struct Histogram {
    name: &'static str,
    help: &'static str,
    buckets: &'static [f64],
    counts: Vec<u64>,
    count: u64,
    sum: f64,
}

impl Histogram {
    fn new(name: &'static str, help: &'static str, buckets: &'static [f64]) -> Histogram {
        Histogram { name, help, buckets, counts: vec![0; buckets.len()], count: 0, sum: 0.0 }
    }

    fn observe(&mut self, seconds: f64) {
        for (count, le) in self.counts.iter_mut().zip(self.buckets) {
            if seconds <= *le {
                *count += 1;
            }
        }
        self.count += 1;
        self.sum += seconds;
    }

    fn render(&self, out: &mut String, labels: &str) {
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

/// Shared between the driver (writer) and `/metrics` (reader).
#[derive(Debug)]
pub struct Metrics {
    stats: Mutex<EngineStats>,
    ttft: Mutex<Histogram>,
    itl: Mutex<Histogram>,
    tokenizations: AtomicU64,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            stats: Mutex::default(),
            ttft: Mutex::new(Histogram::new(
                "vllm:time_to_first_token_seconds",
                "Histogram of time to first token in seconds.",
                &TTFT_BUCKETS,
            )),
            itl: Mutex::new(Histogram::new(
                "vllm:inter_token_latency_seconds",
                "Histogram of inter-token latency in seconds.",
                &ITL_BUCKETS,
            )),
            tokenizations: AtomicU64::new(0),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Metrics {
    pub(crate) fn set_stats(&self, stats: EngineStats) {
        *lock(&self.stats) = stats;
    }

    /// The engine's stats as of its last step.
    pub fn stats(&self) -> EngineStats {
        lock(&self.stats).clone()
    }

    pub(crate) fn observe_ttft(&self, seconds: f64) {
        lock(&self.ttft).observe(seconds);
    }

    pub(crate) fn observe_itl(&self, seconds: f64) {
        lock(&self.itl).observe(seconds);
    }

    pub(crate) fn count_tokenization(&self) {
        self.tokenizations.fetch_add(1, Ordering::Relaxed);
    }

    /// Prompts this replica tokenized itself.
    pub fn tokenizations(&self) -> u64 {
        self.tokenizations.load(Ordering::Relaxed)
    }

    /// The exposition text.
    pub fn render(&self, model: &str, config: &EngineConfig) -> String {
        let s = self.stats();
        let labels = format!("engine=\"0\",model_name=\"{}\"", escape(model));
        let mut out = String::with_capacity(4096);
        let mut metric = |name: &str, kind: &str, help: &str, sample: &str, value: String| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
            let _ = writeln!(out, "{sample}{{{labels}}} {value}");
        };
        metric(
            "vllm:num_requests_running",
            "gauge",
            "Number of requests in model execution batches.",
            "vllm:num_requests_running",
            float(s.running as f64),
        );
        metric(
            "vllm:num_requests_waiting",
            "gauge",
            "Number of requests waiting to be processed.",
            "vllm:num_requests_waiting",
            float(s.waiting as f64),
        );
        metric(
            "vllm:kv_cache_usage_perc",
            "gauge",
            "KV-cache usage. 1 means 100 percent usage.",
            "vllm:kv_cache_usage_perc",
            float(s.kv_usage),
        );
        metric(
            "vllm:prefix_cache_queries",
            "counter",
            "Prefix cache queries, in terms of number of queried tokens.",
            "vllm:prefix_cache_queries_total",
            float(s.prefix_cache_queries as f64),
        );
        metric(
            "vllm:prefix_cache_hits",
            "counter",
            "Prefix cache hits, in terms of number of cached tokens.",
            "vllm:prefix_cache_hits_total",
            float(s.prefix_cache_hits as f64),
        );
        // The CPU tier answers as vLLM's KV connector does, under the
        // connector's counters (only exported when there is one).
        if config.num_cpu_blocks > 0 {
            metric(
                "vllm:external_prefix_cache_queries",
                "counter",
                "External prefix cache queries from KV connector cross-instance cache sharing, in terms of number of queried tokens.",
                "vllm:external_prefix_cache_queries_total",
                float(s.external_queries as f64),
            );
            metric(
                "vllm:external_prefix_cache_hits",
                "counter",
                "External prefix cache hits from KV connector cross-instance cache sharing, in terms of number of cached tokens.",
                "vllm:external_prefix_cache_hits_total",
                float(s.external_hit_tokens as f64),
            );
        }
        metric(
            "vllm:num_preemptions",
            "counter",
            "Cumulative number of preemption from the engine.",
            "vllm:num_preemptions_total",
            float(s.preemptions as f64),
        );
        metric(
            "vllm:generation_tokens",
            "counter",
            "Number of generation tokens processed.",
            "vllm:generation_tokens_total",
            float(s.generated_tokens as f64),
        );
        metric(
            "kvgate_sim_tokenizations",
            "counter",
            "Prompts the simulated engine tokenized itself (not passed through).",
            "kvgate_sim_tokenizations_total",
            float(self.tokenizations() as f64),
        );
        let _ = writeln!(
            out,
            "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n\
             # TYPE vllm:cache_config_info gauge\n\
             vllm:cache_config_info{{block_size=\"{}\",cache_dtype=\"auto\",enable_prefix_caching=\"True\",engine=\"0\",num_cpu_blocks=\"{}\",num_gpu_blocks=\"{}\"}} 1.0",
            config.block_size, config.num_cpu_blocks, config.num_gpu_blocks
        );
        lock(&self.ttft).render(&mut out, &labels);
        lock(&self.itl).render(&mut out, &labels);
        out
    }
}

/// Python's float repr for the values we emit (`1.0`, `0.25`).
fn float(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{v:.1}")
    } else {
        format!("{v}")
    }
}

fn escape(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// Reads one sample's value from an exposition, by its name and an
/// optional label substring: for tests and scripts.
pub fn scrape(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}
