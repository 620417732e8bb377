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
    /// When it was scraped.
    pub at: Instant,
}
