//! The endpoint picker front door (`kvgate epp`): the Gateway API Inference
//! Extension's endpoint picker protocol over Envoy's external-processing
//! gRPC service. A conformant gateway (Envoy Gateway, kgateway, Istio...)
//! opens one bidirectional stream per HTTP request; kvgate reads the
//! request's headers and whole body, prepares and places it through the same
//! request path stages and fleet core as the HTTP proxy (`prepare.rs`,
//! `placement.rs`), and answers with the chosen endpoint (`ip:port`, plus
//! fallbacks) in `x-gateway-destination-endpoint` and in `envoy.lb` dynamic
//! metadata. The gateway then carries the bytes; kvgate watches the response
//! on the same stream for the first token and the end, which move and
//! release the booking as the relay does for the proxy.
//!
//! The exchange of one stream is `epp/exchange.rs`; the messages are built
//! and read in `epp/wire.rs`.

use std::sync::Arc;

use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_server::{
    ExternalProcessor, ExternalProcessorServer,
};
use envoy_types::pb::envoy::service::ext_proc::v3::{ProcessingRequest, ProcessingResponse};
use futures_util::stream::BoxStream;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tonic::{Request, Response, Status, Streaming};

use crate::config::epp_config::EppConfig;
use crate::doors::shed::Shedding;
use crate::observe::metrics::Metrics;
use crate::replicas::directory::Directory;
use crate::replicas::fleet_handle::FleetHandle;
use crate::request::placement::Placer;
use crate::request::prepare::Preparer;

mod exchange;
mod wire;

/// What the endpoint picker uses, built once by the wiring: the request
/// path's stages (`preparer`, `placer`), the fleet (bookings, failures), the
/// directory (endpoints), admission (`shedding`), the metrics, and its
/// settings.
#[derive(Debug)]
pub(crate) struct EppContext {
    pub(crate) preparer: Preparer,
    pub(crate) placer: Placer,
    pub(crate) fleet: Arc<FleetHandle>,
    pub(crate) replicas: Arc<Directory>,
    pub(crate) shedding: Arc<Shedding>,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) config: EppConfig,
    /// `auth.api_keys`: checked against the client's `Authorization`
    /// header, which the gateway passes on.
    pub(crate) api_keys: Vec<String>,
    /// `limits.max_body_bytes`.
    pub(crate) max_body_bytes: usize,
    /// The fleet's block size, to count cached prompt tokens.
    pub(crate) block_size: u32,
    /// `replica_header`: name the replica in `x-kvgate-replica`.
    pub(crate) replica_header: bool,
}

#[derive(Debug)]
struct Picker(Arc<EppContext>);

#[tonic::async_trait]
impl ExternalProcessor for Picker {
    type ProcessStream = BoxStream<'static, Result<ProcessingResponse, Status>>;

    async fn process(
        &self,
        request: Request<Streaming<ProcessingRequest>>,
    ) -> Result<Response<Self::ProcessStream>, Status> {
        let inbound = request.into_inner();
        Ok(Response::new(Box::pin(exchange::answers(Arc::clone(&self.0), inbound))))
    }
}

/// Serves the ext_proc service and the gRPC health service on `listener`
/// (with `tls`, over TLS, each handshake bounded by [`HANDSHAKE`]) until
/// `stop` is set. Health answers `SERVING` for `liveness` once the process
/// serves, and for `readiness` and the ext_proc service name once the fleet
/// is ready (the same rule as `/ready`).
pub(crate) fn serve(
    listener: TcpListener,
    ctx: Arc<EppContext>,
    tls: Option<Arc<rustls::ServerConfig>>,
    mut stop: watch::Receiver<bool>,
) -> JoinHandle<()> {
    let (reporter, health) = tonic_health::server::health_reporter();
    let fleet = Arc::clone(&ctx.fleet);
    let closing = ctx.shedding.closing.clone();
    tokio::spawn(health_loop(reporter, fleet, closing, stop.clone()));
    let router = tonic::transport::Server::builder()
        .add_service(health)
        .add_service(ExternalProcessorServer::new(Picker(ctx)));
    tokio::spawn(async move {
        let stopped = stop.clone();
        let shutdown = async move {
            let _ = stop.wait_for(|v| *v).await;
        };
        let served = match tls {
            // No Nagle delay: a pick is one small message each way, and
            // waiting for the peer's delayed ACK would add 40 ms to it.
            None => {
                let incoming =
                    tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
                router.serve_with_incoming_shutdown(incoming, shutdown).await
            }
            Some(config) => {
                let incoming = tls_incoming(listener, config, stopped);
                router.serve_with_incoming_shutdown(incoming, shutdown).await
            }
        };
        if let Err(e) = served {
            tracing::error!(error = %e, "the endpoint picker's gRPC server stopped");
        }
    })
}

/// Longest TLS handshake a gateway connection gets.
const HANDSHAKE: std::time::Duration = std::time::Duration::from_secs(10);

type TlsConn = tokio_rustls::server::TlsStream<tokio::net::TcpStream>;

/// The connections of `listener` after their TLS handshakes (each on a task
/// of its own, so a slow one holds up no other); failed handshakes are
/// logged and dropped.
fn tls_incoming(
    listener: TcpListener,
    config: Arc<rustls::ServerConfig>,
    mut stop: watch::Receiver<bool>,
) -> BoxStream<'static, Result<TlsConn, std::io::Error>> {
    let (tx, rx) = mpsc::channel::<TlsConn>(64);
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    tokio::spawn(async move {
        loop {
            let (tcp, peer) = tokio::select! {
                r = listener.accept() => match r {
                    Ok(x) => x,
                    Err(e) => {
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                        continue;
                    }
                },
                _ = async { let _ = stop.wait_for(|v| *v).await; } => return,
            };
            let _ = tcp.set_nodelay(true);
            let (acceptor, tx) = (acceptor.clone(), tx.clone());
            tokio::spawn(async move {
                match tokio::time::timeout(HANDSHAKE, acceptor.accept(tcp)).await {
                    Ok(Ok(conn)) => {
                        let _ = tx.send(conn).await;
                    }
                    Ok(Err(e)) => tracing::debug!(%peer, error = %e, "TLS handshake failed"),
                    Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                }
            });
        }
    });
    Box::pin(futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|c| (Ok(c), rx))
    }))
}

/// The ext_proc service's name, as gRPC health checks ask for it.
const SERVICE_NAME: &str = "envoy.service.ext_proc.v3.ExternalProcessor";

/// Keeps the health service's statuses in step with the fleet: checked
/// every second until `stop`.
async fn health_loop(
    reporter: tonic_health::server::HealthReporter,
    fleet: Arc<FleetHandle>,
    closing: watch::Receiver<bool>,
    mut stop: watch::Receiver<bool>,
) {
    use tonic_health::ServingStatus;
    reporter.set_service_status("liveness", ServingStatus::Serving).await;
    loop {
        let r = fleet.readiness();
        let ready = r.ready() && !*closing.borrow();
        let status = if ready { ServingStatus::Serving } else { ServingStatus::NotServing };
        reporter.set_service_status("readiness", status).await;
        reporter.set_service_status(SERVICE_NAME, status).await;
        tokio::select! {
            _ = tokio::time::sleep(std::time::Duration::from_secs(1)) => {}
            _ = stop.wait_for(|v| *v) => return,
        }
    }
}

#[cfg(test)]
mod tests;
