//! Configuration of the parts that span machines: peer kvgate instances
//! sharing their in-flight bookings, and engines found through DNS. Both
//! are sections of [`GatewayConfig`](crate::GatewayConfig).

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

use crate::config::nats_config::NatsConfig;
use crate::config::tls_config::TlsConfig;
use crate::error::ConfigError;

/// Peer ingresses: each instance sends its ledger changes (book, first
/// token, finish) to every peer and applies theirs, so that several
/// instances balance load as one would. The changes travel over an HTTP
/// mesh (`urls`, `dns`, `listen`, `key`) or over NATS (`nats`), not both.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PeersConfig {
    /// Peers' endpoints, e.g. `http://10.0.0.7:9000`.
    pub urls: Vec<String>,
    /// A DNS name with port (a Kubernetes headless Service of the kvgate
    /// pods), resolved every `resolve_interval_ms`; each address is a peer
    /// at `http://IP:PORT`. An instance recognises and skips itself.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dns: Option<String>,
    /// Where this instance receives its peers' changes
    /// (`POST /peer/v1/changes`); unset: no peer endpoint.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub listen: Option<SocketAddr>,
    /// The shared secret peers present (`Authorization: Bearer`); required
    /// whenever any peer setting is used. At least 16 characters.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// Local changes are sent in batches at most this often, ms.
    pub flush_ms: u64,
    /// A peer silent this long is forgotten: its bookings are released
    /// (counted as aged out), ms. Peers send a heartbeat every third of it.
    pub timeout_ms: u64,
    /// How often `dns` is resolved again, ms.
    pub resolve_interval_ms: u64,
    /// Batches queued for one slow peer before new ones are dropped
    /// (counted); routing never waits for a peer.
    pub queue_batches: usize,
    /// NATS publish/subscribe instead of the HTTP mesh.
    pub nats: NatsConfig,
}

/// Engines found through DNS, besides the static `replicas`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DiscoveryConfig {
    /// A DNS name (a headless Service of the vLLM pods) resolved every
    /// `interval_ms`; each address becomes a replica. Addresses that
    /// disappear are drained, then removed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dns: Option<String>,
    /// The engines' HTTP port.
    pub http_port: u16,
    /// Their KV-event PUB port.
    pub events_port: u16,
    /// Their replay ROUTER port; 0: none.
    pub replay_port: u16,
    /// Their event topic (vLLM's `KVEventsConfig.topic`).
    pub topic: String,
    /// Their `--block-size`.
    pub block_size: u32,
    /// The key sent to them (vLLM's `--api-key`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub api_key: Option<String>,
    /// How often the name is resolved, ms.
    pub interval_ms: u64,
    /// A drained engine is removed after this long (or when idle), ms.
    pub drain_ms: u64,
    /// `http` or `https` (then `tls.ca` is required): how the engines found
    /// are spoken to.
    pub scheme: String,
}

impl Default for DiscoveryConfig {
    fn default() -> Self {
        DiscoveryConfig {
            dns: None,
            http_port: 8000,
            events_port: 5557,
            replay_port: 5558,
            topic: String::new(),
            block_size: 16,
            api_key: None,
            interval_ms: 5_000,
            drain_ms: 30_000,
            scheme: "http".to_owned(),
        }
    }
}

impl Default for PeersConfig {
    fn default() -> Self {
        PeersConfig {
            urls: Vec::new(),
            dns: None,
            listen: None,
            key: None,
            flush_ms: 5,
            timeout_ms: 3_000,
            resolve_interval_ms: 5_000,
            queue_batches: 256,
            nats: NatsConfig::default(),
        }
    }
}

impl PeersConfig {
    /// Whether this instance takes part in peer sharing at all.
    pub fn enabled(&self) -> bool {
        self.mesh_enabled() || self.nats.enabled()
    }

    /// Whether changes travel over the HTTP mesh.
    pub fn mesh_enabled(&self) -> bool {
        !self.urls.is_empty() || self.dns.is_some() || self.listen.is_some()
    }

    pub(crate) fn validate(&self, tls: &TlsConfig) -> Result<(), ConfigError> {
        let bad = |m: String| Err(ConfigError::Invalid(m));
        self.nats.validate()?;
        if self.nats.enabled() && self.mesh_enabled() {
            return bad("peers: share over NATS (peers.nats.url) or over the HTTP mesh \
                        (peers.urls, peers.dns, peers.listen), not both"
                .into());
        }
        if !self.enabled() {
            return Ok(());
        }
        if self.flush_ms == 0 || self.timeout_ms < 3 * self.flush_ms || self.queue_batches == 0 {
            return bad("peers: flush_ms and queue_batches must be positive and timeout_ms at \
                        least 3 × flush_ms"
                .into());
        }
        if !self.mesh_enabled() {
            return Ok(());
        }
        match &self.key {
            None => {
                return bad("peers: a peer key (peers.key, --peer-key) is required whenever \
                            peers are configured; the peer port never trusts the network"
                    .into())
            }
            Some(k) if k.len() < 16 => {
                return bad("peers.key needs at least 16 characters".into());
            }
            Some(_) => {}
        }
        for u in &self.urls {
            let url = reqwest::Url::parse(u)
                .map_err(|e| ConfigError::Invalid(format!("peer url {u:?}: {e}")))?;
            tls.check_scheme("peer url", &url)?;
        }
        if let Some(d) = &self.dns {
            if d.rsplit_once(':').and_then(|(_, p)| p.parse::<u16>().ok()).is_none() {
                return bad(format!("peers.dns {d:?}: expected HOST:PORT"));
            }
        }
        if self.resolve_interval_ms == 0 {
            return bad("peers.resolve_interval_ms must be positive".into());
        }
        Ok(())
    }
}

impl DiscoveryConfig {
    pub(crate) fn validate(&self, tls: &TlsConfig) -> Result<(), ConfigError> {
        let bad = |m: String| Err(ConfigError::Invalid(m));
        let example = format!("{}://engine", self.scheme);
        let url = reqwest::Url::parse(&example).map_err(|_| {
            ConfigError::Invalid(format!(
                "discovery.scheme {:?}: expected http or https",
                self.scheme
            ))
        })?;
        tls.check_scheme("discovery.scheme", &url)?;
        if self.dns.is_none() {
            return Ok(());
        }
        if self.http_port == 0 || self.events_port == 0 {
            return bad("discovery: http_port and events_port must be set".into());
        }
        if self.block_size == 0 || self.block_size > 1024 {
            return bad("discovery.block_size must be in 1..=1024".into());
        }
        if self.interval_ms == 0 {
            return bad("discovery.interval_ms must be positive".into());
        }
        Ok(())
    }
}
