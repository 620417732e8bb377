//! The per-step observations: vLLM 0.33's counters and histograms that the
//! driver feeds once per engine step.

use std::fmt::Write as _;

use super::float;
use super::histogram::{
    request_tokens_buckets, Histogram, ITERATION_TOKENS_BUCKETS, ITL_BUCKETS,
    REQUEST_LATENCY_BUCKETS, REQUEST_NUM_PREEMPTIONS_BUCKETS, TTFT_BUCKETS,
};
use crate::engine::FinishReason;
use crate::request_stats::StepRecord;

/// vLLM's `FinishReason` label values, in its enum order; every one is
/// exported from the start (at 0), as vLLM pre-creates them.
const FINISHED_REASONS: [&str; 5] = ["stop", "length", "abort", "error", "repetition"];

/// `vllm:prompt_tokens_by_source`'s `source` label values.
const PROMPT_SOURCES: [&str; 3] = ["local_compute", "local_cache_hit", "external_kv_transfer"];

/// Everything the driver observes per step, behind one lock so that a
/// scrape sees a step whole: a finished request's queue, prefill and
/// computed-token observations always land in the same scrape.
#[derive(Debug)]
pub(super) struct Observed {
    ttft: Histogram,
    itl: Histogram,
    time_per_output_token: Histogram,
    e2e: Histogram,
    queue: Histogram,
    inference: Histogram,
    prefill: Histogram,
    decode: Histogram,
    num_preemptions: Histogram,
    prefill_kv_computed: Histogram,
    prompt_tokens_request: Histogram,
    generation_tokens_request: Histogram,
    iteration_tokens: Histogram,
    prompt_tokens: u64,
    /// Indexed like [`PROMPT_SOURCES`].
    prompt_tokens_by_source: [u64; 3],
    /// Indexed like [`FINISHED_REASONS`].
    request_success: [u64; 5],
}

impl Observed {
    pub(super) fn new(max_model_len: u64) -> Observed {
        let tokens = request_tokens_buckets(max_model_len);
        let h = Histogram::new;
        Observed {
            ttft: h(
                "vllm:time_to_first_token_seconds",
                "Histogram of time to first token in seconds.",
                &TTFT_BUCKETS,
            ),
            itl: h(
                "vllm:inter_token_latency_seconds",
                "Histogram of inter-token latency in seconds.",
                &ITL_BUCKETS,
            ),
            time_per_output_token: h(
                "vllm:request_time_per_output_token_seconds",
                "Histogram of time_per_output_token_seconds per request.",
                &ITL_BUCKETS,
            ),
            e2e: h(
                "vllm:e2e_request_latency_seconds",
                "Histogram of e2e request latency in seconds.",
                &REQUEST_LATENCY_BUCKETS,
            ),
            queue: h(
                "vllm:request_queue_time_seconds",
                "Histogram of time spent in WAITING phase for request.",
                &REQUEST_LATENCY_BUCKETS,
            ),
            inference: h(
                "vllm:request_inference_time_seconds",
                "Histogram of time spent in RUNNING phase for request.",
                &REQUEST_LATENCY_BUCKETS,
            ),
            prefill: h(
                "vllm:request_prefill_time_seconds",
                "Histogram of time spent in PREFILL phase for request.",
                &REQUEST_LATENCY_BUCKETS,
            ),
            decode: h(
                "vllm:request_decode_time_seconds",
                "Histogram of time spent in DECODE phase for request.",
                &REQUEST_LATENCY_BUCKETS,
            ),
            num_preemptions: h(
                "vllm:request_num_preemptions",
                "Histogram of the number of times a request was preempted.",
                &REQUEST_NUM_PREEMPTIONS_BUCKETS,
            ),
            prefill_kv_computed: h(
                "vllm:request_prefill_kv_computed_tokens",
                "Histogram of new KV tokens computed during prefill (excluding cached tokens).",
                &tokens,
            ),
            prompt_tokens_request: h(
                "vllm:request_prompt_tokens",
                "Number of prefill tokens processed.",
                &tokens,
            ),
            generation_tokens_request: h(
                "vllm:request_generation_tokens",
                "Number of generation tokens processed.",
                &tokens,
            ),
            iteration_tokens: h(
                "vllm:iteration_tokens_total",
                "Histogram of number of tokens per engine_step.",
                &ITERATION_TOKENS_BUCKETS,
            ),
            prompt_tokens: 0,
            prompt_tokens_by_source: [0; 3],
            request_success: [0; 5],
        }
    }

    pub(super) fn record(&mut self, rec: &StepRecord) {
        for &v in &rec.ttft {
            self.ttft.observe(v);
        }
        for &v in &rec.itl {
            self.itl.observe(v);
        }
        self.prompt_tokens += rec.prompt_tokens;
        self.prompt_tokens_by_source[0] += rec.computed_prompt_tokens();
        self.prompt_tokens_by_source[1] += rec.local_cached_tokens;
        self.prompt_tokens_by_source[2] += rec.external_cached_tokens;
        if let Some(n) = rec.iteration_tokens {
            self.iteration_tokens.observe(n as f64);
        }
        for f in &rec.finished {
            let reason = match f.reason {
                FinishReason::Stop => 0,
                FinishReason::Length => 1,
            };
            self.request_success[reason] += 1;
            self.e2e.observe(f.e2e);
            self.queue.observe(f.queue);
            self.prefill.observe(f.prefill);
            self.inference.observe(f.inference);
            self.decode.observe(f.decode);
            self.num_preemptions.observe(f64::from(f.preemptions));
            self.prefill_kv_computed.observe(f64::from(f.prefill_kv_computed_tokens));
            self.prompt_tokens_request.observe(f64::from(f.prompt_tokens));
            self.generation_tokens_request.observe(f64::from(f.generation_tokens));
            self.time_per_output_token.observe(f.time_per_output_token);
        }
    }

    /// Counters first, then histograms, in vLLM's declaration order.
    pub(super) fn render(&self, out: &mut String, labels: &str) {
        let _ = writeln!(
            out,
            "# HELP vllm:prompt_tokens Number of prefill tokens processed.\n\
             # TYPE vllm:prompt_tokens counter\n\
             vllm:prompt_tokens_total{{{labels}}} {}",
            float(self.prompt_tokens as f64)
        );
        let _ = writeln!(
            out,
            "# HELP vllm:prompt_tokens_by_source Number of prompt tokens by source.\n\
             # TYPE vllm:prompt_tokens_by_source counter"
        );
        for (source, n) in PROMPT_SOURCES.iter().zip(self.prompt_tokens_by_source) {
            let _ = writeln!(
                out,
                "vllm:prompt_tokens_by_source_total{{{labels},source=\"{source}\"}} {}",
                float(n as f64)
            );
        }
        let cached = self.prompt_tokens_by_source[1] + self.prompt_tokens_by_source[2];
        let _ = writeln!(
            out,
            "# HELP vllm:prompt_tokens_cached Number of cached prompt tokens (local + external).\n\
             # TYPE vllm:prompt_tokens_cached counter\n\
             vllm:prompt_tokens_cached_total{{{labels}}} {}",
            float(cached as f64)
        );
        let _ = writeln!(
            out,
            "# HELP vllm:request_success Count of successfully processed requests.\n\
             # TYPE vllm:request_success counter"
        );
        for (reason, n) in FINISHED_REASONS.iter().zip(self.request_success) {
            let _ = writeln!(
                out,
                "vllm:request_success_total{{{labels},finished_reason=\"{reason}\"}} {}",
                float(n as f64)
            );
        }
        for h in [
            &self.prompt_tokens_request,
            &self.generation_tokens_request,
            &self.iteration_tokens,
            &self.ttft,
            &self.itl,
            &self.time_per_output_token,
            &self.e2e,
            &self.queue,
            &self.inference,
            &self.prefill,
            &self.decode,
            &self.num_preemptions,
            &self.prefill_kv_computed,
        ] {
            h.render(out, labels);
        }
    }
}
