//! Multipart frames around the payload: the PUB message
//! `[topic, seq (8-byte big-endian), payload]` and the replay replies, whose
//! shape changed between vLLM releases (FIELD.md §1):
//!
//! * 0.11: `[seq, payload]` per batch, then `[-1 (8 bytes, signed BE), b""]`;
//! * 0.26+: `[topic, seq, payload]` per batch, then `[b"", -1, b""]`.
//!
//! A DEALER client also sees the ROUTER's empty delimiter first. The frame
//! count tells the versions apart, so both are accepted.

use crate::error::DecodeError;

/// The replay end marker: -1 as a signed 8-byte big-endian integer.
pub const END_SEQ: u64 = u64::MAX;

/// Parses a big-endian sequence number from the first 8 bytes of its frame.
/// Some forks append an identity after the seq (24-byte frames); the seq
/// itself is always first, so longer frames are accepted.
pub fn parse_seq(frame: &[u8]) -> Result<u64, DecodeError> {
    match frame.get(..8).and_then(|b| <[u8; 8]>::try_from(b).ok()) {
        Some(bytes) => Ok(u64::from_be_bytes(bytes)),
        None => Err(DecodeError::SeqLength(frame.len())),
    }
}

/// A PUB message split into its parts; the payload is not decoded yet.
#[derive(Debug, PartialEq, Eq)]
pub struct PubMessage<'a> {
    /// The topic frame.
    pub topic: &'a [u8],
    /// The batch sequence number.
    pub seq: u64,
    /// The msgpack payload.
    pub payload: &'a [u8],
}

/// Splits a PUB multipart message.
pub fn parse_pub<'a>(frames: &[&'a [u8]]) -> Result<PubMessage<'a>, DecodeError> {
    match frames {
        [topic, seq, payload] => Ok(PubMessage { topic, seq: parse_seq(seq)?, payload }),
        _ => Err(DecodeError::FrameCount { what: "pub message", expected: "3", got: frames.len() }),
    }
}

/// One replay reply.
#[derive(Debug, PartialEq, Eq)]
pub enum ReplayReply<'a> {
    /// A buffered batch.
    Batch {
        /// Its sequence number.
        seq: u64,
        /// Its msgpack payload.
        payload: &'a [u8],
    },
    /// The end of the replay.
    End,
}

/// Parses one replay reply as received by a DEALER socket (with the leading
/// empty delimiter) or a REQ socket (without it).
pub fn parse_replay<'a>(frames: &[&'a [u8]]) -> Result<ReplayReply<'a>, DecodeError> {
    // A DEALER sees [b"", ...]; both reply shapes have a non-empty seq frame
    // in a position an empty delimiter never takes, so strip exactly one.
    let body = match frames {
        [first, rest @ ..] if first.is_empty() && (rest.len() == 2 || rest.len() == 3) => rest,
        _ => frames,
    };
    let (seq, payload) = match body {
        [seq, payload] => (*seq, *payload),
        [_topic, seq, payload] => (*seq, *payload),
        _ => {
            return Err(DecodeError::FrameCount {
                what: "replay reply",
                expected: "2 or 3 (after the delimiter)",
                got: body.len(),
            })
        }
    };
    let seq = parse_seq(seq)?;
    if seq == END_SEQ {
        Ok(ReplayReply::End)
    } else {
        Ok(ReplayReply::Batch { seq, payload })
    }
}

/// The replay request body: the start seq as 8 big-endian bytes.
pub fn replay_request(start_seq: u64) -> [u8; 8] {
    start_seq.to_be_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replay_shapes_of_both_versions() {
        let seq = 7u64.to_be_bytes();
        let end = END_SEQ.to_be_bytes();
        // 0.11 via DEALER.
        assert_eq!(
            parse_replay(&[b"", &seq, b"p"]),
            Ok(ReplayReply::Batch { seq: 7, payload: b"p" })
        );
        assert_eq!(parse_replay(&[b"", &end, b""]), Ok(ReplayReply::End));
        // 0.26 via DEALER, including the default empty topic.
        assert_eq!(
            parse_replay(&[b"", b"", &seq, b"p"]),
            Ok(ReplayReply::Batch { seq: 7, payload: b"p" })
        );
        assert_eq!(
            parse_replay(&[b"", b"kv@x", &seq, b"p"]),
            Ok(ReplayReply::Batch { seq: 7, payload: b"p" })
        );
        assert_eq!(parse_replay(&[b"", b"", &end, b""]), Ok(ReplayReply::End));
        // REQ sockets strip the delimiter themselves.
        assert_eq!(parse_replay(&[&seq, b"p"]), Ok(ReplayReply::Batch { seq: 7, payload: b"p" }));
    }

    #[test]
    fn bad_frames_are_errors() {
        assert!(parse_replay(&[b"x"]).is_err());
        assert!(parse_replay(&[b"", b"123", b"p"]).is_err());
        assert!(parse_pub(&[b"t", b"1234567", b"p"]).is_err());
        assert!(parse_pub(&[b"t"]).is_err());
    }
}
