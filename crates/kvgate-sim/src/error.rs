//! The crate's error type: only API misuse is an error; everything that
//! happens while serving (preemption, eviction) is counted in stats.

/// Why a call into the engine was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SimError {
    /// A configuration value is out of range.
    #[error("invalid engine config: {0}")]
    InvalidConfig(String),
    /// `add_request` with an id that is already in the engine.
    #[error("request {0} already exists")]
    DuplicateRequest(u64),
    /// A request without prompt tokens.
    #[error("request {0} has an empty prompt")]
    EmptyPrompt(u64),
    /// `max_tokens` of 0.
    #[error("request {0} asks for zero output tokens")]
    ZeroMaxTokens(u64),
    /// `set_identity` for a request that is unknown or already scheduled.
    #[error("request {0} is not waiting unscheduled: its cache identity is fixed")]
    IdentityFixed(u64),
    /// A disaggregation role for a request that is unknown or already
    /// scheduled.
    #[error("request {0} is not waiting unscheduled: its disaggregation role is fixed")]
    RoleFixed(u64),
    /// Prompt plus output cannot fit in the GPU KV cache.
    #[error("request {id} needs {tokens} tokens, more than max_model_len {max_model_len}")]
    TooLong {
        /// The request.
        id: u64,
        /// Prompt + max_tokens.
        tokens: u64,
        /// What the KV cache holds.
        max_model_len: u64,
    },
}
