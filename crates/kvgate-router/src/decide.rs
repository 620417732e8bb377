//! One decision: gather every replica's candidate row (overlap, load,
//! prediction), apply admission, let the policy choose, book the winner.
//! Every policy goes through this one path, so none can skip the ledger.

use std::sync::Arc;
use std::time::{Duration, Instant};

use kvgate_index::{BlockKey, Index, PrefixMatch, ReplicaId};

use crate::adapters::AdapterId;
use crate::calibrate::SampleBasis;
use crate::config::{AdmissionMode, PolicyKind};
use crate::cost::{
    decode_delay_charge, future_charge, predict, work_charge, CostInputs, Prediction,
};
use crate::explain::{Candidate, Explanation, Reason};
use crate::ledger::{Booking, RouteView};
use crate::replica::Health;
use crate::router::{Router, RouterMetrics};

/// What the router needs to know about a request.
#[derive(Clone, Copy, Debug, Default)]
pub struct RouteRequest<'a> {
    /// Prompt length in tokens.
    pub prompt_tokens: u64,
    /// The prompt's block keys (full blocks, from `kvgate_index::block_keys`).
    pub keys: &'a [BlockKey],
    /// The request's `max_tokens`, if given.
    pub max_output_tokens: Option<u32>,
    /// Session key for `session_affinity` (a header or the `user` field).
    pub session_key: Option<&'a str>,
    /// What `approx_prefix` remembers: the prompt's characters as `u32`, or
    /// its token ids. Without it, the block keys are used (block granularity).
    pub approx_symbols: Option<&'a [u32]>,
    /// When the request first asked and was told to wait, if it was.
    pub queued_since: Option<Instant>,
    /// Replicas not to use for this request (a retry after they failed it).
    pub exclude: &'a [ReplicaId],
    /// The LoRA adapter the request names, if any: replicas that hold it in
    /// a GPU slot skip its load (`adapters.rs`).
    pub adapter: Option<&'a str>,
    /// Set on the decode hop of a disaggregated request (`disagg.rs`): its
    /// prompt's KV arrives from a prefill replica at this many seconds per
    /// token not cached on the candidate, instead of being prefilled there.
    pub remote_kv_s_per_token: Option<f64>,
    /// The request already runs on the one replica not excluded (an
    /// endpoint picker's gateway retried it there): it is booked there
    /// whatever that replica's load, since no wait or refusal can move it
    /// any more. Only a replica that is down or unknown refuses it.
    pub already_running: bool,
}

/// Why a request was not routed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RejectReason {
    /// No replica is routable (none registered, or all down).
    NoReplica,
    /// Every replica is busy and waiting is not allowed or took too long.
    AllBusy,
}

/// A routed request.
#[derive(Debug)]
pub struct Routed {
    /// The chosen replica.
    pub replica: ReplicaId,
    /// Its ledger booking; finish it (or drop it) when the request ends.
    pub booking: Booking,
    /// The model's TTFT prediction there, seconds.
    pub predicted_ttft_s: f64,
    /// Prefix blocks counted as cached there (events plus tentative).
    pub cached_blocks: u32,
    /// The decision's explanation, when the decision log is on.
    pub explanation: Option<Arc<Explanation>>,
}

/// A decision previewed by [`Router::peek`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Peek {
    /// The replica `decide` would most likely choose.
    pub replica: ReplicaId,
    /// Its cost (what the policy minimises, in seconds for `kv_aware`).
    pub cost: f64,
    /// The model's TTFT prediction there, seconds.
    pub predicted_ttft_s: f64,
    /// Prefix blocks counted as cached there (events plus tentative).
    pub cached_blocks: u32,
    /// Prompt tokens it would compute (or, for a decode hop, still compute
    /// after the transfer).
    pub uncached_tokens: u64,
    /// Its tokens per block.
    pub block_size: u32,
    /// Seconds of the request's own prefill there.
    pub prefill_s: f64,
    /// Requests there still waiting for their first token.
    pub awaiting_first_token: u32,
}

/// The outcome of a decision.
#[derive(Debug)]
pub enum Decision {
    /// Send it here.
    Routed(Routed),
    /// Every replica is busy: retry after this long, passing `queued_since`.
    Wait {
        /// When to ask again.
        retry_after: Duration,
    },
    /// Give up; the hint is for a `Retry-After` header.
    Reject {
        /// Why.
        reason: RejectReason,
        /// When a retry might succeed.
        retry_after: Duration,
    },
}

impl Decision {
    /// The routed request, if any.
    pub fn routed(self) -> Option<Routed> {
        match self {
            Decision::Routed(r) => Some(r),
            _ => None,
        }
    }
}

impl Router {
    /// Decides where `req` goes, matching its keys against `index` (whose
    /// replica ids are this router's).
    pub fn decide(&mut self, req: &RouteRequest<'_>, index: &Index, now: Instant) -> Decision {
        let mut matches = std::mem::take(&mut self.scratch_matches);
        index.find_matches(req.keys, &mut matches);
        self.maintain(now, Some(index));
        let d = self.decide_inner(req, &matches, now);
        self.scratch_matches = matches;
        d
    }

    /// Decides with prefix matches computed elsewhere (`matches[id.index()]`
    /// as `Index::find_matches` returns them; missing entries count as none).
    pub fn decide_with_matches(
        &mut self,
        req: &RouteRequest<'_>,
        matches: &[PrefixMatch],
        now: Instant,
    ) -> Decision {
        self.maintain(now, None);
        self.decide_inner(req, matches, now)
    }

    /// What [`Router::decide`] would weigh for `req`, without booking
    /// anything: the cheapest usable, non-busy replica by the policy's cost
    /// (no random selection among near-equals), or `None` if there is none.
    /// The disaggregation planner compares such previews across pools.
    pub fn peek(&mut self, req: &RouteRequest<'_>, index: &Index, now: Instant) -> Option<Peek> {
        let mut matches = std::mem::take(&mut self.scratch_matches);
        index.find_matches(req.keys, &mut matches);
        self.maintain(now, Some(index));
        let mut cands = std::mem::take(&mut self.scratch_cands);
        let mut preds = std::mem::take(&mut self.scratch_preds);
        cands.clear();
        preds.clear();
        let adapter = req.adapter.and_then(|a| self.adapters.intern(a));
        self.gather(req, adapter, &matches, now, &mut cands, &mut preds);
        let best = cands
            .iter()
            .zip(&preds)
            .filter(|(c, _)| {
                c.health != Health::Down && !c.busy && !req.exclude.contains(&c.replica)
            })
            .min_by(|a, b| a.0.score.total_cmp(&b.0.score))
            .map(|(c, p)| Peek {
                replica: c.replica,
                cost: c.score,
                predicted_ttft_s: p.ttft_s,
                cached_blocks: c.overlap_blocks.iter().sum::<u32>() + c.tentative_blocks,
                uncached_tokens: p.uncached_tokens,
                block_size: self.block_size(c.replica),
                prefill_s: p.prefill_s,
                awaiting_first_token: c.requests.saturating_sub(c.decoding),
            });
        self.scratch_matches = matches;
        self.scratch_cands = cands;
        self.scratch_preds = preds;
        best
    }

    fn decide_inner(
        &mut self,
        req: &RouteRequest<'_>,
        matches: &[PrefixMatch],
        now: Instant,
    ) -> Decision {
        let policy = self.config.policy;
        let mut cands = std::mem::take(&mut self.scratch_cands);
        let mut preds = std::mem::take(&mut self.scratch_preds);
        preds.clear();
        cands.clear();
        let adapter = req.adapter.and_then(|a| self.adapters.intern(a));
        self.gather(req, adapter, matches, now, &mut cands, &mut preds);

        let usable = |c: &Candidate| c.health != Health::Down && !req.exclude.contains(&c.replica);
        let routable = cands.iter().filter(|c| usable(c)).count();
        let mut eligible = std::mem::take(&mut self.scratch_eligible);
        eligible.clear();
        let open = |c: &Candidate| !c.busy || req.already_running;
        eligible.extend((0..cands.len()).filter(|&i| usable(&cands[i]) && open(&cands[i])));
        let outcome = if routable == 0 {
            Err((Reason::NoReplica, RejectReason::NoReplica))
        } else if eligible.is_empty() {
            let waited =
                req.queued_since.map_or(Duration::ZERO, |t| now.saturating_duration_since(t));
            let may_wait = self.config.admission == AdmissionMode::Queue
                && waited < Duration::from_millis(self.config.max_queue_wait_ms);
            if may_wait {
                Err((Reason::AllBusyWait, RejectReason::AllBusy))
            } else {
                Err((Reason::AllBusyReject, RejectReason::AllBusy))
            }
        } else {
            Ok(self.choose(policy, req, &cands, &eligible))
        };

        let poll = Duration::from_millis(self.config.queue_poll_ms);
        let decision = match outcome {
            Ok(Some((i, reason))) => {
                let (pred, c) = (preds[i], cands[i]);
                let cached = c.overlap_blocks.iter().sum::<u32>() + c.tentative_blocks;
                let load_s = adapter.map_or(0.0, |a| self.adapter_load_s(c.replica, a));
                // A decode hop's first token waits for another replica's
                // prefill and a transfer: no sample of this one's speed.
                let basis = req.remote_kv_s_per_token.is_none().then_some(SampleBasis {
                    prefill_tokens: c.pending_prefill_tokens + pred.uncached_tokens,
                    lower_blocks: [c.overlap_blocks[1], c.overlap_blocks[2]],
                    other_s: pred.interference_s + (pred.adapter_s - load_s).max(0.0),
                    adapter_load: load_s > 0.0,
                });
                let block_size = self.block_size(c.replica);
                let blocks = new_blocks(req, cached, block_size, self.output_tokens(req));
                let id = self.books.book_local(
                    c.replica,
                    pred.uncached_tokens,
                    blocks,
                    basis,
                    adapter,
                    now,
                );
                let booking = Booking::new(id, c.replica);
                if let Some(a) = adapter {
                    let slots = self.adapters.max_loras(c.replica) > 0;
                    if self.adapters.touch(c.replica, a) && slots {
                        RouterMetrics::inc(&self.metrics.adapter_loads);
                    }
                }
                if policy == PolicyKind::KvAware && c.health == Health::Healthy {
                    let from = (cached as usize).min(req.keys.len());
                    self.tentative.add(c.replica, &req.keys[from..], now);
                    if let Some(out) = &mut self.tentative_outbox {
                        if out.len() < crate::router::TENTATIVE_OUTBOX_MAX {
                            out.push((c.replica, req.keys[from..].to_vec()));
                        } else {
                            self.tentative_outbox_dropped += 1;
                        }
                    }
                }
                if policy == PolicyKind::ApproxPrefix {
                    self.remember_approx(req, c.replica);
                }
                RouterMetrics::inc(&self.metrics.routed);
                RouterMetrics::inc(&self.metrics.routed_by_reason[reason.index()]);
                let slot = c.replica.index();
                if self.last_chosen.len() <= slot {
                    self.last_chosen.resize(slot + 1, 0);
                }
                self.decisions += 1;
                self.last_chosen[slot] = self.decisions;
                let floor = preds.iter().map(|p| p.uncached_tokens).min().unwrap_or(0);
                // A decode hop's prompt was computed elsewhere: it is
                // neither work given to this replica nor reuse found here.
                if req.remote_kv_s_per_token.is_none() {
                    self.attraction.record(
                        slot,
                        self.order.iter().map(|id| id.index()),
                        pred.uncached_tokens,
                        req.prompt_tokens,
                        floor,
                    );
                }
                if req.queued_since.is_some() {
                    RouterMetrics::inc(&self.metrics.routed_after_wait);
                }
                let explanation =
                    self.log_decision(req, &cands, Some((c.replica, id)), reason, now);
                Decision::Routed(Routed {
                    replica: c.replica,
                    booking,
                    predicted_ttft_s: c.predicted_ttft_s,
                    cached_blocks: cached,
                    explanation,
                })
            }
            Ok(None) => {
                // Unreachable in practice (eligible was non-empty); treat as busy.
                RouterMetrics::inc(&self.metrics.rejected);
                self.log_decision(req, &cands, None, Reason::AllBusyReject, now);
                Decision::Reject { reason: RejectReason::AllBusy, retry_after: poll }
            }
            Err((reason, why)) => {
                // A waiter's re-polls: its first Wait is in the log already
                // and its outcome will be; the polls in between would only
                // push real decisions out of it.
                let repoll = reason == Reason::AllBusyWait && req.queued_since.is_some();
                if !repoll {
                    self.log_decision(req, &cands, None, reason, now);
                }
                if reason == Reason::AllBusyWait {
                    RouterMetrics::inc(&self.metrics.waits);
                    Decision::Wait { retry_after: poll }
                } else {
                    RouterMetrics::inc(&self.metrics.rejected);
                    let retry_after = if why == RejectReason::NoReplica {
                        Duration::from_secs(1)
                    } else {
                        poll.max(Duration::from_secs(1))
                    };
                    Decision::Reject { reason: why, retry_after }
                }
            }
        };
        self.scratch_cands = cands;
        self.scratch_preds = preds;
        self.scratch_eligible = eligible;
        decision
    }

    /// Fills one candidate row and one prediction per registered replica.
    fn gather(
        &self,
        req: &RouteRequest<'_>,
        adapter: Option<AdapterId>,
        matches: &[PrefixMatch],
        now: Instant,
        cands: &mut Vec<Candidate>,
        preds: &mut Vec<Prediction>,
    ) {
        let cfg = &self.config;
        let books = &self.books;
        let avg_tokens = books.avg_prefill_tokens();
        let out_tokens = self.output_tokens(req);
        let stale_before = self.stale_before(now);
        let pooled = books.pooled_calibration();
        for &id in &self.order {
            let Some(r) = self.replicas.get(id.index()).and_then(Option::as_ref) else { continue };
            let Some(view) = books.route_view(id, pooled.as_ref()) else { continue };
            let mut m = matches.get(id.index()).copied().unwrap_or_default();
            if r.health != Health::Healthy {
                // A view being rebuilt is not evidence of cached blocks.
                m = PrefixMatch::default();
            }
            let tentative = if cfg.policy == PolicyKind::KvAware && r.health == Health::Healthy {
                self.tentative.extension(id, req.keys, m.total as usize)
            } else {
                0
            };
            let report = Router::fresh_report(r, stale_before);
            let (load, (external_requests, external_waiting)) = (view.load(), view.external());
            let queue_tokens =
                load.pending_prefill_tokens + (f64::from(external_waiting) * avg_tokens) as u64;
            let decoding =
                load.decoding_requests + external_requests.saturating_sub(external_waiting);
            let cap = r.info.capacity_blocks[0];
            let reported_used = report.map_or(0, |rep| (rep.kv_usage.max(0.0) * cap as f64) as u64);
            let cached_blocks = m.total + tentative;
            let new_blocks = new_blocks(req, cached_blocks, r.info.block_size, out_tokens);
            let mut x = CostInputs {
                prompt_tokens: req.prompt_tokens,
                block_size: r.info.block_size,
                cached_blocks,
                lower_blocks: [m.cpu, m.storage],
                queue_tokens,
                decoding,
                kv_used_blocks: reported_used.max(load.booked_blocks),
                kv_new_blocks: new_blocks,
                kv_capacity_blocks: cap,
                max_num_batched_tokens: r.info.max_num_batched_tokens,
                prefill_s_per_token: view.cal.prefill_s_per_token,
                overhead_s: view.cal.overhead_s,
                transfer_s_per_block: if m.cpu > 0 || m.storage > 0 {
                    view.transfer_s_per_block()
                } else {
                    [0.0; 2]
                },
                decode_step_s: view.cal.decode_step_s,
                adapter_s: adapter.map_or(0.0, |a| self.adapter_wait_s(id, a, &view, out_tokens)),
                received_s: 0.0,
            };
            if let Some(s_per_token) = req.remote_kv_s_per_token {
                remote_kv_inputs(&mut x, s_per_token);
            }
            let pred = predict(&cfg.cost, &x);
            let busy_tokens = cfg.busy_pending_tokens > 0 && queue_tokens > cfg.busy_pending_tokens;
            let busy_kv = cfg.busy_kv_usage < 1.0
                && report.is_some_and(|rep| rep.kv_usage >= cfg.busy_kv_usage);
            cands.push(Candidate {
                replica: id,
                health: r.health,
                busy: busy_tokens || busy_kv,
                overlap_blocks: [m.gpu, m.cpu, m.storage],
                tentative_blocks: tentative,
                pending_prefill_tokens: queue_tokens,
                decoding,
                requests: load.requests() + external_requests,
                booked_blocks: load.booked_blocks,
                predicted_ttft_s: pred.ttft_s,
                score: pred.cost,
            });
            preds.push(pred);
        }
        // The fleet-work charge (relative to the best placement), the
        // decode-delay charge and the future-work charge (cost.rs).
        let floor = preds.iter().map(|p| p.uncached_tokens).min().unwrap_or(0);
        let share = |c: &Candidate| self.attraction.share(c.replica.index());
        let total: f64 = cands.iter().map(share).sum();
        let least = cands.iter().map(share).fold(f64::INFINITY, f64::min);
        let n = cands.len() as f64;
        // Later turns exist only where routed work gets reused: scaled by
        // the recent reuse ratio, the charge vanishes on traffic without it.
        let reuse = self.attraction.reuse();
        for (c, p) in cands.iter_mut().zip(preds.iter_mut()) {
            let busy = c.pending_prefill_tokens > 0 || c.decoding > 0;
            let excess = if total > 0.0 { reuse * n * (share(c) - least) / total } else { 0.0 };
            let w = work_charge(&cfg.cost, p, floor, busy)
                + decode_delay_charge(&cfg.cost, p, c.decoding)
                // An idle replica delays nobody's future turns.
                + future_charge(&cfg.cost, p, floor, if busy { excess } else { 0.0 });
            p.cost += w;
            c.score += w;
        }
    }

    /// Seconds a request for `adapter` waits on `replica` before its
    /// prefill (`adapters.rs`): the load when no slot holds it, plus, when
    /// every slot is held by other adapters' requests in flight, about half
    /// a request's decode (until the first of them finishes and frees one).
    /// Nothing where the slot count is unknown.
    fn adapter_wait_s(
        &self,
        replica: ReplicaId,
        adapter: AdapterId,
        view: &RouteView<'_>,
        out_tokens: u64,
    ) -> f64 {
        let slots = self.adapters.max_loras(replica);
        if slots == 0 {
            return 0.0;
        }
        let cost = &self.config.cost;
        let load = self.adapter_load_s(replica, adapter);
        let (running, others) = view.adapters_in_flight(adapter);
        let wait = if !running && others >= slots {
            let step = view.cal.decode_step_s.unwrap_or(cost.decode_step_ms * 1e-3);
            0.5 * out_tokens as f64 * step
        } else {
            0.0
        };
        load + wait
    }

    /// Seconds loading `adapter` on `replica` would take: none where a slot
    /// holds it or the slot count is unknown, else the calibrated load
    /// (`router.cost.adapter_load_ms` until TTFTs have been observed).
    fn adapter_load_s(&self, replica: ReplicaId, adapter: AdapterId) -> f64 {
        if self.adapters.max_loras(replica) == 0 || self.adapters.resident(replica, adapter) {
            0.0
        } else {
            self.books.adapter_load_s()
        }
    }

    /// The candidate rows a logged decision keeps: all of them, or the
    /// `explain_candidates` cheapest (the chosen one always), in replica
    /// order.
    fn kept_candidates(&self, cands: &[Candidate], chosen: Option<ReplicaId>) -> Vec<Candidate> {
        let cap = self.config.explain_candidates;
        if cap == 0 || cands.len() <= cap {
            return cands.to_vec();
        }
        let mut idx: Vec<usize> = (0..cands.len()).collect();
        idx.select_nth_unstable_by(cap - 1, |&a, &b| cands[a].score.total_cmp(&cands[b].score));
        idx.truncate(cap);
        if let Some(at) = chosen.and_then(|id| cands.iter().position(|c| c.replica == id)) {
            if !idx.contains(&at) {
                idx[cap - 1] = at;
            }
        }
        idx.sort_unstable();
        idx.into_iter().map(|i| cands[i]).collect()
    }

    /// Output tokens a request is expected to produce.
    fn output_tokens(&self, req: &RouteRequest<'_>) -> u64 {
        u64::from(req.max_output_tokens.unwrap_or(self.config.cost.default_output_tokens))
    }

    /// A registered replica's block size (1 if it is gone).
    fn block_size(&self, id: ReplicaId) -> u32 {
        self.replicas.get(id.index()).and_then(Option::as_ref).map_or(1, |r| r.info.block_size)
    }

    fn log_decision(
        &mut self,
        req: &RouteRequest<'_>,
        cands: &[Candidate],
        chosen: Option<(ReplicaId, u64)>,
        reason: Reason,
        now: Instant,
    ) -> Option<Arc<Explanation>> {
        if !self.log.enabled() {
            return None;
        }
        let e = Arc::new(Explanation {
            at: now,
            booking: chosen.map(|c| c.1),
            policy: self.config.policy,
            prompt_tokens: req.prompt_tokens,
            prompt_blocks: req.keys.len() as u32,
            chosen: chosen.map(|c| c.0),
            reason,
            candidates: self.kept_candidates(cands, chosen.map(|c| c.0)),
            candidates_total: cands.len() as u32,
        });
        self.log.push(e.clone());
        Some(e)
    }
}

/// A decode hop's inputs (`RouteRequest::remote_kv_s_per_token`): the
/// prompt tokens the candidate lacks arrive by transfer (vLLM's connector
/// pulls only those), so it prefills just the partial last block; it joins
/// the next step rather than the prefill queue, so at most one step's
/// budget of queued prefill is ahead of it.
pub(crate) fn remote_kv_inputs(x: &mut CostInputs, s_per_token: f64) {
    let bs = u64::from(x.block_size.max(1));
    let missing = x.prompt_tokens.saturating_sub(u64::from(x.cached_blocks) * bs);
    x.received_s = s_per_token.max(0.0) * missing as f64;
    x.cached_blocks = (x.prompt_tokens / bs) as u32;
    x.lower_blocks = [0, 0];
    x.transfer_s_per_block = [0.0; 2];
    x.queue_tokens = x.queue_tokens.min(u64::from(x.max_num_batched_tokens));
}

/// KV blocks a request adds on a replica that holds `cached_blocks` of its
/// prefix: its uncached prompt plus its expected output.
fn new_blocks(req: &RouteRequest<'_>, cached_blocks: u32, block_size: u32, out_tokens: u64) -> u64 {
    let bs = u64::from(block_size.max(1));
    let uncached = req.prompt_tokens.saturating_sub(u64::from(cached_blocks) * bs);
    (uncached + out_tokens).div_ceil(bs)
}
