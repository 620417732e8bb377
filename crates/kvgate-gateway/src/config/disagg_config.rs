//! Prefill/decode disaggregation in the configuration (`[disagg]`, and each
//! replica's `role`): how the planner decides whether to split a request,
//! and how fast KV moves between replicas (docs/routing.md, "Prefill/decode
//! disaggregation").

use serde::{Deserialize, Serialize};

use crate::error::ConfigError;

pub use kvgate_fleet::Role;

/// How the planner decides whether to split.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SplitMode {
    /// The cheaper of split and bypass in the cost model.
    #[default]
    Conditional,
    /// Split every request while a prefill replica can take it.
    Always,
    /// Dynamo's `isl_bounding` rule (`isl_threshold`, `isl_ratio`).
    IslBounding,
}

/// `[disagg]`: applies to every pool that has `role = "prefill"` replicas.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DisaggConfig {
    /// How to decide whether to split a request.
    pub mode: SplitMode,
    /// The model's KV bytes per token (all layers; `layers × kv_heads ×
    /// head_dim × 2 × dtype bytes`): sizes a transfer.
    pub kv_bytes_per_token: u64,
    /// The prefill-to-decode link, GB/s (10^9 bytes).
    pub bandwidth_gbps: f64,
    /// `isl_bounding`: bypass only below this many uncached tokens.
    pub isl_threshold: u64,
    /// `isl_bounding`: and below this share of the prompt.
    pub isl_ratio: f64,
    /// `conditional`: a prefill replica may also serve a request whole when
    /// that costs the fleet least (vLLM's NIXL engines run `kv_role =
    /// "kv_both"` and serve plain requests). Off by default: it puts the
    /// prefill pool's memory to use when the decode pool lacks it, but it
    /// gives up disaggregation's ITL (docs/benchmarks.md, "Prefill/decode disaggregation").
    pub whole_on_prefill: bool,
}

impl Default for DisaggConfig {
    fn default() -> Self {
        DisaggConfig {
            mode: SplitMode::Conditional,
            // Qwen3-0.6B in bf16 (the bundled tokenizer's model): 28 layers
            // × 8 KV heads × 128 × K and V × 2 bytes.
            kv_bytes_per_token: 114_688,
            bandwidth_gbps: 64.0,
            isl_threshold: 2048,
            isl_ratio: 0.7,
            whole_on_prefill: false,
        }
    }
}

impl DisaggConfig {
    /// Refuses values the planner cannot use.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let ok = self.kv_bytes_per_token > 0
            && self.bandwidth_gbps.is_finite()
            && self.bandwidth_gbps > 0.0
            && self.isl_ratio.is_finite()
            && (0.0..=1.0).contains(&self.isl_ratio);
        ok.then_some(()).ok_or_else(|| {
            ConfigError::Invalid(
                "disagg: kv_bytes_per_token must be > 0, bandwidth_gbps a number > 0, \
                 isl_ratio within 0..=1"
                    .into(),
            )
        })
    }

    /// The router crate's planner settings.
    pub fn planner(&self) -> kvgate_router::DisaggConfig {
        let mode = match self.mode {
            SplitMode::Conditional => {
                kvgate_router::DisaggMode::Conditional { whole_on_prefill: self.whole_on_prefill }
            }
            SplitMode::Always => kvgate_router::DisaggMode::Always,
            SplitMode::IslBounding => kvgate_router::DisaggMode::IslBounding {
                eff_isl_threshold: self.isl_threshold,
                ratio: self.isl_ratio,
            },
        };
        kvgate_router::DisaggConfig {
            mode,
            kv_bytes_per_token: self.kv_bytes_per_token,
            bandwidth_bytes_per_s: self.bandwidth_gbps * 1e9,
        }
    }
}
