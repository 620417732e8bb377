//! The raw [`GatewayConfig`] validated once into typed sections, durations
//! as `Duration`, that components receive section by section: the fleet
//! core its [`HealthRules`], each monitor its [`ProbeTiming`], the request
//! path its [`RequestLimits`], the server its [`ServerTiming`], the peer
//! tasks their [`PeerTiming`], the dashboard its [`DashboardTiming`], each
//! pool's DNS discovery its [`DiscoveryTiming`]. A component never reads
//! milliseconds or seconds out of the raw config itself, so each unit
//! conversion happens here, once (`crates/kvgate/tests/fleet_owner.rs`
//! checks the gateway's sources for any other).

use std::time::Duration;

use crate::config::{DashboardConfig, DiscoveryConfig, GatewayConfig, PeersConfig};

/// Every typed section.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Settings {
    pub(crate) health: HealthRules,
    pub(crate) probes: ProbeTiming,
    pub(crate) request: RequestLimits,
    pub(crate) server: ServerTiming,
    pub(crate) peers: PeerTiming,
    pub(crate) dashboard: DashboardTiming,
    /// `tls.reload_ms`: how often the listeners' certificate files are
    /// checked for a change (zero: never).
    pub(crate) tls_reload: Duration,
}

impl Settings {
    /// From a config that `GatewayConfig::validate` accepted.
    pub(crate) fn from_config(c: &GatewayConfig) -> Settings {
        let m = &c.monitor;
        Settings {
            health: HealthRules {
                unhealthy_after: m.unhealthy_after,
                purge_after: Duration::from_millis(m.purge_after_ms),
                rebuild: Duration::from_millis(m.rebuild_ms),
                index_bound: c.limits.index_blocks_per_tier,
            },
            probes: ProbeTiming {
                every: Duration::from_millis(m.health_interval_ms.min(m.metrics_interval_ms)),
                timeout: Duration::from_millis(m.probe_timeout_ms),
            },
            request: RequestLimits {
                first_byte: Duration::from_millis(c.limits.first_byte_timeout_ms),
                stream_idle: Duration::from_millis(c.limits.stream_idle_timeout_ms),
                max_retries: c.limits.max_retries,
            },
            server: ServerTiming {
                header_read: Duration::from_millis(c.limits.header_read_timeout_ms),
                connect: Duration::from_millis(c.limits.connect_timeout_ms),
                shutdown_grace: Duration::from_millis(c.limits.shutdown_grace_ms),
            },
            peers: PeerTiming::of(&c.peers),
            dashboard: DashboardTiming::of(&c.dashboard),
            tls_reload: Duration::from_millis(c.tls.reload_ms),
        }
    }
}

/// The server's timeouts (`[limits]`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct ServerTiming {
    /// `header_read_timeout_ms`: a connection that sends no complete head
    /// by then is closed.
    pub(crate) header_read: Duration,
    /// `connect_timeout_ms`: connecting to an engine or a peer.
    pub(crate) connect: Duration,
    /// `shutdown_grace_ms`: how long shutdown waits for requests in flight.
    pub(crate) shutdown_grace: Duration,
}

/// The peer tasks' timing (`[peers]`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct PeerTiming {
    /// `flush_ms`: how often queued changes go out.
    pub(crate) flush: Duration,
    /// A third of `timeout_ms`: a silent instance sends an empty batch this
    /// often, so that its peers do not forget it.
    pub(crate) heartbeat: Duration,
    /// `resolve_interval_ms`: how often peers are looked up in DNS.
    pub(crate) resolve_every: Duration,
    /// `timeout_ms`: a peer silent this long is forgotten, and a send
    /// given up.
    pub(crate) timeout: Duration,
}

impl PeerTiming {
    fn of(p: &PeersConfig) -> PeerTiming {
        PeerTiming {
            flush: Duration::from_millis(p.flush_ms),
            heartbeat: Duration::from_millis(p.timeout_ms / 3),
            resolve_every: Duration::from_millis(p.resolve_interval_ms),
            timeout: Duration::from_millis(p.timeout_ms),
        }
    }
}

/// The dashboard's timing (`[dashboard]`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct DashboardTiming {
    /// `interval_ms`: between frames.
    pub(crate) interval: Duration,
    /// `window_s`: the span its rates are averaged over.
    pub(crate) window: Duration,
    /// `session_s`: how long a login lasts.
    pub(crate) session: Duration,
}

impl DashboardTiming {
    fn of(d: &DashboardConfig) -> DashboardTiming {
        DashboardTiming {
            interval: Duration::from_millis(d.interval_ms),
            window: Duration::from_secs(d.window_s),
            session: Duration::from_secs(d.session_s),
        }
    }
}

/// One pool's DNS discovery timing (`[discovery]`, per pool).
#[derive(Clone, Copy, Debug)]
pub(crate) struct DiscoveryTiming {
    /// `interval_ms`: between lookups.
    pub(crate) interval: Duration,
    /// `drain_ms`: how long an engine gone from DNS may finish its requests.
    pub(crate) drain: Duration,
}

impl DiscoveryTiming {
    /// A pool's own section (pools have their own `[discovery]`).
    pub(crate) fn of(d: &DiscoveryConfig) -> DiscoveryTiming {
        DiscoveryTiming {
            interval: Duration::from_millis(d.interval_ms),
            drain: Duration::from_millis(d.drain_ms),
        }
    }
}

pub(crate) use kvgate_fleet::HealthRules;

/// How often and how patiently a monitor probes (`[monitor]`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct ProbeTiming {
    /// Between probes: the shorter of `health_interval_ms` and
    /// `metrics_interval_ms` (one probe reads both).
    pub(crate) every: Duration,
    /// `probe_timeout_ms`.
    pub(crate) timeout: Duration,
}

/// The request path's limits (`[limits]`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct RequestLimits {
    /// `first_byte_timeout_ms`: an engine that sends no response head by
    /// then is given up on, and another replica tried.
    pub(crate) first_byte: Duration,
    /// `stream_idle_timeout_ms`: a stream silent this long ends with an
    /// error tail.
    pub(crate) stream_idle: Duration,
    /// `max_retries`: other replicas tried after the first fails.
    pub(crate) max_retries: u32,
}
