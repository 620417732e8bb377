//! The acceptance fleet and where its KV capacity comes from.
//!
//! Each replica is one Qwen3-32B pod as in llm-d's public benchmark (the
//! source of the `llmd_qwen3_32b` timing preset): tensor parallel over two
//! 80 GiB H100s. vLLM gives the KV cache what is left of
//! `gpu_memory_utilization × memory` after the weights and the runtime's own
//! memory (activations of the profiling step, CUDA graphs, NCCL buffers).
//! `docs/sim.md` walks through the numbers; a unit test pins them.

use std::time::Duration;

use kvgate_sim::{EngineConfig, TimingModel};

const GIB: f64 = (1u64 << 30) as f64;

/// The inputs of the GPU KV capacity derivation.
#[derive(Clone, Debug, PartialEq)]
pub struct KvMemoryModel {
    /// GPUs per replica (tensor parallel degree).
    pub gpus: u32,
    /// Memory per GPU, GiB.
    pub gpu_memory_gib: f64,
    /// vLLM `--gpu-memory-utilization`.
    pub gpu_memory_utilization: f64,
    /// Runtime memory per GPU outside weights and KV (activations, CUDA
    /// graphs, communication buffers), GiB.
    pub runtime_reserve_gib: f64,
    /// Model parameters.
    pub parameters: f64,
    /// Bytes per weight (bf16: 2).
    pub bytes_per_parameter: f64,
    /// Transformer layers.
    pub layers: u32,
    /// KV heads (grouped-query attention).
    pub kv_heads: u32,
    /// Dimension per head.
    pub head_dim: u32,
    /// Bytes per cached K or V element (bf16: 2).
    pub kv_bytes_per_element: f64,
    /// Tokens per KV block.
    pub block_size: u32,
}

impl KvMemoryModel {
    /// Qwen3-32B (64 layers, 8 KV heads of 128, 32.8B parameters, bf16) on
    /// two 80 GiB H100s at vLLM's default 0.9 utilisation, with 4 GiB per GPU
    /// of runtime memory, 16-token blocks.
    pub fn qwen3_32b_tp2_h100() -> KvMemoryModel {
        KvMemoryModel {
            gpus: 2,
            gpu_memory_gib: 80.0,
            gpu_memory_utilization: 0.9,
            runtime_reserve_gib: 4.0,
            parameters: 32.8e9,
            bytes_per_parameter: 2.0,
            layers: 64,
            kv_heads: 8,
            head_dim: 128,
            kv_bytes_per_element: 2.0,
            block_size: 16,
        }
    }

    /// KV bytes per token: K and V, per layer, per KV head, per dimension.
    pub fn kv_bytes_per_token(&self) -> f64 {
        2.0 * f64::from(self.layers)
            * f64::from(self.kv_heads)
            * f64::from(self.head_dim)
            * self.kv_bytes_per_element
    }

    /// Bytes left for the KV cache on the whole replica.
    pub fn kv_memory_bytes(&self) -> f64 {
        let usable = f64::from(self.gpus)
            * (self.gpu_memory_gib * self.gpu_memory_utilization - self.runtime_reserve_gib)
            * GIB;
        (usable - self.parameters * self.bytes_per_parameter).max(0.0)
    }

    /// GPU KV blocks per replica.
    pub fn gpu_blocks(&self) -> u32 {
        let per_block = self.kv_bytes_per_token() * f64::from(self.block_size);
        (self.kv_memory_bytes() / per_block).floor() as u32
    }
}

/// The simulated fleet a replay runs on.
#[derive(Clone, Debug, PartialEq)]
pub struct FleetSpec {
    /// Replicas.
    pub replicas: usize,
    /// Every replica's engine (each gets its own hash seed).
    pub engine: EngineConfig,
    /// Delay between a step's end and its KV events reaching the index.
    pub event_delay: Duration,
    /// Interval of engine reports to the router (as `/metrics` scrapes).
    pub report_every: Duration,
    /// The base model each pool serves, in order. Replicas are split evenly
    /// and contiguously ([`FleetSpec::pool_of`]); each pool has its own
    /// index and router, and serves only its model's requests. Empty: one
    /// pool that serves every request (a one-model workload).
    pub pools: Vec<String>,
    /// A prefill/decode fleet: the first `prefill` replicas prefill, the
    /// rest decode, each side with its own index and router, and the
    /// planner of [`DisaggSpec::mode`] deciding per request. `None`: every
    /// replica serves whole requests.
    pub disagg: Option<DisaggSpec>,
}

/// The prefill/decode split of a fleet ([`FleetSpec::disagg`]).
#[derive(Clone, Debug, PartialEq)]
pub struct DisaggSpec {
    /// Prefill replicas (the first ones); the others decode.
    pub prefill: usize,
    /// How the planner decides whether to split.
    pub mode: kvgate_router::DisaggMode,
    /// The model's KV bytes per token.
    pub kv_bytes_per_token: u64,
    /// The prefill-to-decode link, bytes per second: a transfer takes the
    /// tokens the decode replica lacks × bytes per token ÷ this.
    pub bandwidth_bytes_per_s: f64,
}

impl FleetSpec {
    /// The acceptance fleet: 8 replicas of the calibrated Qwen3-32B preset,
    /// 16-token blocks, GPU blocks from [`KvMemoryModel::qwen3_32b_tp2_h100`],
    /// a CPU tier of 4× the GPU blocks, vLLM's default step limits.
    pub fn acceptance() -> FleetSpec {
        let gpu = KvMemoryModel::qwen3_32b_tp2_h100().gpu_blocks();
        FleetSpec {
            replicas: 8,
            engine: EngineConfig {
                block_size: 16,
                num_gpu_blocks: gpu,
                num_cpu_blocks: gpu * 4,
                max_num_seqs: 256,
                max_num_batched_tokens: 8192,
                hash_seed: Some(0),
                timing: TimingModel::llmd_qwen3_32b(),
                ..EngineConfig::default()
            },
            event_delay: Duration::from_millis(1),
            // `kvgate serve` scrapes `/metrics` once a second by default.
            report_every: Duration::from_millis(1000),
            pools: Vec::new(),
            disagg: None,
        }
    }

    /// Pools: one per base model of [`FleetSpec::pools`], at least one.
    pub fn pool_count(&self) -> usize {
        if self.disagg.is_some() {
            return 2;
        }
        self.pools.len().max(1)
    }

    /// The pool of replica `r`: `⌊r · pools ÷ replicas⌋`, so pools are
    /// contiguous, differ by at most one replica, and none is empty while
    /// there are at least as many replicas as pools.
    pub fn pool_of(&self, r: usize) -> usize {
        if let Some(d) = &self.disagg {
            return usize::from(r >= d.prefill);
        }
        r * self.pool_count() / self.replicas.max(1)
    }

    /// Replicas in pool `p`.
    pub fn pool_replicas(&self, p: usize) -> usize {
        (0..self.replicas).filter(|&r| self.pool_of(r) == p).count()
    }

    /// GPU + CPU blocks of pool `p`: its pooled oracle's capacity.
    pub fn pool_blocks(&self, p: usize) -> u64 {
        self.pool_replicas(p) as u64
            * (u64::from(self.engine.num_gpu_blocks) + u64::from(self.engine.num_cpu_blocks))
    }

    /// This fleet shaped for `w`: one pool per model the workload names (when
    /// it names any) and the adapter slots it asks for.
    pub fn for_workload(mut self, w: &crate::workload::Workload) -> Result<FleetSpec, String> {
        self.pools = w.models.clone();
        if let Some(m) = w.max_loras {
            self.engine.max_loras = m;
        }
        if self.replicas < self.pool_count() {
            return Err(format!(
                "{} model pools need at least as many replicas, not {}",
                self.pool_count(),
                self.replicas
            ));
        }
        self.engine.validate().map_err(|e| format!("invalid engine settings: {e}"))?;
        Ok(self)
    }

    /// GPU + CPU blocks of the whole fleet: the pooled oracle's capacity.
    pub fn total_blocks(&self) -> u64 {
        self.replicas as u64
            * (u64::from(self.engine.num_gpu_blocks) + u64::from(self.engine.num_cpu_blocks))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qwen3_32b_derivation_matches_docs_sim_md() {
        let m = KvMemoryModel::qwen3_32b_tp2_h100();
        assert_eq!(m.kv_bytes_per_token(), 262_144.0);
        let kv_gib = m.kv_memory_bytes() / GIB;
        assert!((kv_gib - 74.91).abs() < 0.01, "{kv_gib}");
        assert_eq!(m.gpu_blocks(), 19_175);
        let f = FleetSpec::acceptance();
        assert_eq!(f.engine.num_cpu_blocks, 4 * 19_175);
        assert_eq!(f.total_blocks(), 8 * 5 * 19_175);
        assert!(f.engine.validate().is_ok());
    }

    #[test]
    fn pools_split_replicas_evenly_and_contiguously() {
        let mut f = FleetSpec::acceptance();
        f.pools = vec!["a".into(), "b".into()];
        let of: Vec<usize> = (0..8).map(|r| f.pool_of(r)).collect();
        assert_eq!(of, [0, 0, 0, 0, 1, 1, 1, 1]);
        f.replicas = 5;
        f.pools.push("c".into());
        let of: Vec<usize> = (0..5).map(|r| f.pool_of(r)).collect();
        assert_eq!(of, [0, 0, 1, 1, 2]);
        assert_eq!(f.pool_blocks(2), 5 * 19_175);
        f.pools.clear();
        assert!((0..5).all(|r| f.pool_of(r) == 0));
    }
}
