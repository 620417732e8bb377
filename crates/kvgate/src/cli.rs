//! Command-line surface. Every flag is documented here; `kvgate --help` and
//! `docs/cli.md` come from these doc comments.

use clap::{Args, Parser, Subcommand};

/// kvgate: a KV-cache-aware, token-aware router for vLLM fleets.
#[derive(Debug, Parser)]
#[command(name = "kvgate", version, about)]
pub(crate) struct Cli {
    /// Log filter (tracing `EnvFilter` syntax, e.g. `info,kvgate_events=debug`).
    /// Defaults to `RUST_LOG`, then `info`. Logs go to stderr.
    #[arg(long, global = true)]
    pub(crate) log: Option<String>,
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Tools for vLLM KV-cache event streams.
    #[command(subcommand)]
    Events(EventsCommand),
    /// Tokenize one vLLM `/tokenize` request body read from stdin, exactly as
    /// the engine would, and print `{"tokens":[...],"count":N}`.
    Tokenize(TokenizeArgs),
}

/// Flags of `kvgate tokenize`.
#[derive(Debug, Args)]
pub(crate) struct TokenizeArgs {
    /// A Hugging Face model directory (tokenizer.json, tokenizer_config.json,
    /// optional chat_template.jinja). Default: the bundled Qwen3 tokenizer.
    #[arg(long)]
    pub(crate) model_dir: Option<std::path::PathBuf>,
}

#[derive(Debug, Subcommand)]
pub(crate) enum EventsCommand {
    /// Subscribe to one engine's KV events and print every decoded event.
    Tail(TailArgs),
}

/// Flags of `kvgate events tail`.
#[derive(Debug, Args)]
pub(crate) struct TailArgs {
    /// The engine's PUB endpoint (vLLM `--kv-events-config` `endpoint`, with the
    /// engine's host instead of `*`), e.g. `tcp://127.0.0.1:5557`.
    #[arg(long)]
    pub(crate) endpoint: String,
    /// The engine's ROUTER replay endpoint (`replay_endpoint`). With it, missed
    /// batches are replayed and a fresh start learns the engine's whole buffer.
    #[arg(long)]
    pub(crate) replay: Option<String>,
    /// Topic prefix to subscribe to (vLLM `topic`); empty means all.
    #[arg(long, default_value = "")]
    pub(crate) topic: String,
    /// Block size the engine is expected to use; stores that disagree are
    /// rejected by the index and counted as `block_size_mismatch`.
    #[arg(long, default_value_t = 16)]
    pub(crate) expect_block_size: u32,
    /// Print one JSON object per line instead of human-readable lines.
    #[arg(long)]
    pub(crate) json: bool,
    /// Stop after this many seconds (fractions allowed); default: run until Ctrl-C.
    #[arg(long)]
    pub(crate) duration: Option<f64>,
    /// Apply every event to a kvgate index and print a one-line JSON summary at exit.
    #[arg(long)]
    pub(crate) summary: bool,
    /// Seconds a replay may take before it counts as failed.
    #[arg(long, default_value_t = 5.0)]
    pub(crate) replay_timeout: f64,
}
