//! vLLM KV-cache events: the wire format and, behind the `subscriber`
//! feature, an async ZMQ subscriber with replay.
//!
//! The wire half is sans-IO: [`decode_batch`] turns one msgpack payload into a
//! typed [`Batch`], whatever vLLM release produced it (array or map batches,
//! array or map events, omitted trailing fields, unknown fields, int or byte
//! hashes), and [`encode_batch`] writes any of those layouts back, for the
//! simulator and for round-trip tests. [`frames`] parses the multipart PUB and
//! replay frames, and [`seq`] holds the sequence-number bookkeeping that
//! decides between "in order", "gap" and "publisher restarted".
//!
//! Nothing here trusts its input: malformed bytes give a [`DecodeError`], never
//! a panic.

pub mod decode;
pub mod decode_fast;
pub mod encode;
mod endpoint;
pub mod error;
mod fields;
pub mod frames;
#[cfg(feature = "publisher")]
pub mod publisher;
pub mod seq;
#[cfg(feature = "subscriber")]
pub mod subscriber;
pub mod types;

pub use decode::{decode_batch, decode_batch_reference};
pub use decode_fast::decode_batch_fast;
pub use encode::{encode_batch, Layout};
pub use endpoint::offset_endpoint_port;
pub use error::DecodeError;
pub use types::*;
