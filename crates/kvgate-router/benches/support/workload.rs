//! The fleet, prompts and load shared by `benches/decide.rs` and
//! `examples/decide_latency.rs` (see the bench's docs for the shape).

#![allow(dead_code)]

#[path = "../../../kvgate-index/benches/support/fleet.rs"]
pub(crate) mod fleet;

use std::sync::Arc;
use std::time::{Duration, Instant};

use kvgate_index::{block_keys, BlockKey, Index, PrefixMatch, ReplicaId, ReplicaSpec, Tier};
use kvgate_router::{
    EngineReport, LedgerChange, PeerId, PolicyKind, ReplicaInfo, RouteRequest, Router,
    RouterConfig, RouterMetrics,
};

pub(crate) const REPLICAS: usize = 64;
pub(crate) const PROMPTS: usize = 64;
pub(crate) const PROMPT_BLOCKS: usize = 256;
pub(crate) const FAMILIES: usize = 16;
pub(crate) const FAMILIES_PER_REPLICA: usize = 4;
pub(crate) const BLOCKS_PER_REPLICA: u64 = 4096;
pub(crate) const TICK: Duration = Duration::from_micros(5);

/// The fleet's index, the prompts and their precomputed matches.
pub(crate) struct Workload {
    pub(crate) index: Index,
    pub(crate) ids: Vec<ReplicaId>,
    pub(crate) prompts: Vec<Vec<BlockKey>>,
    pub(crate) prompt_tokens: u64,
    pub(crate) matches: Vec<Vec<PrefixMatch>>,
    pub(crate) sessions: Vec<String>,
    pub(crate) start: Instant,
    /// Replicas, and blocks per prompt, of this shape.
    pub(crate) replicas: usize,
    pub(crate) prompt_blocks: usize,
}

/// The bench's shape: 64 replicas, 256-block prompts.
pub(crate) fn workload() -> Workload {
    workload_shaped(REPLICAS, PROMPT_BLOCKS)
}

/// The same construction with `replicas` replicas and prompts of
/// `prompt_blocks` blocks (a family prefix of at most 255 blocks, then the
/// prompt's own tokens; one replica holds each prompt whole).
pub(crate) fn workload_shaped(replicas: usize, prompt_blocks: usize) -> Workload {
    let families: Vec<Vec<u32>> = (0..FAMILIES as u64).map(fleet::family_tokens).collect();
    let bs = fleet::BLOCK_SIZE;
    // Prompt p: family p % 16 to a depth of 64..=255 blocks, then unique
    // tokens, plus a partial block (not keyed).
    let mut rng = fleet::Rng(0xdec1de);
    let prompt_tokens: Vec<Vec<u32>> = (0..PROMPTS)
        .map(|p| {
            let depth = (64 + rng.below(192) as usize).min(prompt_blocks);
            let mut t = families[p % FAMILIES][..depth * bs].to_vec();
            t.extend(rng.tokens((prompt_blocks - depth) * bs + 4));
            t
        })
        .collect();
    let start = Instant::now();
    let mut index = Index::new();
    let ids: Vec<ReplicaId> = (0..replicas)
        .map(|r| index.add_replica(ReplicaSpec::new(format!("r{r}"), 0, bs as u32)).unwrap())
        .collect();
    for (r, &id) in ids.iter().enumerate() {
        let mut rng = fleet::Rng(0x5eed ^ (r as u64).wrapping_mul(0x51_7cc1_b727_220a));
        let engine_seed = rng.next_u64();
        let store = |index: &mut Index, tokens: &[u32]| {
            for e in fleet::engine_events(tokens, engine_seed) {
                index.apply(id, &e, start);
            }
        };
        // The whole of one prompt.
        for p in (0..PROMPTS).filter(|p| p % replicas == r) {
            store(&mut index, &prompt_tokens[p]);
        }
        // Prefixes of a few families, each at two depths.
        for k in 0..FAMILIES_PER_REPLICA {
            let family = &families[(r * 3 + k) % FAMILIES];
            for _ in 0..2 {
                let depth = 8 + rng.below(216) as usize;
                let mut t = family[..depth * bs].to_vec();
                let suffix = 1 + rng.below(32) as usize;
                t.extend(rng.tokens(suffix * bs));
                store(&mut index, &t);
            }
        }
        // Unique filler up to the target size.
        while index.blocks_held(id, Tier::Gpu).unwrap() < BLOCKS_PER_REPLICA {
            let blocks = 16 + rng.below(112) as usize;
            let t = rng.tokens(blocks * bs);
            store(&mut index, &t);
        }
    }
    let prompts: Vec<Vec<BlockKey>> =
        prompt_tokens.iter().map(|t| block_keys(t, bs, None)).collect();
    let matches = prompts
        .iter()
        .map(|keys| {
            let mut out = Vec::new();
            index.find_matches(keys, &mut out);
            out
        })
        .collect();
    Workload {
        index,
        ids,
        prompts,
        prompt_tokens: (prompt_blocks * bs + 4) as u64,
        matches,
        sessions: (0..PROMPTS).map(|p| format!("session-{p}")).collect(),
        start,
        replicas,
        prompt_blocks,
    }
}

/// A router over the fleet with in-flight load and fresh engine reports.
pub(crate) fn router(w: &Workload, policy: PolicyKind, explain_last: usize) -> Router {
    let config = RouterConfig { policy, explain_last, seed: Some(42), ..RouterConfig::default() };
    let mut router = Router::new(config, Arc::new(RouterMetrics::default())).unwrap();
    for (r, &id) in w.ids.iter().enumerate() {
        let mut info = ReplicaInfo::new(format!("http://10.0.0.{r}:8000"), 16);
        info.capacity_blocks = [16_384, 0, 0];
        router.add_replica(id, info).unwrap();
    }
    load(&mut router, w, w.start);
    router
}

/// Books 0–5 requests per replica through the peer path (every other one
/// decoding) and sends matching engine reports. Repeating it at a later `now`
/// refreshes the bookings and reports without changing the load, so that
/// long criterion runs never see them expire or go stale.
pub(crate) fn load(router: &mut Router, w: &Workload, now: Instant) {
    let peer = PeerId(1);
    let mut next_id = 0u64;
    for (r, &id) in w.ids.iter().enumerate() {
        let bookings = r % 6;
        for b in 0..bookings {
            let change = LedgerChange::Book {
                id: next_id,
                replica: id,
                prefill_tokens: 500 + 700 * b as u64,
                blocks: 100 + 40 * b as u64,
            };
            router.apply_peer(peer, &change, now);
            if b % 2 == 1 {
                router.apply_peer(peer, &LedgerChange::FirstToken { id: next_id }, now);
            }
            next_id += 1;
        }
        let decoding = (bookings / 2) as u32;
        let report = EngineReport {
            running: decoding,
            waiting: bookings as u32 - decoding,
            kv_usage: 0.2 + 0.1 * (r % 8) as f64,
            prefix_cache_queries: 0,
            prefix_cache_hits: 0,
            timing: None,
            at: now,
        };
        router.report(id, report).unwrap();
    }
}

/// Refreshes the load every 2^16 decisions (about 0.33 s of router time).
pub(crate) fn tick(router: &mut Router, w: &Workload, now: &mut Instant, n: &mut u64) {
    *now += TICK;
    *n += 1;
    if n.is_multiple_of(1 << 16) {
        load(router, w, *now);
    }
}

pub(crate) fn request<'a>(w: &'a Workload, p: usize) -> RouteRequest<'a> {
    RouteRequest {
        prompt_tokens: w.prompt_tokens,
        keys: &w.prompts[p],
        max_output_tokens: Some(256),
        session_key: Some(&w.sessions[p]),
        approx_symbols: None,
        queued_since: None,
        exclude: &[],
        adapter: None,
        remote_kv_s_per_token: None,
        already_running: false,
    }
}
