//! The health rules the fleet core applies (`[monitor]` in the
//! configuration, converted once by the shell's settings).

use std::time::Duration;

/// The timing and counting rules of replica health, from `[monitor]` and
/// `[limits]`, validated once.
#[derive(Clone, Copy, Debug)]
pub struct HealthRules {
    /// Consecutive failures that take a replica out of rotation.
    pub unhealthy_after: u32,
    /// Out of rotation this long: its index entries are purged.
    pub purge_after: Duration,
    /// How long a rebuilt view counts as degraded.
    pub rebuild: Duration,
    /// The index's bound per tier before an engine reports its size.
    pub index_bound: u64,
}

/// `[monitor]`'s and `[limits]`' defaults (the gateway's configuration
/// takes its defaults from here; fast-mode replay runs with them).
impl Default for HealthRules {
    fn default() -> HealthRules {
        HealthRules {
            unhealthy_after: 2,
            purge_after: Duration::from_secs(30),
            rebuild: Duration::from_secs(5),
            index_bound: 1 << 20,
        }
    }
}
