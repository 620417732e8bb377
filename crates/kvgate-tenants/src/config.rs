//! Tenants, priority bands and the VTC charge weights: one serde struct with
//! its defaults here and nowhere else, checked once by
//! [`TenantsConfig::validate`] before an [`AdmissionQueue`](crate::AdmissionQueue)
//! is built from it.
//!
//! A tenant is a name. Names the configuration does not list (a trusted
//! front gateway may name its own customers) are accepted with the default
//! tenant's settings and counters of their own, up to `max_tenants`; past
//! that they are served as the default tenant, so a stream of invented names
//! cannot grow memory without bound.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::error::{ConfigError, PriorityError};

/// The most priority bands a configuration may have (a tenant's bands fit
/// one `u64` mask).
pub const MAX_BANDS: usize = 64;

/// The tenant section of kvgate's configuration.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TenantsConfig {
    /// The tenant of requests that name none.
    pub default_tenant: String,
    /// The band of tenants that name none; the first band when unset.
    pub default_band: Option<String>,
    /// VTC charge per input (prompt) token, before the tenant's weight.
    pub input_weight: f64,
    /// VTC charge per output (generated) token, before the tenant's weight.
    pub output_weight: f64,
    /// With peers sharing counters: leave free capacity to a peer that holds
    /// a tenant further behind than twice the local pick's cost, instead of
    /// dispatching the pick (fleet-wide fairness at the price of a short
    /// wait for the peer to act).
    pub defer_to_peers: bool,
    /// At most this many tenants are tracked; requests naming further
    /// unlisted tenants are served as the default tenant.
    pub max_tenants: usize,
    /// Priority bands, highest first. A band is served only while every
    /// band above it has nothing that can be dispatched.
    pub bands: Vec<BandConfig>,
    /// Tenants by name.
    pub tenants: BTreeMap<String, TenantConfig>,
}

/// One priority band.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BandConfig {
    /// The band's name (`interactive`, `batch`).
    pub name: String,
    /// A request of this band is dispatched only to a replica whose
    /// predicted time to first token is within this target, ms (the caller
    /// applies it in the dispatch predicate).
    pub ttft_target_ms: u64,
    /// At most this many requests wait in this band; more are answered 429.
    pub max_queue: usize,
    /// A request that has waited this long in the band is answered 503, ms.
    pub queue_ttl_ms: u64,
    /// The largest vLLM `priority` (lower is more urgent) that chooses this
    /// band: a request's `priority` goes to the first band, in band order,
    /// whose `max_priority` is at least it. Bands without it are chosen by
    /// no priority; when no band has it, `priority` chooses no band. It is
    /// also the priority an engine with priority scheduling is sent for a
    /// request of this band that did not choose it with its own priority.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_priority: Option<i64>,
}

/// One tenant's settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TenantConfig {
    /// The tenant's share relative to others in its band (VTC weight).
    pub weight: f64,
    /// The tenant's priority band; `default_band` when unset.
    pub band: Option<String>,
    /// At most this many of the tenant's requests are admitted and not
    /// finished (waiting or at an engine) on one instance; more get 429.
    pub max_in_flight: Option<u32>,
    /// At most this many tokens (prompt plus output) per minute across the
    /// instances that share counters; more get 429.
    pub tokens_per_minute: Option<u64>,
}

impl Default for TenantsConfig {
    fn default() -> Self {
        Self {
            default_tenant: "default".to_owned(),
            default_band: None,
            input_weight: 1.0,
            output_weight: 2.0,
            defer_to_peers: true,
            max_tenants: 10_000,
            bands: vec![
                BandConfig {
                    name: "interactive".to_owned(),
                    ttft_target_ms: 2_000,
                    max_queue: 5_000,
                    queue_ttl_ms: 60_000,
                    max_priority: None,
                },
                BandConfig {
                    name: "batch".to_owned(),
                    ttft_target_ms: 30_000,
                    max_queue: 5_000,
                    queue_ttl_ms: 600_000,
                    max_priority: None,
                },
            ],
            tenants: BTreeMap::new(),
        }
    }
}

impl Default for TenantConfig {
    fn default() -> Self {
        Self { weight: 1.0, band: None, max_in_flight: None, tokens_per_minute: None }
    }
}

impl TenantsConfig {
    /// Checks every value once; the queue relies on what this accepts.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.bands.is_empty() {
            return Err(ConfigError::NoBands);
        }
        if self.bands.len() > MAX_BANDS {
            return Err(ConfigError::TooManyBands(self.bands.len()));
        }
        for (i, band) in self.bands.iter().enumerate() {
            validate_band(band)?;
            if self.bands[..i].iter().any(|b| b.name == band.name) {
                return Err(ConfigError::DuplicateBand(band.name.clone()));
            }
            let above = self.bands[..i].iter().filter_map(|b| b.max_priority).max();
            if let (Some(above), Some(own)) = (above, band.max_priority) {
                if own <= above {
                    return Err(ConfigError::InvalidBand {
                        band: band.name.clone(),
                        reason: "max_priority must be above every max_priority of the bands \
                                 before it (no priority could choose it)",
                    });
                }
            }
        }
        if self.default_tenant.is_empty() {
            return Err(ConfigError::EmptyName("tenant"));
        }
        if let Some(band) = &self.default_band {
            self.check_band_exists("default_band".to_owned(), band)?;
        }
        for (name, value) in
            [("input_weight", self.input_weight), ("output_weight", self.output_weight)]
        {
            if !value.is_finite() || value < 0.0 {
                return Err(ConfigError::InvalidChargeWeight { name, value });
            }
        }
        if self.input_weight + self.output_weight <= 0.0 {
            return Err(ConfigError::InvalidChargeWeight {
                name: "input_weight + output_weight",
                value: 0.0,
            });
        }
        for (name, tenant) in &self.tenants {
            self.validate_tenant(name, tenant)?;
        }
        let needed =
            self.tenants.len() + usize::from(!self.tenants.contains_key(&self.default_tenant));
        if self.max_tenants < needed {
            return Err(ConfigError::TooFewTenantSlots { max: self.max_tenants, needed });
        }
        Ok(())
    }

    /// The position of a band in the strict order (0 is served first).
    pub fn band_index(&self, name: &str) -> Option<usize> {
        self.bands.iter().position(|b| b.name == name)
    }

    /// The band a request's vLLM `priority` chooses: the first band, in band
    /// order, whose `max_priority` is at least `priority`. `Ok(None)`: no
    /// band has a `max_priority`, so priorities choose no band.
    pub fn band_for_priority(&self, priority: i64) -> Result<Option<usize>, PriorityError> {
        if self.bands.iter().all(|b| b.max_priority.is_none()) {
            return Ok(None);
        }
        match self.bands.iter().position(|b| b.max_priority.is_some_and(|m| m >= priority)) {
            Some(index) => Ok(Some(index)),
            None => Err(PriorityError {
                priority,
                bands: self
                    .bands
                    .iter()
                    .filter_map(|b| Some(format!("{} up to {}", b.name, b.max_priority?)))
                    .collect::<Vec<_>>()
                    .join(", "),
            }),
        }
    }

    /// The priority an engine with priority scheduling is sent for a
    /// request of band `index` that did not choose it with its own
    /// priority: the band's `max_priority`, else its index in band order.
    pub fn band_priority(&self, index: usize) -> i64 {
        let band = self.bands.get(index);
        band.and_then(|b| b.max_priority).unwrap_or(index as i64)
    }

    /// The settings of the default tenant (and so of every unlisted one).
    pub fn default_tenant_config(&self) -> TenantConfig {
        self.tenants.get(&self.default_tenant).cloned().unwrap_or_default()
    }

    fn validate_tenant(&self, name: &str, tenant: &TenantConfig) -> Result<(), ConfigError> {
        let invalid = |reason| ConfigError::InvalidTenant { tenant: name.to_owned(), reason };
        if name.is_empty() {
            return Err(ConfigError::EmptyName("tenant"));
        }
        if !tenant.weight.is_finite() || tenant.weight <= 0.0 {
            return Err(invalid("weight must be finite and above 0"));
        }
        if tenant.max_in_flight == Some(0) {
            return Err(invalid("max_in_flight must be at least 1"));
        }
        if tenant.tokens_per_minute == Some(0) {
            return Err(invalid("tokens_per_minute must be at least 1"));
        }
        if let Some(band) = &tenant.band {
            self.check_band_exists(format!("tenant {name:?}"), band)?;
        }
        Ok(())
    }

    fn check_band_exists(&self, owner: String, band: &str) -> Result<(), ConfigError> {
        match self.band_index(band) {
            Some(_) => Ok(()),
            None => Err(ConfigError::UnknownBand { owner, band: band.to_owned() }),
        }
    }
}

fn validate_band(band: &BandConfig) -> Result<(), ConfigError> {
    let invalid = |reason| ConfigError::InvalidBand { band: band.name.clone(), reason };
    if band.name.is_empty() {
        return Err(ConfigError::EmptyName("band"));
    }
    if band.ttft_target_ms == 0 {
        return Err(invalid("ttft_target_ms must be at least 1"));
    }
    if band.max_queue == 0 {
        return Err(invalid("max_queue must be at least 1"));
    }
    if band.queue_ttl_ms == 0 {
        return Err(invalid("queue_ttl_ms must be at least 1"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn defaults_validate() {
        let config = TenantsConfig::default();
        config.validate().unwrap();
        assert_eq!(config.band_index("interactive"), Some(0));
        assert_eq!(config.band_index("batch"), Some(1));
        assert_eq!(config.default_tenant_config().weight, 1.0);
    }

    #[test]
    fn parses_toml_with_defaults_filled() {
        let text = r#"
            default_tenant = "anon"
            output_weight = 3

            [tenants.acme]
            weight = 2
            band = "batch"
            max_in_flight = 8
            tokens_per_minute = 100000

            [tenants.anon]
        "#;
        let config: TenantsConfig = toml::from_str(text).unwrap();
        config.validate().unwrap();
        assert_eq!(config.output_weight, 3.0);
        assert_eq!(config.input_weight, 1.0);
        assert_eq!(config.bands.len(), 2);
        let acme = &config.tenants["acme"];
        assert_eq!(acme.weight, 2.0);
        assert_eq!(acme.max_in_flight, Some(8));
        assert_eq!(config.tenants["anon"], TenantConfig::default());
    }

    #[test]
    fn unknown_fields_are_refused() {
        let err = toml::from_str::<TenantsConfig>("wieght = 2").unwrap_err();
        assert!(err.to_string().contains("unknown field"), "{err}");
        let err = toml::from_str::<TenantsConfig>("[tenants.a]\nwieght = 2").unwrap_err();
        assert!(err.to_string().contains("unknown field"), "{err}");
    }

    #[test]
    fn bad_values_are_typed_errors() {
        let mut config = TenantsConfig::default();
        config.tenants.insert(
            "a".into(),
            TenantConfig { band: Some("bulk".into()), ..TenantConfig::default() },
        );
        assert!(matches!(
            config.validate(),
            Err(ConfigError::UnknownBand { ref band, .. }) if band == "bulk"
        ));

        let mut config = TenantsConfig::default();
        config.tenants.insert("a".into(), TenantConfig { weight: 0.0, ..TenantConfig::default() });
        assert!(matches!(config.validate(), Err(ConfigError::InvalidTenant { .. })));

        let mut config = TenantsConfig::default();
        config.bands.push(config.bands[0].clone());
        assert_eq!(config.validate(), Err(ConfigError::DuplicateBand("interactive".into())));

        let config = TenantsConfig { bands: Vec::new(), ..TenantsConfig::default() };
        assert_eq!(config.validate(), Err(ConfigError::NoBands));

        let config = TenantsConfig { output_weight: f64::NAN, ..TenantsConfig::default() };
        assert!(matches!(
            config.validate(),
            Err(ConfigError::InvalidChargeWeight { name: "output_weight", .. })
        ));

        let config = TenantsConfig { max_tenants: 0, ..TenantsConfig::default() };
        assert!(matches!(
            config.validate(),
            Err(ConfigError::TooFewTenantSlots { max: 0, needed: 1 })
        ));
    }

    fn with_priorities(maxima: [Option<i64>; 3]) -> TenantsConfig {
        let mut config = TenantsConfig::default();
        config.bands.push(BandConfig { name: "bulk".into(), ..config.bands[1].clone() });
        for (band, max) in config.bands.iter_mut().zip(maxima) {
            band.max_priority = max;
        }
        config
    }

    #[test]
    fn a_priority_chooses_the_first_band_whose_max_priority_is_at_least_it() {
        let config = with_priorities([Some(0), Some(10), None]);
        config.validate().unwrap();
        assert_eq!(config.band_for_priority(i64::MIN), Ok(Some(0)));
        assert_eq!(config.band_for_priority(-5), Ok(Some(0)));
        assert_eq!(config.band_for_priority(0), Ok(Some(0)));
        assert_eq!(config.band_for_priority(1), Ok(Some(1)));
        assert_eq!(config.band_for_priority(10), Ok(Some(1)));
        let err = config.band_for_priority(11).unwrap_err();
        assert_eq!(
            err.to_string(),
            "priority 11 chooses no priority band (the bands take priorities interactive up \
             to 0, batch up to 10; lower is more urgent)"
        );
        // The priority an engine is sent: the band's max_priority, else its index.
        assert_eq!(config.band_priority(0), 0);
        assert_eq!(config.band_priority(1), 10);
        assert_eq!(config.band_priority(2), 2);
    }

    #[test]
    fn without_max_priority_a_priority_chooses_no_band() {
        let config = TenantsConfig::default();
        assert_eq!(config.band_for_priority(7), Ok(None));
        assert_eq!(config.band_for_priority(-7), Ok(None));
        assert_eq!(config.band_priority(1), 1);
    }

    #[test]
    fn max_priority_must_rise_in_band_order() {
        let config = with_priorities([Some(5), None, Some(5)]);
        assert!(matches!(
            config.validate(),
            Err(ConfigError::InvalidBand { ref band, .. }) if band == "bulk"
        ));
        with_priorities([Some(5), None, Some(6)]).validate().unwrap();
        let text = "[[bands]]\nname = \"a\"\nttft_target_ms = 1\nmax_queue = 1\n\
                    queue_ttl_ms = 1\nmax_priority = -3\n";
        let config: TenantsConfig = toml::from_str(text).unwrap();
        assert_eq!(config.bands[0].max_priority, Some(-3));
    }
}
