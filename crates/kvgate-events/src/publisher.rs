//! The publisher side of vLLM's KV-event protocol, for the simulated engine
//! (`kvgate sim`) and for tests: a ZMQ PUB socket that sends
//! `[topic, seq (8-byte big-endian), payload]` and an optional ROUTER replay
//! service over a bounded buffer of recent batches (FIELD.md §1).
//!
//! It behaves as vLLM's `ZmqEventPublisher` does where a subscriber can tell:
//!
//! * the PUB endpoint is **bound** if it contains `*`, `::`, `ipc://` or
//!   `inproc://`, and **connected** otherwise; the replay endpoint is always
//!   bound. `tcp://*:PORT` is bound on every IPv4 interface (`0.0.0.0`), as
//!   libzmq does, since the pure-Rust `zeromq` crate does not read `*`;
//! * batches are numbered 0, 1, 2, ... from process start, and the last
//!   `buffer_steps` of them are kept for replay;
//! * a replay request is exactly `[identity, b"", start_seq (8 bytes BE)]`
//!   on the ROUTER; anything else is logged and ignored. The reply is every
//!   buffered batch with seq ≥ start, then an end marker, in the frame shape
//!   of the layout's release ([`replay_has_topic`]);
//! * publishing never waits: a subscriber that cannot keep up loses messages
//!   (PUB drops at its high-water mark, as libzmq does), and replay requests
//!   are served on their own tasks.
//!
//! For fault injection, `drop_rate` withholds a deterministic fraction of
//! batches from the PUB socket while still numbering and buffering them, as a
//! lossy network would: subscribers see gaps that replay can fill.
//!
//! [`Publisher::publish`] is synchronous and cheap (an encode, a short lock
//! and a channel push), so a simulated engine can call it from its step loop;
//! [`Publisher::start`] must run inside a tokio runtime, which hosts the
//! socket tasks.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use zeromq::{
    Endpoint, PubSocket, RouterSocket, Socket, SocketEvent, SocketRecv, SocketSend, ZmqMessage,
};

use crate::encode::{encode_batch, Layout};
use crate::frames::{parse_seq, END_SEQ};
use crate::types::Batch;

/// vLLM's default number of batches kept for replay.
pub const DEFAULT_BUFFER_STEPS: usize = 10_000;
/// vLLM's default PUB high-water mark.
pub const DEFAULT_HWM: usize = 100_000;

/// Where and how to publish.
#[derive(Clone, Debug)]
pub struct PublisherConfig {
    /// The PUB endpoint, e.g. `tcp://*:5557` (bound) or
    /// `tcp://10.0.0.9:5557` (connected), by vLLM's rule ([`should_bind`]).
    pub endpoint: String,
    /// The ROUTER replay endpoint, always bound; `None` disables replay
    /// (batches are still numbered, nothing is buffered).
    pub replay_endpoint: Option<String>,
    /// The topic frame of every PUB message (vLLM's default is empty).
    pub topic: String,
    /// How many recent batches the replay buffer keeps (at least 1).
    pub buffer_steps: usize,
    /// The msgpack layout, which also picks the replay frame shape.
    pub layout: Layout,
    /// Fault injection: the fraction of batches, in `[0, 1]`, numbered and
    /// buffered but not sent on PUB. See [`drop_decision`].
    pub drop_rate: f64,
    /// Seed of the drop decisions.
    pub drop_seed: u64,
    /// Messages queued for the PUB socket before new ones are dropped.
    pub hwm: usize,
    /// How long one replay reply may wait on a slow client before it is
    /// abandoned.
    pub replay_send_timeout: Duration,
    /// Bind the PUB socket even where vLLM's rule would connect, e.g. to
    /// `tcp://127.0.0.1:0` (loopback only), for in-process fleets.
    pub force_bind: bool,
    /// Fault injection: every replay reply waits this long before its first
    /// batch (a slow engine or network), so that what a subscriber does
    /// while its initial sync is in flight can be tested. The reply holds
    /// what is buffered when it is sent, as vLLM's does.
    pub replay_delay: Duration,
}

impl PublisherConfig {
    /// vLLM's defaults for `endpoint`: no replay, empty topic, 10,000 buffered
    /// batches, the 0.26 layout, no faults.
    pub fn new(endpoint: impl Into<String>) -> Self {
        Self {
            endpoint: endpoint.into(),
            replay_endpoint: None,
            topic: String::new(),
            buffer_steps: DEFAULT_BUFFER_STEPS,
            layout: Layout::V0_26,
            drop_rate: 0.0,
            drop_seed: 0,
            hwm: DEFAULT_HWM,
            replay_send_timeout: Duration::from_secs(5),
            force_bind: false,
            replay_delay: Duration::ZERO,
        }
    }
}

/// Counters, shared with whatever exports them.
#[derive(Debug, Default)]
pub struct PublisherMetrics {
    /// Batches numbered (sent, dropped by the fault, or dropped at the HWM).
    pub published: AtomicU64,
    /// Batches withheld from PUB by the `drop_rate` fault.
    pub dropped: AtomicU64,
    /// Batches dropped because the PUB queue was full (slow socket).
    pub hwm_dropped: AtomicU64,
    /// Well-formed replay requests answered.
    pub replay_requests: AtomicU64,
    /// Batches sent in replay replies.
    pub replayed_batches: AtomicU64,
    /// Malformed replay requests ignored.
    pub bad_replay_requests: AtomicU64,
}

impl PublisherMetrics {
    fn inc(counter: &AtomicU64, by: u64) {
        counter.fetch_add(by, Ordering::Relaxed);
    }

    fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }

    /// Batches numbered so far.
    pub fn published(&self) -> u64 {
        Self::get(&self.published)
    }

    /// Batches withheld by the fault.
    pub fn dropped(&self) -> u64 {
        Self::get(&self.dropped)
    }

    /// Replay requests answered.
    pub fn replay_requests(&self) -> u64 {
        Self::get(&self.replay_requests)
    }
}

/// Errors that stop the publisher from starting.
#[derive(Debug, thiserror::Error)]
pub enum PublisherError {
    /// A configuration value is out of range.
    #[error("invalid publisher config: {0}")]
    Config(String),
    /// The endpoint string is not a ZMQ endpoint this build supports.
    #[error("invalid endpoint {endpoint}: {error}")]
    Endpoint {
        /// The endpoint given.
        endpoint: String,
        /// What was wrong.
        error: String,
    },
    /// Binding failed (port in use, address not local, ...).
    #[error("cannot bind {endpoint}: {error}")]
    Bind {
        /// The endpoint given.
        endpoint: String,
        /// What was wrong.
        error: String,
    },
}

/// The endpoints as they ended up, with port 0 resolved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LocalEndpoints {
    /// The PUB endpoint: where it is bound (e.g. `tcp://0.0.0.0:41234`), or
    /// the configured endpoint when it connects.
    pub events: String,
    /// Whether the PUB socket is bound (false: it connects to `events`).
    pub events_bound: bool,
    /// Where the replay ROUTER is bound, if replay is on.
    pub replay: Option<String>,
}

/// vLLM's rule: bind if the endpoint contains `*`, `::`, `ipc://` or
/// `inproc://`; connect otherwise.
pub fn should_bind(endpoint: &str) -> bool {
    ["*", "::", "ipc://", "inproc://"].iter().any(|p| endpoint.contains(p))
}

/// Rewrites an endpoint into one the `zeromq` crate can bind: a `*` host
/// (every interface, as libzmq reads it) becomes `0.0.0.0`. Other endpoints
/// are returned unchanged.
pub fn bindable_endpoint(endpoint: &str) -> String {
    match endpoint.strip_prefix("tcp://*:") {
        Some(port) => format!("tcp://0.0.0.0:{port}"),
        None => endpoint.to_owned(),
    }
}

/// An endpoint a local client can connect to for a bound endpoint: the
/// wildcard hosts `0.0.0.0` and `::` become the loopback address.
pub fn loopback_endpoint(bound: &str) -> String {
    if let Some(port) = bound.strip_prefix("tcp://0.0.0.0:") {
        format!("tcp://127.0.0.1:{port}")
    } else if let Some(port) = bound.strip_prefix("tcp://[::]:") {
        format!("tcp://[::1]:{port}")
    } else {
        bound.to_owned()
    }
}

/// Whether the replay replies of `layout` carry the topic frame: vLLM 0.11
/// answers `[seq, payload]` and ends with `[-1, b""]`; 0.26 and later (and
/// the map-batch layout of newer main) answer `[topic, seq, payload]` and end
/// with `[b"", -1, b""]`.
pub fn replay_has_topic(layout: Layout) -> bool {
    !matches!(layout, Layout::V0_11)
}

/// Whether the `drop_rate` fault withholds batch `seq` from PUB. A pure
/// function of `(seed, seq)`, so that runs are reproducible and tests can
/// predict which batches a subscriber will miss.
pub fn drop_decision(seed: u64, rate: f64, seq: u64) -> bool {
    if rate <= 0.0 {
        return false;
    }
    // SplitMix64 of (seed, seq); the top 53 bits as a uniform in [0, 1).
    let mut z = seed.wrapping_add(seq.wrapping_add(1).wrapping_mul(0x9e37_79b9_7f4a_7c15));
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    let unit = (z >> 11) as f64 / (1u64 << 53) as f64;
    unit < rate
}

/// What [`Publisher::publish_payload`] did with one batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Published {
    /// The seq it was given.
    pub seq: u64,
    /// Whether the `drop_rate` fault withheld it from PUB.
    pub dropped: bool,
}

struct State {
    next_seq: u64,
    buffer: VecDeque<(u64, Bytes)>,
    /// `None` once shut down: later batches are numbered but not sent.
    pub_tx: Option<mpsc::Sender<ZmqMessage>>,
}

struct Shared {
    state: Mutex<State>,
    metrics: Arc<PublisherMetrics>,
    topic: Bytes,
    layout: Layout,
    buffer_steps: usize,
    replay: bool,
    drop_rate: f64,
    drop_seed: u64,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave the state torn (every
        // update is a push or a counter), so a poisoned lock is still usable.
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Every buffered batch with seq ≥ `start`.
    fn snapshot_from(&self, start: u64) -> Vec<(u64, Bytes)> {
        let state = self.lock();
        state.buffer.iter().filter(|(s, _)| *s >= start).cloned().collect()
    }
}

/// A running publisher; cheap to share behind an `Arc`.
pub struct Publisher {
    shared: Arc<Shared>,
    local: LocalEndpoints,
    shutdown_tx: watch::Sender<bool>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
}

impl std::fmt::Debug for Publisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Publisher")
            .field("local", &self.local)
            .field("layout", &self.shared.layout)
            .field("metrics", &self.shared.metrics)
            .finish_non_exhaustive()
    }
}

impl Publisher {
    /// Binds (or connects) the sockets and starts their tasks, with fresh
    /// counters. Must be called inside a tokio runtime.
    pub async fn start(config: PublisherConfig) -> Result<Publisher, PublisherError> {
        Self::start_with_metrics(config, Arc::new(PublisherMetrics::default())).await
    }

    /// As [`Publisher::start`], counting into `metrics`.
    pub async fn start_with_metrics(
        config: PublisherConfig,
        metrics: Arc<PublisherMetrics>,
    ) -> Result<Publisher, PublisherError> {
        if config.buffer_steps == 0 {
            return Err(PublisherError::Config("buffer_steps must be at least 1".into()));
        }
        if !(0.0..=1.0).contains(&config.drop_rate) {
            return Err(PublisherError::Config(format!(
                "drop_rate must be in [0, 1], not {}",
                config.drop_rate
            )));
        }
        if config.hwm == 0 {
            return Err(PublisherError::Config("hwm must be at least 1".into()));
        }
        let (shutdown_tx, shutdown_rx) = watch::channel(false);
        let mut tasks = Vec::new();

        // PUB socket.
        let bind = config.force_bind || should_bind(&config.endpoint);
        let target =
            if bind { bindable_endpoint(&config.endpoint) } else { config.endpoint.clone() };
        if let Err(e) = target.parse::<Endpoint>() {
            return Err(PublisherError::Endpoint {
                endpoint: config.endpoint.clone(),
                error: e.to_string(),
            });
        }
        let mut pub_socket = PubSocket::new();
        let events = if bind {
            pub_socket
                .bind(&target)
                .await
                .map_err(|e| bind_error(&config.endpoint, &e))?
                .to_string()
        } else {
            config.endpoint.clone()
        };

        // Replay ROUTER, always bound.
        let mut router = None;
        let mut replay = None;
        if let Some(endpoint) = &config.replay_endpoint {
            let target = bindable_endpoint(endpoint);
            let mut socket = RouterSocket::new();
            let bound =
                socket.bind(&target).await.map_err(|e| bind_error(endpoint, &e))?.to_string();
            replay = Some(bound);
            router = Some(socket);
        }

        let (pub_tx, pub_rx) = mpsc::channel(config.hwm);
        let shared = Arc::new(Shared {
            state: Mutex::new(State { next_seq: 0, buffer: VecDeque::new(), pub_tx: Some(pub_tx) }),
            metrics,
            topic: Bytes::from(config.topic.clone().into_bytes()),
            layout: config.layout,
            buffer_steps: config.buffer_steps,
            replay: router.is_some(),
            drop_rate: config.drop_rate,
            drop_seed: config.drop_seed,
        });

        let connect_to = (!bind).then_some(target);
        tasks.push(tokio::spawn(pub_task(pub_socket, connect_to, pub_rx, shutdown_rx.clone())));
        if let Some(router) = router {
            tasks.push(tokio::spawn(replay_task(
                router,
                Arc::clone(&shared),
                config.replay_send_timeout,
                config.replay_delay,
                shutdown_rx,
            )));
        }
        let local = LocalEndpoints { events, events_bound: bind, replay };
        tracing::info!(events = %local.events, bound = bind, replay = ?local.replay, layout = config.layout.name(), "kv events publisher started");
        Ok(Publisher { shared, local, shutdown_tx, tasks: Mutex::new(tasks) })
    }

    /// The endpoints as bound (port 0 resolved).
    pub fn local_endpoints(&self) -> &LocalEndpoints {
        &self.local
    }

    /// The counters.
    pub fn metrics(&self) -> &Arc<PublisherMetrics> {
        &self.shared.metrics
    }

    /// The layout batches are encoded in.
    pub fn layout(&self) -> Layout {
        self.shared.layout
    }

    /// The seq the next batch will get.
    pub fn next_seq(&self) -> u64 {
        self.shared.lock().next_seq
    }

    /// Encodes `batch` in the configured layout and publishes it; returns
    /// its seq. Never blocks on subscribers or replay clients.
    pub fn publish(&self, batch: &Batch) -> u64 {
        self.publish_payload(Bytes::from(encode_batch(batch, self.shared.layout))).seq
    }

    /// Publishes an already encoded payload (or a malformed one, for tests).
    pub fn publish_payload(&self, payload: Bytes) -> Published {
        let shared = &*self.shared;
        let mut state = shared.lock();
        let seq = state.next_seq;
        state.next_seq += 1;
        let dropped = drop_decision(shared.drop_seed, shared.drop_rate, seq);
        if shared.replay {
            if state.buffer.len() >= shared.buffer_steps {
                state.buffer.pop_front();
            }
            state.buffer.push_back((seq, payload.clone()));
        }
        PublisherMetrics::inc(&shared.metrics.published, 1);
        if dropped {
            PublisherMetrics::inc(&shared.metrics.dropped, 1);
        } else if let Some(tx) = &state.pub_tx {
            let mut msg = ZmqMessage::from(shared.topic.clone());
            msg.push_back(Bytes::copy_from_slice(&seq.to_be_bytes()));
            msg.push_back(payload);
            // Sent under the lock so that PUB order is seq order.
            if tx.try_send(msg).is_err() {
                PublisherMetrics::inc(&shared.metrics.hwm_dropped, 1);
            }
        }
        Published { seq, dropped }
    }

    /// Stops the socket tasks and closes the sockets (what is already queued
    /// for PUB is flushed first). Later `publish` calls still number their
    /// batches but send nothing. Idempotent.
    pub async fn shutdown(&self) {
        // Closing the channel lets the PUB task drain what is queued, then exit.
        drop(self.shared.lock().pub_tx.take());
        let _ = self.shutdown_tx.send(true);
        let tasks = std::mem::take(
            &mut *self.tasks.lock().unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        for task in tasks {
            if let Err(e) = task.await {
                tracing::warn!(error = %e, "kv events publisher task failed");
            }
        }
    }
}

impl Drop for Publisher {
    fn drop(&mut self) {
        let _ = self.shutdown_tx.send(true);
    }
}

fn bind_error(endpoint: &str, e: &zeromq::ZmqError) -> PublisherError {
    match e {
        zeromq::ZmqError::Endpoint(err) => {
            PublisherError::Endpoint { endpoint: endpoint.to_owned(), error: err.to_string() }
        }
        other => PublisherError::Bind { endpoint: endpoint.to_owned(), error: other.to_string() },
    }
}

/// Owns the PUB socket: sends what `publish` queued, and in connect mode
/// (re)connects with backoff.
async fn pub_task(
    mut socket: PubSocket,
    connect_to: Option<String>,
    mut rx: mpsc::Receiver<ZmqMessage>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut monitor = socket.monitor();
    // In connect mode: whether a connection is wanted now.
    let mut need_connect = connect_to.is_some();
    let mut delay = Duration::from_millis(100);
    loop {
        if need_connect {
            if let Some(endpoint) = &connect_to {
                let attempt = tokio::select! {
                    r = socket.connect(endpoint) => r,
                    _ = shutdown.changed() => break,
                };
                match attempt {
                    Ok(()) => {
                        need_connect = false;
                        delay = Duration::from_millis(100);
                    }
                    Err(e) => {
                        tracing::warn!(endpoint = %endpoint, error = %e, retry_in = ?delay, "kv events publisher: connect failed");
                        // Drop what arrives meanwhile, as a PUB without peers does.
                        let sleep = tokio::time::sleep(delay);
                        tokio::pin!(sleep);
                        loop {
                            tokio::select! {
                                () = &mut sleep => break,
                                m = rx.recv() => if m.is_none() { return close_pub(socket).await },
                                _ = shutdown.changed() => return close_pub(socket).await,
                            }
                        }
                        delay = (delay * 2).min(Duration::from_secs(5));
                        continue;
                    }
                }
            }
        }
        tokio::select! {
            biased;
            m = rx.recv() => match m {
                Some(msg) => {
                    // Never blocks: the socket drops for peers whose queue is full.
                    if let Err(e) = socket.send(msg).await {
                        tracing::debug!(error = %e, "kv events publisher: send failed");
                    }
                }
                // Shut down: everything queued was sent.
                None => break,
            },
            ev = monitor.next() => match ev {
                Some(SocketEvent::Disconnected(_)) if connect_to.is_some() => need_connect = true,
                Some(_) => {}
                None => monitor = socket.monitor(),
            },
            _ = shutdown.changed() => {
                // Flush what was queued before the shutdown.
                while let Ok(msg) = rx.try_recv() {
                    let _ = socket.send(msg).await;
                }
                break;
            }
        }
    }
    close_pub(socket).await;
}

async fn close_pub(socket: PubSocket) {
    for e in socket.close().await {
        tracing::debug!(error = %e, "kv events publisher: close");
    }
}

/// Serves replay requests; each reply runs on its own task so that a slow
/// client delays nobody else.
async fn replay_task(
    socket: RouterSocket,
    shared: Arc<Shared>,
    send_timeout: Duration,
    delay: Duration,
    mut shutdown: watch::Receiver<bool>,
) {
    let (send, mut recv) = socket.split();
    let mut replies = tokio::task::JoinSet::new();
    loop {
        let msg = tokio::select! {
            m = recv.recv() => m,
            _ = shutdown.changed() => break,
            // Reap finished replies so the set stays small.
            Some(_) = replies.join_next(), if !replies.is_empty() => continue,
        };
        let frames = match msg {
            Ok(m) => m.into_vec(),
            Err(e) => {
                tracing::warn!(error = %e, "kv events replay: receive failed");
                continue;
            }
        };
        let start = match frames.as_slice() {
            [_identity, _delimiter, start] => match parse_seq(start) {
                Ok(seq) => seq,
                Err(e) => {
                    PublisherMetrics::inc(&shared.metrics.bad_replay_requests, 1);
                    tracing::warn!(error = %e, "kv events replay: ignoring request with a bad start seq");
                    continue;
                }
            },
            _ => {
                PublisherMetrics::inc(&shared.metrics.bad_replay_requests, 1);
                tracing::warn!(
                    frames = frames.len(),
                    "kv events replay: ignoring request that is not [identity, b\"\", start_seq]"
                );
                continue;
            }
        };
        let identity = frames[0].clone();
        PublisherMetrics::inc(&shared.metrics.replay_requests, 1);
        let shared = Arc::clone(&shared);
        let mut send = send.clone();
        replies.spawn(async move {
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            // Read the buffer when answering, as vLLM's publisher thread
            // does when it gets to the request: a delayed reply carries the
            // batches published (and already sent live) while it waited.
            let batches = shared.snapshot_from(start);
            let count = batches.len() as u64;
            let reply = async {
                for (seq, payload) in batches {
                    let msg = replay_message(&identity, &shared, seq, payload);
                    send.send(msg).await?;
                }
                send.send(replay_message(&identity, &shared, END_SEQ, Bytes::new())).await
            };
            match tokio::time::timeout(send_timeout, reply).await {
                Ok(Ok(())) => PublisherMetrics::inc(&shared.metrics.replayed_batches, count),
                Ok(Err(e)) => tracing::warn!(start, error = %e, "kv events replay: reply failed"),
                Err(_) => {
                    tracing::warn!(start, "kv events replay: client too slow, reply abandoned")
                }
            }
        });
    }
    replies.shutdown().await;
}

/// One replay reply in the layout's frame shape; `seq == END_SEQ` with an
/// empty payload is the end marker (whose topic frame is empty).
fn replay_message(identity: &Bytes, shared: &Shared, seq: u64, payload: Bytes) -> ZmqMessage {
    let mut msg = ZmqMessage::from(identity.clone());
    msg.push_back(Bytes::new());
    if replay_has_topic(shared.layout) {
        msg.push_back(if seq == END_SEQ { Bytes::new() } else { shared.topic.clone() });
    }
    msg.push_back(Bytes::copy_from_slice(&seq.to_be_bytes()));
    msg.push_back(payload);
    msg
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn publisher_can_be_shared_across_tasks() {
        fn send_sync<T: Send + Sync + 'static>() {}
        send_sync::<Publisher>();
        send_sync::<PublisherMetrics>();
    }

    #[test]
    fn bind_rule_is_vllms() {
        assert!(should_bind("tcp://*:5557"));
        assert!(should_bind("tcp://[::]:5557"));
        assert!(should_bind("ipc:///tmp/kv"));
        assert!(should_bind("inproc://kv"));
        assert!(!should_bind("tcp://127.0.0.1:5557"));
        assert!(!should_bind("tcp://router.internal:5557"));
    }

    #[test]
    fn star_becomes_every_ipv4_interface() {
        assert_eq!(bindable_endpoint("tcp://*:5557"), "tcp://0.0.0.0:5557");
        assert_eq!(bindable_endpoint("tcp://127.0.0.1:0"), "tcp://127.0.0.1:0");
        assert!(bindable_endpoint("tcp://*:0").parse::<Endpoint>().is_ok());
        assert_eq!(loopback_endpoint("tcp://0.0.0.0:41"), "tcp://127.0.0.1:41");
        assert_eq!(loopback_endpoint("tcp://[::]:41"), "tcp://[::1]:41");
    }

    #[test]
    fn drop_decisions_are_reproducible_and_near_the_rate() {
        let a: Vec<bool> = (0..10_000).map(|s| drop_decision(7, 0.25, s)).collect();
        let b: Vec<bool> = (0..10_000).map(|s| drop_decision(7, 0.25, s)).collect();
        assert_eq!(a, b);
        let dropped = a.iter().filter(|d| **d).count();
        assert!((2_200..2_800).contains(&dropped), "{dropped}");
        assert!((0..1000).all(|s| !drop_decision(7, 0.0, s)));
        assert!((0..1000).all(|s| drop_decision(7, 1.0, s)));
        let c: Vec<bool> = (0..64).map(|s| drop_decision(8, 0.25, s)).collect();
        assert_ne!(a[..64].to_vec(), c);
    }
}
