//! Fleet scenarios in virtual time: simulated vLLM engines, the KV index and
//! the fleet core together (see `support/mod.rs` for the driver).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use kvgate_router::PolicyKind;
use kvgate_sim::TimingModel;
use support::{quantile, Fleet, Rng};

const MS: Duration = Duration::from_millis(1);

/// Warm-up, sequential phase and burst of the shared-system-prompt scenario.
struct Burst {
    fleet: Fleet,
    warm: usize,
    /// Records of the sequential phase and of the burst.
    sequential: std::ops::Range<usize>,
    burst: std::ops::Range<usize>,
}

fn shared_prompt_burst(
    replicas: usize,
    policy: PolicyKind,
    suffix: usize,
    n_seq: usize,
    n_burst: usize,
) -> Burst {
    let mut rng = Rng::new(1);
    let system = rng.tokens(4096);
    let prompt = |rng: &mut Rng| {
        let mut p = system.clone();
        p.extend(rng.tokens(suffix));
        p
    };
    let mut fleet = Fleet::uniform(replicas, TimingModel::llmd_qwen3_32b(), policy);
    // Warm one replica.
    let p = prompt(&mut rng);
    fleet.submit(Duration::ZERO, p, 16);
    fleet.run_to_idle();
    let warm = fleet.records[0].replica;
    // One at a time, each after the previous finished.
    let start = fleet.records.len();
    for _ in 0..n_seq {
        let p = prompt(&mut rng);
        let at = fleet.now + 50 * MS;
        fleet.submit(at, p, 16);
        fleet.run_to_idle();
    }
    let sequential = start..fleet.records.len();
    // The burst: arrivals 0.5 ms apart.
    let t0 = fleet.now + 200 * MS;
    let start = fleet.records.len();
    for k in 0..n_burst {
        let p = prompt(&mut rng);
        fleet.submit(t0 + MS.mul_f64(0.5 * k as f64), p, 32);
    }
    fleet.run_to_idle();
    Burst { fleet, warm, sequential, burst: start..start + n_burst }
}

fn ttfts(fleet: &Fleet, range: std::ops::Range<usize>) -> Vec<f64> {
    fleet.records[range].iter().map(|r| r.ttft_s()).collect()
}

fn p(xs: &[f64], q: f64) -> f64 {
    quantile(xs, q)
}

/// Criterion 1 (a): with one warm replica and the fleet idle, requests
/// sharing the system prompt all go to the warm replica and hit its cache.
#[test]
fn shared_prompt_stays_on_the_idle_warm_replica() {
    let b = shared_prompt_burst(4, PolicyKind::KvAware, 512, 8, 0);
    let counts = b.fleet.counts(b.sequential.clone());
    println!("sequential: warm {} counts {counts:?}", b.warm);
    for r in &b.fleet.records[b.sequential.clone()] {
        assert_eq!(r.replica, b.warm, "left the idle warm replica: {counts:?}");
        assert_eq!(r.cached_tokens, 4096, "the warm replica's cache was hit");
    }
}

/// Criterion 1 (b): a burst of 64 requests sharing a 4k-token system prompt
/// spreads once the warm replica's queue makes a cold one cheaper; every
/// move to a cold replica is justified by the decision's own predictions;
/// and it beats both round robin and "always the warm replica".
#[test]
fn shared_prompt_burst_spreads_when_the_warm_queue_makes_cold_faster() {
    let b = shared_prompt_burst(4, PolicyKind::KvAware, 512, 8, 64);
    let fleet = &b.fleet;
    let counts = fleet.counts(b.burst.clone());
    let t = ttfts(fleet, b.burst.clone());
    let eps = fleet.router().config().epsilon;

    // Every move off the warm replica: was the cold one predicted faster?
    let mut first_on: Vec<Option<usize>> = vec![None; counts.len()];
    for (k, r) in fleet.records[b.burst.clone()].iter().enumerate() {
        if first_on[r.replica].is_none() {
            first_on[r.replica] = Some(k);
        }
        if r.replica == b.warm {
            continue;
        }
        let e = r.explanation.as_ref().expect("decision log on");
        let warm_row = e.candidates.iter().find(|c| c.replica == fleet.ids[b.warm]).unwrap();
        let chosen = e.chosen_candidate().unwrap();
        // Its cost, which adds to the TTFT the delay its prefill causes the
        // requests queued behind it (the fleet-work charge).
        assert!(
            chosen.score <= warm_row.score * (1.0 + eps) + 1e-3,
            "burst request {k} went to replica {} cost {:.3} (TTFT {:.3}s) while the warm one cost {:.3} (TTFT {:.3}s)",
            r.replica,
            chosen.score,
            chosen.predicted_ttft_s,
            warm_row.score,
            warm_row.predicted_ttft_s
        );
    }

    // Predicted vs observed TTFT per replica, for the report.
    for (i, first) in first_on.iter().enumerate() {
        let rs: Vec<_> = fleet.records[b.burst.clone()].iter().filter(|r| r.replica == i).collect();
        if rs.is_empty() {
            continue;
        }
        let pred: Vec<f64> = rs.iter().map(|r| r.predicted_ttft_s).collect();
        let obs: Vec<f64> = rs.iter().map(|r| r.ttft_s()).collect();
        let v = fleet.router().load(fleet.ids[i]).unwrap();
        println!(
            "replica {i}{}: {} requests, first at burst #{:?}, predicted TTFT max {:.3}s, observed max {:.3}s, sigma {:.2e} s/token",
            if i == b.warm { " (warm)" } else { "" },
            rs.len(),
            first,
            p(&pred, 1.0),
            p(&obs, 1.0),
            v.prefill_s_per_token
        );
    }

    // Policy comparison on the burst alone (after the one warm-up request):
    // with the sequential phase, round robin would have warmed every replica
    // for free while kv_aware rightly kept them cold.
    let kv = shared_prompt_burst(4, PolicyKind::KvAware, 512, 0, 64);
    let kv_t = ttfts(&kv.fleet, kv.burst.clone());
    let rr = shared_prompt_burst(4, PolicyKind::RoundRobin, 512, 0, 64);
    let rr_t = ttfts(&rr.fleet, rr.burst.clone());
    let solo = shared_prompt_burst(1, PolicyKind::KvAware, 512, 0, 64);
    let solo_t = ttfts(&solo.fleet, solo.burst.clone());
    println!(
        "burst counts {counts:?} (warm {}), p50 {:.3}s p90 {:.3}s",
        b.warm,
        p(&t, 0.5),
        p(&t, 0.9)
    );
    println!(
        "burst without the sequential phase: counts kv_aware {:?} round_robin {:?}; \
         p90 TTFT kv_aware {:.3}s round_robin {:.3}s always-warm {:.3}s; p50 {:.3}/{:.3}/{:.3}; \
         hit tokens kv_aware {} round_robin {}",
        kv.fleet.counts(kv.burst.clone()),
        rr.fleet.counts(rr.burst.clone()),
        p(&kv_t, 0.9),
        p(&rr_t, 0.9),
        p(&solo_t, 0.9),
        p(&kv_t, 0.5),
        p(&rr_t, 0.5),
        p(&solo_t, 0.5),
        kv.fleet.hit_tokens(),
        rr.fleet.hit_tokens()
    );

    // The warm replica takes the first ones and the plurality.
    assert!(first_on[b.warm] == Some(0), "first burst request not on the warm replica");
    assert!(
        fleet.records[b.burst.clone()].iter().take(4).all(|r| r.replica == b.warm),
        "the first burst requests should stay warm"
    );
    assert!(counts.iter().all(|&c| c <= counts[b.warm]), "warm not the plurality: {counts:?}");
    // It spreads.
    let used = counts.iter().filter(|&&c| c > 0).count();
    assert!(used >= 3, "burst did not spread: {counts:?}");
    assert!(counts.iter().all(|&c| c <= 32), "one replica took more than half: {counts:?}");
    // Better than keeping everything warm, and no worse than round robin.
    assert!(p(&kv_t, 0.9) < p(&solo_t, 0.9), "spreading did not help");
    assert!(
        p(&kv_t, 0.9) <= p(&rr_t, 0.9),
        "kv_aware p90 TTFT {:.3}s worse than round robin's {:.3}s",
        p(&kv_t, 0.9),
        p(&rr_t, 0.9)
    );
    // Both pay one cold prefill per replica they use; kv_aware no more.
    assert!(kv.fleet.hit_tokens() >= rr.fleet.hit_tokens(), "kv_aware reused less cache");
}

/// Poisson traffic over `prompts` shared system prompts.
#[allow(clippy::too_many_arguments)]
fn shared_traffic(
    fleet: &mut Fleet,
    seed: u64,
    prompts: usize,
    prompt_len: usize,
    suffix: usize,
    rate_per_s: f64,
    until: Duration,
    max_tokens: u32,
    pause: Option<(Duration, Duration)>,
) {
    let mut rng = Rng::new(seed);
    let systems: Vec<Vec<u32>> = (0..prompts).map(|_| rng.tokens(prompt_len)).collect();
    let mut t = fleet.now;
    loop {
        t += rng.exp(Duration::from_secs_f64(1.0 / rate_per_s));
        if t >= until {
            break;
        }
        if pause.is_some_and(|(a, b)| t >= a && t < b) {
            continue;
        }
        let k = (rng.next_u64() % prompts as u64) as usize;
        let mut p = systems[k].clone();
        p.extend(rng.tokens(suffix));
        fleet.submit(t, p, max_tokens);
    }
}

struct FlushRun {
    fleet: Fleet,
    flush: Duration,
}

fn flush_run(policy: PolicyKind, flushed: &[usize]) -> FlushRun {
    let mut fleet = Fleet::uniform(4, TimingModel::llmd_qwen3_32b(), policy);
    let flush = Duration::from_secs(10);
    let end = Duration::from_secs(30);
    // vLLM refuses to reset the prefix cache while requests run, so traffic
    // pauses for a second around the flush to let every engine drain.
    let pause = (!flushed.is_empty()).then_some((flush, flush + Duration::from_secs(1)));
    shared_traffic(&mut fleet, 3, 8, 2048, 256, 24.0, end, 16, pause);
    for &r in flushed {
        fleet.flush_at(r, flush);
    }
    fleet.run_to_idle();
    FlushRun { fleet, flush }
}

fn check_no_death_spiral(run: &FlushRun, label: &str, flushed: &[usize]) {
    let fleet = &run.fleet;
    assert_eq!(fleet.flushed_at.len(), flushed.len(), "every flush happened");
    let flushed_at = fleet.flushed_at.iter().map(|f| f.1).max().unwrap();
    let recs = &fleet.records;
    let before: Vec<usize> = (0..recs.len())
        .filter(|&i| recs[i].arrival >= run.flush / 2 && recs[i].arrival < run.flush)
        .collect();
    let after: Vec<usize> = (0..recs.len()).filter(|&i| recs[i].arrival >= flushed_at).collect();
    let last_third = &after[after.len() * 2 / 3..];
    let first_sec: Vec<usize> = after
        .iter()
        .copied()
        .filter(|&i| recs[i].arrival < flushed_at + Duration::from_secs(2))
        .collect();
    let ttft = |ix: &[usize]| ix.iter().map(|&i| recs[i].ttft_s()).collect::<Vec<_>>();
    let count = |ix: &[usize]| {
        let mut c = vec![0usize; fleet.engines.len()];
        for &i in ix {
            c[recs[i].replica] += 1;
        }
        c
    };
    let (tb, ta, tl, tf) = (ttft(&before), ttft(&after), ttft(last_third), ttft(&first_sec));
    let max_pending: Vec<u64> = fleet.gauges.iter().map(|g| g.max_pending_prefill_tokens).collect();
    let max_waiting: Vec<usize> = fleet.gauges.iter().map(|g| g.max_waiting).collect();
    let hit = |ix: &[usize]| {
        ix.iter().map(|&i| u64::from(recs[i].cached_tokens)).sum::<u64>() as f64
            / ix.iter().map(|&i| recs[i].prompt_tokens).sum::<u64>() as f64
    };
    println!(
        "{label}: flushed at {:.2}s; counts before {:?} after {:?} first 2s after {:?} last third {:?}",
        flushed_at.as_secs_f64(),
        count(&before),
        count(&after),
        count(&first_sec),
        count(last_third)
    );
    println!(
        "{label}: p50 TTFT before {:.3}s, first 2s after {:.3}s (p90 {:.3}s), after {:.3}s, last third {:.3}s; \
         hit rate before {:.2} after {:.2} last third {:.2}; max pending {:?}; max waiting {:?}",
        p(&tb, 0.5),
        p(&tf, 0.5),
        p(&tf, 0.9),
        p(&ta, 0.5),
        p(&tl, 0.5),
        hit(&before),
        hit(&after),
        hit(last_third),
        max_pending,
        max_waiting
    );
    let ca = count(&after);
    let n = after.len();
    assert!(
        ca.iter().all(|&c| c * 2 <= n),
        "{label}: one replica took over half after the flush: {ca:?}"
    );
    // A cold replica only wins when a warm one's queue makes it faster, so
    // it gets less than an equal share, but it must not be abandoned.
    let cf = count(&first_sec);
    for &r in flushed {
        assert!(cf[r] > 0, "{label}: flushed replica {r} unused right after the flush: {cf:?}");
        assert!(ca[r] * 20 >= n, "{label}: flushed replica {r} starved after the flush: {ca:?}");
    }
    assert!(
        max_pending.iter().all(|&m| m <= 16_384),
        "{label}: a queue grew past two full steps: {max_pending:?}"
    );
    assert!(
        p(&tl, 0.5) <= 1.5 * p(&tb, 0.5),
        "{label}: TTFT did not recover: last third p50 {:.3}s vs {:.3}s before",
        p(&tl, 0.5),
        p(&tb, 0.5)
    );
    assert!(hit(last_third) >= 0.8 * hit(&before), "{label}: cache reuse did not recover");
}

/// Criterion 2: no death spiral after every cache is flushed.
#[test]
fn no_death_spiral_after_all_caches_are_flushed() {
    let run = flush_run(PolicyKind::KvAware, &[0, 1, 2, 3]);
    check_no_death_spiral(&run, "all flushed", &[0, 1, 2, 3]);
    let steady = flush_run(PolicyKind::KvAware, &[]);
    let recs = &steady.fleet.records;
    let t: Vec<f64> = recs.iter().filter(|r| r.arrival >= run.flush).map(|r| r.ttft_s()).collect();
    println!(
        "steady state (no flush), after 10s: p50 {:.3}s p90 {:.3}s counts {:?}",
        p(&t, 0.5),
        p(&t, 0.9),
        steady.fleet.counts(0..recs.len())
    );
}

/// Criterion 2, one replica flushed: its traffic is not dumped on the others
/// beyond what their load allows, and it takes its share again.
#[test]
fn no_pile_up_after_one_replica_is_flushed() {
    let run = flush_run(PolicyKind::KvAware, &[0]);
    check_no_death_spiral(&run, "replica 0 flushed", &[0]);
}

/// Criterion 3: after a replica's capacity changes (it becomes 2.5x slower
/// at prefill), its calibrated prefill rate converges within 50 requests.
#[test]
fn calibration_converges_within_50_requests_after_a_slowdown() {
    let fast = TimingModel::llmd_qwen3_32b();
    let slow = TimingModel { prefill_linear_ms: fast.prefill_linear_ms * 2.5, ..fast.clone() };
    let mut fleet = Fleet::uniform(1, fast.clone(), PolicyKind::KvAware);
    let id = fleet.ids[0];
    let mut rng = Rng::new(5);
    let run = |fleet: &mut Fleet, n: usize, rng: &mut Rng, const_ms: f64| {
        let mut est = Vec::new();
        let mut truth = Vec::new();
        for _ in 0..n {
            let len = 2048 + (rng.next_u64() % 2048) as usize;
            let at = fleet.now + 20 * MS;
            fleet.submit(at, rng.tokens(len), 4);
            fleet.run_to_idle();
            let r = fleet.records.last().unwrap();
            let uncached = (r.prompt_tokens - u64::from(r.cached_tokens)) as f64;
            truth.push((r.ttft_s() - const_ms / 1000.0) / uncached);
            est.push(fleet.router().load(id).unwrap().prefill_s_per_token);
        }
        (est, truth)
    };
    let (est_a, truth_a) = run(&mut fleet, 50, &mut rng, fast.prefill_const_ms);
    let true_a = p(&truth_a, 0.5);
    let mut cfg = support::engine_config(slow.clone());
    cfg.hash_seed = Some(8);
    fleet.replace_engine(0, cfg);
    let (est_b, truth_b) = run(&mut fleet, 60, &mut rng, slow.prefill_const_ms);
    let true_b = p(&truth_b, 0.5);
    let within = |e: f64, t: f64| (e / t - 1.0).abs() <= 0.25;
    let converged_at = (0..est_b.len()).find(|&k| est_b[k..].iter().all(|&e| within(e, true_b)));
    println!(
        "calibration: true {:.3e} s/token before, estimate after 50: {:.3e}; true {:.3e} after; \
         estimate after 10/20/30/50: {:.3e} {:.3e} {:.3e} {:.3e}; within 25% for good from request {:?}",
        true_a,
        est_a[49],
        true_b,
        est_b[9],
        est_b[19],
        est_b[29],
        est_b[49],
        converged_at.map(|k| k + 1)
    );
    assert!(within(est_a[49], true_a), "did not calibrate to the original speed");
    assert!(
        converged_at.is_some_and(|k| k < 50),
        "estimate not within 25% of {true_b:.3e} for good within 50 requests: {est_b:?}"
    );
}

/// With no prefix reuse at all, kv_aware balances like least_load.
#[test]
fn without_reuse_kv_aware_balances_like_least_load() {
    let run = |policy| {
        let mut fleet = Fleet::uniform(4, TimingModel::llmd_qwen3_32b(), policy);
        let mut rng = Rng::new(11);
        let mut t = Duration::ZERO;
        for _ in 0..400 {
            t += rng.exp(Duration::from_secs_f64(1.0 / 30.0));
            let len = 512 + (rng.next_u64() % 1024) as usize;
            fleet.submit(t, rng.tokens(len), 16);
        }
        fleet.run_to_idle();
        let c = fleet.counts(0..400);
        let ratio = *c.iter().max().unwrap() as f64 / *c.iter().min().unwrap() as f64;
        let tt = ttfts(&fleet, 0..400);
        (c, ratio, p(&tt, 0.9))
    };
    let (kv, kv_ratio, kv_p90) = run(PolicyKind::KvAware);
    let (ll, ll_ratio, ll_p90) = run(PolicyKind::LeastLoad);
    println!("no reuse: kv_aware {kv:?} ratio {kv_ratio:.2} p90 {kv_p90:.3}s; least_load {ll:?} ratio {ll_ratio:.2} p90 {ll_p90:.3}s");
    assert!(kv_ratio <= 1.3, "kv_aware unbalanced without reuse: {kv:?}");
    assert!(kv_p90 <= ll_p90 * 1.1, "kv_aware p90 {kv_p90:.3}s vs least_load {ll_p90:.3}s");
}

/// Several shared system prompts under steady load: kv_aware reuses more
/// cache than round robin and its tail TTFT is no worse.
#[test]
fn mixed_system_prompts_beat_round_robin() {
    let run = |policy| {
        let mut fleet = Fleet::uniform(4, TimingModel::llmd_qwen3_32b(), policy);
        shared_traffic(&mut fleet, 9, 8, 4096, 128, 20.0, Duration::from_secs(15), 16, None);
        fleet.run_to_idle();
        let n = fleet.records.len();
        let tt = ttfts(&fleet, 0..n);
        (fleet.counts(0..n), fleet.hit_tokens(), p(&tt, 0.5), p(&tt, 0.9))
    };
    let kv = run(PolicyKind::KvAware);
    let rr = run(PolicyKind::RoundRobin);
    println!("mixed: kv_aware {kv:?}; round_robin {rr:?} (counts, hit tokens, p50, p90)");
    assert!(kv.1 > rr.1, "kv_aware hit fewer tokens than round robin");
    assert!(kv.3 <= rr.3, "kv_aware p90 {:.3}s worse than round robin {:.3}s", kv.3, rr.3);
}

/// Agent sessions arriving over time (a shared system prompt, then each
/// session's own growing context): every continuing turn stays where its
/// session's cache is, and new sessions spread over the replicas rather than
/// piling onto whichever one is momentarily quiet (docs/routing.md, "Decode
/// delay").
#[test]
fn new_sessions_spread_while_continuing_sessions_stick() {
    const SESSIONS: usize = 24;
    const TURNS: usize = 8;
    let run = |decode_delay_weight: f64, future_work_weight: f64| {
        let mut router = support::router_config(PolicyKind::KvAware);
        router.cost.decode_delay_weight = decode_delay_weight;
        router.cost.future_work_weight = future_work_weight;
        let configs = (0..4).map(|_| support::engine_config(TimingModel::llmd_qwen3_32b()));
        let mut fleet = Fleet::new(configs.collect(), router);
        let mut rng = Rng::new(5);
        let system = rng.tokens(1024);
        // (arrival, session, prompt); turns of one session grow by 256 tokens.
        let mut plan = Vec::new();
        for s in 0..SESSIONS {
            let mut prompt = system.clone();
            prompt.extend(rng.tokens(2048));
            let mut t = Duration::from_millis(400 * s as u64 + rng.next_u64() % 100);
            for _ in 0..TURNS {
                plan.push((t, s, prompt.clone()));
                prompt.extend(rng.tokens(256));
                t += Duration::from_millis(1500 + rng.next_u64() % 500);
            }
        }
        plan.sort_by_key(|p| p.0);
        for (t, _, prompt) in &plan {
            fleet.submit(*t, prompt.clone(), 64);
        }
        fleet.run_to_idle();
        // Records are in arrival order, as the plan is.
        let mut last: Vec<Option<usize>> = vec![None; SESSIONS];
        let (mut stayed, mut continuing) = (0, 0);
        let mut sessions_on = [0usize; 4];
        for (k, (_, s, _)) in plan.iter().enumerate() {
            let r = fleet.records[k].replica;
            match last[*s] {
                None => sessions_on[r] += 1,
                Some(prev) => {
                    continuing += 1;
                    stayed += usize::from(prev == r);
                }
            }
            last[*s] = Some(r);
        }
        let n = fleet.records.len();
        let tt = ttfts(&fleet, 0..n);
        (stayed as f64 / continuing as f64, sessions_on, p(&tt, 0.5), p(&tt, 0.9))
    };
    let defaults = support::router_config(PolicyKind::KvAware).cost;
    let (stick, on, p50, p90) = run(defaults.decode_delay_weight, defaults.future_work_weight);
    let (stick0, on0, p50_0, p90_0) = run(0.0, 0.0);
    let (stick_f, on_f, _, _) = run(defaults.decode_delay_weight, 0.0);
    println!(
        "sessions: stick {stick:.3}, new sessions per replica {on:?}, p50 {p50:.3}s p90 {p90:.3}s; \
         without the decode-delay charge: stick {stick0:.3}, {on0:?}, p50 {p50_0:.3}s \
         p90 {p90_0:.3}s; without the future-work charge: stick {stick_f:.3}, {on_f:?}"
    );
    assert!(stick >= 0.9, "continuing turns moved: {stick:.3} stayed");
    // Without the charges new sessions pile onto the replicas that hold the
    // shared prompt (15/9/0/0 when written); with the decode-delay charge
    // alone they spread within 1.5× of an even share (7/7/6/4), but the
    // replica that warmed last still gets the fewest; the future-work charge
    // evens that out too without moving continuing sessions.
    let even = SESSIONS as f64 / 4.0;
    let hi = *on.iter().max().unwrap() as f64;
    let hi0 = *on0.iter().max().unwrap() as f64;
    assert!(hi <= 1.5 * even, "new sessions piled up: {on:?}");
    assert!(hi < hi0, "the charge did not spread sessions: {on:?} vs {on0:?}");
    assert!(stick_f >= 0.9, "continuing turns moved: {stick_f:.3}");
    let spread = |on: &[usize; 4]| on.iter().max().unwrap() - on.iter().min().unwrap();
    assert!(
        spread(&on) < spread(&on_f),
        "the future-work charge did not even out {on:?}: {on_f:?}"
    );
}
