//! The shedding layer in front of a stand-in handler: 503 while shutting
//! down, 429 with `Retry-After` when every permit is held, and an admitted
//! request holding exactly one permit until its handler lets go of it.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::from_fn_with_state;
use axum::routing::post;
use axum::Router;
use tokio::sync::{watch, Semaphore};
use tower::ServiceExt;

use super::{shed, Admitted, Shedding};
use crate::observe::metrics::Metrics;
use crate::observe::snapshot::FleetSnapshot;

/// The handler reports how many permits are left while it holds its own.
async fn handler(State(sem): State<Arc<Semaphore>>, Admitted(_permit): Admitted) -> String {
    sem.available_permits().to_string()
}

fn app(
    closing: bool,
    permits: usize,
) -> (Router, Arc<Semaphore>, Arc<Metrics>, watch::Sender<bool>) {
    let (tx, rx) = watch::channel(closing);
    let sem = Arc::new(Semaphore::new(permits));
    let metrics = Arc::new(Metrics::new());
    let s = Arc::new(Shedding {
        closing: rx,
        inflight: Arc::clone(&sem),
        metrics: Arc::clone(&metrics),
    });
    let app = Router::new()
        .route("/v1/chat/completions", post(handler))
        .layer(from_fn_with_state(s, shed))
        .with_state(Arc::clone(&sem));
    (app, sem, metrics, tx)
}

fn chat() -> Request {
    axum::http::Request::post("/v1/chat/completions").body(Body::empty()).unwrap()
}

async fn text(r: axum::response::Response) -> String {
    let b = axum::body::to_bytes(r.into_body(), 1 << 20).await.unwrap();
    String::from_utf8(b.to_vec()).unwrap()
}

fn counted(metrics: &Metrics, status: u16) -> bool {
    let text = metrics.render(&FleetSnapshot::default());
    let line = format!("route=\"chat\",status=\"{status}\"");
    text.lines()
        .any(|l| l.starts_with("kvgate_requests_total") && l.contains(&line) && l.ends_with(" 1"))
}

#[tokio::test]
async fn an_admitted_request_holds_one_permit_until_its_handler_returns() {
    let (app, sem, _, _tx) = app(false, 3);
    let r = app.oneshot(chat()).await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(text(r).await, "2", "one of three permits held by the handler");
    assert_eq!(sem.available_permits(), 3, "released with the request");
}

#[tokio::test]
async fn during_the_shutdown_grace_new_requests_get_503_and_are_counted() {
    let (app, sem, metrics, tx) = app(false, 3);
    tx.send_replace(true);
    let r = app.oneshot(chat()).await.unwrap();
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(text(r).await.contains("shutting down"));
    assert_eq!(sem.available_permits(), 3, "no permit taken");
    assert!(counted(&metrics, 503));
}

#[tokio::test]
async fn with_every_permit_held_a_request_gets_429_with_retry_after() {
    let (app, sem, metrics, _tx) = app(false, 1);
    let held = Arc::clone(&sem).try_acquire_owned().unwrap();
    let r = app.clone().oneshot(chat()).await.unwrap();
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.headers().get("retry-after").unwrap(), "1");
    assert!(counted(&metrics, 429));
    drop(held);
    assert_eq!(app.oneshot(chat()).await.unwrap().status(), StatusCode::OK);
}

#[tokio::test]
async fn a_handler_without_the_layer_refuses_rather_than_serving_unbounded() {
    let sem = Arc::new(Semaphore::new(1));
    let app = Router::new().route("/v1/chat/completions", post(handler)).with_state(sem);
    let r = app.oneshot(chat()).await.unwrap();
    assert_eq!(r.status(), StatusCode::INTERNAL_SERVER_ERROR);
}
