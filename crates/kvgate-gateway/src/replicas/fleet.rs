//! The fleet core lives in `kvgate-fleet` (sans-IO: the index, the routers,
//! every replica's status and the health rules, driven with `now`); the
//! gateway's shell (`fleet_handle.rs`) owns the one lock around it.

pub(crate) use kvgate_fleet::{Fleet, PoolId, Reachable};
