//! One run's summary: latency distributions, throughput, the engine-side hit
//! rate against the bounds, load imbalance and decision time. The field
//! names are the JSON schema (`docs/replay.md`).

use std::time::Duration;

use serde::Serialize;

use crate::fleet::{Fleet, LoadSample, Record};
use crate::oracle::OracleHitRates;

/// Mean and nearest-rank percentiles.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Distribution {
    /// Arithmetic mean.
    pub mean: f64,
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
}

impl Distribution {
    /// Of `xs` (sorted in place); all zero when empty.
    pub fn of(xs: &mut [f64]) -> Distribution {
        if xs.is_empty() {
            return Distribution::default();
        }
        xs.sort_by(f64::total_cmp);
        let q = |q: f64| {
            let k = ((q * xs.len() as f64).ceil() as usize).clamp(1, xs.len()) - 1;
            xs[k]
        };
        let mean = xs.iter().sum::<f64>() / xs.len() as f64;
        Distribution { mean, p50: q(0.5), p90: q(0.9), p99: q(0.99) }
    }
}

/// Everything measured in one run of one policy at one load level.
#[derive(Clone, Debug, Default, Serialize)]
pub struct RunSummary {
    /// The policy's name.
    pub policy: String,
    /// Offered request rate, requests/s (the workload's rate × `rate_scale`).
    pub rate: f64,
    /// Multiple of the workload's own rate.
    pub rate_scale: f64,
    /// Requests in the workload.
    pub requests: u64,
    /// Requests that finished.
    pub completed: u64,
    /// Requests not served (refused or rejected by the engine).
    pub unserved: u64,
    /// Time to first token, ms.
    pub ttft_ms: Distribution,
    /// Mean inter-token latency per request, ms (requests with ≥ 2 tokens).
    pub itl_ms: Distribution,
    /// Arrival to last token, ms.
    pub e2e_ms: Distribution,
    /// Output tokens per second of virtual time (first arrival to last token).
    pub throughput_tok_s: f64,
    /// Prompt tokens per second over the same span.
    pub prompt_tok_s: f64,
    /// Engine counters: (GPU + CPU-tier hit tokens) ÷ queried tokens, as
    /// vLLM's `prefix_cache_hits` and external hits over `prefix_cache_queries`.
    pub hit_rate: f64,
    /// Σ cached tokens at first admission ÷ Σ prompt tokens.
    pub first_admission_hit_rate: f64,
    /// The pooled-LRU oracle's hit rate (fleet GPU + CPU capacity).
    pub oracle_hit_rate: f64,
    /// The unlimited cache's hit rate.
    pub ceiling_hit_rate: f64,
    /// `hit_rate ÷ oracle_hit_rate`.
    pub hit_rate_vs_oracle: f64,
    /// `first_admission_hit_rate ÷ oracle_hit_rate` (neither counts
    /// re-admissions after preemption).
    pub first_admission_vs_oracle: f64,
    /// The workload's mean TTFT floor, ms: each request alone on a replica
    /// holding its oracle prefix (`oracle.rs`); compare `ttft_ms.mean`.
    pub ttft_floor_ms: Option<f64>,
    /// Max ÷ mean of the prefill tokens each replica computed.
    pub load_imbalance: f64,
    /// Max ÷ mean of the requests each replica served.
    pub request_imbalance: f64,
    /// Requests per replica.
    pub replica_requests: Vec<u64>,
    /// Wall-clock time of `Router::decide`, µs.
    pub decision_us: Distribution,
    /// Ingress CPU per request, µs; live mode only (null in fast mode).
    pub ingress_cpu_us_per_req: Option<f64>,
    /// Engine preemptions, fleet-wide.
    pub preemptions: u64,
    /// Virtual seconds from the first arrival to the last token.
    pub makespan_s: f64,
    /// Wall-clock seconds the run took.
    pub wall_s: f64,
    /// A prefill/decode fleet's plans and transfers; absent on an
    /// aggregated fleet.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disagg: Option<DisaggSummary>,
    /// TTFT of every served request, seconds (for charts).
    #[serde(skip)]
    pub ttft_s: Vec<f64>,
    /// Per-replica load over time (for charts).
    #[serde(skip)]
    pub load: Vec<LoadSample>,
}

/// Max ÷ mean of `xs` (1 when the mean is 0): the imbalance measure.
pub fn max_over_mean(xs: &[f64]) -> f64 {
    let mean = xs.iter().sum::<f64>() / xs.len().max(1) as f64;
    let max = xs.iter().copied().fold(0.0, f64::max);
    if mean > 0.0 {
        max / mean
    } else {
        1.0
    }
}

/// What a prefill/decode run's planner did (`RunSummary::disagg`).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct DisaggSummary {
    /// Requests split into a prefill hop and a decode hop.
    pub split: u64,
    /// Requests served whole on a decode replica.
    pub bypassed: u64,
    /// bypassed ÷ planned.
    pub bypass_rate: f64,
    /// Requests served whole on a prefill replica (`whole_on_prefill`).
    pub on_prefill: u64,
    /// on_prefill ÷ planned.
    pub on_prefill_rate: f64,
    /// KV transfers, milliseconds each.
    pub transfer_ms: Distribution,
    /// Mean tokens per transfer (what the decode replica lacked).
    pub transfer_tokens_mean: f64,
    /// TTFT of the split requests, measured against predicted.
    pub split_ttft: PlanTtft,
    /// TTFT of the bypassed requests, measured against predicted.
    pub bypassed_ttft: PlanTtft,
    /// TTFT of the requests served whole on a prefill replica.
    pub on_prefill_ttft: PlanTtft,
}

/// One kind of plan's mean TTFT as measured and as the routers predicted it
/// when they planned (a split: prefill hop plus decode hop). Where they part,
/// the cost model misses something: on a decode pool short of KV memory,
/// the wait for free blocks (docs/benchmarks.md, "Prefill/decode disaggregation").
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct PlanTtft {
    /// Requests of this plan that got a first token.
    pub requests: u64,
    /// Their mean TTFT, milliseconds.
    pub measured_ms: f64,
    /// Their mean predicted TTFT, milliseconds.
    pub predicted_ms: f64,
}

impl PlanTtft {
    fn of<'a>(records: impl Iterator<Item = &'a Record>) -> PlanTtft {
        let (mut n, mut measured, mut predicted) = (0u64, 0.0, 0.0);
        for r in records {
            let Some(first) = r.first_token_at else { continue };
            n += 1;
            measured += first.saturating_sub(r.arrival).as_secs_f64();
            predicted += r.predicted_ttft_s;
        }
        let per = 1000.0 / n.max(1) as f64;
        PlanTtft { requests: n, measured_ms: measured * per, predicted_ms: predicted * per }
    }
}

impl DisaggSummary {
    fn of(fleet: &Fleet) -> Option<DisaggSummary> {
        let counts = fleet.disagg_counts()?;
        // Served whole on a replica of `pool` (0 prefills, 1 decodes).
        let whole_on =
            |r: &Record, pool| !r.split && r.replica.is_some_and(|g| fleet.pool_of[g] == pool);
        let mut ms: Vec<f64> = fleet.transfers.iter().map(|t| t.1 * 1000.0).collect();
        let n = fleet.transfers.len().max(1) as f64;
        Some(DisaggSummary {
            split: counts.split,
            bypassed: counts.bypassed,
            bypass_rate: counts.bypass_rate(),
            on_prefill: counts.on_prefill,
            on_prefill_rate: counts.on_prefill_rate(),
            transfer_ms: Distribution::of(&mut ms),
            transfer_tokens_mean: fleet.transfers.iter().map(|t| t.0 as f64).sum::<f64>() / n,
            split_ttft: PlanTtft::of(fleet.records.iter().filter(|r| r.split)),
            bypassed_ttft: PlanTtft::of(fleet.records.iter().filter(|r| whole_on(r, 1))),
            on_prefill_ttft: PlanTtft::of(fleet.records.iter().filter(|r| whole_on(r, 0))),
        })
    }
}

/// Per-request latencies and token counts, added up the same way for fast
/// mode's records and live mode's client outcomes, so that both report one
/// summary. Times are since the run's start; `scale` multiplies every
/// latency (live mode's engines run `--speedup` times faster than engine
/// time, and its latencies are read back in engine time).
#[derive(Debug)]
pub struct Tally {
    scale: f64,
    start: Duration,
    end: Duration,
    ttft: Vec<f64>,
    itl: Vec<f64>,
    e2e: Vec<f64>,
    ttft_s: Vec<f64>,
    out_tokens: u64,
    prompt_tokens: u64,
    cached: u64,
    completed: u64,
}

/// What a summary needs besides the per-request [`Tally`].
#[derive(Debug)]
pub struct RunFacts {
    /// The policy's name.
    pub policy: String,
    /// Offered request rate, requests/s.
    pub rate: f64,
    /// Multiple of the workload's own rate.
    pub rate_scale: f64,
    /// Requests in the workload.
    pub requests: u64,
    /// Requests not served.
    pub unserved: u64,
    /// The engines' own hit rate; `None` where their counters are unknown
    /// (the hit rate at first admission stands in).
    pub hit_rate: Option<f64>,
    /// The run's bounds.
    pub bounds: OracleHitRates,
    /// Uncached prompt tokens per replica (for the imbalance).
    pub prefill_per_replica: Vec<f64>,
    /// Requests per replica.
    pub replica_requests: Vec<u64>,
    /// Decision time, µs.
    pub decision_us: Distribution,
    /// Ingress CPU per request, µs (live mode only).
    pub ingress_cpu_us_per_req: Option<f64>,
    /// Preemptions the engines counted.
    pub preemptions: u64,
    /// Wall-clock seconds the run took.
    pub wall_s: f64,
    /// Requests in flight per replica over time.
    pub load: Vec<LoadSample>,
    /// The P/D breakdown, for disaggregated runs.
    pub disagg: Option<DisaggSummary>,
}

impl Tally {
    /// An empty tally for a run that started at `start`.
    pub fn new(start: Duration, scale: f64) -> Tally {
        Tally {
            scale,
            start,
            end: Duration::ZERO,
            ttft: Vec::new(),
            itl: Vec::new(),
            e2e: Vec::new(),
            ttft_s: Vec::new(),
            out_tokens: 0,
            prompt_tokens: 0,
            cached: 0,
            completed: 0,
        }
    }

    /// One request that reached its first token at `first`; `done` is
    /// when its last token came, if it finished.
    pub fn add(
        &mut self,
        arrival: Duration,
        first: Duration,
        done: Option<Duration>,
        prompt_tokens: u32,
        cached_tokens: u32,
        output_tokens: u32,
    ) {
        let ms = |d: Duration| d.as_secs_f64() * 1000.0 * self.scale;
        self.ttft.push(ms(first - arrival));
        self.ttft_s.push((first - arrival).as_secs_f64() * self.scale);
        self.prompt_tokens += u64::from(prompt_tokens);
        self.cached += u64::from(cached_tokens);
        if let Some(done) = done {
            self.completed += 1;
            self.end = self.end.max(done);
            self.out_tokens += u64::from(output_tokens);
            self.e2e.push(ms(done - arrival));
            if output_tokens > 1 {
                self.itl.push(ms(done - first) / f64::from(output_tokens - 1));
            }
        }
    }

    /// Requests that finished.
    pub fn completed(&self) -> u64 {
        self.completed
    }

    /// Cached ÷ prompt tokens at first admission, as the responses report.
    pub fn first_admission_hit_rate(&self) -> f64 {
        if self.prompt_tokens == 0 {
            0.0
        } else {
            self.cached as f64 / self.prompt_tokens as f64
        }
    }

    /// The run's summary.
    pub fn summary(mut self, facts: RunFacts) -> RunSummary {
        let span = (self.end.saturating_sub(self.start).as_secs_f64() * self.scale).max(1e-9);
        let first_admission = self.first_admission_hit_rate();
        let hit_rate = facts.hit_rate.unwrap_or(first_admission);
        let vs_oracle =
            |x: f64| if facts.bounds.oracle > 0.0 { x / facts.bounds.oracle } else { 0.0 };
        let reqs: Vec<f64> = facts.replica_requests.iter().map(|&r| r as f64).collect();
        RunSummary {
            policy: facts.policy,
            rate: facts.rate,
            rate_scale: facts.rate_scale,
            requests: facts.requests,
            completed: self.completed,
            unserved: facts.unserved,
            ttft_ms: Distribution::of(&mut self.ttft),
            itl_ms: Distribution::of(&mut self.itl),
            e2e_ms: Distribution::of(&mut self.e2e),
            throughput_tok_s: self.out_tokens as f64 / span,
            prompt_tok_s: self.prompt_tokens as f64 / span,
            hit_rate,
            first_admission_hit_rate: first_admission,
            oracle_hit_rate: facts.bounds.oracle,
            ceiling_hit_rate: facts.bounds.ceiling,
            hit_rate_vs_oracle: vs_oracle(hit_rate),
            first_admission_vs_oracle: vs_oracle(first_admission),
            ttft_floor_ms: facts.bounds.ttft_floor_ms,
            load_imbalance: max_over_mean(&facts.prefill_per_replica),
            request_imbalance: max_over_mean(&reqs),
            replica_requests: facts.replica_requests,
            decision_us: facts.decision_us,
            ingress_cpu_us_per_req: facts.ingress_cpu_us_per_req,
            preemptions: facts.preemptions,
            makespan_s: span,
            wall_s: facts.wall_s,
            disagg: facts.disagg,
            ttft_s: self.ttft_s,
            load: facts.load,
        }
    }
}

impl RunSummary {
    /// Summarises a finished fast-mode run.
    pub fn from_fleet(
        policy: &str,
        rate: f64,
        rate_scale: f64,
        fleet: &Fleet,
        bounds: OracleHitRates,
        wall_s: f64,
    ) -> RunSummary {
        let recs = &fleet.records;
        let start = recs.first().map_or(Duration::ZERO, |r| r.arrival);
        let mut tally = Tally::new(start, 1.0);
        let mut decide = Vec::with_capacity(recs.len());
        let mut replica_requests = vec![0u64; fleet.prefill_tokens.len()];
        for r in recs {
            decide.push(r.decide_ns as f64 / 1000.0);
            if let Some(i) = r.replica {
                replica_requests[i] += 1;
            }
            if let Some(first) = r.first_token_at {
                tally.add(
                    r.arrival,
                    first,
                    r.finished_at,
                    r.prompt_tokens,
                    r.cached_tokens,
                    r.output_tokens,
                );
            }
        }
        let stats = fleet.engine_stats();
        let queries: u64 = stats.iter().map(|s| s.prefix_cache_queries).sum();
        let hits: u64 = stats.iter().map(|s| s.prefix_cache_hits + s.external_hit_tokens).sum();
        tally.summary(RunFacts {
            policy: policy.to_owned(),
            rate,
            rate_scale,
            requests: recs.len() as u64,
            unserved: fleet.unserved,
            hit_rate: Some(if queries == 0 { 0.0 } else { hits as f64 / queries as f64 }),
            bounds,
            prefill_per_replica: fleet.prefill_tokens.iter().map(|&t| t as f64).collect(),
            replica_requests,
            decision_us: Distribution::of(&mut decide),
            ingress_cpu_us_per_req: None,
            preemptions: stats.iter().map(|s| s.preemptions).sum(),
            wall_s,
            load: fleet.samples.clone(),
            disagg: DisaggSummary::of(fleet),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let mut xs: Vec<f64> = (1..=100).rev().map(f64::from).collect();
        let d = Distribution::of(&mut xs);
        assert_eq!((d.p50, d.p90, d.p99), (50.0, 90.0, 99.0));
        assert!((d.mean - 50.5).abs() < 1e-12);
        assert_eq!(Distribution::of(&mut []), Distribution::default());
        assert_eq!(max_over_mean(&[1.0, 1.0, 4.0]), 2.0);
    }
}
