//! The one error type of this crate. Messages are lowercase and name the
//! part of the input that was wrong; the gateway turns them into OpenAI error
//! bodies (see [`crate::api_error`]) in exactly one place.

/// Why a body, a request edit or an SSE stream could not be handled.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The bytes are not valid JSON, or not the shape the endpoint takes.
    #[error("invalid json body: {0}")]
    Json(#[from] serde_json::Error),
    /// The JSON is well formed but breaks a rule the engine enforces.
    #[error("invalid request: {message}")]
    InvalidRequest {
        /// What is wrong, in words a client can act on.
        message: String,
        /// The request field at fault, when there is one.
        param: Option<&'static str>,
    },
    /// One SSE event grew past the parser's bound; it was dropped.
    #[error("sse event exceeds the {limit}-byte limit")]
    SseEventTooLarge {
        /// The configured bound, in bytes.
        limit: usize,
    },
    /// The stream ended in the middle of an event (no terminating blank line).
    #[error("sse stream ended inside an event")]
    SseTruncated,
    /// An SSE field to be written contains a line break (or, for `id`, a NUL),
    /// which would change the framing.
    #[error("sse field `{field}` must not contain a line break or nul")]
    SseInvalidField {
        /// `event` or `id`.
        field: &'static str,
    },
}

impl Error {
    /// An [`Error::InvalidRequest`] about `param`.
    pub fn invalid_request(message: impl Into<String>, param: Option<&'static str>) -> Self {
        Error::InvalidRequest { message: message.into(), param }
    }
}
