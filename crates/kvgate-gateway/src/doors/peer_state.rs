//! What this instance knows about its peers: the ones it has heard from
//! and the ones it sends to. Plain state behind locks; the protocol, the
//! handler and the tasks that change it are in `peers.rs`.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use kvgate_router::PeerId;
use tokio::sync::mpsc;

use crate::locks::lock;
use crate::observe::snapshot::{PeerBusSnapshot, PeerSnapshot, PeerTargetSnapshot};

/// A peer we have heard from.
#[derive(Debug)]
pub(crate) struct Known {
    pub(crate) id: PeerId,
    pub(crate) last_seen: Instant,
    pub(crate) changes: u64,
    pub(crate) unknown_replica: u64,
    pub(crate) lag_s: f64,
}

/// Counters of one send target.
#[derive(Debug, Default)]
pub(crate) struct TargetStats {
    pub(crate) batches: AtomicU64,
    pub(crate) failures: AtomicU64,
    pub(crate) dropped: AtomicU64,
}

#[derive(Debug)]
pub(crate) struct Target {
    pub(crate) tx: mpsc::Sender<Bytes>,
    pub(crate) stats: Arc<TargetStats>,
}

/// The NATS connection's state, when changes travel over NATS.
#[derive(Debug, Default)]
pub(crate) struct BusState {
    /// Whether `peers.nats` is configured (else the rest stays zero).
    pub(crate) configured: AtomicBool,
    /// Whether the client is connected to a server now.
    pub(crate) connected: AtomicBool,
    /// Connections lost.
    pub(crate) disconnects: AtomicU64,
    /// Messages on the subject that were not a batch (dropped).
    pub(crate) undecodable: AtomicU64,
}

/// Peer state shared by the handlers and the sender.
#[derive(Debug)]
pub(crate) struct Peers {
    /// This process's id on the wire.
    pub(crate) instance: String,
    pub(crate) known: Mutex<HashMap<String, Known>>,
    pub(crate) next_peer: AtomicU32,
    pub(crate) targets: Mutex<HashMap<String, Target>>,
    /// Targets that turned out to be this process.
    pub(crate) itself: Mutex<HashSet<String>>,
    /// Local changes dropped because the router's outbox overflowed.
    pub(crate) outbox_dropped: AtomicU64,
    /// Peers forgotten for silence.
    pub(crate) forgotten: AtomicU64,
    /// The NATS connection, when `peers.nats` is set.
    pub(crate) bus: BusState,
}

impl Peers {
    pub(crate) fn new() -> Peers {
        let mut raw = [0u8; 8];
        // Without OS randomness, fall back to time and pid: still distinct
        // between the processes of one deployment in practice.
        if getrandom::fill(&mut raw).is_err() {
            let t = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos());
            raw = ((t as u64) ^ u64::from(std::process::id()).rotate_left(32)).to_le_bytes();
        }
        Peers {
            instance: raw.iter().map(|b| format!("{b:02x}")).collect(),
            known: Mutex::new(HashMap::new()),
            next_peer: AtomicU32::new(1),
            targets: Mutex::new(HashMap::new()),
            itself: Mutex::new(HashSet::new()),
            outbox_dropped: AtomicU64::new(0),
            forgotten: AtomicU64::new(0),
            bus: BusState::default(),
        }
    }

    /// For the snapshot: peers heard from, and send targets.
    pub(crate) fn snapshot(&self, now: Instant) -> (Vec<PeerSnapshot>, Vec<PeerTargetSnapshot>) {
        let mut peers: Vec<PeerSnapshot> = lock(&self.known)
            .iter()
            .map(|(instance, k)| PeerSnapshot {
                instance: instance.clone(),
                changes_received: k.changes,
                unknown_replica: k.unknown_replica,
                lag_s: k.lag_s,
                silent_s: now.saturating_duration_since(k.last_seen).as_secs_f64(),
            })
            .collect();
        peers.sort_by(|a, b| a.instance.cmp(&b.instance));
        let mut targets: Vec<PeerTargetSnapshot> = lock(&self.targets)
            .iter()
            .map(|(url, t)| PeerTargetSnapshot {
                url: url.clone(),
                batches_sent: t.stats.batches.load(Ordering::Relaxed),
                failures: t.stats.failures.load(Ordering::Relaxed),
                dropped: t.stats.dropped.load(Ordering::Relaxed),
            })
            .collect();
        targets.sort_by(|a, b| a.url.cmp(&b.url));
        (peers, targets)
    }

    /// For the snapshot: the NATS connection, when configured.
    pub(crate) fn bus_snapshot(&self) -> Option<PeerBusSnapshot> {
        let b = &self.bus;
        b.configured.load(Ordering::Relaxed).then(|| PeerBusSnapshot {
            connected: b.connected.load(Ordering::Relaxed),
            disconnects: b.disconnects.load(Ordering::Relaxed),
            undecodable: b.undecodable.load(Ordering::Relaxed),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instance_ids_differ() {
        assert_ne!(Peers::new().instance, Peers::new().instance);
        assert_eq!(Peers::new().instance.len(), 16);
    }
}
