//! Listeners, routes, middleware and the gateway's lifecycle.
//!
//! Connections are served by hyper directly (not `axum::serve`) because the
//! header-read timeout and the header size limit are hyper connection
//! settings: a slow-loris client cannot hold a connection open by trickling
//! headers, and oversized headers are refused before any handler runs.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::request::engine_client::{Connect, HttpEngines};
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::{delete, get, post};
use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use kvgate_openai::ErrorResponse;
use tokio::net::{TcpListener, TcpSocket};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tower::ServiceExt;

use crate::config::settings::{DiscoveryTiming, Settings};
use crate::config::GatewayConfig;
use crate::doors::api::ApiContext;
use crate::doors::throttle::{ClientAddr, KeyKind, KeyVerdict};
use crate::doors::tls::{ServerTls, ALPN_H2, ALPN_HTTP1};
use crate::doors::{admin, api};
use crate::error::StartError;
use crate::request::request_error::Reason;
use crate::request::response::{error_response, error_response_in};
use crate::request::route::{Api, Route};
use crate::state::Shared;

/// A running gateway.
#[derive(Debug)]
pub struct Gateway {
    shared: Arc<Shared>,
    addr: SocketAddr,
    admin_addr: Option<SocketAddr>,
    metrics_addr: Option<SocketAddr>,
    peer_addr: Option<SocketAddr>,
    epp_addr: Option<SocketAddr>,
    stop_accepting: watch::Sender<bool>,
    servers: Vec<JoinHandle<()>>,
}

async fn client_auth(State(s): State<Arc<Shared>>, req: Request, next: Next) -> Response {
    let ok = crate::doors::auth::client_allowed(&s.config.auth.api_keys, req.headers());
    let presented = crate::doors::auth::bearer(req.headers()).is_some();
    match s.key_verdict(req.extensions().get(), KeyKind::Client, presented, ok) {
        KeyVerdict::Allowed => next.run(req).await,
        KeyVerdict::Throttled(r) => count_refused(&s, req.uri().path(), r),
        KeyVerdict::Denied => {
            s.metrics.count(Reason::Unauthorized);
            let e = ErrorResponse::authentication("invalid or missing API key");
            let mut r = error_response_in(Api::of_path(req.uri().path()), &e);
            r.headers_mut()
                .insert("www-authenticate", axum::http::HeaderValue::from_static("Bearer"));
            count_refused(&s, req.uri().path(), r)
        }
    }
}

/// A generation request refused before its handler ran (401, 429) is still
/// an answered request: `kvgate_requests_total` counts it, by route and
/// status, with no replica.
fn count_refused(s: &Shared, path: &str, r: Response) -> Response {
    if let Some(route) = Route::of_path(path) {
        s.metrics.request(route.label(), r.status().as_u16(), "");
    }
    r
}

async fn admin_auth(State(s): State<Arc<Shared>>, req: Request, next: Next) -> Response {
    let ok = crate::doors::auth::admin_allowed(s.config.auth.admin_key.as_ref(), req.headers());
    let presented = crate::doors::auth::admin_key_presented(req.headers());
    match s.key_verdict(req.extensions().get(), KeyKind::Admin, presented, ok) {
        KeyVerdict::Allowed => next.run(req).await,
        KeyVerdict::Throttled(r) => r,
        KeyVerdict::Denied => {
            s.metrics.count(Reason::Unauthorized);
            error_response(&ErrorResponse::authentication("invalid or missing admin key"))
        }
    }
}

async fn not_found() -> Response {
    error_response(&ErrorResponse::not_found("no such route"))
}

/// `/admin/*` and the dashboard, each router with its own context; the
/// auth middleware is the wiring's and sees the whole state.
fn admin_routes(shared: &Arc<Shared>) -> Router {
    Router::new()
        .route("/admin/replicas", get(admin::replicas).post(admin::add_replica))
        .route("/admin/replicas/{name}/drain", post(admin::drain_replica))
        .route("/admin/replicas/{name}/blocks", get(admin::replica_blocks))
        .route("/admin/replicas/{name}", delete(admin::remove_replica))
        .route("/admin/decisions", get(admin::decisions))
        .layer(middleware::from_fn_with_state(Arc::clone(shared), admin_auth))
        .with_state(shared.admin_context())
        // Its own guard: the admin key or a login cookie (dashboard.rs).
        .merge(crate::doors::dashboard::routes(shared.dashboard_context()))
}

fn app(shared: &Arc<Shared>, api: &Arc<ApiContext>) -> Router {
    let c = &shared.config;
    // The generation routes' layers, outermost first: shedding (503 while
    // shutting down, 429 at the in-flight limit), then the key check.
    let generation = Router::new()
        .route("/v1/chat/completions", post(api::chat))
        .route("/v1/completions", post(api::completions))
        .route("/v1/messages", post(api::messages))
        .route("/v1/responses", post(api::responses))
        .layer(middleware::from_fn_with_state(Arc::clone(shared), client_auth))
        .layer(middleware::from_fn_with_state(shared.shedding(), crate::doors::shed::shed));
    let mut protected = Router::new()
        .route("/v1/models", get(api::models))
        .route("/tokenize", post(api::tokenize))
        .route("/v1/messages/count_tokens", post(api::count_tokens))
        .route("/v1/responses/{id}", get(crate::request::stored_responses::retrieve))
        .route("/v1/responses/{id}/cancel", post(crate::request::stored_responses::cancel))
        .route("/detokenize", post(api::detokenize));
    if c.metrics_listen.is_none() {
        protected = protected.route("/metrics", get(api::metrics));
    }
    let protected =
        protected.layer(middleware::from_fn_with_state(Arc::clone(shared), client_auth));
    let mut router = Router::new()
        .merge(generation)
        .merge(protected)
        .route("/health", get(api::health))
        .route("/ready", get(api::ready))
        .with_state(Arc::clone(api));
    if c.admin_listen.is_none() {
        router = router.merge(admin_routes(shared));
    }
    router.fallback(not_found).layer(DefaultBodyLimit::max(c.limits.max_body_bytes))
}

/// Pending connections the kernel queues for us. `TcpListener::bind` asks
/// for 128, which a burst of clients overflows while the accept loop is
/// busy (dropped SYNs cost the client a 1 s retransmit); the kernel caps
/// this at `net.core.somaxconn`.
const LISTEN_BACKLOG: u32 = 4096;

/// Largest peer batch: bounded by the router's outbox (64 Ki changes of
/// well under 128 bytes each).
const PEER_BODY_LIMIT: usize = 16 << 20;

async fn bind(addr: SocketAddr) -> Result<TcpListener, StartError> {
    let listen = || {
        let socket = if addr.is_ipv4() { TcpSocket::new_v4() } else { TcpSocket::new_v6() }?;
        socket.set_reuseaddr(true)?;
        socket.bind(addr)?;
        socket.listen(LISTEN_BACKLOG)
    };
    listen().map_err(|source| StartError::Bind { addr, source })
}

/// Accepts connections until `stop` is set; each connection then finishes
/// its in-flight request and closes. With `tls`, each connection's TLS
/// handshake comes first, bounded by the header-read timeout.
fn serve(
    listener: TcpListener,
    app: Router,
    shared: &Shared,
    tls: Option<Arc<rustls::ServerConfig>>,
    stop: watch::Receiver<bool>,
) -> JoinHandle<()> {
    let limits = &shared.config.limits;
    let header_timeout = shared.settings.server.header_read;
    // hyper refuses buffers under 8 KiB.
    let max_buf = limits.max_header_bytes.max(8192);
    let connections = Arc::clone(&shared.connections);
    let (open, refused) = shared.metrics.connection_metrics();
    let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
    tokio::spawn(async move {
        let mut stop_accept = stop.clone();
        loop {
            let (stream, client) = tokio::select! {
                r = listener.accept() => match r {
                    Ok(x) => x,
                    Err(e) => {
                        // Out of file descriptors and the like: back off, keep serving.
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
                _ = async { let _ = stop_accept.wait_for(|v| *v).await; } => break,
            };
            // Past the connection limit: close at once rather than hold
            // the socket (idle connections are what a flood is made of).
            let Ok(permit) = Arc::clone(&connections).try_acquire_owned() else {
                refused.inc();
                drop(stream);
                continue;
            };
            let _ = stream.set_nodelay(true);
            let ip = ClientAddr(client.ip());
            let svc = TowerToHyperService::new(app.clone().map_request(
                move |mut r: hyper::Request<hyper::body::Incoming>| {
                    r.extensions_mut().insert(ip);
                    r
                },
            ));
            let stop_conn = stop.clone();
            let open = open.clone();
            let acceptor = acceptor.clone();
            open.inc();
            tokio::spawn(async move {
                let _permit = permit;
                let conn = Conn { header_timeout, max_buf, stop: stop_conn };
                match acceptor {
                    None => conn.serve(stream, svc).await,
                    Some(a) => match tokio::time::timeout(header_timeout, a.accept(stream)).await {
                        Ok(Ok(tls)) => conn.serve(tls, svc).await,
                        Ok(Err(e)) => tracing::debug!(%client, error = %e, "TLS handshake failed"),
                        Err(_) => tracing::debug!(%client, "TLS handshake timed out"),
                    },
                }
                open.dec();
            });
        }
    })
}

/// One accepted connection's HTTP/1 settings and the shutdown signal.
struct Conn {
    header_timeout: Duration,
    max_buf: usize,
    stop: watch::Receiver<bool>,
}

impl Conn {
    /// Serves `io` until the client closes it, or until shutdown lets its
    /// in-flight request finish.
    async fn serve<I, S>(mut self, io: I, svc: S)
    where
        I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
        S: hyper::service::HttpService<hyper::body::Incoming> + Send,
        S::Future: Send + 'static,
        S::ResBody: Send + 'static,
        <S::ResBody as hyper::body::Body>::Data: Send,
        <S::ResBody as hyper::body::Body>::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let mut builder = hyper::server::conn::http1::Builder::new();
        builder
            .timer(TokioTimer::new())
            .header_read_timeout(self.header_timeout)
            .max_buf_size(self.max_buf);
        let conn = builder.serve_connection(TokioIo::new(io), svc);
        tokio::pin!(conn);
        tokio::select! {
            _ = conn.as_mut() => {}
            _ = async { let _ = self.stop.wait_for(|v| *v).await; } => {
                conn.as_mut().graceful_shutdown();
                let _ = conn.await;
            }
        }
    }
}

impl Gateway {
    /// Validates `config`, loads the tokenizer, binds every listener,
    /// registers the replicas and starts their event and monitor tasks.
    pub async fn start(config: GatewayConfig) -> Result<Gateway, StartError> {
        config.validate()?;
        let tokenizers = crate::replicas::pool::load_tokenizers(&config.pools())?;
        // TLS files are read and checked before anything listens.
        let settings = Settings::from_config(&config);
        let server_tls =
            ServerTls::load(&config.tls, settings.tls_reload).map_err(StartError::Tls)?;
        let connect = Connect {
            connect_timeout: settings.server.connect,
            idle_timeout: Duration::from_secs(90),
            tls: crate::doors::tls::client_config(&config.tls).map_err(StartError::Tls)?,
        };
        let mut client = reqwest::Client::builder()
            .connect_timeout(connect.connect_timeout)
            .tcp_nodelay(true)
            .pool_idle_timeout(connect.idle_timeout);
        if let Some(c) = connect.tls.clone() {
            client = client.use_preconfigured_tls(c);
        }
        let client = client.build().map_err(|e| StartError::Client(e.to_string()))?;
        let tls_for = |alpn, machines| {
            let c = server_tls.as_ref().map(|t: &Arc<ServerTls>| t.config(alpn, machines));
            c.transpose().map_err(StartError::Tls)
        };
        let http_tls = tls_for(ALPN_HTTP1, false)?;
        let peer_tls = tls_for(ALPN_HTTP1, true)?;
        let grpc_tls = tls_for(ALPN_H2, true)?;
        let listener = bind(config.listen).await?;
        let admin_listener = match config.admin_listen {
            Some(a) => Some(bind(a).await?),
            None => None,
        };
        let metrics_listener = match config.metrics_listen {
            Some(a) => Some(bind(a).await?),
            None => None,
        };
        let peer_listener = match config.peers.listen {
            Some(a) => Some(bind(a).await?),
            None => None,
        };
        let epp_listener = match config.epp.listen {
            Some(a) => Some(bind(a).await?),
            None => None,
        };
        let engines =
            Arc::new(HttpEngines::new(client.clone(), connect).map_err(StartError::Client)?);
        let shared = Arc::new(Shared::new(config, settings, tokenizers, engines, client)?);
        for r in shared.config.all_replicas() {
            let name = r.display_name().to_owned();
            shared.registry.add_ranks(r).map_err(|reason| StartError::Replica { name, reason })?;
        }
        let local = |l: &TcpListener| {
            l.local_addr().map_err(|source| StartError::Bind { addr: shared.config.listen, source })
        };
        let addr = local(&listener)?;
        let admin_addr = admin_listener.as_ref().map(local).transpose()?;
        let metrics_addr = metrics_listener.as_ref().map(local).transpose()?;
        let peer_addr = peer_listener.as_ref().map(local).transpose()?;
        let epp_addr = epp_listener.as_ref().map(local).transpose()?;
        let (stop_accepting, stop_rx) = watch::channel(false);
        // Each component's context, built once here.
        let api = shared.api_context();
        let peer_context = shared.peer_context();
        // The client-facing listeners (API, admin, metrics) share one TLS setting.
        let serve_client = |l, app, stop| serve(l, app, &shared, http_tls.clone(), stop);
        let mut servers = vec![serve_client(listener, app(&shared, &api), stop_rx.clone())];
        if let Some(l) = admin_listener {
            let a = admin_routes(&shared).fallback(not_found);
            servers.push(serve_client(l, a, stop_rx.clone()));
        }
        if let Some(l) = metrics_listener {
            let m = Router::new()
                .route("/metrics", get(api::metrics))
                .layer(middleware::from_fn_with_state(Arc::clone(&shared), client_auth))
                .fallback(not_found)
                .with_state(Arc::clone(&api));
            servers.push(serve_client(l, m, stop_rx.clone()));
        }
        if let Some(l) = peer_listener {
            let p = Router::new()
                .route(crate::doors::peers::CHANGES_PATH, post(crate::doors::peers::receive))
                .fallback(not_found)
                .layer(DefaultBodyLimit::max(PEER_BODY_LIMIT))
                .with_state(Arc::clone(&peer_context));
            servers.push(serve(l, p, &shared, peer_tls, stop_rx.clone()));
        }
        if let Some(l) = epp_listener {
            servers.push(crate::doors::epp::serve(
                l,
                shared.epp_context(),
                grpc_tls,
                stop_rx.clone(),
            ));
        }
        if let Some(t) = server_tls {
            servers.push(tokio::spawn(t.watch(stop_rx.clone())));
        }
        servers.push(tokio::spawn(crate::replicas::upkeep::run(
            Arc::clone(&shared.fleet),
            stop_rx.clone(),
        )));
        if shared.config.peers.enabled() {
            let bus = match shared.config.peers.nats.enabled() {
                true => Some(
                    crate::doors::peer_bus::connect(&shared.config.peers.nats, &shared.peers)
                        .await?,
                ),
                false => None,
            };
            servers.push(tokio::spawn(crate::doors::peers::run(
                peer_context,
                bus,
                stop_rx.clone(),
            )));
        }
        for pool in shared.config.pools().into_iter().filter(|p| p.discovery.dns.is_some()) {
            let registry = Arc::clone(&shared.registry);
            let timing = DiscoveryTiming::of(&pool.discovery);
            let run = crate::replicas::discovery::run(
                pool.discovery,
                timing,
                pool.name,
                registry,
                stop_rx.clone(),
            );
            servers.push(tokio::spawn(run));
        }
        tracing::info!(
            %addr,
            admin = ?admin_addr,
            metrics = ?metrics_addr,
            peer = ?peer_addr,
            epp = ?epp_addr,
            instance = %shared.peers.instance,
            pools = shared.config.pools().len(),
            models = ?shared.config.pools().iter().map(|p| p.model.served_name.clone()).collect::<Vec<_>>(),
            replicas = shared.config.all_replicas().len(),
            "kvgate serving"
        );
        if shared.config.auth.api_keys.is_empty() && !addr.ip().is_loopback() {
            tracing::warn!(%addr, "serving WITHOUT client authentication on a non-loopback address (--allow-unauthenticated)");
        }
        Ok(Gateway {
            shared,
            addr,
            admin_addr,
            metrics_addr,
            peer_addr,
            epp_addr,
            stop_accepting,
            servers,
        })
    }

    /// The API address as bound.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The admin address, when admin has its own listener.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin_addr
    }

    /// The metrics address, when metrics have their own listener.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_addr
    }

    /// The peer endpoint's address, when `peers.listen` is set.
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        self.peer_addr
    }

    /// The endpoint picker's gRPC address, when `epp.listen` is set.
    pub fn epp_addr(&self) -> Option<SocketAddr> {
        self.epp_addr
    }

    /// The fleet core's handle, for in-crate tests.
    #[cfg(test)]
    pub(crate) fn fleet(&self) -> &Arc<crate::replicas::fleet_handle::FleetHandle> {
        &self.shared.fleet
    }

    /// The replica directory, for in-crate tests.
    #[cfg(test)]
    pub(crate) fn directory(&self) -> &Arc<crate::replicas::directory::Directory> {
        &self.shared.replicas
    }

    /// A snapshot of the fleet, for in-crate tests.
    #[cfg(test)]
    pub(crate) fn snapshot(&self) -> crate::FleetSnapshot {
        self.shared.view.snapshot(crate::clock::now())
    }

    /// The registry, for in-crate tests.
    #[cfg(test)]
    pub(crate) fn registry(&self) -> &Arc<crate::replicas::registry::Registry> {
        &self.shared.registry
    }

    /// This process's peer instance id.
    pub fn instance(&self) -> &str {
        &self.shared.peers.instance
    }

    /// Replica names in registration order.
    pub fn replica_names(&self) -> Vec<String> {
        self.shared.replicas.all().iter().map(|r| r.name.clone()).collect()
    }

    /// Graceful shutdown: new requests get 503, listeners stop accepting,
    /// in-flight requests get up to `limits.shutdown_grace_ms` to finish,
    /// then replica tasks stop. Returns how many requests were still in
    /// flight when the grace period ended.
    pub async fn shutdown(self) -> usize {
        // `send_replace`, not `send`: `send` drops the value when no receiver
        // is open, and shutdown must be seen whoever subscribes later.
        self.shared.closing.send_replace(true);
        let _ = self.stop_accepting.send(true);
        let max = self.shared.config.limits.max_concurrent_requests;
        let grace = self.shared.settings.server.shutdown_grace;
        let all = u32::try_from(max).unwrap_or(u32::MAX);
        let drained = tokio::time::timeout(grace, self.shared.inflight.acquire_many(all)).await;
        let left = match drained {
            Ok(_) => 0,
            Err(_) => max.saturating_sub(self.shared.inflight.available_permits()),
        };
        for r in self.shared.replicas.all().iter() {
            let _ = r.stop.send(true);
        }
        for s in self.servers {
            s.abort();
        }
        tracing::info!(left, "kvgate stopped");
        left
    }
}
