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
