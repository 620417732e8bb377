//! Property tests of the acceptance list: the cost model's
//! monotonicity, the ledger's conservation, and least-load with no reuse.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use kvgate_index::{BlockKey, PrefixMatch, ReplicaId};
use kvgate_router::{
    predict, Booking, CostInputs, CostModelConfig, Decision, EngineReport, LedgerChange, Outcome,
    PeerId, PolicyKind, ReplicaInfo, RouteRequest, Router, RouterConfig, RouterMetrics,
};
use proptest::prelude::*;

fn inputs() -> impl Strategy<Value = CostInputs> {
    (
        (
            1u64..100_000,
            prop_oneof![Just(16u32), Just(32), Just(1)],
            0u32..4000,
            0u32..100,
            0u32..100,
        ),
        (
            0u64..1_000_000,
            0u32..512,
            0u64..20_000,
            0u64..5000,
            prop_oneof![Just(0u64), 1000u64..20_000],
        ),
        (1u32..65_536, 1e-6f64..1e-2, 0f64..1e-2, 0f64..1e-1, 0f64..0.1),
    )
        .prop_map(|((p, bs, cached, cpu, sto), (q, d, used, new, cap), (b, s, tc, ts, o))| {
            CostInputs {
                prompt_tokens: p,
                block_size: bs,
                cached_blocks: cached,
                lower_blocks: [cpu.min(cached), sto.min(cached - cpu.min(cached))],
                queue_tokens: q,
                decoding: d,
                kv_used_blocks: used,
                kv_new_blocks: new,
                kv_capacity_blocks: cap,
                max_num_batched_tokens: b,
                prefill_s_per_token: s,
                overhead_s: o,
                transfer_s_per_block: [tc, ts],
                // Half the cases with a measured decode step.
                decode_step_s: (q % 2 == 0).then_some(o + 1e-3),
                adapter_s: 0.0,
                received_s: 0.0,
            }
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    /// More GPU overlap never raises the predicted cost, all else equal.
    #[test]
    fn more_gpu_overlap_never_costs_more(x in inputs(), more in 1u32..500) {
        let c = CostModelConfig::default();
        let base = predict(&c, &x);
        let y = CostInputs { cached_blocks: x.cached_blocks + more, ..x };
        let better = predict(&c, &y);
        prop_assert!(better.cost <= base.cost + 1e-12, "{base:?} -> {better:?}");
        prop_assert!(better.ttft_s <= base.ttft_s + 1e-12);
    }

    /// More pending load (queue, decodes, KV in use) never lowers it.
    #[test]
    fn more_load_never_costs_less(
        x in inputs(), dq in 0u64..100_000, dd in 0u32..64, du in 0u64..5000,
    ) {
        let c = CostModelConfig::default();
        let base = predict(&c, &x);
        let y = CostInputs {
            queue_tokens: x.queue_tokens + dq,
            decoding: x.decoding + dd,
            kv_used_blocks: x.kv_used_blocks + du,
            ..x
        };
        let worse = predict(&c, &y);
        prop_assert!(worse.cost + 1e-12 >= base.cost, "{base:?} -> {worse:?}");
        prop_assert!(worse.ttft_s + 1e-12 >= base.ttft_s);
    }
}

const REPLICAS: u32 = 4;

/// A router whose near-tie bands (for fresh requests too) are `epsilon`:
/// with 0 the choice is the cost model's argmin, which is what the
/// least-load properties check; the bands only widen which near-equal
/// replica wins.
fn router(policy: PolicyKind, epsilon: f64) -> Router {
    let cfg = RouterConfig {
        policy,
        epsilon,
        fresh_epsilon: epsilon,
        seed: Some(7),
        ..RouterConfig::default()
    };
    let mut r = Router::new(cfg, Arc::new(RouterMetrics::default())).unwrap();
    for i in 0..REPLICAS {
        r.add_replica(ReplicaId(i), ReplicaInfo::new(format!("r{i}"), 16)).unwrap();
    }
    r
}

/// One step of the ledger model test.
#[derive(Clone, Debug)]
enum Op {
    Decide { tokens: u64, overlap: [u32; REPLICAS as usize] },
    FirstToken(usize),
    Finish(usize, u8),
    Drop(usize),
    Report { replica: u32, running: u32, waiting: u32 },
    PeerBook { peer: u32, id: u64, replica: u32, tokens: u64 },
    PeerFirst { peer: u32, id: u64 },
    PeerFinish { peer: u32, id: u64 },
    ForgetPeer(u32),
    Advance(u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (1u64..5000, prop::array::uniform4(0u32..300))
            .prop_map(|(tokens, overlap)| Op::Decide { tokens, overlap }),
        3 => any::<prop::sample::Index>().prop_map(|i| Op::FirstToken(i.index(1 << 16))),
        3 => (any::<prop::sample::Index>(), 0u8..3).prop_map(|(i, o)| Op::Finish(i.index(1 << 16), o)),
        1 => any::<prop::sample::Index>().prop_map(|i| Op::Drop(i.index(1 << 16))),
        1 => (0..REPLICAS, 0u32..4, 0u32..4)
            .prop_map(|(replica, running, waiting)| Op::Report { replica, running, waiting }),
        2 => (0u32..3, 0u64..8, 0..REPLICAS + 1, 0u64..3000)
            .prop_map(|(peer, id, replica, tokens)| Op::PeerBook { peer, id, replica, tokens }),
        1 => (0u32..3, 0u64..8).prop_map(|(peer, id)| Op::PeerFirst { peer, id }),
        1 => (0u32..3, 0u64..8).prop_map(|(peer, id)| Op::PeerFinish { peer, id }),
        1 => (0u32..3).prop_map(Op::ForgetPeer),
        1 => prop_oneof![0u64..2_000, 50_000u64..2_000_000].prop_map(Op::Advance),
    ]
}

fn check_conservation(r: &Router) -> Result<(), TestCaseError> {
    let t = r.ledger_totals();
    prop_assert_eq!(t.booked - t.released(), r.in_flight() as u64, "{:?}", t);
    let pending: u64 =
        r.replica_ids().iter().map(|&id| r.load(id).unwrap().load.pending_prefill_tokens).sum();
    let requests: u64 =
        r.replica_ids().iter().map(|&id| u64::from(r.load(id).unwrap().load.requests())).sum();
    prop_assert_eq!(
        t.prefill_tokens_booked - t.prefill_tokens_started - t.prefill_tokens_released,
        pending,
        "{:?}",
        t
    );
    prop_assert_eq!(requests, r.in_flight() as u64);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// Bookings minus releases equal in-flight at all times, in requests and
    /// in prefill tokens, whatever mix of outcomes, drops, expiries,
    /// reconciliations and peer traffic happens.
    #[test]
    fn ledger_conserves_tokens(ops in prop::collection::vec(op(), 1..120)) {
        let mut r = router(PolicyKind::KvAware, 0.05);
        let t0 = Instant::now();
        let mut now = t0;
        let mut live: Vec<Booking> = Vec::new();
        let keys: Vec<BlockKey> = (0..400).map(BlockKey).collect();
        for op in ops {
            match op {
                Op::Decide { tokens, overlap } => {
                    let matches: Vec<PrefixMatch> = overlap
                        .iter()
                        .map(|&o| PrefixMatch { total: o, gpu: o, gpu_prefix: o, ..PrefixMatch::default() })
                        .collect();
                    let n = (tokens / 16) as usize;
                    let req = RouteRequest {
                        prompt_tokens: tokens,
                        keys: &keys[..n.min(keys.len())],
                        ..RouteRequest::default()
                    };
                    if let Decision::Routed(routed) = r.decide_with_matches(&req, &matches, now) {
                        live.push(routed.booking);
                    }
                }
                Op::FirstToken(i) if !live.is_empty() => {
                    let n = live.len();
                    r.first_token(live[i % n], now);
                }
                Op::Finish(i, o) if !live.is_empty() => {
                    let n = live.len();
                    let b = live.swap_remove(i % n);
                    r.finish(b, [Outcome::Finished, Outcome::Cancelled, Outcome::Error][o as usize]);
                }
                Op::Drop(i) if !live.is_empty() => {
                    let n = live.len();
                    r.abandon(live.swap_remove(i % n));
                }
                Op::Report { replica, running, waiting } => {
                    let rep = EngineReport {
                        running, waiting, kv_usage: 0.1,
                        prefix_cache_queries: 0, prefix_cache_hits: 0, timing: None, at: now,
                    };
                    r.report(ReplicaId(replica), rep).unwrap();
                }
                Op::PeerBook { peer, id, replica, tokens } => {
                    let c = LedgerChange::Book {
                        id, replica: ReplicaId(replica), prefill_tokens: tokens, blocks: tokens / 16,
                    };
                    r.apply_peer(PeerId(peer), &c, now);
                }
                Op::PeerFirst { peer, id } => {
                    r.apply_peer(PeerId(peer), &LedgerChange::FirstToken { id }, now);
                }
                Op::PeerFinish { peer, id } => {
                    r.apply_peer(PeerId(peer), &LedgerChange::Finish { id }, now);
                }
                Op::ForgetPeer(p) => {
                    r.forget_peer(PeerId(p));
                }
                Op::Advance(ms) => {
                    now += Duration::from_millis(ms);
                    r.maintain(now, None);
                }
                _ => {}
            }
            check_conservation(&r)?;
        }
        // Finishing or dropping everything empties the local books.
        drop(live);
        check_conservation(&r)?;
        r.maintain(now + Duration::from_secs(3600), None);
        prop_assert_eq!(r.in_flight(), 0);
        check_conservation(&r)?;
    }

    /// With zero overlap everywhere, `kv_aware` picks a least-loaded replica.
    #[test]
    fn no_overlap_means_least_load(
        pending in prop::array::uniform4(0u64..50_000),
        decoding in 0u32..8,
        tokens in 16u64..20_000,
    ) {
        let mut r = router(PolicyKind::KvAware, 0.0);
        let now = Instant::now();
        let mut id = 0;
        for (i, p) in pending.iter().enumerate() {
            if *p > 0 {
                id += 1;
                let c = LedgerChange::Book {
                    id, replica: ReplicaId(i as u32), prefill_tokens: *p, blocks: 0,
                };
                prop_assert!(r.apply_peer(PeerId(0), &c, now));
            }
            // The same number of decodes everywhere.
            for _ in 0..decoding {
                id += 1;
                let c = LedgerChange::Book {
                    id, replica: ReplicaId(i as u32), prefill_tokens: 0, blocks: 0,
                };
                r.apply_peer(PeerId(0), &c, now);
                r.apply_peer(PeerId(0), &LedgerChange::FirstToken { id }, now);
            }
        }
        let keys: Vec<BlockKey> = (0..tokens / 16).map(|k| BlockKey(k + 1)).collect();
        let req = RouteRequest { prompt_tokens: tokens, keys: &keys, ..RouteRequest::default() };
        let least = *pending.iter().min().unwrap();
        let routed = r.decide_with_matches(&req, &[], now).routed().unwrap();
        prop_assert_eq!(pending[routed.replica.index()], least, "{:?}", pending);
    }
}

/// With unequal decode counts too, the choice is never dominated: no other
/// replica has both fewer or equal pending tokens and fewer or equal decodes
/// with one strictly fewer.
#[test]
fn no_overlap_choice_is_never_dominated() {
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig::with_cases(500));
    let strat = (prop::array::uniform4(0u64..30_000), prop::array::uniform4(0u32..40), 16u64..8000);
    runner
        .run(&strat, |(pending, decoding, tokens)| {
            let mut r = router(PolicyKind::KvAware, 0.0);
            let now = Instant::now();
            let mut id = 0;
            for i in 0..REPLICAS as usize {
                id += 1;
                let c = LedgerChange::Book {
                    id,
                    replica: ReplicaId(i as u32),
                    prefill_tokens: pending[i],
                    blocks: 0,
                };
                r.apply_peer(PeerId(0), &c, now);
                for _ in 0..decoding[i] {
                    id += 1;
                    let c = LedgerChange::Book {
                        id,
                        replica: ReplicaId(i as u32),
                        prefill_tokens: 0,
                        blocks: 0,
                    };
                    r.apply_peer(PeerId(0), &c, now);
                    r.apply_peer(PeerId(0), &LedgerChange::FirstToken { id }, now);
                }
            }
            let keys: Vec<BlockKey> = (0..tokens / 16).map(|k| BlockKey(k + 1)).collect();
            let req =
                RouteRequest { prompt_tokens: tokens, keys: &keys, ..RouteRequest::default() };
            let c = r.decide_with_matches(&req, &[], now).routed().unwrap().replica.index();
            for j in 0..REPLICAS as usize {
                let dominates = pending[j] <= pending[c]
                    && decoding[j] <= decoding[c]
                    && (pending[j] < pending[c] || decoding[j] < decoding[c]);
                prop_assert!(!dominates, "chose {c} but {j} dominates: {pending:?} {decoding:?}");
            }
            Ok(())
        })
        .unwrap();
}
