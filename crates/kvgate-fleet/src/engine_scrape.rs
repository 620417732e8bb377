//! What one scrape of an engine's `/metrics` says, as the fleet core keeps
//! it per replica. The shell parses the text (`kvgate-gateway`'s
//! `scrape.rs`); the core only reads these values.

use kvgate_router::EngineTiming;

/// What one scrape of a vLLM `/metrics` says.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EngineScrape {
    /// `vllm:num_requests_running`, summed over engines (data-parallel ranks).
    pub running: u32,
    /// `vllm:num_requests_waiting`, summed.
    pub waiting: u32,
    /// `vllm:kv_cache_usage_perc` (or the older `gpu_cache_usage_perc`), mean.
    pub kv_usage: f64,
    /// `vllm:prefix_cache_queries_total`, tokens.
    pub prefix_queries: u64,
    /// `vllm:prefix_cache_hits_total`, tokens.
    pub prefix_hits: u64,
    /// `vllm:cache_config_info` label `block_size`.
    pub block_size: Option<u32>,
    /// `vllm:cache_config_info` label `num_gpu_blocks`.
    pub num_gpu_blocks: Option<u64>,
    /// `vllm:cache_config_info` label `num_cpu_blocks`, when set.
    pub num_cpu_blocks: Option<u64>,
    /// vLLM's request-level timing totals, when the engine exports them.
    pub timing: Option<EngineTiming>,
    /// `vllm:lora_requests_info`, when the engine serves adapters.
    pub lora: Option<LoraScrape>,
    /// KV received from prefill replicas, when the engine's NIXL connector
    /// reports it (a decode replica of a disaggregated pool).
    pub transfers: Option<TransferTotals>,
    /// The engine's `max_num_batched_tokens`. vLLM's `/metrics` does not
    /// export it, so a live scrape leaves it `None` and the router keeps
    /// its default; fast-mode replay's simulated engines report theirs.
    pub step_budget: Option<u32>,
}

/// NIXL's cumulative transfer series (vLLM 0.33
/// `distributed/kv_transfer/kv_connector/v1/nixl/stats.py`), summed over
/// engines: `vllm:nixl_xfer_time_seconds` (each pull's duration) and
/// `vllm:nixl_bytes_transferred`. Their differences between two scrapes
/// give the link's seconds per byte, which calibrates the planner's
/// transfer rate (`Fleet::probe_succeeded`).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct TransferTotals {
    /// Transfers (`vllm:nixl_xfer_time_seconds_count`).
    pub count: f64,
    /// Seconds spent in them (`vllm:nixl_xfer_time_seconds_sum`).
    pub seconds: f64,
    /// Bytes moved (`vllm:nixl_bytes_transferred_sum`).
    pub bytes: f64,
}

impl TransferTotals {
    /// Bytes and seconds of the transfers since `earlier`; `None` when
    /// there were none, or a counter went back (the engine restarted).
    pub fn since(&self, earlier: &TransferTotals) -> Option<(f64, f64)> {
        let (n, s, b) = (
            self.count - earlier.count,
            self.seconds - earlier.seconds,
            self.bytes - earlier.bytes,
        );
        (n > 0.0 && s >= 0.0 && b > 0.0).then_some((b, s))
    }
}

/// The engine's LoRA slots, from `vllm:lora_requests_info`: vLLM sets a new
/// label set to the current time whenever its running or waiting adapters
/// change, and the old sets stay exported, so the sample with the greatest
/// value is the current one.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LoraScrape {
    /// Label `max_lora`: the engine's adapter slots.
    pub max_loras: u32,
    /// Labels `running_lora_adapters` and `waiting_lora_adapters` (comma
    /// separated): adapters in a slot or about to be.
    pub adapters: Vec<String>,
    /// The sample's value (when it was set), to pick the newest.
    pub at: f64,
}
