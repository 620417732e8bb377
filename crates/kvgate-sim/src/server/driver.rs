//! The engine driver: one tokio task per replica owns an [`Engine`], takes
//! requests from a channel, steps the engine in (sped-up) real time, routes
//! each output token to its request and publishes each step's KV events as
//! one batch.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use kvgate_events::publisher::Publisher;
use kvgate_events::{Batch, BlockHash};
use rustc_hash::FxHashMap;
use tokio::sync::{mpsc, oneshot};

use crate::engine::{Engine, RequestId, TokenOutput};
use crate::error::SimError;
use crate::server::metrics::Metrics;

/// One request as the HTTP layer hands it to the driver.
#[derive(Debug)]
pub(crate) struct NewRequest {
    pub(crate) id: RequestId,
    pub(crate) prompt: Vec<u32>,
    pub(crate) max_tokens: u32,
    pub(crate) min_tokens: u32,
    pub(crate) ignore_eos: bool,
    /// Every output token of this request, in order.
    pub(crate) tokens: mpsc::UnboundedSender<TokenOutput>,
    /// Whether the engine accepted it.
    pub(crate) accepted: oneshot::Sender<Result<(), SimError>>,
}

/// What the driver is asked to do.
#[derive(Debug)]
pub(crate) enum Command {
    Add(NewRequest),
    Abort(RequestId),
    ResetPrefixCache(oneshot::Sender<bool>),
    /// The engine's true cache contents: (GPU hashes, CPU-tier hashes).
    CachedBlocks(oneshot::Sender<(Vec<BlockHash>, Vec<BlockHash>)>),
}

struct Live {
    tokens: mpsc::UnboundedSender<TokenOutput>,
    arrival: Duration,
    /// When the previous token came out (virtual time), for inter-token latency.
    last_token: Option<Duration>,
}

/// Runs until every command sender is dropped.
pub(crate) async fn run(
    mut engine: Engine,
    mut rx: mpsc::UnboundedReceiver<Command>,
    speedup: f64,
    publisher: Option<Arc<Publisher>>,
    metrics: Arc<Metrics>,
) {
    let start = Instant::now();
    let virtual_now = |start: Instant| start.elapsed().mul_f64(speedup);
    let mut live: FxHashMap<RequestId, Live> = FxHashMap::default();
    metrics.set_stats(engine.stats());
    loop {
        if !engine.has_work() {
            let Some(cmd) = rx.recv().await else { return };
            handle(&mut engine, &mut live, cmd, virtual_now(start), &publisher, &metrics);
        }
        while let Ok(cmd) = rx.try_recv() {
            handle(&mut engine, &mut live, cmd, virtual_now(start), &publisher, &metrics);
        }
        if !engine.has_work() {
            metrics.set_stats(engine.stats());
            continue;
        }
        let now = virtual_now(start);
        let out = engine.step(now);
        let real = out.duration.div_f64(speedup);
        if real.is_zero() {
            tokio::task::yield_now().await;
        } else {
            tokio::time::sleep(real).await;
        }
        let done = now + out.duration;
        publish(&publisher, out.events);
        for t in out.tokens {
            let finished = t.finished.is_some();
            if let Some(l) = live.get_mut(&t.request_id) {
                match l.last_token {
                    _ if t.is_first => {
                        metrics.observe_ttft(done.saturating_sub(l.arrival).as_secs_f64());
                    }
                    Some(prev) => metrics.observe_itl(done.saturating_sub(prev).as_secs_f64()),
                    None => {}
                }
                l.last_token = Some(done);
                // A closed receiver means the client left; the abort command
                // follows on the channel.
                let _ = l.tokens.send(t.clone());
            }
            if finished {
                live.remove(&t.request_id);
            }
        }
        metrics.set_stats(engine.stats());
    }
}

fn handle(
    engine: &mut Engine,
    live: &mut FxHashMap<RequestId, Live>,
    cmd: Command,
    now: Duration,
    publisher: &Option<Arc<Publisher>>,
    metrics: &Metrics,
) {
    match cmd {
        Command::Add(r) => {
            let res =
                engine.add_request(r.id, r.prompt, r.max_tokens, r.min_tokens, r.ignore_eos, now);
            if res.is_ok() {
                live.insert(r.id, Live { tokens: r.tokens, arrival: now, last_token: None });
            }
            let _ = r.accepted.send(res);
        }
        Command::Abort(id) => {
            if live.remove(&id).is_some() {
                engine.abort(id);
            }
        }
        Command::CachedBlocks(reply) => {
            let _ = reply.send((engine.gpu_cached_hashes(), engine.cpu_cached_hashes()));
        }
        Command::ResetPrefixCache(reply) => {
            let ok = engine.reset_prefix_cache();
            if ok {
                // Flush the queued `AllBlocksCleared` now rather than with
                // the next request's first step.
                let out = engine.step(now);
                publish(publisher, out.events);
                metrics.set_stats(engine.stats());
            }
            let _ = reply.send(ok);
        }
    }
}

fn publish(publisher: &Option<Arc<Publisher>>, events: Vec<kvgate_events::Event>) {
    let Some(publisher) = publisher else { return };
    if events.is_empty() {
        return;
    }
    let ts = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64());
    publisher.publish(&Batch { ts, events, dp_rank: None, skipped_events: 0 });
}
