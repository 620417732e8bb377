//! Configuration of the endpoint picker front door (`kvgate epp`): the
//! `[epp]` section of [`GatewayConfig`](crate::GatewayConfig).

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

use crate::config::tls_config::TlsConfig;
use crate::error::ConfigError;

/// The Gateway API Inference Extension's endpoint picker: an Envoy
/// external-processing (ext_proc) gRPC service that picks the replica for
/// each request while the gateway carries the bytes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EppConfig {
    /// The ext_proc gRPC listener; unset: no endpoint picker (`kvgate epp`
    /// sets it, default `127.0.0.1:9002`). Off loopback it needs mutual TLS
    /// (`tls.client_ca`) or `auth.allow_unauthenticated`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub listen: Option<SocketAddr>,
    /// Endpoints listed after the chosen one in
    /// `x-gateway-destination-endpoint`, cheapest first, for the gateway to
    /// try if the first fails (they come from the decision's explanation, so
    /// `router.explain_last` must be above 0 for any to be listed).
    pub fallbacks: usize,
    /// Write the prompt token ids into the forwarded body, as `serve` does,
    /// following each replica's `passthrough`; false forwards the client's
    /// body unchanged.
    pub token_passthrough: bool,
}

impl Default for EppConfig {
    fn default() -> Self {
        EppConfig { listen: None, fallbacks: 2, token_passthrough: true }
    }
}

/// Where `kvgate epp` listens when neither the file nor a flag says.
pub const DEFAULT_EPP_LISTEN: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 9002);

/// Most fallback endpoints listed.
const MAX_FALLBACKS: usize = 16;

impl EppConfig {
    pub(crate) fn validate(
        &self,
        allow_unauthenticated: bool,
        tls: &TlsConfig,
    ) -> Result<(), ConfigError> {
        if let Some(a) = self.listen {
            // Who may ask for picks: the gateway, proven by its client
            // certificate (mutual TLS), or anyone on a trusted network.
            let mutual_tls = tls.client_ca.is_some();
            if !a.ip().is_loopback() && !allow_unauthenticated && !mutual_tls {
                return Err(ConfigError::Invalid(format!(
                    "epp.listen {a} is not loopback: require the gateway's client certificate \
                     (tls.cert, tls.key and tls.client_ca), or pass --allow-unauthenticated \
                     (auth.allow_unauthenticated) to serve it on a network you trust"
                )));
            }
        }
        if self.fallbacks > MAX_FALLBACKS {
            return Err(ConfigError::Invalid(format!(
                "epp.fallbacks {} is above {MAX_FALLBACKS}",
                self.fallbacks
            )));
        }
        Ok(())
    }
}
