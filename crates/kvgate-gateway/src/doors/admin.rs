//! The admin API, behind the admin key: replica state and the last
//! decisions, and adding, draining and removing replicas at runtime.

use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use kvgate_index::Tier;
use kvgate_openai::ErrorResponse;
use serde::Deserialize;
use serde_json::json;

use crate::config::{GatewayConfig, ReplicaConfig};
use crate::observe::decision_json::recent_decisions_json;
use crate::replicas::fleet_view::FleetView;
use crate::replicas::registry::Registry;
use crate::request::response::error_response;

/// What the admin handlers use: the fleet's snapshot and decision log to
/// read, the registry to change the replicas with, and the running config
/// that a replica added at runtime is validated against.
#[derive(Debug)]
pub(crate) struct AdminContext {
    pub(crate) view: Arc<FleetView>,
    pub(crate) registry: Arc<Registry>,
    pub(crate) config: GatewayConfig,
}

type S = State<Arc<AdminContext>>;

/// `GET /admin/replicas`: the fleet snapshot.
pub(crate) async fn replicas(State(s): S) -> Response {
    Json(s.view.snapshot(Instant::now())).into_response()
}

#[derive(Debug, Deserialize)]
pub(crate) struct DecisionsQuery {
    limit: Option<usize>,
}

/// `GET /admin/decisions?limit=N`: the last decisions, newest first.
pub(crate) async fn decisions(State(s): S, Query(q): Query<DecisionsQuery>) -> Response {
    let limit = q.limit.unwrap_or(50).min(10_000);
    let out = recent_decisions_json(&s.view, limit, Instant::now());
    Json(json!({"decisions": out})).into_response()
}

/// `POST /admin/replicas` with a replica's config as JSON.
pub(crate) async fn add_replica(State(s): S, body: Bytes) -> Response {
    let cfg: ReplicaConfig = match serde_json::from_slice(&body) {
        Ok(c) => c,
        Err(e) => {
            return error_response(&ErrorResponse::invalid_request(format!("invalid replica: {e}")))
        }
    };
    let mut check = s.config.clone();
    check.replicas = vec![cfg.clone()];
    if let Err(e) = check.validate() {
        return error_response(&ErrorResponse::invalid_request(e.to_string()));
    }
    match s.registry.add_ranks(cfg) {
        Ok(added) => {
            let names: Vec<&str> = added.iter().map(|r| r.name.as_str()).collect();
            let body = match names.as_slice() {
                [one] => json!({"added": one}),
                many => json!({"added": many}),
            };
            (StatusCode::CREATED, Json(body)).into_response()
        }
        Err(e) => error_response(&ErrorResponse::with_status(409, e)),
    }
}

fn find(
    s: &AdminContext,
    name: &str,
) -> Result<Arc<crate::replicas::replica::Replica>, Box<Response>> {
    s.registry.by_name(name).ok_or_else(|| {
        Box::new(error_response(&ErrorResponse::not_found(format!("no replica named {name:?}"))))
    })
}

/// `POST /admin/replicas/{name}/drain`.
pub(crate) async fn drain_replica(State(s): S, Path(name): Path<String>) -> Response {
    match find(&s, &name) {
        Ok(r) => {
            s.registry.drain(&r);
            Json(json!({"draining": r.name})).into_response()
        }
        Err(resp) => *resp,
    }
}

/// `GET /admin/replicas/{name}/blocks`: the engine hashes kvgate's index
/// holds for the replica, per tier (folded to u64 like `BlockHash::fold_u64`),
/// to check the view against the engine's own contents.
pub(crate) async fn replica_blocks(State(s): S, Path(name): Path<String>) -> Response {
    let r = match find(&s, &name) {
        Ok(r) => r,
        Err(resp) => return *resp,
    };
    let [gpu, cpu, storage] = s.view.fleet.with(|f| {
        [Tier::Gpu, Tier::Cpu, Tier::Storage]
            .map(|t| f.index().engine_hashes(r.id, t).unwrap_or_default())
    });
    let body = json!({
        "replica": r.name,
        "gpu": gpu,
        "cpu": cpu,
        "storage": storage,
    });
    Json(body).into_response()
}

/// `DELETE /admin/replicas/{name}`.
pub(crate) async fn remove_replica(State(s): S, Path(name): Path<String>) -> Response {
    match find(&s, &name) {
        Ok(r) => {
            s.registry.remove(&r);
            Json(json!({"removed": r.name})).into_response()
        }
        Err(resp) => *resp,
    }
}
