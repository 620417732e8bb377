//! The one place a gateway error becomes an answer: an HTTP response (the
//! proxy) or an ext_proc immediate response (the endpoint picker), each
//! with its status, the body in the route's API's shape (OpenAI's, or
//! Anthropic's for `/v1/messages`), and `Retry-After` on answers that ask
//! the client to come back; [`answer`] and [`immediate`] also count it.

use std::time::Duration;

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use envoy_types::pb::envoy::config::core::v3::{HeaderValue as EnvoyHeader, HeaderValueOption};
use envoy_types::pb::envoy::r#type::v3::HttpStatus;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    processing_response, HeaderMutation, ImmediateResponse, ProcessingResponse,
};
use kvgate_openai::{anthropic, ErrorResponse};

use crate::observe::metrics::Metrics;
use crate::request::request_error::{Family, RequestError};
use crate::request::route::{Api, Route};

/// The metric label of a generation route, `other` for none.
fn label(route: Option<Route>) -> &'static str {
    route.map_or("other", Route::label)
}

fn api(route: Option<Route>) -> Api {
    route.map_or(Api::OpenAi, Route::api)
}

/// The answer to a request on `route` (a generation route; `None` for
/// another path) that ends in `e`, counted:
/// `kvgate_requests_total{route,status,replica}` always, and a refusal's
/// reason in `kvgate_rejected_total` (retries and broken streams are
/// counted where they happen, as each one may not end the request).
pub(crate) fn answer(
    metrics: &Metrics,
    route: Option<Route>,
    replica: &str,
    e: &RequestError,
) -> Response {
    count(metrics, label(route), replica, e);
    // On the request's span (and its exported trace), with its kind.
    tracing::Span::current().record("error", e.reason.label());
    log_cause(replica, e);
    let r = error_response_in(api(route), &e.body);
    match e.retry_after {
        Some(after) => with_retry_after(r, after),
        None => r,
    }
}

/// An error with a cause is logged with the whole chain (the client's
/// answer says only what it may see).
fn log_cause(replica: &str, e: &RequestError) {
    if std::error::Error::source(e).is_some() {
        tracing::debug!(replica, error = %e.chain(), "request failed");
    }
}

/// The endpoint picker's counterpart of [`answer`]: the gateway answers
/// the client itself with `e`'s status, body and `Retry-After`, counted the
/// same way.
pub(crate) fn immediate(
    metrics: &Metrics,
    route: Option<Route>,
    replica: &str,
    e: &RequestError,
) -> ProcessingResponse {
    count(metrics, label(route), replica, e);
    log_cause(replica, e);
    let mut headers = Vec::new();
    if let Some(after) = e.retry_after {
        headers.push(("retry-after", retry_after_secs(after).to_string().into_bytes()));
    }
    immediate_response(e.status(), error_body(api(route), &e.body), &headers)
}

/// An ext_proc immediate response: the gateway answers with `status`,
/// `body` (JSON) and `headers`, and never reaches an engine.
fn immediate_response(
    status: u16,
    body: Vec<u8>,
    headers: &[(&str, Vec<u8>)],
) -> ProcessingResponse {
    let set = |(key, value): (&str, Vec<u8>)| HeaderValueOption {
        header: Some(EnvoyHeader { key: key.to_owned(), value: String::new(), raw_value: value }),
        ..HeaderValueOption::default()
    };
    let mut set_headers = vec![set(("content-type", b"application/json".to_vec()))];
    set_headers.extend(headers.iter().map(|(k, v)| set((k, v.clone()))));
    let r = ImmediateResponse {
        status: Some(HttpStatus { code: i32::from(status) }),
        headers: Some(HeaderMutation { set_headers, remove_headers: Vec::new() }),
        body,
        details: "kvgate_epp".to_owned(),
        ..ImmediateResponse::default()
    };
    ProcessingResponse {
        response: Some(processing_response::Response::ImmediateResponse(r)),
        ..ProcessingResponse::default()
    }
}

/// `e` counted: `kvgate_requests_total{route,status,replica}` always, and a
/// refusal's reason in `kvgate_rejected_total`.
fn count(metrics: &Metrics, route: &'static str, replica: &str, e: &RequestError) {
    metrics.request(route, e.status(), replica);
    // Debug only: under overload every shed request ends here, and engine
    // failures were logged (warn) where they happened.
    let (reason, status, message) = (e.reason.label(), e.status(), &e.body.error.message);
    let source = e.reason.source().label();
    tracing::debug!(route, replica, reason, source, status, %message, "request not served");
    if e.reason.family() == Family::Rejected {
        metrics.count(e.reason);
    }
}

fn retry_after_secs(after: Duration) -> u64 {
    after.as_secs_f64().ceil().max(1.0) as u64
}

/// The status and OpenAI-style JSON body of `e`.
pub(crate) fn error_response(e: &ErrorResponse) -> Response {
    error_response_in(Api::OpenAi, e)
}

/// The status of `e` and its JSON body in `api`'s shape.
pub(crate) fn error_response_in(api: Api, e: &ErrorResponse) -> Response {
    let status = StatusCode::from_u16(e.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (status, [(header::CONTENT_TYPE, "application/json")], error_body(api, e)).into_response()
}

/// `e` as a JSON body in `api`'s shape.
fn error_body(api: Api, e: &ErrorResponse) -> Vec<u8> {
    match api {
        Api::OpenAi | Api::Responses => e.to_vec(),
        Api::Anthropic => anthropic::error_body(e),
    }
}

/// `r` with `Retry-After: after` (whole seconds, at least 1).
pub(crate) fn with_retry_after(mut r: Response, after: Duration) -> Response {
    if let Ok(v) = HeaderValue::from_str(&retry_after_secs(after).to_string()) {
        r.headers_mut().insert(header::RETRY_AFTER, v);
    }
    r
}
