//! Several kvgate instances sharing their load (issue 9), as processes:
//! two instances in front of the same three simulated replicas, each sending
//! its bookings to the other. The other instance must see them (and their
//! end), and a peer that dies must neither block routing nor leave its
//! bookings behind.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::{Duration, Instant};

use serde_json::Value;
use support::*;

const KEY: &str = "peer-key-for-tests-0123";

fn instance(sims: &[&Sim], me: u16, other: u16) -> Serve {
    let listen = format!("127.0.0.1:{me}");
    let peer = format!("http://127.0.0.1:{other}");
    spawn_serve(
        sims,
        &[
            "--peer-listen",
            &listen,
            "--peer",
            &peer,
            "--peer-key",
            KEY,
            "--set",
            "peers.timeout_ms=900",
        ],
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peers_see_each_others_bookings_and_survive_a_peer_death() {
    let flags = ["--speedup", "2"];
    let sims = [
        spawn_sim(None, true, &flags),
        spawn_sim(None, true, &flags),
        spawn_sim(None, true, &flags),
    ];
    let refs: Vec<&Sim> = sims.iter().collect();
    let ports = free_ports(2);
    let mut a = instance(&refs, ports[0], ports[1]);
    let b = instance(&refs, ports[1], ports[0]);
    wait_ready(&a.base).await;
    wait_ready(&b.base).await;

    // 1. A's bookings reach B, and so does their end.
    let streams = long_streams(&a.base, 4, 0);
    wait_for("B sees A's 4 bookings", Duration::from_secs(5), async || booked(&b.admin).await == 4)
        .await;
    assert!(metric(&b.base, "kvgate_peer_changes_received_total").await >= 4.0);
    assert!(metric(&a.base, "kvgate_peer_batches_sent_total").await >= 1.0);
    for s in streams {
        assert!(s.await.unwrap() > 0);
    }
    wait_for("B sees A's bookings end", Duration::from_secs(5), async || {
        booked(&b.admin).await == 0
    })
    .await;
    assert_eq!(metric(&b.base, "kvgate_peers_forgotten_total").await, 0.0);

    // A wrong key is refused at the peer port.
    let r = client()
        .post(format!("http://127.0.0.1:{}/peer/v1/changes", ports[1]))
        .bearer_auth("not-the-peer-key-at-all")
        .body(r#"{"instance":"x","sent_unix_ms":0,"changes":[]}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);

    // 2. A dies with bookings in flight: B keeps routing at once, and A's
    // bookings are released once A has been silent for the timeout.
    let _streams = long_streams(&a.base, 3, 0);
    wait_for("B sees A's 3 bookings", Duration::from_secs(5), async || booked(&b.admin).await == 3)
        .await;
    let _ = a.proc.0.kill();
    let _ = a.proc.0.wait();
    let killed = Instant::now();
    let url = format!("{}/v1/completions", b.base);
    for i in 0..8u32 {
        let prompt: Vec<u32> = (0..32).map(|t| 50_000 + i * 100 + t).collect();
        let t = Instant::now();
        let r =
            client().post(&url).json(&token_completion(&prompt, 2, false)).send().await.unwrap();
        assert_eq!(r.status(), 200);
        let _: Value = r.json().await.unwrap();
        assert!(
            t.elapsed() < Duration::from_secs(3),
            "a request took {:?} with a dead peer",
            t.elapsed()
        );
    }
    wait_for("A's bookings aged out", Duration::from_secs(5), async || booked(&b.admin).await == 0)
        .await;
    let aged = killed.elapsed();
    eprintln!("peer killed: its 3 bookings released after {aged:?} (timeout 0.9 s)");
    assert!(metric(&b.base, "kvgate_peers_forgotten_total").await >= 1.0);
    let gone = metric(&b.base, "kvgate_ledger_releases_total{reason=\"peer_gone\"}").await;
    assert!(gone >= 3.0 || metric(&b.base, "kvgate_ledger_releases_total").await >= 3.0, "{gone}");
    // B keeps trying A, and counts the failures instead of blocking.
    assert!(metric(&b.base, "kvgate_peer_send_failures_total").await >= 1.0);
}

/// Engines found through DNS: `localhost` resolves to the simulated engine,
/// which becomes a replica named by its address and serves requests; no
/// simulated replicas of kvgate's own are started.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engines_are_discovered_through_dns() {
    let ports = SimPorts::pick();
    let _sim = spawn_sim(Some(ports), true, &["--speedup", "20"]);
    let serve = spawn_serve_with(
        &[],
        &[
            "--discover-dns",
            "localhost",
            "--set",
            &format!("discovery.http_port={}", ports.http),
            "--set",
            &format!("discovery.events_port={}", ports.events),
            "--set",
            &format!("discovery.replay_port={}", ports.replay),
            "--set",
            "discovery.interval_ms=200",
        ],
    );
    let name = format!("127.0.0.1:{}", ports.http);
    wait_for("the engine discovered and healthy", Duration::from_secs(10), async || {
        let v = get_json(&format!("{}/admin/replicas", serve.admin)).await;
        v["replicas"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["name"] == name && r["health"] == "healthy")
    })
    .await;
    let v = get_json(&format!("{}/admin/replicas", serve.admin)).await;
    assert!(
        v["replicas"]
            .as_array()
            .unwrap()
            .iter()
            .all(|r| !r["name"].as_str().unwrap().starts_with("sim-")),
        "embedded sims started despite discovery: {v}"
    );
    let prompt: Vec<u32> = (0..48).collect();
    let r = client()
        .post(format!("{}/v1/completions", serve.base))
        .json(&token_completion(&prompt, 2, false))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["x-kvgate-replica"], name.as_str());
}
