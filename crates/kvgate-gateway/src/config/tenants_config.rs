//! The `[tenants]` section of [`GatewayConfig`](crate::GatewayConfig): who a
//! request belongs to (client keys mapped to tenants, and a header that
//! trusted keys may set) and the tenant admission queue's settings
//! (`kvgate-tenants`: bands, weights, limits). Absent, kvgate serves every
//! request first come first served, as one anonymous stream.

use kvgate_tenants::TenantsConfig;
use serde::{Deserialize, Serialize};

use crate::error::ConfigError;

/// The header a trusted key names a request's tenant in, unless configured.
pub const DEFAULT_TENANT_HEADER: &str = "x-kvgate-tenant";

/// One client key and the tenant its requests belong to.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantKey {
    /// The client key (`Authorization: Bearer K`); it must also be one of
    /// `auth.api_keys`, which decide who may call at all.
    pub key: String,
    /// The tenant of its requests.
    pub tenant: String,
    /// Requests with this key may name another tenant in the tenant header
    /// (a gateway in front that serves many customers); without, the
    /// header is ignored.
    #[serde(default)]
    pub names_tenants: bool,
}

/// Tenants, their bands and limits. In the file, the queue's own keys
/// ([`TenantsConfig`]: `default_tenant`, `bands`, `tenants`, …) sit at the
/// top of the section beside `header` and `keys`; `kvgate-tenants` reads and
/// validates them, unknown keys included.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "toml::Table", into = "toml::Table")]
pub struct TenantsSection {
    /// The header that names a request's tenant, honoured only from keys
    /// with `names_tenants`.
    pub header: String,
    /// Client keys and their tenants.
    pub keys: Vec<TenantKey>,
    /// The admission queue's settings.
    pub queue: TenantsConfig,
}

impl Default for TenantsSection {
    fn default() -> Self {
        TenantsSection {
            header: DEFAULT_TENANT_HEADER.to_owned(),
            keys: Vec::new(),
            queue: TenantsConfig::default(),
        }
    }
}

/// The section's own keys, apart from the queue's.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Own {
    #[serde(default = "default_header")]
    header: String,
    #[serde(default)]
    keys: Vec<TenantKey>,
}

fn default_header() -> String {
    DEFAULT_TENANT_HEADER.to_owned()
}

impl TryFrom<toml::Table> for TenantsSection {
    type Error = String;

    fn try_from(mut table: toml::Table) -> Result<Self, String> {
        let mut own = toml::Table::new();
        for key in ["header", "keys"] {
            if let Some(v) = table.remove(key) {
                own.insert(key.to_owned(), v);
            }
        }
        let Own { header, keys } = own.try_into().map_err(|e: toml::de::Error| e.to_string())?;
        let queue = table.try_into().map_err(|e: toml::de::Error| e.to_string())?;
        Ok(TenantsSection { header, keys, queue })
    }
}

impl From<TenantsSection> for toml::Table {
    fn from(s: TenantsSection) -> toml::Table {
        let mut table = toml::Table::new();
        table.insert("header".to_owned(), toml::Value::String(s.header));
        let keys = s.keys.iter().filter_map(|k| toml::Value::try_from(k).ok()).collect();
        table.insert("keys".to_owned(), toml::Value::Array(keys));
        // Plain values (strings, numbers, maps): serialising them cannot fail.
        if let Ok(toml::Value::Table(queue)) = toml::Value::try_from(&s.queue) {
            table.extend(queue);
        }
        table
    }
}

impl TenantsSection {
    /// Checks the section against the client keys (`auth.api_keys`).
    pub(crate) fn validate(&self, api_keys: &[String]) -> Result<(), ConfigError> {
        let bad = |m: String| Err(ConfigError::Invalid(format!("tenants: {m}")));
        self.queue.validate().map_err(|e| ConfigError::Invalid(format!("tenants: {e}")))?;
        if axum::http::HeaderName::from_bytes(self.header.as_bytes()).is_err() {
            return bad(format!("header {:?} is not a valid header name", self.header));
        }
        for (i, k) in self.keys.iter().enumerate() {
            if !api_keys.contains(&k.key) {
                return bad(format!(
                    "keys[{i}] (tenant {:?}) is not one of auth.api_keys: a tenant key must \
                     be a client key",
                    k.tenant
                ));
            }
            if k.tenant.is_empty() {
                return bad(format!("keys[{i}] names no tenant"));
            }
            if self.keys[..i].iter().any(|o| o.key == k.key) {
                return bad(format!("keys[{i}] (tenant {:?}) repeats a key", k.tenant));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_section_reads_from_toml_and_checks_its_keys() {
        let text = r#"
            keys = [{ key = "client-key-a", tenant = "acme" },
                    { key = "front-key-1", tenant = "front", names_tenants = true }]
            [tenants.acme]
            weight = 2
            max_in_flight = 4
        "#;
        let s: TenantsSection = toml::from_str(text).unwrap();
        assert_eq!(s.header, DEFAULT_TENANT_HEADER);
        assert_eq!(s.queue.tenants["acme"].max_in_flight, Some(4));
        assert_eq!(s.queue.bands.len(), 2);
        let text = toml::to_string(&s).unwrap();
        assert_eq!(toml::from_str::<TenantsSection>(&text).unwrap(), s, "{text}");
        let keys = ["client-key-a".to_owned(), "front-key-1".to_owned()];
        s.validate(&keys).unwrap();
        let e = s.validate(&keys[..1]).unwrap_err().to_string();
        assert!(e.contains("keys[1]") && e.contains("auth.api_keys"), "{e}");
        let typo = toml::from_str::<TenantsSection>("hedaer = \"x\"").unwrap_err();
        assert!(typo.to_string().contains("unknown field"), "{typo}");
        let mut bad_band = s;
        bad_band.queue.default_band = Some("nope".into());
        assert!(bad_band.validate(&keys).unwrap_err().to_string().contains("nope"));
    }
}
