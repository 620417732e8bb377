//! One replica's shell side: its configuration, name and URLs (parsed
//! once), event counters and the switch that stops its tasks. What the
//! fleet knows about it (health, load, cached blocks) is in `fleet.rs`.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use axum::http::Uri;
use kvgate_events::subscriber::SubscriberMetrics;
use kvgate_index::ReplicaId;
use tokio::sync::watch;

use crate::config::ReplicaConfig;
use crate::request::route::Route;

/// One configured replica at runtime.
#[derive(Debug)]
pub(crate) struct Replica {
    pub(crate) id: ReplicaId,
    pub(crate) config: ReplicaConfig,
    pub(crate) name: String,
    /// The URL without a trailing slash.
    pub(crate) base: String,
    /// The engine's URL of each route (`Route::ALL` order), parsed once (parsing a URL
    /// per request was 3 % of a short request's CPU). `http::Uri`, what the
    /// engine client sends on, so nothing is parsed again per request.
    pub(crate) route_urls: [Uri; Route::COUNT],
    /// Its `host:port` ([`Replica::endpoint_of`]), made once: the endpoint
    /// picker names and matches replicas by it on every request.
    pub(crate) endpoint: String,
    pub(crate) events: Arc<SubscriberMetrics>,
    pub(crate) routed: AtomicU64,
    /// Stops this replica's tasks (subscriber, monitor) when set.
    pub(crate) stop: watch::Sender<bool>,
}

impl Replica {
    /// `base` + each route's path, parsed (checked as a URL first, for
    /// the same errors as everywhere else a URL is read).
    pub(crate) fn parse_route_urls(base: &str) -> Result<[Uri; Route::COUNT], String> {
        let parse = |route: Route| {
            let text = format!("{base}{}", route.path());
            let url = reqwest::Url::parse(&text).map_err(|e| format!("invalid URL {base}: {e}"))?;
            Uri::try_from(url.as_str()).map_err(|e| format!("invalid URL {base}: {e}"))
        };
        Ok([
            parse(Route::Chat)?,
            parse(Route::Completions)?,
            parse(Route::Messages)?,
            parse(Route::Responses)?,
        ])
    }

    /// The engine's `host:port` in `url`, as a gateway's endpoint list names
    /// it (the endpoint picker's answer; IPv6 hosts in brackets).
    pub(crate) fn endpoint_of(url: &Uri) -> String {
        let https = url.scheme_str() == Some("https");
        let port = url.port_u16().unwrap_or(if https { 443 } else { 80 });
        format!("{}:{port}", url.host().unwrap_or_default())
    }

    /// The engine URL for `route`.
    pub(crate) fn route_url(&self, route: Route) -> &Uri {
        &self.route_urls[route.index()]
    }
}
