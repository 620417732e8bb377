//! The admission workload the bench and the `admission_cost` example share:
//! 1,000 tenants in two bands (weights 1 to 4, a tenth with a token rate,
//! a tenth with an in-flight limit), every tenant backlogged with about ten
//! waiting requests, and 256 requests in flight. One step offers a request
//! for a random tenant, dispatches the next one, reports output for a
//! running request and finishes the oldest, so the queue stays the same
//! size; the clock advances 5 µs a step (virtual time).

#![allow(dead_code, unreachable_pub, clippy::unwrap_used)]

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use kvgate_tenants::{
    AdmissionQueue, Admit, QueuedRequest, RequestId, TenantConfig, TenantId, TenantsConfig, Usage,
};

pub const TENANTS: usize = 1_000;
const WAITING_PER_TENANT: usize = 10;
const IN_FLIGHT: usize = 256;
const STEP: Duration = Duration::from_micros(5);

pub struct Workload {
    pub queue: AdmissionQueue,
    pub now: Instant,
    tenants: Vec<TenantId>,
    running: VecDeque<RequestId>,
    rng: u64,
}

fn config() -> TenantsConfig {
    let mut config = TenantsConfig { max_tenants: TENANTS + 1, ..TenantsConfig::default() };
    for band in &mut config.bands {
        band.max_queue = 1_000_000;
        band.queue_ttl_ms = 3_600_000;
    }
    for i in 0..TENANTS {
        let tenant = TenantConfig {
            weight: 1.0 + (i % 4) as f64,
            band: Some(if i % 3 == 0 { "batch" } else { "interactive" }.into()),
            max_in_flight: (i % 10 == 1).then_some(1_000),
            tokens_per_minute: (i % 10 == 2).then_some(u64::MAX / 2),
        };
        config.tenants.insert(format!("tenant-{i}"), tenant);
    }
    config
}

impl Workload {
    pub fn new() -> Self {
        let now = Instant::now();
        let mut queue = AdmissionQueue::new(&config(), now).unwrap();
        let tenants = (0..TENANTS).map(|i| queue.resolve(Some(&format!("tenant-{i}")))).collect();
        let mut w =
            Self { queue, now, tenants, running: VecDeque::new(), rng: 0x9e37_79b9_7f4a_7c15 };
        for _ in 0..TENANTS * WAITING_PER_TENANT {
            w.enqueue();
        }
        for _ in 0..IN_FLIGHT {
            w.dispatch();
        }
        w
    }

    fn next(&mut self) -> u64 {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        self.rng
    }

    /// Offers one request for a random tenant.
    pub fn enqueue(&mut self) {
        let r = self.next();
        let admit = Admit {
            tenant: self.tenants[r as usize % TENANTS],
            band: None,
            may_climb: false,
            input_tokens: 256 + (r >> 20) % 4_096,
            max_output_tokens: 256,
        };
        self.queue.enqueue(admit, self.now).unwrap();
    }

    /// Dispatches the next request (every band can take one).
    pub fn dispatch(&mut self) -> Option<QueuedRequest> {
        let d = self.queue.next_dispatch(self.now, |_| true)?;
        self.running.push_back(d.id);
        Some(d)
    }

    /// Output for one running request, the oldest finished, time moves on.
    pub fn settle(&mut self) {
        let r = self.next() as usize;
        let id = self.running[r % self.running.len()];
        self.queue.on_output_tokens(id, 16);
        if self.running.len() > IN_FLIGHT {
            let id = self.running.pop_front().unwrap();
            let usage = Usage { input_tokens: 1_000, output_tokens: 200 };
            self.queue.finish(id, Some(usage), self.now).unwrap();
        }
        self.now += STEP;
    }
}
