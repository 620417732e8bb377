//! The crate's one error type. Bad trace lines are not errors unless the
//! caller asks for strictness: they are [`crate::LineError`] values, counted
//! and reported.

use std::fmt;

/// Why a replay could not be prepared or run.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// Reading a file failed.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The cause.
        source: std::io::Error,
    },
    /// A trace line is malformed and strict parsing was asked for.
    #[error("{0}")]
    BadLine(LineError),
    /// The trace's format could not be recognised.
    #[error("cannot detect the trace format: {0}")]
    UnknownFormat(String),
    /// A workload spec or option is invalid.
    #[error("invalid workload: {0}")]
    InvalidWorkload(String),
    /// The workload has no requests.
    #[error("the workload has no requests")]
    Empty,
    /// A fleet or router setting is invalid.
    #[error("invalid fleet: {0}")]
    InvalidFleet(String),
    /// The chat template or tokenizer failed.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// Writing a chart failed.
    #[error("plot {path}: {message}")]
    Plot {
        /// The chart file.
        path: String,
        /// What went wrong.
        message: String,
    },
}

/// A malformed trace line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LineError {
    /// 1-based line number in the file.
    pub line: usize,
    /// What is wrong with it.
    pub message: String,
}

impl fmt::Display for LineError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}: {}", self.line, self.message)
    }
}
