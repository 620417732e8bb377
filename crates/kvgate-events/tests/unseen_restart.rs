//! A publisher that restarts while the subscriber's SUB connection stays
//! open and silent: the socket never reports a disconnect, so only the
//! replay endpoint can tell that the process behind it is new. Seen once in
//! front of a real engine killed mid-stream (the view kept the dead
//! process's blocks and never learnt the new one's).
//!
//! A TCP relay between the SUB socket and the publisher plays the silent
//! connection: frozen, it keeps the subscriber's connection open and
//! forwards nothing; connections made after the freeze are relayed as usual.

#![cfg(all(feature = "publisher", feature = "subscriber"))]
// Test harness code: a failed unwrap is a failed test, with its message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use kvgate_events::publisher::{Publisher, PublisherConfig};
use kvgate_events::subscriber::{
    ResetReason, Subscriber, SubscriberConfig, SubscriberMetrics, Update,
};
use kvgate_events::{Batch, BlockHash, BlockStored, Event};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};

const WAIT: Duration = Duration::from_secs(20);

fn batch(hash: u64) -> Batch {
    let stored = BlockStored::new(vec![BlockHash::Int(hash)], None, (0..16).collect(), 16);
    Batch { ts: 1.0, events: vec![Event::Stored(stored)], dp_rank: None, skipped_events: 0 }
}

fn port_of(endpoint: &str) -> u16 {
    endpoint.rsplit(':').next().and_then(|p| p.parse().ok()).expect("a tcp endpoint with a port")
}

/// Relays every connection on its port to `target`, until frozen: the
/// connections open at the freeze stay open and go silent.
struct Relay {
    port: u16,
    freeze: watch::Sender<bool>,
}

impl Relay {
    async fn start(target: u16) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (freeze, frozen) = watch::channel(false);
        tokio::spawn(async move {
            while let Ok((mut down, _)) = listener.accept().await {
                let mut frozen = frozen.clone();
                let old = !*frozen.borrow();
                tokio::spawn(async move {
                    let Ok(mut up) = TcpStream::connect(("127.0.0.1", target)).await else {
                        return;
                    };
                    if !old {
                        let _ = tokio::io::copy_bidirectional(&mut down, &mut up).await;
                        return;
                    }
                    let froze = tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut down, &mut up) => false,
                        _ = frozen.wait_for(|f| *f) => true,
                    };
                    if froze {
                        // Silent from now on, but open: hold `down`.
                        drop(up);
                        std::future::pending::<()>().await;
                    }
                });
            }
        });
        Relay { port, freeze }
    }
}

async fn start_publisher(events: &str, replay: &str) -> Publisher {
    let deadline = Instant::now() + WAIT;
    loop {
        let mut cfg = PublisherConfig::new(events);
        cfg.replay_endpoint = Some(replay.to_owned());
        match Publisher::start(cfg).await {
            Ok(p) => return p,
            // The old process's ports may take a moment to free.
            Err(e) if Instant::now() < deadline => {
                eprintln!("publisher not up yet: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("publisher never started: {e}"),
        }
    }
}

/// Publishes `b` until it arrives live; returns its seq.
async fn until_live(publisher: &Publisher, b: &Batch, rx: &mut mpsc::Receiver<Update>) -> u64 {
    let deadline = Instant::now() + WAIT;
    loop {
        assert!(Instant::now() < deadline, "no batch arrived live");
        let seq = publisher.publish(b);
        while let Ok(Some(u)) = tokio::time::timeout(Duration::from_millis(50), rx.recv()).await {
            if let Update::Batch { seq: got, replayed: false, .. } = u {
                if got == seq {
                    return seq;
                }
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_the_sub_socket_never_sees_is_found_through_the_replay_endpoint() {
    let old = start_publisher("tcp://*:0", "tcp://127.0.0.1:0").await;
    let events = old.local_endpoints().events.clone();
    let replay = old.local_endpoints().replay.clone().unwrap();
    let relay = Relay::start(port_of(&events)).await;

    let mut cfg = SubscriberConfig::new(format!("tcp://127.0.0.1:{}", relay.port));
    cfg.replay_endpoint = Some(replay.clone());
    cfg.tail_probe_after = Some(Duration::from_millis(50));
    cfg.quiet_check = Duration::from_millis(200);
    cfg.backoff_max = Duration::from_millis(500);
    let metrics = Arc::new(SubscriberMetrics::default());
    let (tx, mut rx) = mpsc::channel(10_000);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let sub = Subscriber::new(cfg, Arc::clone(&metrics), tx);
    tokio::spawn(sub.run(async {
        let _ = stopped.await;
    }));

    let last = until_live(&old, &batch(1), &mut rx).await;
    // Let the tail probe find the stream quiet, then kill the publisher
    // behind a connection that says nothing.
    tokio::time::sleep(Duration::from_millis(300)).await;
    relay.freeze.send(true).unwrap();
    old.shutdown().await;
    drop(old);
    // (A `tcp://*` events endpoint is bound; any other is connected.)
    let new = start_publisher(&format!("tcp://*:{}", port_of(&events)), &replay).await;
    // The new process numbers from 0 again: its seq `last` exists, with
    // other contents.
    for i in 0..=last + 2 {
        new.publish(&batch(1_000 + i));
    }

    let deadline = Instant::now() + WAIT;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, rx.recv()).await {
            Ok(Some(Update::Reset { reason })) => {
                assert_eq!(reason, ResetReason::RestartedWhileDisconnected { last });
                break;
            }
            Ok(Some(Update::Disconnected)) => panic!("the relay let a disconnect through"),
            Ok(Some(_)) => {}
            Ok(None) => panic!("the subscriber stopped"),
            Err(_) => panic!("the restart was never noticed"),
        }
    }
    // The new process's batches are learnt (replayed from its start), and
    // its live stream reaches the replaced socket.
    let mut replayed = 0;
    while let Ok(Some(u)) = tokio::time::timeout(Duration::from_millis(300), rx.recv()).await {
        if let Update::Batch { replayed: true, .. } = u {
            replayed += 1;
        }
    }
    assert_eq!(replayed, last + 3);
    until_live(&new, &batch(9_999), &mut rx).await;
    assert!(metrics.reconnects.load(std::sync::atomic::Ordering::Relaxed) >= 1);
    let _ = stop.send(());
    new.shutdown().await;
}
