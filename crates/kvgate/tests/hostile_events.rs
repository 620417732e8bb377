//! Hostile KV event streams (issue 8): a publisher that kvgate dials (as it
//! dials every configured engine) sends messages on another topic, absurd
//! block counts, undecodable payloads and broken frames, then floods the
//! index with far more blocks than the engine can hold. Each is counted and
//! bounded; kvgate neither crashes nor grows, and keeps serving.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::{Duration, Instant};

use bytes::Bytes;
use kvgate_events::{encode_batch, Batch, BlockHash, BlockStored, Event, Layout};
use serde_json::Value;
use support::*;
use zeromq::{PubSocket, Socket, SocketSend, ZmqMessage};

const BLOCK: u32 = 16;
const CAPACITY: u64 = 500;

/// A BlockStored of `hashes` as one chain from the root.
fn stored(hashes: &[u64], tokens_per_block: usize) -> Event {
    Event::Stored(BlockStored::new(
        hashes.iter().map(|&h| BlockHash::Int(h)).collect(),
        None,
        (0..tokens_per_block as u32).collect(),
        BLOCK,
    ))
}

fn batch(events: Vec<Event>) -> Vec<u8> {
    encode_batch(&Batch { ts: 0.0, events, dp_rank: None, skipped_events: 0 }, Layout::V0_26)
}

/// One block per event, each its own chain: `n` distinct blocks from `first`.
fn independent_blocks(first: u64, n: u64) -> Vec<Event> {
    (first..first + n)
        .map(|h| {
            let mut e = stored(&[h], BLOCK as usize);
            if let Event::Stored(s) = &mut e {
                // Distinct contents too, so that no two blocks share a key.
                s.token_ids =
                    (0..BLOCK).map(|t| (h as u32).wrapping_mul(31).wrapping_add(t)).collect();
            }
            e
        })
        .collect()
}

struct Hostile {
    socket: PubSocket,
    seq: u64,
}

impl Hostile {
    async fn send_frames(&mut self, frames: Vec<Bytes>) {
        let mut frames = frames.into_iter();
        let mut msg = ZmqMessage::from(frames.next().unwrap());
        for f in frames {
            msg.push_back(f);
        }
        self.socket.send(msg).await.unwrap();
    }

    /// `[topic, seq, payload]` with the next seq.
    async fn publish(&mut self, topic: &str, payload: Vec<u8>) {
        let seq = self.seq;
        self.seq += 1;
        let frames = vec![
            Bytes::from(topic.to_owned()),
            Bytes::copy_from_slice(&seq.to_be_bytes()),
            Bytes::from(payload),
        ];
        self.send_frames(frames).await;
    }
}

async fn replica(serve: &Serve) -> Value {
    let v = get_json(&format!("{}/admin/replicas", serve.admin)).await;
    v["replicas"][0].clone()
}

async fn holds(serve: &Serve, hash: u64) -> bool {
    let v = get_json(&format!("{}/admin/replicas/r0/blocks", serve.admin)).await;
    v["gpu"].as_array().unwrap().iter().any(|h| h.as_u64() == Some(hash))
}

/// Publishes a one-block marker on the right topic until kvgate holds it:
/// everything published before it has then been processed.
async fn sync(p: &mut Hostile, serve: &Serve, marker: u64) {
    let t0 = Instant::now();
    loop {
        p.publish("kv", batch(independent_blocks(marker, 1))).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        if holds(serve, marker).await {
            return;
        }
        assert!(t0.elapsed() < Duration::from_secs(15), "marker {marker} never applied");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_event_streams_are_counted_and_bounded() {
    let sim = spawn_sim(None, false, &["--num-gpu-blocks", &CAPACITY.to_string()]);
    let mut socket = PubSocket::new();
    let endpoint = socket.bind("tcp://127.0.0.1:0").await.unwrap();
    let mut p = Hostile { socket, seq: 0 };
    let spec = format!("{},name=r0,events={endpoint},topic=kv", sim.url);
    let serve = spawn_serve_with(&[spec], &[]);
    wait_ready(&serve.base).await;
    let pid = serve.proc.0.id();
    sync(&mut p, &serve, 1).await;
    // The engine's real size has been scraped: the index bound is 500.
    let t0 = Instant::now();
    while replica(&serve).await["capacity_blocks"][0] != CAPACITY {
        assert!(t0.elapsed() < Duration::from_secs(10), "{}", replica(&serve).await);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let rss_start = rss_kib(pid);

    // 1. Another topic that starts with ours (ZMQ's filter is a prefix
    // match): dropped and counted, nothing stored.
    for i in 0..50 {
        p.publish("kv-evil", batch(independent_blocks(1_000 + i, 1))).await;
    }
    sync(&mut p, &serve, 2).await;
    let r = replica(&serve).await;
    assert_eq!(r["event_wrong_topic"], 50, "{r}");
    for i in 0..50 {
        assert!(!holds(&serve, 1_000 + i).await, "block {i} from another topic stored");
    }

    // 2. Absurd block counts and undecodable input.
    // 100,000 hashes with 16 tokens: inconsistent, refused whole.
    let hashes: Vec<u64> = (10_000..110_000).collect();
    p.publish("kv", batch(vec![stored(&hashes, BLOCK as usize)])).await;
    // An array header claiming 4 billion elements, and nothing after it.
    p.publish("kv", vec![0xdd, 0xff, 0xff, 0xff, 0xff]).await;
    // Two frames instead of three; a seq frame of 3 bytes.
    p.send_frames(vec![Bytes::from_static(b"kv"), Bytes::from_static(b"x")]).await;
    p.send_frames(vec![Bytes::from_static(b"kv"), Bytes::from_static(b"abc"), Bytes::new()]).await;
    sync(&mut p, &serve, 3).await;
    assert!(!holds(&serve, 10_000).await);
    let r = replica(&serve).await;
    assert!(r["index_anomalies"]["malformed"].as_u64() >= Some(1), "{r}");
    assert!(r["event_decode_errors"].as_u64() >= Some(3), "{r}");
    // The undecodable batch may have hidden a removal: the view was reset.
    assert!(
        r["event_resets"].as_u64() >= Some(1) || r["problems"].to_string().contains("undecodable"),
        "{r}"
    );

    // 3. A flood of 40,000 distinct blocks, 80 times the engine's size.
    for chunk in 0..200 {
        p.publish("kv", batch(independent_blocks(1_000_000 + chunk * 200, 200))).await;
    }
    sync(&mut p, &serve, 4).await;
    let r = replica(&serve).await;
    let held = r["index_blocks"][0].as_u64().unwrap();
    let bound = CAPACITY + CAPACITY / 16 + 64;
    let evicted = r["index_anomalies"]["over_capacity_evictions"].as_u64().unwrap();
    let grown_mib = rss_kib(pid).saturating_sub(rss_start) / 1024;
    eprintln!(
        "flood: 40,000 blocks sent, {held} held (bound {bound}), {evicted} dropped and counted; RSS +{grown_mib} MiB"
    );
    assert!(held <= bound, "{held} blocks held, bound {bound}");
    assert!(evicted >= 40_000 - bound, "{evicted}");
    assert!(grown_mib < 64, "RSS grew {grown_mib} MiB");

    // kvgate is alive and serves through the replica.
    let health = client().get(format!("{}/health", serve.base)).send().await.unwrap();
    assert_eq!(health.status(), 200);
    let body = token_completion(&(0..64).collect::<Vec<u32>>(), 2, false);
    let r =
        client().post(format!("{}/v1/completions", serve.base)).json(&body).send().await.unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
}
