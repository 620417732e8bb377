//! The crate's errors: a configuration that cannot be used, and a request
//! priority that chooses no band. Everything the
//! queue decides at run time (rejections, expiries, unknown ids) is a counted
//! value, not an error.

/// Why a [`TenantsConfig`](crate::TenantsConfig) was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConfigError {
    /// No priority band is configured.
    #[error("at least one priority band is required")]
    NoBands,
    /// More bands than a [`BandId`](crate::BandId) can name.
    #[error("{0} priority bands configured; at most 64 are allowed")]
    TooManyBands(usize),
    /// A band or tenant name is empty.
    #[error("a {0} name is empty")]
    EmptyName(&'static str),
    /// Two bands share a name.
    #[error("band {0:?} is configured twice")]
    DuplicateBand(String),
    /// A tenant (or `default_band`) names a band that is not configured.
    #[error("{owner} names band {band:?}, which is not configured")]
    UnknownBand {
        /// Who names the band: `tenant "x"` or `default_band`.
        owner: String,
        /// The band named.
        band: String,
    },
    /// A band setting is out of range.
    #[error("band {band:?}: {reason}")]
    InvalidBand {
        /// The band's name.
        band: String,
        /// What is wrong.
        reason: &'static str,
    },
    /// A tenant setting is out of range.
    #[error("tenant {tenant:?}: {reason}")]
    InvalidTenant {
        /// The tenant's name.
        tenant: String,
        /// What is wrong.
        reason: &'static str,
    },
    /// A VTC charge weight is negative or not finite.
    #[error("{name} must be finite and at least 0, not {value}")]
    InvalidChargeWeight {
        /// `input_weight` or `output_weight`.
        name: &'static str,
        /// The value given.
        value: f64,
    },
    /// `max_tenants` is smaller than the configured tenants plus the default.
    #[error("max_tenants = {max} is below the {needed} tenants configured (default included)")]
    TooFewTenantSlots {
        /// The configured `max_tenants`.
        max: usize,
        /// Configured tenants plus the default tenant.
        needed: usize,
    },
}

/// A request's vLLM `priority` that chooses no band: it is above every
/// band's `max_priority`. The caller answers 400 with this message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("priority {priority} chooses no priority band (the bands take priorities {bands}; lower is more urgent)")]
pub struct PriorityError {
    /// The priority asked for.
    pub priority: i64,
    /// The bands' names and their `max_priority`, in band order.
    pub bands: String,
}
