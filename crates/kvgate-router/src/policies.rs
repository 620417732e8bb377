//! The policies' choices among eligible candidates. `kv_aware` minimises the
//! predicted-TTFT cost; the baselines reproduce what other routers do, so
//! that the replay bench compares like with like through the same ledger.

use std::borrow::Cow;

use kvgate_index::ReplicaId;
use rand::Rng;

use crate::config::PolicyKind;
use crate::decide::RouteRequest;
use crate::explain::{Candidate, Reason};
use crate::router::Router;
use crate::select::{pick_cost, pick_min, Band};

/// Inserts between two LRU trims of the `approx_prefix` memory.
const APPROX_EVICT_EVERY: u64 = 1024;

impl Router {
    /// The chosen index into `cands` and why. `eligible` is non-empty.
    pub(crate) fn choose(
        &mut self,
        policy: PolicyKind,
        req: &RouteRequest<'_>,
        cands: &[Candidate],
        eligible: &[usize],
    ) -> Option<(usize, Reason)> {
        if eligible.len() == 1 {
            return Some((eligible[0], Reason::Only));
        }
        match policy {
            PolicyKind::KvAware => {
                let mut costs = std::mem::take(&mut self.scratch_costs);
                costs.clear();
                costs.extend(eligible.iter().map(|&i| (i, cands[i].score)));
                let c = &self.config;
                let last = &self.last_chosen;
                let attraction = &self.attraction;
                // A request for an adapter some candidate holds in a slot is
                // not fresh: that replica saves the load (select.rs).
                let adapters = &self.adapters;
                let adapter_held = req.adapter.and_then(|a| adapters.id(a)).is_some_and(|a| {
                    eligible.iter().any(|&i| adapters.resident(cands[i].replica, a))
                });
                let order = |i: usize| {
                    let slot = cands[i].replica.index();
                    (attraction.share(slot), last.get(slot).copied().unwrap_or(0))
                };
                let cached = |i: usize| {
                    let c = &cands[i];
                    c.overlap_blocks.iter().sum::<u32>() + c.tentative_blocks
                };
                let r = pick_cost(
                    &costs,
                    c.selection,
                    Band { epsilon: c.epsilon, fresh: (!adapter_held).then_some(c.fresh_epsilon) },
                    c.temperature,
                    &mut self.rng,
                    order,
                    cached,
                );
                self.scratch_costs = costs;
                r
            }
            PolicyKind::LinearBlocks => self.linear_blocks(req, cands, eligible),
            PolicyKind::ApproxPrefix => self.approx_prefix(req, cands, eligible),
            PolicyKind::LeastLoad => {
                self.least_load(cands, eligible).map(|i| (i, Reason::LeastLoad))
            }
            PolicyKind::PowerOfTwo => {
                let a = self.rng.random_range(0..eligible.len());
                let mut b = self.rng.random_range(0..eligible.len() - 1);
                if b >= a {
                    b += 1;
                }
                let pair = [eligible[a], eligible[b]];
                let items: Vec<_> =
                    pair.iter().map(|&i| (i, cands[i].pending_prefill_tokens)).collect();
                pick_min(&items, &mut self.rng).map(|i| (i, Reason::PowerOfTwo))
            }
            PolicyKind::RoundRobin => {
                let i = eligible[self.rr_cursor % eligible.len()];
                self.rr_cursor = self.rr_cursor.wrapping_add(1);
                Some((i, Reason::RoundRobin))
            }
            PolicyKind::Random => {
                let k = self.rng.random_range(0..eligible.len());
                Some((eligible[k], Reason::Random))
            }
            PolicyKind::SessionAffinity => match req.session_key {
                Some(key) => self.rendezvous(key, cands, eligible).map(|i| (i, Reason::Affinity)),
                None => self.least_load(cands, eligible).map(|i| (i, Reason::NoSessionKey)),
            },
        }
    }

    /// Fewest pending prefill tokens, then fewest decoding, ties at random.
    fn least_load(&mut self, cands: &[Candidate], eligible: &[usize]) -> Option<usize> {
        let items: Vec<_> = eligible
            .iter()
            .map(|&i| (i, (cands[i].pending_prefill_tokens, cands[i].decoding)))
            .collect();
        pick_min(&items, &mut self.rng)
    }

    /// Rendezvous (highest random weight) hashing: adding or removing a
    /// replica moves only the sessions that hashed to it.
    fn rendezvous(&self, key: &str, cands: &[Candidate], eligible: &[usize]) -> Option<usize> {
        eligible.iter().copied().max_by_key(|&i| {
            let seed = self.replica_name_hash(cands[i].replica);
            xxhash_rust::xxh3::xxh3_64_with_seed(key.as_bytes(), seed)
        })
    }

    fn replica_name_hash(&self, id: ReplicaId) -> u64 {
        self.replicas.get(id.index()).and_then(Option::as_ref).map_or(0, |r| r.name_hash)
    }

    /// Dynamo's classic cost, `w × prefill_blocks + decode_blocks`, argmin
    /// with random ties (its default temperature 0).
    fn linear_blocks(
        &mut self,
        req: &RouteRequest<'_>,
        cands: &[Candidate],
        eligible: &[usize],
    ) -> Option<(usize, Reason)> {
        let w = self.config.linear_overlap_weight;
        let req_blocks = req.keys.len() as f64;
        let mut costs = std::mem::take(&mut self.scratch_costs);
        costs.clear();
        for &i in eligible {
            let c = &cands[i];
            let bs = self
                .replicas
                .get(c.replica.index())
                .and_then(Option::as_ref)
                .map_or(16.0, |r| f64::from(r.info.block_size));
            let overlap = f64::from(c.overlap_blocks[0]);
            let prefill_blocks = c.pending_prefill_tokens as f64 / bs + (req_blocks - overlap);
            let decode_blocks = c.booked_blocks as f64 + req_blocks;
            costs.push((i, w * prefill_blocks + decode_blocks));
        }
        let r = pick_cost(
            &costs,
            crate::config::Selection::Epsilon,
            Band { epsilon: 0.0, fresh: None },
            1.0,
            &mut self.rng,
            |_| (0.0, 0),
            |_| 0,
        )
        .map(|(i, _)| (i, Reason::LowestCost));
        self.scratch_costs = costs;
        r
    }

    /// SGLang / vLLM-router `cache_aware`: least requests when imbalanced;
    /// else the longest remembered prefix when it covers `cache_threshold`
    /// of the prompt; else the replica with the least remembered text.
    fn approx_prefix(
        &mut self,
        req: &RouteRequest<'_>,
        cands: &[Candidate],
        eligible: &[usize],
    ) -> Option<(usize, Reason)> {
        let a = &self.config.approx;
        let loads: Vec<u32> = eligible.iter().map(|&i| cands[i].requests).collect();
        let (min, max) = (loads.iter().min().copied()?, loads.iter().max().copied()?);
        let imbalanced = max.saturating_sub(min) > a.balance_abs_threshold
            && f64::from(max) > a.balance_rel_threshold * f64::from(min);
        if imbalanced {
            let items: Vec<_> = eligible.iter().map(|&i| (i, cands[i].requests)).collect();
            return pick_min(&items, &mut self.rng).map(|i| (i, Reason::ApproxImbalance));
        }
        let symbols = Self::approx_symbols(req);
        let mut per_tenant = std::mem::take(&mut self.scratch_approx);
        self.approx.match_per_tenant(&symbols, &mut per_tenant);
        let matched = |i: usize| per_tenant.get(cands[i].replica.index()).copied().unwrap_or(0);
        let best = eligible.iter().map(|&i| matched(i)).max().unwrap_or(0);
        let rate = if symbols.is_empty() { 0.0 } else { f64::from(best) / symbols.len() as f64 };
        let r = if best > 0 && rate >= self.config.approx.cache_threshold {
            // Among the best matches, the least loaded.
            let items: Vec<_> = eligible
                .iter()
                .filter(|&&i| matched(i) == best)
                .map(|&i| (i, cands[i].requests))
                .collect();
            pick_min(&items, &mut self.rng).map(|i| (i, Reason::ApproxMatch { matched: rate }))
        } else {
            let items: Vec<_> = eligible
                .iter()
                .map(|&i| (i, self.approx.tenant_size(cands[i].replica.0)))
                .collect();
            pick_min(&items, &mut self.rng).map(|i| (i, Reason::ApproxSmallestTree))
        };
        self.scratch_approx = per_tenant;
        r
    }

    fn approx_symbols<'a>(req: &RouteRequest<'a>) -> Cow<'a, [u32]> {
        match req.approx_symbols {
            Some(s) => Cow::Borrowed(s),
            // Block granularity: fold each 64-bit key into one symbol.
            None => req.keys.iter().map(|k| (k.0 ^ (k.0 >> 32)) as u32).collect(),
        }
    }

    /// Remembers that `replica` was sent this prompt.
    pub(crate) fn remember_approx(&mut self, req: &RouteRequest<'_>, replica: ReplicaId) {
        let symbols = Self::approx_symbols(req);
        self.approx_tick += 1;
        self.approx.insert(&symbols, replica.0, self.approx_tick);
        if self.approx_tick.is_multiple_of(APPROX_EVICT_EVERY) {
            self.approx.evict(self.config.approx.max_tree_symbols);
        }
    }
}
