//! Property tests of the engine model against naive models:
//! block accounting, the event contract the router's index relies on,
//! TTFT monotonicity in virtual time, and shared-prefix hits.

// Test helpers outside #[test] fns: unwrap is the point here.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashSet;
use std::time::Duration;

use kvgate_events::{BlockHash, Event, Medium, Tier};
use kvgate_sim::{Engine, EngineConfig};
use proptest::prelude::*;

#[derive(Clone, Debug)]
enum Op {
    Add { base: usize, suffix: Vec<u32>, max_tokens: u32, min_tokens: u32, ignore_eos: bool },
    Step,
    Abort(u64),
    Reset,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0usize..4, prop::collection::vec(0u32..5, 0..12), 1u32..12, 0u32..4, any::<bool>())
            .prop_map(|(base, suffix, max_tokens, min_tokens, ignore_eos)| Op::Add { base, suffix, max_tokens, min_tokens, ignore_eos }),
        6 => Just(Op::Step),
        1 => (0u64..40).prop_map(Op::Abort),
        1 => Just(Op::Reset),
    ]
}

fn config() -> impl Strategy<Value = EngineConfig> {
    (
        1u32..5,
        2u32..40,
        0u32..10,
        1u32..5,
        1u32..24,
        prop_oneof![Just(0.0), Just(0.3)],
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(|(bs, gpu, cpu, seqs, budget, eos, hash_bytes, self_desc)| EngineConfig {
            block_size: bs,
            num_gpu_blocks: gpu,
            num_cpu_blocks: cpu,
            max_num_seqs: seqs,
            max_num_batched_tokens: budget,
            hash_seed: Some(1),
            hash_bytes,
            self_describing_cpu_events: self_desc,
            eos_probability: eos,
            ..EngineConfig::default()
        })
}

/// Shared prefixes so that requests hit each other's blocks.
fn base_prefix(base: usize) -> Vec<u32> {
    match base {
        0 => vec![],
        1 => (0..6).collect(),
        2 => (0..11).collect(),
        _ => (50..58).collect(),
    }
}

/// The router's view: a naive per-tier set of engine hashes fed by events.
#[derive(Default)]
struct NaiveView {
    gpu: HashSet<BlockHash>,
    cpu: HashSet<BlockHash>,
}

impl NaiveView {
    fn apply(&mut self, ev: &Event) {
        match ev {
            Event::Stored(s) => {
                // Prefix-closed: a GPU store's parent is held when it arrives.
                if Medium::tier(s.medium.as_ref()) == Tier::Gpu {
                    if let Some(parent) = &s.parent_block_hash {
                        assert!(self.gpu.contains(parent), "GPU store with unknown parent");
                    }
                }
                let set = self.tier(s.medium.as_ref());
                set.extend(s.block_hashes.iter().cloned());
            }
            Event::Removed(r) => {
                let set = self.tier(r.medium.as_ref());
                for h in &r.block_hashes {
                    assert!(set.remove(h), "removal of a hash never stored: {h:?}");
                }
            }
            Event::AllCleared => {
                self.gpu.clear();
                self.cpu.clear();
            }
        }
    }

    fn tier(&mut self, medium: Option<&Medium>) -> &mut HashSet<BlockHash> {
        match Medium::tier(medium) {
            Tier::Cpu => &mut self.cpu,
            _ => &mut self.gpu,
        }
    }
}

fn as_set(v: Vec<BlockHash>) -> HashSet<BlockHash> {
    v.into_iter().collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// (1) block accounting never leaks and (2) the events reproduce the
    /// engine's cached-block set per tier after every step; every stream drains.
    #[test]
    fn accounting_and_event_contract(config in config(), ops in prop::collection::vec(op(), 1..120)) {
        let mut e = Engine::new(config).unwrap();
        let mut view = NaiveView::default();
        let mut now = Duration::ZERO;
        let mut next_id = 0u64;
        let check = |e: &mut Engine, view: &mut NaiveView, now: &mut Duration| {
            let out = e.step(*now);
            *now += out.duration;
            for ev in &out.events {
                view.apply(ev);
            }
            e.check_invariants().unwrap();
            prop_assert_eq!(&view.gpu, &as_set(e.gpu_cached_hashes()));
            prop_assert_eq!(&view.cpu, &as_set(e.cpu_cached_hashes()));
            Ok(())
        };
        for op in ops {
            match op {
                Op::Add { base, suffix, max_tokens, min_tokens, ignore_eos } => {
                    let mut prompt = base_prefix(base);
                    prompt.extend(suffix);
                    let _ = e.add_request(next_id, prompt, max_tokens, min_tokens, ignore_eos, now);
                    next_id += 1;
                }
                Op::Step => check(&mut e, &mut view, &mut now)?,
                Op::Abort(id) => {
                    e.abort(id);
                }
                Op::Reset => {
                    e.reset_prefix_cache();
                }
            }
            e.check_invariants().unwrap();
        }
        let mut guard = 0;
        while e.has_work() {
            check(&mut e, &mut view, &mut now)?;
            guard += 1;
            prop_assert!(guard < 20_000, "engine made no progress");
        }
        check(&mut e, &mut view, &mut now)?;
        prop_assert_eq!(e.stats().kv_usage, 0.0);
    }

    /// (3a) On an idle engine, TTFT grows with the number of uncached tokens.
    #[test]
    fn ttft_grows_with_uncached_tokens(a in 16usize..6000, b in 16usize..6000) {
        let (short, long) = (a.min(b), a.max(b));
        prop_assert!(ttft_alone(short) <= ttft_alone(long));
    }

    /// (3b) TTFT of the same request grows with the queue ahead of it.
    #[test]
    fn ttft_grows_with_queue_depth(a in 0usize..12, b in 0usize..12) {
        let (shallow, deep) = (a.min(b), a.max(b));
        prop_assert!(ttft_behind(shallow) <= ttft_behind(deep));
        if deep > shallow {
            prop_assert!(ttft_behind(shallow) < ttft_behind(deep));
        }
    }

    /// (4) Two requests sharing a 2k-token prefix: the second's prefix hit is
    /// at least the shared full blocks, capped so that one token is computed.
    #[test]
    fn shared_2k_prefix_hits(suffix_a in 0usize..40, suffix_b in 0usize..40, seed in any::<u64>()) {
        let mut e = Engine::new(EngineConfig { hash_seed: Some(seed), ..EngineConfig::default() }).unwrap();
        let shared: Vec<u32> = (0..2048).map(|i| (i * 7 + 3) % 50_000).collect();
        let mut pa = shared.clone();
        pa.extend((0..suffix_a as u32).map(|i| 60_000 + i));
        let mut pb = shared.clone();
        pb.extend((0..suffix_b as u32).map(|i| 70_000 + i));
        e.add_request(1, pa, 4, 0, true, Duration::ZERO).unwrap();
        drain(&mut e);
        e.add_request(2, pb.clone(), 4, 0, true, Duration::ZERO).unwrap();
        let first = drain(&mut e).into_iter().find(|t| t.is_first).unwrap();
        let expected = (2048.min(pb.len() - 1) / 16 * 16) as u32;
        prop_assert!(first.cached_tokens >= expected);
        // Nothing beyond the shared prefix can hit (suffixes differ).
        prop_assert_eq!(first.cached_tokens, expected);
        let s = e.stats();
        prop_assert_eq!(s.prefix_cache_hits, u64::from(expected));
    }
}

fn drain(e: &mut Engine) -> Vec<kvgate_sim::TokenOutput> {
    let mut now = Duration::ZERO;
    let mut toks = Vec::new();
    while e.has_work() {
        let out = e.step(now);
        now += out.duration;
        toks.extend(out.tokens);
    }
    toks
}

/// Virtual-time TTFT of request 0, given the engine already holds `pre`.
fn ttft_of(e: &mut Engine, probe: u64) -> Duration {
    let mut now = Duration::ZERO;
    loop {
        let out = e.step(now);
        now += out.duration;
        if out.tokens.iter().any(|t| t.request_id == probe && t.is_first) {
            return now;
        }
        assert!(e.has_work(), "probe never produced a token");
    }
}

fn ttft_alone(n: usize) -> Duration {
    let mut e =
        Engine::new(EngineConfig { hash_seed: Some(0), ..EngineConfig::default() }).unwrap();
    e.add_request(0, (0..n as u32).collect(), 1, 0, true, Duration::ZERO).unwrap();
    ttft_of(&mut e, 0)
}

fn ttft_behind(depth: usize) -> Duration {
    let mut e = Engine::new(EngineConfig {
        hash_seed: Some(0),
        max_num_batched_tokens: 2048,
        ..EngineConfig::default()
    })
    .unwrap();
    for id in 0..depth as u64 {
        let prompt: Vec<u32> = (0..2048).map(|i| id as u32 * 10_000 + i).collect();
        e.add_request(id + 1, prompt, 8, 0, true, Duration::ZERO).unwrap();
    }
    e.add_request(0, (0..512).map(|i| 900_000 + i).collect(), 1, 0, true, Duration::ZERO).unwrap();
    ttft_of(&mut e, 0)
}

#[test]
fn cached_prefix_beats_cold_ttft() {
    let mut e =
        Engine::new(EngineConfig { hash_seed: Some(0), ..EngineConfig::default() }).unwrap();
    let prompt: Vec<u32> = (0..4000).collect();
    e.add_request(1, prompt.clone(), 1, 0, true, Duration::ZERO).unwrap();
    let cold = ttft_of(&mut e, 1);
    e.add_request(2, prompt, 1, 0, true, Duration::ZERO).unwrap();
    let warm = ttft_of(&mut e, 2);
    assert!(warm < cold, "warm {warm:?} vs cold {cold:?}");
}

/// Every step's events survive the wire codec in every vLLM layout, with
/// int and byte hashes, GPU and CPU media.
#[test]
fn events_round_trip_every_layout() {
    for hash_bytes in [false, true] {
        let mut e = Engine::new(EngineConfig {
            block_size: 4,
            num_gpu_blocks: 12,
            num_cpu_blocks: 6,
            max_num_batched_tokens: 16,
            hash_seed: Some(5),
            hash_bytes,
            ..EngineConfig::default()
        })
        .unwrap();
        for id in 0..12u64 {
            let prompt: Vec<u32> =
                (0..(5 + id as u32 % 7) * 3).map(|i| i + (id as u32 % 3) * 100).collect();
            e.add_request(id, prompt, 5, 0, true, Duration::ZERO).unwrap();
        }
        let mut now = Duration::ZERO;
        let mut n_events = 0;
        while e.has_work() {
            let out = e.step(now);
            now += out.duration;
            if out.events.is_empty() {
                continue;
            }
            n_events += out.events.len();
            let batch = kvgate_events::Batch {
                ts: now.as_secs_f64(),
                events: out.events.clone(),
                dp_rank: None,
                skipped_events: 0,
            };
            for layout in kvgate_events::Layout::ALL {
                let bytes = kvgate_events::encode_batch(&batch, layout);
                let back = kvgate_events::decode_batch(&bytes).unwrap();
                assert_eq!(back.events, out.events, "{layout:?}");
            }
        }
        assert!(n_events > 10);
    }
}
