//! `kvgate-router`: where each request goes, and the honest account of the
//! load that put there. Sans-IO: no sockets, no clock, no tokio; time is an
//! argument, so the replay bench drives it in virtual time.
//!
//! Code map:
//! - `config.rs`: [`RouterConfig`], the single source of the router's
//!   settings and defaults.
//! - `replica.rs`: [`ReplicaInfo`], [`Health`], [`EngineReport`], [`EngineTiming`].
//! - `ledger.rs`: the in-flight ledger and its [`Booking`] values,
//!   reconciliation with engine reports, peer bookings.
//! - `calibrate.rs`: robust online calibration of prefill and transfer speed.
//! - `cost.rs`: the predicted-TTFT model ([`predict`]).
//! - `adapters.rs`: LoRA adapters believed resident in each replica's GPU slots.
//! - `tentative.rs`: routed-but-unconfirmed blocks.
//! - `select.rs`: anti-herding choice among near-equal candidates.
//! - `decide.rs`: the decision path every policy shares ([`Router::decide`]).
//! - `disagg.rs`: prefill/decode disaggregation: split or bypass, and
//!   where each hop goes ([`Disagg::plan`]).
//! - `policies.rs`: `kv_aware` and the baselines.
//! - `approx_tree.rs`: the prefix tree behind the `approx_prefix` baseline.
//! - `explain.rs`: per-decision explanations and the decision log.
//! - `router.rs`: [`Router`] state, replica management, peers.
//!
//! Architecture invariants:
//! - Every routed request is booked in the ledger through one path
//!   (`decide.rs`), whatever the policy.
//! - A booking leaves the ledger exactly once, and every way out is counted.
//! - Nothing here depends on tokio, reads a clock or takes a lock: the
//!   shell that owns the router serialises access to it.

mod adapters;
mod approx_tree;
mod attract;
mod calibrate;
mod config;
mod cost;
mod decide;
mod disagg;
mod error;
mod explain;
mod ledger;
mod policies;
mod replica;
mod router;
mod select;
mod tentative;

pub use calibrate::CalibrationSource;
pub use config::{
    AdmissionMode, ApproxPrefixConfig, CalibrationConfig, CostModelConfig, PolicyKind,
    RouterConfig, Selection,
};
pub use cost::{predict, work_charge, CostInputs, Prediction};
pub use decide::{Decision, Peek, RejectReason, RouteRequest, Routed};
pub use disagg::{Disagg, DisaggConfig, DisaggMode, PdCounts, PdPlan, PdRefusal};
pub use error::RouterError;
pub use explain::{Candidate, Explanation, Reason};
pub use ledger::{
    Booking, LedgerChange, LedgerTotals, LoadListener, LoadView, Origin, Outcome, PeerId,
    ReplicaLoad,
};
pub use replica::{EngineReport, EngineTiming, Health, ReplicaInfo};
pub use router::{Router, RouterMetrics};
pub use tentative::TentativeStats;
