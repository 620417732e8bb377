//! What the router knows about one replica: static facts, health, and the
//! engine's last report.

use std::time::Instant;

use crate::error::RouterError;

/// Static facts about a replica, from configuration or discovery.
#[derive(Clone, Debug, PartialEq)]
pub struct ReplicaInfo {
    /// Name for logs and explanations (usually the URL).
    pub name: String,
    /// Tokens per KV block.
    pub block_size: u32,
    /// KV capacity in blocks per tier (GPU, CPU, storage); 0 when unknown.
    pub capacity_blocks: [u64; 3],
    /// The engine's per-step token budget (`--max-num-batched-tokens`).
    pub max_num_batched_tokens: u32,
}

impl ReplicaInfo {
    /// A replica with vLLM's defaults for the budget and unknown capacities.
    pub fn new(name: impl Into<String>, block_size: u32) -> ReplicaInfo {
        ReplicaInfo {
            name: name.into(),
            block_size,
            capacity_blocks: [0; 3],
            max_num_batched_tokens: 8192,
        }
    }

    pub(crate) fn validate(&self) -> Result<(), RouterError> {
        let bad = |reason: &str| {
            Err(RouterError::InvalidReplica { name: self.name.clone(), reason: reason.into() })
        };
        if self.block_size == 0 {
            return bad("block_size must be > 0");
        }
        if self.max_num_batched_tokens == 0 {
            return bad("max_num_batched_tokens must be > 0");
        }
        Ok(())
    }
}

/// Whether a replica takes traffic, and whether its KV view can be trusted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Health {
    /// Routable, view trusted.
    #[default]
    Healthy,
    /// Routable, but its KV view is being rebuilt (after a reset or lost
    /// events): its overlap counts as zero so that no request is sent to
    /// ghost blocks.
    Degraded,
    /// Not routable (unreachable, draining or removed from rotation).
    Down,
}

impl Health {
    /// Lower-case name for explanations and metrics.
    pub fn name(self) -> &'static str {
        match self {
            Health::Healthy => "healthy",
            Health::Degraded => "degraded",
            Health::Down => "down",
        }
    }
}

/// What the engine last reported (its `/metrics`), with the time of the
/// report.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EngineReport {
    /// `vllm:num_requests_running`.
    pub running: u32,
    /// `vllm:num_requests_waiting`.
    pub waiting: u32,
    /// `vllm:kv_cache_usage_perc`, 0–1.
    pub kv_usage: f64,
    /// `vllm:prefix_cache_queries_total` (tokens).
    pub prefix_cache_queries: u64,
    /// `vllm:prefix_cache_hits_total` (tokens).
    pub prefix_cache_hits: u64,
    /// What the engine measured of its requests' phases, when it exports it
    /// (vLLM's request-level histograms); calibration prefers it to TTFTs
    /// seen from outside (docs/routing.md, "Calibration").
    pub timing: Option<EngineTiming>,
    /// When it was scraped.
    pub at: Instant,
}

/// Cumulative totals of vLLM's request-level metrics. vLLM observes them when
/// a request finishes, so one request's phases and computed tokens land in
/// the same scrape; the router works on the differences between reports.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct EngineTiming {
    /// Requests counted (`vllm:request_prefill_time_seconds_count`).
    pub requests: u64,
    /// Seconds from first scheduled to first token, summed
    /// (`vllm:request_prefill_time_seconds_sum`).
    pub prefill_s: f64,
    /// Seconds waiting before first scheduled, summed
    /// (`vllm:request_queue_time_seconds_sum`).
    pub queue_s: f64,
    /// Prompt tokens the engine computed in those prefills, cached tokens
    /// excluded (`vllm:request_prefill_kv_computed_tokens_sum`, or prompt
    /// tokens minus prefix-cache hits where that is missing).
    pub computed_tokens: u64,
    /// Inter-token latencies observed (`vllm:inter_token_latency_seconds_count`).
    pub itl_count: u64,
    /// Their sum in seconds: mean = one decode step's duration.
    pub itl_s: f64,
}
