//! The engine's configuration: one serde struct with vLLM's defaults where
//! vLLM has one, validated once by [`EngineConfig::validate`].

use serde::{Deserialize, Serialize};

use crate::error::SimError;
use crate::timing::TimingModel;

/// Largest accepted `block_size` (vLLM's largest is 256; memory stays bounded).
pub const MAX_BLOCK_SIZE: u32 = 1024;
/// Largest accepted block count per tier (bounds the pool's memory).
pub const MAX_BLOCKS: u32 = 1 << 24;

/// Everything that shapes one simulated engine.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EngineConfig {
    /// Tokens per KV block (vLLM `--block-size`, default 16).
    pub block_size: u32,
    /// GPU KV blocks. vLLM reserves one as the null block; we do not.
    pub num_gpu_blocks: u32,
    /// CPU offload blocks; 0 disables the CPU tier.
    pub num_cpu_blocks: u32,
    /// Most requests running at once (vLLM `--max-num-seqs`).
    pub max_num_seqs: u32,
    /// Per-step token budget (vLLM `--max-num-batched-tokens`).
    pub max_num_batched_tokens: u32,
    /// Seed of the engine's `NONE_HASH`; `None` draws one per process.
    pub hash_seed: Option<u64>,
    /// Publish 32-byte hashes instead of u64 ints.
    pub hash_bytes: bool,
    /// Step-time model.
    pub timing: TimingModel,
    /// Milliseconds to load one block from the CPU tier back to the GPU.
    pub cpu_load_ms_per_block: f64,
    /// Fill CPU-tier `BlockStored` events with tokens, parent and block size
    /// instead of vLLM's placeholder form.
    pub self_describing_cpu_events: bool,
    /// Offload to the CPU tier in chunks of this many blocks, as a request
    /// computes them, the way vLLM 0.33's offloading connector does (and
    /// evict whole chunks); 0 offloads block by block on GPU eviction.
    pub cpu_chunk_blocks: u32,
    /// Chance per output token past `min_tokens` that the filler model emits
    /// EOS (only when the request does not `ignore_eos`). 0 disables EOS.
    pub eos_probability: f64,
    /// The token id emitted as EOS.
    pub eos_token_id: u32,
    /// GPU LoRA adapter slots (vLLM `--max-loras`, default 1): at most this
    /// many distinct adapters in one batch, and resident at once (LRU).
    pub max_loras: u32,
    /// Milliseconds to make a non-resident adapter resident in a slot
    /// (read from disk and copied to the GPU), added to the step that first
    /// schedules it. vLLM has no such setting; see [`DEFAULT_LORA_LOAD_MS`].
    pub lora_load_ms: f64,
}

/// The default adapter load time. An estimate, not a measurement: a rank-16
/// adapter of a 7–8B model is 20–80 MB of safetensors; read from a warm page
/// cache or NVMe at 1–2 GB/s and copied host to GPU, that is tens of
/// milliseconds. Workloads that care should set it.
pub const DEFAULT_LORA_LOAD_MS: f64 = 50.0;

/// Largest accepted `max_loras` (the slots are a small LRU list).
pub const MAX_LORAS: u32 = 1024;

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            block_size: 16,
            num_gpu_blocks: 8192,
            num_cpu_blocks: 0,
            max_num_seqs: 256,
            max_num_batched_tokens: 8192,
            hash_seed: None,
            hash_bytes: false,
            timing: TimingModel::default(),
            cpu_load_ms_per_block: 0.05,
            self_describing_cpu_events: false,
            cpu_chunk_blocks: 0,
            eos_probability: 0.0,
            eos_token_id: 151_645,
            max_loras: 1,
            lora_load_ms: DEFAULT_LORA_LOAD_MS,
        }
    }
}

impl EngineConfig {
    /// Checks every field once; the engine trusts the result.
    pub fn validate(&self) -> Result<(), SimError> {
        let bad = |msg: &str| Err(SimError::InvalidConfig(msg.to_owned()));
        if self.block_size == 0 {
            return bad("block_size must be at least 1");
        }
        if self.block_size > MAX_BLOCK_SIZE {
            return bad("block_size must be at most 1024");
        }
        if self.num_gpu_blocks == 0 || self.num_gpu_blocks > MAX_BLOCKS {
            return bad("num_gpu_blocks must be within 1..=16777216");
        }
        if self.num_cpu_blocks > MAX_BLOCKS {
            return bad("num_cpu_blocks must be at most 16777216");
        }
        if self.cpu_chunk_blocks > 0 && self.num_cpu_blocks < self.cpu_chunk_blocks {
            return bad("cpu_chunk_blocks needs num_cpu_blocks of at least one chunk");
        }
        if self.cpu_chunk_blocks > 4096 {
            return bad("cpu_chunk_blocks must be at most 4096");
        }
        if self.max_num_seqs == 0 {
            return bad("max_num_seqs must be at least 1");
        }
        if self.max_num_batched_tokens == 0 {
            return bad("max_num_batched_tokens must be at least 1");
        }
        if !self.timing.is_finite() {
            return bad("timing coefficients must be finite");
        }
        if !(self.cpu_load_ms_per_block.is_finite() && self.cpu_load_ms_per_block >= 0.0) {
            return bad("cpu_load_ms_per_block must be a finite number >= 0");
        }
        if !(0.0..=1.0).contains(&self.eos_probability) {
            return bad("eos_probability must be within 0..=1");
        }
        if self.max_loras == 0 || self.max_loras > MAX_LORAS {
            return bad("max_loras must be within 1..=1024");
        }
        if !(self.lora_load_ms.is_finite() && self.lora_load_ms >= 0.0) {
            return bad("lora_load_ms must be a finite number >= 0");
        }
        Ok(())
    }

    /// `lora_load_ms` as a duration: what a load outside a step (the runtime
    /// load route) waits before the adapter is servable.
    pub fn lora_load_duration(&self) -> std::time::Duration {
        std::time::Duration::from_secs_f64((self.lora_load_ms.max(0.0) / 1000.0).min(1e9))
    }

    /// GPU blocks that hold KV: `num_gpu_blocks` less vLLM's null block
    /// (block 0, which vLLM counts but never allocates), at least one.
    pub fn usable_gpu_blocks(&self) -> u32 {
        self.num_gpu_blocks.saturating_sub(1).max(1)
    }

    /// The most tokens (prompt + output) one request may reach: all usable
    /// GPU blocks.
    pub fn max_model_len(&self) -> u64 {
        u64::from(self.usable_gpu_blocks()) * u64::from(self.block_size)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_validate() {
        assert!(EngineConfig::default().validate().is_ok());
        let c = EngineConfig { block_size: 0, ..EngineConfig::default() };
        assert!(c.validate().is_err());
        let c = EngineConfig { num_gpu_blocks: u32::MAX, ..EngineConfig::default() };
        assert!(c.validate().is_err());
        let c = EngineConfig { eos_probability: 2.0, ..EngineConfig::default() };
        assert!(c.validate().is_err());
        let c = EngineConfig { cpu_load_ms_per_block: f64::NAN, ..EngineConfig::default() };
        assert!(c.validate().is_err());
        let c = EngineConfig { max_loras: 0, ..EngineConfig::default() };
        assert!(c.validate().is_err());
        let c = EngineConfig { lora_load_ms: -1.0, ..EngineConfig::default() };
        assert!(c.validate().is_err());
    }

    #[test]
    fn serde_defaults_and_unknown_fields() {
        let c: EngineConfig = serde_json::from_str(
            r#"{"num_gpu_blocks": 100, "hash_seed": 5, "timing": {"decode_const_ms": 9.0}}"#,
        )
        .unwrap();
        assert_eq!(c.num_gpu_blocks, 100);
        assert_eq!(c.block_size, 16);
        assert_eq!(c.hash_seed, Some(5));
        assert_eq!(c.timing.decode_const_ms, 9.0);
        assert_eq!(c.timing.prefill_const_ms, TimingModel::dynamo_mocker().prefill_const_ms);
        assert!(serde_json::from_str::<EngineConfig>(r#"{"blocksize": 16}"#).is_err());
        let back: EngineConfig = serde_json::from_str(&serde_json::to_string(&c).unwrap()).unwrap();
        assert_eq!(back, c);
    }
}
