//! What kvgate knows about one replica beyond the router: probe results,
//! failures, the degraded window of a rebuilt view, drain, problems, the
//! engine's last scrape. Plain data with its transitions; the fleet core
//! (`fleet.rs`) owns one per replica and applies the rules of
//! [`HealthRules`] (`rules.rs`) with the `now` it is given.

use std::time::Instant;

use kvgate_router::Health;

use crate::{EngineScrape, HealthRules};

/// How a request or probe failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Failure {
    /// Nothing listens (connection refused, unreachable): out of rotation
    /// at once.
    Unreachable,
    /// Anything else: counts toward `unhealthy_after`.
    Error,
}

/// One replica's status.
#[derive(Debug, Default)]
pub struct ReplicaStatus {
    /// The last probe succeeded.
    pub probe_ok: bool,
    /// Some probe ever succeeded (for `/ready`).
    pub ever_seen: bool,
    /// Consecutive failures (probes or requests).
    pub failures: u32,
    /// When it left rotation.
    pub down_since: Option<Instant>,
    /// Its index entries were purged while down.
    pub purged: bool,
    /// No new requests (admin drain).
    pub draining: bool,
    /// Why its view is being rebuilt, and until when it counts as degraded.
    pub degraded: Option<(String, Instant)>,
    /// Last error, for the admin API.
    pub last_error: Option<String>,
    /// Configuration problems found at runtime (loud, persistent).
    pub problems: Vec<String>,
    /// The last scrape.
    pub engine: Option<EngineScrape>,
    /// Whether any event arrived.
    pub events_seen: bool,
    /// The event subscriber's first sync is done (initial replay applied,
    /// or no replay endpoint): `/ready` waits for it.
    pub view_synced: bool,
    /// That sync reached back to the engine's first batch.
    pub view_complete: bool,
    /// LoRA adapters the engine lists in `/v1/models` (cards with a
    /// `parent`).
    pub adapters: Vec<String>,
}

impl ReplicaStatus {
    /// Adds a problem once and logs it loudly the first time.
    pub fn problem(&mut self, name: &str, p: String) {
        if !self.problems.contains(&p) {
            tracing::error!(replica = name, problem = %p, "replica misconfigured");
            self.problems.push(p);
        }
    }

    /// The router health this status implies at `now`.
    pub fn health(&self, now: Instant) -> Health {
        if !self.probe_ok || self.draining {
            Health::Down
        } else if self.degraded.as_ref().is_some_and(|(_, until)| now < *until) {
            Health::Degraded
        } else {
            Health::Healthy
        }
    }

    /// Why it is not healthy at `now`, if it is not.
    pub fn reason(&self, now: Instant) -> Option<String> {
        if !self.probe_ok {
            Some(self.last_error.clone().unwrap_or_else(|| "not seen yet".into()))
        } else {
            self.degraded.as_ref().filter(|(_, until)| now < *until).map(|(why, _)| why.clone())
        }
    }

    /// Records a failure; returns whether it took the replica out of
    /// rotation.
    pub fn fail(
        &mut self,
        error: String,
        failure: Failure,
        rules: &HealthRules,
        now: Instant,
    ) -> bool {
        self.last_error = Some(error);
        match failure {
            Failure::Unreachable => {
                self.failures = self.failures.max(rules.unhealthy_after);
            }
            Failure::Error => self.failures = self.failures.saturating_add(1),
        }
        let out = self.probe_ok
            && (failure == Failure::Unreachable || self.failures >= rules.unhealthy_after);
        if out {
            self.probe_ok = false;
            self.down_since = Some(now);
        }
        out
    }

    /// When its index entries are due to be purged, if they are not yet.
    pub fn purge_due(&self, rules: &HealthRules) -> Option<Instant> {
        match (self.purged, self.probe_ok, self.down_since) {
            (false, false, Some(since)) => Some(since + rules.purge_after),
            _ => None,
        }
    }

    /// When its degraded window ends, if one is open.
    pub fn degraded_until(&self) -> Option<Instant> {
        self.degraded.as_ref().map(|(_, until)| *until)
    }
}
