//! Which tenant a request belongs to (`[tenants]`): its client key's
//! tenant, or the tenant named in the tenant header when that key may name
//! one (a gateway in front that serves many customers), else none (the
//! default tenant). Both front doors ask here: the proxy with the client's
//! headers, the endpoint picker with those Envoy passes on.
//!
//! The key was checked against `auth.api_keys` (in constant time) before a
//! request gets here, so looking it up in a map leaks nothing new.

use std::collections::HashMap;

use axum::http::HeaderMap;

use crate::config::TenantsSection;
use crate::doors::auth::bearer;

/// Longest tenant name taken from the header; a longer one is ignored.
const MAX_TENANT_NAME: usize = 128;

/// The key → tenant map and the tenant header.
#[derive(Debug, Default)]
pub(crate) struct TenantKeys {
    /// Lower-case header name.
    header: String,
    /// Key → (tenant, may name tenants in the header).
    keys: HashMap<String, (String, bool)>,
}

impl TenantKeys {
    pub(crate) fn new(section: &TenantsSection) -> TenantKeys {
        let keys = section.keys.iter();
        TenantKeys {
            header: section.header.to_ascii_lowercase(),
            keys: keys.map(|k| (k.key.clone(), (k.tenant.clone(), k.names_tenants))).collect(),
        }
    }

    /// The tenant of a request with bearer token `key` whose tenant header
    /// (see [`TenantKeys::header`]) is `named`; `None`: the default tenant.
    pub(crate) fn tenant_of<'a>(
        &'a self,
        key: Option<&str>,
        named: Option<&'a str>,
    ) -> Option<&'a str> {
        let (tenant, may_name) = key.and_then(|k| self.keys.get(k))?;
        let named = named.map(str::trim).filter(|n| !n.is_empty() && n.len() <= MAX_TENANT_NAME);
        match named {
            Some(n) if *may_name => Some(n),
            _ => Some(tenant.as_str()),
        }
    }

    /// [`TenantKeys::tenant_of`] for the proxy's request headers.
    pub(crate) fn in_headers<'a>(&'a self, headers: &'a HeaderMap) -> Option<&'a str> {
        let named = headers.get(self.header.as_str()).and_then(|v| v.to_str().ok());
        self.tenant_of(bearer(headers), named)
    }

    /// Whether the key `key` may name tenants (`names_tenants`): a trusted
    /// front gateway, whose requests' `priority` may also choose a band
    /// above their tenant's.
    pub(crate) fn trusted(&self, key: Option<&str>) -> bool {
        key.and_then(|k| self.keys.get(k)).is_some_and(|(_, may_name)| *may_name)
    }

    /// The tenant header's name (lower case).
    pub(crate) fn header(&self) -> &str {
        &self.header
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::TenantKey;

    fn keys() -> TenantKeys {
        let key = |key: &str, tenant: &str, names_tenants| TenantKey {
            key: key.into(),
            tenant: tenant.into(),
            names_tenants,
        };
        TenantKeys::new(&TenantsSection {
            header: "X-Kvgate-Tenant".into(),
            keys: vec![key("key-of-acme", "acme", false), key("key-of-front", "front", true)],
            ..TenantsSection::default()
        })
    }

    #[test]
    fn the_header_counts_only_from_keys_that_may_name_tenants() {
        let k = keys();
        assert_eq!(k.header(), "x-kvgate-tenant");
        assert_eq!(k.tenant_of(Some("key-of-acme"), None), Some("acme"));
        assert_eq!(k.tenant_of(Some("key-of-acme"), Some("globex")), Some("acme"));
        assert_eq!(k.tenant_of(Some("key-of-front"), Some("globex")), Some("globex"));
        assert_eq!(k.tenant_of(Some("key-of-front"), Some(" ")), Some("front"));
        assert_eq!(k.tenant_of(Some("key-of-front"), Some(&"x".repeat(129))), Some("front"));
        assert_eq!(k.tenant_of(Some("other-key"), Some("globex")), None);
        assert_eq!(k.tenant_of(None, Some("globex")), None);
        let mut h = HeaderMap::new();
        h.insert("authorization", "Bearer key-of-front".parse().unwrap());
        h.insert("x-kvgate-tenant", "initech".parse().unwrap());
        assert_eq!(k.in_headers(&h), Some("initech"));
    }

    #[test]
    fn only_keys_that_name_tenants_are_trusted() {
        let k = keys();
        assert!(k.trusted(Some("key-of-front")));
        assert!(!k.trusted(Some("key-of-acme")));
        assert!(!k.trusted(Some("other-key")));
        assert!(!k.trusted(None));
    }
}
