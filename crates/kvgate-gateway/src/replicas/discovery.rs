//! Engines found through DNS: `discovery.dns` (a Kubernetes headless
//! Service of the vLLM pods) is resolved every `discovery.interval_ms`.
//! A new address becomes a replica named `IP:PORT` with the configured
//! ports, topic and key; an address that disappears is drained (no new
//! requests) and removed once idle or after `discovery.drain_ms`; one that
//! comes back while draining is put back in rotation. A failed lookup
//! changes nothing: a DNS hiccup must not drain the fleet. Static replicas
//! are never touched.

use std::collections::{BTreeSet, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::watch;

use crate::config::cluster_config::DiscoveryConfig;
use crate::config::settings::DiscoveryTiming;
use crate::config::ReplicaConfig;
use crate::replicas::registry::Registry;

/// What to do after a lookup, given the discovered replicas by name.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Plan {
    /// Names to register.
    pub(crate) add: Vec<String>,
    /// Names to drain (gone from DNS).
    pub(crate) drain: Vec<String>,
    /// Names back in DNS while draining.
    pub(crate) undrain: Vec<String>,
}

/// Compares a lookup with what was discovered before.
pub(crate) fn plan(
    resolved: &BTreeSet<String>,
    discovered: &BTreeSet<String>,
    draining: &HashMap<String, Instant>,
) -> Plan {
    let mut p = Plan::default();
    for name in resolved {
        if !discovered.contains(name) {
            p.add.push(name.clone());
        } else if draining.contains_key(name) {
            p.undrain.push(name.clone());
        }
    }
    for name in discovered {
        if !resolved.contains(name) && !draining.contains_key(name) {
            p.drain.push(name.clone());
        }
    }
    p
}

/// `IP:PORT`, bracketed for IPv6, as a replica name and URL authority.
fn authority(ip: IpAddr, port: u16) -> String {
    SocketAddr::new(ip, port).to_string()
}

fn replica_config(d: &DiscoveryConfig, pool: &str, ip: IpAddr) -> ReplicaConfig {
    let mut r = ReplicaConfig::new(format!("{}://{}", d.scheme, authority(ip, d.http_port)));
    r.name = Some(authority(ip, d.http_port));
    r.events = Some(format!("tcp://{}", authority(ip, d.events_port)));
    r.replay = (d.replay_port > 0).then(|| format!("tcp://{}", authority(ip, d.replay_port)));
    r.topic = d.topic.clone();
    r.api_key = d.api_key.clone();
    r.block_size = d.block_size;
    r.pool = Some(pool.to_owned());
    r
}

/// Runs discovery with `d` (a pool's `discovery`) until `stop`; replicas
/// come and go in `pool` through `registry`, the only handle discovery
/// needs.
pub(crate) async fn run(
    d: DiscoveryConfig,
    timing: DiscoveryTiming,
    pool: String,
    registry: Arc<Registry>,
    mut stop: watch::Receiver<bool>,
) {
    let Some(dns) = d.dns.clone() else { return };
    let mut tick = tokio::time::interval(timing.interval);
    let mut discovered: BTreeSet<String> = BTreeSet::new();
    let mut ips: HashMap<String, IpAddr> = HashMap::new();
    let mut draining: HashMap<String, Instant> = HashMap::new();
    loop {
        tokio::select! {
            _ = stop.changed() => return,
            _ = tick.tick() => {}
        }
        let found = match tokio::net::lookup_host((dns.as_str(), d.http_port)).await {
            Ok(a) => a.map(|a| a.ip()).collect::<BTreeSet<IpAddr>>(),
            Err(e) => {
                tracing::warn!(%dns, error = %e, "engine DNS lookup failed; keeping the current replicas");
                continue;
            }
        };
        let resolved: BTreeSet<String> = found
            .iter()
            .map(|&ip| {
                let name = authority(ip, d.http_port);
                ips.insert(name.clone(), ip);
                name
            })
            .collect();
        let p = plan(&resolved, &discovered, &draining);
        let now = crate::clock::now();
        for name in &p.add {
            let Some(&ip) = ips.get(name) else { continue };
            match registry.add(replica_config(&d, &pool, ip)) {
                Ok(_) => {
                    discovered.insert(name.clone());
                    tracing::info!(replica = %name, %dns, "engine discovered");
                }
                Err(e) => tracing::warn!(replica = %name, error = %e, "discovered engine refused"),
            }
        }
        for name in &p.undrain {
            if let Some(r) = registry.by_name(name) {
                registry.undrain(&r, now);
                draining.remove(name);
                tracing::info!(replica = %name, "engine back in DNS; draining stopped");
            }
        }
        for name in &p.drain {
            if let Some(r) = registry.by_name(name) {
                registry.drain(&r);
                draining.insert(name.clone(), now);
                tracing::info!(replica = %name, "engine gone from DNS; draining");
            }
        }
        // Remove drained engines once idle, or when the drain time is up.
        let limit = timing.drain;
        let done: Vec<String> = draining
            .iter()
            .filter(|(name, since)| {
                let idle = registry.by_name(name).is_none_or(|r| registry.idle(&r));
                idle || now.saturating_duration_since(**since) >= limit
            })
            .map(|(n, _)| n.clone())
            .collect();
        for name in done {
            draining.remove(&name);
            discovered.remove(&name);
            if let Some(r) = registry.by_name(&name) {
                registry.remove(&r);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn new_addresses_are_added_and_vanished_ones_drained_once() {
        let draining = HashMap::new();
        let p = plan(&set(&["a", "b", "c"]), &set(&["a", "d"]), &draining);
        assert_eq!(p.add, vec!["b", "c"]);
        assert_eq!(p.drain, vec!["d"]);
        assert!(p.undrain.is_empty());
        // Already draining: not drained again.
        let draining: HashMap<String, Instant> = [("d".to_owned(), Instant::now())].into();
        let p = plan(&set(&["a"]), &set(&["a", "d"]), &draining);
        assert!(p.drain.is_empty() && p.add.is_empty());
        // Back while draining: put back in rotation, not re-added.
        let p = plan(&set(&["a", "d"]), &set(&["a", "d"]), &draining);
        assert_eq!(p.undrain, vec!["d"]);
        assert!(p.add.is_empty());
    }

    #[test]
    fn names_bracket_ipv6() {
        assert_eq!(
            authority("10.0.0.5".parse().unwrap_or(IpAddr::from([0, 0, 0, 0])), 8000),
            "10.0.0.5:8000"
        );
        assert_eq!(
            authority("::1".parse().unwrap_or(IpAddr::from([0, 0, 0, 0])), 8000),
            "[::1]:8000"
        );
    }
}
