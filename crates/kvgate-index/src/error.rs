//! The crate's error type, for the few operations that can fail.
//!
//! Only management calls (adding, removing and clearing replicas) return
//! errors. Event application never does: what goes wrong there is a counted
//! anomaly (see `stats.rs`), because a router must keep routing on a lossy
//! event stream and surface the damage through metrics instead.

use crate::replica_id::ReplicaId;

/// Why an index management call failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum IndexError {
    /// `(name, dp_rank)` identifies a replica; it is already registered.
    #[error(
        "replica {name:?} with data-parallel rank {dp_rank} is already registered as {existing}"
    )]
    DuplicateReplica {
        /// The replica name that was added twice.
        name: String,
        /// Its data-parallel rank.
        dp_rank: u32,
        /// The id it already has.
        existing: ReplicaId,
    },
    /// No live replica has this id (never added, or removed).
    #[error("unknown replica {0}")]
    UnknownReplica(ReplicaId),
    /// A replica's block size must be at least one token.
    #[error("block size of replica {name:?} must be at least 1 token")]
    ZeroBlockSize {
        /// The replica name.
        name: String,
    },
    /// Every `u32` replica id is in use.
    #[error("too many replicas: every u32 id is in use")]
    TooManyReplicas,
}
