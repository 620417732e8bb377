//! Command-line surface. Every flag is documented here; `kvgate --help` and
//! `docs/cli.md` come from these doc comments.

use clap::{Args, Parser, Subcommand};

/// kvgate: a KV-cache-aware, token-aware router for vLLM fleets.
#[derive(Debug, Parser)]
// A later occurrence of a flag overrides an earlier one: config files are
// expanded into flags placed before the command line's own.
#[command(name = "kvgate", version, about, args_override_self = true)]
pub(crate) struct Cli {
    /// Log filter (tracing `EnvFilter` syntax, e.g. `info,kvgate_events=debug`).
    /// Defaults to `RUST_LOG`, then `info`. Logs go to stderr.
    #[arg(long, global = true)]
    pub(crate) log: Option<String>,
    /// Log line format: `text`, or `json` (one object per line, with the
    /// fields of every span it is logged in: a request's `trace_id` among
    /// them). Also `KVGATE_LOG_FORMAT`.
    #[arg(long, global = true, value_enum, env = "KVGATE_LOG_FORMAT", default_value = "text")]
    pub(crate) log_format: LogFormat,
    /// Export kvgate's spans over OTLP to this collector (e.g.
    /// `http://localhost:4318` for HTTP, `http://localhost:4317` for gRPC).
    /// Off by default; also on when `OTEL_EXPORTER_OTLP_ENDPOINT` or
    /// `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` is set. `OTEL_SERVICE_NAME`
    /// (default `kvgate`) and `OTEL_TRACES_SAMPLER`/`_ARG` apply.
    #[arg(long, global = true, value_name = "URL")]
    pub(crate) otlp_endpoint: Option<String>,
    /// OTLP transport: `grpc` or `http/protobuf`. Defaults to
    /// `OTEL_EXPORTER_OTLP_PROTOCOL`, then `http/protobuf`.
    #[arg(long, global = true, value_enum)]
    pub(crate) otlp_protocol: Option<OtlpProtocol>,
    #[command(subcommand)]
    pub(crate) command: Command,
}

/// `--log-format`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum LogFormat {
    Text,
    Json,
}

/// `--otlp-protocol`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum OtlpProtocol {
    Grpc,
    #[value(name = "http/protobuf")]
    HttpProtobuf,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Tools for vLLM KV-cache event streams.
    #[command(subcommand)]
    Events(EventsCommand),
    /// Tokenize one vLLM `/tokenize` request body read from stdin, exactly as
    /// the engine would, and print `{"tokens":[...],"count":N}`.
    Tokenize(TokenizeArgs),
    /// Run simulated vLLM engines (no GPU): vLLM's HTTP API, KV events,
    /// replay and metrics over the kvgate-sim engine model.
    Sim(Box<SimArgs>),
    /// The ingress: an OpenAI-compatible endpoint that tokenizes once,
    /// routes on live KV state and streams the answer back. With no replicas
    /// configured it starts simulated ones on loopback. See docs/config.md.
    Serve(Box<ServeArgs>),
    /// The endpoint picker for a Kubernetes gateway (Gateway API Inference
    /// Extension): an Envoy ext_proc gRPC service that tokenizes, routes on
    /// live KV state and answers with the chosen replica's `ip:port`, while
    /// the gateway carries the bytes. Takes `serve`'s configuration; the
    /// OpenAI-compatible proxy, health, metrics and admin stay on their HTTP
    /// listeners beside it. See docs/deploy.md.
    Epp(Box<EppArgs>),
    /// Replay a trace or a generated workload through a fleet under every
    /// policy and compare TTFT, KV hit rate (against the oracle bounds), load
    /// imbalance and decision time. See docs/replay.md.
    Replay(Box<crate::replay_cmd::ReplayArgs>),
}

/// `kvgate serve`. Every setting is a key of the config file
/// (docs/config.md); these flags override the file, and each reads a
/// `KVGATE_*` environment variable when not given.
#[derive(Debug, Args)]
pub(crate) struct ServeArgs {
    /// Address of the OpenAI-compatible API (default 127.0.0.1:8000).
    #[arg(long, env = "KVGATE_LISTEN")]
    pub(crate) listen: Option<std::net::SocketAddr>,
    #[command(flatten)]
    pub(crate) gateway: GatewayArgs,
}

/// `kvgate epp`: `serve`'s settings, with `--listen` naming the gRPC
/// listener.
#[derive(Debug, Args)]
pub(crate) struct EppArgs {
    /// Address of the ext_proc gRPC listener the gateway calls (config key
    /// `epp.listen`; default 127.0.0.1:9002).
    #[arg(long, env = "KVGATE_EPP_LISTEN")]
    pub(crate) listen: Option<std::net::SocketAddr>,
    /// Address of the HTTP API beside it: the OpenAI-compatible proxy,
    /// `/health`, `/ready`, `/metrics` (config key `listen`; default
    /// 127.0.0.1:8000).
    #[arg(long, env = "KVGATE_LISTEN")]
    pub(crate) http_listen: Option<std::net::SocketAddr>,
    #[command(flatten)]
    pub(crate) gateway: GatewayArgs,
}

/// The settings `serve` and `epp` share.
#[derive(Debug, Args)]
pub(crate) struct GatewayArgs {
    /// A TOML config file (see docs/config.md).
    #[arg(long, env = "KVGATE_CONFIG")]
    pub(crate) config: Option<std::path::PathBuf>,
    /// Override any config key: `--set router.epsilon=0.1` (TOML values;
    /// repeatable; applied after the file).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub(crate) set: Vec<String>,
    /// Address of the admin API (default 127.0.0.1:8001).
    #[arg(long, env = "KVGATE_ADMIN_LISTEN")]
    pub(crate) admin_listen: Option<std::net::SocketAddr>,
    /// Serve `/metrics` on its own address instead of the API's.
    #[arg(long, env = "KVGATE_METRICS_LISTEN")]
    pub(crate) metrics_listen: Option<std::net::SocketAddr>,
    /// A vLLM replica: `URL[,events=tcp://H:P][,replay=tcp://H:P][,topic=T][,api_key=K]`
    /// `[,block_size=N][,passthrough=kv_transfer_params|token_prompt|none]`
    /// `[,priority_scheduling=true|false][,name=N]`.
    /// Repeatable; replaces the file's replicas. None starts simulated replicas.
    #[arg(long = "replica", value_name = "SPEC", env = "KVGATE_REPLICAS", value_delimiter = ' ')]
    pub(crate) replicas: Vec<String>,
    /// Routing policy: kv_aware, linear_blocks, approx_prefix, least_load,
    /// power_of_two, round_robin, random, session_affinity.
    #[arg(long, env = "KVGATE_POLICY")]
    pub(crate) policy: Option<String>,
    /// A Hugging Face model directory for the tokenizer and chat template
    /// (default: the bundled Qwen3 tokenizer).
    #[arg(long, env = "KVGATE_MODEL_DIR")]
    pub(crate) model_dir: Option<std::path::PathBuf>,
    /// The model name clients use.
    #[arg(long, env = "KVGATE_SERVED_MODEL_NAME")]
    pub(crate) served_model_name: Option<String>,
    /// A client API key (repeatable; env: comma-separated).
    #[arg(
        long = "api-key",
        env = "KVGATE_API_KEYS",
        value_delimiter = ',',
        hide_env_values = true
    )]
    pub(crate) api_keys: Vec<String>,
    /// The admin API key.
    #[arg(long, env = "KVGATE_ADMIN_KEY", hide_env_values = true)]
    pub(crate) admin_key: Option<String>,
    /// Serve a non-loopback address without client keys (logged as a warning).
    #[arg(long, env = "KVGATE_ALLOW_UNAUTHENTICATED")]
    pub(crate) allow_unauthenticated: bool,
    /// Simulated replicas to start when none are configured (default 4).
    #[arg(long, env = "KVGATE_SIM_REPLICAS")]
    pub(crate) sim_replicas: Option<usize>,
    /// A peer kvgate instance's peer endpoint, e.g. `http://10.0.0.7:9000`
    /// (repeatable; env: comma-separated). Instances share their in-flight
    /// bookings so that they balance load as one.
    #[arg(long = "peer", value_name = "URL", env = "KVGATE_PEERS", value_delimiter = ',')]
    pub(crate) peers: Vec<String>,
    /// Find peers by DNS: `HOST:PORT` (a headless Service of the kvgate
    /// pods), resolved periodically; this instance skips itself.
    #[arg(long, value_name = "HOST:PORT", env = "KVGATE_PEER_DNS")]
    pub(crate) peer_dns: Option<String>,
    /// Where this instance receives its peers' bookings.
    #[arg(long, value_name = "ADDR", env = "KVGATE_PEER_LISTEN")]
    pub(crate) peer_listen: Option<std::net::SocketAddr>,
    /// The key peers share (required with any peer setting).
    #[arg(long, env = "KVGATE_PEER_KEY", hide_env_values = true)]
    pub(crate) peer_key: Option<String>,
    /// Share load over NATS instead of the HTTP mesh: the servers, e.g.
    /// `nats://nats:4222` (comma-separated; `tls://` needs
    /// `peers.nats.ca`). Each instance publishes its changes once on
    /// `--peer-nats-subject` and applies the others'.
    #[arg(long, value_name = "URL", env = "KVGATE_PEER_NATS")]
    pub(crate) peer_nats: Option<String>,
    /// The NATS subject of this deployment's changes (default `kvgate.peers`).
    #[arg(long, value_name = "SUBJECT", env = "KVGATE_PEER_NATS_SUBJECT")]
    pub(crate) peer_nats_subject: Option<String>,
    /// The token the NATS server requires.
    #[arg(long, env = "KVGATE_PEER_NATS_TOKEN", hide_env_values = true)]
    pub(crate) peer_nats_token: Option<String>,
    /// The NATS user (with `--peer-nats-password`).
    #[arg(long, env = "KVGATE_PEER_NATS_USER")]
    pub(crate) peer_nats_user: Option<String>,
    /// The NATS user's password.
    #[arg(long, env = "KVGATE_PEER_NATS_PASSWORD", hide_env_values = true)]
    pub(crate) peer_nats_password: Option<String>,
    /// The key that authenticates the Responses API ids kvgate hands out
    /// (each names the replica holding its response); every instance of a
    /// fleet needs the same one. Unset, each instance draws its own.
    #[arg(long, env = "KVGATE_AFFINITY_KEY", hide_env_values = true)]
    pub(crate) affinity_key: Option<String>,
    /// Find engines by DNS: a name (a headless Service of the vLLM pods)
    /// resolved periodically; ports and topic come from `discovery.*`.
    #[arg(long, value_name = "HOST", env = "KVGATE_DISCOVER_DNS")]
    pub(crate) discover_dns: Option<String>,
    /// The API key sent to discovered engines (vLLM's `--api-key`).
    #[arg(long, env = "KVGATE_ENGINE_API_KEY", hide_env_values = true)]
    pub(crate) engine_api_key: Option<String>,
    /// Print the effective configuration as TOML and exit.
    #[arg(long)]
    pub(crate) print_config: bool,
}

/// `kvgate sim`. See docs/sim.md.
#[derive(Debug, Args)]
pub(crate) struct SimArgs {
    /// A TOML file whose keys are these flags' long names (`num_gpu_blocks = 4096`,
    /// `hash_bytes = true`, ...); flags given on the command line win.
    #[arg(long)]
    pub(crate) config: Option<std::path::PathBuf>,
    /// HTTP host to bind.
    #[arg(long, default_value = "127.0.0.1")]
    pub(crate) host: String,
    /// HTTP port of the first replica; replica i listens on PORT+i.
    #[arg(long, default_value_t = 8000)]
    pub(crate) port: u16,
    /// Replicas (independent engines) in this process, on consecutive
    /// HTTP, event and replay ports.
    #[arg(long, default_value_t = 1)]
    pub(crate) replicas: u16,
    /// The model (vLLM's `--model`): its served name unless
    /// `--served-model-name` is given, and `root` in `/v1/models`.
    #[arg(long, default_value = "Qwen/Qwen3-0.6B")]
    pub(crate) model: String,
    /// vLLM's `--served-model-name`: the names requests may use for the
    /// model (one or more, repeatable); the first names it in responses and
    /// metric labels.
    #[arg(long = "served-model-name", value_name = "NAME", num_args = 1..)]
    pub(crate) served_model_names: Vec<String>,
    /// A LoRA adapter served beside the model, by name only (repeatable): a
    /// request whose `model` names it hashes its blocks under the adapter,
    /// and events carry `lora_name`.
    #[arg(long = "lora-adapter", value_name = "NAME")]
    pub(crate) lora_adapters: Vec<String>,
    /// vLLM's `--lora-modules`: adapters as `NAME=PATH` or JSON
    /// `{"name":..,"path":..,"base_model_name":..}` (one or more, repeatable).
    #[arg(long = "lora-modules", value_name = "NAME=PATH", num_args = 1..)]
    pub(crate) lora_modules: Vec<String>,
    /// vLLM's `--max-loras`: GPU adapter slots per engine; a batch holds at
    /// most this many distinct adapters.
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub(crate) max_loras: u32,
    /// Milliseconds to load an adapter into a slot (not a vLLM flag): added
    /// to the step that first schedules a non-resident adapter, and waited
    /// by `/v1/load_lora_adapter`.
    #[arg(long, default_value_t = kvgate_sim::config::DEFAULT_LORA_LOAD_MS, value_name = "MS")]
    pub(crate) lora_load_ms: f64,
    /// Mount `/v1/load_lora_adapter` and `/v1/unload_lora_adapter`; also on
    /// when `VLLM_ALLOW_RUNTIME_LORA_UPDATING` is `1` or `true`, as vLLM reads it.
    #[arg(long)]
    pub(crate) allow_runtime_lora_updating: bool,
    /// vLLM's `--kv-transfer-config` JSON for prefill/decode disaggregation, e.g.
    /// `{"kv_connector":"NixlConnector","kv_role":"kv_both"}`: a request with
    /// `kv_transfer_params.do_remote_decode` is a prefill hop (blocks held until the
    /// lease, `kv_connector_extra_config.kv_lease_duration`, default 30 s, ends; its
    /// response carries the decode side's parameters), one with `do_remote_prefill`
    /// a decode hop (waits for the KV transfer, then computes only the last prompt
    /// token). Without it, `kv_transfer_params` is ignored, as vLLM does.
    #[arg(long, value_name = "JSON")]
    pub(crate) kv_transfer_config: Option<String>,
    /// With --kv-transfer-config: the link between replicas in GB/s (10^9 bytes);
    /// a decode hop waits tokens it lacks × --kv-bytes-per-token ÷ this (Dynamo's
    /// mocker assumes 64).
    #[arg(long, value_name = "GB/S", default_value_t = 64.0)]
    pub(crate) kv_transfer_bandwidth: f64,
    /// With --kv-transfer-config: KV bytes per token of the simulated model
    /// (default: Qwen3-0.6B in bf16, 28 layers × 8 KV heads × 128 × K and V × 2 bytes).
    #[arg(long, value_name = "BYTES", default_value_t = 114_688)]
    pub(crate) kv_bytes_per_token: u64,
    /// vLLM's `--data-parallel-size`: this many engines behind each
    /// replica's one HTTP port, each with its own cache and event stream on
    /// the `--events` (and `--replay`) port plus its rank.
    /// `X-data-parallel-rank: r` pins a request to rank r; without it
    /// requests rotate over the ranks.
    #[arg(long, default_value_t = 1, value_name = "K")]
    pub(crate) data_parallel_size: u32,
    /// KV-event PUB endpoint of the first replica, e.g. `tcp://*:5557`
    /// (bound, by vLLM's rule) or `tcp://HOST:PORT` (connected).
    #[arg(long)]
    pub(crate) events: Option<String>,
    /// Replay ROUTER endpoint of the first replica, e.g. `tcp://*:5558`.
    #[arg(long)]
    pub(crate) replay: Option<String>,
    /// Bind the `--events` endpoint even when it names a host (vLLM's rule
    /// would connect), e.g. `--events tcp://127.0.0.1:5557 --bind-events` to
    /// publish on loopback only instead of every interface.
    #[arg(long)]
    pub(crate) bind_events: bool,
    /// Batches kept for replay.
    #[arg(long, default_value_t = 10_000)]
    pub(crate) buffer_steps: usize,
    /// Topic frame of every PUB message.
    #[arg(long, default_value = "")]
    pub(crate) topic: String,
    /// msgpack layout of the events: v0.11, v0.26 or map.
    #[arg(long, default_value = "v0.26")]
    pub(crate) event_layout: String,
    /// Fault: fraction of event batches numbered and buffered but not sent.
    #[arg(long, default_value_t = 0.0)]
    pub(crate) drop_event_batches: f64,
    /// Fault: every replay reply waits this long before answering, in ms (a
    /// slow engine: lets tests watch a subscriber's initial sync in flight).
    #[arg(long, default_value_t = 0)]
    pub(crate) replay_delay_ms: u64,
    /// Tokens per KV block.
    #[arg(long, default_value_t = 16)]
    pub(crate) block_size: u32,
    /// GPU KV blocks per replica, counted as vLLM's `num_gpu_blocks` (one of
    /// them is the null block, so one fewer holds KV).
    #[arg(long, default_value_t = 8192)]
    pub(crate) num_gpu_blocks: u32,
    /// CPU offload blocks per replica (0: no CPU tier).
    #[arg(long, default_value_t = 0)]
    pub(crate) num_cpu_blocks: u32,
    /// Most requests running at once.
    #[arg(long, default_value_t = 256)]
    pub(crate) max_num_seqs: u32,
    /// Per-step token budget (chunked prefill).
    #[arg(long, default_value_t = 8192)]
    pub(crate) max_num_batched_tokens: u32,
    /// Block-hash seed (vLLM's PYTHONHASHSEED); random per replica if unset.
    #[arg(long)]
    pub(crate) hash_seed: Option<u64>,
    /// Publish block hashes as 32 bytes instead of u64 ints.
    #[arg(long)]
    pub(crate) hash_bytes: bool,
    /// Fill CPU-tier BlockStored events instead of vLLM's placeholders.
    #[arg(long)]
    pub(crate) self_describing_cpu_events: bool,
    /// Offload to the CPU tier in chunks of N blocks as requests compute
    /// them, and evict whole chunks, as vLLM 0.33's offloading connector
    /// does: chunks that overlap a shared prefix re-announce its blocks.
    /// 0 offloads block by block on GPU eviction.
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub(crate) cpu_chunk_blocks: u32,
    /// Timing preset: dynamo_mocker, llmd_qwen3_32b, vllm_cpu_tiny or vllm_cpu_gpu_like
    /// (fitted to the real CPU engine's presets of scripts/real-vllm.sh; see docs/real-vllm.md).
    #[arg(long, default_value = "dynamo_mocker")]
    pub(crate) timing: String,
    /// Run real time this many times faster than the timing model.
    #[arg(long, default_value_t = 1.0)]
    pub(crate) speedup: f64,
    /// `max_tokens` for requests that set none.
    #[arg(long, default_value_t = 16)]
    pub(crate) default_max_tokens: u32,
    /// Require `Authorization: Bearer KEY` on /v1 routes.
    #[arg(long, env = "VLLM_API_KEY")]
    pub(crate) api_key: Option<String>,
    /// Fault: fraction of generation requests answered with HTTP 500.
    #[arg(long, default_value_t = 0.0)]
    pub(crate) fail_rate: f64,
    /// Fault: responses stop making progress after N output tokens (the
    /// connection stays open).
    #[arg(long)]
    pub(crate) stall_after_tokens: Option<u32>,
    /// Fault: the process exits (status 3) once any replica has finished N
    /// requests, as a crashed engine would.
    #[arg(long)]
    pub(crate) exit_after_requests: Option<u64>,
}

/// Flags of `kvgate tokenize`.
#[derive(Debug, Args)]
pub(crate) struct TokenizeArgs {
    /// A Hugging Face model directory (tokenizer.json, tokenizer_config.json,
    /// optional chat_template.jinja). Default: the bundled Qwen3 tokenizer.
    #[arg(long)]
    pub(crate) model_dir: Option<std::path::PathBuf>,
    /// What encodes: auto (fastokens where it is proven on the tokenizer,
    /// else tokenizers), fastokens, or tokenizers (config: model.encoder).
    #[arg(long, default_value = "auto")]
    pub(crate) encoder: kvgate_tokenize::EncoderChoice,
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

#[cfg(test)]
mod tests;
