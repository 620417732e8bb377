//! Configuration of load sharing over NATS: the `[peers.nats]` table of
//! [`PeersConfig`](crate::config::cluster_config::PeersConfig). What it
//! connects with is `doors/peer_bus.rs`.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::error::ConfigError;

/// The subject instances share when `subject` is not set.
pub const DEFAULT_SUBJECT: &str = "kvgate.peers";

/// NATS Core publish/subscribe as the carrier of peers' ledger changes:
/// each instance publishes each batch once on `subject` and applies every
/// other instance's. One subject per deployment.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NatsConfig {
    /// The NATS servers, comma-separated, e.g. `nats://nats:4222`
    /// (`tls://` requires TLS). Unset: no NATS.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// The subject of this deployment's changes; every instance of one
    /// deployment uses the same, and no other deployment uses it.
    pub subject: String,
    /// A token the server requires (`authorization { token }`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    /// A user the server knows, with `password`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// `user`'s password.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub password: Option<String>,
    /// A file holding an nkey seed (`SU…`) the server knows by its public key.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nkey_seed_file: Option<PathBuf>,
    /// A CA bundle (PEM) the server's certificate must chain to; set, the
    /// connection requires TLS.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ca: Option<PathBuf>,
    /// A certificate chain (PEM) presented to a server that verifies clients.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client_cert: Option<PathBuf>,
    /// Its private key (PEM); refused when others may read the file.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client_key: Option<PathBuf>,
}

impl Default for NatsConfig {
    fn default() -> Self {
        NatsConfig {
            url: None,
            subject: DEFAULT_SUBJECT.to_owned(),
            token: None,
            user: None,
            password: None,
            nkey_seed_file: None,
            ca: None,
            client_cert: None,
            client_key: None,
        }
    }
}

impl NatsConfig {
    /// Whether changes travel over NATS.
    pub fn enabled(&self) -> bool {
        self.url.is_some()
    }

    /// The servers of `url`, trimmed.
    pub(crate) fn servers(&self) -> Vec<&str> {
        self.url
            .iter()
            .flat_map(|u| u.split(','))
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .collect()
    }

    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        let bad = |m: String| Err(ConfigError::Invalid(m));
        let Some(url) = &self.url else {
            let set = [
                ("token", self.token.is_some()),
                ("user", self.user.is_some()),
                ("password", self.password.is_some()),
                ("nkey_seed_file", self.nkey_seed_file.is_some()),
                ("ca", self.ca.is_some()),
                ("client_cert", self.client_cert.is_some()),
                ("client_key", self.client_key.is_some()),
            ];
            if let Some((key, _)) = set.iter().find(|(_, on)| *on) {
                return bad(format!(
                    "peers.nats.{key} is set but peers.nats.url is not (--peer-nats URL)"
                ));
            }
            return Ok(());
        };
        let servers = self.servers();
        if servers.is_empty() {
            return bad(format!("peers.nats.url {url:?}: no server named"));
        }
        for s in &servers {
            let parsed = if s.contains("://") {
                reqwest::Url::parse(s)
            } else {
                reqwest::Url::parse(&format!("nats://{s}"))
            }
            .map_err(|e| ConfigError::Invalid(format!("peers.nats.url {s:?}: {e}")))?;
            match parsed.scheme() {
                "nats" => {}
                "tls" if self.ca.is_some() => {}
                "tls" => {
                    return bad(format!(
                        "peers.nats.url {s:?}: tls:// needs peers.nats.ca, the CA bundle the \
                         server's certificate chains to"
                    ))
                }
                other => {
                    return bad(format!(
                        "peers.nats.url {s:?}: scheme {other:?}, expected nats:// or tls://"
                    ))
                }
            }
            if parsed.host_str().is_none_or(str::is_empty) {
                return bad(format!("peers.nats.url {s:?}: no host"));
            }
        }
        check_subject(&self.subject)?;
        let methods = [self.token.is_some(), self.user.is_some(), self.nkey_seed_file.is_some()];
        if methods.iter().filter(|&&m| m).count() > 1 {
            return bad("peers.nats: token, user/password and nkey_seed_file are alternatives; \
                        set one"
                .into());
        }
        if self.user.is_some() != self.password.is_some() {
            return bad("peers.nats.user and peers.nats.password go together".into());
        }
        if self.token.as_deref().is_some_and(str::is_empty) {
            return bad("peers.nats.token is empty".into());
        }
        if self.client_cert.is_some() != self.client_key.is_some() {
            return bad("peers.nats.client_cert and peers.nats.client_key go together".into());
        }
        if self.client_cert.is_some() && self.ca.is_none() {
            return bad(
                "peers.nats.client_cert is presented over TLS, which needs peers.nats.ca".into()
            );
        }
        Ok(())
    }
}

/// A subject kvgate may publish on: dot-separated tokens, none empty, no
/// wildcard (`*`, `>`) and no whitespace.
fn check_subject(subject: &str) -> Result<(), ConfigError> {
    let ok = !subject.is_empty()
        && subject.split('.').all(|t| {
            !t.is_empty() && t != "*" && t != ">" && !t.chars().any(|c| c.is_whitespace())
        })
        && !subject.contains(['*', '>']);
    if ok {
        Ok(())
    } else {
        Err(ConfigError::Invalid(format!(
            "peers.nats.subject {subject:?}: expected dot-separated tokens without wildcards \
             or spaces, e.g. {DEFAULT_SUBJECT}.prod"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_url(url: &str) -> NatsConfig {
        NatsConfig { url: Some(url.to_owned()), ..NatsConfig::default() }
    }

    fn message(c: &NatsConfig) -> String {
        c.validate().err().map(|e| e.to_string()).unwrap_or_default()
    }

    #[test]
    fn good_settings_pass() {
        assert!(NatsConfig::default().validate().is_ok());
        assert!(with_url("nats://127.0.0.1:4222").validate().is_ok());
        assert!(with_url("nats-a:4222, nats://nats-b:4222").validate().is_ok());
        let tls = NatsConfig { ca: Some("/etc/ca.pem".into()), ..with_url("tls://nats:4222") };
        assert!(tls.validate().is_ok());
        let user = NatsConfig {
            user: Some("kvgate".into()),
            password: Some("pw".into()),
            ..with_url("nats://nats:4222")
        };
        assert!(user.validate().is_ok());
    }

    #[test]
    fn mistakes_are_named() {
        assert!(message(&with_url("http://nats:4222")).contains("expected nats:// or tls://"));
        assert!(message(&with_url("tls://nats:4222")).contains("needs peers.nats.ca"));
        assert!(message(&with_url(" , ")).contains("no server"));
        for subject in ["", "a..b", "kvgate.*", "kvgate.>", "has space", "a.b>"] {
            let c = NatsConfig { subject: subject.into(), ..with_url("nats://n:4222") };
            assert!(message(&c).contains("peers.nats.subject"), "{subject:?}: {}", message(&c));
        }
        let both = NatsConfig {
            token: Some("t".into()),
            nkey_seed_file: Some("/s".into()),
            ..with_url("nats://n:4222")
        };
        assert!(message(&both).contains("alternatives"));
        let half = NatsConfig { user: Some("u".into()), ..with_url("nats://n:4222") };
        assert!(message(&half).contains("go together"));
        let orphan = NatsConfig { token: Some("t".into()), ..NatsConfig::default() };
        assert!(message(&orphan).contains("peers.nats.token is set but peers.nats.url is not"));
        let cert = NatsConfig {
            client_cert: Some("/c".into()),
            client_key: Some("/k".into()),
            ..with_url("nats://n:4222")
        };
        assert!(message(&cert).contains("needs peers.nats.ca"));
    }
}
