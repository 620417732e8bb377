//! Server-sent events, the framing of every streamed answer.
//!
//! An engine streams `data: {json}\n\n` chunks and ends with
//! `data: [DONE]\n\n`. The gateway reads those streams (to time the first
//! token and account usage) and writes its own (errors, keep-alive
//! comments, the simulator's output). [`encode`] writes frames;
//! [`SseParser`] reads them incrementally from byte chunks split anywhere,
//! with a bound on how much one event may buffer; [`SseFraming`] follows
//! only the framing (where events end, whether `[DONE]` came), for relays
//! that pass the bytes on without reading them.
//!
//! The parser follows the WHATWG event-stream rules (any of `\n`, `\r\n`,
//! `\r` ends a line; a leading BOM is dropped; `:` starts a comment; a line
//! without a colon is a field with an empty value; one space after the colon
//! is dropped; `data` lines are joined with `\n`; an event without `data` is
//! not dispatched) with two differences that suit a proxy: `id` belongs to
//! the event that carries it rather than persisting, and `retry` is ignored.

pub mod encode;
mod framing;
mod lines;
mod parse;

pub use encode::{
    write_comment, write_data, write_done, write_error, write_event, write_item, write_json,
    DONE_FRAME,
};
pub use framing::SseFraming;
pub use parse::{SseParser, DEFAULT_MAX_EVENT_BYTES};

/// One dispatched event.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SseEvent {
    /// The `event:` name, if the event had one.
    pub event: Option<String>,
    /// The `data:` lines, joined with `\n`.
    pub data: String,
    /// The `id:`, if the event had one.
    pub id: Option<String>,
}

impl SseEvent {
    /// A plain `data:` event.
    pub fn data(data: impl Into<String>) -> Self {
        SseEvent { event: None, data: data.into(), id: None }
    }
}

/// What a stream yields: an event, or the `[DONE]` sentinel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SseItem {
    /// Any event other than the sentinel.
    Event(SseEvent),
    /// `data: [DONE]` (without an `event:` name): the stream is complete.
    Done,
}

/// The data of the end-of-stream sentinel.
pub const DONE_DATA: &str = "[DONE]";
