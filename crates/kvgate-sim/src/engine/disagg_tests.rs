//! Unit tests of the two disaggregation roles: a prefill hop that holds its
//! blocks until they are fetched, and a decode hop whose prompt KV arrives
//! from elsewhere.

use super::tests::cfg;
use super::*;

fn run(e: &mut Engine) -> (Vec<StepOutput>, Duration) {
    let mut now = Duration::ZERO;
    let mut outs = Vec::new();
    while e.has_work() {
        let out = e.step(now);
        now += out.duration;
        e.check_invariants().unwrap();
        outs.push(out);
        assert!(outs.len() < 10_000, "no progress");
    }
    (outs, now)
}

#[test]
fn a_prefill_hop_holds_its_blocks_until_released() {
    let mut e = Engine::new(cfg(16)).unwrap();
    e.add_request(1, (0..17).collect(), 1, 0, true, Duration::ZERO).unwrap();
    e.set_hold_blocks(1).unwrap();
    let (outs, _) = run(&mut e);
    assert!(outs.iter().flat_map(|o| &o.tokens).any(|t| t.finished.is_some()));
    // 17 prompt tokens + 1 sampled need 5 blocks of 4, all still referenced,
    // of the 15 that hold KV (one of the 16 is vLLM's null block).
    assert_eq!(e.held_requests(), 1);
    assert_eq!(e.stats().kv_usage, 5.0 / 15.0);
    assert!(e.release_held(1));
    assert!(!e.release_held(1), "released twice");
    assert_eq!(e.stats().kv_usage, 0.0);
    e.check_invariants().unwrap();
    // The blocks stay cached: the same prompt hits 4 full blocks.
    e.add_request(2, (0..17).collect(), 1, 0, true, Duration::ZERO).unwrap();
    run(&mut e);
    assert_eq!(e.request_cached_tokens(2), None, "finished requests are gone");
    assert_eq!(e.stats().prefix_cache_hits, 16);
}

#[test]
fn a_decode_hop_computes_only_its_last_prompt_token() {
    let mut local = Engine::new(cfg(32)).unwrap();
    local.add_request(1, (0..40).collect(), 3, 0, true, Duration::ZERO).unwrap();
    let (outs, _) = run(&mut local);
    let computed: u64 = outs.iter().map(|o| o.prefill_tokens).sum();
    assert_eq!(computed, 40);

    let mut remote = Engine::new(cfg(32)).unwrap();
    remote.add_request(1, (0..40).collect(), 3, 0, true, Duration::ZERO).unwrap();
    remote.set_remote_kv(1).unwrap();
    let (outs, _) = run(&mut remote);
    let computed: u64 = outs.iter().map(|o| o.prefill_tokens).sum();
    assert_eq!(computed, 1, "only the last prompt token is recomputed");
    let tokens: Vec<_> = outs.iter().flat_map(|o| &o.tokens).collect();
    assert_eq!(tokens.len(), 3);
    assert!(tokens[0].is_first);
    // The received blocks are announced as stored once loaded, as vLLM's
    // block pool does when the pull completes: the 10 full prompt blocks.
    let stored: usize = outs
        .iter()
        .flat_map(|o| &o.events)
        .map(|ev| match ev {
            Event::Stored(s) => s.block_hashes.len(),
            _ => 0,
        })
        .sum();
    assert!(stored >= 10, "{stored} blocks stored");
    // The prompt is now cached locally for the session's next turn.
    remote.add_request(2, (0..41).collect(), 1, 0, true, Duration::ZERO).unwrap();
    run(&mut remote);
    assert!(remote.stats().prefix_cache_hits >= 40);
}

#[test]
fn a_decode_hop_takes_its_local_hit_first() {
    let mut e = Engine::new(cfg(32)).unwrap();
    e.add_request(1, (0..16).collect(), 1, 0, true, Duration::ZERO).unwrap();
    run(&mut e);
    e.add_request(2, (0..40).collect(), 1, 0, true, Duration::ZERO).unwrap();
    e.set_remote_kv(2).unwrap();
    let (outs, _) = run(&mut e);
    let computed: u64 = outs.iter().map(|o| o.prefill_tokens).sum();
    assert_eq!(computed, 1);
    let first = outs.iter().flat_map(|o| &o.tokens).find(|t| t.is_first).unwrap();
    // It reports every prompt token but the last as cached: the 4 full
    // blocks request 1 left (16 tokens) and the 23 loaded, which count as
    // external, as vLLM counts its connector's loads.
    assert_eq!(first.cached_tokens, 39);
    assert_eq!(first.external_cached_tokens, 23);
}

#[test]
fn roles_are_refused_for_unknown_or_started_requests() {
    let mut e = Engine::new(cfg(16)).unwrap();
    assert_eq!(e.set_remote_kv(9), Err(SimError::RoleFixed(9)));
    assert_eq!(e.set_hold_blocks(9), Err(SimError::RoleFixed(9)));
    e.add_request(1, (0..8).collect(), 4, 0, true, Duration::ZERO).unwrap();
    e.step(Duration::ZERO);
    assert_eq!(e.set_remote_kv(1), Err(SimError::RoleFixed(1)));
}

#[test]
fn an_abort_frees_held_blocks() {
    let mut e = Engine::new(cfg(16)).unwrap();
    e.add_request(1, (0..8).collect(), 1, 0, true, Duration::ZERO).unwrap();
    e.set_hold_blocks(1).unwrap();
    run(&mut e);
    assert_eq!(e.held_requests(), 1);
    e.abort(1);
    assert_eq!(e.held_requests(), 0);
    assert_eq!(e.stats().kv_usage, 0.0);
    e.check_invariants().unwrap();
}
