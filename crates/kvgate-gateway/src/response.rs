//! The one place a gateway error becomes an HTTP answer: the OpenAI-style
//! body with its status, and `Retry-After` on answers that ask the client
//! to come back.

use std::time::Duration;

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use kvgate_openai::ErrorResponse;

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
