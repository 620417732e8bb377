//! Counters shared by several router instances. Each instance owns its
//! shard: per tenant, the VTC service it charged itself, its lift register
//! and its tokens of the last minute. It exports the shard as a
//! [`ShardSnapshot`] (whole, or only what changed since the last export)
//! on whatever channel the instances already share, and every reader adds
//! the peers' shards to its own: service and tokens are summed, lifts are
//! the largest register. With them travels how many of each tenant's
//! requests wait on the instance, so that a tenant waiting on a peer is not
//! lifted as if it had been idle. Values are absolute, so applying a snapshot twice,
//! or a stale one, changes nothing.
//!
//! Snapshots name tenants by name, since each instance numbers its tenants
//! in the order it met them.

use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};

/// One instance's shard, or the part of it that changed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ShardSnapshot {
    /// The exporting instance.
    pub instance: String,
    /// A number the instance picks at start (a restart's shard replaces the
    /// last one's instead of waiting for its versions to catch up).
    pub incarnation: u64,
    /// Increases with every export of the incarnation.
    pub version: u64,
    /// Whether `tenants` is the whole shard (a tenant it leaves out is zero)
    /// or only the tenants that changed.
    pub full: bool,
    /// The tenants.
    pub tenants: Vec<TenantShard>,
}

/// One tenant in one instance's shard.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TenantShard {
    /// The tenant's name.
    pub tenant: String,
    /// Weighted VTC service charged by this instance.
    pub service: f64,
    /// This instance's lift register.
    pub lift: f64,
    /// Tokens this instance counted in the last minute.
    pub window_tokens: u64,
    /// The tenant's requests waiting on this instance: while a peer holds
    /// some, the tenant is backlogged and a new local backlog is not lifted.
    pub waiting: u64,
}

/// One tenant's values in a shard: this instance's own, or the peers' sums.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct ShardValues {
    pub(crate) service: f64,
    pub(crate) lift: f64,
    pub(crate) window_tokens: u64,
    pub(crate) waiting: u64,
}

#[derive(Clone, Debug)]
struct PeerShard {
    incarnation: u64,
    version: u64,
    tenants: FxHashMap<String, ShardValues>,
}

/// The latest shard of every peer.
#[derive(Clone, Debug, Default)]
pub(crate) struct Peers {
    peers: FxHashMap<String, PeerShard>,
}

impl Peers {
    /// Applies a peer's snapshot; returns the tenants whose sums may have
    /// changed (none for a stale or repeated snapshot).
    pub(crate) fn apply(&mut self, snapshot: &ShardSnapshot) -> Vec<String> {
        let peer = self.peers.entry(snapshot.instance.clone()).or_insert_with(|| PeerShard {
            incarnation: snapshot.incarnation,
            version: 0,
            tenants: FxHashMap::default(),
        });
        let restarted = peer.incarnation != snapshot.incarnation;
        if !restarted && snapshot.version <= peer.version {
            return Vec::new();
        }
        let mut changed = Vec::new();
        if restarted || snapshot.full {
            changed.extend(peer.tenants.drain().map(|(name, _)| name));
        }
        peer.incarnation = snapshot.incarnation;
        peer.version = snapshot.version;
        for row in &snapshot.tenants {
            let values = ShardValues {
                service: row.service,
                lift: row.lift,
                window_tokens: row.window_tokens,
                waiting: row.waiting,
            };
            peer.tenants.insert(row.tenant.clone(), values);
            changed.push(row.tenant.clone());
        }
        changed.sort_unstable();
        changed.dedup();
        changed
    }

    /// Drops a peer that left; returns the tenants it had counted.
    pub(crate) fn forget(&mut self, instance: &str) -> Vec<String> {
        self.peers
            .remove(instance)
            .map(|peer| peer.tenants.into_keys().collect())
            .unwrap_or_default()
    }

    /// The peers' part of a tenant's counters.
    pub(crate) fn sums(&self, tenant: &str) -> ShardValues {
        let mut sums = ShardValues::default();
        for peer in self.peers.values() {
            if let Some(row) = peer.tenants.get(tenant) {
                sums.service += row.service;
                sums.lift = sums.lift.max(row.lift);
                sums.window_tokens = sums.window_tokens.saturating_add(row.window_tokens);
                sums.waiting = sums.waiting.saturating_add(row.waiting);
            }
        }
        sums
    }

    /// How many peers have sent a shard.
    pub(crate) fn len(&self) -> usize {
        self.peers.len()
    }
}

/// What this instance last exported per tenant, to send only changes.
#[derive(Clone, Debug, Default)]
pub(crate) struct Exported {
    version: u64,
    last: Vec<ShardValues>,
}

impl Exported {
    /// Builds the next snapshot from every tenant's current shard values
    /// (in tenant id order): all non-zero rows when `full`, else the rows
    /// that differ from the last export.
    pub(crate) fn next<'a>(
        &mut self,
        identity: (&str, u64),
        full: bool,
        rows: impl Iterator<Item = (&'a str, ShardValues)>,
    ) -> ShardSnapshot {
        self.version += 1;
        let mut tenants = Vec::new();
        for (i, (name, now)) in rows.enumerate() {
            if self.last.len() <= i {
                self.last.push(ShardValues::default());
            }
            let changed = self.last[i] != now;
            let nonzero = now != ShardValues::default();
            if (full && nonzero) || (!full && changed) {
                tenants.push(TenantShard {
                    tenant: name.to_owned(),
                    service: now.service,
                    lift: now.lift,
                    window_tokens: now.window_tokens,
                    waiting: now.waiting,
                });
            }
            self.last[i] = now;
        }
        ShardSnapshot {
            instance: identity.0.to_owned(),
            incarnation: identity.1,
            version: self.version,
            full,
            tenants,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snap(instance: &str, version: u64, full: bool, rows: &[(&str, f64, u64)]) -> ShardSnapshot {
        ShardSnapshot {
            instance: instance.into(),
            incarnation: 7,
            version,
            full,
            tenants: rows
                .iter()
                .map(|&(tenant, service, window_tokens)| TenantShard {
                    tenant: tenant.into(),
                    service,
                    lift: service / 2.0,
                    window_tokens,
                    waiting: 0,
                })
                .collect(),
        }
    }

    #[test]
    fn readers_sum_service_and_tokens_and_take_the_largest_lift() {
        let mut peers = Peers::default();
        peers.apply(&snap("b", 1, true, &[("x", 10.0, 5)]));
        peers.apply(&snap("c", 1, true, &[("x", 30.0, 7), ("y", 1.0, 0)]));
        let x = peers.sums("x");
        assert_eq!((x.service, x.lift, x.window_tokens), (40.0, 15.0, 12));
        assert_eq!(peers.len(), 2);
        let mut forgotten = peers.forget("c");
        forgotten.sort();
        assert_eq!(forgotten, ["x", "y"]);
        assert_eq!(peers.sums("x").service, 10.0);
    }

    #[test]
    fn stale_and_repeated_snapshots_change_nothing_and_full_ones_replace() {
        let mut peers = Peers::default();
        assert_eq!(peers.apply(&snap("b", 2, true, &[("x", 10.0, 5)])), ["x"]);
        assert!(peers.apply(&snap("b", 2, true, &[("x", 99.0, 5)])).is_empty());
        assert!(peers.apply(&snap("b", 1, false, &[("x", 99.0, 5)])).is_empty());
        assert_eq!(peers.sums("x").service, 10.0);
        // A delta updates the tenants it names.
        peers.apply(&snap("b", 3, false, &[("y", 4.0, 0)]));
        assert_eq!(peers.sums("x").service, 10.0);
        assert_eq!(peers.sums("y").service, 4.0);
        // A full snapshot drops the tenants it leaves out.
        let changed = peers.apply(&snap("b", 4, true, &[("y", 5.0, 0)]));
        assert_eq!(changed, ["x", "y"]);
        assert_eq!(peers.sums("x"), ShardValues::default());
        // A restart (new incarnation) replaces whatever its versions say.
        let mut restarted = snap("b", 1, false, &[("z", 1.0, 0)]);
        restarted.incarnation = 8;
        peers.apply(&restarted);
        assert_eq!(peers.sums("y"), ShardValues::default());
        assert_eq!(peers.sums("z").service, 1.0);
    }

    #[test]
    fn exports_send_every_non_zero_row_or_only_changes() {
        let mut exported = Exported::default();
        let row = |service: f64| ShardValues { service, lift: 0.0, window_tokens: 0, waiting: 0 };
        let full = exported.next(("a", 1), true, [("x", row(1.0)), ("y", row(0.0))].into_iter());
        assert_eq!((full.version, full.tenants.len()), (1, 1));
        let delta = exported.next(("a", 1), false, [("x", row(1.0)), ("y", row(2.0))].into_iter());
        assert_eq!(delta.version, 2);
        assert_eq!(delta.tenants.len(), 1);
        assert_eq!(delta.tenants[0].tenant, "y");
    }
}
