//! Fast mode and `serve` drive one fleet core (`kvgate-fleet`); this test
//! holds them to it. Fast-mode replay runs a small chat workload against
//! simulated engines and keeps its journal: every scrape, event batch,
//! upkeep tick, arrival, first token and end it handed the core, at its
//! virtual instant. The same journal then drives `serve`'s request path
//! over fake engines on a paused clock: scrapes, events and ticks go to the
//! fleet as the gateway's monitor, feeds and upkeep would hand them in; each
//! arrival is a token-id completion through `forward`, whose engine answers
//! with its first token and its end exactly when the simulated engine gave
//! them. Both must make the same decisions (the router's explanation of
//! each: replica, booking, every candidate's overlap, load, predicted TTFT
//! and score) and end with the same books.

use std::collections::HashMap;
use std::sync::Arc;

use axum::http::HeaderMap;
use bytes::Bytes;
use kvgate_replay::{CoreInput, FleetSpec, SyntheticSpec};
use kvgate_router::{Explanation, Router, RouterConfig};

use super::forward;
use super::tests::{gateway, DONE, TOKEN};
use crate::clock;
use crate::doors::api::ApiContext;
use crate::request::engine_fake::fed;

/// Long enough that the monitor probes once, at the start, and never
/// again during the test: the journal's scrapes stand in for its probes.
const NEVER_MS: u64 = 86_400_000;

/// Which position (in the fleet's order) a decision names, by the
/// replica's name: `replica-3` in fast mode, `http://r3:…` in the gateway.
fn position(router: &Router, id: kvgate_index::ReplicaId) -> usize {
    let (info, _) = router.replica(id).expect("a replica the router knows");
    let digits: String = info
        .name
        .chars()
        .skip_while(|c| !c.is_ascii_digit())
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().expect("a numbered replica")
}

/// A decision with replica ids replaced by positions, and its instant left
/// out (the two runs start at different instants; every duration between
/// their inputs is the same).
fn comparable(router: &Router, e: &Explanation) -> String {
    let mut candidates = e.candidates.clone();
    candidates.sort_by_key(|c| position(router, c.replica));
    let rows: Vec<String> = candidates
        .iter()
        .map(|c| {
            format!(
                "#{} {:?} busy {} overlap {:?} tentative {} pending {} decoding {} requests {} \
                 booked {} predicted {:e} score {:e}",
                position(router, c.replica),
                c.health,
                c.busy,
                c.overlap_blocks,
                c.tentative_blocks,
                c.pending_prefill_tokens,
                c.decoding,
                c.requests,
                c.booked_blocks,
                c.predicted_ttft_s,
                c.score
            )
        })
        .collect();
    format!(
        "booking {:?} prompt {} ({} blocks) -> {:?} because {:?}; {} candidates: {}",
        e.booking,
        e.prompt_tokens,
        e.prompt_blocks,
        e.chosen.map(|id| position(router, id)),
        e.reason,
        e.candidates_total,
        rows.join(" | ")
    )
}

/// Yields to the gateway's tasks until `done` holds (they run at the
/// paused instant: no time passes).
async fn settle(api: &ApiContext, what: &str, done: impl Fn(&ApiContext) -> bool) {
    for _ in 0..10_000 {
        if done(api) {
            return;
        }
        tokio::task::yield_now().await;
    }
    panic!("the gateway never got there: {what}");
}

#[tokio::test(start_paused = true)]
async fn serve_makes_the_decisions_fast_mode_makes_with_the_same_bookings() {
    // Fast mode: three replicas whose caches hold less than the workload's
    // prefixes, requests overlapping in time.
    let spec: SyntheticSpec = "synthetic:chat,seed=5,conversations=16,turns=3,system_prompts=4,\
        system_tokens=512,user_tokens=96,output_tokens=24,think_s=2,rate=6"
        .parse()
        .expect("spec");
    let workload = spec.generate(None);
    let mut fleet = FleetSpec::acceptance();
    fleet.replicas = 3;
    fleet.engine.block_size = 16;
    fleet.engine.num_gpu_blocks = 160;
    fleet.engine.num_cpu_blocks = 0;
    let mut fast = kvgate_replay::Fleet::new(&fleet, RouterConfig::default()).expect("fleet");
    fast.keep_journal();
    fast.run(&workload, 1.0, &|_| ());
    assert_eq!(fast.unserved, 0);
    let journal = fast.journal().to_vec();
    assert!(journal.iter().any(|i| matches!(i, CoreInput::Events { .. })));

    // serve's request path over fake engines, on the paused clock.
    let engines = ["r0:1", "r1:2", "r2:3"];
    let (api, fake) = gateway(&engines, |c| {
        c.monitor.health_interval_ms = NEVER_MS;
        c.monitor.metrics_interval_ms = NEVER_MS;
        for r in &mut c.replicas {
            r.block_size = 16;
        }
    })
    .await;
    let ids: Vec<_> = engines
        .iter()
        .map(|e| api.view.replicas.by_name(&format!("http://{e}")).expect("replica").id)
        .collect();
    let model = api.pools.all()[0].model.served_name.clone();
    let base = tokio::time::Instant::now();
    let mut streams = HashMap::new();
    let mut clients = Vec::new();
    let totals = |api: &ApiContext| api.fleet.with(|f| f.router().ledger_totals());
    for input in &journal {
        let at = base + input.at();
        let now = tokio::time::Instant::now();
        if at > now {
            tokio::time::advance(at - now).await;
        }
        let now = clock::now();
        match input {
            CoreInput::Tick { .. } => api.fleet.with(|f| f.tick(now)),
            CoreInput::Scrape { replica, scrape, .. } => {
                let scrape = Ok(scrape.clone());
                api.fleet.with(|f| f.probe_succeeded(ids[*replica], scrape, now));
            }
            CoreInput::Events { replica, batch, .. } => {
                api.fleet.with(|f| f.apply_events(ids[*replica], batch, now));
            }
            CoreInput::Arrival { request, .. } => {
                let r = &workload.requests[*request];
                let body = serde_json::json!({
                    "model": model,
                    "prompt": r.prompt.tokens(),
                    "max_tokens": r.output_tokens,
                    "stream": true,
                });
                let p = crate::request::prepare::completions(
                    &api.preparer,
                    Bytes::from(body.to_string()),
                )
                .await
                .expect("prepared");
                let (answer, tx) = fed();
                fake.next([answer]);
                streams.insert(*request, tx);
                let booked = totals(&api).booked;
                let client = Arc::clone(&api);
                clients.push(tokio::spawn(async move {
                    let permit = Arc::new(
                        Arc::new(tokio::sync::Semaphore::new(1))
                            .try_acquire_owned()
                            .expect("permit"),
                    );
                    let resp =
                        forward(&client.forwarder, p, &HeaderMap::new(), permit, clock::now())
                            .await;
                    assert_eq!(resp.status(), 200);
                    axum::body::to_bytes(resp.into_body(), usize::MAX).await.expect("body")
                }));
                settle(&api, "the request booked", |a| totals(a).booked > booked).await;
            }
            CoreInput::FirstToken { request, .. } => {
                let first = totals(&api).first_tokens;
                streams[request].send(TOKEN).expect("the relay reads its stream");
                settle(&api, "its first token", |a| totals(a).first_tokens > first).await;
            }
            CoreInput::Finished { request, .. } => {
                let finished = totals(&api).finished;
                let tx = streams.remove(request).expect("a stream in flight");
                tx.send(DONE).expect("the relay reads its stream");
                drop(tx);
                settle(&api, "its end", |a| totals(a).finished > finished).await;
            }
        }
    }
    for c in clients {
        let body = c.await.expect("client");
        assert!(body.ends_with(DONE.as_bytes()));
    }

    let served: Vec<String> = api.fleet.with(|f| {
        let r = f.router();
        r.recent_decisions().map(|e| comparable(r, e)).collect()
    });
    let replayed: Vec<String> =
        fast.router().recent_decisions().map(|e| comparable(fast.router(), e)).collect();
    assert_eq!(replayed.len(), workload.requests.len());
    for (i, (s, f)) in served.iter().zip(&replayed).enumerate() {
        assert_eq!(s, f, "decision {i}: serve, then fast mode");
    }
    assert_eq!(served.len(), replayed.len());
    let (s, f) = (totals(&api), fast.router().ledger_totals());
    assert_eq!(
        (s.booked, s.first_tokens, s.finished, s.prefill_tokens_booked),
        (f.booked, f.first_tokens, f.finished, f.prefill_tokens_booked)
    );
    assert_eq!(api.fleet.with(|f| f.in_flight()), 0);
    // Every request went where fast mode sent it.
    let seen: Vec<String> = fake.seen().into_iter().map(|s| s.engine).collect();
    let sent: Vec<String> = (0..workload.requests.len())
        .map(|i| engines[fast.records[i].replica.expect("served")].to_owned())
        .collect();
    let arrivals: Vec<usize> = journal
        .iter()
        .filter_map(|i| match i {
            CoreInput::Arrival { request, .. } => Some(*request),
            _ => None,
        })
        .collect();
    let sent_in_order: Vec<String> = arrivals.iter().map(|&i| sent[i].clone()).collect();
    assert_eq!(seen, sent_in_order);
}
