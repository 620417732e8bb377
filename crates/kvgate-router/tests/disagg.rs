//! The prefill/decode planner (`Disagg::plan`): each mode's rule, the
//! bookings it leaves in both ledgers, and the transfer calibration.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Instant;

use kvgate_events::{BlockHash, BlockStored, Event};
use kvgate_index::{block_keys, Index, ReplicaId, ReplicaSpec};
use kvgate_router::{
    Disagg, DisaggConfig, DisaggMode, Outcome, PdPlan, PolicyKind, ReplicaInfo, RouteRequest,
    Router, RouterConfig, RouterMetrics,
};

const BS: u32 = 16;

/// A router over `n` replicas, with their index.
fn side(n: u32) -> (Router, Index) {
    let cfg =
        RouterConfig { policy: PolicyKind::KvAware, seed: Some(3), ..RouterConfig::default() };
    let mut r = Router::new(cfg, Arc::new(RouterMetrics::default())).unwrap();
    let mut index = Index::new();
    for i in 0..n {
        let id = index.add_replica(ReplicaSpec::new(format!("r{i}"), 0, BS)).unwrap();
        let mut info = ReplicaInfo::new(format!("http://r{i}"), BS);
        info.capacity_blocks = [100_000, 0, 0];
        r.add_replica(id, info).unwrap();
    }
    (r, index)
}

fn planner(mode: DisaggMode) -> Disagg {
    // Qwen3-32B's 256 KiB per token over 64 GB/s: 4.1 µs per token.
    Disagg::new(DisaggConfig { mode, kv_bytes_per_token: 262_144, bandwidth_bytes_per_s: 64e9 })
}

fn prompt(len: u32, salt: u32) -> Vec<u32> {
    (0..len).map(|i| i.wrapping_mul(7).wrapping_add(salt * 100_003)).collect()
}

/// Replica `id` of `index` caches `tokens`' full blocks, as its events say.
fn cache(index: &mut Index, id: ReplicaId, tokens: &[u32], now: Instant) {
    let n = tokens.len() / BS as usize;
    let hashes = (0..n as u64).map(|i| BlockHash::Int(0xabc0_0000 + i)).collect();
    let stored = BlockStored::new(hashes, None, tokens[..n * BS as usize].to_vec(), BS);
    index.apply_events(id, &[Event::Stored(stored)], now);
}

fn request<'a>(tokens: &'a [u32], keys: &'a [kvgate_index::BlockKey]) -> RouteRequest<'a> {
    RouteRequest {
        prompt_tokens: tokens.len() as u64,
        keys,
        max_output_tokens: Some(200),
        ..RouteRequest::default()
    }
}

#[test]
fn always_splits_and_books_both_sides() {
    let (mut p, pi) = side(2);
    let (mut d, di) = side(2);
    let mut pd = planner(DisaggMode::Always);
    let now = Instant::now();
    let t = prompt(4000, 1);
    let k = block_keys(&t, BS as usize, None);
    let plan = pd.plan((&mut p, &pi), (&mut d, &di), &request(&t, &k), now).unwrap();
    let PdPlan::Split { prefill, decode } = plan else { panic!("not split: {plan:?}") };
    // The prefill side computes the prompt; the decode side only the last
    // partial block (4000 = 250 blocks exactly: one token).
    assert_eq!(p.load(prefill.replica).unwrap().load.pending_prefill_tokens, 4000);
    assert!(d.load(decode.replica).unwrap().load.pending_prefill_tokens <= u64::from(BS));
    // Its TTFT includes the transfer: 4000 × 4.1 µs.
    assert!(decode.predicted_ttft_s >= 4000.0 * 262_144.0 / 64e9);
    p.finish(prefill.booking, Outcome::Finished);
    d.finish(decode.booking, Outcome::Finished);
    assert_eq!(pd.counts().split, 1);
    assert_eq!(pd.counts().bypass_rate(), 0.0);
}

#[test]
fn isl_bounding_bypasses_when_the_decode_side_holds_most_of_the_prompt() {
    let (mut p, pi) = side(2);
    let (mut d, mut di) = side(2);
    let mut pd = planner(DisaggMode::dynamo_default());
    let now = Instant::now();
    let t = prompt(6000, 2);
    let k = block_keys(&t, BS as usize, None);
    // Nothing cached: 6000 uncached tokens ≥ 2048, split.
    let plan = pd.plan((&mut p, &pi), (&mut d, &di), &request(&t, &k), now).unwrap();
    assert!(matches!(plan, PdPlan::Split { .. }));
    // Another prompt whose first 5000 tokens (312 blocks) decode replica 1
    // caches: 1008 left, < 2048 and < 70 % of the prompt, bypass onto it.
    // (Not the same prompt: the split's decode hop left it tentatively on
    // its decode replica, where the transfer lands.)
    let t = prompt(6000, 12);
    let k = block_keys(&t, BS as usize, None);
    cache(&mut di, ReplicaId(1), &t[..5000], now);
    let plan = pd.plan((&mut p, &pi), (&mut d, &di), &request(&t, &k), now).unwrap();
    let PdPlan::Aggregated(whole) = plan else { panic!("not bypassed: {plan:?}") };
    assert_eq!(whole.replica, ReplicaId(1));
    assert_eq!(pd.counts().bypassed, 1);
    assert_eq!(pd.counts().bypass_rate(), 0.5);
}

#[test]
fn conditional_bypasses_a_mostly_cached_prompt_and_splits_a_cold_one() {
    let (mut p, pi) = side(2);
    let (mut d, mut di) = side(2);
    let mut pd = planner(DisaggMode::conditional());
    let now = Instant::now();
    // A cold 8k-token prompt on an idle fleet: either way it is prefilled
    // once, and the split keeps it off the decode side. With the decode
    // side busy decoding, splitting is cheaper (the decode-delay charge).
    let busy = prompt(64, 9);
    let bk = block_keys(&busy, BS as usize, None);
    for _ in 0..40 {
        let r = d.decide(&request(&busy, &bk), &di, now).routed().unwrap();
        d.first_token(r.booking, now);
    }
    let t = prompt(8000, 3);
    let k = block_keys(&t, BS as usize, None);
    let plan = pd.plan((&mut p, &pi), (&mut d, &di), &request(&t, &k), now).unwrap();
    assert!(matches!(plan, PdPlan::Split { .. }), "{plan:?}");
    // The next turn of a session whose prefix a decode replica holds: a
    // 100-token question after 7,900 cached tokens computes little there
    // and needs no transfer.
    let t2 = prompt(8000, 4);
    let k2 = block_keys(&t2, BS as usize, None);
    cache(&mut di, ReplicaId(0), &t2[..7900], now);
    let plan = pd.plan((&mut p, &pi), (&mut d, &di), &request(&t2, &k2), now).unwrap();
    let PdPlan::Aggregated(whole) = plan else { panic!("not bypassed: {plan:?}") };
    assert_eq!(whole.replica, ReplicaId(0));
}

#[test]
fn conditional_bypasses_when_the_prefill_side_is_swamped() {
    let (mut p, pi) = side(1);
    let (mut d, di) = side(2);
    let mut pd = planner(DisaggMode::conditional());
    let now = Instant::now();
    // 200k tokens queued on the only prefill replica.
    let q = prompt(20_000, 5);
    let qk = block_keys(&q, BS as usize, None);
    for _ in 0..10 {
        p.decide(&request(&q, &qk), &pi, now).routed().unwrap();
    }
    let t = prompt(4000, 6);
    let k = block_keys(&t, BS as usize, None);
    let plan = pd.plan((&mut p, &pi), (&mut d, &di), &request(&t, &k), now).unwrap();
    assert!(matches!(plan, PdPlan::Aggregated(_)), "{plan:?}");
}

#[test]
fn no_prefill_replica_means_serving_whole() {
    let (mut p, pi) = side(0);
    let (mut d, di) = side(1);
    for mode in [DisaggMode::Always, DisaggMode::conditional()] {
        let mut pd = planner(mode);
        let t = prompt(3000, 7);
        let k = block_keys(&t, BS as usize, None);
        let plan = pd.plan((&mut p, &pi), (&mut d, &di), &request(&t, &k), Instant::now());
        assert!(matches!(plan, Ok(PdPlan::Aggregated(_))), "{mode:?}: {plan:?}");
    }
}

#[test]
fn the_transfer_rate_is_calibrated_from_observed_transfers() {
    // A prior of 4.1 µs per token; the link really moves one in 8 µs.
    let mut pd = planner(DisaggMode::conditional());
    let prior = pd.transfer_s_per_token();
    assert!((prior - 262_144.0 / 64e9).abs() < 1e-12);
    for i in 0..40 {
        let tokens = 1000 + 100 * i;
        pd.observe_transfer(tokens, tokens as f64 * 8e-6);
    }
    // One stray slow transfer does not move the median.
    pd.observe_transfer(1000, 5.0);
    assert!((pd.transfer_s_per_token() - 8e-6).abs() < 1e-9, "{}", pd.transfer_s_per_token());
    // Nonsense is ignored.
    pd.observe_transfer(0, 1.0);
    pd.observe_transfer(10, f64::NAN);
    assert!((pd.transfer_s_per_token() - 8e-6).abs() < 1e-9);
}

/// `whole_on_prefill`: a prompt whose prefix only a prefill replica holds,
/// with the decode side busy, is served whole there (no transfer, nothing
/// recomputed); without the setting it never is, and with no decode replica
/// at all the prefill side still serves it whole.
#[test]
fn whole_on_prefill_serves_where_the_prefix_is_when_allowed() {
    let now = Instant::now();
    let t = prompt(8000, 11);
    let k = block_keys(&t, BS as usize, None);
    let busy = prompt(64, 12);
    let bk = block_keys(&busy, BS as usize, None);
    for whole_on_prefill in [true, false] {
        let (mut p, mut pi) = side(2);
        let (mut d, di) = side(2);
        cache(&mut pi, ReplicaId(1), &t[..7900], now);
        for _ in 0..40 {
            let r = d.decide(&request(&busy, &bk), &di, now).routed().unwrap();
            d.first_token(r.booking, now);
        }
        let mut pd = planner(DisaggMode::Conditional { whole_on_prefill });
        let plan = pd.plan((&mut p, &pi), (&mut d, &di), &request(&t, &k), now).unwrap();
        if whole_on_prefill {
            let PdPlan::OnPrefill(whole) = plan else { panic!("not on prefill: {plan:?}") };
            assert_eq!(whole.replica, ReplicaId(1));
            assert_eq!(p.in_flight(), 1, "booked in the prefill ledger");
            assert_eq!((pd.counts().on_prefill, pd.counts().on_prefill_rate()), (1, 1.0));
        } else {
            assert!(!matches!(plan, PdPlan::OnPrefill(_)), "{plan:?}");
            assert_eq!(pd.counts().on_prefill, 0);
        }
    }
    let (mut p, pi) = side(1);
    let (mut d, di) = side(0);
    let mut pd = planner(DisaggMode::Conditional { whole_on_prefill: true });
    let plan = pd.plan((&mut p, &pi), (&mut d, &di), &request(&t, &k), now);
    assert!(matches!(plan, Ok(PdPlan::OnPrefill(_))), "{plan:?}");
}
