//! What kvgate shows of itself: Prometheus metrics, the fleet snapshot, recent TTFTs
//! and decisions.

pub(crate) mod decision_json;
pub(crate) mod metrics;
pub(crate) mod snapshot;
pub(crate) mod ttft_ring;
