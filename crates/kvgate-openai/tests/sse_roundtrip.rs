//! SSE properties: any sequence of events, `[DONE]`s and comments, encoded
//! with any line-ending style (and maybe a BOM), then cut into chunks at
//! arbitrary points, parses back to the same events; arbitrary bytes never
//! panic and never grow the buffer past its bound; oversized events are
//! dropped exactly, and every other event still arrives.
//!
//! `KVGATE_FUZZ_CASES=N` raises the case count of the byte fuzz.

#![allow(clippy::unwrap_used)]

use kvgate_openai::sse::{self, SseEvent, SseItem, SseParser};
use kvgate_openai::Error;
use proptest::collection::vec;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

#[derive(Clone, Debug)]
enum Frame {
    Item(SseItem),
    Comment(String),
}

/// Text without line breaks (names and ids), NUL excluded for ids.
fn field_text(allow_nul: bool) -> impl Strategy<Value = String> {
    vec(any::<char>(), 0..8).prop_map(move |chars| {
        chars
            .into_iter()
            .filter(|c| !matches!(c, '\r' | '\n') && (allow_nul || *c != '\0'))
            .collect()
    })
}

/// Data with line breaks of every style and multibyte characters.
fn data_text() -> impl Strategy<Value = String> {
    vec(
        prop_oneof![
            "[a-z {}\":,\\[\\]]{0,6}",
            Just("\n".to_owned()),
            Just("\r\n".to_owned()),
            Just("\r".to_owned()),
            Just("[DONE]".to_owned()),
            "\\PC{0,4}",
            Just("é✓🦀".to_owned()),
        ],
        0..6,
    )
    .prop_map(|parts| parts.concat())
}

fn frame() -> impl Strategy<Value = Frame> {
    prop_oneof![
        6 => (proptest::option::of(field_text(true)), data_text(), proptest::option::of(field_text(false)))
            .prop_map(|(event, data, id)| Frame::Item(SseItem::Event(SseEvent { event, data, id }))),
        1 => Just(Frame::Item(SseItem::Done)),
        1 => data_text().prop_map(Frame::Comment),
    ]
}

#[derive(Clone, Copy, Debug)]
enum LineEnding {
    Lf,
    CrLf,
    Cr,
}

fn encode(frames: &[Frame], ending: LineEnding, bom: bool) -> Vec<u8> {
    let mut out = Vec::new();
    for frame in frames {
        match frame {
            Frame::Item(item) => sse::write_item(&mut out, item).unwrap(),
            Frame::Comment(text) => sse::write_comment(&mut out, text),
        }
    }
    // The encoder writes `\n` only as a line terminator, so the style can be
    // changed by rewriting every `\n`.
    let mut styled = Vec::with_capacity(out.len() * 2 + 3);
    if bom {
        styled.extend_from_slice(b"\xEF\xBB\xBF");
    }
    for byte in out {
        match (byte, ending) {
            (b'\n', LineEnding::CrLf) => styled.extend_from_slice(b"\r\n"),
            (b'\n', LineEnding::Cr) => styled.push(b'\r'),
            (byte, _) => styled.push(byte),
        }
    }
    styled
}

/// What the parser must yield: comments vanish, data line breaks become
/// `\n`, and a nameless `[DONE]` event is the sentinel.
fn expected(frames: &[Frame]) -> Vec<SseItem> {
    frames
        .iter()
        .filter_map(|frame| match frame {
            Frame::Comment(_) => None,
            Frame::Item(SseItem::Done) => Some(SseItem::Done),
            Frame::Item(SseItem::Event(event)) => {
                let data = event.data.replace("\r\n", "\n").replace('\r', "\n");
                if event.event.is_none() && data == "[DONE]" {
                    Some(SseItem::Done)
                } else {
                    Some(SseItem::Event(SseEvent { data, ..event.clone() }))
                }
            }
        })
        .collect()
}

fn chunks(bytes: &[u8], cuts: &[usize]) -> Vec<Vec<u8>> {
    let mut cuts: Vec<usize> = cuts.iter().map(|c| c % (bytes.len() + 1)).collect();
    cuts.sort_unstable();
    let mut out = Vec::new();
    let mut start = 0;
    for cut in cuts {
        out.push(bytes[start..cut].to_vec());
        start = cut;
    }
    out.push(bytes[start..].to_vec());
    out
}

fn line_ending() -> impl Strategy<Value = LineEnding> {
    prop_oneof![Just(LineEnding::Lf), Just(LineEnding::CrLf), Just(LineEnding::Cr)]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn encoded_events_parse_back_at_any_split(
        frames in vec(frame(), 0..8),
        ending in line_ending(),
        bom in any::<bool>(),
        cuts in vec(any::<usize>(), 0..12),
        byte_at_a_time in proptest::bool::weighted(0.1),
    ) {
        let bytes = encode(&frames, ending, bom);
        let mut parser = SseParser::default();
        let mut items = Vec::new();
        if byte_at_a_time {
            for byte in &bytes {
                parser.feed(std::slice::from_ref(byte), &mut items).unwrap();
            }
        } else {
            for chunk in chunks(&bytes, &cuts) {
                parser.feed(&chunk, &mut items).unwrap();
            }
        }
        parser.finish().unwrap();
        prop_assert_eq!(items, expected(&frames));
    }

    #[test]
    fn oversized_events_are_dropped_and_the_rest_arrive(
        frames in vec(frame(), 1..10),
        limit in 1usize..48,
        cuts in vec(any::<usize>(), 0..12),
    ) {
        let mut parser = SseParser::new(limit);
        let mut items = Vec::new();
        let mut errors = 0;
        let bytes = encode(&frames, LineEnding::Lf, false);
        for chunk in chunks(&bytes, &cuts) {
            match parser.feed(&chunk, &mut items) {
                Ok(()) => {}
                Err(Error::SseEventTooLarge { limit: l }) => { prop_assert_eq!(l, limit); errors += 1; }
                Err(other) => prop_assert!(false, "unexpected error {other}"),
            }
            prop_assert!(parser.buffered_len() <= limit);
        }
        parser.finish().unwrap();
        let kept: Vec<Frame> = frames
            .iter()
            .filter(|frame| match frame {
                Frame::Comment(_) => true,
                Frame::Item(item) => survives(item, limit),
            })
            .cloned()
            .collect();
        let n_dropped = frames.len() - kept.len();
        prop_assert_eq!(items, expected(&kept));
        prop_assert_eq!(errors > 0, n_dropped > 0);
        prop_assert!(errors <= n_dropped);
    }
}

/// Whether the parser keeps `item` under `limit`: it drops an event as soon
/// as a line, plus the fields already held, would exceed the bound (comment
/// lines are never held).
fn survives(item: &SseItem, limit: usize) -> bool {
    let mut encoded = Vec::new();
    sse::write_item(&mut encoded, item).unwrap();
    let text = String::from_utf8(encoded).unwrap();
    let mut fields = 0;
    let mut has_data = false;
    for line in text.split('\n').filter(|line| !line.is_empty()) {
        if fields + line.len() > limit {
            return false;
        }
        if let Some(value) = line.strip_prefix("data: ") {
            fields += value.len() + usize::from(has_data);
            has_data = true;
        } else if let Some(value) =
            line.strip_prefix("event: ").or_else(|| line.strip_prefix("id: "))
        {
            fields += value.len();
        }
    }
    true
}

const SSE_PIECES: &[&[u8]] = &[
    b"data",
    b"data:",
    b"data: ",
    b"event:",
    b"id:",
    b":",
    b"\r",
    b"\n",
    b"\r\n",
    b" ",
    b"\xEF\xBB\xBF",
    b"[DONE]",
    b"\xE2\x9C",
    b"\0",
];

/// Bytes that look like SSE more often than uniform bytes do.
fn sse_like_bytes() -> impl Strategy<Value = Vec<u8>> {
    vec(
        prop_oneof![
            any::<u8>().prop_map(|b| vec![b]),
            proptest::sample::select(SSE_PIECES).prop_map(|s| s.to_vec()),
        ],
        0..128,
    )
    .prop_map(|parts| parts.concat())
}

#[test]
fn arbitrary_bytes_never_panic_and_stay_bounded() {
    let cases =
        std::env::var("KVGATE_FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(4000);
    let mut runner =
        TestRunner::new(Config { cases, failure_persistence: None, ..Config::default() });
    let strategy = (sse_like_bytes(), vec(any::<usize>(), 0..8), 1usize..64);
    runner
        .run(&strategy, |(bytes, cuts, limit)| {
            let mut parser = SseParser::new(limit);
            let mut items = Vec::new();
            for chunk in chunks(&bytes, &cuts) {
                let _ = parser.feed(&chunk, &mut items);
                prop_assert!(parser.buffered_len() <= limit);
            }
            let _ = parser.finish();
            prop_assert_eq!(parser.buffered_len(), 0);
            for item in &items {
                if let SseItem::Event(event) = item {
                    prop_assert!(event.data.len() <= limit);
                }
            }
            Ok(())
        })
        .unwrap();
}
