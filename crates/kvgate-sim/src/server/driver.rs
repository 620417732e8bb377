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
use crate::hash::CacheIdentity;
use crate::request_stats::Tracker;
use crate::server::metrics::Metrics;

/// One request as the HTTP layer hands it to the driver.
#[derive(Debug)]
pub(crate) struct NewRequest {
    pub(crate) id: RequestId,
    pub(crate) prompt: Vec<u32>,
    pub(crate) max_tokens: u32,
    pub(crate) min_tokens: u32,
    pub(crate) ignore_eos: bool,
    /// LoRA adapter and cache salt.
    pub(crate) identity: CacheIdentity,
    /// Every output token of this request, in order.
    pub(crate) tokens: mpsc::UnboundedSender<TokenOutput>,
    /// Whether the engine accepted it.
    pub(crate) accepted: oneshot::Sender<Result<(), SimError>>,
    /// Its part in a disaggregated request.
    pub(crate) hop: Hop,
}

/// A request's part in prefill/decode disaggregation (`kv_transfer.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Hop {
    /// A whole request.
    Whole,
    /// A prefill hop: its blocks stay held after it finishes.
    Prefill,
    /// A decode hop: its prompt's KV was received; only the last token is
    /// computed.
    Decode,
}

/// What the driver is asked to do.
#[derive(Debug)]
pub(crate) enum Command {
    Add(NewRequest),
    Abort(RequestId),
    ResetPrefixCache(oneshot::Sender<bool>),
    /// The engine's true cache contents: (GPU hashes, CPU-tier hashes).
    CachedBlocks(oneshot::Sender<(Vec<BlockHash>, Vec<BlockHash>)>),
    /// A runtime-loaded adapter takes a GPU slot (its load time was waited
    /// for by the HTTP layer); answered when done.
    LoadLora(String, oneshot::Sender<()>),
    /// An unloaded adapter frees its slot.
    UnloadLora(String, oneshot::Sender<()>),
    /// Prompt tokens of these tokens (under this identity) cached now.
    PrefixHit(Vec<u32>, CacheIdentity, oneshot::Sender<usize>),
    /// A finished prefill hop's lease ended: free its held blocks.
    ReleaseHeld(RequestId),
}

/// Where a live request's tokens go.
struct Live {
    tokens: mpsc::UnboundedSender<TokenOutput>,
}

/// The driver's request tables: token routes and metric timelines.
#[derive(Default)]
struct Requests {
    live: FxHashMap<RequestId, Live>,
    stats: Tracker,
}

/// The most a step may start late, in real time, and still follow the last
/// one without a gap: a few of the timer's millisecond ticks.
const MAX_TIMER_LAG: Duration = Duration::from_millis(5);

/// Runs until every command sender is dropped.
pub(crate) async fn run(
    mut engine: Engine,
    mut rx: mpsc::UnboundedReceiver<Command>,
    speedup: f64,
    publisher: Option<Arc<Publisher>>,
    dp_rank: Option<u32>,
    metrics: Arc<Metrics>,
) {
    let publisher = publisher.map(|p| RankPublisher { publisher: p, dp_rank });
    let start = Instant::now();
    let virtual_now = |start: Instant| start.elapsed().mul_f64(speedup);
    let mut reqs = Requests { live: FxHashMap::default(), stats: Tracker::with_speedup(speedup) };
    report(&engine, &metrics);
    let mut last_end: Option<Duration> = None;
    let max_lag = MAX_TIMER_LAG.mul_f64(speedup);
    loop {
        if !engine.has_work() {
            let Some(cmd) = rx.recv().await else { return };
            handle(&mut engine, &mut reqs, cmd, virtual_now(start), &publisher, &metrics);
        }
        while let Ok(cmd) = rx.try_recv() {
            handle(&mut engine, &mut reqs, cmd, virtual_now(start), &publisher, &metrics);
        }
        if !engine.has_work() {
            report(&engine, &metrics);
            continue;
        }
        // While busy, steps run back to back on the model's clock: the next
        // one starts where the last one ended, and each waits for an absolute
        // deadline. Sleeping for each step's duration instead adds the
        // timer's lateness (tokio rounds up to a millisecond) to every step:
        // at --speedup 4 that is up to 4 ms of model time on 5 ms decode
        // steps, an engine much slower than its timing model. Only a lag
        // beyond the timer's (the process was not scheduled) is lost as idle
        // time, as it would be on a real machine.
        let real_now = virtual_now(start);
        let now = match last_end {
            Some(end) if real_now.saturating_sub(end) <= max_lag => end,
            _ => real_now,
        };
        let out = engine.step(now);
        let end = now + out.duration;
        if out.duration.is_zero() {
            tokio::task::yield_now().await;
        } else {
            tokio::time::sleep_until((start + end.div_f64(speedup)).into()).await;
        }
        last_end = engine.has_work().then_some(end);
        let record = reqs.stats.step(now, &out);
        publish(&publisher, out.events);
        // Metrics before tokens: a client that has its last token can
        // scrape its request's observations.
        metrics.record(&record);
        report(&engine, &metrics);
        for t in out.tokens {
            let finished = t.finished.is_some();
            if let Some(l) = reqs.live.get(&t.request_id) {
                // A closed receiver means the client left; the abort command
                // follows on the channel.
                let _ = l.tokens.send(t.clone());
            }
            if finished {
                reqs.live.remove(&t.request_id);
            }
        }
    }
}

fn handle(
    engine: &mut Engine,
    reqs: &mut Requests,
    cmd: Command,
    now: Duration,
    publisher: &Option<RankPublisher>,
    metrics: &Metrics,
) {
    match cmd {
        Command::Add(r) => {
            let prompt_len = r.prompt.len();
            let res =
                engine.add_request(r.id, r.prompt, r.max_tokens, r.min_tokens, r.ignore_eos, now);
            let res = match res {
                Ok(()) if !r.identity.is_plain() => engine.set_identity(r.id, r.identity),
                other => other,
            };
            let res = match (res, r.hop) {
                (Ok(()), Hop::Prefill) => engine.set_hold_blocks(r.id),
                (Ok(()), Hop::Decode) => engine.set_remote_kv(r.id),
                (other, _) => other,
            };
            if res.is_err() {
                engine.abort(r.id);
            }
            if res.is_ok() {
                reqs.live.insert(r.id, Live { tokens: r.tokens });
                reqs.stats.add(r.id, prompt_len, now);
            }
            let _ = r.accepted.send(res);
        }
        Command::Abort(id) => {
            if reqs.live.remove(&id).is_some() {
                reqs.stats.abort(id);
                engine.abort(id);
            }
        }
        Command::CachedBlocks(reply) => {
            let _ = reply.send((engine.gpu_cached_hashes(), engine.cpu_cached_hashes()));
        }
        Command::LoadLora(name, reply) => {
            engine.load_lora(&name);
            report(engine, metrics);
            let _ = reply.send(());
        }
        Command::UnloadLora(name, reply) => {
            engine.unload_lora(&name);
            report(engine, metrics);
            let _ = reply.send(());
        }
        Command::PrefixHit(tokens, identity, reply) => {
            let _ = reply.send(engine.prefix_hit_tokens(&tokens, &identity));
        }
        Command::ReleaseHeld(id) => {
            engine.release_held(id);
            report(engine, metrics);
        }
        Command::ResetPrefixCache(reply) => {
            let ok = engine.reset_prefix_cache();
            if ok {
                // Flush the queued `AllBlocksCleared` now rather than with
                // the next request's first step.
                let out = engine.step(now);
                publish(publisher, out.events);
                report(engine, metrics);
            }
            let _ = reply.send(ok);
        }
    }
}

/// Hands the engine's counters to `/metrics`, and with LoRA on its running
/// and waiting adapters (for `vllm:lora_requests_info`, stamped now).
pub(crate) fn report(engine: &Engine, metrics: &Metrics) {
    metrics.set_stats(engine.stats());
    if metrics.lora_enabled() {
        let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64());
        metrics.set_loras(&engine.running_loras(), &engine.waiting_loras(), now);
    }
}

/// A rank's publisher and the rank its batches carry.
struct RankPublisher {
    publisher: Arc<Publisher>,
    dp_rank: Option<u32>,
}

fn publish(publisher: &Option<RankPublisher>, events: Vec<kvgate_events::Event>) {
    let Some(p) = publisher else { return };
    if events.is_empty() {
        return;
    }
    let ts = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64());
    p.publisher.publish(&Batch { ts, events, dp_rank: p.dp_rank, skipped_events: 0 });
}
