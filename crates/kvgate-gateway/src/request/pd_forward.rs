//! Forwarding a request of a disaggregated pool (`[disagg]`,
//! docs/routing.md "Prefill/decode disaggregation"), as vLLM 0.33's NIXL
//! connector expects over HTTP (docs/pd-protocol.md):
//!
//! 1. placement (`placement.rs`, through the admission queue like any
//!    request) asks the pool's planner: serve it whole on a decode replica
//!    (the bypass) or on a prefill replica (`disagg.whole_on_prefill`), sent
//!    as any request; or split it, and `forward.rs`'s loop runs the hops
//!    here;
//! 2. the prefill hop: the request's body (with the prompt's token ids)
//!    plus `kv_transfer_params: {do_remote_decode: true, ...}`,
//!    `max_tokens: 1`, not streamed, without `stream_options`,
//!    `min_tokens` and `min_completion_tokens` (vLLM refuses
//!    `min_tokens > max_tokens`). A prefill replica that fails (connection,
//!    5xx, timeout, or no `kv_transfer_params` in its answer) is handed back
//!    to `forward.rs`'s loop, which reports it, and the request is placed
//!    again without it; once `limits.max_retries` replicas have failed it,
//!    it is served whole;
//! 3. the decode hop: the client's request unchanged but for
//!    `kv_transfer_params`, which is exactly what the prefill answered (plus
//!    `prompt_token_ids` for chat, where kvgate hands vLLM the ids), sent
//!    at once (the prefill side holds the blocks only for its lease). It
//!    streams to the client through the relay. If it fails before any byte
//!    reached the client, the loop reports the replica and places the
//!    request again whole, elsewhere, without the stale parameters.
//!
//! Every hop holds its booking: the prefill hop's ends with its answer, the
//! decode hop's moves with its first token as any request's does.

use std::sync::Arc;

use axum::http::{header, HeaderValue};
use bytes::Bytes;
use kvgate_index::ReplicaId;
use kvgate_openai::ErrorResponse;
use kvgate_router::{Outcome, Routed};
use serde_json::{json, Map, Value};

use crate::clock;
use crate::replicas::replica::Replica;
use crate::request::booking::HeldBooking;
use crate::request::engine_client::EngineResponse;
use crate::request::forwarder::{read_capped, send_body, Forwarder};
use crate::request::placement::Attempts;
use crate::request::prepare::Prepared;
use crate::request::request_error::{Reason, RequestError};
use crate::request::route::Route;

/// Largest prefill answer read, bytes (one token and its parameters).
const MAX_PREFILL_ANSWER: usize = 4 << 20;

/// A split request whose decode hop answered: relay it.
pub(crate) struct Decoded {
    pub(crate) replica: Arc<Replica>,
    pub(crate) routed: Routed,
    pub(crate) booking: HeldBooking,
    pub(crate) resp: EngineResponse,
}

/// A hop's replica that failed, handed back to `forward.rs`'s loop, which
/// reports it to the fleet (once, from the error).
pub(crate) struct Failed {
    pub(crate) replica: ReplicaId,
    pub(crate) error: RequestError,
    /// The decode hop failed: its error is the request's last failure (the
    /// answer if no replica is left to serve it whole).
    pub(crate) last: bool,
}

/// Runs a split request's hops: `prefill`'s, then `decode`'s with the
/// parameters the prefill answered. `Err`: place it again, as `attempts`
/// now says (without a failed replica; whole after a refused request, a
/// failed decode hop, or `limits.max_retries` failed prefill replicas),
/// with the replica that failed, if one did, for the loop to report.
pub(crate) async fn hops(
    fwd: &Forwarder,
    p: &Prepared,
    fwd_headers: &[(header::HeaderName, HeaderValue)],
    prefill: Routed,
    decode: Routed,
    attempts: &mut Attempts,
) -> Result<Decoded, Option<Failed>> {
    let decode_booking = HeldBooking::new(Arc::clone(&fwd.fleet), decode.booking);
    let params = match prefill_hop(fwd, p, fwd_headers, prefill).await {
        Ok(params) => params,
        Err(HopFailure::Replica(replica, error)) => {
            // Placed again without the failed prefill replica.
            decode_booking.finish(Outcome::Cancelled);
            attempts.exclude.push(replica);
            if attempts.tried() > fwd.limits.max_retries as usize {
                fwd.metrics.disagg_plan("prefill_fallback");
                attempts.split = false;
            }
            return Err(error.map(|error| Failed { replica, error: *error, last: false }));
        }
        Err(HopFailure::Request) => {
            // The request itself was refused (a 4xx, or a body no hop can
            // be made of): served whole, its answer reaches the client.
            decode_booking.finish(Outcome::Cancelled);
            attempts.split = false;
            return Err(None);
        }
    };
    fwd.metrics.disagg_plan("split");
    attempts.split = false;
    let Some(replica) = fwd.replicas.get(decode.replica) else {
        // Removed between the decision and now.
        decode_booking.finish(Outcome::Error);
        attempts.exclude.push(decode.replica);
        return Err(None);
    };
    let body = decode_body(p, &replica, params);
    match send_body(fwd, p, &replica, fwd_headers, body).await {
        Ok(resp) => Ok(Decoded { replica, routed: decode, booking: decode_booking, resp }),
        Err(error) => {
            decode_booking.finish(Outcome::Error);
            let message = &error.body.error.message;
            tracing::warn!(replica = %replica.name, error = %message, "decode hop failed; serving the request whole");
            fwd.metrics.count(error.reason);
            attempts.exclude.push(replica.id);
            fwd.metrics.disagg_plan("decode_fallback");
            Err(Some(Failed { replica: replica.id, error, last: true }))
        }
    }
}

/// Why a prefill hop gave no parameters.
enum HopFailure {
    /// Plan again without this replica: it failed (the error, for the loop
    /// to report), or it was removed (none).
    Replica(ReplicaId, Option<Box<RequestError>>),
    /// The request was refused (the engine's 4xx, or a body that is not a
    /// JSON object): no replica would take it.
    Request,
}

/// Runs the prefill hop on the planned replica; its `kv_transfer_params`.
async fn prefill_hop(
    fwd: &Forwarder,
    p: &Prepared,
    fwd_headers: &[(header::HeaderName, HeaderValue)],
    prefill: Routed,
) -> Result<Map<String, Value>, HopFailure> {
    let booking = HeldBooking::new(Arc::clone(&fwd.fleet), prefill.booking);
    let Some(replica) = fwd.replicas.get(prefill.replica) else {
        booking.finish(Outcome::Error);
        return Err(HopFailure::Replica(prefill.replica, None));
    };
    let fail = |error: RequestError| {
        let why = &error.body.error.message;
        tracing::warn!(replica = %replica.name, error = %why, "prefill hop failed; planning again");
        Err(HopFailure::Replica(replica.id, Some(Box::new(error))))
    };
    let Some(body) = prefill_body(&p.body_for(&replica.config)) else {
        // The request's problem, not the replica's (which was never sent
        // anything): no hop can be made of it, so it goes whole.
        booking.finish(Outcome::Cancelled);
        tracing::debug!(replica = %replica.name, "the request body is not a JSON object; serving it whole");
        return Err(HopFailure::Request);
    };
    let resp = match send_body(fwd, p, &replica, fwd_headers, body).await {
        Ok(r) => r,
        Err(e) => {
            booking.finish(Outcome::Error);
            fwd.metrics.count(e.reason);
            return fail(e);
        }
    };
    let status = resp.status;
    if (400..500).contains(&status) {
        booking.finish(Outcome::Error);
        return Err(HopFailure::Request);
    }
    let answer = read_capped(resp.body, MAX_PREFILL_ANSWER).await;
    let params = match (status, &answer) {
        (200..=299, Ok(bytes)) => serde_json::from_slice::<Value>(bytes)
            .ok()
            .and_then(|v| v.get("kv_transfer_params").and_then(Value::as_object).cloned()),
        _ => None,
    };
    match params {
        Some(params) => {
            // The prefill's one token is its first and last.
            booking.first_token(clock::now());
            booking.finish(Outcome::Finished);
            Ok(params)
        }
        None => {
            booking.finish(Outcome::Error);
            let why = match answer {
                Err(e) => format!("prefill answer unreadable: {e}"),
                Ok(_) if !(200..300).contains(&status) => format!("prefill answered {status}"),
                Ok(_) => "prefill answered without kv_transfer_params (no KV connector?)".into(),
            };
            fail(RequestError::new(Reason::Upstream, ErrorResponse::bad_gateway(why)))
        }
    }
}

/// Whether a request can be split: one prompt (not a batch of them) and
/// one choice (`n` 1), as vLLM transfers one prompt's KV per request.
pub(crate) fn splittable(body: &Bytes) -> bool {
    let Ok(v) = serde_json::from_slice::<Value>(body) else { return false };
    let batch = match v.get("prompt") {
        Some(Value::Array(a)) => a.first().is_some_and(|x| !x.is_number()),
        _ => false,
    };
    let n = v.get("n").and_then(Value::as_u64).unwrap_or(1);
    !batch && n <= 1
}

/// The prefill hop's body: `body` (an OpenAI request object) asking for
/// remote decode, one token, not streamed. `None` if `body` is not a JSON
/// object.
pub(crate) fn prefill_body(body: &Bytes) -> Option<Bytes> {
    let mut v: Value = serde_json::from_slice(body).ok()?;
    let o = v.as_object_mut()?;
    let mut params =
        o.get("kv_transfer_params").and_then(Value::as_object).cloned().unwrap_or_default();
    params.insert("do_remote_decode".into(), json!(true));
    params.insert("do_remote_prefill".into(), json!(false));
    for k in ["remote_engine_id", "remote_block_ids", "remote_host", "remote_port"] {
        params.insert(k.into(), Value::Null);
    }
    o.insert("kv_transfer_params".into(), Value::Object(params));
    o.insert("max_tokens".into(), json!(1));
    if o.contains_key("max_completion_tokens") {
        o.insert("max_completion_tokens".into(), json!(1));
    }
    o.insert("stream".into(), json!(false));
    for k in ["stream_options", "min_tokens", "min_completion_tokens"] {
        o.remove(k);
    }
    serde_json::to_vec(&v).ok().map(Bytes::from)
}

/// The decode hop's body: what the replica would get for the whole request,
/// with `kv_transfer_params` replaced by the prefill's answer, verbatim,
/// plus the prompt's token ids for chat and Messages when kvgate hands them
/// over there.
pub(crate) fn decode_body(p: &Prepared, replica: &Replica, params: Map<String, Value>) -> Bytes {
    let base = p.body_for(&replica.config);
    let Ok(mut v) = serde_json::from_slice::<Value>(&base) else { return base };
    let Some(o) = v.as_object_mut() else { return base };
    let ids = match p.route {
        Route::Chat | Route::Messages | Route::Responses => {
            o.get("kv_transfer_params").and_then(|k| k.get("prompt_token_ids")).cloned()
        }
        _ => None,
    };
    let mut params = params;
    if let Some(ids) = ids {
        params.insert("prompt_token_ids".into(), ids);
    }
    o.insert("kv_transfer_params".into(), Value::Object(params));
    serde_json::to_vec(&v).map(Bytes::from).unwrap_or(base)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_prefill_body_asks_for_one_unstreamed_token_and_remote_decode() {
        let body = Bytes::from_static(
            br#"{"model":"m","prompt":[1,2,3],"max_tokens":50,"min_tokens":10,"stream":true,
                 "stream_options":{"include_usage":true},"max_completion_tokens":50,
                 "kv_transfer_params":{"prompt_token_ids":[1,2,3]}}"#,
        );
        let v: Value = serde_json::from_slice(&prefill_body(&body).unwrap()).unwrap();
        assert_eq!(v["max_tokens"], json!(1));
        assert_eq!(v["max_completion_tokens"], json!(1));
        assert_eq!(v["stream"], json!(false));
        assert!(v.get("stream_options").is_none() && v.get("min_tokens").is_none());
        let k = &v["kv_transfer_params"];
        assert_eq!(k["do_remote_decode"], json!(true));
        assert_eq!(k["do_remote_prefill"], json!(false));
        assert_eq!(k["remote_engine_id"], Value::Null);
        // What kvgate put there for the engine stays.
        assert_eq!(k["prompt_token_ids"], json!([1, 2, 3]));
        assert_eq!(v["prompt"], json!([1, 2, 3]));
        assert!(prefill_body(&Bytes::from_static(b"[1]")).is_none());
        assert!(prefill_body(&Bytes::from_static(b"nope")).is_none());
    }

    #[test]
    fn batches_and_several_choices_are_not_split() {
        let ok = |b: &'static [u8]| splittable(&Bytes::from_static(b));
        assert!(ok(br#"{"prompt":[1,2,3]}"#));
        assert!(ok(br#"{"prompt":"text"}"#));
        assert!(ok(br#"{"messages":[{"role":"user","content":"hi"}],"n":1}"#));
        assert!(!ok(br#"{"prompt":[[1,2],[3]]}"#));
        assert!(!ok(br#"{"prompt":["a","b"]}"#));
        assert!(!ok(br#"{"prompt":[1],"n":2}"#));
    }
}
