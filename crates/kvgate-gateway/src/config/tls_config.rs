//! Configuration of TLS: the `[tls]` section of
//! [`GatewayConfig`](crate::GatewayConfig). What it turns into is `tls.rs`.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::error::ConfigError;

/// TLS on kvgate's listeners, and to https:// engines and peers.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TlsConfig {
    /// This instance's certificate chain (PEM). With `key`, every listener
    /// kvgate opens speaks TLS: the API, admin, metrics, peer and endpoint
    /// picker listeners.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cert: Option<PathBuf>,
    /// Its private key (PEM: PKCS#8, PKCS#1 or SEC1). Refused when others
    /// may read the file.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<PathBuf>,
    /// A CA bundle (PEM): the machine-facing listeners (peer, endpoint
    /// picker) then require a client certificate that chains to it (mutual
    /// TLS). Needs `cert` and `key`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client_ca: Option<PathBuf>,
    /// The CA bundle (PEM) that https:// engines and peers must chain to;
    /// required when any engine or peer is https://.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ca: Option<PathBuf>,
    /// The certificate chain (PEM) kvgate presents to https:// engines and
    /// peers that ask for one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client_cert: Option<PathBuf>,
    /// Its private key (PEM); refused when others may read the file.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client_key: Option<PathBuf>,
    /// How often `cert` and `key` are checked for changes, ms: a changed
    /// pair is loaded without a restart (a bad one is logged and the
    /// previous pair kept). 0: never.
    pub reload_ms: u64,
}

impl Default for TlsConfig {
    fn default() -> Self {
        TlsConfig {
            cert: None,
            key: None,
            client_ca: None,
            ca: None,
            client_cert: None,
            client_key: None,
            reload_ms: 10_000,
        }
    }
}

impl TlsConfig {
    /// Whether kvgate's listeners speak TLS.
    pub fn serves_tls(&self) -> bool {
        self.cert.is_some()
    }

    /// The scheme of this instance's own HTTP endpoints (peers found by DNS
    /// are reached the way this instance serves).
    pub(crate) fn scheme(&self) -> &'static str {
        if self.serves_tls() {
            "https"
        } else {
            "http"
        }
    }

    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        let bad = |m: &str| Err(ConfigError::Invalid(m.to_owned()));
        if self.cert.is_some() != self.key.is_some() {
            return bad("tls.cert and tls.key go together: set both or neither");
        }
        if self.client_cert.is_some() != self.client_key.is_some() {
            return bad("tls.client_cert and tls.client_key go together: set both or neither");
        }
        if self.client_ca.is_some() && self.cert.is_none() {
            return bad("tls.client_ca (client certificates required) needs tls.cert and tls.key");
        }
        if self.client_cert.is_some() && self.ca.is_none() {
            return bad(
                "tls.client_cert is presented to https:// engines and peers, which need tls.ca",
            );
        }
        Ok(())
    }

    /// `url`'s scheme is one kvgate can speak with this configuration.
    pub(crate) fn check_scheme(&self, what: &str, url: &reqwest::Url) -> Result<(), ConfigError> {
        match url.scheme() {
            "http" => Ok(()),
            "https" if self.ca.is_some() => Ok(()),
            "https" => Err(ConfigError::Invalid(format!(
                "{what} {url}: https:// needs tls.ca, the CA bundle its certificate chains to"
            ))),
            other => Err(ConfigError::Invalid(format!(
                "{what} {url}: expected http:// or https://, not {other}://"
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::config::{GatewayConfig, ReplicaConfig};

    fn refused(c: &GatewayConfig, words: &str) {
        let e = c.validate().expect_err("refused").to_string();
        assert!(e.contains(words), "{e}");
    }

    #[test]
    fn incomplete_or_untrusted_tls_settings_are_refused_with_the_reason() {
        let mut c = GatewayConfig::default();
        c.tls.cert = Some("/c.pem".into());
        refused(&c, "tls.cert and tls.key go together");
        c.tls.key = Some("/k.pem".into());
        c.validate().expect("a pair");
        c.tls.client_cert = Some("/cc.pem".into());
        refused(&c, "tls.client_cert and tls.client_key");
        c.tls.client_key = Some("/ck.pem".into());
        refused(&c, "need tls.ca");
        c.tls.ca = Some("/ca.pem".into());
        c.validate().expect("a client identity with its CA");

        let mut c = GatewayConfig::default();
        c.tls.client_ca = Some("/ca.pem".into());
        refused(&c, "needs tls.cert");

        let mut c = GatewayConfig {
            replicas: vec![ReplicaConfig::new("https://engine:8000")],
            ..GatewayConfig::default()
        };
        refused(&c, "https:// needs tls.ca");
        c.tls.ca = Some("/ca.pem".into());
        c.validate().expect("https with a CA");
        c.replicas = vec![ReplicaConfig::new("ftp://engine:8000")];
        refused(&c, "expected http:// or https://");

        let mut c = GatewayConfig::default();
        c.discovery.scheme = "https".into();
        refused(&c, "https:// needs tls.ca");
        c.discovery.scheme = "gopher".into();
        refused(&c, "discovery.scheme");
    }

    #[test]
    fn the_picker_leaves_loopback_only_with_mutual_tls_or_an_explicit_waiver() {
        let mut c = GatewayConfig::default();
        c.epp.listen = Some("0.0.0.0:9002".parse().expect("addr"));
        refused(&c, "epp.listen 0.0.0.0:9002 is not loopback");
        c.tls.cert = Some("/c.pem".into());
        c.tls.key = Some("/k.pem".into());
        c.tls.client_ca = Some("/ca.pem".into());
        c.validate().expect("mutual TLS");
        let mut c = GatewayConfig::default();
        c.epp.listen = Some("0.0.0.0:9002".parse().expect("addr"));
        c.auth.allow_unauthenticated = true;
        c.validate().expect("waived");
    }
}
