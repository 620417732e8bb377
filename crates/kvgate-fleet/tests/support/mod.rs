//! Scenario tests' driver: N simulated vLLM engines in front of the fleet
//! core `kvgate serve` drives (`kvgate_fleet::Fleet`: the KV index, the
//! router, the replicas' health rules), through a discrete-event loop that
//! hands the core what a gateway's shell would: scrapes, event batches,
//! first tokens and ends, at virtual time. Unlike fast-mode replay's loop
//! (`kvgate-replay`'s `fleet.rs`), it takes requests one at a time, runs
//! until a chosen instant, and flushes or swaps engines mid-run.
//!
//! - Replicas come into rotation at the first scrape, at time 0.
//! - Requests arrive at given virtual times; at each arrival the core
//!   routes (`now = base + virtual time`) and the request joins the chosen
//!   engine's waiting queue (an idle engine's clock jumps to the arrival).
//! - Engines step in time order: the engine with the earliest clock among
//!   those with work steps next, never starting a step after the next
//!   arrival. A step's outputs happen at its end time: its KV events are
//!   applied to the index then (plus an optional delay), first tokens call
//!   `Booking::first_token`, finished requests `Booking::finish`.
//! - Every `report_every` of virtual time each replica's engine stats reach
//!   the core as a scrape (without request timings: calibration starts from
//!   the priors and learns from first tokens), the core ticks, and the
//!   ledger's pending prefill tokens are sampled.
//!
//! Everything is deterministic: engines hash with a fixed seed and the
//! router is seeded.

#![allow(dead_code)]

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kvgate_events::{Batch, Event};
use kvgate_fleet::{EngineScrape, HealthRules};
use kvgate_index::{block_keys, ReplicaId};
use kvgate_router::{
    Booking, Decision, Explanation, Outcome, PolicyKind, RouteRequest, Router, RouterConfig,
    RouterMetrics,
};
use kvgate_sim::{Engine, EngineConfig, Timeline, TimingModel};

/// Tokens per KV block in every scenario.
pub(crate) const BLOCK_SIZE: u32 = 16;

/// An engine config for scenarios: 16-token blocks, 8192 GPU blocks, the
/// llm-d Qwen3-32B timing, fixed hash seed, no EOS.
pub(crate) fn engine_config(timing: TimingModel) -> EngineConfig {
    EngineConfig {
        block_size: BLOCK_SIZE,
        num_gpu_blocks: 8192,
        hash_seed: Some(7),
        timing,
        ..EngineConfig::default()
    }
}

/// A seeded router config for `policy`.
pub(crate) fn router_config(policy: PolicyKind) -> RouterConfig {
    RouterConfig { policy, seed: Some(42), explain_last: 4096, ..RouterConfig::default() }
}

/// Everything recorded about one request.
#[derive(Clone, Debug)]
pub(crate) struct Record {
    /// Position of the chosen replica in the fleet.
    pub(crate) replica: usize,
    pub(crate) arrival: Duration,
    pub(crate) prompt_tokens: u64,
    /// Time of the first token minus arrival.
    pub(crate) ttft: Option<Duration>,
    pub(crate) finished_at: Option<Duration>,
    /// Prompt tokens the engine served from cache.
    pub(crate) cached_tokens: u32,
    /// The router's prediction at decision time, seconds.
    pub(crate) predicted_ttft_s: f64,
    /// Cached blocks the router counted (events plus tentative).
    pub(crate) router_cached_blocks: u32,
    pub(crate) explanation: Option<Arc<Explanation>>,
}

impl Record {
    pub(crate) fn ttft_s(&self) -> f64 {
        self.ttft.expect("request has a first token").as_secs_f64()
    }
}

/// Something that happens at a point of virtual time, other than a step.
#[derive(Debug)]
enum Delivery {
    /// A step's KV events reach the index.
    Events { replica: usize, events: Vec<Event> },
    /// A first token (and maybe the end) of a request reaches the router.
    Token { request: u64, is_first: bool, finished: bool, cached_tokens: u32 },
}

#[derive(Debug)]
struct Arrival {
    at: Duration,
    request: u64,
    tokens: Vec<u32>,
    max_tokens: u32,
}

/// Per-replica gauges sampled at report ticks.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Gauges {
    pub(crate) max_pending_prefill_tokens: u64,
    pub(crate) max_waiting: usize,
}

/// The fleet.
#[derive(Debug)]
pub(crate) struct Fleet {
    pub(crate) base: Instant,
    pub(crate) engines: Vec<Engine>,
    pub(crate) clocks: Vec<Duration>,
    pub(crate) ids: Vec<ReplicaId>,
    core: kvgate_fleet::Fleet,
    pub(crate) records: Vec<Record>,
    pub(crate) gauges: Vec<Gauges>,
    /// Extra delay between a step's end and its events reaching the index.
    pub(crate) event_delay: Duration,
    pub(crate) report_every: Duration,
    /// Virtual time of the last thing processed.
    pub(crate) now: Duration,
    next_report: Duration,
    arrivals: Vec<Arrival>,
    deliveries: Timeline<Delivery>,
    bookings: HashMap<u64, Booking>,
    /// Replicas to flush (prefix-cache reset) at or after the given time.
    flushes: Vec<(usize, Duration)>,
    /// When each requested flush took effect.
    pub(crate) flushed_at: Vec<(usize, Duration)>,
}

impl Fleet {
    /// A fleet of `configs.len()` replicas under `router`.
    pub(crate) fn new(configs: Vec<EngineConfig>, router: RouterConfig) -> Fleet {
        let router =
            Router::new(router, Arc::new(RouterMetrics::default())).expect("valid router config");
        let mut core = kvgate_fleet::Fleet::new(vec![router], HealthRules::default());
        let mut ids = Vec::new();
        let mut engines = Vec::new();
        for (i, c) in configs.into_iter().enumerate() {
            let id = core.add(&format!("replica-{i}"), 0, c.block_size, true, 0).unwrap();
            ids.push(id);
            engines.push(Engine::new(c).unwrap());
        }
        let n = engines.len();
        let mut fleet = Fleet {
            base: Instant::now(),
            engines,
            clocks: vec![Duration::ZERO; n],
            ids,
            core,
            records: Vec::new(),
            gauges: vec![Gauges::default(); n],
            event_delay: Duration::ZERO,
            report_every: Duration::from_millis(100),
            now: Duration::ZERO,
            next_report: Duration::ZERO,
            arrivals: Vec::new(),
            deliveries: Timeline::default(),
            bookings: HashMap::new(),
            flushes: Vec::new(),
            flushed_at: Vec::new(),
        };
        // The first scrape brings every replica into rotation.
        fleet.report_all(Duration::ZERO);
        fleet
    }

    /// The router (its config, ledger and calibration).
    pub(crate) fn router(&self) -> &Router {
        self.core.router()
    }

    /// `n` identical replicas with `timing`, under `policy`.
    pub(crate) fn uniform(n: usize, timing: TimingModel, policy: PolicyKind) -> Fleet {
        Fleet::new(vec![engine_config(timing); n], router_config(policy))
    }

    pub(crate) fn instant(&self, t: Duration) -> Instant {
        self.base + t
    }

    /// Queues a request arriving at `at` (not before the fleet's present);
    /// returns its request id (its index in `records` once routed).
    pub(crate) fn submit(&mut self, at: Duration, tokens: Vec<u32>, max_tokens: u32) -> u64 {
        let request = (self.records.len() + self.arrivals.len()) as u64;
        let at = at.max(self.now);
        let pos = self.arrivals.partition_point(|a| a.at <= at);
        self.arrivals.insert(pos, Arrival { at, request, tokens, max_tokens });
        request
    }

    /// Asks for `replica`'s prefix cache to be reset at or after `at`, as
    /// soon as the engine has nothing running (vLLM refuses otherwise).
    pub(crate) fn flush_at(&mut self, replica: usize, at: Duration) {
        self.flushes.push((replica, at));
    }

    /// Swaps replica `i`'s engine for a fresh one (empty cache) built from
    /// `config`. The engine must be idle. The core hears of it as a gateway
    /// would of a restarted engine, by its view being lost (cleared, and
    /// degraded until rebuilt); its timing it must learn by itself.
    pub(crate) fn replace_engine(&mut self, i: usize, config: EngineConfig) {
        assert!(!self.engines[i].has_work(), "replace an idle engine only");
        self.engines[i] = Engine::new(config).unwrap();
        let (id, now) = (self.ids[i], self.instant(self.now));
        self.core.view_lost(id, "engine replaced".into(), now);
        while self.core.clear_step(id, usize::MAX).0 > 0 {}
    }

    /// Runs until every request submitted so far has finished.
    pub(crate) fn run_to_idle(&mut self) {
        self.run_until(Duration::MAX);
    }

    /// Processes everything that happens at or before `limit` (a step that
    /// starts before it may end after it; its outputs wait until then).
    pub(crate) fn run_until(&mut self, limit: Duration) {
        loop {
            self.try_flushes();
            let next_delivery = self.deliveries.next_at();
            let next_arrival = self.arrivals.first().map(|a| a.at);
            let next_step = (0..self.engines.len())
                .filter(|&i| self.engines[i].has_work())
                .min_by_key(|&i| (self.clocks[i], i));
            let step_at = next_step.map(|i| self.clocks[i]);
            let busy = next_delivery.is_some() || next_arrival.is_some() || step_at.is_some();
            let report_at = busy.then_some(self.next_report);
            // Ties: deliveries, then reports, then arrivals, then steps.
            let candidates =
                [(next_delivery, 0u8), (report_at, 1), (next_arrival, 2), (step_at, 3)];
            let Some((t, kind)) = candidates
                .iter()
                .filter_map(|&(t, k)| t.map(|t| (t, k)))
                .min_by_key(|&(t, k)| (t, k))
            else {
                break;
            };
            if t > limit {
                break;
            }
            self.now = self.now.max(t);
            match kind {
                0 => self.deliver_next(),
                1 => self.report_all(t),
                2 => self.arrive(),
                _ => self.step(next_step.expect("a stepping engine")),
            }
        }
        if limit != Duration::MAX {
            self.now = self.now.max(limit);
            self.try_flushes();
        }
    }

    fn try_flushes(&mut self) {
        let mut i = 0;
        while i < self.flushes.len() {
            let (r, at) = self.flushes[i];
            // The engine's present: its clock, or the fleet's if it is idle.
            let present = if self.engines[r].has_work() { self.clocks[r] } else { self.now };
            if present >= at && self.engines[r].reset_prefix_cache() {
                self.flushes.swap_remove(i);
                self.flushed_at.push((r, present));
                if !self.engines[r].has_work() {
                    // No step will come soon: publish AllCleared now.
                    self.clocks[r] = self.clocks[r].max(present);
                    let out = self.engines[r].step(self.clocks[r]);
                    let when = self.clocks[r] + self.event_delay;
                    self.schedule(when, Delivery::Events { replica: r, events: out.events });
                }
            } else {
                i += 1;
            }
        }
    }

    fn schedule(&mut self, at: Duration, d: Delivery) {
        self.deliveries.schedule(at, d);
    }

    fn deliver_next(&mut self) {
        let Some((at, delivery)) = self.deliveries.pop() else { return };
        let now = self.instant(at);
        match delivery {
            Delivery::Events { replica, events } => {
                let batch =
                    Batch { ts: at.as_secs_f64(), events, dp_rank: None, skipped_events: 0 };
                self.core.apply_events(self.ids[replica], &batch, now);
            }
            Delivery::Token { request, is_first, finished, cached_tokens } => {
                let rec = &mut self.records[request as usize];
                if is_first {
                    rec.ttft = Some(at - rec.arrival);
                    rec.cached_tokens = cached_tokens;
                    if let Some(&b) = self.bookings.get(&request) {
                        self.core.first_token(b, now);
                    }
                }
                if finished {
                    rec.finished_at = Some(at);
                    if let Some(b) = self.bookings.remove(&request) {
                        self.core.finish(b, Outcome::Finished);
                    }
                }
            }
        }
    }

    fn report_all(&mut self, t: Duration) {
        let at = self.instant(t);
        self.core.tick(at);
        for i in 0..self.engines.len() {
            let s = self.engines[i].stats();
            let c = self.engines[i].config();
            let scrape = EngineScrape {
                running: s.running as u32,
                waiting: s.waiting as u32,
                kv_usage: s.kv_usage,
                prefix_queries: s.prefix_cache_queries,
                prefix_hits: s.prefix_cache_hits,
                block_size: Some(c.block_size),
                num_gpu_blocks: Some(u64::from(c.num_gpu_blocks)),
                num_cpu_blocks: Some(u64::from(c.num_cpu_blocks)),
                step_budget: Some(c.max_num_batched_tokens),
                ..EngineScrape::default()
            };
            self.core.probe_succeeded(self.ids[i], Ok(scrape), at);
            let load = self.core.router().load(self.ids[i]).unwrap().load;
            let g = &mut self.gauges[i];
            g.max_pending_prefill_tokens =
                g.max_pending_prefill_tokens.max(load.pending_prefill_tokens);
            g.max_waiting = g.max_waiting.max(s.waiting);
        }
        self.next_report = t + self.report_every;
    }

    fn arrive(&mut self) {
        let a = self.arrivals.remove(0);
        let now = self.instant(a.at);
        let keys = block_keys(&a.tokens, BLOCK_SIZE as usize, None);
        let req = RouteRequest {
            prompt_tokens: a.tokens.len() as u64,
            keys: &keys,
            max_output_tokens: Some(a.max_tokens),
            ..RouteRequest::default()
        };
        let Decision::Routed(routed) = self.core.route(0, &req, now) else {
            panic!("no admission limits in scenarios: every request is routed")
        };
        let replica = self.ids.iter().position(|&id| id == routed.replica).expect("known replica");
        assert_eq!(a.request as usize, self.records.len(), "arrivals in submission order");
        self.records.push(Record {
            replica,
            arrival: a.at,
            prompt_tokens: a.tokens.len() as u64,
            ttft: None,
            finished_at: None,
            cached_tokens: 0,
            predicted_ttft_s: routed.predicted_ttft_s,
            router_cached_blocks: routed.cached_blocks,
            explanation: routed.explanation,
        });
        self.bookings.insert(a.request, routed.booking);
        if !self.engines[replica].has_work() {
            self.clocks[replica] = self.clocks[replica].max(a.at);
        }
        self.engines[replica]
            .add_request(a.request, a.tokens, a.max_tokens, a.max_tokens, true, a.at)
            .unwrap();
    }

    fn step(&mut self, i: usize) {
        let start = self.clocks[i];
        let out = self.engines[i].step(start);
        let end = start + out.duration;
        self.clocks[i] = end;
        if !out.events.is_empty() {
            self.schedule(
                end + self.event_delay,
                Delivery::Events { replica: i, events: out.events },
            );
        }
        for t in out.tokens {
            if t.is_first || t.finished.is_some() {
                self.schedule(
                    end,
                    Delivery::Token {
                        request: t.request_id,
                        is_first: t.is_first,
                        finished: t.finished.is_some(),
                        cached_tokens: t.cached_tokens,
                    },
                );
            }
        }
    }

    /// Requests routed to each replica among `records[range]`.
    pub(crate) fn counts(&self, range: std::ops::Range<usize>) -> Vec<usize> {
        let mut c = vec![0; self.engines.len()];
        for r in &self.records[range] {
            c[r.replica] += 1;
        }
        c
    }

    /// Prefix-cache hit tokens over the whole fleet (engine stats).
    pub(crate) fn hit_tokens(&self) -> u64 {
        self.engines.iter().map(|e| e.stats().prefix_cache_hits).sum()
    }
}

/// A deterministic generator (splitmix64) for prompts and arrival times.
#[derive(Clone, Debug)]
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub(crate) fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Exponential with the given mean.
    pub(crate) fn exp(&mut self, mean: Duration) -> Duration {
        mean.mul_f64(-(1.0 - self.unit()).ln())
    }

    /// `n` random token ids (below the engines' filler range's reach).
    pub(crate) fn tokens(&mut self, n: usize) -> Vec<u32> {
        (0..n).map(|_| 10_000 + (self.next_u64() % 100_000) as u32).collect()
    }
}

/// The `q`-quantile (0–1) of `xs` (nearest rank).
pub(crate) fn quantile(xs: &[f64], q: f64) -> f64 {
    assert!(!xs.is_empty(), "quantile of nothing");
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    let k = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1;
    v[k]
}
