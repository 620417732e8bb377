//! Peer load sharing: several kvgate instances in front of one fleet each
//! see every replica's KV events (the engines' PUB sockets fan out), but
//! each knows only its own in-flight requests. Without more, they herd: a
//! burst split over three instances lands three times on the replica each
//! thinks idle. So every instance sends its ledger changes (book, first
//! token, finish) to its peers and books theirs through the router's peer
//! API, and each routes on the fleet's whole load.
//!
//! Transport: the batches of `peer_wire.rs` over HTTP, `POST
//! /peer/v1/changes` on the peer listener, `Authorization: Bearer
//! <peers.key>` (constant-time check); or, with `[peers.nats]`, published
//! once on a NATS subject (`peer_bus.rs`), which is then the only target.
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
use std::time::Instant;
use tracing::Instrument;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, watch};

use crate::config::cluster_config::PeersConfig;
use crate::config::settings::PeerTiming;
use crate::doors::auth::{bearer, key_matches};
use crate::doors::peer_bus::{Bus, Sink};
use crate::doors::peer_state::{Peers, Target, TargetStats};
use crate::doors::peer_wire::{self, Applied};
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

/// What a peer answers to a batch: its instance id (so that a target that
/// is this process is recognised and skipped).
#[derive(Debug, Serialize, Deserialize)]
struct WireReply {
    instance: String,
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
    let batch = match peer_wire::decode(&body) {
        Ok(b) => b,
        Err(e) => return (StatusCode::BAD_REQUEST, format!("bad batch: {e}")).into_response(),
    };
    let applied = peer_wire::apply(&s.peers, &s.fleet, &s.replicas, &batch, crate::clock::now());
    if let Applied::Changes { lag_s, .. } = applied {
        s.metrics.peer_batch_lag(lag_s);
    }
    Json(WireReply { instance: s.peers.instance.clone() }).into_response()
}

/// Sends local changes to every peer (or to the NATS `bus`), forgets
/// silent peers, and keeps the target list current (static URLs plus
/// `peers.dns`), until `stop`.
pub(crate) async fn run(ctx: Arc<PeerContext>, bus: Option<Bus>, mut stop: watch::Receiver<bool>) {
    let cfg = ctx.config.clone();
    ctx.fleet.with(|f| f.share_with_peers());
    for u in &cfg.urls {
        add_target(&ctx, u.trim_end_matches('/'));
    }
    if let Some(bus) = bus {
        let (rx, stats) = insert_target(&ctx, &bus.label.clone());
        let sink = Sink {
            peers: Arc::clone(&ctx.peers),
            fleet: Arc::clone(&ctx.fleet),
            replicas: Arc::clone(&ctx.replicas),
            metrics: Arc::clone(&ctx.metrics),
        };
        bus.start(sink, ctx.timing.timeout, rx, stats, stop.clone());
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
        let Some(body) =
            peer_wire::encode(&ctx.peers.instance, &ctx.replicas, &changes, &mut tentative)
        else {
            continue;
        };
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

fn forget_silent(ctx: &PeerContext, now: Instant) {
    peer_wire::forget_silent(&ctx.peers, &ctx.fleet, ctx.timing.timeout, now);
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
    if lock(&ctx.peers.targets).contains_key(url) {
        return;
    }
    let (rx, stats) = insert_target(ctx, url);
    tokio::spawn(send_loop(Arc::clone(ctx), url.to_owned(), rx, stats));
    tracing::info!(%url, "peer target added");
}

/// A send target's bounded queue and counters, registered under `name`.
fn insert_target(ctx: &PeerContext, name: &str) -> (mpsc::Receiver<Bytes>, Arc<TargetStats>) {
    let (tx, rx) = mpsc::channel(ctx.config.queue_batches);
    let stats = Arc::new(TargetStats::default());
    lock(&ctx.peers.targets).insert(name.to_owned(), Target { tx, stats: Arc::clone(&stats) });
    (rx, stats)
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
