//! The raw [`GatewayConfig`] validated once into typed sections, durations
//! as `Duration`, that components receive section by section: the fleet
//! core its [`HealthRules`], each monitor its [`ProbeTiming`], the request
//! path its [`RequestLimits`]. A component never reads milliseconds out of
//! the raw config itself, so each unit conversion happens here, once.

use std::time::Duration;

use crate::config::GatewayConfig;

/// Every typed section.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Settings {
    pub(crate) health: HealthRules,
    pub(crate) probes: ProbeTiming,
    pub(crate) request: RequestLimits,
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
