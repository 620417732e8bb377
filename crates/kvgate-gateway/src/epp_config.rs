//! Configuration of the endpoint picker front door (`kvgate epp`): the
//! `[epp]` section of [`GatewayConfig`](crate::GatewayConfig).

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

use crate::error::ConfigError;

/// The Gateway API Inference Extension's endpoint picker: an Envoy
/// external-processing (ext_proc) gRPC service that picks the replica for
/// each request while the gateway carries the bytes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EppConfig {
    /// The ext_proc gRPC listener; unset: no endpoint picker (`kvgate epp`
    /// sets it, default `127.0.0.1:9002`). Off loopback it needs
    /// `auth.allow_unauthenticated` (gRPC TLS is not built yet).
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
    pub(crate) fn validate(&self, allow_unauthenticated: bool) -> Result<(), ConfigError> {
        if let Some(a) = self.listen {
            if !a.ip().is_loopback() && !allow_unauthenticated {
                return Err(ConfigError::Invalid(format!(
                    "epp.listen {a} is not loopback: the endpoint picker has no TLS or keys of \
                     its own yet, so pass --allow-unauthenticated (auth.allow_unauthenticated) \
                     to serve it on a network you trust"
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
