//! The client-facing handlers besides generation: models, tokenize,
//! detokenize, Anthropic's count_tokens, health, readiness and metrics; and
//! the generation entry points that prepare a request and hand it to
//! `forward`.

use std::sync::Arc;
use std::time::Instant;
use tracing::Instrument;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use kvgate_openai::ErrorResponse;
use serde_json::{json, Value};

use tokio::sync::watch;

use crate::doors::shed::Admitted;
use crate::observe::metrics::Metrics;
use crate::replicas::fleet_handle::FleetHandle;
use crate::replicas::fleet_view::FleetView;
use crate::replicas::pool::Pools;
use crate::request::forward::{forward, Forwarder};
use crate::request::prepare::{self, Preparer};
use crate::request::request_error::{Reason, RequestError};
use crate::request::response::{answer, error_response, error_response_in};
use crate::request::route::{Api, Route};

/// What the client-facing handlers use, built once by the wiring: the
/// request path's stages (`preparer`, `forwarder`), the shutdown flag for
/// readiness (shedding is the layer in `shed.rs`), the pools (models and
/// tokenizers for `/v1/models` and `/tokenize`), the fleet for readiness
/// and adapters, and the snapshot and metrics for `/metrics`.
#[derive(Debug)]
pub(crate) struct ApiContext {
    pub(crate) pools: Arc<Pools>,
    /// Set on shutdown: readiness says no.
    pub(crate) closing: watch::Receiver<bool>,
    pub(crate) preparer: Preparer,
    pub(crate) forwarder: Forwarder,
    pub(crate) fleet: Arc<FleetHandle>,
    pub(crate) view: Arc<FleetView>,
    pub(crate) metrics: Arc<Metrics>,
}

type S = State<Arc<ApiContext>>;

pub(crate) fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

pub(crate) async fn chat(State(s): S, a: Admitted, headers: HeaderMap, body: Bytes) -> Response {
    generate(s, Route::Chat, a, headers, body).await
}

pub(crate) async fn completions(
    State(s): S,
    a: Admitted,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    generate(s, Route::Completions, a, headers, body).await
}

/// Anthropic's Messages API, routed like chat (`prepare::messages`).
pub(crate) async fn messages(
    State(s): S,
    a: Admitted,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    generate(s, Route::Messages, a, headers, body).await
}

/// OpenAI's Responses API, routed like chat, or to the replica holding
/// the response it continues (`prepare::responses`).
pub(crate) async fn responses(
    State(s): S,
    a: Admitted,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    generate(s, Route::Responses, a, headers, body).await
}

/// `POST /v1/messages/count_tokens`: answered from kvgate's own renderer
/// and tokenizer, as `/tokenize` is, in vLLM's shape.
pub(crate) async fn count_tokens(State(s): S, body: Bytes) -> Response {
    match prepare::count_tokens(&s.preparer, &body, unix_now()).await {
        Ok(n) => Json(json!({
            "input_tokens": n,
            "context_management": {"original_input_tokens": n},
        }))
        .into_response(),
        Err(e) => error_response_in(Api::Anthropic, &e),
    }
}

/// A generation request the shedding layer admitted (`shed.rs`), holding
/// its in-flight permit until the answer has been streamed out.
async fn generate(
    s: Arc<ApiContext>,
    route: Route,
    Admitted(permit): Admitted,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let t0 = Instant::now();
    // One span per request from its arrival, continuing the client's trace;
    // the decision's fields are filled in by `forward` once made.
    let span = crate::request::trace_context::request_span("serve", route.label(), &headers);
    let traced = crate::request::trace_context::is_traced(&span);
    let request = async move {
        let prepared = async {
            match route {
                Route::Chat => prepare::chat(&s.preparer, body).await,
                Route::Completions => prepare::completions(&s.preparer, body).await,
                Route::Messages => prepare::messages(&s.preparer, body, unix_now()).await,
                Route::Responses => prepare::responses(&s.preparer, body).await,
            }
        };
        let prepared = prepared
            .instrument(crate::request::trace_context::stage_span!(traced, "render_and_tokenize"))
            .await;
        match prepared {
            Ok(p) => {
                let span = tracing::Span::current();
                span.record("prompt_tokens", crate::request::trace_context::int(p.prompt_tokens));
                span.record("stream", p.stream);
                forward(&s.forwarder, p, &headers, permit, t0).await
            }
            Err(e) => answer(&s.metrics, Some(route), "", &RequestError::new(Reason::Invalid, *e)),
        }
    };
    request.instrument(span).await
}

/// Every pool's model (its served name, then its aliases), then each of
/// its LoRA adapters with the model as its parent, as vLLM lists them.
pub(crate) async fn models(State(s): S) -> Json<Value> {
    let created = unix_now();
    let mut data = Vec::new();
    for pool in s.pools.all() {
        let model = &pool.model;
        let card = |id: &str, parent: Option<&str>| {
            json!({
                "id": id,
                "object": "model",
                "created": created,
                "owned_by": "kvgate",
                "root": parent.map_or(model.served_name.as_str(), |_| id),
                "parent": parent,
                "max_model_len": model.max_model_len,
                "permission": [],
            })
        };
        let names = std::iter::once(&model.served_name).chain(&model.aliases);
        data.extend(names.map(|n| card(n, None)));
        // Served ones, then those kvgate would load on first use (a client
        // may name them now).
        let mut adapters = s.fleet.adapters(pool.id, &model.lora_adapters);
        let mut loadable: Vec<&String> =
            pool.loadable.keys().filter(|a| !adapters.contains(a)).collect();
        loadable.sort();
        adapters.extend(loadable.into_iter().cloned());
        data.extend(adapters.iter().map(|a| card(a, Some(&model.served_name))));
    }
    Json(json!({ "object": "list", "data": data }))
}

fn bad(msg: impl Into<String>) -> Response {
    error_response(&ErrorResponse::invalid_request(msg))
}

/// vLLM's `/tokenize`: chat (`messages`) or text (`prompt`), from kvgate's own
/// tokenizer, which renders exactly as the engine does.
pub(crate) async fn tokenize(State(s): S, body: Bytes) -> Response {
    let Ok(value) = serde_json::from_slice::<Value>(&body) else {
        return bad("the body is not valid JSON");
    };
    let pool = match s.pools.resolve(value.get("model").and_then(Value::as_str), &s.fleet) {
        Ok(m) => m.pool,
        Err(e) => return error_response(&e),
    };
    let tokens = pool.tokenizer.encode_tokenize_body(value).await;
    match tokens {
        Ok(tokens) => Json(json!({
            "count": tokens.len(),
            "max_model_len": pool.model.max_model_len,
            "tokens": tokens,
            "token_strs": null,
        }))
        .into_response(),
        Err(e) => bad(e.to_string()),
    }
}

/// vLLM's `/detokenize`.
pub(crate) async fn detokenize(State(s): S, body: Bytes) -> Response {
    let Ok(value) = serde_json::from_slice::<Value>(&body) else {
        return bad("the body is not valid JSON");
    };
    let pool = match s.pools.resolve(value.get("model").and_then(Value::as_str), &s.fleet) {
        Ok(m) => m.pool,
        Err(e) => return error_response(&e),
    };
    match pool.tokenizer.decode_detokenize_body(&value) {
        Ok(prompt) => Json(json!({"prompt": prompt})).into_response(),
        Err(e) => bad(e.to_string()),
    }
}

/// Liveness: the process serves HTTP.
pub(crate) async fn health() -> StatusCode {
    StatusCode::OK
}

/// Readiness: every configured replica has answered a probe at least once,
/// and at least one is in rotation now.
pub(crate) async fn ready(State(s): S) -> Response {
    // A replica with an event stream counts only once its view has been
    // synced: before that, kvgate would route blind to what it caches.
    let r = s.fleet.readiness();
    let ok = r.ready() && !*s.closing.borrow();
    let status = if ok { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    let body = json!({
        "ready": ok,
        "replicas": r.replicas,
        "in_rotation": r.in_rotation,
        "not_seen_yet": r.not_seen,
        "view_not_synced": r.not_synced,
    });
    (status, Json(body)).into_response()
}

/// Prometheus metrics (OpenMetrics text).
pub(crate) async fn metrics(State(s): S) -> Response {
    let snap = s.view.snapshot(Instant::now());
    let text = s.metrics.render(&snap);
    ([(header::CONTENT_TYPE, crate::observe::metrics::CONTENT_TYPE)], text).into_response()
}
