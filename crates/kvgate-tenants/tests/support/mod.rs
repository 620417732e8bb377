//! A tiny discrete-time fleet for the fairness tests: open-loop tenants
//! sending fixed-size requests at fixed rates, one server of fixed capacity
//! (`slots` requests decode at once, one output token each per tick), and
//! one or more router instances, each with its own [`AdmissionQueue`], in
//! front of it. Everything runs in virtual time, so every figure is exact
//! and repeatable.
//!
//! Service is measured as VTC defines it: `input × 1 + output × 2` tokens,
//! divided by the tenant's weight, charged at dispatch and per token. The
//! service difference is taken over the interval in which every tenant is
//! backlogged (has a request waiting somewhere).

#![allow(dead_code, unreachable_pub, clippy::unwrap_used, clippy::expect_used)]

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use kvgate_tenants::{
    AdmissionQueue, Admit, BandConfig, RequestId, TenantConfig, TenantsConfig, Usage,
};

/// One virtual tick: one decode step of a loaded engine.
pub const TICK: Duration = Duration::from_millis(40);

/// A tenant's traffic.
#[derive(Clone, Debug)]
pub struct Source {
    pub name: &'static str,
    pub weight: f64,
    /// Requests per tick.
    pub rate: f64,
    pub input_tokens: u64,
    /// Output tokens: drawn uniformly from `output_tokens ± output_spread`.
    pub output_tokens: u64,
    pub output_spread: u64,
    /// Sends only in ticks where this returns true.
    pub active: fn(u64) -> bool,
    /// Requests sent at once in its first active tick, so that it is
    /// backlogged from the start.
    pub burst: u64,
}

impl Source {
    pub fn new(name: &'static str, rate: f64) -> Self {
        Self {
            name,
            weight: 1.0,
            rate,
            input_tokens: 256,
            output_tokens: 256,
            output_spread: 128,
            active: |_| true,
            burst: 16,
        }
    }

    /// The weighted cost of its largest request.
    pub fn max_cost(&self) -> f64 {
        let output = self.output_tokens + self.output_spread;
        (self.input_tokens as f64 + 2.0 * output as f64) / self.weight
    }
}

/// Which order the waiting requests are served in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Order {
    /// `AdmissionQueue` (VTC), on `instances` routers sharing counters
    /// every `share_every` ticks (0: never).
    Vtc { instances: usize, share_every: u64 },
    /// One first-come queue across tenants.
    Fcfs,
}

/// What a run measured.
#[derive(Clone, Debug, Default)]
pub struct Outcome {
    /// Weighted service per tenant over the all-backlogged interval.
    pub service: Vec<f64>,
    /// The largest weighted service difference between two tenants, over
    /// every tick of the all-backlogged interval.
    pub max_difference: f64,
    /// The same, only over the interval's first half.
    pub max_difference_first_half: f64,
    /// The difference at the last tick.
    pub final_difference: f64,
    /// Ticks in which every tenant was backlogged.
    pub backlogged_ticks: u64,
    /// Output tokens served in all.
    pub output_tokens: u64,
}

impl Outcome {
    /// Jain's index of the weighted service.
    pub fn jain(&self) -> f64 {
        let sum: f64 = self.service.iter().sum();
        let squares: f64 = self.service.iter().map(|s| s * s).sum();
        sum * sum / (self.service.len() as f64 * squares)
    }
}

struct Running {
    id: RequestId,
    instance: usize,
    tenant: usize,
    output: u64,
    left: u64,
}

/// A config with one band that never expires or fills in these runs.
pub fn config(sources: &[Source]) -> TenantsConfig {
    let mut config = TenantsConfig {
        bands: vec![BandConfig {
            name: "interactive".into(),
            ttft_target_ms: 1_000,
            max_queue: 1_000_000,
            queue_ttl_ms: 1_000_000_000,
            max_priority: None,
        }],
        ..TenantsConfig::default()
    };
    for s in sources {
        config
            .tenants
            .insert(s.name.into(), TenantConfig { weight: s.weight, ..TenantConfig::default() });
    }
    config
}

/// Runs the sources for `ticks` ticks through a server of `slots`.
pub fn run(sources: &[Source], slots: usize, ticks: u64, order: Order) -> Outcome {
    run_with(sources, &Setup { slots, ticks, order, warmup: 0, seed: 1 })
}

/// Everything a run can vary.
#[derive(Clone, Copy, Debug)]
pub struct Setup {
    pub slots: usize,
    pub ticks: u64,
    pub order: Order,
    /// Nothing is measured before this tick.
    pub warmup: u64,
    /// Draws output lengths, instances and turns; output lengths depend
    /// only on the seed, so every order sees the same requests.
    pub seed: u64,
}

/// `run` with every knob.
pub fn run_with(sources: &[Source], setup: &Setup) -> Outcome {
    let Setup { slots, ticks, order, warmup, seed } = *setup;
    let start = Instant::now();
    let config = config(sources);
    let n_instances = match order {
        Order::Vtc { instances, .. } => instances,
        Order::Fcfs => 1,
    };
    let mut queues: Vec<AdmissionQueue> = (0..n_instances)
        .map(|i| {
            AdmissionQueue::new(&config, start).unwrap().with_identity(format!("instance-{i}"), 1)
        })
        .collect();
    let tenant_ids: Vec<Vec<_>> = queues
        .iter_mut()
        .map(|q| sources.iter().map(|s| q.resolve(Some(s.name))).collect())
        .collect();
    let mut fcfs: VecDeque<(RequestId, usize, u64)> = VecDeque::new();
    let mut waiting = vec![0u64; sources.len()];
    let mut owed = vec![0.0f64; sources.len()];
    let mut service = vec![0.0f64; sources.len()];
    let mut running: Vec<Running> = Vec::new();
    let mut rng = Rng(0x2545_f491_4f6c_dd1d ^ seed.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    let mut lengths: Vec<Rng> = (0..sources.len() as u64)
        .map(|t| {
            Rng(0x5851_f42d_4c95_7f2d ^ (seed * 1_000 + t + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15))
        })
        .collect();
    let mut started = vec![false; sources.len()];
    let mut next_fcfs_id = 0u64;
    let mut outputs: HashMap<(usize, RequestId), u64> = HashMap::new();

    let mut out = Outcome::default();
    let mut baseline: Option<Vec<f64>> = None;

    for tick in 0..ticks {
        let now = start + TICK * tick as u32;
        // Arrivals, spread over the instances at random.
        for (t, s) in sources.iter().enumerate() {
            if !(s.active)(tick) {
                continue;
            }
            owed[t] += s.rate;
            if !started[t] {
                started[t] = true;
                owed[t] += s.burst as f64;
            }
            while owed[t] >= 1.0 {
                owed[t] -= 1.0;
                let instance = rng.below(n_instances);
                let spread = 2 * s.output_spread as usize + 1;
                let output = s.output_tokens - s.output_spread + lengths[t].below(spread) as u64;
                waiting[t] += 1;
                if order == Order::Fcfs {
                    fcfs.push_back((RequestId(next_fcfs_id), t, output));
                    next_fcfs_id += 1;
                } else {
                    let admit = Admit {
                        tenant: tenant_ids[instance][t],
                        band: None,
                        may_climb: false,
                        input_tokens: s.input_tokens,
                        max_output_tokens: output,
                    };
                    let ticket = queues[instance].enqueue(admit, now).unwrap();
                    outputs.insert((instance, ticket.id), output);
                }
            }
        }
        // Dispatch while the server has room. Each free slot goes to the
        // first instance with something to dispatch, counting from one
        // drawn at random: independent routers competing for one fleet.
        while running.len() < slots {
            let first = rng.below(n_instances);
            let mut dispatched = false;
            for instance in (first..n_instances).chain(0..first) {
                let picked = match order {
                    Order::Fcfs => fcfs.pop_front(),
                    Order::Vtc { .. } => queues[instance].next_dispatch(now, |_| true).map(|d| {
                        let t = tenant_ids[instance].iter().position(|&id| id == d.tenant).unwrap();
                        (d.id, t, outputs.remove(&(instance, d.id)).unwrap())
                    }),
                };
                if let Some((id, t, output)) = picked {
                    dispatched = true;
                    waiting[t] -= 1;
                    service[t] += sources[t].input_tokens as f64 / sources[t].weight;
                    running.push(Running { id, instance, tenant: t, output, left: output });
                    break;
                }
            }
            if !dispatched {
                break;
            }
        }
        // One decode step.
        for r in running.iter_mut() {
            r.left -= 1;
            service[r.tenant] += 2.0 / sources[r.tenant].weight;
            out.output_tokens += 1;
            if order != Order::Fcfs {
                queues[r.instance].on_output_tokens(r.id, 1);
            }
        }
        running.retain(|r| {
            if r.left > 0 {
                return true;
            }
            if order != Order::Fcfs {
                let usage =
                    Usage { input_tokens: sources[r.tenant].input_tokens, output_tokens: r.output };
                queues[r.instance].finish(r.id, Some(usage), now).unwrap();
            }
            false
        });
        // Instances exchange shards.
        if let Order::Vtc { instances, share_every } = order {
            if instances > 1 && share_every > 0 && tick % share_every == 0 {
                let snapshots: Vec<_> =
                    queues.iter_mut().map(|q| q.export_shard(false, now)).collect();
                for q in queues.iter_mut() {
                    for s in &snapshots {
                        q.merge_shard(s);
                    }
                }
            }
        }
        // Measure over the interval in which everyone is backlogged.
        if tick < warmup {
            continue;
        }
        if waiting.iter().all(|&w| w > 0) {
            let base = baseline.get_or_insert_with(|| service.clone());
            let got: Vec<f64> = service.iter().zip(base.iter()).map(|(s, b)| s - b).collect();
            let difference = spread(&got);

            out.backlogged_ticks += 1;
            out.max_difference = out.max_difference.max(difference);
            if tick < ticks / 2 {
                out.max_difference_first_half = out.max_difference_first_half.max(difference);
            }
            out.final_difference = difference;

            out.service = got;
        } else if baseline.is_some() {
            // The all-backlogged interval ended; these scenarios keep it
            // open to the end, so a gap means the scenario is wrong.
            panic!("tenant went idle at tick {tick}: {waiting:?}");
        }
    }
    for q in &queues {
        for (_, name, counters) in q.all_counters() {
            assert!(counters.balanced(), "{name}: {counters:?}");
        }
    }
    out
}

/// xorshift64: the instance each request reaches and the order in which
/// instances see a free slot.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
}

fn spread(values: &[f64]) -> f64 {
    let max = values.iter().copied().fold(f64::MIN, f64::max);
    let min = values.iter().copied().fold(f64::MAX, f64::min);
    max - min
}
