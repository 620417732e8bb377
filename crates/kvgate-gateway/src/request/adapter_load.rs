//! Loading a LoRA adapter that no replica of its pool serves, through
//! vLLM's runtime API (`POST /v1/load_lora_adapter`, which vLLM mounts when
//! `VLLM_ALLOW_RUNTIME_LORA_UPDATING` is set), for the adapters a pool
//! declares loadable (`model.loadable_adapters`, `NAME=PATH`).
//!
//! At most one load per pool and adapter runs at a time: a request arriving
//! while one is under way waits for it and then finds the adapter served.
//! The replica is the healthy one with the fewest adapters registered (the
//! most room in vLLM's CPU adapter cache and its `max_loras` slots), ties
//! going to the least loaded. Every load and failure is counted per pool.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;

use crate::locks::lock;
use crate::replicas::directory::Directory;
use crate::replicas::fleet_handle::FleetHandle;
use crate::request::engine_client::{EngineClient, EngineRequest};
use kvgate_fleet::PoolId;

/// A pool's runtime-load counters (`kvgate_pool_adapter_runtime_loads_total`).
#[derive(Debug, Default)]
pub(crate) struct LoadCounts {
    pub(crate) loaded: AtomicU64,
    pub(crate) failed: AtomicU64,
}

/// The loads under way, one lock per (pool, adapter).
type InFlight = Mutex<HashMap<(PoolId, String), Arc<tokio::sync::Mutex<()>>>>;

/// What a runtime load needs.
#[derive(Debug)]
pub(crate) struct AdapterLoader {
    pub(crate) engines: Arc<dyn EngineClient>,
    pub(crate) fleet: Arc<FleetHandle>,
    pub(crate) replicas: Arc<Directory>,
    /// How long one load may take.
    pub(crate) timeout: Duration,
    pub(crate) loading: InFlight,
}

impl AdapterLoader {
    /// Makes sure some replica of `pool` serves `name`, loading it from
    /// `path` on one replica if none does. `Err` says why it could not be
    /// loaded (counted in `counts`).
    pub(crate) async fn ensure(
        &self,
        pool: PoolId,
        name: &str,
        path: &str,
        counts: &LoadCounts,
    ) -> Result<(), String> {
        let gate = {
            let mut loading = lock(&self.loading);
            Arc::clone(loading.entry((pool, name.to_owned())).or_default())
        };
        let _turn = gate.lock().await;
        // Loaded meanwhile (by the load this request waited for).
        if self.fleet.adapter_pool(name) == Some(pool) {
            return Ok(());
        }
        let result = self.load_once(pool, name, path).await;
        match &result {
            Ok(replica) => {
                counts.loaded.fetch_add(1, Ordering::Relaxed);
                tracing::info!(%replica, adapter = name, "LoRA adapter loaded at runtime");
            }
            Err(e) => {
                counts.failed.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(adapter = name, error = %e, "LoRA adapter runtime load failed");
            }
        }
        result.map(|_| ())
    }

    async fn load_once(&self, pool: PoolId, name: &str, path: &str) -> Result<String, String> {
        let now = crate::clock::now();
        let Some(id) = self.fleet.load_target(pool, now) else {
            return Err("no healthy replica in the pool to load it on".into());
        };
        let Some(replica) = self.replicas.get(id) else {
            return Err("the chosen replica was removed".into());
        };
        let url = axum::http::Uri::try_from(format!("{}/v1/load_lora_adapter", replica.base))
            .map_err(|e| e.to_string())?;
        let body = serde_json::json!({ "lora_name": name, "lora_path": path }).to_string();
        let req = EngineRequest {
            url,
            body: Bytes::from(body),
            headers: Vec::new(),
            bearer: replica.config.api_key.clone(),
        };
        let sent = tokio::time::timeout(self.timeout, self.engines.post(req)).await;
        let resp = match sent {
            Err(_) => return Err(format!("{}: no answer within {:?}", replica.name, self.timeout)),
            Ok(Err(e)) => return Err(format!("{}: {e}", replica.name)),
            Ok(Ok(r)) => r,
        };
        // vLLM answers 200 on success; "already loaded" is a 400, which
        // also means the replica has it.
        let status = resp.status;
        let text = read_short(resp.body).await;
        if status == 200 || (status == 400 && text.contains("already been loaded")) {
            self.fleet.add_adapter(id, name);
            return Ok(replica.name.clone());
        }
        Err(format!("{} answered {status}: {}", replica.name, text.trim()))
    }
}

/// The first kilobytes of an answer, for an error message.
async fn read_short(mut body: crate::request::engine_client::BodyStream) -> String {
    use futures_util::StreamExt;
    let mut out = Vec::new();
    while let Some(Ok(chunk)) = body.next().await {
        out.extend_from_slice(&chunk[..chunk.len().min(4096 - out.len())]);
        if out.len() >= 4096 {
            break;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}
