//! What a replica does in a disaggregated pool (each replica's `role` in
//! the configuration).

use serde::{Deserialize, Serialize};

/// What a replica does in a disaggregated pool.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Whole requests and decode hops (the decode side; every replica of a
    /// pool without prefill replicas).
    #[default]
    Both,
    /// Prefill hops only: the pool's prefill side.
    Prefill,
    /// Decode hops and bypassed whole requests (the same as `both` in
    /// routing; named for operators' clarity).
    Decode,
}

impl Role {
    /// The snake_case name.
    pub fn name(self) -> &'static str {
        match self {
            Role::Both => "both",
            Role::Prefill => "prefill",
            Role::Decode => "decode",
        }
    }
}
