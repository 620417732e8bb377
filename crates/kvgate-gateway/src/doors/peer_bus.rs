//! Load sharing over NATS Core publish/subscribe (`[peers.nats]`): the
//! same batches as the HTTP mesh (`peer_wire.rs`), published once per
//! flush on one subject per deployment instead of posted to every peer.
//! Each instance subscribes to that subject and applies every other
//! instance's batches; the server does not echo our own (`no_echo`), and
//! a batch carrying our instance id is dropped anyway.
//!
//! The bus is never on the request path: `peers.rs`'s flush loop hands each
//! batch to a bounded queue (dropped and counted when full), a task here
//! publishes it, and a batch that finds the connection down is dropped and
//! counted as a failure rather than buffered. The client reconnects by
//! itself and subscribes again on every new connection. Peers that fall
//! silent (their instance, or our connection) are forgotten after
//! `peers.timeout_ms`, their bookings released, as on the mesh.
//!
//! At start, credentials and TLS are checked with one connection attempt:
//! a server that refuses them stops the start with the reason. A server
//! that cannot be reached does not: the instance routes on its own load and
//! the client keeps trying.

use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use async_nats::connection::State;
use async_nats::{Client, ConnectErrorKind, ConnectOptions, Event};
use axum::body::Bytes;
use futures_util::StreamExt;
use tokio::sync::{mpsc, watch};

use crate::config::nats_config::NatsConfig;
use crate::doors::peer_state::{Peers, TargetStats};
use crate::doors::peer_wire::{self, Applied};
use crate::error::StartError;
use crate::observe::metrics::Metrics;
use crate::replicas::directory::Directory;
use crate::replicas::fleet_handle::FleetHandle;

/// How long one connection attempt may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// How often the server is pinged, so that a half-open connection is
/// noticed and replaced.
const PING_INTERVAL: Duration = Duration::from_secs(5);
/// The longest wait between reconnection attempts.
const MAX_RECONNECT_DELAY: Duration = Duration::from_secs(1);

/// A connected (or connecting) NATS client and this deployment's subject.
#[derive(Debug)]
pub(crate) struct Bus {
    client: Client,
    subject: String,
    /// The send target's name in metrics: `nats:` and the subject.
    pub(crate) label: String,
}

/// Connects to `cfg`'s servers. Refused credentials or TLS fail the start;
/// an unreachable server only delays sharing (the client retries).
pub(crate) async fn connect(cfg: &NatsConfig, peers: &Arc<Peers>) -> Result<Bus, StartError> {
    let servers = cfg.servers().join(",");
    peers.bus.configured.store(true, Ordering::Relaxed);
    let first = options(cfg, peers)?.connect(servers.as_str()).await;
    let client = match first {
        Ok(c) => c,
        Err(e) => match e.kind() {
            ConnectErrorKind::AuthorizationViolation | ConnectErrorKind::Authentication => {
                return Err(StartError::BusRefused {
                    servers,
                    hint: "the server refused this instance's credentials \
                           (peers.nats.token, user/password or nkey_seed_file)",
                    source: e,
                })
            }
            _ if is_tls_failure(&e) => {
                return Err(StartError::BusRefused {
                    servers,
                    hint: "TLS failed (peers.nats.ca, client_cert, client_key; \
                           the server's tls settings)",
                    source: e,
                })
            }
            ConnectErrorKind::ServerParse => {
                return Err(StartError::BusRefused {
                    servers,
                    hint: "not a server address (peers.nats.url)",
                    source: e,
                })
            }
            _ => {
                tracing::warn!(%servers, error = %e, "NATS unreachable; routing on this \
                    instance's own load until it connects (the client keeps trying)");
                options(cfg, peers)?
                    .retry_on_initial_connect()
                    .connect(servers.as_str())
                    .await
                    .map_err(|source| StartError::BusRefused {
                        servers: servers.clone(),
                        hint: "the client could not start",
                        source,
                    })?
            }
        },
    };
    let subject = cfg.subject.clone();
    Ok(Bus { client, label: format!("nats:{subject}"), subject })
}

/// Whether a connection failed in TLS: the client reports a handshake the
/// server's certificate failed (unknown issuer, wrong name) as I/O, with
/// rustls's error inside.
fn is_tls_failure(e: &async_nats::ConnectError) -> bool {
    if e.kind() == ConnectErrorKind::Tls {
        return true;
    }
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        let inner = c.downcast_ref::<std::io::Error>().and_then(std::io::Error::get_ref);
        if c.is::<rustls::Error>() || inner.is_some_and(|i| i.is::<rustls::Error>()) {
            return true;
        }
        cause = c.source();
    }
    false
}

/// The client's options from `[peers.nats]`; the event callback keeps
/// `peers.bus` current.
fn options(cfg: &NatsConfig, peers: &Arc<Peers>) -> Result<ConnectOptions, StartError> {
    let state = Arc::clone(peers);
    let mut o = ConnectOptions::new()
        .name(format!("kvgate-{}", peers.instance))
        .no_echo()
        .connection_timeout(CONNECT_TIMEOUT)
        .ping_interval(PING_INTERVAL)
        .reconnect_delay_callback(|attempts| {
            let ms = 50u64.saturating_mul(1 << attempts.min(5));
            Duration::from_millis(ms).min(MAX_RECONNECT_DELAY)
        })
        .event_callback(move |event| {
            let state = Arc::clone(&state);
            async move { on_event(&state, event) }
        });
    if let Some(token) = &cfg.token {
        o = o.token(token.clone());
    }
    if let (Some(user), Some(password)) = (&cfg.user, &cfg.password) {
        o = o.user_and_password(user.clone(), password.clone());
    }
    if let Some(path) = &cfg.nkey_seed_file {
        o = o.nkey(read_seed(path)?);
    }
    if let Some(ca) = &cfg.ca {
        let identity = cfg.client_cert.as_deref().zip(cfg.client_key.as_deref());
        let tls = crate::doors::tls::client_config_with(ca, identity)
            .map_err(|e| StartError::Tls(format!("peers.nats: {e}")))?;
        o = o.tls_client_config(tls).require_tls(true);
    }
    Ok(o)
}

/// An nkey seed from its file: the first line that is one (`S…`), so that
/// a `.nk` file with comments works too.
fn read_seed(path: &Path) -> Result<String, StartError> {
    let text = std::fs::read_to_string(path)
        .map_err(|source| StartError::BusSeed { path: path.to_owned(), source })?;
    text.lines()
        .map(str::trim)
        .find(|l| l.starts_with('S') && l.len() > 50)
        .map(str::to_owned)
        .ok_or_else(|| StartError::BusSeed {
            path: path.to_owned(),
            source: std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "no nkey seed in it (a line starting with S, as `nk -gen user` writes)",
            ),
        })
}

fn on_event(peers: &Peers, event: Event) {
    let bus = &peers.bus;
    match event {
        Event::Connected => {
            bus.connected.store(true, Ordering::Relaxed);
            tracing::info!("NATS connected: sharing load with peers");
        }
        Event::Disconnected => {
            bus.connected.store(false, Ordering::Relaxed);
            bus.disconnects.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                "NATS connection lost: routing on this instance's own load until it returns"
            );
        }
        Event::ServerError(e) => tracing::error!(error = %e, "NATS server error"),
        Event::ClientError(e) => tracing::warn!(error = %e, "NATS client error"),
        Event::SlowConsumer(_) => {
            tracing::warn!("NATS: peers' batches arrive faster than applied; the server drops some")
        }
        other => tracing::info!(event = %other, "NATS"),
    }
}

/// Where received batches go: what is known about peers, the fleet whose
/// ledger takes their changes, the directory that names replicas, and the
/// metrics that count their lag.
#[derive(Debug)]
pub(crate) struct Sink {
    pub(crate) peers: Arc<Peers>,
    pub(crate) fleet: Arc<FleetHandle>,
    pub(crate) replicas: Arc<Directory>,
    pub(crate) metrics: Arc<Metrics>,
}

impl Bus {
    /// Starts the publisher (batches from `rx`, counted in `stats`, each
    /// given up after `timeout`) and the subscriber into `ctx` (until `stop`).
    pub(crate) fn start(
        self,
        ctx: Sink,
        timeout: Duration,
        rx: mpsc::Receiver<Bytes>,
        stats: Arc<TargetStats>,
        stop: watch::Receiver<bool>,
    ) {
        if self.client.connection_state() == State::Connected {
            ctx.peers.bus.connected.store(true, Ordering::Relaxed);
        }
        let publisher = self.client.clone();
        tokio::spawn(publish(publisher, self.subject.clone(), rx, stats, timeout));
        tokio::spawn(subscribe(ctx, self.client, self.subject, stop));
    }
}

/// Publishes each batch once, in order, until the queue is dropped. A batch
/// that finds the connection down is dropped (a failure), not buffered:
/// peers forget this instance if it stays down, and stale changes would
/// only mislead them.
async fn publish(
    client: Client,
    subject: String,
    mut rx: mpsc::Receiver<Bytes>,
    stats: Arc<TargetStats>,
    timeout: Duration,
) {
    let mut failing = false;
    while let Some(body) = rx.recv().await {
        let sent = if client.connection_state() == State::Connected {
            match tokio::time::timeout(timeout, client.publish(subject.clone(), body)).await {
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) => Err(e.to_string()),
                Err(_) => Err(format!("no room to publish within {timeout:?}")),
            }
        } else {
            Err("not connected".to_owned())
        };
        match sent {
            Ok(()) => {
                failing = false;
                stats.batches.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => {
                if !failing {
                    tracing::warn!(%subject, error = %e, "NATS publish failed; batches are lost until it works");
                }
                failing = true;
                stats.failures.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// Applies every batch published on `subject` until `stop`. The client
/// subscribes again on each new connection; if the subscription itself
/// ends (the client closed), it is made again.
async fn subscribe(ctx: Sink, client: Client, subject: String, mut stop: watch::Receiver<bool>) {
    loop {
        let mut sub = match client.subscribe(subject.clone()).await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(%subject, error = %e, "NATS subscribe failed; trying again");
                tokio::select! {
                    _ = stop.changed() => return,
                    _ = tokio::time::sleep(MAX_RECONNECT_DELAY) => continue,
                }
            }
        };
        loop {
            let message = tokio::select! {
                _ = stop.changed() => return,
                m = sub.next() => m,
            };
            let Some(message) = message else { break };
            receive(&ctx, &message.payload);
        }
        tracing::warn!(%subject, "NATS subscription ended; subscribing again");
    }
}

/// One message: decoded and applied, or counted as undecodable.
fn receive(ctx: &Sink, payload: &[u8]) {
    let batch = match peer_wire::decode(payload) {
        Ok(b) => b,
        Err(e) => {
            let n = ctx.peers.bus.undecodable.fetch_add(1, Ordering::Relaxed);
            if n == 0 {
                tracing::warn!(error = %e, "a message on the peers' NATS subject is not a batch; dropped (and counted)");
            }
            return;
        }
    };
    match peer_wire::apply(&ctx.peers, &ctx.fleet, &ctx.replicas, &batch, crate::clock::now()) {
        Applied::Own => tracing::debug!("a batch with this instance's id on NATS; dropped"),
        Applied::Changes { lag_s, .. } => ctx.metrics.peer_batch_lag(lag_s),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handshake_failures_are_told_from_unreachable_servers() {
        let handshake = std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer),
        );
        let e = async_nats::ConnectError::with_source(ConnectErrorKind::Io, handshake);
        assert!(is_tls_failure(&e));
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        let e = async_nats::ConnectError::with_source(ConnectErrorKind::Io, refused);
        assert!(!is_tls_failure(&e));
        assert!(is_tls_failure(&async_nats::ConnectError::new(ConnectErrorKind::Tls)));
    }

    #[test]
    fn seeds_are_read_from_nk_files() {
        let dir = std::env::temp_dir().join(format!("kvgate-seed-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        let seed = format!("SUA{}", "B".repeat(55));
        let file = dir.join("user.nk");
        let _ = std::fs::write(&file, format!("# a comment\n  {seed}  \n"));
        assert_eq!(read_seed(&file).ok(), Some(seed));
        // The error names the file; its source says what is wrong.
        let chain = |e: StartError| {
            let source = std::error::Error::source(&e).map(|s| s.to_string()).unwrap_or_default();
            format!("{e}: {source}")
        };
        let _ = std::fs::write(&file, "not a seed\n");
        let e = read_seed(&file).err().map(chain).unwrap_or_default();
        assert!(e.contains("user.nk: no nkey seed"), "{e}");
        let e = read_seed(&dir.join("missing.nk")).err().map(chain).unwrap_or_default();
        assert!(e.contains("missing.nk: No such file"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
