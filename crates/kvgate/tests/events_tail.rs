//! End-to-end interop: a Python publisher built on libzmq (pyzmq) and msgspec,
//! shaped like each vLLM release (tests/py/vllm_publisher.py), publishes to
//! `kvgate events tail`, which runs as a real process. Covers live decoding,
//! the startup replay, recovery of missed batches through replay, resets on a
//! publisher restart, and a replay buffer that already wrapped.
//!
//! Needs the venv from `scripts/setup-test-env.sh` (the README's test command
//! creates it); without it these tests fail and say so.

// Test harness code: a failed unwrap is a failed test, with its message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

const WAIT: Duration = Duration::from_secs(20);

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn python() -> PathBuf {
    let path = std::env::var_os("KVGATE_TEST_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join(".cache/venv/bin/python"));
    assert!(
        path.exists(),
        "{} not found: run `bash scripts/setup-test-env.sh` (or the README's test command)",
        path.display()
    );
    path
}

/// Lines of a child's stdout, read on a thread.
fn line_reader(stdout: impl std::io::Read + Send + 'static) -> Receiver<String> {
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

struct Publisher {
    child: Child,
    stdin: ChildStdin,
    out: Receiver<String>,
    pub_ep: String,
    replay_ep: String,
}

impl Publisher {
    fn start(layout: &str, extra: &[&str]) -> Publisher {
        let mut child = Command::new(python())
            .arg(repo_root().join("tests/py/vllm_publisher.py"))
            .args(["--layout", layout])
            .args(extra)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn python publisher");
        let stdin = child.stdin.take().unwrap();
        let out = line_reader(child.stdout.take().unwrap());
        let ready = out.recv_timeout(WAIT).expect("publisher READY line");
        let field = |name: &str| {
            ready
                .split_whitespace()
                .find_map(|w| w.strip_prefix(&format!("{name}=")))
                .unwrap_or_else(|| panic!("no {name} in {ready:?}"))
                .to_owned()
        };
        let (pub_ep, replay_ep) = (field("pub"), field("replay"));
        Publisher { child, stdin, out, pub_ep, replay_ep }
    }

    fn command(&mut self, cmd: Value) -> String {
        writeln!(self.stdin, "{cmd}").unwrap();
        self.stdin.flush().unwrap();
        let answer = self.out.recv_timeout(WAIT).expect("publisher answer");
        assert!(answer.starts_with("OK"), "publisher said {answer:?} to {cmd}");
        answer
    }

    fn publish(&mut self, events: Value, skip_pub: bool) {
        self.command(json!({"cmd": "publish", "events": events, "skip_pub": skip_pub}));
    }
}

impl Drop for Publisher {
    fn drop(&mut self) {
        let _ = writeln!(self.stdin, "{}", json!({"cmd": "quit"}));
        let _ = self.stdin.flush();
        std::thread::sleep(Duration::from_millis(50));
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct Tail {
    child: Child,
    out: Receiver<String>,
    seen: Vec<Value>,
}

impl Tail {
    fn start(publisher: &Publisher, with_replay: bool, extra: &[&str]) -> Tail {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_kvgate"));
        cmd.args(["events", "tail", "--json", "--summary", "--duration", "60"])
            .args(["--endpoint", &publisher.pub_ep])
            .args(["--expect-block-size", "4"])
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        if with_replay {
            cmd.args(["--replay", &publisher.replay_ep]);
        }
        let mut child = cmd.spawn().expect("spawn kvgate");
        let out = line_reader(child.stdout.take().unwrap());
        let mut tail = Tail { child, out, seen: Vec::new() };
        tail.wait_for(|v| v["type"] == "Connected");
        if with_replay {
            tail.wait_for(|v| v["type"] == "Replayed");
        }
        // PUB/SUB subscriptions propagate asynchronously; give it a moment.
        std::thread::sleep(Duration::from_millis(300));
        tail
    }

    /// Waits for a line matching `pred` and returns it.
    fn wait_for(&mut self, pred: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + WAIT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = self
                .out
                .recv_timeout(left)
                .unwrap_or_else(|_| panic!("timed out; saw {:#?}", self.seen));
            let v: Value = serde_json::from_str(&line).expect("tail prints JSON lines");
            self.seen.push(v.clone());
            if pred(&v) {
                return v;
            }
        }
    }

    /// Stops with SIGINT and returns the summary.
    fn finish(mut self) -> (Vec<Value>, Value) {
        let status = Command::new("kill").args(["-INT", &self.child.id().to_string()]).status();
        assert!(status.is_ok_and(|s| s.success()));
        let summary = self.wait_for(|v| v.get("summary").is_some());
        let exit = self.child.wait().unwrap();
        assert!(exit.success(), "tail exited with {exit}");
        (self.seen, summary["summary"].clone())
    }
}

fn stored(hashes: &[u64], parent: Option<u64>, first_token: u32) -> Value {
    let tokens: Vec<u32> = (0..hashes.len() as u32 * 4).map(|i| first_token + i).collect();
    json!({"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent,
           "token_ids": tokens, "block_size": 4, "lora_id": null, "medium": "GPU", "lora_name": null})
}

fn count_type(seen: &[Value], ty: &str) -> usize {
    seen.iter().filter(|v| v["type"] == ty).count()
}

/// Every layout and both hash forms: live events decode, print in the
/// documented JSON shape, and land in the index (including CPU placeholders).
#[test]
fn live_events_every_layout_and_hash_form() {
    for layout in ["0.11", "0.26", "main"] {
        for form in ["int", "bytes"] {
            let mut publisher = Publisher::start(layout, &["--hash-form", form]);
            let mut tail = Tail::start(&publisher, true, &[]);
            publisher.publish(
                json!([stored(&[11, 12], None, 100), stored(&[13], Some(12), 200)]),
                false,
            );
            publisher.publish(
                json!([{"type": "BlockStored", "block_hashes": [11, 12], "parent_block_hash": null,
                        "token_ids": [], "block_size": 0, "lora_id": null, "medium": "CPU", "lora_name": null},
                       {"type": "BlockRemoved", "block_hashes": [13], "medium": "GPU"}]),
                false,
            );
            let removed = tail.wait_for(|v| v["type"] == "BlockRemoved");
            let (seen, summary) = tail.finish();
            let ctx = format!("layout {layout} hashes {form}");
            let first = seen.iter().find(|v| v["type"] == "BlockStored").unwrap();
            if form == "int" {
                assert_eq!(first["block_hashes"], json!([11, 12]), "{ctx}");
                assert_eq!(removed["block_hashes"], json!([13]), "{ctx}");
            } else {
                let hex = |h: u64| format!("{:064x}", h);
                assert_eq!(first["block_hashes"], json!([hex(11), hex(12)]), "{ctx}");
                assert_eq!(removed["block_hashes"], json!([hex(13)]), "{ctx}");
            }
            assert_eq!(first["token_ids"].as_array().unwrap().len(), 8, "{ctx}");
            assert_eq!(first["seq"], json!(0), "{ctx}");
            assert_eq!(summary["blocks"]["GPU"], json!(2), "{ctx}");
            assert_eq!(summary["blocks"]["CPU"], json!(2), "{ctx}");
            assert_eq!(summary["gaps"], json!(0), "{ctx}");
            assert_eq!(summary["resets"], json!(0), "{ctx}");
            assert_eq!(summary["anomalies"]["unknown_parent"], json!(0), "{ctx}");
        }
    }
}

/// Batches the subscriber never received on the live stream are recovered
/// from the replay endpoint, in both replay-frame shapes.
#[test]
fn replay_recovers_missed_batches() {
    for layout in ["0.11", "0.26"] {
        let mut publisher = Publisher::start(layout, &[]);
        let mut tail = Tail::start(&publisher, true, &[]);
        publisher.publish(json!([stored(&[1], None, 0)]), false);
        tail.wait_for(|v| v["type"] == "BlockStored");
        // Three batches lost on the way, each extending the chain.
        publisher.publish(json!([stored(&[2], Some(1), 10)]), true);
        publisher.publish(json!([stored(&[3], Some(2), 20)]), true);
        publisher.publish(json!([stored(&[4], Some(3), 30)]), true);
        publisher.publish(json!([stored(&[5], Some(4), 40)]), false);
        let gap = tail.wait_for(|v| v["type"] == "Gap");
        assert_eq!((gap["from"].clone(), gap["to"].clone()), (json!(1), json!(4)), "{layout}");
        // The replay covers 1..=4 (the live batch 4 is in the buffer too);
        // its summary line comes after the replayed batches.
        let replayed = tail.wait_for(|v| v["type"] == "Replayed" && v["from"] == 1);
        assert_eq!((replayed["first"].clone(), replayed["last"].clone()), (json!(1), json!(4)));
        let (seen, summary) = tail.finish();
        // Without the replay the chain would break at block 2 and blocks 3..5
        // would be dropped as unknown parents.
        assert_eq!(summary["blocks"]["GPU"], json!(5), "{layout}: {seen:#?}");
        assert_eq!(summary["anomalies"]["unknown_parent"], json!(0), "{layout}");
        assert_eq!(summary["gaps"], json!(1), "{layout}");
        assert_eq!(summary["resets"], json!(0), "{layout}");
        let stored_seqs: Vec<_> =
            seen.iter().filter(|v| v["type"] == "BlockStored").map(|v| v["seq"].clone()).collect();
        assert_eq!(stored_seqs, vec![json!(0), json!(1), json!(2), json!(3), json!(4)], "{layout}");
    }
}

/// A router started next to a running engine learns its whole buffer.
#[test]
fn startup_replay_learns_existing_blocks() {
    let mut publisher = Publisher::start("0.26", &[]);
    publisher.publish(json!([stored(&[1, 2], None, 0)]), false);
    publisher.publish(json!([stored(&[3], Some(2), 50)]), false);
    let tail = Tail::start(&publisher, true, &[]);
    let (seen, summary) = tail.finish();
    assert_eq!(summary["blocks"]["GPU"], json!(3), "{seen:#?}");
    assert_eq!(count_type(&seen, "Degraded"), 0);
}

/// If the replay buffer already wrapped, the view is marked degraded.
#[test]
fn wrapped_buffer_marks_degraded() {
    let mut publisher = Publisher::start("0.26", &["--buffer-steps", "2"]);
    for i in 0..4u64 {
        publisher.publish(json!([stored(&[100 + i], None, i as u32 * 8)]), false);
    }
    let mut tail = Tail::start(&publisher, true, &[]);
    let degraded = tail.seen.iter().find(|v| v["type"] == "Degraded").cloned();
    let degraded = degraded.unwrap_or_else(|| tail.wait_for(|v| v["type"] == "Degraded"));
    assert!(degraded["reason"].as_str().unwrap().contains("wrapped"));
    let (_, summary) = tail.finish();
    // Only the two batches still buffered are known.
    assert_eq!(summary["blocks"]["GPU"], json!(2));
}

/// A publisher restart (seq back to 0) resets the view: blocks from before
/// the restart must not survive as ghosts.
#[test]
fn publisher_restart_resets_view() {
    for with_replay in [true, false] {
        let mut publisher = Publisher::start("0.26", &[]);
        let mut tail = Tail::start(&publisher, with_replay, &[]);
        publisher.publish(json!([stored(&[1, 2, 3], None, 0)]), false);
        publisher.publish(json!([stored(&[4], Some(3), 40)]), false);
        tail.wait_for(|v| v["type"] == "BlockStored" && v["seq"] == 1);
        publisher.command(json!({"cmd": "restart"}));
        publisher.publish(json!([stored(&[70], None, 900)]), false);
        let reset = tail.wait_for(|v| v["type"] == "Reset");
        assert!(reset["reason"].as_str().unwrap().contains("restarted"), "{reset}");
        tail.wait_for(|v| v["type"] == "BlockStored" && v["block_hashes"] == json!([70]));
        let (_, summary) = tail.finish();
        assert_eq!(summary["blocks"]["GPU"], json!(1), "replay={with_replay}");
        assert_eq!(summary["resets"], json!(1), "replay={with_replay}");
    }
}

/// Without a replay endpoint a gap cannot be filled: the view is reset.
#[test]
fn gap_without_replay_resets() {
    let mut publisher = Publisher::start("0.26", &[]);
    let mut tail = Tail::start(&publisher, false, &[]);
    publisher.publish(json!([stored(&[1], None, 0)]), false);
    tail.wait_for(|v| v["type"] == "BlockStored");
    publisher.publish(json!([stored(&[2], Some(1), 10)]), true);
    publisher.publish(json!([stored(&[9], None, 500)]), false);
    let reset = tail.wait_for(|v| v["type"] == "Reset");
    assert!(reset["reason"].as_str().unwrap().contains("no replay"), "{reset}");
    let (_, summary) = tail.finish();
    assert_eq!(summary["blocks"]["GPU"], json!(1));
    assert_eq!(summary["gaps"], json!(1));
}

/// A real publisher restart: the process dies and a new one binds the same
/// ports with an empty cache and seq back at 0. The subscriber reconnects by
/// itself, sees seq go backwards, resets, and learns the new process's
/// buffer through replay; nothing from the old process survives.
#[test]
fn process_restart_on_same_ports_reconnects_and_resets() {
    let mut first = Publisher::start("0.26", &[]);
    let ports: Vec<String> = [&first.pub_ep, &first.replay_ep]
        .iter()
        .map(|ep| ep.rsplit(':').next().unwrap().to_owned())
        .collect();
    let mut tail = Tail::start(&first, true, &[]);
    for i in 0..3u64 {
        first.publish(
            json!([stored(&[10 + i], if i == 0 { None } else { Some(9 + i) }, i as u32 * 4)]),
            false,
        );
    }
    tail.wait_for(|v| v["type"] == "BlockStored" && v["seq"] == 2);
    drop(first);
    tail.wait_for(|v| v["type"] == "Disconnected");
    let mut second =
        Publisher::start("0.26", &["--pub-port", &ports[0], "--replay-port", &ports[1]]);
    second.publish(json!([stored(&[500, 501], None, 1000)]), false);
    tail.wait_for(|v| v["type"] == "Connected");
    // The new process's seq 0 arrives live or through the reconnect replay.
    let reset = tail.wait_for(|v| v["type"] == "Reset");
    assert!(reset["reason"].as_str().unwrap().contains("restarted"), "{reset}");
    tail.wait_for(|v| v["type"] == "BlockStored" && v["block_hashes"] == json!([500, 501]));
    let (seen, summary) = tail.finish();
    assert_eq!(summary["blocks"]["GPU"], json!(2), "{seen:#?}");
    assert_eq!(summary["anomalies"]["unknown_parent"], json!(0));
}
