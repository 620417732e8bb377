//! `kvgate events tail`: subscribe to one engine's KV events, print them, and
//! optionally apply them to a [`kvgate_index::Index`] and summarise.
//!
//! It is both an operator tool ("is my engine publishing, and what?") and the
//! test hook for the subscriber and the index: integration tests run it
//! against a Python publisher and read its JSON lines.

use std::io::Write;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use kvgate_events::subscriber::{Subscriber, SubscriberConfig, SubscriberMetrics, Update};
use kvgate_events::{BlockHash, Event, Tier};
use kvgate_index::{Index, ReplicaId, ReplicaSpec};
use serde_json::{json, Value};
use tokio::sync::mpsc;

use crate::cli::TailArgs;

pub(crate) async fn run(args: TailArgs) -> anyhow::Result<()> {
    let mut config = SubscriberConfig::new(args.endpoint.clone());
    config.replay_endpoint = args.replay.clone();
    config.topic = args.topic.clone();
    config.replay_timeout = secs("--replay-timeout", args.replay_timeout)?;
    let deadline = args.duration.map(|d| secs("--duration", d)).transpose()?;

    let metrics = Arc::new(SubscriberMetrics::default());
    let (tx, mut rx) = mpsc::channel(1024);
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let subscriber = Subscriber::new(config, Arc::clone(&metrics), tx);
    let task = tokio::spawn(subscriber.run(async {
        let _ = stop_rx.await;
    }));

    let mut view = args.summary.then(|| View::new(args.expect_block_size));
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let sleep = async {
        match deadline {
            Some(d) => tokio::time::sleep(d).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(sleep);
    // One ctrl_c future for the whole loop: a fresh one per iteration only
    // hears signals sent after it was made, so a SIGINT that arrived while
    // an update was being printed was lost and the tail never stopped (a CI
    // flake of `events_tail::publisher_restart_resets_view`).
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    loop {
        tokio::select! {
            () = &mut sleep => break,
            _ = &mut ctrl_c => break,
            update = rx.recv() => {
                let Some(update) = update else { break };
                if let Some(view) = view.as_mut() {
                    view.apply(&update);
                }
                for line in render(&update, args.json) {
                    writeln!(out, "{line}")?;
                }
                // Flush per update: operators and tests read this live.
                out.flush()?;
            }
        }
    }
    let _ = stop_tx.send(());
    match task.await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return Err(e).context("kv event subscriber failed"),
        Err(e) => return Err(e).context("kv event subscriber task panicked"),
    }
    if let Some(view) = view {
        writeln!(out, "{}", view.summary(&metrics))?;
    }
    out.flush()?;
    Ok(())
}

fn secs(flag: &str, value: f64) -> anyhow::Result<Duration> {
    Duration::try_from_secs_f64(value).map_err(|_| {
        anyhow::anyhow!("{flag} must be a non-negative number of seconds, got {value}")
    })
}

/// The index that `--summary` applies events to: one replica.
struct View {
    index: Index,
    replica: ReplicaId,
}

impl View {
    fn new(block_size: u32) -> Self {
        let mut index = Index::new();
        // A fresh index has no replicas, so this cannot collide.
        let replica =
            index.add_replica(ReplicaSpec::new("tail", 0, block_size)).unwrap_or(ReplicaId(0));
        Self { index, replica }
    }

    fn apply(&mut self, update: &Update) {
        match update {
            Update::Batch { batch, .. } => {
                self.index.apply_batch(self.replica, batch, Instant::now());
            }
            Update::Reset { .. } => {
                let _ = self.index.clear_replica(self.replica);
            }
            _ => {}
        }
    }

    fn summary(&self, metrics: &SubscriberMetrics) -> Value {
        let blocks: serde_json::Map<String, Value> = Tier::ALL
            .iter()
            .map(|t| {
                let n = self.index.blocks_held(self.replica, *t).unwrap_or(0);
                (t.label().to_owned(), json!(n))
            })
            .collect();
        let anomalies: serde_json::Map<String, Value> = self
            .index
            .anomalies()
            .labelled()
            .iter()
            .map(|(k, v)| ((*k).to_owned(), json!(v)))
            .collect();
        json!({"summary": {
            "blocks": blocks,
            "anomalies": anomalies,
            "batches": metrics.batches.load(Ordering::Relaxed),
            "events": metrics.events.load(Ordering::Relaxed),
            "gaps": metrics.gaps.load(Ordering::Relaxed),
            "replayed_batches": metrics.replayed_batches.load(Ordering::Relaxed),
            "resets": metrics.resets.load(Ordering::Relaxed),
            "decode_errors": metrics.decode_errors.load(Ordering::Relaxed),
        }})
    }
}

/// Lines to print for one update.
fn render(update: &Update, as_json: bool) -> Vec<String> {
    let values = update_json(update);
    if as_json {
        values.iter().map(Value::to_string).collect()
    } else {
        values.iter().map(human).collect()
    }
}

fn update_json(update: &Update) -> Vec<Value> {
    match update {
        Update::Batch { seq, batch, .. } => {
            batch.events.iter().map(|e| event_json(*seq, e)).collect()
        }
        Update::Gap { from, to } => vec![json!({"type": "Gap", "from": from, "to": to})],
        Update::Replayed { from, count, range } => vec![json!({
            "type": "Replayed", "from": from, "count": count,
            "first": range.map(|r| r.0), "last": range.map(|r| r.1),
        })],
        Update::Reset { reason } => vec![json!({"type": "Reset", "reason": reason.to_string()})],
        Update::Degraded { reason } => vec![json!({"type": "Degraded", "reason": reason})],
        Update::DecodeError { seq, error } => {
            vec![json!({"type": "DecodeError", "seq": seq, "error": error.to_string()})]
        }
        Update::Connected => vec![json!({"type": "Connected"})],
        Update::Synced { complete } => vec![json!({"type": "Synced", "complete": complete})],
        Update::Disconnected => vec![json!({"type": "Disconnected"})],
    }
}

fn hash_json(h: &BlockHash) -> Value {
    match h {
        BlockHash::Int(v) => json!(v),
        BlockHash::Bytes(b) => {
            json!(b.iter().map(|x| format!("{x:02x}")).collect::<String>())
        }
    }
}

fn event_json(seq: u64, event: &Event) -> Value {
    match event {
        Event::Stored(s) => {
            let mut v = json!({
                "seq": seq,
                "type": "BlockStored",
                "block_hashes": s.block_hashes.iter().map(hash_json).collect::<Vec<_>>(),
                "parent_block_hash": s.parent_block_hash.as_ref().map(hash_json),
                "token_ids": s.token_ids,
                "block_size": s.block_size,
                "medium": s.medium.as_ref().map(|m| m.as_wire()),
                "lora_name": s.lora_name,
            });
            if let Some(obj) = v.as_object_mut() {
                if let Some(g) = s.group_idx {
                    obj.insert("group_idx".into(), json!(g));
                }
                if let Some(k) = &s.kv_cache_spec_kind {
                    obj.insert("kv_cache_spec_kind".into(), json!(k));
                }
            }
            v
        }
        Event::Removed(r) => {
            let mut v = json!({
                "seq": seq,
                "type": "BlockRemoved",
                "block_hashes": r.block_hashes.iter().map(hash_json).collect::<Vec<_>>(),
                "medium": r.medium.as_ref().map(|m| m.as_wire()),
            });
            if let (Some(obj), Some(g)) = (v.as_object_mut(), r.group_idx) {
                obj.insert("group_idx".into(), json!(g));
            }
            v
        }
        Event::AllCleared => json!({"seq": seq, "type": "AllBlocksCleared"}),
    }
}

/// A compact human line: the type first, then `key=value` pairs.
fn human(v: &Value) -> String {
    let Some(obj) = v.as_object() else { return v.to_string() };
    let ty = obj.get("type").and_then(Value::as_str).unwrap_or("?");
    let mut line = String::from(ty);
    for (k, val) in obj {
        if k == "type" {
            continue;
        }
        let text = match val {
            Value::Array(items) if items.len() > 8 => format!("[{} items]", items.len()),
            other => other.to_string(),
        };
        line.push_str(&format!(" {k}={text}"));
    }
    line
}
