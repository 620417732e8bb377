//! The engine server (feature `server`): one simulated vLLM replica behind
//! vLLM's HTTP API and KV-event publisher.
//!
//! [`start`] binds nothing itself: it takes a listener, starts the KV-event
//! publisher (when configured), spawns the [`driver`] task that owns the
//! [`Engine`] and serves HTTP until the returned [`Replica`] is shut down.

mod driver;
mod http;
mod kv_transfer;
mod lora;
mod messages;
pub mod metrics;
mod render;
mod responses;
mod routes;

use std::net::SocketAddr;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, PoisonError, RwLock};

use kvgate_events::offset_endpoint_port;
use kvgate_events::publisher::{LocalEndpoints, Publisher, PublisherConfig, PublisherError};
use kvgate_tokenize::service::TokenizeService;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use crate::engine::Engine;
use crate::error::SimError;
use crate::EngineConfig;

pub use kv_transfer::KvTransferConfig;
pub use lora::{runtime_lora_updating_from_env, LoraModule};
pub use metrics::Metrics;

/// Everything one replica needs besides its listener and tokenizer.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// The engine model.
    pub engine: EngineConfig,
    /// The model (vLLM's `--model`): the served name when
    /// `served_model_names` is empty, and `root` of the model's cards.
    pub model: String,
    /// vLLM's `--served-model-name`: every name requests may use for the
    /// model; the first one names it in responses and metric labels.
    /// Empty: `model` alone.
    pub served_model_names: Vec<String>,
    /// LoRA adapters served beside the model, by name only (path = name):
    /// a request naming one hashes its blocks under the adapter.
    pub lora_adapters: Vec<String>,
    /// LoRA adapters with paths (vLLM's `--lora-modules`), after
    /// `lora_adapters`. Both kinds are loaded into the GPU slots at start,
    /// in order, as vLLM loads its static adapters.
    pub lora_modules: Vec<LoraModule>,
    /// Mount `/v1/load_lora_adapter` and `/v1/unload_lora_adapter` (vLLM
    /// mounts them when `VLLM_ALLOW_RUNTIME_LORA_UPDATING` is true).
    pub allow_runtime_lora_updating: bool,
    /// Real time runs this many times faster than the timing model.
    pub speedup: f64,
    /// When set, `/v1/*` requires `Authorization: Bearer <key>`.
    pub api_key: Option<String>,
    /// KV events; `None` publishes nothing.
    pub events: Option<PublisherConfig>,
    /// `max_tokens` when a request sets none.
    pub default_max_tokens: u32,
    /// Injected faults, for tests of the router's failure handling.
    pub faults: Faults,
    /// vLLM's `--data-parallel-size`: this many engines behind the one HTTP
    /// server, each with its own cache and its own event stream on the
    /// event (and replay) port plus its rank. `X-data-parallel-rank` pins a
    /// request to a rank; without it requests rotate over the ranks.
    pub data_parallel_size: u32,
    /// vLLM's `--kv-transfer-config` (NixlConnector): requests may be the
    /// prefill or the decode hop of a disaggregated request
    /// (`kv_transfer.rs`). `None`: `kv_transfer_params` is ignored.
    pub kv_transfer: Option<KvTransferConfig>,
}

/// Faults a replica injects on purpose.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Faults {
    /// Fraction of generation requests, in `[0, 1]`, answered with HTTP 500
    /// before reaching the engine (deterministic per request number).
    pub fail_rate: f64,
    /// Seed of the `fail_rate` decisions.
    pub fail_seed: u64,
    /// After this many output tokens a response stops making progress: the
    /// connection stays open, nothing more is sent.
    pub stall_after_tokens: Option<u32>,
    /// After this many finished requests the replica signals
    /// [`Replica::exited`] (`kvgate sim` then exits, as a crashed engine).
    pub exit_after_requests: Option<u64>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            engine: EngineConfig::default(),
            model: "Qwen/Qwen3-0.6B".to_owned(),
            served_model_names: Vec::new(),
            lora_adapters: Vec::new(),
            lora_modules: Vec::new(),
            allow_runtime_lora_updating: false,
            speedup: 1.0,
            api_key: None,
            events: None,
            default_max_tokens: 16,
            faults: Faults::default(),
            data_parallel_size: 1,
            kv_transfer: None,
        }
    }
}

/// Why a replica could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The engine configuration was refused.
    #[error(transparent)]
    Engine(#[from] SimError),
    /// The KV-event publisher could not bind or connect.
    #[error("kv events: {0}")]
    Events(#[from] PublisherError),
    /// The HTTP listener failed.
    #[error("http: {0}")]
    Io(#[from] std::io::Error),
    /// `speedup` must be a positive finite number.
    #[error("speedup must be a positive finite number, got {0}")]
    Speedup(f64),
    /// `fail_rate` must be within `[0, 1]`.
    #[error("fail rate must be within 0..=1, got {0}")]
    FailRate(f64),
    /// `data_parallel_size` must be within `1..=64`.
    #[error("data parallel size must be within 1..=64, got {0}")]
    DataParallelSize(u32),
    /// A rank's event endpoint cannot be derived (no port, or past 65535).
    #[error("kv events for a data-parallel rank: {0}")]
    RankPort(String),
    /// Two static adapters share a name (vLLM refuses to start then too).
    #[error("lora adapter {0:?} is given twice")]
    DuplicateAdapter(String),
}

impl ServerConfig {
    /// The names requests may use for the model; the first is its name in
    /// responses and metrics.
    pub fn served_names(&self) -> Vec<String> {
        if self.served_model_names.is_empty() {
            vec![self.model.clone()]
        } else {
            self.served_model_names.clone()
        }
    }

    /// The static adapters, in load order: `lora_adapters`, then `lora_modules`.
    pub fn static_adapters(&self) -> Vec<LoraModule> {
        let named = self.lora_adapters.iter().map(|n| LoraModule::named(n));
        named.chain(self.lora_modules.iter().cloned()).collect()
    }

    /// Whether LoRA is on (vLLM's `--enable-lora`): some adapter is
    /// configured, or adapters may be loaded at runtime. Only then are the
    /// LoRA metrics exported.
    pub fn lora_enabled(&self) -> bool {
        !self.lora_adapters.is_empty()
            || !self.lora_modules.is_empty()
            || self.allow_runtime_lora_updating
    }
}

/// State shared by the HTTP handlers of one replica.
#[derive(Debug)]
pub(crate) struct AppState {
    pub(crate) config: ServerConfig,
    /// The driver of each data-parallel rank.
    pub(crate) ranks: Vec<mpsc::UnboundedSender<driver::Command>>,
    /// Each rank's counters (`engine="r"` on `/metrics`).
    pub(crate) rank_metrics: Vec<Arc<Metrics>>,
    /// Rank 0's: what the HTTP layer counts itself (tokenizations).
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) tokenizer: Arc<TokenizeService>,
    /// `ServerConfig::served_names`, resolved once.
    pub(crate) served_names: Vec<String>,
    /// The adapters requests may name now (static ones, then runtime loads),
    /// in the order `/v1/models` lists them. Never held across an await.
    pub(crate) adapters: RwLock<Vec<LoraModule>>,
    /// Serialises runtime loads and unloads.
    pub(crate) lora_update: tokio::sync::Mutex<()>,
    pub(crate) next_id: AtomicU64,
    pub(crate) finished: AtomicU64,
    pub(crate) exit: watch::Sender<bool>,
    /// The HTTP address: what a prefill hop advertises as its remote side.
    pub(crate) http_addr: SocketAddr,
    /// Decode hops' parameters as received (`/debug/kv_transfers`).
    pub(crate) kv_received: kv_transfer::Received,
    /// Prefill hops' parameters as answered (`/debug/kv_transfers`).
    pub(crate) kv_answered: kv_transfer::Received,
    /// The Responses API's store (`/v1/responses`), as vLLM's in-process one.
    pub(crate) responses: responses::Store,
}

impl AppState {
    /// Whether `name` is a servable adapter now.
    pub(crate) fn has_adapter(&self, name: &str) -> bool {
        self.adapters.read().unwrap_or_else(PoisonError::into_inner).iter().any(|a| a.name == name)
    }

    /// The servable adapters now.
    pub(crate) fn adapters(&self) -> Vec<LoraModule> {
        self.adapters.read().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Changes the adapter list under its lock.
    pub(crate) fn with_adapters(&self, f: impl FnOnce(&mut Vec<LoraModule>)) {
        f(&mut self.adapters.write().unwrap_or_else(PoisonError::into_inner));
    }

    /// Whether `model` names the model or a servable adapter.
    pub(crate) fn serves(&self, model: &str) -> bool {
        self.served_names.iter().any(|n| n == model) || self.has_adapter(model)
    }
}

/// A running replica.
#[derive(Debug)]
pub struct Replica {
    http_addr: SocketAddr,
    events: Option<LocalEndpoints>,
    rank_events: Vec<LocalEndpoints>,
    metrics: Arc<Metrics>,
    publisher: Option<Arc<Publisher>>,
    shutdown: watch::Sender<bool>,
    exit: watch::Receiver<bool>,
    http: JoinHandle<std::io::Result<()>>,
}

impl Replica {
    /// The bound HTTP address.
    pub fn http_addr(&self) -> SocketAddr {
        self.http_addr
    }

    /// `http://ADDR`.
    pub fn url(&self) -> String {
        format!("http://{}", self.http_addr)
    }

    /// The KV-event endpoints as bound (port 0 resolved); rank 0's.
    pub fn events(&self) -> Option<&LocalEndpoints> {
        self.events.as_ref()
    }

    /// Every data-parallel rank's event endpoints, by rank.
    pub fn rank_events(&self) -> &[LocalEndpoints] {
        &self.rank_events
    }

    /// The replica's counters.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// The publisher, when events are on.
    pub fn publisher(&self) -> Option<&Arc<Publisher>> {
        self.publisher.as_ref()
    }

    /// Completes once `exit_after_requests` requests have finished (never
    /// without that fault).
    pub async fn exited(&self) {
        let mut rx = self.exit.clone();
        if rx.wait_for(|v| *v).await.is_err() {
            std::future::pending::<()>().await;
        }
    }

    /// Stops serving HTTP (in-flight requests end) and waits for it.
    pub async fn shutdown(self) {
        let _ = self.shutdown.send(true);
        let _ = self.http.await;
    }

    /// Waits until the HTTP server stops (it runs until shutdown).
    pub async fn wait(&mut self) -> std::io::Result<()> {
        match (&mut self.http).await {
            Ok(r) => r,
            Err(e) => Err(std::io::Error::other(e)),
        }
    }
}

/// Starts one replica on `listener`. Must run inside a tokio runtime.
pub async fn start(
    config: ServerConfig,
    listener: TcpListener,
    tokenizer: Arc<TokenizeService>,
) -> Result<Replica, ServerError> {
    if !(config.speedup.is_finite() && config.speedup > 0.0) {
        return Err(ServerError::Speedup(config.speedup));
    }
    if !(0.0..=1.0).contains(&config.faults.fail_rate) {
        return Err(ServerError::FailRate(config.faults.fail_rate));
    }
    let size = config.data_parallel_size;
    if !(1..=64).contains(&size) {
        return Err(ServerError::DataParallelSize(size));
    }
    let adapters = config.static_adapters();
    for (i, a) in adapters.iter().enumerate() {
        if adapters[..i].iter().any(|b| b.name == a.name) {
            return Err(ServerError::DuplicateAdapter(a.name.clone()));
        }
    }
    let (mut ranks, mut rank_metrics, mut rank_events, mut publishers) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for rank in 0..size {
        let mut engine = Engine::new(config.engine.clone())?;
        // vLLM loads its static adapters at startup, each into a GPU slot.
        for a in &adapters {
            engine.load_lora(&a.name);
        }
        let publisher = match &config.events {
            Some(pc) => Some(Arc::new(Publisher::start(rank_publisher(pc, rank)?).await?)),
            None => None,
        };
        if let Some(p) = &publisher {
            rank_events.push(p.local_endpoints().clone());
        }
        let metrics = Arc::new(Metrics::new(config.engine.max_model_len()));
        if config.lora_enabled() {
            metrics.enable_lora();
        }
        if config.kv_transfer.is_some() {
            metrics.enable_kv_transfer();
        }
        // Counters as of start-up (the static adapters' loads) before the
        // server answers: the driver task may not have run by the first
        // scrape.
        driver::report(&engine, &metrics);
        let (tx, rx) = mpsc::unbounded_channel();
        // vLLM stamps a DP engine's batches with its rank.
        let dp_rank = (size > 1).then_some(rank);
        let driver = driver::run(
            engine,
            rx,
            config.speedup,
            publisher.clone(),
            dp_rank,
            Arc::clone(&metrics),
        );
        tokio::spawn(driver);
        ranks.push(tx);
        rank_metrics.push(metrics);
        publishers.push(publisher);
    }
    let publisher = publishers.swap_remove(0);
    let metrics = Arc::clone(&rank_metrics[0]);
    let events = rank_events.first().cloned();
    let http_addr = listener.local_addr()?;
    let (exit_tx, exit) = watch::channel(false);
    let served_names = config.served_names();
    let state = Arc::new(AppState {
        config,
        ranks,
        rank_metrics,
        metrics: Arc::clone(&metrics),
        tokenizer,
        served_names,
        adapters: RwLock::new(adapters),
        lora_update: tokio::sync::Mutex::new(()),
        next_id: AtomicU64::new(1),
        finished: AtomicU64::new(0),
        exit: exit_tx,
        http_addr,
        kv_received: kv_transfer::Received::default(),
        kv_answered: kv_transfer::Received::default(),
        responses: responses::Store::default(),
    });
    let app = routes::router(state);
    let (shutdown, mut shutdown_rx) = watch::channel(false);
    // vLLM's server (uvicorn) sets TCP_NODELAY; without it, small SSE writes
    // on a kept-alive connection wait for the client's delayed ACK (~40 ms).
    let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
        let _ = tcp.set_nodelay(true);
    });
    let http = tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async move {
                let _ = shutdown_rx.wait_for(|v| *v).await;
            })
            .await
    });
    Ok(Replica { http_addr, events, rank_events, metrics, publisher, shutdown, exit, http })
}

/// Rank `rank`'s publisher: the event and replay ports plus the rank, by
/// vLLM's rule ([`offset_endpoint_port`]).
fn rank_publisher(pc: &PublisherConfig, rank: u32) -> Result<PublisherConfig, ServerError> {
    let offset =
        |endpoint: &str| offset_endpoint_port(endpoint, rank).map_err(ServerError::RankPort);
    let mut out = pc.clone();
    out.endpoint = offset(&pc.endpoint)?;
    out.replay_endpoint = pc.replay_endpoint.as_deref().map(offset).transpose()?;
    Ok(out)
}
