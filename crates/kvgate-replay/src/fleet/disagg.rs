//! The prefill/decode fleet's part of the event loop (`FleetSpec::disagg`):
//! pool 0 prefills, pool 1 decodes, and the fleet core plans each request
//! (`kvgate_fleet::Fleet::plan`, as `kvgate serve` plans a `[disagg]`
//! pool's). A split request runs as vLLM's NIXL connector runs it:
//!
//! 1. the prefill hop (`max_tokens` 1) on its prefill engine, whose blocks
//!    stay held when it finishes (`Engine::set_hold_blocks`);
//! 2. the transfer: the prompt tokens the decode engine lacks at that
//!    moment × KV bytes per token ÷ bandwidth (the connector pulls only
//!    what the decode side does not cache); at its end the prefill engine
//!    frees the blocks (they stay cached) and the decode engine's NIXL
//!    totals count it, which the planner learns at the next scrape;
//! 3. the decode hop on its decode engine, which loads the transferred KV
//!    and computes only the last prompt token (`Engine::set_remote_kv`);
//!    its first token is the request's.
//!
//! A bypassed request runs whole on its decode engine, as in an aggregated
//! fleet; one planned whole on a prefill engine (`whole_on_prefill`) runs
//! whole there. The decode engine's blocks are announced when the hop is
//! admitted, as vLLM announces them when the pull completes.

use std::time::{Duration, Instant};

use kvgate_index::BlockKey;
use kvgate_router::{Booking, Outcome, PdCounts, PdPlan, RouteRequest};
use kvgate_sim::CacheIdentity;

use super::{Delivery, Fleet, Record};

/// Prefill hops run on their engine under the request's index with this
/// bit set, so their token is told apart from a whole request's.
pub(super) const PREFILL_HOP: u64 = 1 << 62;

/// A split request between its plan and its decode hop's admission.
#[derive(Debug)]
pub(super) struct SplitHop {
    prefill_replica: usize,
    prefill_booking: Booking,
    decode_replica: usize,
    tokens: Vec<u32>,
    output_tokens: u32,
    /// Set when the prefill hop is done: tokens transferred, and when.
    transfer: Option<(u64, Duration)>,
}

impl Fleet {
    /// Plans, books and starts request `i` on a P/D fleet.
    pub(super) fn arrive_disagg(
        &mut self,
        i: usize,
        tokens: Vec<u32>,
        output_tokens: u32,
        keys: &[BlockKey],
        mut rec: Record,
    ) {
        let at = rec.arrival;
        let now = self.base + at;
        let req = RouteRequest {
            prompt_tokens: tokens.len() as u64,
            keys,
            max_output_tokens: Some(output_tokens),
            approx_symbols: Some(&tokens),
            ..RouteRequest::default()
        };
        rec.best_indexed_blocks = self.best_indexed(1, keys);
        let t0 = Instant::now();
        let plan = self.core.plan(0, &req, now);
        rec.decide_ns = t0.elapsed().as_nanos() as u64;
        let Some(plan) = plan else { return self.unserved_record(rec) };
        match plan {
            Ok(PdPlan::Aggregated(routed)) => {
                self.start_whole(1, i, tokens, output_tokens, routed, rec)
            }
            Ok(PdPlan::OnPrefill(routed)) => {
                self.start_whole(0, i, tokens, output_tokens, routed, rec)
            }
            Ok(PdPlan::Split { prefill, decode }) => {
                let (Some(pg), Some(dg)) =
                    (self.global(0, prefill.replica), self.global(1, decode.replica))
                else {
                    self.core.finish(prefill.booking, Outcome::Error);
                    self.core.finish(decode.booking, Outcome::Error);
                    return self.unserved_record(rec);
                };
                rec.routed_cached_blocks = prefill.cached_blocks;
                rec.split = true;
                rec.predicted_ttft_s = prefill.predicted_ttft_s + decode.predicted_ttft_s;
                let hop_tokens = tokens.clone();
                if self.start(pg, i as u64 | PREFILL_HOP, hop_tokens, 1, at, true) {
                    rec.replica = Some(dg);
                    self.bookings.insert(i, decode.booking);
                    self.hops.insert(
                        i,
                        SplitHop {
                            prefill_replica: pg,
                            prefill_booking: prefill.booking,
                            decode_replica: dg,
                            tokens,
                            output_tokens,
                            transfer: None,
                        },
                    );
                } else {
                    self.core.finish(prefill.booking, Outcome::Error);
                    self.core.finish(decode.booking, Outcome::Error);
                    self.unserved += 1;
                }
                self.records.push(rec);
            }
            Err(_) => self.unserved_record(rec),
        }
    }

    /// Starts request `i` whole on the replica of pool `pool` (1 decodes, 0
    /// prefills) that `routed` names.
    fn start_whole(
        &mut self,
        pool: usize,
        i: usize,
        tokens: Vec<u32>,
        output_tokens: u32,
        routed: kvgate_router::Routed,
        mut rec: Record,
    ) {
        let Some(g) = self.global(pool, routed.replica) else {
            self.core.finish(routed.booking, Outcome::Error);
            return self.unserved_record(rec);
        };
        rec.routed_cached_blocks = routed.cached_blocks;
        rec.predicted_ttft_s = routed.predicted_ttft_s;
        if self.start(g, i as u64, tokens, output_tokens, rec.arrival, false) {
            rec.replica = Some(g);
            self.bookings.insert(i, routed.booking);
        } else {
            self.core.finish(routed.booking, Outcome::Error);
            self.unserved += 1;
        }
        self.records.push(rec);
    }

    /// The fleet-wide replica the core calls `id`, when it is in `pool`.
    fn global(&self, pool: usize, id: kvgate_index::ReplicaId) -> Option<usize> {
        self.position(id).filter(|&g| self.pool_of[g] == pool)
    }

    fn unserved_record(&mut self, rec: Record) {
        self.unserved += 1;
        self.records.push(rec);
    }

    /// Adds a request (or hop) to engine `g`; false if the engine refused it.
    fn start(
        &mut self,
        g: usize,
        id: u64,
        tokens: Vec<u32>,
        max_tokens: u32,
        at: Duration,
        hold: bool,
    ) -> bool {
        if !self.engines[g].has_work() {
            self.clocks[g] = self.clocks[g].max(at);
        }
        let len = tokens.len();
        let engine = &mut self.engines[g];
        let mut added = engine.add_request(id, tokens, max_tokens, max_tokens, true, at);
        if added.is_ok() && hold {
            added = engine.set_hold_blocks(id);
        }
        if added.is_err() {
            engine.abort(id);
            return false;
        }
        self.trackers[g].add(id, len, at);
        true
    }

    /// The prefill hop's token: its booking ends, and the transfer of what
    /// the decode engine lacks starts.
    pub(super) fn prefill_done(&mut self, request: usize, cached_tokens: u32, at: Duration) {
        let Some(hop) = self.hops.get_mut(&request) else { return };
        let now = self.base + at;
        self.core.first_token(hop.prefill_booking, now);
        self.core.finish(hop.prefill_booking, Outcome::Finished);
        self.records[request].cached_tokens = cached_tokens;
        let have = self.engines[hop.decode_replica]
            .prefix_hit_tokens(&hop.tokens, &CacheIdentity::default());
        let missing = hop.tokens.len().saturating_sub(1).saturating_sub(have) as u64;
        let delay = Duration::from_secs_f64(missing as f64 * self.transfer_s_per_token);
        hop.transfer = Some((missing, at));
        self.schedule(at + delay, Delivery::Transfer { request });
    }

    /// The transfer's end: the prefill engine lets the blocks go, and the
    /// decode hop joins its engine.
    pub(super) fn transfer_done(&mut self, request: usize, at: Duration) {
        let Some(hop) = self.hops.remove(&request) else { return };
        self.engines[hop.prefill_replica].release_held(request as u64 | PREFILL_HOP);
        if let Some((tokens, since)) = hop.transfer {
            let secs = at.saturating_sub(since).as_secs_f64();
            self.transfers.push((tokens, secs));
            if let Some(t) = &mut self.transfer_totals[hop.decode_replica] {
                t.count += 1.0;
                t.seconds += secs;
                t.bytes += tokens as f64 * self.kv_bytes_per_token;
            }
        }
        let (g, id) = (hop.decode_replica, request as u64);
        let started = self.start(g, id, hop.tokens, hop.output_tokens, at, false)
            && self.engines[g].set_remote_kv(id).is_ok();
        if !started {
            self.engines[g].abort(id);
            if let Some(b) = self.bookings.remove(&request) {
                self.core.finish(b, Outcome::Error);
            }
            self.records[request].replica = None;
            self.unserved += 1;
        }
    }

    /// The planner's counts (`None` on an aggregated fleet).
    pub fn disagg_counts(&self) -> Option<PdCounts> {
        self.core.pd_counts(0).filter(|_| self.disagg)
    }
}
