//! `kvgate-replay`: replay a workload through a simulated fleet under every
//! routing policy, and report what each policy achieved against the
//! physical bounds. This crate is the library behind `kvgate replay`.
//!
//! Fast mode is sans-IO and single-threaded per run: virtual time,
//! `kvgate-sim`'s engine model per replica, in front of the fleet core
//! `kvgate serve` drives (`kvgate-fleet`: the index fed by the engines' own
//! KV events, one router per pool, the health rules, a P/D pool's planner),
//! which routes every request. No HTTP, no tokio, no clock reads except the
//! measured wall time of each decision.
//!
//! Code map:
//! - `workload.rs`: a workload's requests; Mooncake JSONL and OpenAI
//!   `messages` files with line-numbered errors; format detection.
//! - `synthetic.rs`: seeded generators (`chat`, `agentic`, `noreuse`;
//!   `lora` in `synthetic/lora.rs`).
//! - `capacity.rs`: the acceptance fleet and its KV capacity derivation.
//! - `oracle.rs`: the pooled-LRU oracle, the unlimited-cache ceiling and
//!   the TTFT floor.
//! - `pools.rs`: model pools: each pool's own oracle, and per run the
//!   adapter loads, model violations and hit rate ÷ pool oracle.
//! - `fleet.rs`: the virtual-time discrete-event fleet (engines, the fleet
//!   core, deliveries, scrapes); `fleet/disagg.rs` its P/D part;
//!   `fleet/journal.rs` what it hands the core, kept for the gateway's test
//!   of the same decisions.
//! - `metrics.rs`: per-run summaries (TTFT, ITL, E2E, hit rate, imbalance),
//!   added up by one `Tally` for fast mode and for `kvgate-live`.
//! - `run.rs`: comparisons, rate sweeps and the automatic load levels.
//! - `report.rs`: the JSON schema and the terminal table.
//! - `plots.rs`: SVG charts.
//! - `scoreboard.rs`: `--suite`'s per-level ratios of each policy to the best.

mod capacity;
mod error;
mod fleet;
mod metrics;
mod oracle;
mod plots;
mod pools;
mod report;
mod run;
mod scoreboard;
mod synthetic;
mod workload;

pub use capacity::{DisaggSpec, FleetSpec, KvMemoryModel};
pub use error::{LineError, ReplayError};
pub use fleet::{CoreInput, Fleet, LoadSample, Record};
pub use metrics::{
    max_over_mean, DisaggSummary, Distribution, PlanTtft, RunFacts, RunSummary, Tally,
};
pub use oracle::{oracle_hit_rates, oracle_hit_rates_of, FloorModel, OracleHitRates, PooledLru};
pub use plots::{line_chart, write_plots, Line};
pub use pools::{combined_oracle, pool_bounds, wants_pools, PoolBound, PoolRun, PoolRunStat};
pub use report::{render_table, Report, WorkloadInfo};
pub use run::{
    find_load_levels, run_disagg_matrix, run_matrix, run_matrix_pools, run_policy,
    run_policy_fleet, DisaggSetup, Level, LevelSearch, Progress, RunOptions,
};
pub use scoreboard::{render_scoreboard, scoreboard, LevelScore, PolicyScore};
pub use synthetic::{adapter_name, model_name, SyntheticKind, SyntheticSpec};
pub use workload::{
    detect_format, mooncake_tokens, parse_messages, parse_mooncake, Prompt, TraceFormat,
    TraceRequest, Workload, DEFAULT_MODEL, MOONCAKE_BLOCK_TOKENS,
};
