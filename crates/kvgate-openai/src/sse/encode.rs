//! Writing SSE frames into a byte buffer.
//!
//! Each function appends one complete frame (ending in a blank line) to
//! `out`, so frames can be written back to back into one buffer and sent as
//! one chunk. Line breaks inside data or comments become separate lines, as
//! the format requires; line breaks in an event name or id would change the
//! framing and are refused.

use serde::Serialize;

use super::{SseEvent, SseItem, DONE_DATA};
use crate::api_error::ErrorResponse;
use crate::error::Error;

/// The end-of-stream frame, `data: [DONE]\n\n`.
pub const DONE_FRAME: &[u8] = b"data: [DONE]\n\n";

/// Splits on `\r\n`, `\r` and `\n`.
fn lines(text: &str) -> impl Iterator<Item = &str> {
    let mut rest = Some(text);
    std::iter::from_fn(move || {
        let current = rest?;
        match current.find(['\r', '\n']) {
            None => {
                rest = None;
                Some(current)
            }
            Some(at) => {
                let skip = if current[at..].starts_with("\r\n") { 2 } else { 1 };
                rest = Some(&current[at + skip..]);
                Some(&current[..at])
            }
        }
    })
}

/// Appends `data: ...` lines for `data` (one per line of it), without the
/// terminating blank line.
fn push_data_lines(out: &mut Vec<u8>, data: &str) {
    for line in lines(data) {
        out.extend_from_slice(b"data: ");
        out.extend_from_slice(line.as_bytes());
        out.push(b'\n');
    }
}

/// Appends a `data:` event for `data`.
pub fn write_data(out: &mut Vec<u8>, data: &str) {
    push_data_lines(out, data);
    out.push(b'\n');
}

/// Appends `data: {json}\n\n` for `value`. Compact JSON never contains a
/// raw line break, so the value is written straight into `out`; on error
/// `out` is left as it was.
pub fn write_json<T: Serialize + ?Sized>(out: &mut Vec<u8>, value: &T) -> Result<(), Error> {
    let start = out.len();
    out.extend_from_slice(b"data: ");
    if let Err(err) = serde_json::to_writer(&mut *out, value) {
        out.truncate(start);
        return Err(err.into());
    }
    out.extend_from_slice(b"\n\n");
    Ok(())
}

/// Appends `data: [DONE]\n\n`.
pub fn write_done(out: &mut Vec<u8>) {
    out.extend_from_slice(DONE_FRAME);
}

/// Appends a comment (`: text`, one line per line of `text`) and a blank
/// line. Clients ignore comments; they keep idle connections alive.
pub fn write_comment(out: &mut Vec<u8>, text: &str) {
    for line in lines(text) {
        out.push(b':');
        if !line.is_empty() {
            out.push(b' ');
            out.extend_from_slice(line.as_bytes());
        }
        out.push(b'\n');
    }
    out.push(b'\n');
}

/// Appends an error mid-stream the way vLLM does: a `data:` event whose
/// JSON is the error body. Clients that follow OpenAI's SDK raise it.
pub fn write_error(out: &mut Vec<u8>, error: &ErrorResponse) -> Result<(), Error> {
    write_json(out, error)
}

fn check_field(value: &str, field: &'static str, allow_nul: bool) -> Result<(), Error> {
    if value.contains(['\r', '\n']) || (!allow_nul && value.contains('\0')) {
        return Err(Error::SseInvalidField { field });
    }
    Ok(())
}

/// Appends `event` (name, id, data lines, blank line). Line breaks in the
/// data are normalised to `\n` by the round trip.
pub fn write_event(out: &mut Vec<u8>, event: &SseEvent) -> Result<(), Error> {
    if let Some(name) = &event.event {
        check_field(name, "event", true)?;
    }
    if let Some(id) = &event.id {
        check_field(id, "id", false)?;
    }
    if let Some(name) = &event.event {
        out.extend_from_slice(b"event: ");
        out.extend_from_slice(name.as_bytes());
        out.push(b'\n');
    }
    if let Some(id) = &event.id {
        out.extend_from_slice(b"id: ");
        out.extend_from_slice(id.as_bytes());
        out.push(b'\n');
    }
    write_data(out, &event.data);
    Ok(())
}

/// Appends an [`SseItem`].
pub fn write_item(out: &mut Vec<u8>, item: &SseItem) -> Result<(), Error> {
    match item {
        SseItem::Event(event) => write_event(out, event),
        SseItem::Done => {
            write_data(out, DONE_DATA);
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(f: impl FnOnce(&mut Vec<u8>)) -> String {
        let mut out = Vec::new();
        f(&mut out);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn frames() {
        assert_eq!(
            text(|o| write_json(o, &serde_json::json!({"a": "x\ny"})).unwrap()),
            "data: {\"a\":\"x\\ny\"}\n\n"
        );
        assert_eq!(text(write_done), "data: [DONE]\n\n");
        assert_eq!(text(|o| write_comment(o, "ping")), ": ping\n\n");
        assert_eq!(text(|o| write_comment(o, "a\nb")), ": a\n: b\n\n");
        assert_eq!(text(|o| write_comment(o, "")), ":\n\n");
        assert_eq!(text(|o| write_data(o, "a\r\nb\rc\n")), "data: a\ndata: b\ndata: c\ndata: \n\n");
        assert_eq!(text(|o| write_data(o, "")), "data: \n\n");
        let event = SseEvent { event: Some("e".into()), data: "d".into(), id: Some("7".into()) };
        assert_eq!(text(|o| write_event(o, &event).unwrap()), "event: e\nid: 7\ndata: d\n\n");
    }

    #[test]
    fn error_frame_is_vllm_shaped() {
        let frame = text(|o| write_error(o, &ErrorResponse::bad_gateway("engine died")).unwrap());
        assert_eq!(
            frame,
            "data: {\"error\":{\"message\":\"engine died\",\"type\":\"upstream_error\",\"param\":null,\"code\":502}}\n\n"
        );
    }

    #[test]
    fn refuses_line_breaks_in_names_and_ids() {
        let mut out = Vec::new();
        let bad_name = SseEvent { event: Some("a\nb".into()), ..SseEvent::data("x") };
        assert!(matches!(
            write_event(&mut out, &bad_name),
            Err(Error::SseInvalidField { field: "event" })
        ));
        let bad_id = SseEvent { id: Some("a\0b".into()), ..SseEvent::data("x") };
        assert!(matches!(
            write_event(&mut out, &bad_id),
            Err(Error::SseInvalidField { field: "id" })
        ));
        assert!(out.is_empty());
    }
}
