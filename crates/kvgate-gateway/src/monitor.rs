//! Watching each replica: `GET /health` and `GET /metrics` on an interval.
//! Metrics feed the router (load, KV usage, capacity, reconciliation) and
//! check the configured block size; failed probes take a replica out of
//! rotation, and after `purge_after_ms` out of rotation its index entries are
//! purged. When it answers again it comes back (degraded while its view is
//! rebuilt if it was purged).

use std::sync::Arc;
use std::time::{Duration, Instant};

use kvgate_router::EngineReport;

use crate::locks::{lock, write};
use crate::scrape::{parse_rank_metrics, EngineScrape};
use crate::state::{Replica, Shared};

/// Probes `replica` until it is stopped.
pub(crate) async fn run(shared: Arc<Shared>, replica: Arc<Replica>) {
    let m = &shared.config.monitor;
    let mut tick = tokio::time::interval(Duration::from_millis(
        m.health_interval_ms.min(m.metrics_interval_ms),
    ));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut stop = replica.stop.subscribe();
    let mut adapters_at: Option<Instant> = None;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = async { let _ = stop.wait_for(|v| *v).await; } => return,
        }
        probe_once(&shared, &replica).await;
        let up = lock(&replica.status).probe_ok;
        if up && adapters_at.is_none_or(|at| at.elapsed() >= ADAPTER_REFRESH) {
            refresh_adapters(&shared, &replica).await;
            adapters_at = Some(Instant::now());
        }
    }
}

/// How often the engine's `/v1/models` is read for LoRA adapters (vLLM can
/// load and unload them at run time).
pub(crate) const ADAPTER_REFRESH: Duration = Duration::from_secs(10);

/// Reads the engine's LoRA adapters from `/v1/models`: vLLM lists each one
/// as a card whose `parent` is the base model. A failed or odd answer keeps
/// the last list (the probe reports the replica's health).
async fn refresh_adapters(shared: &Shared, replica: &Replica) {
    let timeout = Duration::from_millis(shared.config.monitor.probe_timeout_ms);
    let Ok(text) = get(shared, replica, "/v1/models", timeout).await else { return };
    let Ok(list) = serde_json::from_str::<kvgate_openai::ModelList>(&text) else {
        tracing::debug!(replica = %replica.name, "/v1/models is not a model list");
        return;
    };
    let adapters: Vec<String> =
        list.data.into_iter().filter(|card| card.parent.is_some()).map(|card| card.id).collect();
    let mut status = lock(&replica.status);
    if status.adapters != adapters {
        tracing::info!(replica = %replica.name, ?adapters, "LoRA adapters listed by the engine");
        status.adapters = adapters;
    }
}

/// One probe: `/health`, then `/metrics`.
pub(crate) async fn probe_once(shared: &Shared, replica: &Replica) {
    let timeout = Duration::from_millis(shared.config.monitor.probe_timeout_ms);
    let mut health = get(shared, replica, "/health", timeout).await;
    if matches!(&health, Err(Probe { unreachable: false, .. })) {
        // A kept-alive connection to a process that just died fails
        // without a connect error; one fresh attempt tells a dead engine
        // (refused: out of rotation at once) from a failing one.
        health = get(shared, replica, "/health", timeout).await;
    }
    let now = Instant::now();
    match health {
        Ok(_) => {
            let metrics = get(shared, replica, "/metrics", timeout).await;
            let rank = replica.config.dp_rank;
            let scrape = metrics.map_err(|p| p.error).and_then(|t| parse_rank_metrics(&t, rank));
            on_success(shared, replica, scrape, now);
        }
        // Nothing listens (refused, unreachable): out of rotation at once,
        // as a refused request does; other failures count toward
        // `unhealthy_after`.
        Err(Probe { error, unreachable: true }) => {
            shared.mark_down(replica, error, now);
            purge_if_long_down(shared, replica, now);
        }
        Err(Probe { error, unreachable: false }) => {
            shared.note_failure(replica, error, now);
            purge_if_long_down(shared, replica, now);
        }
    }
}

/// A failed probe.
struct Probe {
    error: String,
    /// The connection itself failed.
    unreachable: bool,
}

async fn get(
    shared: &Shared,
    replica: &Replica,
    path: &str,
    timeout: Duration,
) -> Result<String, Probe> {
    let mut req = shared.client.get(format!("{}{path}", replica.base)).timeout(timeout);
    if let Some(k) = &replica.config.api_key {
        req = req.bearer_auth(k);
    }
    let failed = |e: reqwest::Error| Probe {
        unreachable: e.is_connect(),
        error: format!("GET {path}: {e}"),
    };
    let resp = req.send().await.map_err(failed)?;
    if !resp.status().is_success() {
        return Err(Probe {
            error: format!("GET {path}: HTTP {}", resp.status()),
            unreachable: false,
        });
    }
    resp.text().await.map_err(failed)
}

fn on_success(
    shared: &Shared,
    replica: &Replica,
    scrape: Result<EngineScrape, String>,
    now: Instant,
) {
    let rebuild = Duration::from_millis(shared.config.monitor.rebuild_ms);
    {
        let mut s = lock(&replica.status);
        if !s.probe_ok {
            tracing::info!(replica = %replica.name, "replica in rotation");
            if s.purged {
                s.degraded = Some(("view purged while down; rebuilding".into(), now + rebuild));
                s.purged = false;
            }
        }
        s.probe_ok = true;
        s.ever_seen = true;
        s.failures = 0;
        s.down_since = None;
        match &scrape {
            Ok(e) => {
                if let Some(bs) = e.block_size.filter(|&b| b != replica.config.block_size) {
                    let p = format!(
                        "engine reports block_size {bs} but kvgate is configured with {}",
                        replica.config.block_size
                    );
                    s.problem(&replica.name, p);
                }
                s.engine = Some(e.clone());
            }
            Err(err) => s.last_error = Some(err.clone()),
        }
    }
    shared.sync_health(replica, now);
    if let Ok(e) = scrape {
        let report = EngineReport {
            running: e.running,
            waiting: e.waiting,
            kv_usage: e.kv_usage,
            prefix_cache_queries: e.prefix_queries,
            prefix_cache_hits: e.prefix_hits,
            timing: e.timing,
            at: now,
        };
        let resized = {
            let mut router = lock(&shared.router);
            let mut resized = None;
            if let (Some(cap), Some((info, _))) = (e.num_gpu_blocks, router.replica(replica.id)) {
                let cpu = e.num_cpu_blocks.unwrap_or(0);
                if info.capacity_blocks[0] != cap || info.capacity_blocks[1] != cpu {
                    let mut info = info.clone();
                    info.capacity_blocks[0] = cap;
                    info.capacity_blocks[1] = cpu;
                    let _ = router.update_info(replica.id, info);
                    resized = Some((cap, cpu));
                }
            }
            let _ = router.report(replica.id, report);
            resized
        };
        // The index's memory bound follows the engine's real size (taken
        // after the router's lock: registration locks the index first). A
        // CPU tier the engine does not report (0: offloading connectors
        // count their blocks elsewhere) keeps the configured bound.
        if let Some((gpu, cpu)) = resized {
            let bound = shared.config.limits.index_blocks_per_tier;
            let cpu = if cpu > 0 { cpu } else { bound };
            let dropped = write(&shared.index)
                .set_capacity(replica.id, [Some(gpu), Some(cpu), Some(bound)])
                .unwrap_or(0);
            if dropped > 0 {
                tracing::warn!(replica = %replica.name, dropped, capacity = gpu, "the index held more blocks than the engine can; the oldest were dropped");
            }
        }
    }
}

/// Purges the index entries of a replica out of rotation for too long: its
/// cache is probably gone (a crash), and stale entries would attract traffic
/// when it returns.
fn purge_if_long_down(shared: &Shared, replica: &Replica, now: Instant) {
    let purge_after = Duration::from_millis(shared.config.monitor.purge_after_ms);
    let due = {
        let s = lock(&replica.status);
        !s.purged && s.down_since.is_some_and(|t| now.saturating_duration_since(t) >= purge_after)
    };
    if due {
        // Stepwise: upkeep finishes it (a million blocks must not stall
        // routing behind the write lock).
        let n = write(&shared.index).begin_clear(replica.id).unwrap_or(0);
        lock(&replica.status).purged = true;
        tracing::warn!(replica = %replica.name, blocks = n, "purged the index entries of a replica out of rotation");
    }
}
