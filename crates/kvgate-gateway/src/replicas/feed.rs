//! Keeping the KV view live: one `kvgate-events` subscriber per replica feeds
//! the index. A reset clears that replica's view and marks it degraded (its
//! overlap ignored) until events have flowed for `monitor.rebuild_ms`.

use std::sync::Arc;
use std::time::Duration;
use tracing::Instrument;

use kvgate_events::subscriber::{Subscriber, SubscriberConfig, Update};
use tokio::sync::mpsc;

use kvgate_index::ReplicaId;

use crate::replicas::fleet_handle::FleetHandle;
use crate::replicas::replica::Replica;

/// Runs the subscriber of `replica` until it is stopped. An error says why
/// it ended otherwise (the supervisor restarts it).
pub(crate) async fn run(fleet: Arc<FleetHandle>, replica: Arc<Replica>) -> Result<(), String> {
    let Some(endpoint) = replica.config.events.clone() else { return Ok(()) };
    let mut cfg = SubscriberConfig::new(endpoint);
    cfg.replay_endpoint = replica.config.replay.clone();
    cfg.topic = replica.config.topic.clone();
    let (tx, mut rx) = mpsc::channel(1024);
    let sub = Subscriber::new(cfg, Arc::clone(&replica.events), tx);
    let mut stop = replica.stop.subscribe();
    let task = tokio::spawn(async move {
        let shutdown = async move {
            let _ = stop.wait_for(|v| *v).await;
        };
        sub.run(shutdown).await
    });
    // A replay's span runs from the gap to the replayed batches.
    let mut replaying: Option<tracing::Span> = None;
    while let Some(update) = rx.recv().await {
        let clears = matches!(update, Update::Reset { .. } | Update::DecodeError { .. });
        match &update {
            Update::Gap { from, to } => {
                let span = tracing::info_span!("feed_replay", replica = %replica.name, from, to, batches = tracing::field::Empty);
                replaying = Some(span);
            }
            Update::Replayed { count, .. } => {
                if let Some(span) = replaying.take() {
                    span.record("batches", count);
                }
            }
            _ => {}
        }
        if clears {
            // This task applies the replica's events, so none interleave
            // with the clear; other replicas' events and routing do.
            let span = tracing::info_span!("feed_reset", replica = %replica.name, cleared = tracing::field::Empty);
            span.in_scope(|| apply(&fleet, &replica, update));
            finish_clear(&fleet, replica.id).instrument(span).await;
        } else {
            apply(&fleet, &replica, update);
        }
    }
    // The channel closes when the subscriber ends, for whatever reason.
    match task.await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(format!("event subscriber stopped: {e}")),
        Err(e) => Err(format!("event subscriber task: {e}")),
    }
}

/// Engine entries released per hold of the index's write lock while a
/// replica's old view is cleared: at most about 0.7 ms of work, cache-cold
/// (`examples/clear_stall.rs` in kvgate-index), so that clearing a million
/// blocks never stalls a routing decision for long.
const CLEAR_STEP: usize = 4_096;

/// The pause between clear steps. A writer that re-locks at once starves the
/// readers its unlock woke (they lose the race), so each step is followed by
/// a real pause; a million blocks then clear in about 256 steps (half a second).
const CLEAR_PAUSE: Duration = Duration::from_millis(1);

/// Releases a cleared view's old blocks in steps, pausing between them.
pub(crate) async fn finish_clear(fleet: &FleetHandle, id: ReplicaId) {
    loop {
        // The statement ends the write guard; the spent table is freed after.
        let (left, spent) = fleet.with(|f| f.clear_step(id, CLEAR_STEP));
        drop(spent);
        if left == 0 {
            return;
        }
        tokio::time::sleep(CLEAR_PAUSE).await;
    }
}

fn apply(fleet: &FleetHandle, replica: &Replica, update: Update) {
    let now = crate::clock::now();
    let id = replica.id;
    match update {
        Update::Batch { batch, .. } => fleet.with(|f| f.apply_events(id, &batch, now)),
        Update::Reset { reason } => {
            let why = format!("view reset: {reason}");
            let cleared = fleet.with(|f| f.view_lost(id, why, now));
            tracing::Span::current().record("cleared", cleared);
            tracing::warn!(replica = %replica.name, %reason, cleared, "KV view reset");
        }
        Update::Degraded { reason } => {
            tracing::warn!(replica = %replica.name, %reason, "KV view degraded");
            let why = format!("view incomplete: {reason}");
            fleet.with(|f| f.view_degraded(id, why, now));
        }
        Update::DecodeError { seq, error } => {
            // Its events are lost; a lost removal would leave ghost blocks,
            // so the view is reset and rebuilt, and the problem is reported.
            let problem = format!("undecodable event batch (seq {seq}): {error}");
            let why = format!("event batch {seq} undecodable");
            let cleared = fleet.with(|f| {
                f.problem(id, problem);
                f.view_lost(id, why, now)
            });
            tracing::Span::current().record("cleared", cleared);
            tracing::warn!(replica = %replica.name, seq, %error, cleared, "undecodable event batch; view reset");
        }
        Update::Gap { from, to } => {
            tracing::info!(replica = %replica.name, from, to, "event gap, replaying");
        }
        Update::Replayed { from, count, .. } => {
            tracing::debug!(replica = %replica.name, from, count, "replay done");
        }
        Update::Connected => tracing::debug!(replica = %replica.name, "events connected"),
        Update::Synced { complete } => {
            fleet.with(|f| f.view_synced(id, complete));
            if complete {
                tracing::info!(replica = %replica.name, "KV view synced from the engine's first event batch");
            } else {
                tracing::warn!(replica = %replica.name, "KV view synced, but blocks stored before kvgate started may be unknown (no replay endpoint, or its buffer had wrapped)");
            }
        }
        Update::Disconnected => tracing::info!(replica = %replica.name, "events disconnected"),
    }
}
