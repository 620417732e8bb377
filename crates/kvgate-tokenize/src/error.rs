//! The one error type of this crate.
//!
//! Every fallible public function returns [`TokenizeError`]. The variants say
//! whose fault a failure is, so that the gateway can map them to status codes
//! in one place: [`TokenizeError::InvalidRequest`] and
//! [`TokenizeError::Template`] are the client's (vLLM answers them with 400),
//! [`TokenizeError::Unsupported`] means kvgate cannot compute the engine's
//! tokens natively (the gateway may fall back to the engine's own renderer),
//! and the rest are operator or internal faults.

use std::path::PathBuf;

/// Errors from loading a model directory, rendering a chat or tokenizing.
#[derive(Debug, thiserror::Error)]
pub enum TokenizeError {
    /// A file of the model directory could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file that failed.
        path: PathBuf,
        /// The underlying I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The model directory is incomplete or one of its files is malformed.
    #[error("invalid model directory: {0}")]
    InvalidModelDir(String),
    /// The chat template failed to compile or raised an error while
    /// rendering; the message is the template's own (for example the text
    /// given to `raise_exception`).
    #[error("{0}")]
    Template(String),
    /// The request is malformed in a way vLLM also rejects.
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// The request is valid for vLLM but kvgate cannot tokenize it natively
    /// (multimodal content parts).
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// The tokenizer itself failed.
    #[error("tokenizer error: {0}")]
    Tokenizer(String),
}

impl TokenizeError {
    /// Whether the client caused the error (vLLM answers these with 400).
    pub fn is_client_error(&self) -> bool {
        matches!(self, TokenizeError::Template(_) | TokenizeError::InvalidRequest(_))
    }
}

/// Shorthand for results of this crate.
pub type Result<T, E = TokenizeError> = std::result::Result<T, E>;
