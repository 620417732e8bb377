//! The router's configuration: one struct, read from the `[router]` table of
//! kvgate's config file and documented from these doc comments. Defaults live
//! only here (`Default` impls), so the CLI, the file and the docs cannot
//! disagree.

use serde::{Deserialize, Serialize};

use crate::error::RouterError;

/// Which policy picks the replica. Every policy books through the same ledger.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PolicyKind {
    /// kvgate's predicted-TTFT cost model (KV overlap per tier, queue, decode
    /// load, KV pressure), calibrated per replica.
    #[default]
    KvAware,
    /// Dynamo's classic cost: `overlap_weight × prefill_blocks + decode_blocks`.
    LinearBlocks,
    /// A prefix tree of what was sent where, without events (SGLang/vLLM
    /// router `cache_aware`, Ray's prefix-affinity router).
    ApproxPrefix,
    /// Fewest pending prefill tokens.
    LeastLoad,
    /// Two random replicas, the one with fewer pending prefill tokens.
    PowerOfTwo,
    /// Each replica in turn.
    RoundRobin,
    /// Uniformly at random.
    Random,
    /// Rendezvous (consistent) hashing on the request's session key; least
    /// load when a request has none.
    SessionAffinity,
}

impl PolicyKind {
    /// Every policy, in the order the replay bench lists them.
    pub const ALL: [PolicyKind; 8] = [
        PolicyKind::KvAware,
        PolicyKind::LinearBlocks,
        PolicyKind::ApproxPrefix,
        PolicyKind::LeastLoad,
        PolicyKind::PowerOfTwo,
        PolicyKind::RoundRobin,
        PolicyKind::Random,
        PolicyKind::SessionAffinity,
    ];

    /// The snake_case name used in config files, flags and metrics.
    pub fn name(self) -> &'static str {
        match self {
            PolicyKind::KvAware => "kv_aware",
            PolicyKind::LinearBlocks => "linear_blocks",
            PolicyKind::ApproxPrefix => "approx_prefix",
            PolicyKind::LeastLoad => "least_load",
            PolicyKind::PowerOfTwo => "power_of_two",
            PolicyKind::RoundRobin => "round_robin",
            PolicyKind::Random => "random",
            PolicyKind::SessionAffinity => "session_affinity",
        }
    }
}

impl std::str::FromStr for PolicyKind {
    type Err = RouterError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        PolicyKind::ALL.into_iter().find(|p| p.name() == s).ok_or_else(|| {
            let names: Vec<_> = PolicyKind::ALL.iter().map(|p| p.name()).collect();
            RouterError::InvalidConfig(format!(
                "unknown policy {s:?}; expected one of {}",
                names.join(", ")
            ))
        })
    }
}

impl std::fmt::Display for PolicyKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// How a cost-based policy turns costs into a choice. Deterministic argmin
/// herds every burst onto one replica, so both modes randomise among
/// near-equal candidates.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Selection {
    /// Uniformly among candidates whose cost is within `epsilon` (relative)
    /// of the best.
    Epsilon,
    /// Softmax over `-(cost - best) / (temperature × best)`.
    Softmax,
    /// Among candidates within `epsilon` of the best, the one this router
    /// chose least recently: near-ties rotate instead of being drawn.
    #[default]
    Rotate,
    /// Among candidates within `epsilon` of the best, the one recently given
    /// the least prefill work (the decayed per-replica work the future-work
    /// charge keeps), the least recently chosen among equals: near-ties
    /// rotate by tokens, not by count.
    Balance,
}

/// What happens when every replica is over its busy thresholds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AdmissionMode {
    /// Ask the caller to retry shortly, up to `max_queue_wait_ms`, then reject.
    #[default]
    Queue,
    /// Reject at once with a retry-after hint.
    Reject,
}

/// Priors and shape of the predicted-TTFT model (policy `kv_aware`).
/// See `docs/routing.md` for the formula.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CostModelConfig {
    /// Prior prefill throughput per replica, tokens/s, before calibration.
    pub prefill_tokens_per_s: f64,
    /// Prior cost of loading one block from CPU memory to GPU, ms.
    pub cpu_block_ms: f64,
    /// Prior cost of loading one block from storage to GPU, ms.
    pub storage_block_ms: f64,
    /// Prior fixed cost of the request's own first step (scheduling,
    /// sampling), ms; calibrated per replica.
    pub step_overhead_ms: f64,
    /// Extra time per engine step while any sequence decodes, ms.
    pub decode_step_ms: f64,
    /// Extra time per engine step per decoding sequence, ms.
    pub decode_per_seq_ms: f64,
    /// KV occupancy (0–1) above which the decode-pressure term starts.
    pub kv_pressure_start: f64,
    /// The decode-pressure term at full occupancy, as the time the replica
    /// takes to prefill this many tokens (its calibrated speed); it grows
    /// quadratically from `kv_pressure_start`. In prefill time rather than
    /// milliseconds because what it stands for, preempted sequences
    /// recomputed, takes longer on a slower engine: a fixed time would weigh
    /// four times as much against every other term on an engine four times
    /// faster. 32,000 is 2 s at the 16k tokens/s prior. Capped at half the
    /// replica's KV capacity in tokens: preemption recomputes what the cache
    /// held, no more (on 512 blocks of 32 tokens, 8,192).
    pub kv_pressure_tokens: f64,
    /// Weight of the fleet-wide prefill work a choice adds (its uncached
    /// tokens), as a multiple of their prefill time: the delay they cause the
    /// requests queued behind them. Favours cache reuse beyond this request's
    /// own TTFT; the same everywhere when nothing is cached. 3 was chosen
    /// from the Mooncake replay (docs/routing.md).
    pub work_weight: f64,
    /// Weight of the delay a choice's prefill adds to each sequence decoding
    /// on that replica (every one of their next tokens waits for it), as a
    /// share of a TTFT second: the fleet's latency, not only this request's
    /// (docs/routing.md, "Decode delay"). Balances live sessions across
    /// replicas; 0 turns it off.
    pub decode_delay_weight: f64,
    /// Weight of the future work a placement attracts: a session's later
    /// turns follow its prefix to wherever it lands, so a replica whose
    /// share of recently routed prefill work is above the least share is
    /// charged the prefill time of the request's least work anywhere times
    /// that excess times the number of replicas (docs/routing.md, "Future
    /// work"). A continuing session keeps its cache advantage; a new one is
    /// spread. Only a busy candidate pays it: piling sessions onto an idle
    /// replica costs nobody anything. 0 turns it off.
    pub future_work_weight: f64,
    /// Output tokens assumed when a request gives no `max_tokens`.
    pub default_output_tokens: u32,
    /// Time to load a LoRA adapter's weights into a GPU slot of a replica
    /// that does not hold it (vLLM's `--max-loras` slots), ms: a request
    /// for it waits that long before its prefill. The prior of a calibrated
    /// estimate (`calibrate.rs`). Charged only where the replica's slot
    /// count is known (`vllm:lora_requests_info`).
    pub adapter_load_ms: f64,
}

impl Default for CostModelConfig {
    fn default() -> Self {
        CostModelConfig {
            prefill_tokens_per_s: 16_000.0,
            cpu_block_ms: 0.05,
            storage_block_ms: 0.5,
            step_overhead_ms: 20.0,
            decode_step_ms: 10.0,
            decode_per_seq_ms: 0.05,
            kv_pressure_start: 0.8,
            kv_pressure_tokens: 32_000.0,
            work_weight: 3.0,
            decode_delay_weight: 0.05,
            future_work_weight: 1.0,
            default_output_tokens: 256,
            adapter_load_ms: 50.0,
        }
    }
}

/// Online calibration of each replica's prefill rate and transfer costs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CalibrationConfig {
    /// Turn calibration off to keep the priors.
    pub enabled: bool,
    /// Samples kept per replica; the estimate is their median.
    pub window: usize,
    /// Samples needed before the median replaces the prior entirely; fewer
    /// are blended with the prior so that cold starts cannot swing it.
    pub min_samples: usize,
    /// Least difference in work (tokens) between two samples for their slope
    /// to count; also the smallest sample used to fit the rate alone.
    pub min_sample_tokens: u64,
    /// A sample's implied rate is clamped to prior ÷ this … prior × this.
    pub max_ratio_to_prior: f64,
    /// Route each replica on its own engine samples (a fleet of different
    /// GPUs) instead of the fleet's pooled ones. Off by default: a request's
    /// prefill time grows with the prefills sharing its steps, so a
    /// replica's own fit measures its recent load as much as its speed, and
    /// routing on it swings load between identical replicas
    /// (docs/routing.md, "Calibration").
    pub per_replica: bool,
}

impl Default for CalibrationConfig {
    fn default() -> Self {
        CalibrationConfig {
            enabled: true,
            window: 31,
            min_samples: 5,
            min_sample_tokens: 256,
            max_ratio_to_prior: 20.0,
            per_replica: false,
        }
    }
}

/// SGLang / vLLM-router `cache_aware` defaults for the `approx_prefix`
/// baseline.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ApproxPrefixConfig {
    /// Minimum matched fraction of the prompt to follow the best match.
    pub cache_threshold: f64,
    /// Imbalance when the busiest replica has this many more requests …
    pub balance_abs_threshold: u32,
    /// … and this many times as many as the idlest.
    pub balance_rel_threshold: f64,
    /// Symbols (characters or tokens) remembered per replica before LRU
    /// eviction.
    pub max_tree_symbols: usize,
}

impl Default for ApproxPrefixConfig {
    fn default() -> Self {
        ApproxPrefixConfig {
            cache_threshold: 0.3,
            balance_abs_threshold: 64,
            balance_rel_threshold: 1.5,
            max_tree_symbols: 1 << 24,
        }
    }
}

/// Everything that shapes routing decisions.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RouterConfig {
    /// The policy.
    pub policy: PolicyKind,
    /// How costs become a choice (cost-based policies).
    pub selection: Selection,
    /// Relative cost band treated as a tie (`selection = "rotate"`, `"balance"` or `"epsilon"`).
    pub epsilon: f64,
    /// The band for a fresh request, one no replica holds any of
    /// (`selection = "rotate"` or `"balance"`): its near-ties are ordered
    /// by the work recently routed to each replica, so new sessions spread
    /// by work, not by the instantaneous queue (docs/routing.md, "Fresh
    /// requests").
    pub fresh_epsilon: f64,
    /// Softmax temperature, relative to the best cost (`selection = "softmax"`).
    pub temperature: f64,
    /// Seed of the router's randomness; none draws one at startup.
    pub seed: Option<u64>,
    /// The predicted-TTFT model.
    pub cost: CostModelConfig,
    /// Per-replica calibration.
    pub calibration: CalibrationConfig,
    /// `linear_blocks`: weight of prefill blocks against decode blocks
    /// (Dynamo's `--kv-overlap-score-weight`, default 1).
    pub linear_overlap_weight: f64,
    /// `approx_prefix` parameters.
    pub approx: ApproxPrefixConfig,
    /// How long a routed prompt's blocks count as cached on the chosen
    /// replica before events confirm them, ms.
    pub tentative_ttl_ms: u64,
    /// Most tentative blocks kept in all (bounds memory under floods).
    pub tentative_max_blocks: usize,
    /// A booking whose completion never arrives is expired (and counted)
    /// after this long, ms.
    pub booking_timeout_ms: u64,
    /// Bookings made by a peer ingress expire after this long without news, ms.
    pub peer_booking_timeout_ms: u64,
    /// A replica is busy above this many pending prefill tokens; 0 disables.
    pub busy_pending_tokens: u64,
    /// A replica is busy above this reported KV usage (0–1); 1 or more disables.
    pub busy_kv_usage: f64,
    /// What to do when every replica is busy.
    pub admission: AdmissionMode,
    /// Longest a request may wait for a replica to stop being busy, ms.
    pub max_queue_wait_ms: u64,
    /// How often a queued request should retry, ms (also the retry-after hint
    /// floor on rejection).
    pub queue_poll_ms: u64,
    /// Engine reports older than this are ignored, ms.
    pub report_max_age_ms: u64,
    /// Consecutive engine reports that must disagree with the ledger before
    /// it is corrected.
    pub reconcile_reports: u32,
    /// Decisions kept for the debug endpoint; 0 keeps none.
    pub explain_last: usize,
    /// Candidate rows kept per logged decision: the cheapest this many (the
    /// chosen one always among them), in replica order; 0 keeps them all.
    /// Copying every row of a large fleet into the log on every decision
    /// would cost more than the decision.
    pub explain_candidates: usize,
}

impl Default for RouterConfig {
    fn default() -> Self {
        RouterConfig {
            policy: PolicyKind::KvAware,
            selection: Selection::Rotate,
            epsilon: 0.1,
            fresh_epsilon: 0.3,
            temperature: 0.05,
            seed: None,
            cost: CostModelConfig::default(),
            calibration: CalibrationConfig::default(),
            linear_overlap_weight: 1.0,
            approx: ApproxPrefixConfig::default(),
            tentative_ttl_ms: 30_000,
            tentative_max_blocks: 1 << 20,
            booking_timeout_ms: 1_800_000,
            peer_booking_timeout_ms: 60_000,
            busy_pending_tokens: 0,
            busy_kv_usage: 1.0,
            admission: AdmissionMode::Queue,
            max_queue_wait_ms: 10_000,
            queue_poll_ms: 50,
            report_max_age_ms: 10_000,
            reconcile_reports: 5,
            explain_last: 256,
            explain_candidates: 64,
        }
    }
}

impl RouterConfig {
    /// Checks every field once; the router trusts the result.
    pub fn validate(&self) -> Result<(), RouterError> {
        let bad = |what: &str| Err(RouterError::InvalidConfig(what.to_string()));
        let c = &self.cost;
        let finite_nonneg = |x: f64| x.is_finite() && x >= 0.0;
        if !(c.prefill_tokens_per_s.is_finite() && c.prefill_tokens_per_s > 0.0) {
            return bad("cost.prefill_tokens_per_s must be a positive number");
        }
        for (name, v) in [
            ("cost.cpu_block_ms", c.cpu_block_ms),
            ("cost.storage_block_ms", c.storage_block_ms),
            ("cost.step_overhead_ms", c.step_overhead_ms),
            ("cost.decode_step_ms", c.decode_step_ms),
            ("cost.decode_per_seq_ms", c.decode_per_seq_ms),
            ("cost.kv_pressure_tokens", c.kv_pressure_tokens),
            ("cost.work_weight", c.work_weight),
            ("cost.decode_delay_weight", c.decode_delay_weight),
            ("cost.future_work_weight", c.future_work_weight),
            ("cost.adapter_load_ms", c.adapter_load_ms),
            ("epsilon", self.epsilon),
            ("fresh_epsilon", self.fresh_epsilon),
            ("linear_overlap_weight", self.linear_overlap_weight),
            ("busy_kv_usage", self.busy_kv_usage),
        ] {
            if !finite_nonneg(v) {
                return bad(&format!("{name} must be a finite number >= 0"));
            }
        }
        if !(0.0..1.0).contains(&c.kv_pressure_start) {
            return bad("cost.kv_pressure_start must be in [0, 1)");
        }
        if !(self.temperature.is_finite() && self.temperature > 0.0) {
            return bad("temperature must be > 0");
        }
        let cal = &self.calibration;
        if cal.window == 0 || cal.window > 4096 {
            return bad("calibration.window must be in 1..=4096");
        }
        if !(cal.max_ratio_to_prior.is_finite() && cal.max_ratio_to_prior >= 1.0) {
            return bad("calibration.max_ratio_to_prior must be >= 1");
        }
        let a = &self.approx;
        if !(0.0..=1.0).contains(&a.cache_threshold) {
            return bad("approx.cache_threshold must be in [0, 1]");
        }
        if !(a.balance_rel_threshold.is_finite() && a.balance_rel_threshold >= 1.0) {
            return bad("approx.balance_rel_threshold must be >= 1");
        }
        if self.queue_poll_ms == 0 {
            return bad("queue_poll_ms must be > 0");
        }
        if self.booking_timeout_ms == 0 || self.peer_booking_timeout_ms == 0 {
            return bad("booking timeouts must be > 0");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_validate_and_policies_round_trip() {
        assert!(RouterConfig::default().validate().is_ok());
        for p in PolicyKind::ALL {
            assert_eq!(p.name().parse::<PolicyKind>().ok(), Some(p));
        }
        let e = "nope".parse::<PolicyKind>().unwrap_err().to_string();
        assert!(e.contains("kv_aware"), "{e}");
    }

    #[test]
    fn bad_values_are_named() {
        let mut c = RouterConfig::default();
        c.cost.prefill_tokens_per_s = 0.0;
        assert!(c.validate().unwrap_err().to_string().contains("prefill_tokens_per_s"));
        let c = RouterConfig { epsilon: f64::NAN, ..RouterConfig::default() };
        assert!(c.validate().unwrap_err().to_string().contains("epsilon"));
    }
}
