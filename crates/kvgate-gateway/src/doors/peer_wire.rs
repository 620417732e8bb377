//! What peers exchange, whatever carries it: a batch of ledger changes
//! (book, first token, finish, tentative blocks) as JSON, built once per
//! flush from the router's outbox, and applied on arrival through the
//! router's peer API with replica names mapped to local ids. The HTTP mesh
//! (`peers.rs`) and the NATS bus (`peer_bus.rs`) both carry these bytes.

use std::sync::atomic::Ordering;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use kvgate_index::{BlockKey, ReplicaId};
use kvgate_router::{LedgerChange, PeerId};
use serde::{Deserialize, Serialize};

use crate::doors::peer_state::{Known, Peers};
use crate::locks::lock;
use crate::replicas::directory::Directory;
use crate::replicas::fleet_handle::FleetHandle;

/// One batch on the wire.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct WireBatch {
    /// The sender's instance id.
    pub(crate) instance: String,
    /// Sender's wall clock when sent, ms since the epoch (for lag).
    pub(crate) sent_unix_ms: u64,
    /// The same in µs, for lags under a millisecond (0: not sent).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub(crate) sent_unix_us: u64,
    pub(crate) changes: Vec<WireChange>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub(crate) enum WireChange {
    Book {
        id: u64,
        replica: String,
        prefill_tokens: u64,
        blocks: u64,
    },
    FirstToken {
        id: u64,
    },
    Finish {
        id: u64,
    },
    /// Blocks a booking will soon cache on `replica` (content keys, equal
    /// on every instance): a peer's burst then finds the prefix there.
    Tentative {
        replica: String,
        keys: Vec<u64>,
    },
}

/// What a batch's arrival did.
#[derive(Debug, PartialEq)]
pub(crate) enum Applied {
    /// It came from this process (a target that is ourselves, or our own
    /// message back from the bus): nothing applied.
    Own,
    /// Applied, `lag_s` after the sender flushed it (wall clocks); this
    /// many changes named a replica this instance does not know.
    Changes { lag_s: f64, unknown_replica: u64 },
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

fn unix_us() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_micros() as u64)
}

/// The batch of this flush's local changes, as bytes for every carrier.
/// `None` when it cannot be serialised (it always can: plain fields).
pub(crate) fn encode(
    instance: &str,
    replicas: &Directory,
    changes: &[LedgerChange],
    tentative: &mut Vec<(ReplicaId, Vec<BlockKey>)>,
) -> Option<Vec<u8>> {
    let now_us = unix_us();
    let batch = WireBatch {
        instance: instance.to_owned(),
        sent_unix_ms: now_us / 1000,
        sent_unix_us: now_us,
        changes: changes
            .iter()
            .filter_map(|c| wire(replicas, c))
            .chain(tentative.drain(..).filter_map(|(r, keys)| {
                Some(WireChange::Tentative {
                    replica: replicas.get(r)?.name.clone(),
                    keys: keys.iter().map(|k| k.0).collect(),
                })
            }))
            .collect(),
    };
    serde_json::to_vec(&batch).ok()
}

/// A batch from its bytes; the error says what is wrong with it.
pub(crate) fn decode(bytes: &[u8]) -> Result<WireBatch, serde_json::Error> {
    serde_json::from_slice(bytes)
}

fn wire(replicas: &Directory, c: &LedgerChange) -> Option<WireChange> {
    Some(match *c {
        LedgerChange::Book { id, replica, prefill_tokens, blocks } => WireChange::Book {
            id,
            replica: replicas.get(replica)?.name.clone(),
            prefill_tokens,
            blocks,
        },
        LedgerChange::FirstToken { id } => WireChange::FirstToken { id },
        LedgerChange::Finish { id } => WireChange::Finish { id },
    })
}

/// Applies a peer's batch in order: the peer is noted as heard from now
/// (a new one gets a `PeerId`), its changes go to the router's peer API.
/// Our own batches are dropped.
pub(crate) fn apply(
    peers: &Peers,
    fleet: &FleetHandle,
    replicas: &Directory,
    batch: &WireBatch,
    now: Instant,
) -> Applied {
    if batch.instance == peers.instance {
        return Applied::Own;
    }
    let sent_us = match batch.sent_unix_us {
        0 => batch.sent_unix_ms.saturating_mul(1000),
        us => us,
    };
    let lag_s = unix_us().saturating_sub(sent_us) as f64 / 1e6;
    let peer = {
        let mut known = lock(&peers.known);
        let k = known.entry(batch.instance.clone()).or_insert_with(|| {
            let id = PeerId(peers.next_peer.fetch_add(1, Ordering::Relaxed));
            tracing::info!(instance = %batch.instance, "peer joined");
            Known { id, last_seen: now, changes: 0, unknown_replica: 0, lag_s }
        });
        k.last_seen = now;
        k.lag_s = lag_s;
        k.changes += batch.changes.len() as u64;
        k.id
    };
    let mut unknown = 0;
    // Names to local ids first, outside the router's lock.
    let mut tentative = Vec::new();
    let changes: Vec<Option<LedgerChange>> = batch
        .changes
        .iter()
        .filter_map(|c| match c {
            WireChange::Tentative { replica, keys } => {
                match replicas.by_name(replica) {
                    Some(r) => tentative.push((r.id, keys)),
                    None => unknown += 1,
                }
                None
            }
            other => Some(other),
        })
        .map(|c| match c {
            WireChange::Book { id, replica, prefill_tokens, blocks } => {
                replicas.by_name(replica).map(|r| LedgerChange::Book {
                    id: *id,
                    replica: r.id,
                    prefill_tokens: *prefill_tokens,
                    blocks: *blocks,
                })
            }
            WireChange::FirstToken { id } => Some(LedgerChange::FirstToken { id: *id }),
            WireChange::Finish { id } => Some(LedgerChange::Finish { id: *id }),
            WireChange::Tentative { .. } => None,
        })
        .collect();
    unknown += fleet.with(|f| {
        for (replica, keys) in tentative {
            let keys: Vec<BlockKey> = keys.iter().map(|&k| BlockKey(k)).collect();
            f.apply_peer_tentative(replica, &keys, now);
        }
        let mut unknown = 0;
        for c in changes {
            match c {
                Some(c) => f.apply_peer(peer, &c, now),
                None => unknown += 1,
            }
        }
        unknown
    });
    if unknown > 0 {
        if let Some(k) = lock(&peers.known).get_mut(&batch.instance) {
            k.unknown_replica += unknown;
        }
    }
    Applied::Changes { lag_s, unknown_replica: unknown }
}

/// Releases the bookings of peers silent for longer than `timeout`, over
/// any carrier. Returns how many peers were forgotten.
pub(crate) fn forget_silent(
    peers: &Peers,
    fleet: &FleetHandle,
    timeout: std::time::Duration,
    now: Instant,
) -> usize {
    let gone: Vec<(String, PeerId)> = lock(&peers.known)
        .iter()
        .filter(|(_, k)| now.saturating_duration_since(k.last_seen) > timeout)
        .map(|(i, k)| (i.clone(), k.id))
        .collect();
    let n = gone.len();
    for (instance, id) in gone {
        lock(&peers.known).remove(&instance);
        let released = fleet.with(|f| f.forget_peer(id));
        peers.forgotten.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(%instance, released, "peer silent too long: forgotten, its bookings released");
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_round_trip_on_the_wire() {
        let b = WireBatch {
            instance: "ab".into(),
            sent_unix_ms: 7,
            sent_unix_us: 7_001,
            changes: vec![
                WireChange::Book { id: 1, replica: "r0".into(), prefill_tokens: 512, blocks: 32 },
                WireChange::FirstToken { id: 1 },
                WireChange::Finish { id: 1 },
                WireChange::Tentative { replica: "r0".into(), keys: vec![7, u64::MAX] },
            ],
        };
        let text = serde_json::to_string(&b).unwrap_or_default();
        assert!(text.contains(r#""kind":"book""#), "{text}");
        let back: WireBatch = decode(text.as_bytes()).unwrap_or(WireBatch {
            instance: String::new(),
            sent_unix_ms: 0,
            sent_unix_us: 0,
            changes: vec![],
        });
        assert_eq!(back.sent_unix_us, 7_001);
        assert_eq!(back.changes.len(), 4);
        // Content keys survive JSON exactly, even past 2^53.
        assert!(
            matches!(&back.changes[3], WireChange::Tentative { keys, .. } if keys[1] == u64::MAX)
        );
        assert!(matches!(back.changes[0], WireChange::Book { id: 1, prefill_tokens: 512, .. }));
        // Unknown kinds are refused, not guessed.
        let bad = r#"{"instance":"x","sent_unix_ms":0,"changes":[{"kind":"steal","id":1}]}"#;
        assert!(decode(bad.as_bytes()).is_err());
        assert!(decode(b"\xff\x00 not json").is_err());
    }
}
