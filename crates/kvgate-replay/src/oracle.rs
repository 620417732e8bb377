//! The physical bounds no router can beat:
//!
//! - the **oracle**: one pooled LRU cache with the whole fleet's capacity
//!   (GPU + CPU blocks of every replica), as if a perfect router could put
//!   every request where its prefix is and the fleet were one cache;
//! - the **ceiling**: a cache of unlimited capacity (every block ever seen
//!   stays);
//! - the **TTFT floor**: each request served alone on a replica that holds
//!   its oracle prefix, with nothing queued or decoding: only its uncached
//!   tokens' prefill, in `max_num_batched_tokens` chunks (each attending over
//!   what precedes it), on the engines' timing model.
//!
//! Both process requests in arrival order and count hits as the engine does:
//! the longest run of cached prompt blocks from the start, capped one token
//! short of the prompt (the engine always recomputes the last token). Then
//! every full block of the prompt is inserted (or touched, most recent
//! last). Only prompt blocks are cached: generated tokens never recur in a
//! trace. Neither depends on the arrival rate.

use kvgate_index::BlockKey;
use rustc_hash::{FxHashMap, FxHashSet};

use crate::workload::Workload;

const NIL: u32 = u32::MAX;

/// An LRU set of block keys with a fixed capacity, O(1) per operation
/// (a hash map into an intrusive doubly linked list).
#[derive(Debug)]
pub struct PooledLru {
    capacity: usize,
    slots: FxHashMap<u64, u32>,
    keys: Vec<u64>,
    prev: Vec<u32>,
    next: Vec<u32>,
    /// Least recently used.
    head: u32,
    /// Most recently used.
    tail: u32,
}

impl PooledLru {
    /// An empty cache of `capacity` blocks.
    pub fn new(capacity: usize) -> PooledLru {
        PooledLru {
            capacity,
            slots: FxHashMap::default(),
            keys: Vec::new(),
            prev: Vec::new(),
            next: Vec::new(),
            head: NIL,
            tail: NIL,
        }
    }

    /// Whether `key` is cached (no recency change).
    pub fn contains(&self, key: u64) -> bool {
        self.slots.contains_key(&key)
    }

    /// Blocks cached.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Whether nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    fn unlink(&mut self, s: u32) {
        let (p, n) = (self.prev[s as usize], self.next[s as usize]);
        if p == NIL {
            self.head = n;
        } else {
            self.next[p as usize] = n;
        }
        if n == NIL {
            self.tail = p;
        } else {
            self.prev[n as usize] = p;
        }
    }

    fn push_back(&mut self, s: u32) {
        self.prev[s as usize] = self.tail;
        self.next[s as usize] = NIL;
        if self.tail == NIL {
            self.head = s;
        } else {
            self.next[self.tail as usize] = s;
        }
        self.tail = s;
    }

    /// Inserts `key` or makes it the most recent, evicting the least recent
    /// block when full.
    pub fn touch(&mut self, key: u64) {
        if self.capacity == 0 {
            return;
        }
        if let Some(&s) = self.slots.get(&key) {
            self.unlink(s);
            self.push_back(s);
            return;
        }
        let s = if self.slots.len() >= self.capacity {
            let s = self.head;
            self.unlink(s);
            self.slots.remove(&self.keys[s as usize]);
            self.keys[s as usize] = key;
            s
        } else {
            self.keys.push(key);
            self.prev.push(NIL);
            self.next.push(NIL);
            (self.keys.len() - 1) as u32
        };
        self.slots.insert(key, s);
        self.push_back(s);
    }
}

/// Hit rates of the bounds over a workload (hit tokens ÷ prompt tokens).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct OracleHitRates {
    /// Pooled LRU with the fleet's total capacity.
    pub oracle: f64,
    /// Unlimited cache.
    pub ceiling: f64,
    /// Mean TTFT floor in ms (`None` when computed without a timing model).
    pub ttft_floor_ms: Option<f64>,
}

/// What the TTFT floor needs about the engines.
#[derive(Clone, Debug)]
pub struct FloorModel {
    /// The engines' timing model.
    pub timing: kvgate_sim::TimingModel,
    /// Their per-step token budget.
    pub max_num_batched_tokens: u32,
}

impl FloorModel {
    /// Milliseconds to prefill `uncached` tokens alone after `cached` ones:
    /// full chunks of the step budget, then the rest, each attending over
    /// what precedes it; the first token comes with the last.
    pub fn prefill_alone_ms(&self, cached: u64, uncached: u64) -> f64 {
        let chunk = u64::from(self.max_num_batched_tokens.max(1));
        let (mut done, mut ms) = (cached, 0.0);
        while done < cached + uncached {
            let n = chunk.min(cached + uncached - done);
            ms += self.timing.prefill_after_ms(n, n * done);
            done += n;
        }
        ms
    }
}

/// Hit tokens for a prompt of `n_tokens` whose first `prefix_blocks` blocks
/// are cached, as the engine counts them.
fn hit_tokens(prefix_blocks: usize, n_tokens: usize, block_size: usize) -> u64 {
    (prefix_blocks * block_size).min(n_tokens.saturating_sub(1)) as u64
}

fn prefix_len(keys: &[BlockKey], cached: impl Fn(u64) -> bool) -> usize {
    keys.iter().take_while(|k| cached(k.get())).count()
}

/// Runs both hit-rate bounds over `workload` with `capacity_blocks` pooled
/// blocks, and the TTFT floor when given the engines' `floor` model.
pub fn oracle_hit_rates(
    workload: &Workload,
    block_size: usize,
    capacity_blocks: usize,
    floor: Option<&FloorModel>,
) -> OracleHitRates {
    oracle_hit_rates_of(workload, block_size, capacity_blocks, floor, |_| true)
}

/// [`oracle_hit_rates`] over the requests `keep` accepts (by index): one
/// model pool's requests against that pool's capacity (`pools.rs`).
pub fn oracle_hit_rates_of(
    workload: &Workload,
    block_size: usize,
    capacity_blocks: usize,
    floor: Option<&FloorModel>,
    keep: impl Fn(usize) -> bool,
) -> OracleHitRates {
    let mut lru = PooledLru::new(capacity_blocks);
    let mut seen: FxHashSet<u64> = FxHashSet::default();
    let (mut total, mut lru_hits, mut ceiling_hits) = (0u64, 0u64, 0u64);
    let (mut floor_ms, mut n) = (0.0, 0usize);
    for (i, r) in workload.requests.iter().enumerate() {
        if !keep(i) {
            continue;
        }
        n += 1;
        let tokens = r.prompt.tokens();
        // The adapter is part of the key: its blocks never serve the base
        // model or another adapter, in the oracle as in the engine.
        let keys = r.block_keys(&tokens, block_size);
        total += tokens.len() as u64;
        let hit = hit_tokens(prefix_len(&keys, |k| lru.contains(k)), tokens.len(), block_size);
        lru_hits += hit;
        if let Some(f) = floor {
            floor_ms += f.prefill_alone_ms(hit, tokens.len() as u64 - hit);
        }
        ceiling_hits +=
            hit_tokens(prefix_len(&keys, |k| seen.contains(&k)), tokens.len(), block_size);
        for k in &keys {
            lru.touch(k.get());
            seen.insert(k.get());
        }
    }
    let rate = |h: u64| if total == 0 { 0.0 } else { h as f64 / total as f64 };
    OracleHitRates {
        oracle: rate(lru_hits),
        ceiling: rate(ceiling_hits),
        ttft_floor_ms: floor.map(|_| floor_ms / n.max(1) as f64),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The obvious model: a vector, most recent last.
    struct NaiveLru {
        capacity: usize,
        order: Vec<u64>,
    }

    impl NaiveLru {
        fn touch(&mut self, key: u64) {
            if self.capacity == 0 {
                return;
            }
            if let Some(p) = self.order.iter().position(|&k| k == key) {
                self.order.remove(p);
            } else if self.order.len() == self.capacity {
                self.order.remove(0);
            }
            self.order.push(key);
        }
    }

    proptest! {
        #[test]
        fn pooled_lru_matches_the_naive_model(
            capacity in 0usize..12,
            ops in prop::collection::vec((0u64..24, any::<bool>()), 0..300),
        ) {
            let mut fast = PooledLru::new(capacity);
            let mut naive = NaiveLru { capacity, order: Vec::new() };
            for (key, is_touch) in ops {
                if is_touch {
                    fast.touch(key);
                    naive.touch(key);
                }
                prop_assert_eq!(fast.contains(key), naive.order.contains(&key));
                prop_assert_eq!(fast.len(), naive.order.len());
            }
            for k in 0..24 {
                prop_assert_eq!(fast.contains(k), naive.order.contains(&k));
            }
        }
    }

    #[test]
    fn bounds_on_a_tiny_workload() {
        use crate::workload::{Prompt, TraceRequest};
        use std::time::Duration;
        let req = |ids: Vec<u64>, len: u32| {
            TraceRequest::plain(
                Duration::ZERO,
                Prompt::Blocks { hash_ids: ids, input_length: len },
                1,
            )
        };
        // 1024 tokens = 64 blocks each; the second repeats the first exactly.
        let w = Workload {
            name: "t".into(),
            requests: vec![req(vec![1, 2], 1024), req(vec![1, 2], 1024), req(vec![3, 4], 1024)],
            ..Workload::default()
        };
        let unlimited = oracle_hit_rates(&w, 16, 1 << 20, None);
        // Second request: all but the last token → 1023 of 3072.
        assert!((unlimited.ceiling - 1023.0 / 3072.0).abs() < 1e-12);
        assert_eq!(unlimited.oracle, unlimited.ceiling);
        // 32 blocks of capacity keep only the second half: no prefix hit.
        let small = oracle_hit_rates(&w, 16, 32, None);
        assert_eq!(small.oracle, 0.0);
        assert!((small.ceiling - unlimited.ceiling).abs() < 1e-12);
        assert_eq!(small.ttft_floor_ms, None);
        // The floor: 3 ms + 1 ms per token, 512-token steps. Unlimited: 1024,
        // 1 and 1024 tokens to compute (2 chunks + 2 chunks + 1 token).
        let f = FloorModel {
            timing: kvgate_sim::TimingModel {
                prefill_quadratic_ms: 0.0,
                prefill_linear_ms: 1.0,
                prefill_const_ms: 3.0,
                decode_quadratic_ms: 0.0,
                decode_linear_ms: 0.0,
                decode_const_ms: 0.0,
                decode_per_seq_ms: 0.0,
                prefill_context_ms: 0.0,
                decode_context_ms: 0.0,
            },
            max_num_batched_tokens: 512,
        };
        assert_eq!(f.prefill_alone_ms(0, 1024), 2.0 * 515.0);
        assert_eq!(f.prefill_alone_ms(1023, 1), 4.0);
        assert_eq!(f.prefill_alone_ms(5, 0), 0.0);
        // A context term charges each chunk for the tokens before it.
        let ctx = FloorModel {
            timing: kvgate_sim::TimingModel { prefill_context_ms: 0.001, ..f.timing.clone() },
            ..f.clone()
        };
        let pairs = 512.0 * 100.0 + 512.0 * 612.0;
        assert!((ctx.prefill_alone_ms(100, 1024) - (2.0 * 515.0 + 0.001 * pairs)).abs() < 1e-9);
        let b = oracle_hit_rates(&w, 16, 1 << 20, Some(&f));
        assert_eq!(b.ttft_floor_ms, Some((1030.0 + 4.0 + 1030.0) / 3.0));
        assert_eq!(b.oracle, unlimited.oracle);
    }
}
