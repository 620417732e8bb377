//! Peer load sharing: several kvgate instances in front of one fleet each
//! see every replica's KV events (the engines' PUB sockets fan out), but
//! each knows only its own in-flight requests. Without more, they herd: a
//! burst split over three instances lands three times on the replica each
//! thinks idle. So every instance sends its ledger changes (book, first
//! token, finish) to its peers and books theirs through the router's peer
//! API, and each routes on the fleet's whole load.
//!
//! Transport: batched JSON over HTTP, `POST /peer/v1/changes` on the peer
//! listener, `Authorization: Bearer <peers.key>` (constant-time check).
//! One sender task per peer posts its batches in order; a peer that is
//! slow or gone only loses batches (bounded queue, counted), and routing
//! never waits for it. A peer silent for `peers.timeout_ms` is forgotten:
//! its bookings are released (ledger reason `peer_gone`). Replicas are
//! named on the wire by their configured names, which every instance of one
//! deployment shares; ids stay local.
//!
//! Peers come from `peers.urls` and from `peers.dns` (a headless Service),
//! resolved periodically. Each process draws a random instance id at start;
//! a batch that comes back with our own id (we resolved ourselves) turns
//! that target off.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};
use tracing::Instrument;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use kvgate_index::BlockKey;
use kvgate_router::{LedgerChange, PeerId};
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, watch};

use crate::config::cluster_config::PeersConfig;
use crate::config::settings::PeerTiming;
use crate::doors::auth::{bearer, key_matches};
use crate::doors::peer_state::{Known, Peers, Target, TargetStats};
use crate::doors::throttle::{self, ClientAddr, KeyKind, KeyThrottle, KeyVerdict};
use crate::locks::lock;
use crate::observe::metrics::Metrics;
use crate::replicas::directory::Directory;
use crate::replicas::fleet_handle::FleetHandle;
use crate::request::request_error::Reason;

/// The path peers post to.
pub(crate) const CHANGES_PATH: &str = "/peer/v1/changes";

/// What the peer endpoint and tasks use: `[peers]`, what is known about
/// each peer, the router (through the fleet handle) whose ledger changes
/// travel, the directory that maps replica names to local ids, the HTTP
/// client for sending, and the key throttle for receiving.
#[derive(Debug)]
pub(crate) struct PeerContext {
    pub(crate) config: PeersConfig,
    /// `config`'s durations (`settings.rs`).
    pub(crate) timing: PeerTiming,
    /// `http` or `https`: how peers found by DNS are reached (as this
    /// instance serves, `tls.cert`).
    pub(crate) scheme: &'static str,
    pub(crate) peers: Arc<Peers>,
    pub(crate) fleet: Arc<FleetHandle>,
    pub(crate) replicas: Arc<Directory>,
    pub(crate) client: reqwest::Client,
    pub(crate) throttle: Arc<KeyThrottle>,
    pub(crate) metrics: Arc<Metrics>,
}

/// One batch on the wire.
#[derive(Debug, Serialize, Deserialize)]
struct WireBatch {
    /// The sender's instance id.
    instance: String,
    /// Sender's wall clock when sent, ms since the epoch (for lag).
    sent_unix_ms: u64,
    changes: Vec<WireChange>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
enum WireChange {
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

#[derive(Debug, Serialize, Deserialize)]
struct WireReply {
    instance: String,
}

fn unix_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// `POST /peer/v1/changes`: a peer's batch, applied in order.
#[tracing::instrument(level = "debug", name = "peer_receive", skip_all)]
pub(crate) async fn receive(
    State(s): State<Arc<PeerContext>>,
    client: Option<axum::Extension<ClientAddr>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let key = s.config.key.as_slice();
    let presented = bearer(&headers);
    let ok = presented.is_some_and(|t| key_matches(key, t));
    let addr = client.as_ref().map(|c| &c.0);
    match throttle::verdict(&s.throttle, &s.metrics, addr, KeyKind::Peer, presented.is_some(), ok) {
        KeyVerdict::Allowed => {}
        KeyVerdict::Throttled(r) => return r,
        KeyVerdict::Denied => {
            s.metrics.count(Reason::PeerUnauthorized);
            return (StatusCode::UNAUTHORIZED, "peer key required").into_response();
        }
    }
    let batch: WireBatch = match serde_json::from_slice(&body) {
        Ok(b) => b,
        Err(e) => return (StatusCode::BAD_REQUEST, format!("bad batch: {e}")).into_response(),
    };
    let peers = &s.peers;
    let reply = Json(WireReply { instance: peers.instance.clone() });
    if batch.instance == peers.instance {
        return reply.into_response();
    }
    let now = crate::clock::now();
    let lag_s = unix_ms().saturating_sub(batch.sent_unix_ms) as f64 / 1e3;
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
    {
        // Names to local ids first, outside the router's lock.
        let mut tentative = Vec::new();
        let changes: Vec<Option<LedgerChange>> = batch
            .changes
            .iter()
            .filter_map(|c| match c {
                WireChange::Tentative { replica, keys } => {
                    match s.replicas.by_name(replica) {
                        Some(r) => tentative.push((r.id, keys)),
                        None => unknown += 1,
                    }
                    None
                }
                other => Some(other),
            })
            .map(|c| match c {
                WireChange::Book { id, replica, prefill_tokens, blocks } => {
                    s.replicas.by_name(replica).map(|r| LedgerChange::Book {
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
        unknown += s.fleet.with(|f| {
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
    }
    if unknown > 0 {
        if let Some(k) = lock(&peers.known).get_mut(&batch.instance) {
            k.unknown_replica += unknown;
        }
    }
    reply.into_response()
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

/// Sends local changes to every peer, forgets silent peers, and keeps the
/// target list current (static URLs plus `peers.dns`), until `stop`.
pub(crate) async fn run(ctx: Arc<PeerContext>, mut stop: watch::Receiver<bool>) {
    let cfg = ctx.config.clone();
    ctx.fleet.with(|f| f.share_with_peers());
    for u in &cfg.urls {
        add_target(&ctx, u.trim_end_matches('/'));
    }
    let PeerTiming { flush, heartbeat, resolve_every, .. } = ctx.timing;
    let mut tick = tokio::time::interval(flush);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let (mut last_sent, mut last_resolved) = (crate::clock::now() - heartbeat, None::<Instant>);
    let mut changes = Vec::new();
    let mut tentative = Vec::new();
    loop {
        tokio::select! {
            _ = stop.changed() => break,
            _ = tick.tick() => {}
        }
        let now = crate::clock::now();
        if let Some(dns) = &cfg.dns {
            if last_resolved.is_none_or(|t| now.duration_since(t) >= resolve_every) {
                last_resolved = Some(now);
                resolve(&ctx, dns).await;
            }
        }
        changes.clear();
        tentative.clear();
        let dropped = ctx.fleet.with(|f| f.drain_peer_changes(&mut changes, &mut tentative));
        ctx.peers.outbox_dropped.store(dropped, Ordering::Relaxed);
        if changes.is_empty() && tentative.is_empty() && now.duration_since(last_sent) < heartbeat {
            forget_silent(&ctx, now);
            continue;
        }
        let batch = WireBatch {
            instance: ctx.peers.instance.clone(),
            sent_unix_ms: unix_ms(),
            changes: changes
                .iter()
                .filter_map(|c| wire(&ctx.replicas, c))
                .chain(tentative.drain(..).filter_map(|(r, keys)| {
                    Some(WireChange::Tentative {
                        replica: ctx.replicas.get(r)?.name.clone(),
                        keys: keys.iter().map(|k| k.0).collect(),
                    })
                }))
                .collect(),
        };
        let Ok(body) = serde_json::to_vec(&batch) else { continue };
        let body = Bytes::from(body);
        for t in lock(&ctx.peers.targets).values() {
            if t.tx.try_send(body.clone()).is_err() {
                t.stats.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
        last_sent = now;
        forget_silent(&ctx, now);
    }
    lock(&ctx.peers.targets).clear();
}

/// Releases the bookings of peers silent for longer than the timeout.
fn forget_silent(ctx: &PeerContext, now: Instant) {
    let timeout = ctx.timing.timeout;
    let gone: Vec<(String, PeerId)> = lock(&ctx.peers.known)
        .iter()
        .filter(|(_, k)| now.saturating_duration_since(k.last_seen) > timeout)
        .map(|(i, k)| (i.clone(), k.id))
        .collect();
    for (instance, id) in gone {
        lock(&ctx.peers.known).remove(&instance);
        let released = ctx.fleet.with(|f| f.forget_peer(id));
        ctx.peers.forgotten.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(%instance, released, "peer silent too long: forgotten, its bookings released");
    }
}

/// Resolves `dns` (HOST:PORT) and makes its addresses the DNS-found
/// targets. A failed lookup keeps the current ones.
async fn resolve(ctx: &Arc<PeerContext>, dns: &str) {
    let addrs = match tokio::net::lookup_host(dns).await {
        Ok(a) => a.collect::<HashSet<SocketAddr>>(),
        Err(e) => {
            tracing::warn!(%dns, error = %e, "peer DNS lookup failed; keeping the current peers");
            return;
        }
    };
    let wanted: HashSet<String> = addrs.iter().map(|a| format!("{}://{a}", ctx.scheme)).collect();
    let statics: HashSet<&str> = ctx.config.urls.iter().map(|u| u.trim_end_matches('/')).collect();
    let current: Vec<String> = lock(&ctx.peers.targets).keys().cloned().collect();
    for url in current {
        if !wanted.contains(&url) && !statics.contains(url.as_str()) {
            lock(&ctx.peers.targets).remove(&url);
            tracing::info!(%url, "peer left DNS");
        }
    }
    for url in wanted {
        add_target(ctx, &url);
    }
}

fn add_target(ctx: &Arc<PeerContext>, url: &str) {
    if lock(&ctx.peers.itself).contains(url) {
        return;
    }
    let mut targets = lock(&ctx.peers.targets);
    if targets.contains_key(url) {
        return;
    }
    let (tx, rx) = mpsc::channel(ctx.config.queue_batches);
    let stats = Arc::new(TargetStats::default());
    targets.insert(url.to_owned(), Target { tx, stats: Arc::clone(&stats) });
    tokio::spawn(send_loop(Arc::clone(ctx), url.to_owned(), rx, stats));
    tracing::info!(%url, "peer target added");
}

/// Posts one target's batches in order until its queue is dropped.
async fn send_loop(
    ctx: Arc<PeerContext>,
    url: String,
    mut rx: mpsc::Receiver<Bytes>,
    stats: Arc<TargetStats>,
) {
    let endpoint = format!("{url}{CHANGES_PATH}");
    let key = ctx.config.key.clone().unwrap_or_default();
    let timeout = ctx.timing.timeout;
    let mut failing = false;
    while let Some(body) = rx.recv().await {
        let sent = ctx
            .client
            .post(&endpoint)
            .bearer_auth(&key)
            .header("content-type", "application/json")
            .timeout(timeout)
            .body(body)
            .send()
            .instrument(tracing::debug_span!("peer_send", %url))
            .await;
        let reply = match sent {
            Ok(r) if r.status().is_success() => r.json::<WireReply>().await.ok(),
            Ok(r) => {
                if !failing {
                    tracing::warn!(%url, status = %r.status(), "peer refused a batch");
                }
                None
            }
            Err(e) => {
                if !failing {
                    tracing::warn!(%url, error = %e, "peer unreachable; batches to it are lost until it answers");
                }
                None
            }
        };
        match reply {
            Some(r) if r.instance == ctx.peers.instance => {
                tracing::debug!(%url, "peer target is this process; skipping it");
                lock(&ctx.peers.itself).insert(url.clone());
                lock(&ctx.peers.targets).remove(&url);
                return;
            }
            Some(_) => {
                failing = false;
                stats.batches.fetch_add(1, Ordering::Relaxed);
            }
            None => {
                failing = true;
                stats.failures.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_round_trip_on_the_wire() {
        let b = WireBatch {
            instance: "ab".into(),
            sent_unix_ms: 7,
            changes: vec![
                WireChange::Book { id: 1, replica: "r0".into(), prefill_tokens: 512, blocks: 32 },
                WireChange::FirstToken { id: 1 },
                WireChange::Finish { id: 1 },
                WireChange::Tentative { replica: "r0".into(), keys: vec![7, u64::MAX] },
            ],
        };
        let text = serde_json::to_string(&b).unwrap_or_default();
        assert!(text.contains(r#""kind":"book""#), "{text}");
        let back: WireBatch = serde_json::from_str(&text).unwrap_or(WireBatch {
            instance: String::new(),
            sent_unix_ms: 0,
            changes: vec![],
        });
        assert_eq!(back.changes.len(), 4);
        // Content keys survive JSON exactly, even past 2^53.
        assert!(
            matches!(&back.changes[3], WireChange::Tentative { keys, .. } if keys[1] == u64::MAX)
        );
        assert!(matches!(back.changes[0], WireChange::Book { id: 1, prefill_tokens: 512, .. }));
        // Unknown kinds are refused, not guessed.
        let bad = r#"{"instance":"x","sent_unix_ms":0,"changes":[{"kind":"steal","id":1}]}"#;
        assert!(serde_json::from_str::<WireBatch>(bad).is_err());
    }
}
