//! Random sequences of every call, checked after each step: nothing
//! panics, every tenant's counts close (arrived = rejected + dispatched +
//! expired + cancelled + waiting; dispatched = finished + in flight), every
//! request has exactly one outcome, the gauges match a plain model, and
//! dispatch is work-conserving (a band the predicate accepts is never left
//! waiting).

#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use kvgate_tenants::{
    AdmissionQueue, Admit, BandId, Cancelled, RequestId, TenantConfig, TenantsConfig, Usage,
};
use proptest::prelude::*;

#[derive(Clone, Debug)]
enum Op {
    Enqueue {
        tenant: usize,
        band: Option<u8>,
        input: u64,
        output: u64,
    },
    /// Bit b set: band b's head may be taken.
    Dispatch {
        bands: u8,
    },
    Cancel {
        pick: usize,
    },
    Output {
        pick: usize,
        n: u64,
    },
    Finish {
        pick: usize,
        usage: Option<(u64, u64)>,
    },
    Advance {
        ms: u64,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..6usize, proptest::option::of(0..3u8), 0..3_000u64, 0..1_000u64)
            .prop_map(|(tenant, band, input, output)| Op::Enqueue { tenant, band, input, output }),
        3 => (0..4u8).prop_map(|bands| Op::Dispatch { bands }),
        1 => any::<usize>().prop_map(|pick| Op::Cancel { pick }),
        2 => (any::<usize>(), 0..200u64).prop_map(|(pick, n)| Op::Output { pick, n }),
        2 => (any::<usize>(), proptest::option::of((0..3_000u64, 0..1_000u64)))
            .prop_map(|(pick, usage)| Op::Finish { pick, usage }),
        1 => (0..30_000u64).prop_map(|ms| Op::Advance { ms }),
    ]
}

fn config() -> TenantsConfig {
    let mut config = TenantsConfig::default();
    config.bands[0].max_queue = 8;
    config.bands[0].queue_ttl_ms = 20_000;
    config.bands[1].max_queue = 12;
    config.bands[1].queue_ttl_ms = 45_000;
    config.max_tenants = 5;
    let tenants = [
        ("t0", 1.0, None, None, None),
        ("t1", 2.0, Some("batch"), Some(3), None),
        ("t2", 0.5, None, None, Some(5_000)),
        ("t3", 1.0, Some("batch"), Some(4), Some(8_000)),
    ];
    for (name, weight, band, max_in_flight, tokens_per_minute) in tenants {
        config.tenants.insert(
            name.into(),
            TenantConfig { weight, band: band.map(Into::into), max_in_flight, tokens_per_minute },
        );
    }
    config
}

/// Picks an id from a set, or a made-up one now and then.
fn pick(set: &BTreeSet<RequestId>, pick: usize) -> RequestId {
    if set.is_empty() || pick.is_multiple_of(7) {
        return RequestId(pick as u64 % 1_000);
    }
    *set.iter().nth(pick % set.len()).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn counts_always_close_and_dispatch_conserves_work(ops in proptest::collection::vec(op(), 1..200)) {
        let t0 = Instant::now();
        let mut now = t0;
        let mut q = AdmissionQueue::new(&config(), t0).unwrap();
        let names = ["t0", "t1", "t2", "t3", "fresh", "overflow"];
        let mut waiting: BTreeSet<RequestId> = BTreeSet::new();
        let mut running: BTreeSet<RequestId> = BTreeSet::new();
        let mut answered: BTreeSet<RequestId> = BTreeSet::new();
        for op in ops {
            match op {
                Op::Enqueue { tenant, band, input, output } => {
                    let tenant = q.resolve(Some(names[tenant]));
                    let admit = Admit {
                        tenant,
                        band: band.map(BandId),
                        may_climb: false,
                        input_tokens: input,
                        max_output_tokens: output,
                    };
                    if let Ok(ticket) = q.enqueue(admit, now) {
                        prop_assert!(ticket.band >= q.tenant_band(tenant));
                        prop_assert!(waiting.insert(ticket.id));
                    }
                }
                Op::Dispatch { bands } => {
                    let allowed = |band: BandId| bands & (1 << band.0) != 0;
                    match q.next_dispatch(now, |head| allowed(head.band)) {
                        Some(d) => {
                            prop_assert!(allowed(d.band));
                            prop_assert!(waiting.remove(&d.id));
                            running.insert(d.id);
                        }
                        None => {
                            for b in 0..q.bands().len() as u8 {
                                if allowed(BandId(b)) {
                                    prop_assert_eq!(q.band_depth(BandId(b)), 0);
                                }
                            }
                        }
                    }
                }
                Op::Cancel { pick: p } => {
                    let id = pick(if p.is_multiple_of(2) { &waiting } else { &running }, p / 2);
                    match q.cancel(id, now) {
                        Cancelled::Left(left) => {
                            prop_assert!(waiting.remove(&left.id));
                            answered.insert(left.id);
                        }
                        Cancelled::Finished(f) => {
                            prop_assert!(running.remove(&f.id));
                            answered.insert(f.id);
                        }
                        Cancelled::Unknown => {
                            prop_assert!(!waiting.contains(&id) && !running.contains(&id));
                        }
                    }
                }
                Op::Output { pick: p, n } => {
                    q.on_output_tokens(pick(&running, p), n);
                }
                Op::Finish { pick: p, usage } => {
                    let id = pick(&running, p);
                    let usage = usage.map(|(input_tokens, output_tokens)| Usage { input_tokens, output_tokens });
                    if let Some(f) = q.finish(id, usage, now) {
                        prop_assert!(running.remove(&f.id));
                        answered.insert(f.id);
                    } else {
                        prop_assert!(!running.contains(&id));
                        // Finishing a waiting request cancels it.
                        if waiting.remove(&id) {
                            answered.insert(id);
                        }
                    }
                }
                Op::Advance { ms } => {
                    now += Duration::from_millis(ms);
                    for e in q.expire(now) {
                        prop_assert_eq!(e.rejection.status(), 503);
                        prop_assert!(waiting.remove(&e.request.id));
                        prop_assert!(answered.insert(e.request.id));
                    }
                    if let Some(deadline) = q.next_deadline() {
                        prop_assert!(deadline > now);
                    }
                }
            }
            for (_, name, c) in q.all_counters() {
                prop_assert!(c.balanced(), "{}: {:?}", name, c);
            }
            let totals = q.totals();
            prop_assert_eq!(totals.queue_depth as usize, waiting.len());
            prop_assert_eq!(q.waiting(), waiting.len());
            prop_assert_eq!(totals.in_flight as usize, running.len());
            prop_assert!(q.tenant_count() <= 5);
        }
    }
}
