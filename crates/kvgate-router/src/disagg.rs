//! Prefill/decode disaggregation: where a request's prefill runs, where it
//! decodes, and whether to split it at all (docs/routing.md, "Prefill/decode
//! disaggregation").
//!
//! A P/D fleet has two routers over two indexes: one over the prefill
//! replicas, one over the decode replicas (a `both` replica may sit in
//! either). For each request the planner previews ([`Router::peek`]):
//!
//! ```text
//! bypass     = the decode router's cost of serving it whole on its best decode replica
//! split      = the prefill router's cost of its prefill (max_tokens 1)
//!            + the decode router's cost of its decode hop, whose uncached prompt
//!              arrives at τ seconds per token (KV bytes per token ÷ bandwidth,
//!              calibrated from observed transfers)
//! on_prefill = the prefill router's cost of serving it whole on its best prefill
//!              replica (only with `whole_on_prefill`, off by default)
//! ```
//!
//! and books the cheapest plan through [`Router::decide`] (a split in both
//! ledgers).
//! Both costs are the kv_aware objective: the bypass pays the prefill on a
//! decode replica plus the delay it imposes on the sequences decoding
//! there (the decode-delay charge), the split pays the prefill replica's
//! queue and the transfer. A decode replica that already caches most of the
//! prompt receives little and computes little, so the bypass wins there; a
//! long uncached prompt on a busy decode replica splits.
//!
//! Sans-IO, like the routers: `now` comes in, plans go out.

use std::time::Instant;

use kvgate_index::Index;

use crate::calibrate::RobustRate;
use crate::config::CalibrationConfig;
use crate::decide::{Decision, Peek, RouteRequest, Routed};
use crate::router::Router;

/// How the planner decides whether to split a request.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum DisaggMode {
    /// Split every request (a prefill replica exists), as vllm-router does.
    Always,
    /// kvgate's rule: the cheapest plan in the cost model: whole on a decode
    /// replica (the bypass), split, or, with `whole_on_prefill`, whole on a
    /// prefill replica. vLLM's NIXL engines run `kv_role = "kv_both"`, so a
    /// prefill engine serves a plain request like any other. Letting it do
    /// so puts the prefill pool's KV memory to use when the decode pool is
    /// short of it (half the GPUs hold every decoding sequence otherwise),
    /// at the cost of ITL: measured, it trades TTFT for ITL
    /// (docs/benchmarks.md, "Prefill/decode disaggregation"), so it is off by default.
    Conditional {
        /// A prefill replica may serve a request whole.
        whole_on_prefill: bool,
    },
    /// Dynamo's published `isl_bounding` rule, as a baseline: bypass iff
    /// the prompt's tokens not cached on the chosen decode replica are
    /// fewer than `eff_isl_threshold` and below `ratio` of the prompt.
    IslBounding {
        /// Dynamo's default is 2048 tokens.
        eff_isl_threshold: u64,
        /// Dynamo's default is 0.7.
        ratio: f64,
    },
}

impl DisaggMode {
    /// Dynamo's `isl_bounding` with its defaults.
    pub fn dynamo_default() -> DisaggMode {
        DisaggMode::IslBounding { eff_isl_threshold: 2048, ratio: 0.7 }
    }

    /// kvgate's rule with its default: only decode replicas serve whole.
    pub fn conditional() -> DisaggMode {
        DisaggMode::Conditional { whole_on_prefill: false }
    }

    /// The name reports use.
    pub fn name(self) -> &'static str {
        match self {
            DisaggMode::Always => "pd_always",
            DisaggMode::Conditional { whole_on_prefill: false } => "pd_conditional",
            DisaggMode::Conditional { whole_on_prefill: true } => "pd_conditional_on_prefill",
            DisaggMode::IslBounding { .. } => "pd_isl_bounding",
        }
    }
}

/// The planner's settings.
#[derive(Clone, Debug, PartialEq)]
pub struct DisaggConfig {
    /// How to decide whether to split.
    pub mode: DisaggMode,
    /// The model's KV bytes per token (all layers; `layers × kv_heads ×
    /// head_dim × 2 × dtype bytes` for plain attention).
    pub kv_bytes_per_token: u64,
    /// Prefill-to-decode link bandwidth, bytes per second: the transfer
    /// rate's prior until transfers have been observed.
    pub bandwidth_bytes_per_s: f64,
}

impl DisaggConfig {
    /// Seconds per transferred token implied by the settings.
    pub fn prior_s_per_token(&self) -> f64 {
        if self.bandwidth_bytes_per_s > 0.0 {
            self.kv_bytes_per_token as f64 / self.bandwidth_bytes_per_s
        } else {
            0.0
        }
    }
}

/// Where a request goes.
#[derive(Debug)]
pub enum PdPlan {
    /// Served whole on one decode replica: the bypass.
    Aggregated(Routed),
    /// Served whole on one prefill replica (`whole_on_prefill`): its booking
    /// is the prefill router's.
    OnPrefill(Routed),
    /// Prefill on one replica, then decode on another, whose booking
    /// expects the prompt's KV by transfer.
    Split {
        /// The prefill hop (`max_tokens` 1, `do_remote_decode`).
        prefill: Routed,
        /// The decode hop (`do_remote_prefill`, the prefill's
        /// `kv_transfer_params`).
        decode: Routed,
    },
}

/// Why a plan could not be made.
#[derive(Debug)]
pub enum PdRefusal {
    /// No decode replica could take it; the decode router's own answer.
    Decode(Decision),
}

/// Counts of plans made.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PdCounts {
    /// Requests split.
    pub split: u64,
    /// Requests served whole on a decode replica.
    pub bypassed: u64,
    /// Requests split with no prefill replica left to take them and so
    /// served whole (counted in `bypassed` too).
    pub no_prefill: u64,
    /// Requests served whole on a prefill replica.
    pub on_prefill: u64,
}

impl PdCounts {
    /// Requests planned.
    pub fn planned(&self) -> u64 {
        self.split + self.bypassed + self.on_prefill
    }

    /// Bypassed (whole on a decode replica) ÷ planned.
    pub fn bypass_rate(&self) -> f64 {
        share(self.bypassed, self.planned())
    }

    /// Served whole on a prefill replica ÷ planned.
    pub fn on_prefill_rate(&self) -> f64 {
        share(self.on_prefill, self.planned())
    }
}

fn share(part: u64, n: u64) -> f64 {
    if n == 0 {
        0.0
    } else {
        part as f64 / n as f64
    }
}

/// The planner: settings, the calibrated transfer rate and counts.
#[derive(Debug)]
pub struct Disagg {
    config: DisaggConfig,
    calibration: CalibrationConfig,
    transfer: RobustRate,
    counts: PdCounts,
}

impl Disagg {
    /// A planner with `config`'s prior transfer rate.
    pub fn new(config: DisaggConfig) -> Disagg {
        let prior = config.prior_s_per_token().max(1e-12);
        Disagg {
            transfer: RobustRate::new(prior),
            calibration: CalibrationConfig::default(),
            config,
            counts: PdCounts::default(),
        }
    }

    /// The settings.
    pub fn config(&self) -> &DisaggConfig {
        &self.config
    }

    /// Plans so far.
    pub fn counts(&self) -> PdCounts {
        self.counts
    }

    /// Seconds per transferred token, as calibrated.
    pub fn transfer_s_per_token(&self) -> f64 {
        self.transfer.estimate()
    }

    /// One observed transfer: `tokens` moved in `seconds` (from the prefill
    /// hop's end to the decode hop's admission). Robust: one slow transfer
    /// does not swing the rate.
    pub fn observe_transfer(&mut self, tokens: u64, seconds: f64) {
        if tokens > 0 && seconds.is_finite() && seconds >= 0.0 {
            self.transfer.observe(seconds / tokens as f64, &self.calibration);
        }
    }

    /// The decode hop's request: `req` whose prompt KV arrives by transfer.
    pub fn decode_hop<'a>(&self, req: &RouteRequest<'a>) -> RouteRequest<'a> {
        RouteRequest { remote_kv_s_per_token: Some(self.transfer_s_per_token()), ..*req }
    }

    /// Decides whether and where to split `req`, and books the plan: the
    /// prefill hop on `prefill`, the decode hop (or the whole request) on
    /// `decode`. Each router's index must be the one its replicas feed.
    pub fn plan(
        &mut self,
        prefill: (&mut Router, &Index),
        decode: (&mut Router, &Index),
        req: &RouteRequest<'_>,
        now: Instant,
    ) -> Result<PdPlan, PdRefusal> {
        let (p_router, p_index) = prefill;
        let (d_router, d_index) = decode;
        let p_req = RouteRequest { max_output_tokens: Some(1), ..*req };
        let d_req = self.decode_hop(req);
        let choice = match self.config.mode {
            DisaggMode::Always => Choice::Split,
            DisaggMode::IslBounding { eff_isl_threshold, ratio } => {
                match d_router.peek(req, d_index, now) {
                    Some(whole) if isl_bypass(req, &whole, eff_isl_threshold, ratio) => {
                        Choice::Whole
                    }
                    _ => Choice::Split,
                }
            }
            DisaggMode::Conditional { whole_on_prefill } => {
                // Each plan's cost to the fleet; a plan no replica can take
                // costs infinity. Ties keep the bypass, then the split.
                let whole = d_router.peek(req, d_index, now).map(|w| w.cost + held_up(&w));
                let hop = d_router.peek(&d_req, d_index, now);
                let pre = p_router.peek(&p_req, p_index, now);
                let split = match (pre, hop) {
                    (Some(p), Some(h)) => Some(p.cost + h.cost),
                    // No decode replica: the bypass below is refused with
                    // the decode router's own answer.
                    _ => None,
                };
                // Whole on a prefill replica prefills there as a split's
                // hop would, so neither is charged the held-up term: what
                // waits there is prefills, which a later one does not pass.
                let on_prefill = if whole_on_prefill {
                    p_router.peek(req, p_index, now).map(|w| w.cost)
                } else {
                    None
                };
                let inf = f64::INFINITY;
                let (w, s, o) =
                    (whole.unwrap_or(inf), split.unwrap_or(inf), on_prefill.unwrap_or(inf));
                if o < w && o < s {
                    Choice::OnPrefill
                } else if s < w {
                    Choice::Split
                } else {
                    Choice::Whole
                }
            }
        };
        match choice {
            Choice::Split => {
                if let Decision::Routed(p) = p_router.decide(&p_req, p_index, now) {
                    match d_router.decide(&d_req, d_index, now) {
                        Decision::Routed(d) => {
                            self.counts.split += 1;
                            return Ok(PdPlan::Split { prefill: p, decode: d });
                        }
                        other => {
                            // No decode replica: the prefill would be wasted.
                            p_router.finish(p.booking, crate::Outcome::Cancelled);
                            return Err(PdRefusal::Decode(other));
                        }
                    }
                }
                self.counts.no_prefill += 1;
            }
            Choice::OnPrefill => {
                if let Decision::Routed(p) = p_router.decide(req, p_index, now) {
                    self.counts.on_prefill += 1;
                    return Ok(PdPlan::OnPrefill(p));
                }
            }
            Choice::Whole => {}
        }
        match d_router.decide(req, d_index, now) {
            Decision::Routed(d) => {
                self.counts.bypassed += 1;
                Ok(PdPlan::Aggregated(d))
            }
            other => Err(PdRefusal::Decode(other)),
        }
    }
}

/// The plan the mode picked, before it is booked.
enum Choice {
    Whole,
    Split,
    OnPrefill,
}

/// What serving a request whole on a decode replica costs the requests
/// there still waiting for their first token, above what its preview
/// counts: its prefill chunks fill the steps they need (a decode hop needs
/// one step, a whole request its own chunks), so each waits about its
/// prefill longer, in TTFT seconds. The decode-delay charge counts only the
/// sequences already decoding, at an ITL weight.
fn held_up(whole: &Peek) -> f64 {
    whole.prefill_s * f64::from(whole.awaiting_first_token)
}

/// Dynamo's `isl_bounding`: the effective input length on the decode
/// replica the router would choose (prompt minus its cached prefix) is
/// short, absolutely and relative to the prompt.
fn isl_bypass(req: &RouteRequest<'_>, whole: &Peek, threshold: u64, ratio: f64) -> bool {
    let bs = u64::from(whole.block_size.max(1));
    let eff = req.prompt_tokens.saturating_sub(u64::from(whole.cached_blocks) * bs);
    eff < threshold && (eff as f64) < ratio * req.prompt_tokens.max(1) as f64
}

#[cfg(test)]
mod tests {
    use crate::config::CostModelConfig;
    use crate::cost::{decode_delay_charge, predict, CostInputs};
    use crate::decide::remote_kv_inputs;

    /// The held-up charge: a bypass's prefill delays each request waiting
    /// for its first token on that decode replica by about its length.
    #[test]
    fn a_bypass_is_charged_for_the_first_tokens_it_holds_up() {
        let peek = |prefill_s: f64, awaiting_first_token: u32| super::Peek {
            replica: kvgate_index::ReplicaId(0),
            cost: 1.0,
            predicted_ttft_s: 1.0,
            cached_blocks: 0,
            uncached_tokens: 8000,
            block_size: 16,
            prefill_s,
            awaiting_first_token,
        };
        assert_eq!(super::held_up(&peek(0.5, 4)), 2.0);
        assert_eq!(super::held_up(&peek(0.5, 0)), 0.0);
        assert_eq!(super::held_up(&peek(0.0, 9)), 0.0);
    }

    /// The worked example of docs/routing.md ("Prefill/decode
    /// disaggregation"), so the doc stays true: the same 8,000-token prompt
    /// bypasses where a decode replica holds 7,680 of its tokens, and
    /// splits when nothing holds it.
    #[test]
    fn worked_example_in_docs_routing_md() {
        let c = CostModelConfig::default();
        let s_per_token = 262_144.0 / 64e9;
        let base = CostInputs {
            prompt_tokens: 8000,
            block_size: 16,
            max_num_batched_tokens: 8192,
            prefill_s_per_token: 1.0 / 16_000.0,
            overhead_s: 0.020,
            ..CostInputs::default()
        };
        let r = |x: f64| (x * 10_000.0).round() / 10_000.0;
        // Whole on D (40 sequences decoding there): its cost and the
        // decode-delay charge its prefill puts on those 40.
        let whole = |cached_blocks: u32| {
            let p = predict(&c, &CostInputs { cached_blocks, decoding: 40, ..base });
            (p, p.cost + decode_delay_charge(&c, &p, 40))
        };
        // The prefill hop on an idle P holding nothing, and the decode hop
        // on that same D.
        let split = |cached_blocks: u32| {
            let p = predict(&c, &CostInputs { ..base });
            let mut x = CostInputs { cached_blocks, decoding: 40, ..base };
            remote_kv_inputs(&mut x, s_per_token);
            let h = predict(&c, &x);
            (p, h, p.cost + h.cost + decode_delay_charge(&c, &h, 40))
        };

        // The session's next turn: D holds 480 blocks (7,680 tokens).
        let (w, bypass) = whole(480);
        assert_eq!((w.uncached_tokens, r(w.ttft_s), r(bypass)), (320, 0.052, 0.092));
        let (p, h, total) = split(480);
        assert_eq!(
            [r(p.ttft_s), r(h.transfer_s), r(h.ttft_s), r(total)],
            [0.52, 0.0013, 0.0334, 0.5535]
        );
        assert!(bypass < total, "the warm turn must bypass");

        // A new 8,000-token prompt: nothing cached anywhere.
        let (w, bypass) = whole(0);
        assert_eq!((r(w.ttft_s), r(bypass)), (0.532, 1.532));
        let (_, h, total) = split(0);
        assert_eq!([r(h.transfer_s), r(h.ttft_s), r(total)], [0.0328, 0.0648, 0.585]);
        assert!(total < bypass, "the cold prompt must split");
    }
}
