//! The one place a gateway error becomes an HTTP answer: the OpenAI-style
//! body with its status, and `Retry-After` on answers that ask the client
//! to come back; [`answer`] also counts it.

use std::time::Duration;

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use kvgate_openai::ErrorResponse;

use crate::metrics::Metrics;
use crate::request_error::{Family, RequestError};

/// The answer to a request on `route` (a generation route's label) that
/// ends in `e`, counted: `kvgate_requests_total{route,status,replica}`
/// always, and a refusal's reason in `kvgate_rejected_total` (retries and
/// broken streams are counted where they happen, as each one may not end
/// the request).
pub(crate) fn answer(
    metrics: &Metrics,
    route: &'static str,
    replica: &str,
    e: &RequestError,
) -> Response {
    metrics.request(route, e.status(), replica);
    // Debug only: under overload every shed request ends here, and engine
    // failures were logged (warn) where they happened.
    let (reason, status, message) = (e.reason.label(), e.status(), &e.body.error.message);
    let source = e.reason.source().label();
    tracing::debug!(route, replica, reason, source, status, %message, "request not served");
    if e.reason.family() == Family::Rejected {
        metrics.count(e.reason);
    }
    let r = error_response(&e.body);
    match e.retry_after {
        Some(after) => with_retry_after(r, after),
        None => r,
    }
}

/// The status and OpenAI-style JSON body of `e`.
pub(crate) fn error_response(e: &ErrorResponse) -> Response {
    let status = StatusCode::from_u16(e.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (status, [(header::CONTENT_TYPE, "application/json")], e.to_vec()).into_response()
}

/// `r` with `Retry-After: after` (whole seconds, at least 1).
pub(crate) fn with_retry_after(mut r: Response, after: Duration) -> Response {
    let secs = after.as_secs_f64().ceil().max(1.0) as u64;
    if let Ok(v) = HeaderValue::from_str(&secs.to_string()) {
        r.headers_mut().insert(header::RETRY_AFTER, v);
    }
    r
}
