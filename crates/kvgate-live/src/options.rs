//! What a live run is, and how it reaches (or builds) its fleet.

use std::path::PathBuf;

use kvgate_replay::{FleetSpec, OracleHitRates, Workload};

/// How live mode reaches (or builds) its fleet.
#[derive(Debug, Clone)]
pub struct LiveOptions {
    /// The kvgate executable spawned as `kvgate sim` and `kvgate serve`.
    pub kvgate_bin: PathBuf,
    /// A running kvgate (`http://HOST:PORT`); `None` spawns kvgate + sims.
    pub target: Option<String>,
    /// The kvgate process to charge ingress CPU to, with `target`.
    pub target_pid: Option<u32>,
    /// Client key for kvgate, if it requires one.
    pub api_key: Option<String>,
    /// Engines run this many times faster than real time.
    pub speedup: f64,
    /// Timing preset of the spawned engines.
    pub timing: String,
    /// Most requests in flight at once (the client's own bound).
    pub max_in_flight: usize,
    /// Served model name sent in requests.
    pub model: String,
    /// kvgate instances spawned in front of the engines; the client
    /// spreads requests over them round-robin.
    pub ingresses: usize,
    /// With several instances: whether they share their bookings (peers).
    pub peer_sharing: bool,
    /// `--set` overrides for the spawned kvgate instances.
    pub set: Vec<String>,
}

/// One live run: `workload` under `policy` at `rate_scale`.
#[derive(Debug, Clone, Copy)]
pub struct LiveRun<'a> {
    /// The requests and their arrival times.
    pub workload: &'a Workload,
    /// The fleet the spawned sims model.
    pub spec: &'a FleetSpec,
    /// The routing policy of the spawned kvgate instances.
    pub policy: &'a str,
    /// Their router seed (instance `i` gets `seed + i`).
    pub seed: u64,
    /// Multiple of the workload's own request rate.
    pub rate_scale: f64,
    /// The workload's bounds, for the summary.
    pub bounds: OracleHitRates,
}
