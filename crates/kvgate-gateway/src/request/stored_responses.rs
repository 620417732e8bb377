//! `GET /v1/responses/{id}` and `POST /v1/responses/{id}/cancel`: a
//! stored response lives only in the engine that made it, so these go to
//! the replica the id names (`affinity.rs`, `conversation.rs`), with the
//! engine's own id, and the answer comes back with the ids rewritten. An
//! id kvgate did not issue, or whose tag does not verify, is vLLM's 404
//! for an unknown response; a replica that cannot serve any more says
//! that the conversation's state is gone. Neither is routed anywhere
//! else. These are reads of state, not generations: no booking, no
//! routing decision.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, RawQuery, State};
use axum::http::{header, Method, StatusCode, Uri};
use axum::response::Response;
use kvgate_openai::responses::{not_found, RESPONSES_PATH};
use kvgate_openai::ErrorResponse;

use crate::doors::api::ApiContext;
use crate::request::conversation;
use crate::request::forwarder::{read_capped, MAX_WHOLE_RESPONSE};
use crate::request::response::{error_response_in, with_retry_after};
use crate::request::route::Api;

/// `GET /v1/responses/{id}` (its query, `starting_after` and `stream`,
/// passed on).
pub(crate) async fn retrieve(
    State(s): State<Arc<ApiContext>>,
    Path(id): Path<String>,
    RawQuery(query): RawQuery,
) -> Response {
    by_id(&s, Method::GET, &id, "", query.as_deref()).await
}

/// `POST /v1/responses/{id}/cancel`.
pub(crate) async fn cancel(State(s): State<Arc<ApiContext>>, Path(id): Path<String>) -> Response {
    by_id(&s, Method::POST, &id, "/cancel", None).await
}

fn refuse(e: &ErrorResponse) -> Response {
    error_response_in(Api::Responses, e)
}

/// Whether an engine id can go into a URL path as it is (vLLM's are
/// `resp_` and hex; anything else is not sent).
fn path_safe(id: &str) -> bool {
    !id.is_empty() && id.bytes().all(|b| b.is_ascii_alphanumeric() || b"_-.".contains(&b))
}

async fn by_id(
    s: &ApiContext,
    method: Method,
    id: &str,
    suffix: &str,
    query: Option<&str>,
) -> Response {
    let fwd = &s.forwarder;
    let owned = match fwd.affinity.resolve(id) {
        Ok(o) if path_safe(&o.engine_id) => o,
        Ok(_) => return refuse(&not_found(id)),
        Err(why) => {
            let mut e = not_found(id);
            e.error.message = format!("{} ({why}).", e.error.message.trim_end_matches('.'));
            return refuse(&e);
        }
    };
    let what = format!("response '{id}'");
    let owner = conversation::owner(&fwd.replicas, &fwd.fleet, &owned.owner, None, &what, true);
    let replica = match owner {
        Ok(r) => r,
        Err(e) => {
            let r = error_response_in(Api::Responses, &e.body);
            return match e.retry_after {
                Some(after) => with_retry_after(r, after),
                None => r,
            };
        }
    };
    let query = query.map_or(String::new(), |q| format!("?{q}"));
    let url = format!("{}{RESPONSES_PATH}/{}{suffix}{query}", replica.base, owned.engine_id);
    let Ok(url) = url.parse::<Uri>() else {
        return refuse(&ErrorResponse::invalid_request("the response id makes no valid URL"));
    };
    let sent = fwd.engines.bodiless(method, url, replica.config.api_key.clone());
    let resp = match tokio::time::timeout(fwd.limits.first_byte, sent).await {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => {
            return refuse(&ErrorResponse::bad_gateway(format!(
                "replica {} holding response '{id}' did not answer: {e}",
                replica.name
            )))
        }
        Err(_) => {
            return refuse(&ErrorResponse::timeout(format!(
                "replica {} holding response '{id}' did not answer in time",
                replica.name
            )))
        }
    };
    // A stored response is already whole; an engine that stops sending it
    // must not hold the client (and this task) for ever.
    let read =
        tokio::time::timeout(fwd.limits.stream_idle, read_capped(resp.body, MAX_WHOLE_RESPONSE));
    let body = match read.await {
        Ok(Ok(b)) => b,
        Ok(Err(e)) => {
            return refuse(&ErrorResponse::bad_gateway(format!(
                "replica {} failed while answering: {e}",
                replica.name
            )))
        }
        Err(_) => {
            return refuse(&ErrorResponse::timeout(format!(
                "replica {} stopped sending response '{id}'",
                replica.name
            )))
        }
    };
    let previous = Some((owned.engine_id, id.to_owned()));
    let body = conversation::rewriter(&fwd.affinity, &replica, previous).body(&body);
    let mut r = Response::new(Body::from(body));
    *r.status_mut() = StatusCode::from_u16(resp.status).unwrap_or(StatusCode::BAD_GATEWAY);
    if let Some(v) = resp.headers.get(header::CONTENT_TYPE) {
        r.headers_mut().insert(header::CONTENT_TYPE, v.clone());
    }
    if fwd.replica_header {
        if let Ok(v) = header::HeaderValue::from_str(&replica.name) {
            r.headers_mut().insert("x-kvgate-replica", v);
        }
    }
    r
}
