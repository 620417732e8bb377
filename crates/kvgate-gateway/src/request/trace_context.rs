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
//!
//! Sampling is decided once, at the request's root, before any span exists
//! ([`set_root_sampler`]): a traced request's spans have the target
//! [`TRACED`], which the exporter's layer takes; an untraced one's have
//! [`UNTRACED`], which it leaves out. The layer's work per span (span data,
//! attribute conversion, context bookkeeping) is most of what tracing costs
//! a request, and the SDK's own sampler runs only after that work is done:
//! an untraced request costs what `tracing` costs at the log level. Every
//! stage span under a request ([`stage_span!`]) follows its request's
//! target, so a traced request's stages are all exported and an untraced
//! one's none.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

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

/// The `tracing` target of a traced request's spans: the exporter's layer
/// takes these.
pub const TRACED: &str = "kvgate_gateway::request";

/// The target of an untraced request's spans (not sampled at its root): the
/// exporter's layer leaves these out, the logs still see them.
pub const UNTRACED: &str = "kvgate_gateway::untraced";

/// Decides at a request's root whether it is traced, given the client's
/// context (empty when it sent none): the process's sampler, set by the
/// binary when it exports traces.
pub type RootSampler = Box<dyn Fn(&opentelemetry::Context) -> bool + Send + Sync>;

static ROOT_SAMPLER: OnceLock<RootSampler> = OnceLock::new();

/// Sets the root sampler, once per process; `false` when one was already
/// set (it stays). Without one, no request is traced: there is no
/// exporter to take its spans.
pub fn set_root_sampler(sampler: RootSampler) -> bool {
    ROOT_SAMPLER.set(sampler).is_ok()
}

/// Spans the exporter had no room for, since start.
static DROPPED_SPANS: AtomicU64 = AtomicU64::new(0);

/// Counts `n` spans the exporter's queue had no room for (the binary's span
/// processor reports them; `/metrics` shows the total as
/// `kvgate_trace_spans_dropped_total`).
pub fn count_dropped_spans(n: u64) {
    DROPPED_SPANS.fetch_add(n, Ordering::Relaxed);
}

/// Spans dropped by the exporter since start.
pub(crate) fn dropped_spans() -> u64 {
    DROPPED_SPANS.load(Ordering::Relaxed)
}

/// A span under the current request (or under `parent:`), exported only
/// when the request is: `stage_span!(traced, "name", fields...)`, with
/// `traced` from [`in_traced_request`] or the request's own
/// [`is_traced`].
macro_rules! stage_span {
    ($traced:expr, $($rest:tt)+) => {
        if $traced {
            tracing::info_span!(target: $crate::request::trace_context::TRACED, $($rest)+)
        } else {
            tracing::info_span!(target: $crate::request::trace_context::UNTRACED, $($rest)+)
        }
    };
}
pub(crate) use stage_span;

/// A count as a span field: `tracing-opentelemetry` exports an unsigned
/// field as its `Debug` text (a string attribute, formatted per record), a
/// signed one as an integer.
pub(crate) fn int(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// Whether the span the code runs in is a traced request's (or one of its
/// stages').
pub(crate) fn in_traced_request() -> bool {
    is_traced(&tracing::Span::current())
}

/// Whether `span` is a traced request's (or one of its stages').
pub(crate) fn is_traced(span: &tracing::Span) -> bool {
    span.metadata().is_some_and(|m| m.target() == TRACED)
}

/// A generation request's span, for both front doors (`door`: `serve`, or
/// `epp` for an endpoint pick), continuing the client's trace from
/// `headers` (see [`continue_from`]): the decision and the answer's fields
/// are recorded on it as they become known. Traced or not as the root
/// sampler decides.
pub(crate) fn request_span(
    door: &'static str,
    route: &'static str,
    headers: &HeaderMap,
) -> tracing::Span {
    macro_rules! span {
        ($target:expr) => {
            tracing::info_span!(
                target: $target,
                "request",
                door,
                route,
                trace_id = tracing::field::Empty,
                prompt_tokens = tracing::field::Empty,
                stream = tracing::field::Empty,
                tenant = tracing::field::Empty,
                queue_wait_s = tracing::field::Empty,
                waited_for = tracing::field::Empty,
                replica = tracing::field::Empty,
                cached_blocks = tracing::field::Empty,
                predicted_ttft_s = tracing::field::Empty,
                reason = tracing::field::Empty,
                candidates = tracing::field::Empty,
                runner_up_ttft_s = tracing::field::Empty,
                ttft_s = tracing::field::Empty,
                output_tokens = tracing::field::Empty,
                finish_reason = tracing::field::Empty,
                outcome = tracing::field::Empty,
                error = tracing::field::Empty,
            )
        };
    }
    // Without a root sampler there is no exporter: nothing is traced.
    let traced_parent = ROOT_SAMPLER.get().and_then(|sample| {
        let parent =
            opentelemetry::global::get_text_map_propagator(|p| p.extract(&Incoming(headers)));
        sample(&parent).then_some(parent)
    });
    let span = if traced_parent.is_some() { span!(TRACED) } else { span!(UNTRACED) };
    continue_from(&span, headers, traced_parent);
    span
}

/// Makes `span` a child of the client's span (`parent`, extracted from
/// `headers` when traces are exported and the request is traced) and
/// records the trace id on it as `trace_id`, for every log line inside the
/// request.
fn continue_from(
    span: &tracing::Span,
    headers: &HeaderMap,
    parent: Option<opentelemetry::Context>,
) {
    if let Some(parent) = parent.filter(|p| p.span().span_context().is_valid()) {
        // An error here only means kvgate's spans are not exported.
        let _ = span.set_parent(parent);
    }
    if span.is_disabled() {
        return;
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
