//! The wiring's state: every handle the gateway is made of, built once at
//! start. Only the wiring (`server.rs`, this file) sees it; each component
//! gets a context holding just the handles it uses, built here
//! (`api_context`, `admin_context`, `dashboard_context`, `peer_context`)
//! or in `Shared::new` (the registry, the fleet view).
//!
//! Fleet state (index, router, replica status) sits behind one lock,
//! [`FleetHandle`], taken through closures: none is held across an `.await`.
//! The replica directory is read lock-free (`directory.rs`).

use std::sync::Arc;
use std::time::Instant;

use kvgate_tokenize::service::TokenizeService;
use tokio::sync::{watch, Semaphore};

use crate::config::GatewayConfig;
use kvgate_router::Router;

use crate::config::settings::Settings;
use crate::doors::admin::AdminContext;
use crate::doors::api::ApiContext;
use crate::doors::dashboard::DashboardContext;
use crate::doors::epp::EppContext;
use crate::doors::peer_state::Peers;
use crate::doors::peers::PeerContext;
use crate::doors::shed::Shedding;
use crate::doors::tenant_keys::TenantKeys;
use crate::doors::throttle::{ClientAddr, KeyKind, KeyThrottle, KeyVerdict};
use crate::error::{ConfigError, StartError};
use crate::observe::metrics::Metrics;
use crate::replicas::directory::Directory;
use crate::replicas::fleet_handle::FleetHandle;
use crate::replicas::fleet_view::FleetView;
use crate::replicas::pool::{Pool, Pools};
use crate::replicas::registry::Registry;
use crate::request::adapter_load::AdapterLoader;
use crate::request::admission::Admission;
use crate::request::engine_client::EngineClient;
use crate::request::forward::Forwarder;
use crate::request::placement::Placer;
use crate::request::prepare::Preparer;
use crate::request::tenant_queue::TenantQueue;
use kvgate_fleet::Fleet;

/// Everything the gateway is made of. Named only by the wiring
/// (`crates/kvgate/tests/fleet_owner.rs` checks).
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) config: GatewayConfig,
    /// `config` in typed sections (`settings.rs`).
    pub(crate) settings: Settings,
    /// The model pools: per pool its model, tokenizer and admission queue
    /// (its router is in the fleet).
    pub(crate) pools: Arc<Pools>,
    /// The index, the router and every replica's status: the one owner of
    /// fleet state (`fleet.rs`).
    pub(crate) fleet: Arc<FleetHandle>,
    /// Who the replicas are and how to reach them, read lock-free.
    pub(crate) replicas: Arc<Directory>,
    /// HTTP to the engines (`HttpEngines`; a fake in unit tests).
    pub(crate) engines: Arc<dyn EngineClient>,
    /// HTTP to peer instances.
    pub(crate) client: reqwest::Client,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) inflight: Arc<Semaphore>,
    /// Runtime LoRA loads (`adapter_load.rs`), shared by both front doors.
    pub(crate) loader: Arc<AdapterLoader>,
    /// Client connections open, bounded by `limits.max_connections`.
    pub(crate) connections: Arc<Semaphore>,
    /// Wrong keys per client address (`limits.key_failures_per_minute`).
    pub(crate) key_throttle: Arc<KeyThrottle>,
    /// The fleet's one block size (validated at startup).
    pub(crate) block_size: u32,
    /// The key of the response ids Responses API clients get
    /// (`auth.affinity_key`, or one drawn for this process).
    pub(crate) affinity: crate::request::affinity::AffinityKey,
    /// Set on shutdown: new requests get 503.
    pub(crate) closing: watch::Sender<bool>,
    /// Peer instances (load sharing).
    pub(crate) peers: Arc<Peers>,
    /// Adding, draining and removing replicas (startup, admin, discovery).
    pub(crate) registry: Arc<Registry>,
    /// What metrics, admin and the dashboard read (the snapshot).
    pub(crate) view: Arc<FleetView>,
    /// Client keys → tenants (`[tenants]`; empty without).
    pub(crate) tenant_keys: Arc<TenantKeys>,
}

impl Shared {
    /// The state for `config` with no replica registered yet
    /// (`Registry::add_ranks` registers them and starts their tasks), with
    /// one tokenizer per pool (`GatewayConfig::pools` order).
    pub(crate) fn new(
        config: GatewayConfig,
        settings: Settings,
        tokenizers: Vec<Arc<TokenizeService>>,
        engines: Arc<dyn EngineClient>,
        client: reqwest::Client,
    ) -> Result<Shared, StartError> {
        let pool_configs = config.pools();
        if tokenizers.len() != pool_configs.len() {
            return Err(StartError::Tokenizer(format!(
                "{} tokenizers for {} pools",
                tokenizers.len(),
                pool_configs.len()
            )));
        }
        let mut routers = Vec::new();
        let mut pools = Vec::new();
        // Pools with prefill replicas get a prefill side (`[disagg]`).
        let mut prefill_sides = Vec::new();
        for (id, (p, tokenizer)) in pool_configs.into_iter().zip(tokenizers).enumerate() {
            let has_prefill = p.replicas.iter().any(|r| r.role == crate::config::Role::Prefill);
            let mut router = Router::new(p.router.clone(), Arc::default()).map_err(|e| {
                StartError::Config(ConfigError::Invalid(format!("pool {}: {e}", p.name)))
            })?;
            // Any drop in a booking's load (first token, end, expiry...)
            // wakes the head of its pool's admission queue (and the heads
            // of its tenant queue's bands).
            let tenants = match &config.tenants {
                Some(t) => {
                    Some(Arc::new(TenantQueue::new(&t.queue, crate::clock::now()).map_err(
                        |e| StartError::Config(ConfigError::Invalid(format!("tenants: {e}"))),
                    )?))
                }
                None => None,
            };
            let admission = Arc::new(Admission::with_tenants(tenants));
            let waiters = Arc::clone(&admission);
            router.on_load_change(Arc::new(move || waiters.load_changed()));
            if has_prefill {
                // Its own ledger; a prefill hop's end frees the pool too.
                let mut side = Router::new(p.router.clone(), Arc::default()).map_err(|e| {
                    StartError::Config(ConfigError::Invalid(format!("pool {}: {e}", p.name)))
                })?;
                let waiters = Arc::clone(&admission);
                side.on_load_change(Arc::new(move || waiters.load_changed()));
                prefill_sides.push((id, side));
            }
            routers.push(router);
            pools.push(Arc::new(Pool::new(id, p.name, p.model, tokenizer, admission, has_prefill)));
        }
        let pools = Arc::new(Pools::new(pools));
        let block_size = config.block_size();
        let affinity =
            crate::request::affinity::AffinityKey::new(config.auth.affinity_key.as_deref());
        if !affinity.shared {
            tracing::info!(
                "no auth.affinity_key: Responses API ids verify on this instance only; give \
                 every instance of the fleet the same key to continue conversations on any of them"
            );
        }
        let (closing, _) = watch::channel(false);
        let mut core = Fleet::new(routers, settings.health);
        for (id, side) in prefill_sides {
            core.add_prefill_side(id, side, kvgate_router::Disagg::new(config.disagg.planner()));
        }
        let fleet = Arc::new(FleetHandle::new(core));
        let metrics = Arc::new(Metrics::new());
        let replicas = Arc::new(Directory::default());
        let peers = Arc::new(Peers::new());
        let registry = Arc::new(Registry {
            fleet: Arc::clone(&fleet),
            replicas: Arc::clone(&replicas),
            engines: Arc::clone(&engines),
            metrics: Arc::clone(&metrics),
            probes: settings.probes,
            block_size,
            pools: Arc::clone(&pools),
        });
        let view = Arc::new(FleetView {
            fleet: Arc::clone(&fleet),
            replicas: Arc::clone(&replicas),
            peers: Arc::clone(&peers),
            pools: Arc::clone(&pools),
            started: Instant::now(),
        });
        Ok(Shared {
            settings,
            inflight: Arc::new(Semaphore::new(config.limits.max_concurrent_requests)),
            loader: Arc::new(AdapterLoader {
                engines: Arc::clone(&engines),
                fleet: Arc::clone(&fleet),
                replicas: Arc::clone(&replicas),
                timeout: settings.request.first_byte.min(std::time::Duration::from_secs(120)),
                loading: Default::default(),
            }),
            connections: Arc::new(Semaphore::new(config.limits.max_connections)),
            pools,
            fleet,
            replicas,
            engines,
            client,
            metrics,
            key_throttle: Arc::new(KeyThrottle::new(config.limits.key_failures_per_minute)),
            block_size,
            affinity,
            closing,
            peers,
            registry,
            view,
            tenant_keys: Arc::new(config.tenants.as_ref().map(TenantKeys::new).unwrap_or_default()),
            config,
        })
    }

    /// The key check of one request, through the wrong-key throttle
    /// (`throttle::verdict` with this gateway's throttle and metrics).
    pub(crate) fn key_verdict(
        &self,
        addr: Option<&ClientAddr>,
        kind: KeyKind,
        presented: bool,
        ok: bool,
    ) -> KeyVerdict {
        crate::doors::throttle::verdict(
            &self.key_throttle,
            &self.metrics,
            addr,
            kind,
            presented,
            ok,
        )
    }

    /// The client-facing handlers' context, the request path's stages in it.
    pub(crate) fn api_context(&self) -> Arc<ApiContext> {
        let c = &self.config;
        let preparer = self.preparer();
        let forwarder = Forwarder {
            placer: self.placer(),
            fleet: Arc::clone(&self.fleet),
            replicas: Arc::clone(&self.replicas),
            engines: Arc::clone(&self.engines),
            metrics: Arc::clone(&self.metrics),
            limits: self.settings.request,
            block_size: self.block_size,
            replica_header: c.replica_header,
            affinity: self.affinity.clone(),
        };
        Arc::new(ApiContext {
            pools: Arc::clone(&self.pools),
            closing: self.closing.subscribe(),
            preparer,
            forwarder,
            fleet: Arc::clone(&self.fleet),
            view: Arc::clone(&self.view),
            metrics: Arc::clone(&self.metrics),
        })
    }

    /// A front door's placement: the fleet's decision and the pools'
    /// admission queues.
    pub(crate) fn placer(&self) -> Placer {
        Placer {
            fleet: Arc::clone(&self.fleet),
            pools: Arc::clone(&self.pools),
            metrics: Arc::clone(&self.metrics),
            loader: Arc::clone(&self.loader),
            tenant_keys: Arc::clone(&self.tenant_keys),
        }
    }

    /// The request path's first stage, for either front door.
    pub(crate) fn preparer(&self) -> Preparer {
        let c = &self.config;
        Preparer {
            pools: Arc::clone(&self.pools),
            max_messages: c.limits.max_messages,
            block_size: self.block_size,
            metrics: Arc::clone(&self.metrics),
            fleet: Arc::clone(&self.fleet),
            affinity: self.affinity.clone(),
        }
    }

    /// The endpoint picker's context.
    pub(crate) fn epp_context(&self) -> Arc<EppContext> {
        let c = &self.config;
        Arc::new(EppContext {
            preparer: self.preparer(),
            placer: self.placer(),
            fleet: Arc::clone(&self.fleet),
            replicas: Arc::clone(&self.replicas),
            shedding: self.shedding(),
            metrics: Arc::clone(&self.metrics),
            config: c.epp.clone(),
            api_keys: c.auth.api_keys.clone(),
            max_body_bytes: c.limits.max_body_bytes,
            block_size: self.block_size,
            replica_header: c.replica_header,
        })
    }

    /// The generation routes' shedding layer.
    pub(crate) fn shedding(&self) -> Arc<Shedding> {
        Arc::new(Shedding {
            closing: self.closing.subscribe(),
            inflight: Arc::clone(&self.inflight),
            metrics: Arc::clone(&self.metrics),
        })
    }

    /// The admin handlers' context.
    pub(crate) fn admin_context(&self) -> Arc<AdminContext> {
        Arc::new(AdminContext {
            view: Arc::clone(&self.view),
            registry: Arc::clone(&self.registry),
            config: self.config.clone(),
        })
    }

    /// The dashboard's context.
    pub(crate) fn dashboard_context(&self) -> DashboardContext {
        DashboardContext {
            config: self.config.dashboard.clone(),
            timing: self.settings.dashboard,
            admin_key: self.config.auth.admin_key.clone(),
            throttle: Arc::clone(&self.key_throttle),
            metrics: Arc::clone(&self.metrics),
            view: Arc::clone(&self.view),
            closing: self.closing.subscribe(),
        }
    }

    /// The peer endpoint's and the peer tasks' context.
    pub(crate) fn peer_context(&self) -> Arc<PeerContext> {
        Arc::new(PeerContext {
            config: self.config.peers.clone(),
            timing: self.settings.peers,
            scheme: self.config.tls.scheme(),
            peers: Arc::clone(&self.peers),
            fleet: Arc::clone(&self.fleet),
            replicas: Arc::clone(&self.replicas),
            client: self.client.clone(),
            throttle: Arc::clone(&self.key_throttle),
            metrics: Arc::clone(&self.metrics),
        })
    }
}

/// The client-facing context over `engines` and the registry that adds
/// replicas to it, for unit tests that drive the request path without
/// sockets (`forward/tests.rs`).
#[cfg(test)]
pub(crate) fn request_path_for_tests(
    config: GatewayConfig,
    tokenizer: Arc<TokenizeService>,
    engines: Arc<dyn EngineClient>,
) -> Result<(Arc<ApiContext>, Arc<Registry>), StartError> {
    let tokenizers = vec![tokenizer; config.pools().len()];
    let settings = Settings::from_config(&config);
    let shared = Shared::new(config, settings, tokenizers, engines, reqwest::Client::new())?;
    Ok((shared.api_context(), Arc::clone(&shared.registry)))
}
