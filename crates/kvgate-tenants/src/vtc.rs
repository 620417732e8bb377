//! The Virtual Token Counter (Sheng et al., "Fairness in Serving Large
//! Language Models", OSDI 2024): one counter per tenant, the service it has
//! received in weighted tokens. Within a band the backlogged tenant with the
//! smallest counter is served next, so two tenants that stay backlogged
//! never drift apart by more than about twice the largest request's cost.
//!
//! Charges: `input_tokens × input_weight / weight` when a request is
//! dispatched, `output_tokens × output_weight / weight` as the engine
//! produces them, and the difference when the final usage is known.
//!
//! Counter lift: a tenant whose queue in a band turns non-empty is raised to
//! the smallest counter among the tenants backlogged in that band (or, with
//! none backlogged, to the counter of the tenant that left last), so time
//! spent idle earns no credit.
//!
//! Several instances: a counter is `service + peer_service + max(lift,
//! peer_lift)`. `service` is this instance's own charges and the peers'
//! charges are summed (a grow-only sum per instance); lifts are a maximum
//! over instances, so two instances lifting the same tenant at once do not
//! lift it twice (`shards.rs` carries both).
//!
//! Tenants waiting only on peers matter too: a pick whose counter is ahead
//! of such a tenant's by more than the slack the caller allows is passed
//! over, so that the peer, which sees the same free capacity, serves its
//! tenant instead ([`Vtc::peer_is_behind`]).
//!
//! Backlogged tenants sit per band in a `BTreeSet` keyed by (counter,
//! tenant), and tenants waiting on peers in a second one per home band, so
//! picking, backlogging, leaving and re-keying after a charge are O(log n)
//! in the number of backlogged tenants.

use std::cmp::Ordering;
use std::collections::BTreeSet;

use crate::ids::{BandId, TenantId};

/// A counter value ordered totally (counters are finite by construction).
#[derive(Clone, Copy, Debug, PartialEq)]
struct Key(f64);

impl Eq for Key {}

impl PartialOrd for Key {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Key {
    fn cmp(&self, other: &Self) -> Ordering {
        self.0.total_cmp(&other.0)
    }
}

#[derive(Clone, Debug)]
struct TenantVtc {
    weight: f64,
    /// This instance's own charges, weighted.
    service: f64,
    /// This instance's lift register.
    lift: f64,
    /// The peers' charges, summed.
    peer_service: f64,
    /// The largest of the peers' lift registers.
    peer_lift: f64,
    /// Whether a peer holds requests of the tenant waiting.
    peer_backlogged: bool,
    /// The band its requests wait in by default, where it is listed while
    /// it waits on a peer.
    home_band: BandId,
    /// The counter under which the tenant sits in its bands' sets.
    key: f64,
    /// Bit `b` set: backlogged in band `b`.
    backlogged: u64,
}

impl TenantVtc {
    fn counter(&self) -> f64 {
        self.service + self.peer_service + self.lift.max(self.peer_lift)
    }
}

#[derive(Clone, Debug, Default)]
struct BandVtc {
    backlogged: BTreeSet<(Key, TenantId)>,
    /// Tenants of this home band with requests waiting on a peer.
    on_peers: BTreeSet<(Key, TenantId)>,
    last_left: Option<TenantId>,
}

/// Every tenant's counter and every band's backlogged set.
#[derive(Clone, Debug)]
pub(crate) struct Vtc {
    input_weight: f64,
    output_weight: f64,
    tenants: Vec<TenantVtc>,
    bands: Vec<BandVtc>,
}

impl Vtc {
    pub(crate) fn new(input_weight: f64, output_weight: f64, n_bands: usize) -> Self {
        Self {
            input_weight,
            output_weight,
            tenants: Vec::new(),
            bands: vec![BandVtc::default(); n_bands],
        }
    }

    /// Adds the next tenant (ids are dense, in order of addition).
    pub(crate) fn add_tenant(&mut self, weight: f64, home_band: BandId) {
        self.tenants.push(TenantVtc {
            home_band,
            weight,
            service: 0.0,
            lift: 0.0,
            peer_service: 0.0,
            peer_lift: 0.0,
            peer_backlogged: false,
            key: 0.0,
            backlogged: 0,
        });
    }

    /// The fleet-wide counter the dispatch order uses.
    pub(crate) fn counter(&self, tenant: TenantId) -> f64 {
        self.tenants[tenant.index()].counter()
    }

    /// This instance's shard of the tenant: (own weighted service, lift register).
    pub(crate) fn own(&self, tenant: TenantId) -> (f64, f64) {
        let t = &self.tenants[tenant.index()];
        (t.service, t.lift)
    }

    /// The backlogged tenant of the band with the smallest counter.
    pub(crate) fn pick(&self, band: BandId) -> Option<TenantId> {
        self.bands[band.index()].backlogged.first().map(|&(_, tenant)| tenant)
    }

    /// How many tenants are backlogged in the band.
    pub(crate) fn backlogged_len(&self, band: BandId) -> usize {
        self.bands[band.index()].backlogged.len()
    }

    /// The tenant's queue in `band` turned non-empty: lift (unless it
    /// waits on a peer, and so was never idle), then join the set.
    pub(crate) fn backlog(&mut self, tenant: TenantId, band: BandId) {
        if self.tenants[tenant.index()].peer_backlogged {
            self.join(tenant, band);
            return;
        }
        let b = &self.bands[band.index()];
        let floor = match b.backlogged.first() {
            Some(&(Key(min), _)) => Some(min),
            None => b.last_left.map(|left| self.tenants[left.index()].counter()),
        };
        let t = &mut self.tenants[tenant.index()];
        if let Some(floor) = floor {
            if t.counter() < floor {
                t.lift = floor - t.service - t.peer_service;
            }
        }
        self.rekey(tenant);
        self.join(tenant, band);
    }

    fn join(&mut self, tenant: TenantId, band: BandId) {
        let t = &mut self.tenants[tenant.index()];
        t.backlogged |= 1 << band.0;
        let key = (Key(t.key), tenant);
        self.bands[band.index()].backlogged.insert(key);
    }

    /// The tenant's queue in `band` turned empty: leave the set.
    pub(crate) fn idle(&mut self, tenant: TenantId, band: BandId) {
        let t = &mut self.tenants[tenant.index()];
        t.backlogged &= !(1 << band.0);
        let key = (Key(t.key), tenant);
        let b = &mut self.bands[band.index()];
        b.backlogged.remove(&key);
        b.last_left = Some(tenant);
    }

    /// Charges (or, negative, refunds) input tokens at the tenant's weight.
    pub(crate) fn charge_input(&mut self, tenant: TenantId, tokens: f64) {
        self.charge(tenant, tokens * self.input_weight);
    }

    /// Charges (or, negative, refunds) output tokens at the tenant's weight.
    pub(crate) fn charge_output(&mut self, tenant: TenantId, tokens: f64) {
        self.charge(tenant, tokens * self.output_weight);
    }

    /// The weighted cost of a request, as the counters would charge it.
    pub(crate) fn cost(&self, tenant: TenantId, input_tokens: u64, output_tokens: u64) -> f64 {
        (input_tokens as f64 * self.input_weight + output_tokens as f64 * self.output_weight)
            / self.tenants[tenant.index()].weight
    }

    /// The peers' part of a tenant's counter, and whether it waits on a
    /// peer, from the merged shards.
    pub(crate) fn set_peer(&mut self, tenant: TenantId, service: f64, lift: f64, backlogged: bool) {
        let t = &mut self.tenants[tenant.index()];
        let on_peers = &mut self.bands[t.home_band.index()].on_peers;
        if t.peer_backlogged {
            on_peers.remove(&(Key(t.key), tenant));
        }
        t.peer_service = service;
        t.peer_lift = lift;
        t.peer_backlogged = backlogged;
        if backlogged {
            on_peers.insert((Key(t.key), tenant));
        }
        self.rekey(tenant);
    }

    /// Whether some other tenant of the band waits on a peer with a
    /// counter more than `slack` below `tenant`'s.
    pub(crate) fn peer_is_behind(&self, band: BandId, tenant: TenantId, slack: f64) -> bool {
        let counter = self.counter(tenant);
        self.bands[band.index()]
            .on_peers
            .iter()
            .find(|&&(_, other)| other != tenant)
            .is_some_and(|&(Key(other), _)| other + slack < counter)
    }

    fn charge(&mut self, tenant: TenantId, unweighted: f64) {
        let t = &mut self.tenants[tenant.index()];
        t.service = (t.service + unweighted / t.weight).max(0.0);
        self.rekey(tenant);
    }

    /// Moves the tenant to its current counter in every band set it is in.
    fn rekey(&mut self, tenant: TenantId) {
        let t = &mut self.tenants[tenant.index()];
        let new = t.counter();
        if new == t.key {
            return;
        }
        let old = std::mem::replace(&mut t.key, new);
        if t.peer_backlogged {
            let on_peers = &mut self.bands[t.home_band.index()].on_peers;
            on_peers.remove(&(Key(old), tenant));
            on_peers.insert((Key(new), tenant));
        }
        let mut mask = t.backlogged;
        while mask != 0 {
            let band = mask.trailing_zeros() as usize;
            mask &= mask - 1;
            let set = &mut self.bands[band].backlogged;
            set.remove(&(Key(old), tenant));
            set.insert((Key(new), tenant));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const B0: BandId = BandId(0);
    const B1: BandId = BandId(1);

    fn vtc(n: usize) -> Vtc {
        let mut vtc = Vtc::new(1.0, 2.0, 2);
        for _ in 0..n {
            vtc.add_tenant(1.0, B0);
        }
        vtc
    }

    #[test]
    fn picks_the_smallest_counter_and_rekeys_on_charge() {
        let mut v = vtc(2);
        v.backlog(TenantId(0), B0);
        v.backlog(TenantId(1), B0);
        assert_eq!(v.pick(B0), Some(TenantId(0)));
        v.charge_input(TenantId(0), 10.0);
        assert_eq!(v.pick(B0), Some(TenantId(1)));
        v.charge_output(TenantId(1), 6.0);
        assert_eq!(v.counter(TenantId(1)), 12.0);
        assert_eq!(v.pick(B0), Some(TenantId(0)));
    }

    #[test]
    fn a_returning_tenant_is_lifted_to_the_backlogged_minimum() {
        let mut v = vtc(3);
        v.backlog(TenantId(0), B0);
        v.backlog(TenantId(1), B0);
        v.charge_input(TenantId(0), 100.0);
        v.charge_input(TenantId(1), 40.0);
        v.backlog(TenantId(2), B0);
        assert_eq!(v.counter(TenantId(2)), 40.0);
        // A counter above the minimum stays where it is.
        v.idle(TenantId(0), B0);
        v.backlog(TenantId(0), B0);
        assert_eq!(v.counter(TenantId(0)), 100.0);
    }

    #[test]
    fn with_nobody_backlogged_the_last_to_leave_sets_the_floor() {
        let mut v = vtc(2);
        v.backlog(TenantId(0), B0);
        v.charge_input(TenantId(0), 50.0);
        v.idle(TenantId(0), B0);
        v.charge_output(TenantId(0), 5.0);
        v.backlog(TenantId(1), B0);
        assert_eq!(v.counter(TenantId(1)), 60.0);
    }

    #[test]
    fn a_tenant_waiting_on_a_peer_is_not_lifted() {
        let mut v = vtc(2);
        v.backlog(TenantId(0), B0);
        v.charge_input(TenantId(0), 100.0);
        v.set_peer(TenantId(1), 10.0, 0.0, true);
        v.backlog(TenantId(1), B0);
        assert_eq!(v.counter(TenantId(1)), 10.0);
        assert_eq!(v.pick(B0), Some(TenantId(1)));
        // Tenant 0, 90 ahead of tenant 1 waiting on a peer, is passed over
        // unless the slack covers the gap.
        assert!(v.peer_is_behind(B0, TenantId(0), 50.0));
        assert!(!v.peer_is_behind(B0, TenantId(0), 90.0));
        assert!(!v.peer_is_behind(B0, TenantId(1), 0.0));
        v.set_peer(TenantId(1), 10.0, 0.0, false);
        assert!(!v.peer_is_behind(B0, TenantId(0), 0.0));
    }

    #[test]
    fn a_tenant_in_two_bands_is_rekeyed_in_both() {
        let mut v = vtc(2);
        v.backlog(TenantId(0), B0);
        v.backlog(TenantId(0), B1);
        v.backlog(TenantId(1), B1);
        v.charge_input(TenantId(0), 10.0);
        assert_eq!(v.pick(B1), Some(TenantId(1)));
        v.idle(TenantId(0), B0);
        v.idle(TenantId(0), B1);
        assert_eq!(v.backlogged_len(B0), 0);
        assert_eq!(v.backlogged_len(B1), 1);
    }

    #[test]
    fn weights_divide_charges_and_lifts_are_a_maximum_over_instances() {
        let mut v = Vtc::new(1.0, 2.0, 1);
        v.add_tenant(2.0, BandId(0));
        v.charge_input(TenantId(0), 10.0);
        v.charge_output(TenantId(0), 10.0);
        assert_eq!(v.counter(TenantId(0)), 15.0);
        assert_eq!(v.cost(TenantId(0), 10, 10), 15.0);
        v.set_peer(TenantId(0), 5.0, 3.0, false);
        assert_eq!(v.counter(TenantId(0)), 23.0);
        assert_eq!(v.own(TenantId(0)), (15.0, 0.0));
    }
}
