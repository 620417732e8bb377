//! W3C trace context on the request path: a request's span continues the
//! client's `traceparent` and `tracestate`, and every hop to an engine
//! carries the context of the span that sends it, so that the client's span,
//! kvgate's and the engine's own (vLLM reads these headers when started with
//! `--otlp-traces-endpoint`) form one trace.
//!
//! The propagator is the process's global one, which the binary sets to the
//! W3C one when it exports traces. Without export there is no OpenTelemetry
//! context on kvgate's spans: the client's headers then reach the engine as
//! they came (`auth::forwarded`), and the trace id is still read from them
//! for the logs.

use axum::http::{HeaderMap, HeaderName, HeaderValue};
use opentelemetry::propagation::{Extractor, Injector};
use opentelemetry::trace::TraceContextExt;
use tracing_opentelemetry::OpenTelemetrySpanExt;

const TRACEPARENT: &str = "traceparent";
const TRACESTATE: &str = "tracestate";

struct Incoming<'a>(&'a HeaderMap);

impl Extractor for Incoming<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(HeaderName::as_str).collect()
    }
}

struct Outgoing<'a>(&'a mut Vec<(HeaderName, HeaderValue)>);

impl Injector for Outgoing<'_> {
    fn set(&mut self, key: &str, value: String) {
        let (Ok(name), Ok(value)) = (HeaderName::try_from(key), HeaderValue::try_from(value))
        else {
            return;
        };
        self.0.retain(|(n, _)| *n != name);
        self.0.push((name, value));
    }
}

/// A generation request's span, for both front doors (`door`: `serve`, or
/// `epp` for an endpoint pick): the decision and the answer's fields are
/// recorded on it as they become known.
pub(crate) fn request_span(door: &'static str, route: &'static str) -> tracing::Span {
    use tracing::field::Empty;
    tracing::info_span!(
        "request",
        door,
        route,
        trace_id = Empty,
        prompt_tokens = Empty,
        stream = Empty,
        replica = Empty,
        cached_blocks = Empty,
        predicted_ttft_s = Empty,
        reason = Empty,
        candidates = Empty,
        runner_up_ttft_s = Empty,
        ttft_s = Empty,
        outcome = Empty,
        error = Empty,
    )
}

/// Makes `span` a child of the client's span (when the client sent a valid
/// `traceparent` and traces are exported) and records the trace id on it
/// as `trace_id`, for every log line inside the request.
pub(crate) fn continue_from(span: &tracing::Span, headers: &HeaderMap) {
    let parent = opentelemetry::global::get_text_map_propagator(|p| p.extract(&Incoming(headers)));
    if parent.span().span_context().is_valid() {
        // An error here only means kvgate's spans are not exported.
        let _ = span.set_parent(parent);
    }
    let ours = span.context().span().span_context().clone();
    if ours.is_valid() {
        span.record("trace_id", tracing::field::display(ours.trace_id()));
    } else if let Some(id) = headers.get(TRACEPARENT).and_then(|v| trace_id_of(v.to_str().ok()?)) {
        span.record("trace_id", id);
    }
}

/// Puts the context of the current span into `headers` (an engine hop's),
/// in place of the client's, when kvgate's spans carry one.
pub(crate) fn inject_current(headers: &mut Vec<(HeaderName, HeaderValue)>) {
    let cx = tracing::Span::current().context();
    if !cx.span().span_context().is_valid() {
        return;
    }
    // The client's tracestate belongs to the client's span, not ours.
    headers.retain(|(n, _)| n.as_str() != TRACESTATE);
    opentelemetry::global::get_text_map_propagator(|p| {
        p.inject_context(&cx, &mut Outgoing(headers))
    });
}

/// The W3C headers naming `span` as the parent, when it carries an
/// exported context (the endpoint picker sets them on the request Envoy
/// sends on).
pub(crate) fn headers_for(span: &tracing::Span) -> Vec<(HeaderName, HeaderValue)> {
    let cx = span.context();
    let mut out = Vec::new();
    if cx.span().span_context().is_valid() {
        opentelemetry::global::get_text_map_propagator(|p| {
            p.inject_context(&cx, &mut Outgoing(&mut out));
        });
    }
    out
}

/// The trace id of a W3C `traceparent` (`00-<32 hex>-<16 hex>-<2 hex>`),
/// if it is well formed and not all zeros.
fn trace_id_of(traceparent: &str) -> Option<&str> {
    let mut parts = traceparent.trim().split('-');
    let (version, trace, parent, flags) =
        (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    let hex = |s: &str, n: usize| {
        s.len() == n && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    };
    let valid = hex(version, 2)
        && version != "ff"
        && hex(trace, 32)
        && hex(parent, 16)
        && hex(flags, 2)
        && trace.bytes().any(|b| b != b'0')
        && parent.bytes().any(|b| b != b'0');
    valid.then_some(trace)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trace_ids_only_from_well_formed_traceparents() {
        let good = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        assert_eq!(trace_id_of(good), Some("4bf92f3577b34da6a3ce929d0e0e4736"));
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
        ] {
            assert_eq!(trace_id_of(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn without_an_exported_span_the_clients_headers_stay() {
        let mut h = vec![(
            HeaderName::from_static(TRACEPARENT),
            HeaderValue::from_static("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
        )];
        let before = h.clone();
        inject_current(&mut h);
        assert_eq!(h, before);
    }
}
