//! `kvgate-live`: the live replay driver behind `kvgate replay --mode live`.
//! A workload runs in real time over HTTP through real `kvgate serve`
//! processes in front of `kvgate sim` processes (spawned here, one fresh
//! fleet per run so that every policy starts from empty caches), or through
//! a kvgate that is already running. Its summary is fast mode's
//! (`kvgate_replay::Tally`), so both modes report the same fields the same
//! way.
//!
//! What it measures, and how:
//! - latencies at the client: time to the first streamed token, mean gap
//!   between tokens, arrival to the last token. The engines run `speedup`
//!   times faster than their timing model and arrivals are compressed by the
//!   same factor, so the load is the one fast mode simulates; latencies are
//!   multiplied back by the speedup to read in engine time, like fast mode's
//!   (which also multiplies kvgate's own sub-millisecond overhead);
//! - the hit rate from the engines' own counters (`vllm:prefix_cache_*` plus
//!   the connector's `vllm:external_prefix_cache_hits_total` for the CPU
//!   tier), before and after the run; against a running kvgate, whose
//!   engines are unknown here, from the `cached_tokens` each response reports;
//! - ingress CPU per request: the kvgate processes' CPU time over the run
//!   (all threads, `/proc/PID/task/*/schedstat`, read while idle), minus
//!   their idle rate measured just before, ÷ requests;
//! - decision time from kvgate's `kvgate_decide_seconds` histogram.
//!
//! Code map:
//! - `options.rs`: what a run is ([`LiveRun`]) and how it reaches its fleet
//!   ([`LiveOptions`]).
//! - `spawn.rs`: the spawned fleet (ports, `kvgate sim`, `kvgate serve`),
//!   killed on drop.
//! - `client.rs`: the open-loop client: every request at its arrival time,
//!   streamed, timed at the client.
//! - `scrape.rs`: Prometheus text: the engines' counters and kvgate's
//!   decision histogram.
//! - `proc_cpu.rs`: CPU seconds of a process's threads, from `/proc` (also
//!   used by the benches).
//! - `run.rs`: one run, start to summary.
//! - `error.rs`: the crate's error type.

mod client;
mod error;
mod options;
mod proc_cpu;
mod run;
mod scrape;
mod spawn;

pub use error::LiveError;
pub use options::{LiveOptions, LiveRun};
pub use proc_cpu::{cpu_seconds, schedstat_seconds};
pub use run::run_live;
pub use scrape::prometheus_samples;
