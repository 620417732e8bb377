//! Logs and traces for every command: `tracing` to stderr as text or JSON
//! lines, and, when a collector is configured, kvgate's spans exported over
//! OTLP with the W3C trace context as the process's propagator (the gateway
//! continues a client's `traceparent` and hands its own to the engine,
//! `kvgate-gateway/src/trace_context.rs`).
//!
//! Export runs on a one-thread Tokio runtime of its own, through the SDK's
//! batch processor: a request only queues its ended spans (a full queue drops
//! them, which the SDK logs with their count), and the exporter's network I/O
//! never shares the gateway's workers.

use std::time::Duration;

use anyhow::Context as _;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::trace::span_processor_with_async_runtime::BatchSpanProcessor;
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::Resource;
use tracing::Level;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

use crate::cli::{LogFormat, OtlpProtocol};

/// How long an export may take before it is abandoned.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

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
            // Its own filter: kvgate's spans are exported whatever `--log`
            // keeps quiet (info: the request path, feed replays and resets).
            let spans = Targets::new()
                .with_target("kvgate", Level::INFO)
                .with_target("kvgate_gateway", Level::INFO);
            // Source locations, thread names and busy/idle timings would be
            // strings and counters on every span of every request: left out.
            let layer = tracing_opentelemetry::layer()
                .with_tracer(tracer)
                .with_location(false)
                .with_threads(false)
                .with_tracked_inactivity(false)
                .with_target(false)
                .with_filter(spans);
            (Some(layer), Telemetry { provider: Some(provider), runtime: Some(runtime) })
        }
    };
    // A second init (tests) keeps the first subscriber.
    let _ = tracing_subscriber::registry().with(fmt).with(otel).try_init();
    Ok(telemetry)
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
    let processor =
        BatchSpanProcessor::builder(exporter, opentelemetry_sdk::runtime::Tokio).build();
    let mut resource = Resource::builder();
    if std::env::var("OTEL_SERVICE_NAME").is_err() {
        resource = resource.with_service_name("kvgate");
    }
    let provider = SdkTracerProvider::builder()
        .with_span_processor(processor)
        .with_resource(resource.build())
        .build();
    drop(_entered);
    Ok((provider, runtime))
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
