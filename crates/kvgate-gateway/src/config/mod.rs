//! `kvgate serve`'s configuration: one serde struct. A TOML file is read
//! first, `--set key=value` pairs and the dedicated flags (each with a
//! `KVGATE_*` environment variable) override it, and [`GatewayConfig::validate`]
//! checks the result once. `docs/config.md` lists every key with the defaults
//! of these `Default` impls (a test keeps the two in step).

use std::net::SocketAddr;

use kvgate_fleet::HealthRules;
use kvgate_router::RouterConfig;
use serde::{Deserialize, Serialize};

pub(crate) mod cluster_config;
pub(crate) mod disagg_config;
pub(crate) mod epp_config;
pub(crate) mod model_config;
pub(crate) mod nats_config;
pub(crate) mod pool_config;
pub(crate) mod replica_config;
pub(crate) mod settings;
pub(crate) mod tenants_config;
pub(crate) mod tls_config;

pub use crate::config::cluster_config::{DiscoveryConfig, PeersConfig};
pub use crate::config::disagg_config::{DisaggConfig, Role, SplitMode};
pub use crate::config::epp_config::{EppConfig, DEFAULT_EPP_LISTEN};
pub use crate::config::model_config::ModelConfig;
pub use crate::config::nats_config::{NatsConfig, DEFAULT_SUBJECT as DEFAULT_NATS_SUBJECT};
pub use crate::config::pool_config::{PoolConfig, DEFAULT_POOL};
pub use crate::config::replica_config::{Passthrough, ReplicaConfig, MAX_DP_SIZE};
pub use crate::config::tenants_config::{TenantKey, TenantsSection, DEFAULT_TENANT_HEADER};
pub use crate::config::tls_config::TlsConfig;
use crate::error::ConfigError;

/// Who may call kvgate.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AuthConfig {
    /// Client keys (`Authorization: Bearer K`); empty serves without keys,
    /// which is allowed on loopback only unless `allow_unauthenticated`.
    pub api_keys: Vec<String>,
    /// The admin key for `/admin/*` (header `Authorization: Bearer K` or
    /// `x-kvgate-admin-key`); without it the admin API is off unless it
    /// listens on loopback.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub admin_key: Option<String>,
    /// Serve a non-loopback address without client keys (logs a warning).
    pub allow_unauthenticated: bool,
    /// The key that authenticates the Responses API ids kvgate hands out,
    /// which name the replica holding each response (`docs/agents.md`).
    /// Every instance of a fleet needs the same one; unset, each instance
    /// draws its own, and a conversation continues only on the instance
    /// that started it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub affinity_key: Option<String>,
}

/// Sizes and timeouts.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LimitsConfig {
    /// Largest request body, bytes.
    pub max_body_bytes: usize,
    /// Largest request header section, bytes.
    pub max_header_bytes: usize,
    /// Most chat messages per request.
    pub max_messages: usize,
    /// A client must send its headers within this, ms.
    pub header_read_timeout_ms: u64,
    /// Connecting to an engine, ms.
    pub connect_timeout_ms: u64,
    /// Waiting for an engine's response headers, ms.
    pub first_byte_timeout_ms: u64,
    /// A stream with no bytes from the engine for this long ends with an
    /// error event, ms.
    pub stream_idle_timeout_ms: u64,
    /// Further replicas tried when one fails before any byte was sent.
    pub max_retries: u32,
    /// Wrong keys (client, admin, dashboard login, peer; each kind on its
    /// own) one client address may present per minute; past it, that kind
    /// of request gets 429 from that address until its minute ends. 0
    /// disables the limit.
    pub key_failures_per_minute: u32,
    /// Requests served at once; more get 429 with `Retry-After` at once.
    pub max_concurrent_requests: usize,
    /// Client connections open at once, over all listeners; a connection
    /// past it is closed as soon as it is accepted (counted). Idle and
    /// slow connections are bounded by this and the header-read timeout.
    pub max_connections: usize,
    /// The index keeps at most this many blocks per replica and tier while
    /// the engine has not reported its cache size (`vllm:cache_config_info`);
    /// once it has, that size (plus a slack of 1/16) is the bound. Over it,
    /// the oldest entries are dropped and counted: a stream that stores more
    /// than the engine can hold has lost removals, or is hostile.
    pub index_blocks_per_tier: u64,
    /// On SIGTERM, in-flight requests get this long to finish, ms.
    pub shutdown_grace_ms: u64,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        LimitsConfig {
            max_body_bytes: 32 << 20,
            max_header_bytes: 64 << 10,
            max_messages: 10_000,
            header_read_timeout_ms: 10_000,
            connect_timeout_ms: 2_000,
            first_byte_timeout_ms: 600_000,
            stream_idle_timeout_ms: 120_000,
            max_retries: 2,
            key_failures_per_minute: 20,
            max_concurrent_requests: 4_096,
            max_connections: 16_384,
            index_blocks_per_tier: HealthRules::default().index_bound,
            shutdown_grace_ms: 30_000,
        }
    }
}

/// Watching replicas.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MonitorConfig {
    /// `GET /health` interval, ms.
    pub health_interval_ms: u64,
    /// `GET /metrics` scrape interval, ms.
    pub metrics_interval_ms: u64,
    /// Per-probe timeout, ms.
    pub probe_timeout_ms: u64,
    /// Consecutive failed probes (or failed requests) before a replica
    /// leaves rotation.
    pub unhealthy_after: u32,
    /// A replica out of rotation this long has its index entries purged, ms.
    pub purge_after_ms: u64,
    /// After an event reset, the replica counts as degraded (overlap
    /// ignored) until events have flowed for this long, ms.
    pub rebuild_ms: u64,
}

impl Default for MonitorConfig {
    fn default() -> Self {
        MonitorConfig {
            health_interval_ms: 1_000,
            metrics_interval_ms: 1_000,
            probe_timeout_ms: 1_000,
            unhealthy_after: HealthRules::default().unhealthy_after,
            purge_after_ms: HealthRules::default().purge_after.as_millis() as u64,
            rebuild_ms: HealthRules::default().rebuild.as_millis() as u64,
        }
    }
}

/// The simulated replicas `kvgate serve` starts when none are configured.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EmbeddedSimConfig {
    /// How many.
    pub replicas: usize,
    /// GPU KV blocks each.
    pub num_gpu_blocks: u32,
    /// Timing preset (`dynamo_mocker`, `llmd_qwen3_32b`, `vllm_cpu_tiny` or `vllm_cpu_gpu_like`).
    pub timing: String,
    /// Simulated time runs this many times faster than real time.
    pub speedup: f64,
    /// `max_tokens` when a request gives none.
    pub default_max_tokens: u32,
}

impl Default for EmbeddedSimConfig {
    fn default() -> Self {
        EmbeddedSimConfig {
            replicas: 4,
            num_gpu_blocks: 8192,
            timing: "llmd_qwen3_32b".to_owned(),
            speedup: 1.0,
            default_max_tokens: 64,
        }
    }
}

/// The live dashboard: `/dashboard` and its stream, served with the admin
/// API and behind the admin key.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DashboardConfig {
    /// Serve `/dashboard`.
    pub enabled: bool,
    /// Period of the stream's frames, ms (one frame for all viewers).
    pub interval_ms: u64,
    /// Rates, hit rates and TTFT percentiles cover this trailing window, s.
    pub window_s: u64,
    /// Decisions per frame (newest first).
    pub decisions: usize,
    /// Lifetime of a login cookie, s.
    pub session_s: u64,
}

impl Default for DashboardConfig {
    fn default() -> Self {
        DashboardConfig {
            enabled: true,
            interval_ms: 1_000,
            window_s: 10,
            decisions: 20,
            session_s: 12 * 3600,
        }
    }
}

impl DashboardConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        let ok = (100..=60_000).contains(&self.interval_ms)
            && (1..=3600).contains(&self.window_s)
            && self.decisions <= 200
            && self.session_s >= 60;
        ok.then_some(()).ok_or_else(|| {
            ConfigError::Invalid(
                "dashboard: interval_ms must be in 100..=60000, window_s in 1..=3600, \
                 decisions at most 200, session_s at least 60"
                    .into(),
            )
        })
    }
}

/// Everything `kvgate serve` reads.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GatewayConfig {
    /// The OpenAI-compatible API.
    pub listen: SocketAddr,
    /// The admin API (`/admin/*`); default loopback. Unset serves admin on
    /// `listen` (then an admin key is required off loopback).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub admin_listen: Option<SocketAddr>,
    /// `/metrics` on its own address; unset serves it on `listen`. Either
    /// way it is behind the client keys when there are any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metrics_listen: Option<SocketAddr>,
    /// Add `x-kvgate-replica: <name>` to responses.
    pub replica_header: bool,
    /// Threads of the async runtime (HTTP, KV events, relaying); 0 = one
    /// per four cores, at least one. Tokenization has its own threads
    /// (`model.tokenizer_threads`).
    pub worker_threads: usize,
    /// How often an idle gateway hands freed memory back to the OS, ms; 0
    /// never (and no purge after the tokenizer load). The allocator returns
    /// pages only while something allocates, so without this a quiet
    /// gateway keeps its load-time and burst-time peaks resident.
    pub memory_release_ms: u64,
    /// The model (without `[[pools]]`).
    pub model: ModelConfig,
    /// Replicas (without `[[pools]]`); none starts `embedded_sims`.
    pub replicas: Vec<ReplicaConfig>,
    /// Model pools, one per base model; without any, `model`, `replicas`,
    /// `discovery` and `router` are the one pool (`pool_config.rs`).
    pub pools: Vec<PoolConfig>,
    /// Routing.
    pub router: RouterConfig,
    /// Keys.
    pub auth: AuthConfig,
    /// Limits and timeouts.
    pub limits: LimitsConfig,
    /// Replica monitoring.
    pub monitor: MonitorConfig,
    /// The embedded default fleet.
    pub embedded_sims: EmbeddedSimConfig,
    /// The live dashboard.
    pub dashboard: DashboardConfig,
    /// Peer kvgate instances sharing their in-flight bookings.
    pub peers: PeersConfig,
    /// Engines found through DNS.
    pub discovery: DiscoveryConfig,
    /// The endpoint picker front door (`kvgate epp`).
    pub epp: EppConfig,
    /// TLS on the listeners, and to https:// engines and peers.
    pub tls: TlsConfig,
    /// Prefill/decode disaggregation, for pools with `role = "prefill"`
    /// replicas.
    pub disagg: DisaggConfig,
    /// Tenants: fair queuing, priority bands and limits
    /// (`docs/tenants.md`). Unset, requests are one first-come stream.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tenants: Option<TenantsSection>,
}

impl Default for GatewayConfig {
    fn default() -> Self {
        GatewayConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 8000)),
            admin_listen: Some(SocketAddr::from(([127, 0, 0, 1], 8001))),
            metrics_listen: None,
            replica_header: true,
            worker_threads: 0,
            memory_release_ms: 2000,
            model: ModelConfig::default(),
            replicas: Vec::new(),
            pools: Vec::new(),
            router: RouterConfig::default(),
            auth: AuthConfig::default(),
            limits: LimitsConfig::default(),
            monitor: MonitorConfig::default(),
            embedded_sims: EmbeddedSimConfig::default(),
            dashboard: DashboardConfig::default(),
            peers: PeersConfig::default(),
            discovery: DiscoveryConfig::default(),
            epp: EppConfig::default(),
            tls: TlsConfig::default(),
            disagg: DisaggConfig::default(),
            tenants: None,
        }
    }
}

impl GatewayConfig {
    /// The async runtime's thread count: `worker_threads`, or one per four
    /// of `cores`. The request path's heavy part, tokenization, runs on the
    /// tokenizer pool (one thread per core); what is left on the runtime is
    /// light, and on a small machine more runtime threads only add
    /// cross-thread wake-ups: on 2 cores, one thread instead of two cut
    /// kvgate's CPU per request by ~15 % and raised the load it sustains
    /// (docs/benchmarks.md, "`kvgate serve` overhead").
    pub fn runtime_threads(&self, cores: usize) -> usize {
        if self.worker_threads > 0 {
            self.worker_threads
        } else {
            (cores / 4).max(1)
        }
    }

    /// Reads a TOML document, applies `key=value` overrides (dotted keys,
    /// TOML values; a value that is not valid TOML is taken as a string),
    /// and deserialises.
    pub fn from_toml_with_overrides(
        text: &str,
        overrides: &[String],
    ) -> Result<GatewayConfig, ConfigError> {
        let mut doc: toml::Table =
            toml::from_str(text).map_err(|e| ConfigError::Parse(e.to_string()))?;
        for o in overrides {
            let Some((key, value)) = o.split_once('=') else {
                return Err(ConfigError::Invalid(format!("--set {o:?}: expected key=value")));
            };
            set_dotted(&mut doc, key.trim(), parse_value(value.trim()))?;
        }
        crate::config::pool_config::inherit_router(&mut doc);
        toml::Value::Table(doc)
            .try_into()
            .map_err(|e: toml::de::Error| ConfigError::Parse(e.to_string()))
    }

    /// The configuration without its secrets (client, admin, peer and
    /// engine keys), for printing: `--print-config` must not put keys on a
    /// terminal or into a file that gets shared.
    pub fn without_secrets(&self) -> GatewayConfig {
        let mut c = self.clone();
        c.auth.api_keys.clear();
        c.auth.admin_key = None;
        c.peers.key = None;
        c.peers.nats.token = None;
        c.peers.nats.password = None;
        c.discovery.api_key = None;
        if let Some(t) = &mut c.tenants {
            for k in &mut t.keys {
                k.key = "(secret)".to_owned();
            }
        }
        for r in &mut c.replicas {
            r.api_key = None;
        }
        for p in &mut c.pools {
            p.discovery.api_key = None;
            for r in &mut p.replicas {
                r.api_key = None;
            }
        }
        c
    }

    /// The pools served, resolved: the `[[pools]]` entries (each named, its
    /// replicas marked with the pool), or the top-level `model`,
    /// `replicas`, `discovery` and `router` as the one pool
    /// [`DEFAULT_POOL`].
    pub fn pools(&self) -> Vec<PoolConfig> {
        if self.pools.is_empty() {
            return vec![PoolConfig {
                name: DEFAULT_POOL.to_owned(),
                model: self.model.clone(),
                replicas: self.replicas.clone(),
                discovery: self.discovery.clone(),
                router: self.router.clone(),
            }];
        }
        let mut pools = self.pools.clone();
        for p in &mut pools {
            p.name = p.display_name().to_owned();
            for r in &mut p.replicas {
                r.pool = Some(p.name.clone());
            }
            // `--replica URL,pool=NAME` entries join the pool they name.
            let named = self.replicas.iter().filter(|r| r.pool.as_deref() == Some(&p.name));
            p.replicas.extend(named.cloned());
        }
        pools
    }

    /// The configuration as it is served, for `--print-config`: with
    /// `[[pools]]`, each pool named and holding its replicas (the
    /// `--replica …,pool=P` ones moved in), its router already resolved
    /// against the top-level one when the file was read.
    pub fn resolved(&self) -> GatewayConfig {
        let mut c = self.clone();
        if !c.pools.is_empty() {
            c.pools = self.pools();
            c.replicas.clear();
        }
        c
    }

    /// The fleet's one block size: the static replicas', else that of the
    /// first pool discovering engines.
    pub fn block_size(&self) -> u32 {
        let pools = self.pools();
        let discovered = || pools.iter().find(|p| p.discovery.dns.is_some());
        match self.all_replicas().first() {
            Some(r) => r.block_size,
            None => discovered().map_or(self.discovery.block_size, |p| p.discovery.block_size),
        }
    }

    /// Every replica of every pool.
    pub fn all_replicas(&self) -> Vec<ReplicaConfig> {
        self.pools().into_iter().flat_map(|p| p.replicas).collect()
    }

    /// Checks the whole configuration once; everything else trusts it.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |m: String| Err(ConfigError::Invalid(m));
        self.router.validate().map_err(|e| ConfigError::Invalid(e.to_string()))?;
        self.disagg.validate()?;
        if self.worker_threads > 1024 {
            return bad(format!("worker_threads {} is above 1024", self.worker_threads));
        }
        let auth = &self.auth;
        if auth.api_keys.iter().any(|k| k.len() < 8) {
            return bad("auth.api_keys: every key needs at least 8 characters".into());
        }
        if auth.admin_key.as_ref().is_some_and(|k| k.len() < 8) {
            return bad("auth.admin_key needs at least 8 characters".into());
        }
        if !self.listen.ip().is_loopback()
            && auth.api_keys.is_empty()
            && !auth.allow_unauthenticated
        {
            return bad(format!(
                "listen {} is not loopback and no client keys are set: set auth.api_keys \
                 (--api-key) or pass --allow-unauthenticated",
                self.listen
            ));
        }
        if let Some(m) = self.metrics_listen {
            if !m.ip().is_loopback() && auth.api_keys.is_empty() && !auth.allow_unauthenticated {
                return bad(format!(
                    "metrics_listen {m} is not loopback and no client keys are set (they \
                     protect /metrics too): set auth.api_keys or pass --allow-unauthenticated"
                ));
            }
        }
        let admin_addr = self.admin_listen.unwrap_or(self.listen);
        if !admin_addr.ip().is_loopback() && auth.admin_key.is_none() {
            return bad(format!(
                "the admin API would listen on {admin_addr} (not loopback) without \
                 auth.admin_key (--admin-key)"
            ));
        }
        let l = &self.limits;
        if l.max_body_bytes == 0
            || l.max_header_bytes < 1024
            || l.max_concurrent_requests == 0
            || l.max_connections == 0
        {
            return bad("limits: body, header and concurrency limits must be positive".into());
        }
        let m = &self.monitor;
        if m.health_interval_ms == 0 || m.metrics_interval_ms == 0 || m.probe_timeout_ms == 0 {
            return bad("monitor: intervals and timeouts must be positive".into());
        }
        if !self.pools.is_empty()
            && (self.replicas.iter().any(|r| r.pool.is_none())
                || self.discovery.dns.is_some()
                || self.model != ModelConfig::default())
        {
            return bad("with [[pools]], put model, replicas and discovery inside each pool \
                        (the top-level ones describe the single pool of a config without them; \
                        a top-level replica must name its pool)"
                .into());
        }
        let names: Vec<String> = self.pools().into_iter().map(|p| p.name).collect();
        if let Some(r) = self
            .replicas
            .iter()
            .find(|r| r.pool.as_deref().is_some_and(|p| !names.iter().any(|n| n == p)))
        {
            return bad(format!(
                "replica {:?}: no pool is named {:?}",
                r.url,
                r.pool.as_deref().unwrap_or("")
            ));
        }
        let pools = self.pools();
        crate::config::pool_config::validate_pools(&pools)?;
        for p in &pools {
            self.validate_pool_replicas(p)?;
        }
        let all = self.all_replicas();
        if let Some(first) = all.first() {
            if let Some(other) = all.iter().find(|r| r.block_size != first.block_size) {
                return bad(format!(
                    "replicas disagree on block_size ({} has {}, {} has {}): the fleet \
                     shares one block size",
                    first.url, first.block_size, other.url, other.block_size
                ));
            }
        }
        for p in &pools {
            if let (Some(first), Some(_)) = (all.first(), &p.discovery.dns) {
                if first.block_size != p.discovery.block_size {
                    return bad(format!(
                        "discovery.block_size {} differs from the static replicas' {}",
                        p.discovery.block_size, first.block_size
                    ));
                }
            }
        }
        self.tls.validate()?;
        self.peers.validate(&self.tls)?;
        self.epp.validate(self.auth.allow_unauthenticated, &self.tls)?;
        if let Some(t) = &self.tenants {
            t.validate(&self.auth.api_keys)?;
        }
        let s = &self.embedded_sims;
        if all.is_empty() && !(1..=64).contains(&s.replicas) {
            return bad("embedded_sims.replicas must be in 1..=64".into());
        }
        self.dashboard.validate()
    }

    /// One pool's replicas and discovery, checked.
    fn validate_pool_replicas(&self, pool: &PoolConfig) -> Result<(), ConfigError> {
        let bad = |m: String| Err(ConfigError::Invalid(m));
        let names: std::collections::HashSet<String> =
            self.pools().into_iter().map(|p| p.name).collect();
        pool.discovery.validate(&self.tls)?;
        let mut seen = std::collections::HashSet::new();
        for r in &pool.replicas {
            if let Some(p) = r.pool.as_deref().filter(|p| !names.contains(*p)) {
                return bad(format!("replica {:?}: no pool is named {p:?}", r.url));
            }
            let url = reqwest::Url::parse(&r.url)
                .map_err(|e| ConfigError::Invalid(format!("replica url {:?}: {e}", r.url)))?;
            self.tls.check_scheme("replica url", &url)?;
            // One URL may be listed once per data-parallel rank.
            if !seen.insert((r.url.trim_end_matches('/').to_owned(), r.dp_rank)) {
                return bad(format!("replica {:?} is listed twice", r.url));
            }
            r.ranks().map_err(ConfigError::Invalid)?;
            for ep in [&r.events, &r.replay].into_iter().flatten() {
                // Checked here, not only when the subscriber dials it: a
                // typo would otherwise surface as a feed that restarts
                // forever (supervise.rs) instead of a refusal to start.
                let host_port = ep.strip_prefix("tcp://").and_then(|hp| hp.rsplit_once(':'));
                let valid = host_port.is_some_and(|(host, port)| {
                    !host.is_empty()
                        && !port.is_empty()
                        && port.bytes().all(|b| b.is_ascii_digit())
                        && port.parse::<u16>().is_ok_and(|p| p > 0)
                });
                if !valid {
                    return bad(format!(
                        "replica {:?}: endpoint {ep:?} must be tcp://HOST:PORT",
                        r.url
                    ));
                }
            }
            if r.replay.is_some() && r.events.is_none() {
                return bad(format!("replica {:?}: a replay endpoint needs events too", r.url));
            }
            if r.block_size == 0 || r.block_size > 1024 {
                return bad(format!("replica {:?}: block_size must be in 1..=1024", r.url));
            }
        }
        Ok(())
    }
}

fn parse_value(v: &str) -> toml::Value {
    // A bare TOML value (number, bool, array, quoted string) or, failing
    // that, the text itself as a string.
    let wrapped = format!("v = {v}");
    match toml::from_str::<toml::Table>(&wrapped) {
        Ok(mut t) => t.remove("v").unwrap_or_else(|| toml::Value::String(v.to_owned())),
        Err(_) => toml::Value::String(v.to_owned()),
    }
}

fn set_dotted(doc: &mut toml::Table, key: &str, value: toml::Value) -> Result<(), ConfigError> {
    let mut parts: Vec<&str> = key.split('.').collect();
    let Some(last) = parts.pop().filter(|l| !l.is_empty()) else {
        return Err(ConfigError::Invalid(format!("--set: empty key in {key:?}")));
    };
    let mut table = doc;
    for p in parts {
        let entry =
            table.entry(p.to_owned()).or_insert_with(|| toml::Value::Table(toml::Table::new()));
        table = match entry {
            toml::Value::Table(t) => t,
            _ => return Err(ConfigError::Invalid(format!("--set {key}: {p} is not a table"))),
        };
    }
    table.insert(last.to_owned(), value);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runtime_threads_default_to_a_quarter_of_the_cores() {
        let mut c = GatewayConfig::default();
        assert_eq!(c.runtime_threads(1), 1);
        assert_eq!(c.runtime_threads(2), 1);
        assert_eq!(c.runtime_threads(16), 4);
        c.worker_threads = 3;
        assert_eq!(c.runtime_threads(2), 3);
        c.worker_threads = 5000;
        assert!(c.validate().unwrap_err().to_string().contains("worker_threads"));
    }

    #[test]
    fn defaults_validate_and_round_trip_through_toml() {
        let c = GatewayConfig::default();
        c.validate().unwrap();
        let text = toml::to_string(&c).unwrap();
        assert_eq!(GatewayConfig::from_toml_with_overrides(&text, &[]).unwrap(), c);
    }

    #[test]
    fn overrides_reach_nested_keys() {
        let c = GatewayConfig::from_toml_with_overrides(
            "[router]\npolicy = \"round_robin\"\n",
            &[
                "router.epsilon=0.2".into(),
                "model.served_name=my-model".into(),
                "listen=\"127.0.0.1:9\"".into(),
            ],
        )
        .unwrap();
        assert_eq!(c.router.policy, kvgate_router::PolicyKind::RoundRobin);
        assert_eq!(c.router.epsilon, 0.2);
        assert_eq!(c.model.served_name, "my-model");
        assert_eq!(c.listen.port(), 9);
        let e = GatewayConfig::from_toml_with_overrides("", &["router.nope=1".into()]).unwrap_err();
        assert!(e.to_string().contains("nope"), "{e}");
    }

    #[test]
    fn replica_specs_parse_and_bad_ones_are_named() {
        let r = ReplicaConfig::parse_spec(
            "http://h:8000,events=tcp://h:5557,replay=tcp://h:5558,api_key=sekrit12,block_size=32,passthrough=none",
        )
        .unwrap();
        assert_eq!(r.events.as_deref(), Some("tcp://h:5557"));
        assert_eq!(r.block_size, 32);
        assert_eq!(r.passthrough, Passthrough::None);
        assert!(!r.priority_scheduling);
        let r = ReplicaConfig::parse_spec("http://h:8000,priority_scheduling=true").unwrap();
        assert!(r.priority_scheduling);
        for bad in [
            "",
            "http://h,colour=red",
            "http://h,block_size=x",
            "http://h,events",
            "http://h,priority_scheduling=yes",
        ] {
            assert!(ReplicaConfig::parse_spec(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn exposure_without_keys_is_refused() {
        let mut c = GatewayConfig { listen: "0.0.0.0:8000".parse().unwrap(), ..Default::default() };
        assert!(c.validate().unwrap_err().to_string().contains("allow-unauthenticated"));
        c.auth.allow_unauthenticated = true;
        c.validate().unwrap();
        let m = GatewayConfig {
            metrics_listen: Some("0.0.0.0:9100".parse().unwrap()),
            ..Default::default()
        };
        assert!(m.validate().unwrap_err().to_string().contains("metrics_listen"));
        c.admin_listen = Some("0.0.0.0:8001".parse().unwrap());
        assert!(c.validate().unwrap_err().to_string().contains("admin"));
        c.auth.admin_key = Some("admin-key-123".into());
        c.validate().unwrap();
        c.auth.api_keys = vec!["short".into()];
        assert!(c.validate().is_err());
    }

    #[test]
    fn replica_mistakes_are_loud() {
        let mut c = GatewayConfig {
            replicas: vec![ReplicaConfig::new("http://a:1"), ReplicaConfig::new("http://a:1")],
            ..GatewayConfig::default()
        };
        assert!(c.validate().unwrap_err().to_string().contains("twice"));
        c.replicas[1] = ReplicaConfig { block_size: 32, ..ReplicaConfig::new("http://b:1") };
        assert!(c.validate().unwrap_err().to_string().contains("block_size"));
        c.replicas[1] =
            ReplicaConfig { events: Some("udp://x".into()), ..ReplicaConfig::new("http://b:1") };
        assert!(c.validate().unwrap_err().to_string().contains("tcp://"));
        c.replicas[1] = ReplicaConfig::new("ftp://b:1");
        assert!(c.validate().is_err());
    }

    #[test]
    fn a_data_parallel_entry_becomes_one_candidate_per_rank() {
        let r = ReplicaConfig::parse_spec(
            "http://h:8000,name=dp,events=tcp://h:5557,replay=tcp://h:6557,dp_size=3",
        )
        .unwrap();
        let ranks = r.ranks().unwrap();
        let got: Vec<_> = ranks
            .iter()
            .map(|r| {
                (
                    r.name.clone().unwrap(),
                    r.dp_rank,
                    r.events.clone().unwrap(),
                    r.replay.clone().unwrap(),
                )
            })
            .collect();
        assert_eq!(
            got,
            (0..3u32)
                .map(|k| (
                    format!("dp#{k}"),
                    Some(k),
                    format!("tcp://h:{}", 5557 + k),
                    format!("tcp://h:{}", 6557 + k)
                ))
                .collect::<Vec<_>>()
        );
        assert!(ranks.iter().all(|r| r.url == "http://h:8000" && r.dp_size == 1));
        // One entry alone stays itself; port 0 stays 0 (vLLM's rule).
        assert_eq!(
            ReplicaConfig::new("http://h").ranks().unwrap(),
            vec![ReplicaConfig::new("http://h")]
        );
        let mut zero = ReplicaConfig::new("http://h");
        zero.events = Some("tcp://h:0".into());
        zero.dp_size = 2;
        assert!(zero.ranks().unwrap().iter().all(|r| r.events.as_deref() == Some("tcp://h:0")));
    }

    #[test]
    fn bad_data_parallel_entries_are_refused() {
        for spec in ["http://h,dp_size=0", "http://h,dp_size=x", "http://h,dp_rank=-1"] {
            assert!(ReplicaConfig::parse_spec(spec).is_err(), "{spec}");
        }
        let mut both = ReplicaConfig::new("http://h");
        both.dp_size = 2;
        both.dp_rank = Some(0);
        assert!(both.ranks().is_err());
        let mut huge = ReplicaConfig::new("http://h");
        huge.dp_size = MAX_DP_SIZE + 1;
        assert!(huge.ranks().is_err());
        let mut past = ReplicaConfig::new("http://h");
        past.events = Some("tcp://h:65535".into());
        past.dp_size = 2;
        assert!(past.ranks().unwrap_err().contains("65535"));
        // Two ranks of one URL are not a duplicate; the same rank twice is.
        let mut c = GatewayConfig::default();
        let rank = |k| ReplicaConfig { dp_rank: Some(k), ..ReplicaConfig::new("http://h:1") };
        c.replicas = vec![rank(0), rank(1)];
        assert!(c.validate().is_ok(), "{:?}", c.validate());
        c.replicas = vec![rank(1), rank(1)];
        assert!(c.validate().is_err());
    }
}
