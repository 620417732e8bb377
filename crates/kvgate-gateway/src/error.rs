//! Typed errors of the gateway library.

use std::net::SocketAddr;

/// A configuration that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The TOML did not parse or did not match the schema.
    #[error("config: {0}")]
    Parse(String),
    /// A value is out of range or inconsistent.
    #[error("config: {0}")]
    Invalid(String),
}

/// Why the gateway could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// Bad configuration.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A listener could not bind.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The OS error.
        source: std::io::Error,
    },
    /// The tokenizer could not be loaded.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// The router or index refused a replica.
    #[error("replica {name}: {reason}")]
    Replica {
        /// The replica.
        name: String,
        /// Why.
        reason: String,
    },
    /// The HTTP client could not be built.
    #[error("http client: {0}")]
    Client(String),
    /// A TLS certificate, key or CA bundle is missing, unreadable, weak or
    /// inconsistent.
    #[error("tls: {0}")]
    Tls(String),
    /// The NATS server that carries peers' changes refused this instance
    /// (credentials, TLS) or could not be addressed.
    #[error("peers.nats {servers}: {hint}")]
    BusRefused {
        /// The servers tried.
        servers: String,
        /// What to check.
        hint: &'static str,
        /// The client's error.
        source: async_nats::ConnectError,
    },
    /// The nkey seed file could not be read.
    #[error("peers.nats.nkey_seed_file {}", path.display())]
    BusSeed {
        /// The file.
        path: std::path::PathBuf,
        /// Why.
        source: std::io::Error,
    },
}
