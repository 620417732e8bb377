//! The one error type of the wire format. Messages are lowercase and say
//! which part of the payload was wrong, so that an operator reading a log
//! line can tell a version mismatch from corruption.

/// Why a payload or frame could not be decoded.
#[derive(Clone, Debug, thiserror::Error, PartialEq)]
pub enum DecodeError {
    /// The bytes are not one valid msgpack value.
    #[error("invalid msgpack: {0}")]
    Msgpack(String),
    /// Bytes remained after the top-level value.
    #[error("{0} trailing bytes after the msgpack value")]
    TrailingBytes(usize),
    /// A value had the wrong msgpack type.
    #[error("{what}: expected {expected}, found {found}")]
    Type {
        /// Which field or element.
        what: &'static str,
        /// The type the layout requires.
        expected: &'static str,
        /// What was found instead.
        found: &'static str,
    },
    /// A required field is absent.
    #[error("{0}: missing")]
    Missing(&'static str),
    /// An integer does not fit the field.
    #[error("{what}: {value} out of range")]
    OutOfRange {
        /// Which field.
        what: &'static str,
        /// The offending value, as text.
        value: String,
    },
    /// A multipart message had an unexpected number of frames.
    #[error("{what}: expected {expected} frames, got {got}")]
    FrameCount {
        /// Which message kind.
        what: &'static str,
        /// Expected count(s), as text.
        expected: &'static str,
        /// Received count.
        got: usize,
    },
    /// A sequence-number frame was shorter than 8 bytes.
    #[error("sequence frame must hold 8 bytes, got {0}")]
    SeqLength(usize),
}
