//! The Rust publisher against real ZMQ on loopback (port 0): our own
//! subscriber for every layout, drop-fault recovery through replay, a wrapped
//! replay buffer, and a Python subscriber built on libzmq (pyzmq) and msgspec
//! structs shaped like vLLM's (tests/py/msgspec_subscriber.py), which also
//! checks the replay frame shapes from a DEALER.
//!
//! The Python test needs the venv from `scripts/setup-test-env.sh`
//! (`.cache/venv`, or `$KVGATE_TEST_PYTHON`); without it, it fails and says so.

#![cfg(all(feature = "publisher", feature = "subscriber"))]
// Test harness code: a failed unwrap is a failed test, with its message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kvgate_events::publisher::{
    drop_decision, loopback_endpoint, replay_has_topic, Publisher, PublisherConfig,
};
use kvgate_events::subscriber::{Subscriber, SubscriberConfig, SubscriberMetrics, Update};
use kvgate_events::{
    decode_batch, encode_batch, Batch, BlockHash, BlockRemoved, BlockStored, Event, Layout, Medium,
};
use rmpv::Value as Mp;
use serde_json::{json, Value};
use tokio::sync::{mpsc, oneshot};

const WAIT: Duration = Duration::from_secs(20);

// --- fixtures -------------------------------------------------------------------

fn stored(first: u64, n: u64, parent: Option<u64>) -> BlockStored {
    let hashes = (first..first + n).map(BlockHash::Int).collect();
    let tokens = (0..16 * n as u32).map(|t| t + first as u32).collect();
    BlockStored::new(hashes, parent.map(BlockHash::Int), tokens, 16)
}

/// Varied batches: int and byte hashes, CPU placeholders, LoRA and hybrid
/// fields, removals, clears, with and without a dp rank.
fn sample_batches() -> Vec<Batch> {
    let mut out = Vec::new();
    for i in 0..12u64 {
        let mut events = vec![Event::Stored(stored(100 * i + 1, 2, (i > 0).then_some(100 * i)))];
        match i % 4 {
            0 => {
                let mut s = stored(100 * i + 50, 1, None);
                s.lora_id = Some(3);
                s.lora_name = Some("adapter-a".into());
                s.extra_keys = Some(vec![Mp::Array(vec![Mp::from("adapter-a")])]);
                events.push(Event::Stored(s));
            }
            1 => {
                let mut s = BlockStored::new(vec![BlockHash::Int(100 * i + 1)], None, vec![], 0);
                s.medium = Some(Medium::Cpu);
                events.push(Event::Stored(s));
                events.push(Event::Removed(BlockRemoved {
                    block_hashes: vec![BlockHash::Int(7), BlockHash::Int(8)],
                    medium: Some(Medium::Gpu),
                    group_idx: None,
                }));
            }
            2 => {
                let mut s = BlockStored::new(
                    vec![BlockHash::Bytes((0..32).collect()), BlockHash::Bytes(vec![0xab; 32])],
                    Some(BlockHash::Bytes(vec![1; 32])),
                    (0..32).collect(),
                    16,
                );
                s.group_idx = Some(1);
                s.kv_cache_spec_kind = Some("sliding_window".into());
                s.kv_cache_spec_sliding_window = Some(4096);
                events.push(Event::Stored(s));
                events.push(Event::Removed(BlockRemoved {
                    block_hashes: vec![BlockHash::Int(u64::MAX)],
                    medium: None,
                    group_idx: Some(1),
                }));
            }
            _ => events.push(Event::AllCleared),
        }
        out.push(Batch {
            ts: 1_700_000_000.25 + i as f64,
            events,
            dp_rank: (i % 3 != 0).then_some((i % 2) as u32),
            skipped_events: 0,
        });
    }
    out
}

fn probe() -> Batch {
    Batch { ts: 0.5, events: vec![], dp_rank: Some(0), skipped_events: 0 }
}

/// What a subscriber decodes from `batch` after it went through `layout`.
fn roundtrip(batch: &Batch, layout: Layout) -> Batch {
    decode_batch(&encode_batch(batch, layout)).unwrap()
}

fn config(layout: Layout, replay: bool) -> PublisherConfig {
    let mut c = PublisherConfig::new("tcp://*:0");
    c.layout = layout;
    if replay {
        c.replay_endpoint = Some("tcp://127.0.0.1:0".into());
    }
    c
}

// --- our own subscriber ---------------------------------------------------------

struct Sub {
    rx: mpsc::Receiver<Update>,
    metrics: Arc<SubscriberMetrics>,
    stop: Option<oneshot::Sender<()>>,
}

impl Sub {
    fn start(publisher: &Publisher) -> Sub {
        Sub::start_with(publisher, |_| {})
    }

    /// A subscriber to `publisher` with its config adjusted by `tweak`.
    fn start_with(publisher: &Publisher, tweak: impl FnOnce(&mut SubscriberConfig)) -> Sub {
        let local = publisher.local_endpoints();
        let mut cfg = SubscriberConfig::new(loopback_endpoint(&local.events));
        cfg.replay_endpoint = local.replay.as_deref().map(loopback_endpoint);
        tweak(&mut cfg);
        let metrics = Arc::new(SubscriberMetrics::default());
        let (tx, rx) = mpsc::channel(10_000);
        let (stop, stopped) = oneshot::channel::<()>();
        let sub = Subscriber::new(cfg, Arc::clone(&metrics), tx);
        tokio::spawn(async move {
            sub.run(async {
                let _ = stopped.await;
            })
            .await
        });
        Sub { rx, metrics, stop: Some(stop) }
    }

    async fn next(&mut self) -> Update {
        tokio::time::timeout(WAIT, self.rx.recv())
            .await
            .expect("no update from the subscriber in time")
            .expect("subscriber stopped")
    }

    fn stop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }
}

/// Publishes probes until the subscriber receives one live batch (its
/// subscription has reached the PUB socket), then drains what is queued.
async fn warm_up(publisher: &Publisher, sub: &mut Sub) {
    let deadline = Instant::now() + WAIT;
    loop {
        assert!(Instant::now() < deadline, "subscriber never received a live batch");
        publisher.publish(&probe());
        let got = tokio::time::timeout(Duration::from_millis(50), sub.rx.recv()).await;
        if let Ok(Some(Update::Batch { replayed: false, .. })) = got {
            break;
        }
    }
    while let Ok(Some(_)) = tokio::time::timeout(Duration::from_millis(100), sub.rx.recv()).await {}
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscriber_receives_batches_in_order_for_each_layout() {
    let batches = sample_batches();
    for layout in Layout::ALL {
        let publisher = Publisher::start(config(layout, false)).await.unwrap();
        assert!(publisher.local_endpoints().events_bound);
        assert!(publisher.local_endpoints().events.starts_with("tcp://0.0.0.0:"));
        let mut sub = Sub::start(&publisher);
        warm_up(&publisher, &mut sub).await;

        let first = publisher.next_seq();
        let seqs: Vec<u64> = batches.iter().map(|b| publisher.publish(b)).collect();
        assert_eq!(seqs, (first..first + batches.len() as u64).collect::<Vec<_>>());
        let mut got = Vec::new();
        while got.len() < batches.len() {
            match sub.next().await {
                Update::Batch { seq, batch, replayed } => {
                    assert!(!replayed);
                    got.push((seq, batch));
                }
                other => panic!("{layout:?}: unexpected {other:?}"),
            }
        }
        for ((seq, batch), (want_seq, original)) in got.iter().zip(seqs.iter().zip(&batches)) {
            assert_eq!(seq, want_seq, "{layout:?}");
            assert_eq!(batch, &roundtrip(original, layout), "{layout:?} seq {seq}");
        }
        assert_eq!(sub.metrics.gaps.load(std::sync::atomic::Ordering::Relaxed), 0);
        assert_eq!(publisher.metrics().published(), publisher.next_seq());
        sub.stop();
        publisher.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_batches_are_recovered_through_replay() {
    use std::sync::atomic::Ordering::Relaxed;
    let (seed, rate) = (42, 0.3);
    for layout in Layout::ALL {
        let mut cfg = config(layout, true);
        cfg.drop_rate = rate;
        cfg.drop_seed = seed;
        let publisher = Publisher::start(cfg).await.unwrap();
        let batches = sample_batches();
        // Published before the subscriber starts: its startup replay covers them.
        for b in &batches[..3] {
            publisher.publish(b);
        }
        let mut sub = Sub::start(&publisher);
        // Publish until a live batch arrives, then many more; end with one
        // that is not dropped, so that the subscriber can see every gap.
        let deadline = Instant::now() + WAIT;
        let mut received = BTreeSet::new();
        let mut live = 0;
        let mut i = 3;
        let mut last_sent = None;
        let mut target = u64::MAX;
        loop {
            if target == u64::MAX {
                let seq = publisher.publish(&batches[i % batches.len()]);
                i += 1;
                if !drop_decision(seed, rate, seq) {
                    last_sent = Some(seq);
                }
                if live > 0 && seq >= 60 && last_sent == Some(seq) {
                    target = seq;
                }
            }
            assert!(Instant::now() < deadline, "{layout:?}: gave up; received {received:?}");
            let got = tokio::time::timeout(Duration::from_millis(20), sub.rx.recv()).await;
            let Ok(update) = got else { continue };
            match update.expect("subscriber stopped") {
                Update::Batch { seq, batch, replayed } => {
                    let original = &batches[(seq as usize) % batches.len()];
                    assert_eq!(batch, roundtrip(original, layout), "{layout:?} seq {seq}");
                    assert!(received.insert(seq), "{layout:?}: seq {seq} delivered twice");
                    if !replayed {
                        live += 1;
                    }
                    if seq == target {
                        break;
                    }
                }
                Update::Reset { reason } => panic!("{layout:?}: reset: {reason}"),
                Update::Degraded { reason } => panic!("{layout:?}: degraded: {reason}"),
                Update::DecodeError { seq, error } => panic!("{layout:?}: seq {seq}: {error}"),
                _ => {}
            }
        }
        assert_eq!(received, (0..=target).collect::<BTreeSet<_>>(), "{layout:?}");
        let dropped = publisher.metrics().dropped();
        assert_eq!(dropped, (0..=target).filter(|&s| drop_decision(seed, rate, s)).count() as u64);
        assert!(dropped > 0);
        assert!(sub.metrics.gaps.load(Relaxed) > 0);
        assert_eq!(sub.metrics.resets.load(Relaxed), 0);
        // The startup replay plus one per gap.
        assert!(publisher.metrics().replay_requests() > sub.metrics.gaps.load(Relaxed));
        sub.stop();
        publisher.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_lost_at_the_end_of_a_burst_is_fetched_by_the_tail_probe() {
    use std::sync::atomic::Ordering::Relaxed;
    let (seed, rate) = (7, 0.5);
    let mut cfg = config(Layout::V0_26, true);
    cfg.drop_rate = rate;
    cfg.drop_seed = seed;
    let publisher = Publisher::start(cfg).await.unwrap();
    let mut sub = Sub::start(&publisher);
    let batches = sample_batches();
    let deadline = Instant::now() + WAIT;
    // Publish until the subscription is live, then stop right after a
    // batch that the publisher drops: no later batch reveals the gap.
    let mut live = false;
    let last = loop {
        assert!(Instant::now() < deadline, "never went live");
        let seq = publisher.publish(&batches[publisher.next_seq() as usize % batches.len()]);
        if live && drop_decision(seed, rate, seq) {
            break seq;
        }
        while let Ok(Some(u)) = tokio::time::timeout(Duration::from_millis(20), sub.rx.recv()).await
        {
            if let Update::Batch { replayed: false, .. } = u {
                live = true;
            }
        }
    };
    let gaps_before = sub.metrics.gaps.load(Relaxed);
    let quiet = Instant::now();
    loop {
        match sub.next().await {
            Update::Batch { seq, replayed, .. } if seq == last => {
                assert!(replayed, "seq {seq} was dropped on the live stream");
                break;
            }
            Update::Reset { reason } => panic!("reset: {reason}"),
            _ => {}
        }
    }
    assert!(quiet.elapsed() < Duration::from_secs(2), "took {:?}", quiet.elapsed());
    assert!(sub.metrics.gaps.load(Relaxed) > gaps_before);
    sub.stop();
    publisher.shutdown().await;
}

/// Waits for batch `seq`, which must arrive live, with no gap or reset first.
async fn expect_live(rx: &mut mpsc::Receiver<Update>, seq: u64) {
    loop {
        match tokio::time::timeout(WAIT, rx.recv()).await.unwrap().unwrap() {
            Update::Batch { seq: s, replayed, .. } if s == seq => {
                assert!(!replayed, "seq {seq} came by replay");
                return;
            }
            Update::Gap { from, to } => panic!("gap {from}..{to} reported"),
            Update::Reset { reason } => panic!("reset: {reason}"),
            _ => {}
        }
    }
}

/// vLLM's publisher answers a replay request from the thread that also
/// publishes, after its current wait, so a tail probe can come back with a
/// batch that was sent live while the probe waited. That batch was not lost:
/// the subscriber must take its live copy and count no gap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tail_probe_overtaken_by_a_live_batch_is_not_a_gap() {
    use std::sync::atomic::Ordering::Relaxed;
    let mut cfg = config(Layout::V0_26, true);
    cfg.replay_delay = Duration::from_millis(300);
    let publisher = Publisher::start(cfg).await.unwrap();
    let mut sub =
        Sub::start_with(&publisher, |c| c.tail_probe_after = Some(Duration::from_millis(50)));
    let batches = sample_batches();
    let deadline = Instant::now() + WAIT;
    // Until a batch arrives live (the subscription is up and synced).
    let mut live_seq = None;
    while live_seq.is_none() {
        assert!(Instant::now() < deadline, "never went live");
        let seq = publisher.publish(&batches[0]);
        while let Ok(Some(u)) =
            tokio::time::timeout(Duration::from_millis(400), sub.rx.recv()).await
        {
            if let Update::Batch { seq: s, replayed: false, .. } = u {
                if s == seq {
                    live_seq = Some(s);
                }
            }
        }
    }
    // Each round: a batch arms the probe (50 ms after it), the probe waits
    // 300 ms for its answer, and a second batch is published in that wait.
    for _ in 0..4 {
        let probes_before = publisher.metrics().replay_requests();
        let a = publisher.publish(&batches[0]);
        expect_live(&mut sub.rx, a).await;
        let waited = Instant::now();
        while publisher.metrics().replay_requests() == probes_before {
            assert!(waited.elapsed() < WAIT, "no tail probe");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let b = publisher.publish(&batches[1]);
        expect_live(&mut sub.rx, b).await;
        // Let the probe's answer land before the next round.
        tokio::time::sleep(Duration::from_millis(400)).await;
    }
    assert_eq!(sub.metrics.gaps.load(Relaxed), 0);
    assert!(
        sub.metrics.probe_overtaken.load(Relaxed) >= 1,
        "no probe was overtaken: the test raced"
    );
    sub.stop();
    publisher.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrapped_buffer_degrades_a_late_subscriber() {
    let mut cfg = config(Layout::V0_11, true);
    cfg.buffer_steps = 5;
    let publisher = Publisher::start(cfg).await.unwrap();
    let batches = sample_batches();
    for i in 0..20 {
        publisher.publish(&batches[i % batches.len()]);
    }
    let mut sub = Sub::start(&publisher);
    assert!(matches!(sub.next().await, Update::Connected));
    match sub.next().await {
        Update::Degraded { reason } => assert!(reason.contains("wrapped"), "{reason}"),
        other => panic!("expected Degraded, got {other:?}"),
    }
    let mut seqs = Vec::new();
    loop {
        match sub.next().await {
            Update::Batch { seq, replayed: true, batch } => {
                assert_eq!(batch, roundtrip(&batches[seq as usize % batches.len()], Layout::V0_11));
                seqs.push(seq);
            }
            Update::Replayed { from: 0, count: 5, range: Some((15, 19)) } => break,
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(seqs, (15..20).collect::<Vec<_>>());
    sub.stop();
    publisher.shutdown().await;
}

#[tokio::test]
async fn bad_configs_and_endpoints_are_errors() {
    let mut c = config(Layout::V0_26, false);
    c.buffer_steps = 0;
    assert!(Publisher::start(c).await.is_err());
    let mut c = config(Layout::V0_26, false);
    c.drop_rate = 1.5;
    assert!(Publisher::start(c).await.is_err());
    assert!(Publisher::start(PublisherConfig::new("nonsense")).await.is_err());
    // Port in use.
    let a = Publisher::start(config(Layout::V0_26, false)).await.unwrap();
    let port = a.local_endpoints().events.rsplit(':').next().unwrap().to_owned();
    assert!(Publisher::start(PublisherConfig::new(format!("tcp://*:{port}"))).await.is_err());
    a.shutdown().await;
    // Connect mode starts even when nobody listens yet.
    let c = Publisher::start(PublisherConfig::new("tcp://127.0.0.1:1")).await.unwrap();
    assert!(!c.local_endpoints().events_bound);
    assert_eq!(c.publish(&probe()), 0);
    c.shutdown().await;
}

// --- the Python (libzmq + msgspec) subscriber --------------------------------------

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn python() -> PathBuf {
    let path = std::env::var_os("KVGATE_TEST_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join(".cache/venv/bin/python"));
    assert!(
        path.exists(),
        "{} not found: run `bash scripts/setup-test-env.sh` (or set KVGATE_TEST_PYTHON to a python with pyzmq and msgspec)",
        path.display()
    );
    path
}

struct Py {
    child: Child,
    lines: mpsc::UnboundedReceiver<String>,
}

impl Py {
    fn spawn(layout: Layout, pub_ep: &str, replay_ep: &str, topic: &str) -> Py {
        let mut child = Command::new(python())
            .arg(repo_root().join("tests/py/msgspec_subscriber.py"))
            .args(["--layout", layout.name(), "--pub", pub_ep, "--replay", replay_ep])
            .args(["--topic", topic])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn the python subscriber");
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::unbounded_channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Py { child, lines }
    }

    async fn line(&mut self, within: Duration) -> Option<String> {
        match tokio::time::timeout(within, self.lines.recv()).await {
            Ok(Some(line)) => Some(line),
            Ok(None) => panic!("python subscriber exited early: {:?}", self.child.wait()),
            Err(_) => None,
        }
    }
}

impl Drop for Py {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn hash_json(h: &BlockHash) -> Value {
    match h {
        BlockHash::Int(v) => json!(v),
        BlockHash::Bytes(b) => {
            json!(format!("0x{}", b.iter().map(|x| format!("{x:02x}")).collect::<String>()))
        }
    }
}

fn mp_json(v: &Mp) -> Value {
    match v {
        Mp::Nil => Value::Null,
        Mp::String(s) => json!(s.as_str().unwrap()),
        Mp::Integer(i) => json!(i.as_i64().unwrap()),
        Mp::Array(items) => Value::Array(items.iter().map(mp_json).collect()),
        other => panic!("fixture value {other:?} has no JSON form here"),
    }
}

/// What the Python subscriber prints for `batch` in `layout`: every field of
/// that release's struct, defaults included.
fn expected_json(batch: &Batch, layout: Layout) -> Value {
    let ext = layout.has_extended_fields();
    let events: Vec<Value> = batch
        .events
        .iter()
        .map(|e| {
            let mut m = serde_json::Map::new();
            m.insert("type".into(), json!(e.tag()));
            match e {
                Event::Stored(s) => {
                    m.insert(
                        "block_hashes".into(),
                        Value::Array(s.block_hashes.iter().map(hash_json).collect()),
                    );
                    m.insert(
                        "parent_block_hash".into(),
                        s.parent_block_hash.as_ref().map_or(Value::Null, hash_json),
                    );
                    m.insert("token_ids".into(), json!(s.token_ids));
                    m.insert("block_size".into(), json!(s.block_size));
                    m.insert("lora_id".into(), json!(s.lora_id));
                    m.insert("medium".into(), json!(s.medium.as_ref().map(Medium::as_wire)));
                    if ext {
                        m.insert("lora_name".into(), json!(s.lora_name));
                        m.insert(
                            "extra_keys".into(),
                            s.extra_keys.as_ref().map_or(Value::Null, |k| {
                                Value::Array(k.iter().map(mp_json).collect())
                            }),
                        );
                        m.insert("group_idx".into(), json!(s.group_idx));
                        m.insert("kv_cache_spec_kind".into(), json!(s.kv_cache_spec_kind));
                        m.insert(
                            "kv_cache_spec_sliding_window".into(),
                            json!(s.kv_cache_spec_sliding_window),
                        );
                    }
                }
                Event::Removed(r) => {
                    m.insert(
                        "block_hashes".into(),
                        Value::Array(r.block_hashes.iter().map(hash_json).collect()),
                    );
                    m.insert("medium".into(), json!(r.medium.as_ref().map(Medium::as_wire)));
                    if ext {
                        m.insert("group_idx".into(), json!(r.group_idx));
                    }
                }
                Event::AllCleared => {}
            }
            Value::Object(m)
        })
        .collect();
    json!({ "ts": batch.ts, "dp_rank": batch.dp_rank, "events": events })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_msgspec_subscriber_decodes_every_layout_and_replay_shape() {
    let topic = "kv@127.0.0.1:8000@Qwen/Qwen3-0.6B";
    for layout in Layout::ALL {
        let mut cfg = config(layout, true);
        cfg.topic = topic.into();
        let publisher = Publisher::start(cfg).await.unwrap();
        let local = publisher.local_endpoints().clone();
        let mut py = Py::spawn(
            layout,
            &loopback_endpoint(&local.events),
            &loopback_endpoint(local.replay.as_deref().unwrap()),
            topic,
        );
        assert_eq!(py.line(WAIT).await.as_deref(), Some("READY"));

        // Probe until the SUB's subscription has reached us.
        let deadline = Instant::now() + WAIT;
        let mut lines = Vec::new();
        while lines.is_empty() {
            assert!(Instant::now() < deadline, "{layout:?}: python saw no live batch");
            publisher.publish(&probe());
            if let Some(l) = py.line(Duration::from_millis(50)).await {
                lines.push(l);
            }
        }
        let mut expected = std::collections::BTreeMap::new();
        for s in 0..publisher.next_seq() {
            expected.insert(s, expected_json(&probe(), layout));
        }
        let first = publisher.next_seq();
        for b in sample_batches() {
            let seq = publisher.publish(&b);
            expected.insert(seq, expected_json(&b, layout));
        }
        let sentinel = Batch { ts: -1.0, events: vec![], dp_rank: None, skipped_events: 0 };
        let last = publisher.publish(&sentinel);
        expected.insert(last, expected_json(&sentinel, layout));

        loop {
            let line = py.line(WAIT).await.expect("python subscriber stalled");
            let done = line == "DONE";
            lines.push(line);
            if done {
                break;
            }
        }
        let mut live = Vec::new();
        let mut replayed = Vec::new();
        let mut end = None;
        for line in &lines[..lines.len() - 1] {
            let v: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{line}: {e}"));
            let seq = v["seq"].as_u64();
            match v["src"].as_str().unwrap() {
                "pub" => {
                    assert_eq!(v["frames"], 3, "{layout:?}");
                    assert_eq!(v["topic"], topic, "{layout:?}");
                    let seq = seq.unwrap();
                    assert_eq!(v["batch"], expected[&seq], "{layout:?} live seq {seq}");
                    live.push(seq);
                }
                "replay" => {
                    let seq = seq.unwrap();
                    if replay_has_topic(layout) {
                        assert_eq!(v["frames"], 4, "{layout:?}: [b\"\", topic, seq, payload]");
                        assert_eq!(v["topic"], topic, "{layout:?}");
                    } else {
                        assert_eq!(v["frames"], 3, "{layout:?}: [b\"\", seq, payload]");
                    }
                    assert_eq!(v["batch"], expected[&seq], "{layout:?} replayed seq {seq}");
                    replayed.push(seq);
                }
                "end" => end = Some(v["frames"].clone()),
                other => panic!("unknown line kind {other}"),
            }
        }
        let live_tail: Vec<u64> = live.iter().copied().filter(|&s| s >= first).collect();
        assert_eq!(live_tail, (first..=last).collect::<Vec<_>>(), "{layout:?}: live stream");
        assert!(live.windows(2).all(|w| w[0] < w[1]), "{layout:?}: live out of order");
        assert_eq!(replayed, (0..=last).collect::<Vec<_>>(), "{layout:?}: replay");
        let end_seq = "ffffffffffffffff";
        let want_end = if replay_has_topic(layout) {
            json!(["", "", end_seq, ""])
        } else {
            json!(["", end_seq, ""])
        };
        assert_eq!(end, Some(want_end), "{layout:?}: end marker");
        let m = publisher.metrics();
        assert_eq!(m.replay_requests(), 1, "{layout:?}");
        assert_eq!(m.bad_replay_requests.load(std::sync::atomic::Ordering::Relaxed), 1);
        publisher.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_subscriber_blocks_neither_publishing_nor_replay() {
    use zeromq::{DealerSocket, Socket, SocketRecv, SocketSend, SubSocket, ZmqMessage};
    let publisher = Publisher::start(config(Layout::V0_26, true)).await.unwrap();
    let local = publisher.local_endpoints().clone();
    // Subscribed, never read.
    let mut stalled = SubSocket::new();
    stalled.connect(&loopback_endpoint(&local.events)).await.unwrap();
    stalled.subscribe("").await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;

    let payload = bytes::Bytes::from(vec![0x90u8; 4096]);
    let started = Instant::now();
    for _ in 0..150_000 {
        publisher.publish_payload(payload.clone());
    }
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "publish blocked: {:?}",
        started.elapsed()
    );

    // Replay still answers, from the last 10,000 batches.
    let mut dealer = DealerSocket::new();
    dealer.connect(&loopback_endpoint(local.replay.as_deref().unwrap())).await.unwrap();
    let request =
        vec![bytes::Bytes::new(), bytes::Bytes::copy_from_slice(&149_998u64.to_be_bytes())];
    dealer.send(ZmqMessage::try_from(request).unwrap()).await.unwrap();
    let mut seqs = Vec::new();
    loop {
        let reply = tokio::time::timeout(WAIT, dealer.recv()).await.unwrap().unwrap().into_vec();
        assert_eq!(reply.len(), 4, "[b\"\", topic, seq, payload]");
        let seq = u64::from_be_bytes(reply[2].as_ref().try_into().unwrap());
        if seq == u64::MAX {
            assert!(reply[1].is_empty() && reply[3].is_empty());
            break;
        }
        seqs.push(seq);
    }
    assert_eq!(seqs, vec![149_998, 149_999]);
    publisher.shutdown().await;
    // After shutdown batches are still numbered, and nothing is sent.
    assert_eq!(publisher.publish(&probe()), 150_000);
    drop(stalled);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_mode_reaches_a_bound_subscriber() {
    use zeromq::{Socket, SocketRecv, SubSocket};
    let mut sub = SubSocket::new();
    let bound = sub.bind("tcp://127.0.0.1:0").await.unwrap().to_string();
    sub.subscribe("kv").await.unwrap();
    let mut cfg = PublisherConfig::new(bound.clone());
    cfg.topic = "kv@x".into();
    let publisher = Publisher::start(cfg).await.unwrap();
    assert!(!publisher.local_endpoints().events_bound);
    assert_eq!(publisher.local_endpoints().events, bound);
    let deadline = Instant::now() + WAIT;
    let frames = loop {
        assert!(Instant::now() < deadline, "nothing arrived over the connected PUB");
        publisher.publish(&probe());
        if let Ok(msg) = tokio::time::timeout(Duration::from_millis(50), sub.recv()).await {
            break msg.unwrap().into_vec();
        }
    };
    assert_eq!(frames.len(), 3);
    assert_eq!(frames[0].as_ref(), b"kv@x");
    assert_eq!(decode_batch(&frames[2]).unwrap(), probe());
    publisher.shutdown().await;
}
