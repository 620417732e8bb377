//! Watching each replica: `GET /health` and `GET /metrics` on an interval,
//! and `GET /v1/models` for its adapters. What the probes find goes to the
//! fleet core (`fleet.rs`), which applies the health rules: metrics feed the
//! router (load, KV usage, capacity, reconciliation) and check the
//! configured block size; failed probes take a replica out of rotation.

use std::sync::Arc;
use std::time::Duration;

use crate::config::settings::ProbeTiming;
use crate::replicas::fleet_handle::FleetHandle;
use crate::replicas::replica::Replica;
use crate::replicas::scrape::parse_rank_metrics;
use crate::request::engine_client::{EngineClient, SendError};
use kvgate_fleet::Failure;

/// What a monitor needs: the engines to probe, the fleet to tell, and how
/// often and how patiently to ask.
#[derive(Clone, Debug)]
pub(crate) struct Prober {
    pub(crate) engines: Arc<dyn EngineClient>,
    pub(crate) fleet: Arc<FleetHandle>,
    pub(crate) timing: ProbeTiming,
    /// The model the replica's pool serves: an engine whose `/v1/models`
    /// does not list it is reported (it would answer 404).
    pub(crate) model: String,
}

/// Probes `replica` until it is stopped.
pub(crate) async fn run(prober: Prober, replica: Arc<Replica>) {
    let mut tick = tokio::time::interval(prober.timing.every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut stop = replica.stop.subscribe();
    let mut adapters_at: Option<tokio::time::Instant> = None;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = async { let _ = stop.wait_for(|v| *v).await; } => return,
        }
        probe_once(&prober, &replica).await;
        let up = prober.fleet.with(|f| f.status(replica.id).is_some_and(|s| s.probe_ok));
        if up && adapters_at.is_none_or(|at| at.elapsed() >= ADAPTER_REFRESH) {
            refresh_adapters(&prober, &replica).await;
            adapters_at = Some(tokio::time::Instant::now());
        }
    }
}

/// How often the engine's `/v1/models` is read for LoRA adapters (vLLM can
/// load and unload them at run time).
pub(crate) const ADAPTER_REFRESH: Duration = Duration::from_secs(10);

/// Reads the engine's LoRA adapters from `/v1/models`: vLLM lists each one
/// as a card whose `parent` is the base model. A failed or odd answer keeps
/// the last list (the probe reports the replica's health).
async fn refresh_adapters(prober: &Prober, replica: &Replica) {
    let timeout = prober.timing.timeout;
    let Ok(text) = get(prober, replica, "/v1/models", timeout).await else { return };
    let Ok(list) = serde_json::from_str::<kvgate_openai::ModelList>(&text) else {
        tracing::debug!(replica = %replica.name, "/v1/models is not a model list");
        return;
    };
    let serves = list.data.iter().any(|c| c.parent.is_none() && c.id == prober.model);
    let adapters: Vec<String> =
        list.data.into_iter().filter(|card| card.parent.is_some()).map(|card| card.id).collect();
    prober.fleet.with(|f| {
        f.set_adapters(replica.id, adapters);
        if !serves {
            let p = format!(
                "its /v1/models does not list {:?}, the model of its pool (check the pool or \
                 the engine's --served-model-name)",
                prober.model
            );
            f.problem(replica.id, p);
        }
    });
}

/// One probe: `/health`, then `/metrics`.
async fn probe_once(prober: &Prober, replica: &Replica) {
    let timeout = prober.timing.timeout;
    let mut health = get(prober, replica, "/health", timeout).await;
    if matches!(&health, Err(Probe { unreachable: false, .. })) {
        // A kept-alive connection to a process that just died fails
        // without a connect error; one fresh attempt tells a dead engine
        // (refused: out of rotation at once) from a failing one.
        health = get(prober, replica, "/health", timeout).await;
    }
    let now = crate::clock::now();
    match health {
        Ok(_) => {
            let metrics = get(prober, replica, "/metrics", timeout).await;
            let rank = replica.config.dp_rank;
            let scrape = metrics.map_err(|p| p.error).and_then(|t| parse_rank_metrics(&t, rank));
            prober.fleet.with(|f| f.probe_succeeded(replica.id, scrape, now));
        }
        // Nothing listens (refused, unreachable): out of rotation at once,
        // as a refused request does; other failures count toward
        // `unhealthy_after`.
        Err(Probe { error, unreachable }) => {
            let failure = if unreachable { Failure::Unreachable } else { Failure::Error };
            prober.fleet.failed(replica.id, error, failure, now);
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
    prober: &Prober,
    replica: &Replica,
    path: &str,
    timeout: Duration,
) -> Result<String, Probe> {
    let url = format!("{}{path}", replica.base);
    let bearer = replica.config.api_key.clone();
    prober.engines.get(url, bearer, timeout).await.map_err(|e| Probe {
        unreachable: matches!(e, SendError::Unreachable(_)),
        error: format!("GET {path}: {e}"),
    })
}
