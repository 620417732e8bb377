//! The crate's one error type; each variant keeps its cause as `source()`.

/// Why a live run could not start or finish.
#[derive(Debug, thiserror::Error)]
pub enum LiveError {
    /// The speed-up factor is not a positive number.
    #[error("--speedup must be a positive number, not {0}")]
    BadSpeedup(f64),
    /// The async runtime could not start.
    #[error("cannot start the async runtime")]
    Runtime(#[source] std::io::Error),
    /// The HTTP client could not be built.
    #[error("cannot build the HTTP client")]
    Client(#[source] reqwest::Error),
    /// No run of free loopback ports for the spawned fleet.
    #[error("no run of {0} free loopback ports found")]
    NoPorts(usize),
    /// A process of the fleet could not be started.
    #[error("cannot start {what}")]
    Spawn {
        /// Which process.
        what: &'static str,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A kvgate did not become ready in time.
    #[error("kvgate at {base} not ready after 60 s (last answer: {last})")]
    NotReady {
        /// Its base URL.
        base: String,
        /// The last status or error seen.
        last: String,
    },
    /// An engine's metrics could not be read.
    #[error("cannot scrape {url}")]
    Scrape {
        /// The page.
        url: String,
        /// The cause.
        #[source]
        source: reqwest::Error,
    },
}
