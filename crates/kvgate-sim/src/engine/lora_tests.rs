//! Unit tests of the GPU LoRA slots inside the engine, in virtual time:
//! the batch's adapter limit, skipped-not-blocked admission, LRU eviction,
//! and the load time charged once per load.

use super::*;

fn cfg(max_loras: u32, lora_load_ms: f64) -> EngineConfig {
    EngineConfig {
        block_size: 4,
        num_gpu_blocks: 256,
        max_num_seqs: 8,
        max_num_batched_tokens: 256,
        hash_seed: Some(7),
        max_loras,
        lora_load_ms,
        ..EngineConfig::default()
    }
}

/// Adds request `id` with `n` prompt tokens under `adapter` (None: the base).
fn add(e: &mut Engine, id: RequestId, adapter: Option<&str>, max_tokens: u32, now: Duration) {
    let prompt: Vec<u32> = (0..12).map(|t| t + 100 * id as u32).collect();
    e.add_request(id, prompt, max_tokens, 0, true, now).unwrap();
    if let Some(a) = adapter {
        let identity = CacheIdentity { lora_name: Some(a.to_owned()), cache_salt: None };
        e.set_identity(id, identity).unwrap();
    }
}

fn step(e: &mut Engine, now: &mut Duration) -> StepOutput {
    let out = e.step(*now);
    *now += out.duration;
    e.check_invariants().unwrap();
    out
}

#[test]
fn over_the_limit_is_skipped_not_blocking() {
    let mut e = Engine::new(cfg(1, 10.0)).unwrap();
    let mut now = Duration::ZERO;
    add(&mut e, 1, Some("a"), 4, now);
    add(&mut e, 2, Some("b"), 4, now);
    add(&mut e, 3, Some("a"), 4, now);
    add(&mut e, 4, None, 4, now);
    let out = step(&mut e, &mut now);
    // b would be a second adapter: skipped; a's second request and the base
    // request behind it are admitted.
    assert_eq!(out.admitted, vec![1, 3, 4]);
    assert_eq!(e.running_loras(), ["a"]);
    assert_eq!(e.waiting_loras(), ["b"]);
    // A later request for the running adapter overtakes the skipped one.
    add(&mut e, 5, Some("a"), 1, now);
    let out = step(&mut e, &mut now);
    assert_eq!(out.admitted, vec![5]);
    assert_eq!(e.waiting_loras(), ["b"]);
    // b runs once a's requests are done, and never beside them.
    let mut b_admitted = false;
    while e.has_work() {
        let running_a = e.running_loras().contains(&"a".to_owned());
        let out = step(&mut e, &mut now);
        if out.admitted.contains(&2) {
            assert!(!running_a, "b is admitted only once no a request runs");
            b_admitted = true;
        }
        assert!(e.running_loras().len() <= 1);
    }
    assert!(b_admitted);
    assert_eq!(e.stats().finished, 5);
}

#[test]
fn two_slots_admit_two_adapters_and_evict_lru() {
    let mut e = Engine::new(cfg(2, 10.0)).unwrap();
    let mut now = Duration::ZERO;
    add(&mut e, 1, Some("a"), 2, now);
    add(&mut e, 2, Some("b"), 2, now);
    add(&mut e, 3, Some("c"), 2, now);
    let out = step(&mut e, &mut now);
    assert_eq!(out.admitted, vec![1, 2]);
    assert_eq!(out.lora_loads, 2);
    assert_eq!(e.resident_loras(), ["a", "b"]);
    while e.has_work() {
        step(&mut e, &mut now);
    }
    // c took the slot of a, the least recently used (a and b were touched
    // together every step; a first).
    assert_eq!(e.resident_loras(), ["b", "c"]);
    let s = e.stats();
    assert_eq!((s.lora_loads, s.lora_evictions), (3, 1));
    // a again: loaded again, evicting b.
    add(&mut e, 4, Some("a"), 1, now);
    let out = step(&mut e, &mut now);
    assert_eq!(out.lora_loads, 1);
    assert_eq!(e.resident_loras(), ["c", "a"]);
    assert_eq!(e.stats().lora_evictions, 2);
}

#[test]
fn load_time_is_charged_once_to_the_first_step() {
    let run = |load_ms: f64| {
        let mut e = Engine::new(cfg(1, load_ms)).unwrap();
        let mut now = Duration::ZERO;
        add(&mut e, 1, Some("a"), 3, now);
        let mut steps = Vec::new();
        while e.has_work() {
            let out = step(&mut e, &mut now);
            steps.push((out.duration, out.lora_loads));
        }
        (steps, e.stats().lora_loads)
    };
    let (free, free_loads) = run(0.0);
    let (paid, paid_loads) = run(500.0);
    assert_eq!((free_loads, paid_loads), (1, 1));
    assert_eq!(free.len(), paid.len());
    let extra = paid[0].0.as_secs_f64() - free[0].0.as_secs_f64();
    assert!((extra - 0.5).abs() < 1e-6, "first step pays the load: {extra}");
    assert_eq!(paid[0].1, 1);
    for (f, p) in free.iter().zip(&paid).skip(1) {
        assert_eq!(f.0, p.0, "later steps pay nothing");
        assert_eq!(p.1, 0);
    }
}

#[test]
fn load_and_unload_lora_outside_steps() {
    let mut e = Engine::new(cfg(1, 100.0)).unwrap();
    let mut now = Duration::ZERO;
    assert!(e.load_lora("a"));
    assert!(!e.load_lora("a"));
    add(&mut e, 1, Some("a"), 1, now);
    assert_eq!(step(&mut e, &mut now).lora_loads, 0, "preloaded: no load in the step");
    assert!(e.unload_lora("a"));
    assert!(e.resident_loras().is_empty());
    add(&mut e, 2, Some("a"), 1, now);
    assert_eq!(step(&mut e, &mut now).lora_loads, 1, "unloaded: loads again");
    let s = e.stats();
    assert_eq!((s.lora_loads, s.lora_evictions), (2, 0));
}

#[test]
fn without_adapters_slots_change_nothing() {
    let run = |max_loras: u32| {
        let mut e = Engine::new(cfg(max_loras, 1000.0)).unwrap();
        let mut now = Duration::ZERO;
        for id in 1..=6 {
            add(&mut e, id, None, 5, now);
        }
        let mut trace = Vec::new();
        while e.has_work() {
            let out = step(&mut e, &mut now);
            trace.push((out.duration, out.admitted, out.tokens.len(), out.lora_loads));
        }
        (trace, e.stats())
    };
    let (one, s1) = run(1);
    let (many, s8) = run(8);
    assert_eq!(one, many);
    assert_eq!(s1, s8);
    assert_eq!(s1.lora_loads, 0);
    assert!(one.iter().all(|t| t.3 == 0));
}
