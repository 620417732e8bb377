//! `/metrics` in the Prometheus text format with vLLM's metric names.
//!
//! Hand-written: vLLM's names contain `:` (`vllm:num_requests_running`),
//! which is legal in the exposition format but reserved for recording rules
//! by convention, and the exposition is simple enough to write by hand.
//!
//! The request-level and iteration histograms follow vLLM 0.33
//! (`vllm/v1/metrics/loggers.py`, `PrometheusStatLogger`): names, help,
//! buckets, and when each is observed (the per-request timeline is
//! `request_stats.rs`). Times are wall seconds, as a real engine's: with
//! `--speedup X` the model's durations are reported X times shorter.

mod histogram;
mod lora;
mod observed;
mod scrape;
mod transfers;

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use crate::engine::EngineStats;
use crate::request_stats::StepRecord;
use crate::EngineConfig;

pub use histogram::{
    request_tokens_buckets, ITERATION_TOKENS_BUCKETS, ITL_BUCKETS, REQUEST_LATENCY_BUCKETS,
    REQUEST_NUM_PREEMPTIONS_BUCKETS, TTFT_BUCKETS,
};
pub(crate) use lora::render_info as render_lora_info;
use lora::LoraInfo;
use observed::Observed;
pub use scrape::{scrape, scrape_histogram, scrape_labeled, HistogramTotals};
use transfers::Transfers;

/// Shared between the driver (writer) and `/metrics` (reader).
#[derive(Debug)]
pub struct Metrics {
    stats: Mutex<EngineStats>,
    observed: Mutex<Observed>,
    tokenizations: AtomicU64,
    /// Behind `vllm:lora_requests_info` (see `metrics/lora.rs`).
    lora: Mutex<LoraInfo>,
    /// KV received from prefill replicas, with a KV connector configured
    /// (`metrics/transfers.rs`); `None` without one.
    transfers: Mutex<Option<Transfers>>,
}

impl Default for Metrics {
    /// Token-count buckets for the default engine's `max_model_len`.
    fn default() -> Self {
        Metrics::new(EngineConfig::default().max_model_len())
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Metrics {
    /// Metrics for an engine of `max_model_len` tokens (the token-count
    /// histograms' buckets stop there, as vLLM's do).
    pub fn new(max_model_len: u64) -> Metrics {
        Metrics {
            stats: Mutex::default(),
            observed: Mutex::new(Observed::new(max_model_len)),
            tokenizations: AtomicU64::new(0),
            lora: Mutex::default(),
            transfers: Mutex::default(),
        }
    }

    /// A KV connector is configured (`--kv-transfer-config`): export its
    /// transfer series, as vLLM's NIXL connector does.
    pub(crate) fn enable_kv_transfer(&self) {
        lock(&self.transfers).get_or_insert_with(Transfers::new);
    }

    /// One decode hop's receipt of `bytes` of KV in `seconds` (wall).
    pub(crate) fn record_transfer(&self, seconds: f64, bytes: f64) {
        if let Some(t) = lock(&self.transfers).as_mut() {
            t.observe(seconds, bytes);
        }
    }

    /// LoRA is on (vLLM's `--enable-lora`): export the LoRA metrics.
    pub(crate) fn enable_lora(&self) {
        lock(&self.lora).enabled = true;
    }

    pub(crate) fn lora_enabled(&self) -> bool {
        lock(&self.lora).enabled
    }

    /// The engine's running and waiting adapters at Unix time `now`.
    pub(crate) fn set_loras(&self, running: &[String], waiting: &[String], now: f64) {
        lock(&self.lora).update(running, waiting, now);
    }

    /// `vllm:lora_requests_info`'s label sets with their times.
    pub(crate) fn lora_series(&self) -> Vec<(String, f64)> {
        lock(&self.lora).series().to_vec()
    }

    pub(crate) fn set_stats(&self, stats: EngineStats) {
        *lock(&self.stats) = stats;
    }

    /// The engine's stats as of its last step.
    pub fn stats(&self) -> EngineStats {
        lock(&self.stats).clone()
    }

    /// One step's observations, all at once.
    pub(crate) fn record(&self, rec: &StepRecord) {
        lock(&self.observed).record(rec);
    }

    pub(crate) fn count_tokenization(&self) {
        self.tokenizations.fetch_add(1, Ordering::Relaxed);
    }

    /// Prompts this replica tokenized itself.
    pub fn tokenizations(&self) -> u64 {
        self.tokenizations.load(Ordering::Relaxed)
    }

    /// The exposition text.
    /// `engine` is the data-parallel rank (vLLM's `engine` label).
    pub fn render(&self, model: &str, config: &EngineConfig, engine: usize) -> String {
        let s = self.stats();
        let labels = format!("engine=\"{engine}\",model_name=\"{}\"", escape(model));
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
        if self.lora_enabled() {
            // vLLM has no counter of adapter loads; these are the sim's.
            metric(
                "kvgate_sim_lora_loads",
                "counter",
                "LoRA adapters made resident in a GPU slot (not a vLLM metric).",
                "kvgate_sim_lora_loads_total",
                float(s.lora_loads as f64),
            );
            metric(
                "kvgate_sim_lora_evictions",
                "counter",
                "LoRA adapters evicted from their GPU slot by another's load (not a vLLM metric).",
                "kvgate_sim_lora_evictions_total",
                float(s.lora_evictions as f64),
            );
        }
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
             vllm:cache_config_info{{block_size=\"{}\",cache_dtype=\"auto\",enable_prefix_caching=\"True\",engine=\"{}\",num_cpu_blocks=\"{}\",num_gpu_blocks=\"{}\"}} 1.0",
            config.block_size, engine, config.num_cpu_blocks, config.num_gpu_blocks
        );
        lock(&self.observed).render(&mut out, &labels);
        if let Some(t) = lock(&self.transfers).as_ref() {
            t.render(&mut out, &labels);
        }
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
