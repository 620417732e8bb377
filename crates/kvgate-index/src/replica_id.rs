//! [`ReplicaId`], the dense id every other module names replicas by. Its
//! own module so that the statistics types can name a replica without
//! importing the replica's map (which itself counts into those statistics).

use std::fmt;

/// Dense id of a replica inside one [`Index`](crate::Index). Ids of removed
/// replicas are reused by later additions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ReplicaId(pub u32);

impl ReplicaId {
    /// The id as an index into [`Index::find_matches`](crate::Index::find_matches)'
    /// output.
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl fmt::Display for ReplicaId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "replica#{}", self.0)
    }
}
