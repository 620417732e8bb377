//! Unit tests of the engine: scheduling, caching, events, preemption, CPU tier.

use super::*;

pub(super) fn cfg(num_gpu_blocks: u32) -> EngineConfig {
    EngineConfig {
        block_size: 4,
        num_gpu_blocks,
        max_num_seqs: 8,
        max_num_batched_tokens: 64,
        hash_seed: Some(7),
        ..EngineConfig::default()
    }
}

fn run_to_end(e: &mut Engine) -> (Vec<TokenOutput>, Vec<Event>, Duration) {
    let mut now = Duration::ZERO;
    let (mut toks, mut evs) = (Vec::new(), Vec::new());
    let mut guard = 0;
    while e.has_work() {
        let out = e.step(now);
        now += out.duration;
        toks.extend(out.tokens);
        evs.extend(out.events);
        e.check_invariants().unwrap();
        guard += 1;
        assert!(guard < 100_000, "no progress");
    }
    (toks, evs, now)
}

#[test]
fn rejects_bad_requests() {
    let mut e = Engine::new(cfg(4)).unwrap();
    assert_eq!(e.add_request(1, vec![], 1, 0, true, Duration::ZERO), Err(SimError::EmptyPrompt(1)));
    assert_eq!(
        e.add_request(1, vec![1], 0, 0, true, Duration::ZERO),
        Err(SimError::ZeroMaxTokens(1))
    );
    assert!(matches!(
        e.add_request(1, vec![1; 16], 1, 0, true, Duration::ZERO),
        Err(SimError::TooLong { .. })
    ));
    e.add_request(1, vec![1], 1, 0, true, Duration::ZERO).unwrap();
    assert_eq!(
        e.add_request(1, vec![1], 1, 0, true, Duration::ZERO),
        Err(SimError::DuplicateRequest(1))
    );
    assert!(Engine::new(EngineConfig { max_num_seqs: 0, ..cfg(4) }).is_err());
}

#[test]
fn generates_max_tokens_then_length() {
    let mut e = Engine::new(cfg(16)).unwrap();
    e.add_request(9, (0..10).collect(), 5, 0, true, Duration::ZERO).unwrap();
    let (toks, _, _) = run_to_end(&mut e);
    assert_eq!(toks.len(), 5);
    assert!(toks[0].is_first && !toks[1].is_first);
    assert_eq!(
        toks.iter().map(|t| t.token).collect::<Vec<_>>(),
        vec![1000, 1001, 1002, 1003, 1004]
    );
    assert_eq!(toks[4].finished, Some(FinishReason::Length));
    assert!(toks[..4].iter().all(|t| t.finished.is_none()));
    assert_eq!(e.stats().finished, 1);
    assert_eq!(e.stats().kv_usage, 0.0);
}

#[test]
fn eos_respects_min_tokens_and_ignore_eos() {
    let c = EngineConfig { eos_probability: 1.0, ..cfg(64) };
    let mut e = Engine::new(c).unwrap();
    e.add_request(1, vec![1, 2, 3], 10, 3, false, Duration::ZERO).unwrap();
    e.add_request(2, vec![1, 2, 3], 10, 3, true, Duration::ZERO).unwrap();
    let (toks, _, _) = run_to_end(&mut e);
    let a: Vec<_> = toks.iter().filter(|t| t.request_id == 1).collect();
    let b: Vec<_> = toks.iter().filter(|t| t.request_id == 2).collect();
    assert_eq!(a.len(), 4);
    assert_eq!(a[3].finished, Some(FinishReason::Stop));
    assert_eq!(a[3].token, e.config().eos_token_id);
    assert_eq!(b.len(), 10);
}

#[test]
fn prefill_and_decode_blocks_are_stored_chained() {
    let mut e = Engine::new(cfg(16)).unwrap();
    // 10 prompt tokens, 6 outputs: tokens 0..15 computed => 3 full blocks (12 tokens) + decode fills block 3 at 16.
    e.add_request(1, (0..10).collect(), 7, 0, true, Duration::ZERO).unwrap();
    let (_, evs, _) = run_to_end(&mut e);
    let stored: Vec<&BlockStored> = evs
        .iter()
        .filter_map(|ev| match ev {
            Event::Stored(s) => Some(s),
            _ => None,
        })
        .collect();
    // Prefill stores 2 blocks (8 of 10 tokens), decode stores blocks 2 and 3 later.
    assert_eq!(stored[0].block_hashes.len(), 2);
    assert_eq!(stored[0].parent_block_hash, None);
    assert_eq!(stored[0].token_ids, (0..8).collect::<Vec<_>>());
    assert_eq!(stored[0].medium, Some(Medium::Gpu));
    assert_eq!(stored[1].parent_block_hash.as_ref(), stored[0].block_hashes.last());
    assert_eq!(stored[1].token_ids, vec![8, 9, 1000, 1001]);
    let n: usize = stored.iter().map(|s| s.block_hashes.len()).sum();
    assert_eq!(n, 4);
    assert_eq!(e.stats().gpu_cached_blocks, 4);
}

#[test]
fn second_request_hits_prefix_capped_one_token() {
    let mut e = Engine::new(cfg(64)).unwrap();
    let prompt: Vec<u32> = (0..16).collect();
    e.add_request(1, prompt.clone(), 1, 0, true, Duration::ZERO).unwrap();
    run_to_end(&mut e);
    e.add_request(2, prompt.clone(), 1, 0, true, Duration::ZERO).unwrap();
    let (toks, evs, _) = run_to_end(&mut e);
    // 16 tokens = 4 full blocks, but the last token is recomputed: 3 blocks hit.
    assert_eq!(toks[0].cached_tokens, 12);
    assert!(evs.is_empty(), "the recomputed block is already cached: {evs:?}");
    let s = e.stats();
    assert_eq!(s.prefix_cache_queries, 32);
    assert_eq!(s.prefix_cache_hits, 12);
}

#[test]
fn eviction_emits_removed_lru_tail_first() {
    // 5 blocks, one of them the null block: 4 hold KV.
    let mut e = Engine::new(cfg(5)).unwrap();
    e.add_request(1, (0..8).collect(), 1, 0, true, Duration::ZERO).unwrap();
    let (_, evs1, _) = run_to_end(&mut e);
    let Event::Stored(s) = &evs1[0] else { panic!("{evs1:?}") };
    let (h0, h1) = (s.block_hashes[0].clone(), s.block_hashes[1].clone());
    // Needs 3 blocks: 2 empty ones, then the LRU cached one, which is the tail block h1.
    e.add_request(2, (100..111).collect(), 1, 0, true, Duration::ZERO).unwrap();
    let (_, evs2, _) = run_to_end(&mut e);
    let removed: Vec<_> = evs2
        .iter()
        .filter_map(|ev| match ev {
            Event::Removed(r) => Some(r.block_hashes.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(removed, vec![vec![h1]]);
    assert!(e.gpu_cached_hashes().contains(&h0));
}

#[test]
fn cpu_tier_offloads_and_serves_external_hits() {
    let c = EngineConfig { num_cpu_blocks: 8, cpu_load_ms_per_block: 1.0, ..cfg(5) };
    let mut e = Engine::new(c).unwrap();
    let a: Vec<u32> = (0..9).collect();
    e.add_request(1, a.clone(), 1, 0, true, Duration::ZERO).unwrap();
    run_to_end(&mut e);
    e.add_request(2, (100..115).collect(), 1, 0, true, Duration::ZERO).unwrap();
    let (_, evs, _) = run_to_end(&mut e);
    let cpu_stores: Vec<_> = evs
        .iter()
        .filter_map(|ev| match ev {
            Event::Stored(s) if s.medium == Some(Medium::Cpu) => Some(s.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(cpu_stores.len(), 2);
    assert!(cpu_stores
        .iter()
        .all(|s| s.is_placeholder() && s.block_size == 0 && s.parent_block_hash.is_none()));
    assert_eq!(e.cpu_cached_hashes().len(), 2);
    // Request 1's prompt again: both blocks come back from CPU.
    e.add_request(3, a, 1, 0, true, Duration::ZERO).unwrap();
    let (toks, _, _) = run_to_end(&mut e);
    assert_eq!(toks[0].cached_tokens, 8);
    let s = e.stats();
    assert_eq!(s.external_hit_tokens, 8);
    assert_eq!(s.external_hit_blocks, 2);
}

#[test]
fn self_describing_cpu_events_carry_tokens() {
    let c = EngineConfig { num_cpu_blocks: 8, self_describing_cpu_events: true, ..cfg(5) };
    let mut e = Engine::new(c).unwrap();
    e.add_request(1, (0..9).collect(), 1, 0, true, Duration::ZERO).unwrap();
    run_to_end(&mut e);
    e.add_request(2, (100..115).collect(), 1, 0, true, Duration::ZERO).unwrap();
    let (_, evs, _) = run_to_end(&mut e);
    let cpu: Vec<_> = evs
        .iter()
        .filter_map(|ev| match ev {
            Event::Stored(s) if s.medium == Some(Medium::Cpu) => Some(s.clone()),
            _ => None,
        })
        .collect();
    assert!(cpu.iter().all(|s| s.token_ids.len() == 4 && s.block_size == 4));
    assert!(cpu.iter().any(|s| s.parent_block_hash.is_some()));
}

#[test]
fn preemption_under_pressure_completes_everything() {
    let c = EngineConfig { max_num_batched_tokens: 8, ..cfg(6) };
    let mut e = Engine::new(c).unwrap();
    for id in 0..4 {
        e.add_request(
            id,
            (id as u32 * 100..id as u32 * 100 + 6).collect(),
            12,
            0,
            true,
            Duration::ZERO,
        )
        .unwrap();
    }
    let (toks, _, _) = run_to_end(&mut e);
    assert_eq!(toks.len(), 48);
    assert!(e.stats().preemptions > 0);
    for id in 0..4 {
        let mine: Vec<_> = toks.iter().filter(|t| t.request_id == id).collect();
        assert_eq!(
            mine.iter().filter(|t| t.is_first).count(),
            1,
            "one first token despite preemption"
        );
    }
}

#[test]
fn chunked_prefill_respects_budget() {
    let c = EngineConfig { max_num_batched_tokens: 8, ..cfg(64) };
    let mut e = Engine::new(c).unwrap();
    e.add_request(1, (0..20).collect(), 2, 0, true, Duration::ZERO).unwrap();
    let o1 = e.step(Duration::ZERO);
    assert_eq!(o1.prefill_tokens, 8);
    assert!(o1.tokens.is_empty());
    let o2 = e.step(o1.duration);
    let o3 = e.step(o1.duration + o2.duration);
    assert_eq!(o3.prefill_tokens, 4);
    assert_eq!(o3.tokens.len(), 1);
    let o4 = e.step(Duration::from_secs(1));
    assert_eq!(o4.decode_seqs, 1);
    assert_eq!(o4.prefill_tokens, 0);
}

#[test]
fn max_num_seqs_limits_running() {
    let c = EngineConfig { max_num_seqs: 2, ..cfg(64) };
    let mut e = Engine::new(c).unwrap();
    for id in 0..5 {
        e.add_request(id, vec![id as u32; 3], 3, 0, true, Duration::ZERO).unwrap();
    }
    e.step(Duration::ZERO);
    let s = e.stats();
    assert_eq!((s.running, s.waiting), (2, 3));
}

#[test]
fn abort_and_reset() {
    let mut e = Engine::new(cfg(16)).unwrap();
    e.add_request(1, (0..10).collect(), 50, 0, true, Duration::ZERO).unwrap();
    e.step(Duration::ZERO);
    assert!(!e.reset_prefix_cache(), "refused while running");
    assert!(e.abort(1));
    assert!(!e.abort(1));
    e.check_invariants().unwrap();
    assert!(e.stats().gpu_cached_blocks > 0);
    assert!(e.reset_prefix_cache());
    assert_eq!(e.stats().gpu_cached_blocks, 0);
    let out = e.step(Duration::ZERO);
    assert_eq!(out.events, vec![Event::AllCleared]);
    assert!(!e.has_work());
}

#[test]
fn hash_bytes_publishes_32_bytes() {
    let mut e = Engine::new(EngineConfig { hash_bytes: true, ..cfg(16) }).unwrap();
    e.add_request(1, (0..8).collect(), 1, 0, true, Duration::ZERO).unwrap();
    let (_, evs, _) = run_to_end(&mut e);
    let Event::Stored(s) = &evs[0] else { panic!() };
    assert!(matches!(&s.block_hashes[0], BlockHash::Bytes(b) if b.len() == 32));
}

#[test]
fn replicas_hash_differently_unless_seeded() {
    let run = |seed| {
        let mut e = Engine::new(EngineConfig { hash_seed: seed, ..cfg(16) }).unwrap();
        e.add_request(1, (0..8).collect(), 1, 0, true, Duration::ZERO).unwrap();
        run_to_end(&mut e).1
    };
    assert_ne!(run(None), run(None));
    assert_eq!(run(Some(3)), run(Some(3)));
}

#[test]
fn extreme_times_do_not_panic() {
    let mut e = Engine::new(cfg(16)).unwrap();
    e.add_request(1, vec![u32::MAX; 5], 3, 9, false, Duration::MAX).unwrap();
    let out = e.step(Duration::MAX);
    assert!(out.duration > Duration::ZERO);
    e.step(Duration::MAX);
    assert!(e.stats().ttft_sum_s >= 0.0);
}

/// The CPU-tier hashes each CPU event names, in order: (stored?, hashes).
fn cpu_events(evs: &[Event]) -> Vec<(bool, Vec<BlockHash>)> {
    evs.iter()
        .filter_map(|e| match e {
            Event::Stored(s) if s.medium == Some(Medium::Cpu) => {
                Some((true, s.block_hashes.clone()))
            }
            Event::Removed(r) if r.medium == Some(Medium::Cpu) => {
                Some((false, r.block_hashes.clone()))
            }
            _ => None,
        })
        .collect()
}

#[test]
fn chunked_offload_re_announces_a_shared_prefix_and_evicts_whole_chunks() {
    let mut c = cfg(64);
    c.num_cpu_blocks = 4; // two chunks of two blocks
    c.cpu_chunk_blocks = 2;
    c.self_describing_cpu_events = true;
    let mut e = Engine::new(c).unwrap();
    // Block 0 shared, block 1 differs: each request's first chunk differs
    // but both contain block 0.
    let a: Vec<u32> = (0..4).chain(100..104).chain([7]).collect();
    let b: Vec<u32> = (0..4).chain(200..204).chain([7]).collect();
    e.add_request(1, a, 1, 0, true, Duration::ZERO).unwrap();
    let (_, first, _) = run_to_end(&mut e);
    e.add_request(2, b, 1, 0, true, Duration::ZERO).unwrap();
    let (_, second, _) = run_to_end(&mut e);
    let (one, two) = (cpu_events(&first), cpu_events(&second));
    assert_eq!(one.len(), 1, "{one:?}");
    assert_eq!(two.len(), 1, "{two:?}");
    let (shared_a, shared_b) = (&one[0].1[0], &two[0].1[0]);
    assert_eq!(shared_a, shared_b, "block 0 announced by both chunks");
    assert_ne!(one[0].1[1], two[0].1[1]);
    assert_eq!(e.stats().cpu_cached_blocks, 3);
    // A third chunk evicts the oldest whole: all its hashes leave, the
    // shared one stays held by the other chunk.
    let third: Vec<u32> = (50..58).chain([7]).collect();
    e.add_request(3, third, 1, 0, true, Duration::ZERO).unwrap();
    let (_, evs, _) = run_to_end(&mut e);
    let cpu = cpu_events(&evs);
    assert_eq!(cpu.len(), 2, "{cpu:?}");
    assert_eq!(cpu[0], (false, one[0].1.clone()));
    assert!(cpu[1].0);
    let held = e.cpu_cached_hashes();
    assert!(held.contains(shared_a));
    assert!(!held.contains(&one[0].1[1]));
    assert_eq!(held.len(), 4);
}

/// A waiting request that does not fit in GPU memory loads nothing: its
/// prefix blocks on the CPU tier keep their age until it is admitted (vLLM
/// loads a connector's blocks only after `allocate_slots` succeeds), and
/// then they are the most recently used.
#[test]
fn a_request_blocked_on_memory_does_not_touch_its_cpu_blocks() {
    let c = EngineConfig { num_cpu_blocks: 8, ..cfg(5) };
    let mut e = Engine::new(c).unwrap();
    let a: Vec<u32> = (0..9).collect();
    e.add_request(1, a.clone(), 1, 0, true, Duration::ZERO).unwrap();
    run_to_end(&mut e);
    // A 15-token prompt evicts request 1's two full blocks to the CPU tier.
    e.add_request(2, (100..115).collect(), 1, 0, true, Duration::ZERO).unwrap();
    run_to_end(&mut e);
    // Request 3 holds 4 of the 5 GPU blocks while it decodes (13 + 3 tokens),
    // evicting request 2's blocks to the CPU tier after request 1's.
    e.add_request(3, (200..213).collect(), 3, 3, true, Duration::ZERO).unwrap();
    let mut now = Duration::ZERO;
    now += e.step(now).duration;
    // Request 1's prompt again: 2 blocks on the CPU tier, 3 needed, 1 free.
    e.add_request(4, a, 1, 0, true, now).unwrap();
    let mut prefix: Vec<Hash32> = e.requests[&4].hashes[..2].to_vec();
    prefix.sort();
    let age = |e: &Engine| e.cpu.as_ref().unwrap().keys_by_age();
    // The two oldest entries (in either order: eviction goes tail first).
    let oldest_first = |e: &Engine| {
        let mut two = age(e)[..2].to_vec();
        two.sort();
        two
    };
    assert_eq!(oldest_first(&e), prefix, "request 1's blocks went to the CPU tier first");
    assert!(age(&e).len() > 2, "request 2's blocks followed them");
    for _ in 0..2 {
        now += e.step(now).duration;
        assert!(e.waiting.contains(&4), "request 4 should be blocked on memory");
        assert_eq!(oldest_first(&e), prefix, "a blocked request touched its CPU blocks");
    }
    // Once request 3 ends, request 4 is admitted and loads them: they are
    // no longer the oldest, and they serve its prefix.
    let (mut guard, mut toks) = (0, Vec::new());
    while e.waiting.contains(&4) {
        let out = e.step(now);
        now += out.duration;
        toks.extend(out.tokens);
        guard += 1;
        assert!(guard < 1_000, "request 4 was never admitted");
    }
    assert_ne!(oldest_first(&e), prefix, "admitted, it loaded them");
    assert!(prefix.iter().all(|h| age(&e).contains(h)));
    toks.extend(run_to_end(&mut e).0);
    let first = toks.iter().find(|t| t.request_id == 4).unwrap();
    assert_eq!(first.cached_tokens, 8);
}

#[test]
fn long_prompts_pay_for_attention_over_their_context() {
    // The gpu_like engine of scripts/real-vllm.sh, as docs/real-vllm.md
    // measured it: a cold 8,000-token prompt in four 2,048-token chunks took
    // 5.5–5.7 s to its first token, the same prompt with its last 128 tokens
    // new 200 ms.
    let config = EngineConfig {
        block_size: 32,
        num_gpu_blocks: 512,
        max_num_seqs: 128,
        max_num_batched_tokens: 2048,
        timing: crate::TimingModel::vllm_cpu_gpu_like(),
        ..EngineConfig::default()
    };
    let ttft = |e: &mut Engine, id, prompt: Vec<u32>| {
        e.add_request(id, prompt, 1, 0, true, Duration::ZERO).unwrap();
        run_to_end(e).2.as_secs_f64()
    };
    let mut e = Engine::new(config.clone()).unwrap();
    let cold: Vec<u32> = (0..8000).collect();
    let cold_s = ttft(&mut e, 1, cold.clone());
    assert!((5.0..7.0).contains(&cold_s), "{cold_s}");
    let mut warm = cold;
    warm[7872..].iter_mut().for_each(|t| *t += 100_000);
    let warm_s = ttft(&mut e, 2, warm);
    assert!((0.15..0.26).contains(&warm_s), "{warm_s}");
    // Without the context terms the same engine is far off.
    let flat = crate::TimingModel { prefill_context_ms: 0.0, ..config.timing.clone() };
    let mut e = Engine::new(EngineConfig { timing: flat, ..config }).unwrap();
    let flat_s = ttft(&mut e, 1, (0..8000).collect());
    assert!(flat_s < 0.5 * cold_s, "{flat_s} vs {cold_s}");
}
