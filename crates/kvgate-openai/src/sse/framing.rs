//! Following an SSE stream's framing without decoding its events.
//!
//! A relay has to know two things about every chunk it passes on: whether
//! the `[DONE]` sentinel has arrived (a stream that ends without it was cut
//! short), and whether an event is half-sent (so that an error appended at
//! a cut starts on a fresh event). [`SseParser`](super::SseParser) answers
//! both, but it copies every event's data into a `String` and the caller
//! then deserialises it; done for each of hundreds of tokens per stream,
//! that is most of what relaying costs. [`SseFraming`] only scans for line
//! ends and looks at the first bytes of each line, and allocates nothing.
//!
//! It cuts lines with the parser's own splitter (`lines.rs`: `\n`, `\r\n` or `\r` end a
//! line, a leading BOM is dropped, `:` starts a comment, one space after a
//! field's colon is dropped, a blank line dispatches), and reports `[DONE]`
//! where the parser would yield [`SseItem::Done`](super::SseItem::Done): an
//! event whose only `data` line is `[DONE]` and which has no `event` name.
//! One difference: the parser drops an event bigger than its size bound,
//! while this scanner keeps no bound, as it keeps no bytes.
//!
//! Anthropic's Messages streams and OpenAI's Responses streams have no
//! `[DONE]`: they end with a named event (`message_stop`,
//! `response.completed`, ... or `error`), which [`SseFraming::named_end`]
//! reports.

use super::lines::{Lines, Piece};
use super::DONE_DATA;

/// The longest line prefix that decides anything: `data: [DONE]` is 12
/// bytes and `event: response.incomplete` 26; one more tells a line that
/// only starts with it.
const PREFIX: usize = 27;

/// The event names that end a stream of named events: an Anthropic
/// Messages stream (`message_stop`), an OpenAI Responses stream
/// (`response.completed`, `.incomplete`, `.failed`), or either with an
/// `error`. Neither API sends the other's names, so one set serves both.
const END_NAMES: [&[u8]; 5] =
    [b"message_stop", b"error", b"response.completed", b"response.incomplete", b"response.failed"];

/// What the `data` lines of the event in progress add up to.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Data {
    /// No `data` line yet.
    #[default]
    None,
    /// Exactly one, and it is `[DONE]`.
    Done,
    /// Anything else.
    Other,
}

/// Scans SSE framing incrementally. Sans-IO: feed it every chunk as it
/// passes.
#[derive(Clone, Debug)]
pub struct SseFraming {
    /// The first bytes of the current line.
    prefix: [u8; PREFIX],
    /// Bytes of the current line so far (may exceed `PREFIX`).
    line_len: usize,
    /// Line ends and the leading BOM.
    lines: Lines,
    /// The event in progress has a field line (not a comment).
    has_fields: bool,
    /// It has an `event` name.
    has_name: bool,
    /// That name is one of [`END_NAMES`].
    end_name: bool,
    data: Data,
    done: bool,
    named_end: bool,
    events: u64,
}

impl Default for SseFraming {
    fn default() -> Self {
        SseFraming::new()
    }
}

impl SseFraming {
    /// A scanner at the start of a stream.
    pub fn new() -> Self {
        SseFraming {
            prefix: [0; PREFIX],
            line_len: 0,
            lines: Lines::default(),
            has_fields: false,
            has_name: false,
            end_name: false,
            data: Data::None,
            done: false,
            named_end: false,
            events: 0,
        }
    }

    /// Whether the `[DONE]` event has been dispatched.
    pub fn is_done(&self) -> bool {
        self.done
    }

    /// Whether an event named as a stream's end has been dispatched
    /// (`message_stop`, `response.completed`, `response.incomplete`,
    /// `response.failed` or `error`): the end of an Anthropic Messages or
    /// OpenAI Responses stream.
    pub fn named_end(&self) -> bool {
        self.named_end
    }

    /// Events dispatched so far, `[DONE]` included.
    pub fn events(&self) -> u64 {
        self.events
    }

    /// Whether the stream stopped inside an event or a line: a writer that
    /// appends its own event must first end that one with a blank line.
    pub fn mid_event(&self) -> bool {
        self.line_len > 0 || self.has_fields || self.lines.in_bom()
    }

    /// Takes in the next chunk.
    pub fn feed(&mut self, chunk: &[u8]) {
        let mut lines = self.lines;
        lines.split(chunk, |piece| match piece {
            Piece::Partial(bytes) => self.push(bytes),
            Piece::End(tail) => {
                self.push(tail);
                self.end_line();
            }
        });
        self.lines = lines;
    }

    /// Adds bytes of the current line.
    fn push(&mut self, bytes: &[u8]) {
        let room = PREFIX.saturating_sub(self.line_len).min(bytes.len());
        self.prefix[self.line_len.min(PREFIX)..][..room].copy_from_slice(&bytes[..room]);
        self.line_len += bytes.len();
    }

    fn end_line(&mut self) {
        let len = std::mem::take(&mut self.line_len);
        let line = &self.prefix[..len.min(PREFIX)];
        if len == 0 {
            // Blank: dispatch. An event without data is not dispatched.
            if self.data != Data::None {
                self.events += 1;
                if self.data == Data::Done && !self.has_name {
                    self.done = true;
                }
                if self.end_name {
                    self.named_end = true;
                }
            }
            self.has_fields = false;
            self.has_name = false;
            self.end_name = false;
            self.data = Data::None;
            return;
        }
        if line[0] == b':' {
            return;
        }
        self.has_fields = true;
        // The field name runs to the first colon, or is the whole line.
        let name_end = line.iter().position(|&b| b == b':').unwrap_or(len);
        let name = &line[..name_end.min(line.len())];
        if name_end == 4 && name == b"data" {
            let value = &line[(name_end + 1).min(line.len())..];
            let value_len = len.saturating_sub(name_end + 1);
            let (value, value_len) = match value.first() {
                Some(b' ') => (&value[1..], value_len - 1),
                _ => (value, value_len),
            };
            let is_done = value_len == DONE_DATA.len() && value == DONE_DATA.as_bytes();
            self.data = match self.data {
                Data::None if is_done => Data::Done,
                _ => Data::Other,
            };
        } else if name_end == 5 && name == b"event" {
            self.has_name = true;
            let value = &line[(name_end + 1).min(line.len())..];
            let value_len = len.saturating_sub(name_end + 1);
            let (value, value_len) = match value.first() {
                Some(b' ') => (&value[1..], value_len - 1),
                _ => (value, value_len),
            };
            // A later `event` line replaces the name, as in the parser.
            self.end_name = END_NAMES.iter().any(|n| value_len == n.len() && value == *n);
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::sse::{SseItem, SseParser};

    fn scan(chunks: &[&[u8]]) -> SseFraming {
        let mut f = SseFraming::new();
        for c in chunks {
            f.feed(c);
        }
        f
    }

    #[test]
    fn a_vllm_stream_ends_with_done() {
        let s = b"data: {\"choices\":[]}\n\ndata: [DONE]\n\n";
        let f = scan(&[s]);
        assert!(f.is_done());
        assert_eq!(f.events(), 2);
        assert!(!f.mid_event());
    }

    #[test]
    fn done_needs_its_own_event_and_no_name() {
        assert!(!scan(&[b"data: [DONE]\n"]).is_done(), "not dispatched yet");
        assert!(scan(&[b"data: [DONE]\n"]).mid_event());
        assert!(!scan(&[b"event: x\ndata: [DONE]\n\n"]).is_done());
        assert!(!scan(&[b"data: a\ndata: [DONE]\n\n"]).is_done());
        assert!(!scan(&[b"data: [DONE]x\n\n"]).is_done());
        assert!(!scan(&[b"data:  [DONE]\n\n"]).is_done(), "only one space is dropped");
        assert!(scan(&[b"data:[DONE]\r\n\r\n"]).is_done());
        assert!(scan(&[b": keep-alive\n\ndata: [DONE]\r\r"]).is_done());
        assert!(scan(&[b"\xEF\xBB", b"\xBFdata: [DONE]\n\n"]).is_done());
    }

    #[test]
    fn an_anthropic_stream_ends_with_message_stop_or_error() {
        let s = b"event: message_start\ndata: {}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";
        let f = scan(&[s]);
        assert!(f.named_end());
        assert!(!f.is_done());
        assert!(scan(&[b"event:error\r\ndata: {}\r\n\r\n"]).named_end());
        assert!(!scan(&[b"event: message_stop\ndata: {}\n"]).named_end(), "not dispatched");
        assert!(!scan(&[b"event: message_stopped\ndata: {}\n\n"]).named_end());
        assert!(!scan(&[b"event: message_stop\n\n"]).named_end(), "no data: not dispatched");
        assert!(!scan(&[b"event: message_delta\ndata: {}\n\n"]).named_end());
        assert!(!scan(&[b"event: message_stop\nevent: x\ndata: {}\n\n"]).named_end());
        for end in ["response.completed", "response.incomplete", "response.failed"] {
            let s = format!("event: response.created\ndata: {{}}\n\nevent: {end}\ndata: {{}}\n\n");
            assert!(scan(&[s.as_bytes()]).named_end(), "{end}");
        }
        assert!(!scan(&[b"event: response.completed.x\ndata: {}\n\n"]).named_end());
        assert!(!scan(&[b"event: response.output_text.delta\ndata: {}\n\n"]).named_end());
    }

    #[test]
    fn a_cut_inside_a_line_or_an_event_is_mid_event() {
        assert!(scan(&[b"data: {\"a\""]).mid_event());
        assert!(scan(&[b"data: {}\n"]).mid_event());
        assert!(!scan(&[b"data: {}\n\n"]).mid_event());
        assert!(!scan(&[b""]).mid_event());
    }

    /// Streams made of the pieces that matter, cut anywhere.
    fn stream() -> impl Strategy<Value = (Vec<u8>, Vec<usize>)> {
        let piece = prop_oneof![
            Just(&b"data: [DONE]"[..]),
            Just(&b"data:[DONE]"[..]),
            Just(&b"data:  [DONE]"[..]),
            Just(&b"data: [DONE]!"[..]),
            Just(&b"data: {\"x\":1}"[..]),
            Just(&b"data"[..]),
            Just(&b"event: error"[..]),
            Just(&b"event"[..]),
            Just(&b"id: 7"[..]),
            Just(&b": comment"[..]),
            Just(&b"retry: 10"[..]),
            Just(&b"\n"[..]),
            Just(&b"\r"[..]),
            Just(&b"\r\n"[..]),
            Just(&b"\n\n"[..]),
            Just(&b"\xEF\xBB\xBF"[..]),
            Just(&b"\xEF\xBB"[..]),
            Just(&b"\xFF"[..]),
        ];
        (proptest::collection::vec(piece, 0..24), proptest::collection::vec(0usize..64, 0..8))
            .prop_map(|(pieces, cuts)| (pieces.concat(), cuts))
    }

    proptest! {
        /// The scanner sees `[DONE]` exactly when the parser yields it, and
        /// is mid-event whenever the parser holds bytes of an event.
        #[test]
        fn agrees_with_the_parser((bytes, cuts) in stream()) {
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c.min(bytes.len())).collect();
            cuts.sort_unstable();
            let mut parser = SseParser::default();
            let mut framing = SseFraming::new();
            let mut items = Vec::new();
            let mut at = 0;
            for cut in cuts.into_iter().chain([bytes.len()]) {
                let chunk = &bytes[at..cut];
                at = cut;
                parser.feed(chunk, &mut items).unwrap();
                framing.feed(chunk);
                let done = items.contains(&SseItem::Done);
                prop_assert_eq!(framing.is_done(), done);
                prop_assert_eq!(framing.events(), items.len() as u64);
                if parser.buffered_len() > 0 {
                    prop_assert!(framing.mid_event());
                }
            }
        }
    }
}
