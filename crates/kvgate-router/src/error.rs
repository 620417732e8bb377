//! Typed errors of the router's API.

use kvgate_index::ReplicaId;

/// What the router refuses.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RouterError {
    /// A configuration value is out of range.
    #[error("invalid router config: {0}")]
    InvalidConfig(String),
    /// The replica id is not registered.
    #[error("unknown replica {0:?}")]
    UnknownReplica(ReplicaId),
    /// The replica id is already registered.
    #[error("replica {0:?} is already registered")]
    DuplicateReplica(ReplicaId),
    /// A replica's static facts are unusable.
    #[error("invalid replica {name:?}: {reason}")]
    InvalidReplica {
        /// The replica's name.
        name: String,
        /// What is wrong.
        reason: String,
    },
}
