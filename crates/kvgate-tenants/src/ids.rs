//! Dense ids: every table in the crate is a `Vec` indexed by these, so the
//! hot path hashes a name once (when the caller resolves it) and never again.

use serde::{Deserialize, Serialize};

/// A tenant, dense from 0 in the order the queue learned of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct TenantId(pub u32);

/// A priority band: its position in the strict order, 0 served first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct BandId(pub u8);

/// One admitted request, issued by the queue; never reused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct RequestId(pub u64);

impl TenantId {
    /// The tenant's position in per-tenant tables.
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl BandId {
    /// The band's position in the strict order.
    pub fn index(self) -> usize {
        usize::from(self.0)
    }
}
