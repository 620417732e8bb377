//! Logs and traces for every command: `tracing` to stderr as text or JSON
//! lines, and, when a collector is configured, kvgate's spans exported over
//! OTLP with the W3C trace context as the process's propagator (the gateway
//! continues a client's `traceparent` and hands its own to the engine,
//! `kvgate-gateway/src/request/trace_context.rs`).
//!
//! Export goes through the SDK's batch processor, on its thread: a request
//! only puts its ended spans in a queue, which wakes no one (the thread
//! wakes for a full batch or at its schedule), and a full queue drops them,
//! counted on the gateway's `/metrics` as `kvgate_trace_spans_dropped_total`.
//! The exporter's network I/O runs on a one-thread Tokio runtime of its
//! own, never on the gateway's workers.
//!
//! The sampler (`OTEL_TRACES_SAMPLER*`, the SDK's reading of them) decides at
//! each request's root, before any span exists
//! (`kvgate_gateway::set_root_sampler`): an untraced request's spans never
//! reach the exporter's layer, whose work per span is most of what tracing
//! costs. The SDK then samples every span it is given.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use opentelemetry::trace::{SpanKind, TraceContextExt as _, TracerProvider as _};
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::error::{OTelSdkError, OTelSdkResult};
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, IdGenerator as _, RandomIdGenerator, Sampler,
    SamplingDecision, SdkTracerProvider, SpanData, SpanExporter, SpanProcessor,
};
use opentelemetry_sdk::Resource;
use tracing::level_filters::LevelFilter;
use tracing::Level;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

use crate::cli::{LogFormat, OtlpProtocol};

/// How long an export may take before it is abandoned.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// Spans waiting for export, at most (`OTEL_BSP_MAX_QUEUE_SIZE`, the SDK's
/// default otherwise).
const DEFAULT_QUEUE: usize = 2048;

/// What `--log`, `--log-format` and `--otlp-*` asked for.
#[derive(Debug)]
pub(crate) struct Options<'a> {
    pub(crate) filter: Option<&'a str>,
    pub(crate) format: LogFormat,
    pub(crate) otlp_endpoint: Option<&'a str>,
    pub(crate) otlp_protocol: Option<OtlpProtocol>,
}

/// Keeps the exporter alive; dropping it flushes the spans still queued.
#[derive(Debug)]
pub(crate) struct Telemetry {
    provider: Option<SdkTracerProvider>,
    runtime: Option<tokio::runtime::Runtime>,
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        if let Some(p) = self.provider.take() {
            if let Err(e) = p.shutdown() {
                eprintln!("kvgate: trace export did not shut down cleanly: {e}");
            }
        }
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_timeout(Duration::from_secs(1));
        }
    }
}

/// Sets up logging, and trace export when a collector is configured.
pub(crate) fn init(o: &Options<'_>) -> anyhow::Result<Telemetry> {
    let filter = o
        .filter
        .map(str::to_owned)
        .or_else(|| std::env::var("RUST_LOG").ok())
        .unwrap_or_else(|| "info".to_owned());
    let filter = EnvFilter::try_new(&filter).with_context(|| format!("--log {filter:?}"))?;
    let fmt = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    // JSON lines carry every enclosing span's fields: a request's trace id
    // is on each line logged while it is served.
    let fmt = match o.format {
        LogFormat::Text => fmt.with_filter(filter).boxed(),
        LogFormat::Json => {
            fmt.json().with_current_span(false).with_span_list(true).with_filter(filter).boxed()
        }
    };
    let (otel, telemetry) = match endpoint(o) {
        None => (None, Telemetry { provider: None, runtime: None }),
        Some(endpoint) => {
            let (provider, runtime) = exporter(endpoint.as_deref(), protocol(o)?)?;
            let tracer = provider.tracer("kvgate");
            opentelemetry::global::set_text_map_propagator(
                opentelemetry_sdk::propagation::TraceContextPropagator::new(),
            );
            // A second init (tests) keeps the first sampler.
            let _ = kvgate_gateway::set_root_sampler(root_sampler());
            // Its own filter: kvgate's spans are exported whatever `--log`
            // keeps quiet (info: the request path, feed replays and resets),
            // except an untraced request's.
            let spans = Targets::new()
                .with_target("kvgate", Level::INFO)
                .with_target("kvgate_gateway", Level::INFO)
                .with_target(kvgate_gateway::UNTRACED_TARGET, LevelFilter::OFF);
            // Source locations, thread names and busy/idle timings would be
            // strings and counters on every span of every request: left out.
            // Context activation would build and attach an OpenTelemetry
            // context each time a span is entered, at every poll of a
            // request's future; kvgate reads a span's context from the span
            // itself (`trace_context.rs`), so it is off.
            let layer = tracing_opentelemetry::layer()
                .with_tracer(tracer)
                .with_location(false)
                .with_threads(false)
                .with_tracked_inactivity(false)
                .with_target(false)
                .with_context_activation(false)
                .with_filter(spans);
            (Some(layer), Telemetry { provider: Some(provider), runtime: Some(runtime) })
        }
    };
    // A second init (tests) keeps the first subscriber.
    let _ = tracing_subscriber::registry().with(fmt).with(otel).try_init();
    Ok(telemetry)
}

/// The sampler the SDK reads from `OTEL_TRACES_SAMPLER` and
/// `OTEL_TRACES_SAMPLER_ARG` (parent-based, always on, by default), asked
/// once per request at its root with the client's context; a request
/// without one is asked with a fresh trace id, as the SDK would.
fn root_sampler() -> kvgate_gateway::RootSampler {
    let sampler = opentelemetry_sdk::trace::Config::default().sampler;
    let ids = RandomIdGenerator::default();
    Box::new(move |parent: &opentelemetry::Context| {
        let client = parent.span().span_context().clone();
        let trace_id = if client.is_valid() { client.trace_id() } else { ids.new_trace_id() };
        let result =
            sampler.should_sample(Some(parent), trace_id, "request", &SpanKind::Server, &[], &[]);
        result.decision == SamplingDecision::RecordAndSample
    })
}

/// `Some(flag)` with `--otlp-endpoint`, `Some(None)` when only the standard
/// variables name a collector (the SDK reads them), `None` when off.
fn endpoint(o: &Options<'_>) -> Option<Option<String>> {
    if let Some(e) = o.otlp_endpoint {
        return Some(Some(e.to_owned()));
    }
    let set = |v: &str| std::env::var(v).is_ok_and(|s| !s.trim().is_empty());
    (set("OTEL_EXPORTER_OTLP_ENDPOINT") || set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))
        .then_some(None)
}

fn protocol(o: &Options<'_>) -> anyhow::Result<OtlpProtocol> {
    if let Some(p) = o.otlp_protocol {
        return Ok(p);
    }
    let var = std::env::var("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        .or_else(|_| std::env::var("OTEL_EXPORTER_OTLP_PROTOCOL"));
    match var.as_deref().map(str::trim) {
        Err(_) | Ok("http/protobuf") => Ok(OtlpProtocol::HttpProtobuf),
        Ok("grpc") => Ok(OtlpProtocol::Grpc),
        Ok(other) => anyhow::bail!(
            "OTEL_EXPORTER_OTLP_PROTOCOL={other:?}: kvgate exports over \"grpc\" or \"http/protobuf\""
        ),
    }
}

/// The OTLP exporter and its provider, on a runtime of their own.
fn exporter(
    endpoint: Option<&str>,
    protocol: OtlpProtocol,
) -> anyhow::Result<(SdkTracerProvider, tokio::runtime::Runtime)> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("kvgate-otlp")
        .enable_all()
        .build()
        .context("starting the trace exporter's runtime")?;
    // The exporter's clients and the batch processor's task bind to the
    // runtime they are made in.
    let _entered = runtime.enter();
    let builder = opentelemetry_otlp::SpanExporter::builder();
    let exporter = match protocol {
        OtlpProtocol::Grpc => {
            let b = builder.with_tonic().with_timeout(EXPORT_TIMEOUT);
            match endpoint {
                Some(e) => b.with_endpoint(e).build(),
                None => b.build(),
            }
        }
        OtlpProtocol::HttpProtobuf => {
            let client = opentelemetry_http::hyper::HyperClient::with_default_connector(
                EXPORT_TIMEOUT,
                None,
            );
            let b = builder.with_http().with_http_client(client).with_timeout(EXPORT_TIMEOUT);
            match endpoint {
                // A bare collector address gets the traces path, as the
                // standard variable does.
                Some(e) => b.with_endpoint(http_traces_url(e)).build(),
                None => b.build(),
            }
        }
    }
    .context("setting up the OTLP trace exporter")?;
    let capacity = std::env::var("OTEL_BSP_MAX_QUEUE_SIZE")
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|&n| n > 0)
        .unwrap_or(DEFAULT_QUEUE);
    let waiting = Arc::new(AtomicUsize::new(0));
    let exporter = Counted {
        inner: Arc::new(exporter),
        waiting: Arc::clone(&waiting),
        runtime: runtime.handle().clone(),
    };
    // The SDK's queue has room for every span the gate lets through: only
    // the gate drops, and it counts.
    let config = BatchConfigBuilder::default().with_max_queue_size(capacity).build();
    let batch = BatchSpanProcessor::builder(exporter).with_batch_config(config).build();
    let processor = Gate { inner: batch, waiting, capacity };
    let mut resource = Resource::builder();
    if std::env::var("OTEL_SERVICE_NAME").is_err() {
        resource = resource.with_service_name("kvgate");
    }
    // The sampler has decided at each request's root (`root_sampler`):
    // every span that reaches the SDK is one to export.
    let provider = SdkTracerProvider::builder()
        .with_span_processor(processor)
        .with_sampler(Sampler::AlwaysOn)
        .with_resource(resource.build())
        .build();
    drop(_entered);
    Ok((provider, runtime))
}

/// The batch processor behind a gate that counts what it drops: the SDK's
/// processor drops a span its queue has no room for and only logs the
/// first. The gate lets a span through while fewer than `capacity` wait
/// for export (queued, or batched and not yet handed to the exporter), and
/// counts the others as dropped (`kvgate_trace_spans_dropped_total`).
#[derive(Debug)]
struct Gate<P> {
    inner: P,
    /// Spans let through and not yet handed to the exporter ([`Counted`]).
    waiting: Arc<AtomicUsize>,
    capacity: usize,
}

impl<P: SpanProcessor> SpanProcessor for Gate<P> {
    fn on_start(&self, span: &mut opentelemetry_sdk::trace::Span, cx: &opentelemetry::Context) {
        self.inner.on_start(span, cx);
    }

    fn on_end(&self, span: SpanData) {
        if self.waiting.fetch_add(1, Ordering::AcqRel) >= self.capacity {
            self.waiting.fetch_sub(1, Ordering::AcqRel);
            kvgate_gateway::count_dropped_spans(1);
            return;
        }
        self.inner.on_end(span);
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

/// The exporter, counting the spans handed to it out of [`Gate`]'s wait,
/// and running each export on the exporter's runtime (the batch
/// processor's thread has none; the OTLP clients need one).
#[derive(Debug)]
struct Counted<E> {
    inner: Arc<E>,
    waiting: Arc<AtomicUsize>,
    runtime: tokio::runtime::Handle,
}

impl<E: SpanExporter + 'static> SpanExporter for Counted<E> {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        self.waiting.fetch_sub(batch.len(), Ordering::AcqRel);
        let inner = Arc::clone(&self.inner);
        match self.runtime.spawn(async move { inner.export(batch).await }).await {
            Ok(result) => result,
            Err(e) => Err(OTelSdkError::InternalFailure(format!("trace export task: {e}"))),
        }
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        // Called once, before any export holds a clone.
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.set_resource(resource);
        }
    }
}

/// `http://host:4318` → `http://host:4318/v1/traces`; a URL with a path is
/// taken as given.
fn http_traces_url(endpoint: &str) -> String {
    let e = endpoint.trim_end_matches('/');
    let after_scheme = e.split_once("://").map_or(e, |(_, rest)| rest);
    if after_scheme.contains('/') {
        e.to_owned()
    } else {
        format!("{e}/v1/traces")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bare_collector_address_gets_the_traces_path() {
        assert_eq!(http_traces_url("http://c:4318"), "http://c:4318/v1/traces");
        assert_eq!(http_traces_url("http://c:4318/"), "http://c:4318/v1/traces");
        assert_eq!(http_traces_url("https://c/otlp/v1/traces"), "https://c/otlp/v1/traces");
    }
}
