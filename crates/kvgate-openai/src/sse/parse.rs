//! The incremental SSE parser.
//!
//! Bytes arrive in chunks cut anywhere: inside a UTF-8 character, between a
//! `\r` and its `\n`, inside the BOM. The parser keeps only the current
//! partial line and the current event's fields, and decodes a line only
//! once it is complete, so a cut never matters. Comment lines are skipped
//! as they stream past without being buffered.
//!
//! Memory is bounded: the buffered line plus the event's fields may not
//! exceed `max_event_bytes`. An event that would is dropped whole, the
//! parser skips to the next blank line, and [`SseParser::feed`] reports
//! [`Error::SseEventTooLarge`] once the chunk is processed; events before
//! and after the dropped one are still delivered.

use std::borrow::Cow;

use super::lines::{Lines, Piece};
use super::{SseEvent, SseItem, DONE_DATA};
use crate::error::Error;

/// Default bound on one event: 4 MiB (a chunk with prompt logprobs can be
/// large; ordinary token chunks are a few hundred bytes).
pub const DEFAULT_MAX_EVENT_BYTES: usize = 4 << 20;

/// Reads SSE events from byte chunks. Sans-IO: feed it what the socket
/// gave, collect what it completes.
#[derive(Clone, Debug)]
pub struct SseParser {
    max_event_bytes: usize,
    /// Bytes of the current line not yet ended (never a comment's).
    line: Vec<u8>,
    /// The current line has at least one byte.
    line_has_bytes: bool,
    /// The current line is a comment; its bytes are dropped.
    line_is_comment: bool,
    /// Line ends and the leading BOM.
    lines: Lines,
    /// Skipping the rest of an oversized event, up to its blank line.
    discarding: bool,
    data: String,
    has_data: bool,
    event: Option<String>,
    id: Option<String>,
}

impl Default for SseParser {
    fn default() -> Self {
        SseParser::new(DEFAULT_MAX_EVENT_BYTES)
    }
}

/// Decodes a complete line or value; invalid UTF-8 becomes U+FFFD, as the
/// event-stream format prescribes.
fn decode(bytes: &[u8]) -> Cow<'_, str> {
    String::from_utf8_lossy(bytes)
}

impl SseParser {
    /// A parser that refuses events larger than `max_event_bytes`.
    pub fn new(max_event_bytes: usize) -> Self {
        SseParser {
            max_event_bytes,
            line: Vec::new(),
            line_has_bytes: false,
            line_is_comment: false,
            lines: Lines::default(),
            discarding: false,
            data: String::new(),
            has_data: false,
            event: None,
            id: None,
        }
    }

    /// The bound on one event, in bytes.
    pub fn max_event_bytes(&self) -> usize {
        self.max_event_bytes
    }

    /// Bytes held for the event in progress (partial line and fields).
    /// Never more than [`SseParser::max_event_bytes`] between calls.
    pub fn buffered_len(&self) -> usize {
        self.line.len() + self.fields_len()
    }

    fn fields_len(&self) -> usize {
        self.data.len()
            + self.event.as_ref().map_or(0, String::len)
            + self.id.as_ref().map_or(0, String::len)
    }

    /// Parses `chunk`, appending every event it completes to `out`.
    ///
    /// On [`Error::SseEventTooLarge`] the whole chunk has still been
    /// processed: the oversized event was dropped and the events around it
    /// are in `out`. The parser stays usable.
    pub fn feed(&mut self, chunk: &[u8], out: &mut Vec<SseItem>) -> Result<(), Error> {
        let mut overflowed = false;
        // `Lines` is two words: copied out so the closure can borrow `self`.
        let mut lines = self.lines;
        lines.split(chunk, |piece| match piece {
            Piece::Partial(bytes) => self.push_partial(bytes, &mut overflowed),
            Piece::End(tail) => self.end_line(tail, out, &mut overflowed),
        });
        self.lines = lines;
        if overflowed {
            Err(Error::SseEventTooLarge { limit: self.max_event_bytes })
        } else {
            Ok(())
        }
    }

    /// Ends the stream. Anything pending is discarded, as the format
    /// prescribes; if that was part of an event, the stream was cut short
    /// and [`Error::SseTruncated`] says so.
    pub fn finish(&mut self) -> Result<(), Error> {
        let truncated = (self.line_has_bytes && !self.line_is_comment)
            || self.has_data
            || self.event.is_some()
            || self.id.is_some()
            || self.lines.in_bom();
        let max = self.max_event_bytes;
        *self = SseParser::new(max);
        if truncated {
            Err(Error::SseTruncated)
        } else {
            Ok(())
        }
    }

    /// Drops the event in progress and skips to its blank line.
    fn overflow(&mut self, overflowed: &mut bool) {
        *overflowed = true;
        self.discarding = true;
        self.line = Vec::new();
        self.reset_fields();
    }

    fn reset_fields(&mut self) {
        self.data = String::new();
        self.has_data = false;
        self.event = None;
        self.id = None;
    }

    /// Adds bytes of a line whose end has not arrived yet.
    fn push_partial(&mut self, bytes: &[u8], overflowed: &mut bool) {
        let Some(&first) = bytes.first() else {
            return;
        };
        if !self.line_has_bytes {
            self.line_has_bytes = true;
            self.line_is_comment = first == b':';
        }
        if self.discarding || self.line_is_comment {
            return;
        }
        if self.line.len() + bytes.len() + self.fields_len() > self.max_event_bytes {
            self.overflow(overflowed);
            return;
        }
        self.line.extend_from_slice(bytes);
    }

    /// Ends the current line, whose last bytes are `tail`.
    fn end_line(&mut self, tail: &[u8], out: &mut Vec<SseItem>, overflowed: &mut bool) {
        let blank = !self.line_has_bytes && tail.is_empty();
        let comment =
            if self.line_has_bytes { self.line_is_comment } else { tail.first() == Some(&b':') };
        self.line_has_bytes = false;
        self.line_is_comment = false;
        if self.discarding {
            if blank {
                self.discarding = false;
            }
            return;
        }
        if blank {
            self.dispatch(out);
            return;
        }
        if comment {
            return;
        }
        if self.line.len() + tail.len() + self.fields_len() > self.max_event_bytes {
            self.overflow(overflowed);
            return;
        }
        if self.line.is_empty() {
            self.apply_field(tail);
        } else {
            let mut line = std::mem::take(&mut self.line);
            line.extend_from_slice(tail);
            self.apply_field(&line);
            line.clear();
            self.line = line;
        }
        // Lossy decoding can grow invalid bytes threefold; keep the bound.
        if self.fields_len() > self.max_event_bytes {
            self.overflow(overflowed);
        }
    }

    fn apply_field(&mut self, line: &[u8]) {
        let (name, value) = match line.iter().position(|&b| b == b':') {
            Some(colon) => {
                let value = &line[colon + 1..];
                (&line[..colon], value.strip_prefix(b" ").unwrap_or(value))
            }
            None => (line, &[][..]),
        };
        match name {
            b"data" => {
                if self.has_data {
                    self.data.push('\n');
                }
                self.data.push_str(&decode(value));
                self.has_data = true;
            }
            b"event" => self.event = Some(decode(value).into_owned()),
            b"id" if !value.contains(&0) => self.id = Some(decode(value).into_owned()),
            _ => {}
        }
    }

    fn dispatch(&mut self, out: &mut Vec<SseItem>) {
        if !self.has_data {
            self.reset_fields();
            return;
        }
        let data = std::mem::take(&mut self.data);
        let event = self.event.take();
        let id = self.id.take();
        self.has_data = false;
        if event.is_none() && data == DONE_DATA {
            out.push(SseItem::Done);
        } else {
            out.push(SseItem::Event(SseEvent { event, data, id }));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_all(chunks: &[&[u8]]) -> Vec<SseItem> {
        let mut parser = SseParser::default();
        let mut out = Vec::new();
        for chunk in chunks {
            parser.feed(chunk, &mut out).unwrap();
        }
        parser.finish().unwrap();
        out
    }

    fn data(text: &str) -> SseItem {
        SseItem::Event(SseEvent::data(text))
    }

    #[test]
    fn vllm_stream() {
        let stream = b"data: {\"a\":1}\n\ndata: {\"a\":2}\n\ndata: [DONE]\n\n";
        assert_eq!(parse_all(&[stream]), vec![data("{\"a\":1}"), data("{\"a\":2}"), SseItem::Done]);
    }

    #[test]
    fn every_line_ending() {
        for stream in [
            &b"data: a\ndata: b\n\n"[..],
            b"data: a\r\ndata: b\r\n\r\n",
            b"data: a\rdata: b\r\r",
            b"data: a\r\ndata: b\n\r",
        ] {
            assert_eq!(parse_all(&[stream]), vec![data("a\nb")], "{stream:?}");
        }
    }

    #[test]
    fn cr_then_lf_across_chunks_is_one_line_ending() {
        assert_eq!(parse_all(&[b"data: a\r", b"\ndata: b\r", b"\n\r", b"\n"]), vec![data("a\nb")]);
        // A lone CR at a chunk end followed by more text is a line end too.
        assert_eq!(parse_all(&[b"data: a\r", b"data: b\r\r"]), vec![data("a\nb")]);
    }

    #[test]
    fn utf8_split_inside_a_character() {
        let stream = "data: héllo ✓\n\n".as_bytes();
        for cut in 0..stream.len() {
            assert_eq!(parse_all(&[&stream[..cut], &stream[cut..]]), vec![data("héllo ✓")]);
        }
    }

    #[test]
    fn bom_at_start_only_and_split() {
        let stream = b"\xEF\xBB\xBFdata: x\n\n";
        for cut in 0..stream.len() {
            assert_eq!(parse_all(&[&stream[..cut], &stream[cut..]]), vec![data("x")]);
        }
        // A partial BOM is content: the line's field name becomes invalid.
        assert_eq!(parse_all(&[b"\xEF\xBBdata: x\n\ndata: y\n\n"]), vec![data("y")]);
        // A second BOM is not stripped.
        assert_eq!(
            parse_all(&[b"\xEF\xBB\xBF\xEF\xBB\xBFdata: x\n\ndata: y\n\n"]),
            vec![data("y")]
        );
    }

    #[test]
    fn fields_comments_and_names() {
        let stream = b": keep-alive\nevent: delta\nid: 3\ndata:no-space\ndata:  two\nretry: 10\nfoo: bar\n\n";
        assert_eq!(
            parse_all(&[stream]),
            vec![SseItem::Event(SseEvent {
                event: Some("delta".into()),
                data: "no-space\n two".into(),
                id: Some("3".into()),
            })]
        );
    }

    #[test]
    fn field_without_colon_and_empty_data() {
        assert_eq!(parse_all(&[b"data\n\n"]), vec![data("")]);
        assert_eq!(parse_all(&[b"data\ndata\n\n"]), vec![data("\n")]);
        assert_eq!(parse_all(&[b"data:\n\n"]), vec![data("")]);
    }

    #[test]
    fn events_without_data_are_not_dispatched() {
        assert_eq!(parse_all(&[b"event: x\nid: 1\n\n\n\ndata: y\n\n"]), vec![data("y")]);
    }

    #[test]
    fn id_with_nul_is_ignored() {
        assert_eq!(parse_all(&[b"id: a\0b\ndata: x\n\n"]), vec![data("x")]);
    }

    #[test]
    fn done_needs_no_event_name() {
        let named =
            SseItem::Event(SseEvent { event: Some("x".into()), data: "[DONE]".into(), id: None });
        assert_eq!(parse_all(&[b"event: x\ndata: [DONE]\n\n"]), vec![named]);
        assert_eq!(parse_all(&[b"data:[DONE]\n\n"]), vec![SseItem::Done]);
        assert_eq!(parse_all(&[b"data: [DONE] \n\n"]), vec![data("[DONE] ")]);
    }

    #[test]
    fn invalid_utf8_is_replaced() {
        assert_eq!(parse_all(&[b"data: a\xFFb\n\n"]), vec![data("a\u{FFFD}b")]);
    }

    #[test]
    fn oversized_event_is_dropped_and_parsing_resumes() {
        let mut parser = SseParser::new(16);
        let mut out = Vec::new();
        let big = format!("data: {}\n\ndata: ok\n\n", "x".repeat(40));
        let err = parser.feed(big.as_bytes(), &mut out).unwrap_err();
        assert!(matches!(err, Error::SseEventTooLarge { limit: 16 }));
        assert_eq!(out, vec![data("ok")]);
        // The same across many small chunks, and via many data lines.
        let mut parser = SseParser::new(16);
        let mut out = Vec::new();
        let mut errors = 0;
        let stream = format!("data: 1\n\n{}\ndata: 2\n\n", "data: abcd\n".repeat(10));
        for byte in stream.as_bytes() {
            if parser.feed(std::slice::from_ref(byte), &mut out).is_err() {
                errors += 1;
            }
            assert!(parser.buffered_len() <= 16);
        }
        assert_eq!(errors, 1);
        assert_eq!(out, vec![data("1"), data("2")]);
    }

    #[test]
    fn long_comments_are_not_buffered() {
        let mut parser = SseParser::new(8);
        let mut out = Vec::new();
        let stream = format!(":{}\ndata: ok\n\n", "c".repeat(100));
        parser.feed(stream.as_bytes(), &mut out).unwrap();
        assert_eq!(out, vec![data("ok")]);
    }

    #[test]
    fn finish_reports_truncation() {
        let mut parser = SseParser::default();
        let mut out = Vec::new();
        parser.feed(b"data: partial\n", &mut out).unwrap();
        assert!(matches!(parser.finish(), Err(Error::SseTruncated)));
        parser.feed(b"data: x", &mut out).unwrap();
        assert!(matches!(parser.finish(), Err(Error::SseTruncated)));
        parser.feed(b"data: x\n\n: trailing comment", &mut out).unwrap();
        assert!(parser.finish().is_ok());
        assert_eq!(out, vec![data("x")]);
    }
}
