//! The predicted-TTFT cost model of policy `kv_aware`.
//!
//! For one replica and one request (all times in seconds):
//!
//! ```text
//! U        = prompt tokens - block_size × cached prefix blocks   (at least 1)
//! queue    = σ × P                       P: pending prefill tokens ahead
//! prefill  = σ × U                       σ: calibrated seconds per token
//! transfer = τ_cpu × cpu blocks + τ_storage × storage blocks
//!            (+ a decode hop's KV received from its prefill replica)
//! adapter  = load (adapter not in a GPU slot) + slot wait (every slot busy)
//! steps    = max(1, (P + U) / max_num_batched_tokens)
//! interf.  = steps × min(decode_step + decode_per_seq × D, measured step)   if D > 0, else 0
//!            (the measured step is the engine's mean inter-token latency)
//! ttft     = queue + prefill + transfer + interf. + adapter + overhead
//! pressure = σ × min(kv_pressure_tokens, capacity tokens ÷ 2) × ((u - start) / (1 - start))²
//!            u: KV occupancy after booking
//! cost     = ttft + pressure + work_weight × busy × σ × (U − U_min)
//!                 + decode_delay_weight × D × σ × U
//!                 + future_work_weight × busy × h × σ × U_min × R × (s − s_min) / Σs
//! busy     = 1 if anything is queued or decoding there, else 0
//! U_min    = the fewest uncached tokens of any candidate
//! s        = prefill tokens recently routed to the replica (decayed per
//!            decision), s_min the least of any candidate, R the candidates
//! h        = the share of recently routed prompt tokens that were cached
//!            somewhere when routed (attract.rs; 0 without reuse)
//! ```
//!
//! Every term is non-decreasing in the load (P, D, occupancy) and
//! non-increasing in the cached prefix, which the property tests check. With
//! nothing cached anywhere, U is the same on every replica, so the cost
//! orders replicas by their load alone: the model *is* least-load there, with
//! no mode switch.

use crate::config::CostModelConfig;

/// The share of a replica's KV capacity, in tokens, that bounds the
/// pressure term's weight: the sequences a full cache preempts hold part
/// of it, never more than all of it.
const PREEMPTED_SHARE: f64 = 0.5;

/// What the model needs about one candidate.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CostInputs {
    /// The request's prompt tokens.
    pub prompt_tokens: u64,
    /// Tokens per block.
    pub block_size: u32,
    /// Cached prefix blocks usable without recompute (any tier).
    pub cached_blocks: u32,
    /// Of those, blocks to load from CPU and from storage.
    pub lower_blocks: [u32; 2],
    /// Prefill tokens queued ahead on the replica.
    pub queue_tokens: u64,
    /// Sequences decoding on the replica.
    pub decoding: u32,
    /// KV blocks in use before this request.
    pub kv_used_blocks: u64,
    /// KV blocks this request adds (uncached prompt + expected output).
    pub kv_new_blocks: u64,
    /// GPU KV capacity in blocks; 0 when unknown (no pressure term).
    pub kv_capacity_blocks: u64,
    /// The replica's per-step token budget.
    pub max_num_batched_tokens: u32,
    /// Calibrated seconds per prefill token.
    pub prefill_s_per_token: f64,
    /// Calibrated fixed seconds of the request's first step.
    pub overhead_s: f64,
    /// Calibrated seconds per block from CPU and from storage.
    pub transfer_s_per_block: [f64; 2],
    /// The engine's measured decode step in seconds; `None` uses the
    /// configured `decode_step_ms`.
    pub decode_step_s: Option<f64>,
    /// Seconds before the prefill can start because of the request's LoRA
    /// adapter: its load into a GPU slot, and the wait for a free slot
    /// (decide.rs works it out from the adapter table and the ledger).
    pub adapter_s: f64,
    /// Seconds receiving the prompt's KV from a prefill replica (a
    /// disaggregated request's decode hop, `disagg.rs`); 0 otherwise.
    pub received_s: f64,
}

/// The model's breakdown for one candidate.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Prediction {
    /// Uncached tokens this request would prefill there.
    pub uncached_tokens: u64,
    /// Seconds waiting for the queue ahead.
    pub queue_s: f64,
    /// Seconds of its own prefill.
    pub prefill_s: f64,
    /// Seconds loading lower-tier blocks (or receiving a decode hop's KV).
    pub transfer_s: f64,
    /// Seconds of decode steps interleaved with the prefill.
    pub interference_s: f64,
    /// Fixed seconds of the first step.
    pub overhead_s: f64,
    /// Seconds waiting for the request's LoRA adapter (load, free slot).
    pub adapter_s: f64,
    /// Predicted time to first token.
    pub ttft_s: f64,
    /// The decode-pressure penalty.
    pub pressure_s: f64,
    /// What the policy minimises.
    pub cost: f64,
}

/// Evaluates the model.
pub fn predict(c: &CostModelConfig, x: &CostInputs) -> Prediction {
    let cached_tokens = u64::from(x.cached_blocks) * u64::from(x.block_size);
    let uncached = x.prompt_tokens.saturating_sub(cached_tokens).max(1);
    let sigma = x.prefill_s_per_token;
    let queue_s = sigma * x.queue_tokens as f64;
    let prefill_s = sigma * uncached as f64;
    let transfer_s = x.transfer_s_per_block[0] * f64::from(x.lower_blocks[0])
        + x.transfer_s_per_block[1] * f64::from(x.lower_blocks[1])
        + x.received_s;
    let interference_s = if x.decoding > 0 {
        let work = (x.queue_tokens + uncached) as f64;
        let steps = (work / f64::from(x.max_num_batched_tokens.max(1))).max(1.0);
        let modelled = (c.decode_step_ms + c.decode_per_seq_ms * f64::from(x.decoding)) * 1e-3;
        // The engine's mean inter-token latency includes the prefill chunks
        // that shared the steps, which `queue` and `prefill` already count:
        // it bounds the decode part from above, so it can only lower the
        // modelled step (a faster engine than the prior), never raise it.
        // Raising it on busy replicas double-counts their prefill and, as the
        // measurement lags, swings load between replicas.
        steps * x.decode_step_s.map_or(modelled, |m| m.min(modelled))
    } else {
        0.0
    };
    let overhead_s = x.overhead_s;
    let adapter_s = x.adapter_s;
    let ttft_s = queue_s + prefill_s + transfer_s + interference_s + adapter_s + overhead_s;
    let pressure_s = if x.kv_capacity_blocks > 0 {
        // (u - start) / (1 - start) with u = blocks / capacity, as one
        // division: this runs once per replica per decision.
        let cap = x.kv_capacity_blocks as f64;
        let blocks = (x.kv_used_blocks + x.kv_new_blocks) as f64;
        let start = c.kv_pressure_start;
        let over = ((blocks - start * cap) / ((1.0 - start) * cap)).max(0.0);
        // What the term stands for, sequences preempted and recomputed,
        // cannot exceed what the cache holds: on a small cache the full
        // weight would outweigh a cache hit many times over and push
        // sessions off the replica that holds them.
        let tokens = c.kv_pressure_tokens.min(PREEMPTED_SHARE * cap * f64::from(x.block_size));
        sigma * tokens * over * over
    } else {
        0.0
    };
    // The fleet-work charge depends on the other candidates; the caller
    // adds it (`work_charge`).
    let cost = ttft_s + pressure_s;
    Prediction {
        uncached_tokens: uncached,
        queue_s,
        prefill_s,
        transfer_s,
        interference_s,
        overhead_s,
        adapter_s,
        ttft_s,
        pressure_s,
        cost,
    }
}

/// The fleet-work charge of a candidate (docs/routing.md): its prefill
/// beyond the fewest uncached tokens any candidate has (`floor_tokens`)
/// delays whoever shares the replica with it, the requests queued behind it
/// and every sequence decoding meanwhile, so it costs `work_weight` times its
/// duration on a busy replica. An idle replica delays nobody, so a burst
/// still spreads over idle replicas; and with no reuse anywhere every
/// candidate has the same uncached tokens, so there is no charge and the
/// cost orders replicas by load alone.
pub fn work_charge(c: &CostModelConfig, p: &Prediction, floor_tokens: u64, busy: bool) -> f64 {
    if !busy || p.uncached_tokens == 0 {
        return 0.0;
    }
    let extra = p.uncached_tokens.saturating_sub(floor_tokens) as f64;
    c.work_weight * p.prefill_s * extra / p.uncached_tokens as f64
}

/// The decode-delay charge of a candidate (docs/routing.md, "Decode
/// delay"): vLLM schedules the running decodes into every step that carries
/// this request's prefill, so each of the `decoding` sequences there waits
/// about `prefill_s` longer for its next tokens. Weighed at
/// `decode_delay_weight` of a TTFT second per sequence. With no reuse
/// anywhere, `prefill_s` is the same everywhere and the charge orders
/// replicas by their decode load, so the choice is still by load alone.
pub(crate) fn decode_delay_charge(c: &CostModelConfig, p: &Prediction, decoding: u32) -> f64 {
    c.decode_delay_weight * p.prefill_s * f64::from(decoding)
}

/// The future-work charge of a candidate (docs/routing.md, "Future work"):
/// the session a request belongs to will send its later turns wherever
/// its prefix lands, each about as much new work as this request needs at
/// best (`floor_tokens`, the fewest uncached tokens of any candidate). A
/// replica that was recently given `excess` × (1 ÷ replicas) more of the
/// fleet's prefill work than the least-given one is charged that work's prefill
/// time (at this replica's rate) times `excess`, at `future_work_weight`.
/// The caller scales `excess` by the fleet's reuse ratio (attract.rs):
/// without reuse there are no later turns to attract.
/// The same tokens are charged on every candidate, so a continuing session
/// keeps its cache advantage and a new session (whose floor is most of its
/// prompt) is spread.
pub(crate) fn future_charge(
    c: &CostModelConfig,
    p: &Prediction,
    floor_tokens: u64,
    excess: f64,
) -> f64 {
    if p.uncached_tokens == 0 || excess <= 0.0 {
        return 0.0;
    }
    let per_token = p.prefill_s / p.uncached_tokens as f64;
    c.future_work_weight * per_token * floor_tokens as f64 * excess
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The worked example of `docs/routing.md`, so the doc stays true.
    #[test]
    fn pressure_weighs_at_most_half_the_cache() {
        let c = CostModelConfig::default();
        let full = |capacity_blocks: u64| {
            let x = CostInputs {
                prompt_tokens: 64,
                block_size: 32,
                kv_capacity_blocks: capacity_blocks,
                kv_used_blocks: capacity_blocks - 2,
                kv_new_blocks: 2,
                prefill_s_per_token: 1e-3,
                ..CostInputs::default()
            };
            predict(&c, &x).pressure_s
        };
        // At full occupancy the term is σ × its token weight: the configured
        // 32,000 on a large cache, half of 512 × 32 tokens on a small one.
        assert!((full(4096) - 32.0).abs() < 1e-9, "{}", full(4096));
        assert!((full(512) - 8.192).abs() < 1e-9, "{}", full(512));
    }

    #[test]
    fn worked_example_in_docs_routing_md() {
        let c = CostModelConfig::default();
        let base = CostInputs {
            prompt_tokens: 4296,
            block_size: 16,
            cached_blocks: 256,
            kv_capacity_blocks: 10_000,
            max_num_batched_tokens: 8192,
            prefill_s_per_token: 1.0 / 16_000.0,
            overhead_s: 0.020,
            transfer_s_per_block: [0.05e-3, 0.5e-3],
            kv_new_blocks: 29,
            ..CostInputs::default()
        };
        let a = predict(
            &c,
            &CostInputs { queue_tokens: 12_000, decoding: 30, kv_used_blocks: 8_500, ..base },
        );
        let b = predict(
            &c,
            &CostInputs {
                lower_blocks: [256, 0],
                queue_tokens: 2_000,
                decoding: 10,
                kv_used_blocks: 4_000,
                ..base
            },
        );
        let cold = predict(
            &c,
            &CostInputs { cached_blocks: 0, kv_used_blocks: 1_000, kv_new_blocks: 285, ..base },
        );
        let r = |x: f64| (x * 10_000.0).round() / 10_000.0;
        assert_eq!([r(a.ttft_s), r(a.pressure_s), r(a.cost)], [0.7996, 0.1399, 0.9395]);
        assert_eq!([r(b.ttft_s), r(b.transfer_s), r(b.cost)], [0.1808, 0.0128, 0.1808]);
        assert_eq!([r(cold.ttft_s), r(cold.cost)], [0.2885, 0.2885]);
        assert_eq!(cold.uncached_tokens, 4296);
        // The fleet-work charge: A and B need only the 200-token question
        // (the floor), so neither is charged; C would add 4,096 more tokens
        // but is idle. Were C busy, it would pay 3 × 4096/16000 s.
        let floor = a.uncached_tokens.min(b.uncached_tokens).min(cold.uncached_tokens);
        assert_eq!(floor, 200);
        assert_eq!(work_charge(&c, &a, floor, true), 0.0);
        assert_eq!(work_charge(&c, &cold, floor, false), 0.0);
        assert_eq!(r(work_charge(&c, &cold, floor, true)), 0.768);
        // The decode-delay charge: A's 200-token prefill holds up its 30
        // decoding sequences, 0.05 × 30 × 200/16000 s; B's holds up 10.
        assert_eq!(r(decode_delay_charge(&c, &a, 30)), 0.0188);
        assert_eq!(r(decode_delay_charge(&c, &b, 10)), 0.0063);
        assert_eq!(decode_delay_charge(&c, &cold, 0), 0.0);
        // The future-work charge: every candidate is charged the same
        // floor tokens, scaled by how far its recent share of the fleet's
        // prefill work is above the least share; none when shares are even.
        let on = CostModelConfig { future_work_weight: 1.0, ..c.clone() };
        assert_eq!(future_charge(&on, &a, floor, 0.0), 0.0);
        assert_eq!(r(future_charge(&on, &cold, floor, 0.5)), r(200.0 / 16_000.0 * 0.5));
        assert_eq!(future_charge(&on, &a, floor, 1.0), future_charge(&on, &cold, floor, 1.0));
        // The costs as the decision sums them (the table's last row).
        let total = |p: &Prediction, d| p.cost + decode_delay_charge(&c, p, d);
        assert_eq!(
            [r(total(&a, 30)), r(total(&b, 10)), r(total(&cold, 0))],
            [0.9583, 0.1871, 0.2885]
        );
    }
}
