//! The virtual-time fleet: N simulated vLLM engines in front of the same
//! fleet core `kvgate serve` drives (`kvgate_fleet::Fleet`: the KV index,
//! one router per model pool with its ledger and calibration, every
//! replica's status and health rules, a P/D pool's planner), driven by a
//! discrete-event loop. What the gateway's shell learns from its engines
//! (events, `/metrics` scrapes with NIXL's transfer totals, first tokens
//! and ends) the loop hands the core in the same calls, at virtual time.
//!
//! - Replicas come into rotation at the first scrape (at time 0, before the
//!   first arrival), as a live fleet's do at their first probe; the core
//!   ticks at every scrape (`kvgate serve` ticks every 250 ms; the router's
//!   expiries also run at every decision).
//! - The one rule the shells still differ on: a simulated engine reports
//!   its `max_num_batched_tokens` (`EngineScrape::step_budget`); vLLM's
//!   `/metrics` does not, so `serve`'s router keeps its default.
//!
//! - A request goes to its model's pool only: that pool's router decides
//!   among that pool's replicas, for every policy alike (the same model
//!   filter a gateway applies before routing). The engine checks the model
//!   it serves anyway and counts a mismatch in `model_violations`.
//! - With adapters in the workload, every report also tells each router
//!   its engines' LoRA slot count and running and waiting adapters, as
//!   `vllm:lora_requests_info` would.
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

use std::sync::Arc;
use std::time::{Duration, Instant};

use kvgate_events::{Batch, Event};
use kvgate_fleet::{EngineScrape, HealthRules, LoraScrape, Role, TransferTotals};
use kvgate_index::{Index, PrefixMatch, ReplicaId};
use kvgate_router::{
    Booking, Decision, Disagg, DisaggConfig, EngineTiming, Outcome, RouteRequest, Router,
    RouterConfig, RouterMetrics,
};
use kvgate_sim::{CacheIdentity, Engine, EngineConfig, EngineStats, Timeline, Tracker};
use rustc_hash::FxHashMap;

use crate::capacity::FleetSpec;
use crate::error::ReplayError;
use crate::workload::Workload;

mod disagg;
mod journal;

use disagg::{SplitHop, PREFILL_HOP};
pub use journal::CoreInput;

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
    /// Disaggregated: prefilled on another replica than `replica`, which
    /// decoded it; `cached_tokens` is then the prefill replica's hit, as
    /// vLLM's decode side reports it.
    pub split: bool,
    /// The routers' predicted TTFT, seconds, at the decision: the chosen
    /// candidate's (a split request's: its prefill hop's plus its decode
    /// hop's, whose booking expects the KV by transfer). Compared with the
    /// TTFT measured, it shows where the cost model is wrong.
    pub predicted_ttft_s: f64,
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
    /// A disaggregated request's prefill hop finished on its prefill replica.
    PrefillDone { request: usize, cached_tokens: u32 },
    /// Its KV reached its decode replica, which now takes the decode hop.
    Transfer { request: usize },
}

/// The fleet after a run, with what it recorded.
#[derive(Debug)]
pub struct Fleet {
    base: Instant,
    engines: Vec<Engine>,
    /// Pool of each replica (a P/D fleet's: 0 prefills, 1 decodes).
    pub(crate) pool_of: Vec<usize>,
    /// The fleet core, as `kvgate serve` drives it.
    core: kvgate_fleet::Fleet,
    /// Each pool's router among the core's (`kvgate_fleet::Fleet::routers`):
    /// a model pool's own; a P/D fleet is one core pool whose prefill side
    /// routes replay's pool 0.
    router_slot: Vec<usize>,
    /// The model each pool serves (`None`: any, a one-pool fleet).
    pool_models: Vec<Option<String>>,
    /// Whether routers hear of adapters (the workload names some).
    adapters: bool,
    clocks: Vec<Duration>,
    /// Each engine's request timelines, and the totals of vLLM's
    /// request-level metrics they give: the same numbers `kvgate sim`
    /// exports, reported to the router as a scrape would.
    trackers: Vec<Tracker>,
    timing: Vec<EngineTiming>,
    ids: Vec<ReplicaId>,
    event_delay: Duration,
    report_every: Duration,
    now: Duration,
    next_report: Duration,
    next_sample: Duration,
    deliveries: Timeline<Delivery>,
    /// Open bookings by request (the core finds a booking's router by its
    /// id).
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
    /// Requests routed to a replica that does not serve their model (must
    /// stay 0: the pools make it impossible; the engine side checks).
    pub model_violations: u64,
    /// Requests naming a model no pool serves (not served).
    pub unknown_model: u64,
    /// A P/D fleet (pool 0 prefills, pool 1 decodes): the core's pool 0
    /// plans its requests.
    disagg: bool,
    /// The physical prefill-to-decode link of a P/D fleet: seconds per token.
    transfer_s_per_token: f64,
    /// KV bytes per transferred token (what NIXL's byte counter counts).
    kv_bytes_per_token: f64,
    /// Each decode engine's NIXL totals, as its `/metrics` would report
    /// them (`None` on other replicas).
    transfer_totals: Vec<Option<TransferTotals>>,
    /// Split requests between their prefill hop's admission and their
    /// decode hop's.
    hops: FxHashMap<usize, SplitHop>,
    /// Each transfer of a split request: (tokens, seconds).
    pub transfers: Vec<(u64, f64)>,
    /// What the loop handed the core, when kept (`journal.rs`).
    journal: Option<Vec<CoreInput>>,
}

impl Fleet {
    /// A fleet as `spec` describes, under `router` (one router per pool,
    /// each with the same settings and seed).
    pub fn new(spec: &FleetSpec, router: RouterConfig) -> Result<Fleet, ReplayError> {
        let bad = |e: String| ReplayError::InvalidFleet(e);
        if spec.replicas < spec.pool_count() {
            return Err(bad(format!(
                "{} pools need at least as many replicas, not {}",
                spec.pool_count(),
                spec.replicas
            )));
        }
        let new_router = || {
            Router::new(router.clone(), Arc::new(RouterMetrics::default()))
                .map_err(|e| bad(e.to_string()))
        };
        let pool_models = if spec.disagg.is_some() {
            if !spec.pools.is_empty() {
                return Err(bad("a prefill/decode fleet serves one model".into()));
            }
            vec![None, None]
        } else if spec.pools.is_empty() {
            vec![None]
        } else {
            spec.pools.iter().cloned().map(Some).collect()
        };
        let (mut core, router_slot, transfer_s_per_token, kv_bytes_per_token) = match &spec.disagg {
            Some(d) => {
                if d.prefill == 0 || d.prefill >= spec.replicas {
                    return Err(bad(format!(
                        "{} prefill replicas of {} leave no prefill or no decode side",
                        d.prefill, spec.replicas
                    )));
                }
                if !(d.bandwidth_bytes_per_s.is_finite() && d.bandwidth_bytes_per_s > 0.0) {
                    return Err(bad("the KV transfer bandwidth must be > 0".into()));
                }
                let config = DisaggConfig {
                    mode: d.mode,
                    kv_bytes_per_token: d.kv_bytes_per_token,
                    bandwidth_bytes_per_s: d.bandwidth_bytes_per_s,
                };
                let s = config.prior_s_per_token();
                // One model pool (the decode side's router, slot 0) with a
                // prefill side (slot 1), as a `[disagg]` pool in serve.
                let mut core =
                    kvgate_fleet::Fleet::new(vec![new_router()?], HealthRules::default());
                core.add_prefill_side(0, new_router()?, Disagg::new(config));
                (core, vec![1, 0], s, d.kv_bytes_per_token as f64)
            }
            None => {
                let routers =
                    (0..spec.pool_count()).map(|_| new_router()).collect::<Result<_, _>>()?;
                let core = kvgate_fleet::Fleet::new(routers, HealthRules::default());
                (core, (0..spec.pool_count()).collect(), 0.0, 0.0)
            }
        };
        let mut ids = Vec::new();
        let mut pool_of = Vec::new();
        let mut engines = Vec::new();
        for i in 0..spec.replicas {
            let c = EngineConfig {
                hash_seed: spec.engine.hash_seed.map(|s| s.wrapping_add(i as u64)),
                ..spec.engine.clone()
            };
            let p = spec.pool_of(i);
            let (model_pool, role) = match spec.disagg {
                Some(_) if p == 0 => (0, Role::Prefill),
                Some(_) => (0, Role::Decode),
                None => (p, Role::Both),
            };
            let name = format!("replica-{i}");
            let id =
                core.add_with_role(&name, 0, c.block_size, true, model_pool, role).map_err(bad)?;
            ids.push(id);
            pool_of.push(p);
            engines.push(Engine::new(c).map_err(|e| bad(e.to_string()))?);
        }
        let n = engines.len();
        let transfer_totals = (0..n)
            .map(|i| (spec.disagg.is_some() && pool_of[i] == 1).then(TransferTotals::default))
            .collect();
        Ok(Fleet {
            base: Instant::now(),
            engines,
            pool_of,
            core,
            router_slot,
            pool_models,
            adapters: false,
            clocks: vec![Duration::ZERO; n],
            trackers: (0..n).map(|_| Tracker::default()).collect(),
            timing: vec![EngineTiming::default(); n],
            ids,
            event_delay: spec.event_delay,
            report_every: spec.report_every.max(Duration::from_millis(1)),
            now: Duration::ZERO,
            next_report: Duration::ZERO,
            next_sample: Duration::ZERO,
            deliveries: Timeline::default(),
            bookings: FxHashMap::default(),
            scratch_matches: Vec::new(),
            records: Vec::new(),
            samples: Vec::new(),
            prefill_tokens: vec![0; n],
            unserved: 0,
            model_violations: 0,
            unknown_model: 0,
            disagg: spec.disagg.is_some(),
            transfer_s_per_token,
            kv_bytes_per_token,
            transfer_totals,
            hops: FxHashMap::default(),
            transfers: Vec::new(),
            journal: None,
        })
    }

    /// Engine stats per replica.
    pub fn engine_stats(&self) -> Vec<EngineStats> {
        self.engines.iter().map(Engine::stats).collect()
    }

    /// The KV index the engines' events fed (every replica's view).
    pub fn index(&self) -> &Index {
        self.core.index()
    }

    /// The router (ledger totals, tentative stats, ...; the first pool's).
    pub fn router(&self) -> &Router {
        self.pool_router(0)
    }

    /// Pools.
    pub fn pool_count(&self) -> usize {
        self.router_slot.len()
    }

    /// Pool `p`'s router.
    pub fn pool_router(&self, p: usize) -> &Router {
        &self.core.routers()[self.router_slot[p]]
    }

    /// The replica (position in the fleet) the core calls `id`.
    fn position(&self, id: ReplicaId) -> Option<usize> {
        self.ids.iter().position(|&x| x == id)
    }

    /// The longest prefix (blocks, any tier) the index shows on a replica
    /// of pool `p` for `keys`.
    fn best_indexed(&mut self, p: usize, keys: &[kvgate_index::BlockKey]) -> u32 {
        self.core.index().find_matches(keys, &mut self.scratch_matches);
        let matches = &self.scratch_matches;
        (0..self.ids.len())
            .filter(|&g| self.pool_of[g] == p)
            .filter_map(|g| matches.get(self.ids[g].index()).map(|m| m.total))
            .max()
            .unwrap_or(0)
    }

    /// The pool of replica `r` (position in the fleet).
    pub fn pool_of(&self, r: usize) -> usize {
        self.pool_of[r]
    }

    /// The pool serving request `i` of `w`, if any: the one-pool fleet
    /// serves every request, else the pool named by the request's model.
    pub fn pool_for(&self, w: &Workload, i: usize) -> Option<usize> {
        match self.pool_models.as_slice() {
            [None] => Some(0),
            models => models.iter().position(|m| m.as_deref() == Some(w.model_name(i))),
        }
    }

    /// Virtual time of the last thing processed.
    pub fn now(&self) -> Duration {
        self.now
    }

    /// Replays `workload` at `rate_scale` × its rate until every request has
    /// finished. `progress` is called with the number of requests that
    /// arrived since the last call.
    pub fn run(&mut self, workload: &Workload, rate_scale: f64, progress: &dyn Fn(u64)) {
        // The core logs each replica's coming into rotation, for operators
        // of a live fleet; a replay's replicas all come in at its start.
        let quiet = tracing::Dispatch::new(tracing::subscriber::NoSubscriber::default());
        tracing::dispatcher::with_default(&quiet, || {
            self.run_quietly(workload, rate_scale, progress)
        });
    }

    fn run_quietly(&mut self, workload: &Workload, rate_scale: f64, progress: &dyn Fn(u64)) {
        let n = workload.requests.len();
        self.records = Vec::with_capacity(n);
        self.adapters = workload.has_adapters();
        let mut next = 0usize;
        let mut unreported = 0u64;
        loop {
            let next_delivery = self.deliveries.next_at();
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
        self.deliveries.schedule(at, d);
    }

    fn deliver_next(&mut self) {
        let Some((at, delivery)) = self.deliveries.pop() else { return };
        let now = self.base + at;
        match delivery {
            Delivery::Events { replica, events } => {
                let batch =
                    Batch { ts: at.as_secs_f64(), events, dp_rank: None, skipped_events: 0 };
                self.core.apply_events(self.ids[replica], &batch, now);
                self.note(|| CoreInput::Events { at, replica, batch });
            }
            Delivery::PrefillDone { request, cached_tokens } => {
                self.prefill_done(request, cached_tokens, at);
            }
            Delivery::Transfer { request } => self.transfer_done(request, at),
            Delivery::Token { request, is_first, finished, cached_tokens } => {
                if is_first {
                    self.note(|| CoreInput::FirstToken { at, request });
                }
                if finished {
                    self.note(|| CoreInput::Finished { at, request });
                }
                let rec = &mut self.records[request];
                if is_first {
                    rec.first_token_at = Some(at);
                    if !rec.split {
                        rec.cached_tokens = cached_tokens;
                    }
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

    /// Every engine's `/metrics`, scraped at `t`; the core's upkeep.
    fn report_all(&mut self, t: Duration) {
        let at = self.base + t;
        self.core.tick(at);
        self.note(|| CoreInput::Tick { at: t });
        let sample = t >= self.next_sample;
        let mut requests = Vec::new();
        for i in 0..self.engines.len() {
            let engine = &self.engines[i];
            let s = engine.stats();
            let c = engine.config();
            let lora = self.adapters.then(|| {
                // `vllm:lora_requests_info`: slots, running and waiting.
                let mut names = engine.running_loras();
                names.extend(engine.waiting_loras());
                names.sort_unstable();
                names.dedup();
                LoraScrape { max_loras: c.max_loras, adapters: names, at: t.as_secs_f64() }
            });
            let scrape = EngineScrape {
                running: s.running as u32,
                waiting: s.waiting as u32,
                kv_usage: s.kv_usage,
                prefix_queries: s.prefix_cache_queries,
                prefix_hits: s.prefix_cache_hits,
                block_size: Some(c.block_size),
                num_gpu_blocks: Some(u64::from(c.num_gpu_blocks)),
                num_cpu_blocks: Some(u64::from(c.num_cpu_blocks)),
                timing: Some(self.timing[i]),
                lora,
                transfers: self.transfer_totals[i],
                step_budget: Some(c.max_num_batched_tokens),
            };
            if let Some(j) = &mut self.journal {
                j.push(CoreInput::Scrape { at: t, replica: i, scrape: scrape.clone() });
            }
            self.core.probe_succeeded(self.ids[i], Ok(scrape), at);
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
        self.note(|| CoreInput::Arrival { at, request: i });
        let r = &workload.requests[i];
        let tokens = r.prompt.tokens();
        let mut rec = Record {
            arrival: at,
            prompt_tokens: tokens.len() as u32,
            output_tokens: r.output_tokens,
            ..Record::default()
        };
        if self.disagg {
            let keys = r.block_keys(&tokens, self.engines[0].config().block_size as usize);
            self.arrive_disagg(i, tokens, r.output_tokens, &keys, rec);
            return;
        }
        // The model filter, the same for every policy: only the pool that
        // serves the request's model routes it.
        let Some(p) = self.pool_for(workload, i) else {
            self.unknown_model += 1;
            self.unserved += 1;
            self.records.push(rec);
            return;
        };
        let block_size = self.engines[0].config().block_size as usize;
        let keys = r.block_keys(&tokens, block_size);
        let req = RouteRequest {
            prompt_tokens: tokens.len() as u64,
            keys: &keys,
            max_output_tokens: Some(r.output_tokens),
            approx_symbols: Some(&tokens),
            adapter: r.adapter.as_deref(),
            ..RouteRequest::default()
        };
        rec.best_indexed_blocks = self.best_indexed(p, &keys);
        let now = self.base + at;
        let t0 = Instant::now();
        let decision = self.core.route(p, &req, now);
        rec.decide_ns = t0.elapsed().as_nanos() as u64;
        let Decision::Routed(routed) = decision else {
            // No admission limits are set by replay; count it if it happens.
            self.unserved += 1;
            self.records.push(rec);
            return;
        };
        let Some(replica) = self.position(routed.replica) else {
            self.core.finish(routed.booking, Outcome::Error);
            self.unserved += 1;
            self.records.push(rec);
            return;
        };
        rec.routed_cached_blocks = routed.cached_blocks;
        rec.predicted_ttft_s = routed.predicted_ttft_s;
        // The engine's side of the filter: a replica of another pool would
        // answer 404 (vLLM's unknown model); count it and serve nothing.
        if self.pool_models[self.pool_of[replica]]
            .as_deref()
            .is_some_and(|m| m != workload.model_name(i))
        {
            self.model_violations += 1;
            self.core.finish(routed.booking, Outcome::Error);
            self.unserved += 1;
            self.records.push(rec);
            return;
        }
        if !self.engines[replica].has_work() {
            self.clocks[replica] = self.clocks[replica].max(at);
        }
        let prompt_len = tokens.len();
        let engine = &mut self.engines[replica];
        let mut added =
            engine.add_request(i as u64, tokens, r.output_tokens, r.output_tokens, true, at);
        if added.is_ok() && r.adapter.is_some() {
            let identity = CacheIdentity { lora_name: r.adapter.clone(), cache_salt: None };
            added = engine.set_identity(i as u64, identity);
            if added.is_err() {
                engine.abort(i as u64);
            }
        }
        if added.is_err() {
            self.core.finish(routed.booking, Outcome::Error);
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
            if t.request_id & PREFILL_HOP != 0 {
                // A prefill hop's one token: it is done, its KV waits.
                let request = (t.request_id & !PREFILL_HOP) as usize;
                let cached_tokens = t.cached_tokens;
                self.schedule(end, Delivery::PrefillDone { request, cached_tokens });
            } else if t.is_first || t.finished.is_some() {
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
