//! A sans-IO model of one vLLM v1 engine, for tests and benches without GPUs.
//!
//! It models what routing depends on: continuous batching with a per-step
//! token budget and chunked prefill, FCFS admission, recompute preemption,
//! a block-granular prefix cache with reference counts and LRU eviction of
//! free cached blocks, an optional CPU offload tier, vLLM-style chained and
//! seeded block hashes, the KV events all of that causes, and a step-time
//! model. Time is a parameter: a driver calls [`Engine::step`] with its own
//! `now` and advances its clock by the returned duration, so replays run in
//! virtual time far faster than real time. No tokio, no clock reads.
//!
//! ```
//! use std::time::Duration;
//! use kvgate_sim::{Engine, EngineConfig};
//!
//! let mut engine = Engine::new(EngineConfig { hash_seed: Some(0), ..EngineConfig::default() }).unwrap();
//! engine.add_request(1, (0..100).collect(), 4, 0, true, Duration::ZERO).unwrap();
//! let mut now = Duration::ZERO;
//! while engine.has_work() {
//!     let out = engine.step(now);
//!     now += out.duration;
//! }
//! assert_eq!(engine.stats().finished, 1);
//! ```

mod chunks;
pub mod config;
pub mod engine;
pub mod error;
pub mod hash;
mod lora;
mod lru;
mod lru_map;
mod pool;
pub mod request_stats;
#[cfg(feature = "server")]
pub mod server;
pub mod timeline;
pub mod timing;

pub use config::EngineConfig;
pub use engine::{Engine, EngineStats, FinishReason, RequestId, StepOutput, TokenOutput};
pub use error::SimError;
pub use hash::{BlockHasher, CacheIdentity};
pub use request_stats::{FinishedRequest, StepRecord, Tracker};
pub use timeline::Timeline;
pub use timing::{StepWork, TimingModel};
