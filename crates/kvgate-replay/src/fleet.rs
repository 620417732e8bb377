//! The virtual-time fleet: N simulated vLLM engines, one KV index fed by
//! their own events, and one router, driven by a discrete-event loop. It grew
//! out of `kvgate-router`'s scenario-test fleet (`tests/support/mod.rs`).
//!
//! - Requests arrive at their (scaled) times; at each arrival the router
//!   decides (`now = base + virtual time`) and the request joins the chosen
//!   engine's waiting queue (an idle engine's clock jumps to the arrival).
//! - Engines step in time order: the engine with the earliest clock among
//!   those with work steps next, never starting a step after the next
//!   event. A step's outputs happen at its end: its KV events reach the
//!   index after `event_delay`, first tokens call `Booking::first_token`,
//!   finished requests `Booking::finish`.
//! - Every `report_every` each engine's stats reach the router as an
//!   `EngineReport` (a `/metrics` scrape); every second of virtual time the
//!   per-replica load is sampled for the load-over-time chart.
//!
//! Everything is deterministic for a given workload, rate and seed, except
//! the measured wall time of each decision.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kvgate_events::Event;
use kvgate_index::{block_keys, Index, PrefixMatch, ReplicaId, ReplicaSpec};
use kvgate_router::{
    Booking, Decision, EngineReport, EngineTiming, Outcome, ReplicaInfo, RouteRequest, Router,
    RouterConfig, RouterMetrics,
};
use kvgate_sim::{Engine, EngineConfig, EngineStats, Tracker};
use rustc_hash::FxHashMap;

use crate::capacity::FleetSpec;
use crate::error::ReplayError;
use crate::workload::Workload;

/// Virtual time between two load samples.
const SAMPLE_EVERY: Duration = Duration::from_secs(1);

/// Everything recorded about one request.
#[derive(Clone, Debug, Default)]
pub struct Record {
    /// Position of the chosen replica in the fleet; `None` if not served.
    pub replica: Option<usize>,
    /// Arrival, virtual.
    pub arrival: Duration,
    /// Prompt tokens.
    pub prompt_tokens: u32,
    /// Output tokens asked for.
    pub output_tokens: u32,
    /// First token, virtual.
    pub first_token_at: Option<Duration>,
    /// Last token, virtual.
    pub finished_at: Option<Duration>,
    /// Prompt tokens the engine served from cache at first admission.
    pub cached_tokens: u32,
    /// Wall-clock time of `Router::decide`, nanoseconds.
    pub decide_ns: u64,
    /// Prefix blocks the router counted as cached on the chosen replica
    /// (events plus tentative).
    pub routed_cached_blocks: u32,
    /// The longest prefix (blocks, any tier) the index showed on any replica.
    pub best_indexed_blocks: u32,
}

/// Requests in each replica's engine (running + waiting) at one moment.
#[derive(Clone, Debug, PartialEq)]
pub struct LoadSample {
    /// Virtual time, seconds.
    pub at_s: f64,
    /// Requests per replica.
    pub requests: Vec<u32>,
}

/// Something that happens at a point of virtual time, other than a step.
#[derive(Debug)]
enum Delivery {
    /// A step's KV events reach the index.
    Events { replica: usize, events: Vec<Event> },
    /// A first token (and maybe the end) of a request reaches the router.
    Token { request: usize, is_first: bool, finished: bool, cached_tokens: u32 },
}

/// The fleet after a run, with what it recorded.
#[derive(Debug)]
pub struct Fleet {
    base: Instant,
    engines: Vec<Engine>,
    clocks: Vec<Duration>,
    /// Each engine's request timelines, and the totals of vLLM's
    /// request-level metrics they give: the same numbers `kvgate sim`
    /// exports, reported to the router as a scrape would.
    trackers: Vec<Tracker>,
    timing: Vec<EngineTiming>,
    ids: Vec<ReplicaId>,
    index: Index,
    router: Router,
    event_delay: Duration,
    report_every: Duration,
    now: Duration,
    next_report: Duration,
    next_sample: Duration,
    deliveries: BinaryHeap<Reverse<(Duration, u64)>>,
    delivery_items: FxHashMap<u64, Delivery>,
    next_seq: u64,
    bookings: FxHashMap<usize, Booking>,
    scratch_matches: Vec<PrefixMatch>,
    /// One per workload request, in order.
    pub records: Vec<Record>,
    /// Per-replica load over time.
    pub samples: Vec<LoadSample>,
    /// Prefill tokens each engine computed.
    pub prefill_tokens: Vec<u64>,
    /// Requests not served (the router refused, or the engine rejected them).
    pub unserved: u64,
}

impl Fleet {
    /// A fleet as `spec` describes, under `router`.
    pub fn new(spec: &FleetSpec, router: RouterConfig) -> Result<Fleet, ReplayError> {
        let bad = |e: String| ReplayError::InvalidFleet(e);
        if spec.replicas == 0 {
            return Err(bad("at least one replica is needed".into()));
        }
        let mut index = Index::new();
        let mut router = Router::new(router, Arc::new(RouterMetrics::default()))
            .map_err(|e| bad(e.to_string()))?;
        let mut ids = Vec::new();
        let mut engines = Vec::new();
        for i in 0..spec.replicas {
            let c = EngineConfig {
                hash_seed: spec.engine.hash_seed.map(|s| s.wrapping_add(i as u64)),
                ..spec.engine.clone()
            };
            let name = format!("replica-{i}");
            let gpu = u64::from(c.num_gpu_blocks);
            let cpu = u64::from(c.num_cpu_blocks);
            let mut rs = ReplicaSpec::new(name.clone(), 0, c.block_size);
            rs.capacity_blocks = [Some(gpu), Some(cpu), None];
            let id = index.add_replica(rs).map_err(|e| bad(e.to_string()))?;
            let info = ReplicaInfo {
                name,
                block_size: c.block_size,
                capacity_blocks: [gpu, cpu, 0],
                max_num_batched_tokens: c.max_num_batched_tokens,
            };
            router.add_replica(id, info).map_err(|e| bad(e.to_string()))?;
            ids.push(id);
            engines.push(Engine::new(c).map_err(|e| bad(e.to_string()))?);
        }
        let n = engines.len();
        Ok(Fleet {
            base: Instant::now(),
            engines,
            clocks: vec![Duration::ZERO; n],
            trackers: (0..n).map(|_| Tracker::default()).collect(),
            timing: vec![EngineTiming::default(); n],
            ids,
            index,
            router,
            event_delay: spec.event_delay,
            report_every: spec.report_every.max(Duration::from_millis(1)),
            now: Duration::ZERO,
            next_report: Duration::ZERO,
            next_sample: Duration::ZERO,
            deliveries: BinaryHeap::new(),
            delivery_items: FxHashMap::default(),
            next_seq: 0,
            bookings: FxHashMap::default(),
            scratch_matches: Vec::new(),
            records: Vec::new(),
            samples: Vec::new(),
            prefill_tokens: vec![0; n],
            unserved: 0,
        })
    }

    /// Engine stats per replica.
    pub fn engine_stats(&self) -> Vec<EngineStats> {
        self.engines.iter().map(Engine::stats).collect()
    }

    /// The KV index the engines' events fed.
    pub fn index(&self) -> &Index {
        &self.index
    }

    /// The router (ledger totals, tentative stats, ...).
    pub fn router(&self) -> &Router {
        &self.router
    }

    /// Virtual time of the last thing processed.
    pub fn now(&self) -> Duration {
        self.now
    }

    /// Replays `workload` at `rate_scale` × its rate until every request has
    /// finished. `progress` is called with the number of requests that
    /// arrived since the last call.
    pub fn run(&mut self, workload: &Workload, rate_scale: f64, progress: &dyn Fn(u64)) {
        let n = workload.requests.len();
        self.records = Vec::with_capacity(n);
        let mut next = 0usize;
        let mut unreported = 0u64;
        loop {
            let next_delivery = self.deliveries.peek().map(|r| r.0 .0);
            let next_arrival = (next < n).then(|| workload.arrival(next, rate_scale));
            let next_step = (0..self.engines.len())
                .filter(|&i| self.engines[i].has_work())
                .min_by_key(|&i| (self.clocks[i], i));
            let step_at = next_step.map(|i| self.clocks[i]);
            // While the whole fleet is idle, reports would repeat themselves:
            // the next one comes with the next arrival.
            let report_at = if next_delivery.is_some() || step_at.is_some() {
                Some(self.next_report)
            } else {
                next_arrival.map(|a| self.next_report.max(a))
            };
            // Ties: deliveries, then reports, then arrivals, then steps.
            let candidates =
                [(next_delivery, 0u8), (report_at, 1), (next_arrival, 2), (step_at, 3)];
            let Some((t, kind)) =
                candidates.iter().filter_map(|&(t, k)| t.map(|t| (t, k))).min_by_key(|&x| x)
            else {
                break;
            };
            self.now = self.now.max(t);
            match (kind, next_step) {
                (0, _) => self.deliver_next(),
                (1, _) => self.report_all(t),
                (2, _) => {
                    self.arrive(workload, next, t);
                    next += 1;
                    unreported += 1;
                    if unreported >= 256 {
                        progress(unreported);
                        unreported = 0;
                    }
                }
                (_, Some(i)) => self.step(i),
                _ => break,
            }
        }
        progress(unreported);
    }

    fn schedule(&mut self, at: Duration, d: Delivery) {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.deliveries.push(Reverse((at, seq)));
        self.delivery_items.insert(seq, d);
    }

    fn deliver_next(&mut self) {
        let Some(Reverse((at, seq))) = self.deliveries.pop() else { return };
        let now = self.base + at;
        match self.delivery_items.remove(&seq) {
            Some(Delivery::Events { replica, events }) => {
                self.index.apply_events(self.ids[replica], &events, now);
            }
            Some(Delivery::Token { request, is_first, finished, cached_tokens }) => {
                let rec = &mut self.records[request];
                if is_first {
                    rec.first_token_at = Some(at);
                    rec.cached_tokens = cached_tokens;
                    if let Some(&b) = self.bookings.get(&request) {
                        self.router.first_token(b, now);
                    }
                }
                if finished {
                    rec.finished_at = Some(at);
                    if let Some(b) = self.bookings.remove(&request) {
                        self.router.finish(b, Outcome::Finished);
                    }
                }
            }
            None => {}
        }
    }

    fn report_all(&mut self, t: Duration) {
        let at = self.base + t;
        let sample = t >= self.next_sample;
        let mut requests = Vec::new();
        for i in 0..self.engines.len() {
            let s = self.engines[i].stats();
            let report = EngineReport {
                running: s.running as u32,
                waiting: s.waiting as u32,
                kv_usage: s.kv_usage,
                prefix_cache_queries: s.prefix_cache_queries,
                prefix_cache_hits: s.prefix_cache_hits,
                timing: Some(self.timing[i]),
                at,
            };
            // The replica exists: it was added in `new`.
            let _ = self.router.report(self.ids[i], report);
            if sample {
                requests.push((s.running + s.waiting) as u32);
            }
        }
        if sample {
            self.samples.push(LoadSample { at_s: t.as_secs_f64(), requests });
            self.next_sample = t + SAMPLE_EVERY;
        }
        self.next_report = t + self.report_every;
    }

    fn arrive(&mut self, workload: &Workload, i: usize, at: Duration) {
        let r = &workload.requests[i];
        let tokens = r.prompt.tokens();
        let mut rec = Record {
            arrival: at,
            prompt_tokens: tokens.len() as u32,
            output_tokens: r.output_tokens,
            ..Record::default()
        };
        let block_size = self.engines[0].config().block_size as usize;
        let keys = block_keys(&tokens, block_size, None);
        let req = RouteRequest {
            prompt_tokens: tokens.len() as u64,
            keys: &keys,
            max_output_tokens: Some(r.output_tokens),
            approx_symbols: Some(&tokens),
            ..RouteRequest::default()
        };
        self.index.find_matches(&keys, &mut self.scratch_matches);
        rec.best_indexed_blocks = self.scratch_matches.iter().map(|m| m.total).max().unwrap_or(0);
        let now = self.base + at;
        let t0 = Instant::now();
        let decision = self.router.decide(&req, &self.index, now);
        rec.decide_ns = t0.elapsed().as_nanos() as u64;
        let Decision::Routed(routed) = decision else {
            // No admission limits are set by replay; count it if it happens.
            self.unserved += 1;
            self.records.push(rec);
            return;
        };
        let Some(replica) = self.ids.iter().position(|&id| id == routed.replica) else {
            self.unserved += 1;
            self.records.push(rec);
            return;
        };
        rec.routed_cached_blocks = routed.cached_blocks;
        if !self.engines[replica].has_work() {
            self.clocks[replica] = self.clocks[replica].max(at);
        }
        let prompt_len = tokens.len();
        let added = self.engines[replica].add_request(
            i as u64,
            tokens,
            r.output_tokens,
            r.output_tokens,
            true,
            at,
        );
        if added.is_err() {
            self.router.finish(routed.booking, Outcome::Error);
            self.unserved += 1;
        } else {
            self.trackers[replica].add(i as u64, prompt_len, at);
            rec.replica = Some(replica);
            self.bookings.insert(i, routed.booking);
        }
        self.records.push(rec);
    }

    fn step(&mut self, i: usize) {
        let start = self.clocks[i];
        let out = self.engines[i].step(start);
        let end = start + out.duration;
        self.clocks[i] = end;
        self.prefill_tokens[i] += out.prefill_tokens;
        let step = self.trackers[i].step(start, &out);
        let t = &mut self.timing[i];
        for f in &step.finished {
            t.requests += 1;
            t.prefill_s += f.prefill;
            t.queue_s += f.queue;
            t.computed_tokens += u64::from(f.prefill_kv_computed_tokens);
        }
        t.itl_count += step.itl.len() as u64;
        t.itl_s += step.itl.iter().sum::<f64>();
        if !out.events.is_empty() {
            let events = out.events;
            self.schedule(end + self.event_delay, Delivery::Events { replica: i, events });
        }
        for t in out.tokens {
            if t.is_first || t.finished.is_some() {
                self.schedule(
                    end,
                    Delivery::Token {
                        request: t.request_id as usize,
                        is_first: t.is_first,
                        finished: t.finished.is_some(),
                        cached_tokens: t.cached_tokens,
                    },
                );
            }
        }
    }
}
