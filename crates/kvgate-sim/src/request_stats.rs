//! Per-request timelines for vLLM's request-level metrics.
//!
//! vLLM 0.33 (`vllm/v1/metrics/stats.py`, `IterationStats`) stamps each
//! request with its arrival, first `SCHEDULED` event (the scheduler's clock
//! at the start of the step; later ones after a preemption are ignored),
//! first token and last token (the engine-core timestamp of the output
//! batch, i.e. the end of the step), and observes every phase histogram
//! once, when the request finishes. This module keeps the same timeline on
//! the driver's clock so that the phases add up as in vLLM: for a request
//! prefilled in one step, the prefill time is exactly that step's duration.
//!
//! No tokio and no clock: [`Tracker::step`] takes the step's start time and
//! its [`StepOutput`], so tests can run it on a bare [`crate::Engine`], and
//! `kvgate replay`'s fast mode reports the same numbers in virtual time as
//! the server does in real time.
//!
//! Seconds are wall seconds: an engine run `speedup` times faster than its
//! timing model reports its phases `speedup` times shorter, as a faster
//! engine would ([`Tracker::with_speedup`]). Everything that reads them (the
//! router's calibration above all) lives in wall time.

use std::time::Duration;

use rustc_hash::FxHashMap;

use crate::engine::{FinishReason, RequestId, StepOutput};

/// What one engine step adds to the metrics, recorded in one go (vLLM
/// records one `IterationStats` per output batch).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StepRecord {
    /// Time to first token of each request whose first token came out.
    pub ttft: Vec<f64>,
    /// Inter-token latencies of the other tokens.
    pub itl: Vec<f64>,
    /// Prompt tokens of the requests whose first token came out (vLLM
    /// counts a prompt when its prefill completes, not per chunk).
    pub prompt_tokens: u64,
    /// Of those, tokens found in the GPU prefix cache.
    pub local_cached_tokens: u64,
    /// Of those, tokens loaded from the CPU tier (an external KV transfer
    /// to vLLM).
    pub external_cached_tokens: u64,
    /// `vllm:iteration_tokens_total`'s observation: prompt tokens computed
    /// (not cached) by requests whose first token came out, plus every token
    /// generated. `None` for a step without output tokens, which vLLM does
    /// not observe (no `IterationStats` for an empty output batch).
    pub iteration_tokens: Option<u64>,
    /// Requests that finished in this step.
    pub finished: Vec<FinishedRequest>,
}

impl StepRecord {
    /// Prompt tokens computed (not cached) by the requests that finished
    /// prefill in this step.
    pub fn computed_prompt_tokens(&self) -> u64 {
        self.prompt_tokens - self.local_cached_tokens - self.external_cached_tokens
    }
}

/// vLLM's `FinishedRequestStats`, in seconds of model time.
#[derive(Clone, Debug, PartialEq)]
pub struct FinishedRequest {
    pub reason: FinishReason,
    /// Arrival → last token.
    pub e2e: f64,
    /// Arrival (queued) → first scheduled.
    pub queue: f64,
    /// First scheduled → first token (preemptions included).
    pub prefill: f64,
    /// First token → last token.
    pub decode: f64,
    /// First scheduled → last token.
    pub inference: f64,
    /// `decode / (generated - 1)`, 0 for a single output token.
    pub time_per_output_token: f64,
    pub prompt_tokens: u32,
    pub generation_tokens: u32,
    /// Prompt tokens minus the first admission's prefix hit.
    pub prefill_kv_computed_tokens: u32,
    pub preemptions: u32,
}

#[derive(Debug)]
struct Timeline {
    arrival: Duration,
    prompt_len: u32,
    scheduled: Option<Duration>,
    first_token: Option<Duration>,
    last_token: Option<Duration>,
    generated: u32,
    preemptions: u32,
    cached: u32,
}

/// The timelines of the requests in the engine.
#[derive(Debug)]
pub struct Tracker {
    live: FxHashMap<RequestId, Timeline>,
    /// Model seconds per reported second.
    speedup: f64,
}

impl Default for Tracker {
    fn default() -> Self {
        Tracker::with_speedup(1.0)
    }
}

impl Tracker {
    /// A tracker for an engine run `speedup` times faster than its model
    /// (values ≤ 0 or not finite count as 1).
    pub fn with_speedup(speedup: f64) -> Tracker {
        let speedup = if speedup.is_finite() && speedup > 0.0 { speedup } else { 1.0 };
        Tracker { live: FxHashMap::default(), speedup }
    }

    /// A request the engine accepted at `now` (vLLM's arrival and `QUEUED`
    /// coincide here: the sim has no separate frontend).
    pub fn add(&mut self, id: RequestId, prompt_len: usize, now: Duration) {
        let prompt_len = u32::try_from(prompt_len).unwrap_or(u32::MAX);
        self.live.insert(
            id,
            Timeline {
                arrival: now,
                prompt_len,
                scheduled: None,
                first_token: None,
                last_token: None,
                generated: 0,
                preemptions: 0,
                cached: 0,
            },
        );
    }

    /// An aborted request: vLLM observes nothing for it.
    pub fn abort(&mut self, id: RequestId) {
        self.live.remove(&id);
    }

    /// Accounts for one step that started at `start`; its tokens came out at
    /// `start + out.duration`.
    pub fn step(&mut self, start: Duration, out: &StepOutput) -> StepRecord {
        let done = start.saturating_add(out.duration);
        let mut rec = StepRecord::default();
        for id in &out.admitted {
            if let Some(t) = self.live.get_mut(id) {
                t.scheduled.get_or_insert(start);
            }
        }
        for id in &out.preempted {
            if let Some(t) = self.live.get_mut(id) {
                t.preemptions += 1;
            }
        }
        for tok in &out.tokens {
            let Some(t) = self.live.get_mut(&tok.request_id) else { continue };
            t.generated += 1;
            if tok.is_first {
                rec.ttft.push(done.saturating_sub(t.arrival).as_secs_f64() / self.speedup);
                let cached = tok.cached_tokens.min(t.prompt_len);
                let external = tok.external_cached_tokens.min(cached);
                t.cached = cached;
                t.first_token = Some(done);
                rec.prompt_tokens += u64::from(t.prompt_len);
                rec.local_cached_tokens += u64::from(cached - external);
                rec.external_cached_tokens += u64::from(external);
            } else if let Some(prev) = t.last_token {
                rec.itl.push(done.saturating_sub(prev).as_secs_f64() / self.speedup);
            }
            t.last_token = Some(done);
            if let Some(reason) = tok.finished {
                if let Some(t) = self.live.remove(&tok.request_id) {
                    rec.finished.push(finish(&t, reason, done, self.speedup));
                }
            }
        }
        if !out.tokens.is_empty() {
            rec.iteration_tokens = Some(rec.computed_prompt_tokens() + out.tokens.len() as u64);
        }
        rec
    }
}

fn finish(t: &Timeline, reason: FinishReason, done: Duration, speedup: f64) -> FinishedRequest {
    let secs = |d: Duration| d.as_secs_f64() / speedup;
    // A request with tokens was scheduled; the fallbacks only keep the
    // arithmetic total.
    let scheduled = t.scheduled.unwrap_or(t.arrival);
    let first = t.first_token.unwrap_or(done);
    let last = t.last_token.unwrap_or(done);
    let decode = secs(last.saturating_sub(first));
    FinishedRequest {
        reason,
        e2e: secs(done.saturating_sub(t.arrival)),
        queue: secs(scheduled.saturating_sub(t.arrival)),
        prefill: secs(first.saturating_sub(scheduled)),
        decode,
        inference: secs(last.saturating_sub(scheduled)),
        time_per_output_token: if t.generated > 1 {
            decode / f64::from(t.generated - 1)
        } else {
            0.0
        },
        prompt_tokens: t.prompt_len,
        generation_tokens: t.generated,
        prefill_kv_computed_tokens: t.prompt_len - t.cached,
        preemptions: t.preemptions,
    }
}

#[cfg(all(test, feature = "server"))]
mod tests;
