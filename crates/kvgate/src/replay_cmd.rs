//! `kvgate replay`: replay a trace or a generated workload through a fleet
//! under every policy, and report TTFT, hit rate against the physical
//! bounds, load imbalance and decision time (docs/replay.md). Fast mode runs
//! in virtual time on `kvgate-replay`; live mode (`kvgate-live`) sends the
//! same workload over HTTP through real kvgate and `kvgate sim` processes.

use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::{Args, ValueEnum};
use kvgate_live::{run_live, LiveOptions, LiveRun};
use kvgate_replay::{
    detect_format, find_load_levels, oracle_hit_rates, parse_messages, parse_mooncake, pool_bounds,
    render_table, run_matrix_pools, wants_pools, write_plots, FleetSpec, FloorModel, Report,
    RunOptions, SyntheticSpec, TraceFormat, Workload, WorkloadInfo,
};
use kvgate_router::{PolicyKind, RouterConfig};

use crate::progress::Progress;
use kvgate_sim::TimingModel;

/// The policies compared by default: kv_aware and its baselines.
const DEFAULT_POLICIES: &str =
    "kv_aware,linear_blocks,approx_prefix,least_load,power_of_two,round_robin";

/// How the replay runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum Mode {
    /// Virtual time, in process: kvgate-sim engines and kvgate-router, no HTTP.
    Fast,
    /// Real time over HTTP: spawned kvgate + `kvgate sim` replicas, or --target.
    Live,
}

/// The trace formats.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum Format {
    /// Detect from the first lines (`hash_ids` → mooncake, `messages` → messages).
    Auto,
    /// Mooncake JSONL: timestamp (ms), input_length, output_length, hash_ids (512-token blocks).
    Mooncake,
    /// OpenAI chat bodies, one per line: messages, optional timestamp (ms) and max_tokens.
    Messages,
}

/// `kvgate replay`. The default fleet is the acceptance fleet: 8
/// replicas of the calibrated Qwen3-32B preset, 16-token blocks, GPU blocks
/// derived from the model's KV bytes per token (docs/sim.md), a CPU tier of 4×.
#[derive(Clone, Debug, Args)]
pub(crate) struct ReplayArgs {
    /// fast: virtual time, in process (default); live: real time over HTTP through
    /// kvgate and `kvgate sim` processes (or a running kvgate, --target), engines at --speedup.
    #[arg(long, value_enum, default_value_t = Mode::Fast)]
    pub(crate) mode: Mode,
    /// A trace file: Mooncake JSONL or OpenAI `messages` lines.
    #[arg(long, value_name = "FILE", conflicts_with = "workload")]
    pub(crate) trace: Option<PathBuf>,
    /// The trace's format.
    #[arg(long, value_enum, default_value_t = Format::Auto)]
    pub(crate) format: Format,
    /// A generated workload: `synthetic:chat|agentic|noreuse|lora[,key=value...]`.
    /// chat: seed, conversations, turns, system_prompts, system_tokens, user_tokens,
    /// output_tokens, think_s, rate. agentic: seed, sessions, steps, shared_tokens,
    /// context_tokens, step_tokens, output_tokens, step_s, rate. noreuse: seed,
    /// requests, input_tokens, output_tokens, rate. lora (one pool per base model,
    /// LoRA adapters in max_loras GPU slots): seed, models, adapters (in all), zipf,
    /// base_share, max_loras, conversations, turns, system_prompts, system_tokens,
    /// user_tokens, output_tokens, think_s, rate. See docs/replay.md.
    #[arg(long, value_name = "SPEC")]
    pub(crate) workload: Option<String>,
    /// Fail on the first malformed trace line instead of reporting and skipping it.
    #[arg(long)]
    pub(crate) strict: bool,
    /// Replay only the first N requests (by arrival).
    #[arg(long, value_name = "N")]
    pub(crate) limit: Option<usize>,
    /// Replay at this multiple of the workload's own request rate (arrival times ÷ X).
    #[arg(long, value_name = "X", default_value_t = 1.0)]
    pub(crate) rate_scale: f64,
    /// Load levels: comma-separated rate scales (`0.5,1,2,4`), or `auto` to find the
    /// scales at which least_load's mean TTFT is each of --levels × its unloaded TTFT.
    /// Replaces --rate-scale.
    #[arg(long, value_name = "LIST|auto")]
    pub(crate) sweep_rate: Option<String>,
    /// Targets of `--sweep-rate auto`: least_load mean TTFT ÷ unloaded TTFT.
    #[arg(long, value_name = "LIST", default_value = "1.2,2,4,8")]
    pub(crate) levels: String,
    /// Rate scale of the unloaded reference run of `--sweep-rate auto`.
    #[arg(long, value_name = "X", default_value_t = 0.05)]
    pub(crate) unloaded_rate_scale: f64,
    /// Most bisection probes per level of `--sweep-rate auto`.
    #[arg(long, value_name = "N", default_value_t = 6)]
    pub(crate) bisect_iterations: usize,
    /// A level of `--sweep-rate auto` is found within this relative distance of its target.
    #[arg(long, value_name = "F", default_value_t = 0.05)]
    pub(crate) bisect_tolerance: f64,
    /// Live mode: run the simulated engines this many times faster than real time
    /// (arrivals are compressed alike; latencies are reported in engine time). Default 1.
    /// Fast mode runs in virtual time and ignores it.
    #[arg(long, value_name = "X")]
    pub(crate) speedup: Option<f64>,
    /// Policies to compare, comma-separated: kv_aware, linear_blocks, approx_prefix,
    /// least_load, power_of_two, round_robin, random, session_affinity.
    #[arg(long, value_name = "LIST", default_value = DEFAULT_POLICIES)]
    pub(crate) policies: String,
    /// Seed of every router (and of generated workloads, unless the spec sets one).
    #[arg(long, default_value_t = 42)]
    pub(crate) seed: u64,
    /// Simulated replicas.
    #[arg(long, value_name = "N", default_value_t = 8)]
    pub(crate) replicas: usize,
    /// Tokens per KV block.
    #[arg(long, default_value_t = 16)]
    pub(crate) block_size: u32,
    /// GPU KV blocks per replica (default: derived for Qwen3-32B on 2×H100, docs/sim.md).
    #[arg(long, value_name = "N")]
    pub(crate) num_gpu_blocks: Option<u32>,
    /// CPU offload blocks per replica (default: 4 × GPU blocks; 0: no CPU tier).
    #[arg(long, value_name = "N")]
    pub(crate) num_cpu_blocks: Option<u32>,
    /// Per-step token budget of each engine.
    #[arg(long, default_value_t = 8192)]
    pub(crate) max_num_batched_tokens: u32,
    /// Most running requests per engine.
    #[arg(long, default_value_t = 256)]
    pub(crate) max_num_seqs: u32,
    /// Engine timing preset: llmd_qwen3_32b, dynamo_mocker, vllm_cpu_tiny or vllm_cpu_gpu_like
    /// (the last two fitted to the real CPU engine's presets of docs/real-vllm.md).
    #[arg(long, default_value = "llmd_qwen3_32b")]
    pub(crate) timing: String,
    /// Delay between an engine step's end and its KV events reaching the index, ms.
    #[arg(long, value_name = "MS", default_value_t = 1.0)]
    pub(crate) event_delay_ms: f64,
    /// Runs in parallel (each run is single-threaded); default: the machine's cores.
    #[arg(long, value_name = "N")]
    pub(crate) jobs: Option<usize>,
    /// Write the report as JSON to FILE (`-`: stdout, and the table goes to stderr).
    #[arg(long, value_name = "FILE")]
    pub(crate) json: Option<PathBuf>,
    /// Write SVG charts into DIR.
    #[arg(long, value_name = "DIR")]
    pub(crate) plots: Option<PathBuf>,
    /// Live mode: replay against this running kvgate (`http://HOST:PORT`) instead of
    /// spawning kvgate and `kvgate sim` replicas. Its policy is its own: name it with
    /// a single --policies entry. Hit rate then comes from the responses' cached_tokens.
    #[arg(long, value_name = "URL")]
    pub(crate) target: Option<String>,
    /// Live mode with --target: the kvgate process id, to measure its ingress CPU (same machine).
    #[arg(long, value_name = "PID", requires = "target")]
    pub(crate) target_pid: Option<u32>,
    /// Live mode: client key for the target kvgate.
    #[arg(long, value_name = "KEY", env = "KVGATE_API_KEY", hide_env_values = true)]
    pub(crate) api_key: Option<String>,
    /// Live mode: most requests in flight at once from this client.
    #[arg(long, value_name = "N", default_value_t = 2048)]
    pub(crate) max_in_flight: usize,
    /// Live mode: the served model name sent in requests.
    #[arg(long, default_value = "Qwen/Qwen3-0.6B")]
    pub(crate) model: String,
    /// Live mode: kvgate instances to spawn in front of the engines, as a list of
    /// setups compared side by side: `1,3` runs one instance, then three sharing
    /// their bookings as peers; `3i` is three independent instances (no sharing).
    /// The client spreads requests over an setup's instances round-robin. With more
    /// than one setup, or any instance count above 1, runs are labelled
    /// `POLICY×N` (`POLICY×Ni` without sharing).
    #[arg(
        long,
        value_name = "LIST",
        default_value = "1",
        value_delimiter = ',',
        conflicts_with = "target"
    )]
    pub(crate) ingresses: Vec<String>,
    /// Override a router setting for every policy: `--set router.cost.work_weight=2`
    /// (keys of docs/config.md's `[router]`; repeatable). Live mode passes them to
    /// the spawned kvgate instances.
    #[arg(long = "set", value_name = "router.KEY=VALUE")]
    pub(crate) set: Vec<String>,
    /// Run the fixed acceptance suite instead of one workload: both Mooncake traces
    /// (from --suite-traces), synthetic chat, agentic and noreuse, each at least_load's
    /// --levels found by `--sweep-rate auto`, every --policies entry; prints one
    /// scoreboard of ratios to the best policy (--json: every report and the scoreboard).
    #[arg(long, conflicts_with_all = ["trace", "workload", "sweep_rate", "target"])]
    pub(crate) suite: bool,
    /// Directory holding mooncake_conversation_trace.jsonl and
    /// mooncake_synthetic_trace.jsonl for --suite.
    #[arg(long, value_name = "DIR", default_value = "../shared/traces")]
    pub(crate) suite_traces: PathBuf,
    /// Prefill/decode disaggregation (fast mode): this many prefill replicas. With
    /// --decode-replicas the fleet is P + D replicas (replacing --replicas); alone, the
    /// rest of --replicas decode. Runs kv_aware under each --disagg-modes entry on
    /// that split fleet and on the same replicas aggregated; docs/replay.md.
    #[arg(long, value_name = "N")]
    pub(crate) prefill_replicas: Option<usize>,
    /// Decode replicas of a prefill/decode fleet (needs --prefill-replicas).
    #[arg(long, value_name = "N", requires = "prefill_replicas")]
    pub(crate) decode_replicas: Option<usize>,
    /// Prefill-to-decode KV link bandwidth, GB/s (10^9 bytes; Dynamo's mocker
    /// assumes 64 for inter-node InfiniBand, ~450 for NVLink).
    #[arg(long, value_name = "GB/S", default_value_t = 64.0)]
    pub(crate) kv_bandwidth_gbps: f64,
    /// KV bytes per token of the served model (default: Qwen3-32B in bf16, 64 layers ×
    /// 8 KV heads × 128 × K and V × 2 bytes = 262,144).
    #[arg(long, value_name = "BYTES")]
    pub(crate) kv_bytes_per_token: Option<u64>,
    /// What a prefill/decode replay compares, comma-separated: aggregated (every
    /// replica serves whole requests), always (split every request), conditional
    /// (kvgate's plan by cost: split, or whole on a decode replica), conditional_on_prefill
    /// (the same, or whole on a prefill replica: `disagg.whole_on_prefill = true`),
    /// isl_bounding (Dynamo's rule: bypass iff the prompt's
    /// tokens not cached on the chosen decode replica are < 2048 and < 70% of it).
    #[arg(long, value_name = "LIST", default_value = "aggregated,always,conditional,isl_bounding")]
    pub(crate) disagg_modes: String,
}

/// The `--disagg-modes` entries.
pub(crate) fn parse_disagg_modes(list: &str) -> anyhow::Result<Vec<kvgate_replay::DisaggSetup>> {
    use kvgate_router::DisaggMode;
    let modes: Vec<_> = list
        .split(',')
        .filter(|m| !m.trim().is_empty())
        .map(|m| match m.trim() {
            "aggregated" => Ok(None),
            "always" => Ok(Some(DisaggMode::Always)),
            "conditional" => Ok(Some(DisaggMode::conditional())),
            "conditional_on_prefill" => {
                Ok(Some(DisaggMode::Conditional { whole_on_prefill: true }))
            }
            "isl_bounding" => Ok(Some(DisaggMode::dynamo_default())),
            other => bail!(
                "--disagg-modes: unknown mode {other:?}; expected aggregated, always, \
                 conditional, conditional_on_prefill or isl_bounding"
            ),
        })
        .collect::<anyhow::Result<_>>()?;
    if modes.is_empty() {
        bail!("--disagg-modes names no mode");
    }
    Ok(modes)
}

/// The prefill/decode split `args` asks for, if any.
fn disagg_spec(args: &ReplayArgs) -> anyhow::Result<Option<kvgate_replay::DisaggSpec>> {
    let Some(prefill) = args.prefill_replicas else { return Ok(None) };
    let total = args.decode_replicas.map_or(args.replicas, |d| prefill + d);
    if prefill == 0 || prefill >= total {
        bail!(
            "--prefill-replicas {prefill} of {total} replicas leaves no prefill or no decode \
             replica"
        );
    }
    if !(args.kv_bandwidth_gbps.is_finite() && args.kv_bandwidth_gbps > 0.0) {
        bail!("--kv-bandwidth-gbps must be a number > 0");
    }
    let bytes = args.kv_bytes_per_token.unwrap_or_else(|| {
        kvgate_replay::KvMemoryModel::qwen3_32b_tp2_h100().kv_bytes_per_token() as u64
    });
    if bytes == 0 {
        bail!("--kv-bytes-per-token must be at least 1");
    }
    Ok(Some(kvgate_replay::DisaggSpec {
        prefill,
        mode: kvgate_router::DisaggMode::conditional(),
        kv_bytes_per_token: bytes,
        bandwidth_bytes_per_s: args.kv_bandwidth_gbps * 1e9,
    }))
}

/// The router configuration with `--set` applied (only `router.` keys).
fn router_config(set: &[String]) -> anyhow::Result<RouterConfig> {
    if let Some(bad) = set.iter().find(|s| !s.trim_start().starts_with("router.")) {
        bail!("--set {bad:?}: replay takes router settings only (router.KEY=VALUE)");
    }
    let c = kvgate_gateway::GatewayConfig::from_toml_with_overrides("", set).context("--set")?;
    c.router.validate().context("--set")?;
    Ok(c.router)
}

/// One `--ingresses` entry: instance count and whether they share.
fn parse_ingresses(list: &[String]) -> anyhow::Result<Vec<(usize, bool)>> {
    list.iter()
        .map(|e| {
            let e = e.trim();
            let (n, sharing) = match e.strip_suffix('i') {
                Some(n) => (n, false),
                None => (e, true),
            };
            match n.parse::<usize>() {
                Ok(n) if (1..=16).contains(&n) => Ok((n, sharing)),
                _ => {
                    bail!("--ingresses: {e:?} is not a count in 1..=16, optionally followed by `i`")
                }
            }
        })
        .collect()
}

fn parse_list(s: &str, what: &str) -> anyhow::Result<Vec<f64>> {
    s.split(',')
        .filter(|x| !x.trim().is_empty())
        .map(|x| {
            let v: f64 =
                x.trim().parse().with_context(|| format!("{what}: {x:?} is not a number"))?;
            if !(v.is_finite() && v > 0.0) {
                bail!("{what}: {v} must be a number > 0");
            }
            Ok(v)
        })
        .collect()
}

pub(crate) fn load_workload(args: &ReplayArgs) -> anyhow::Result<Workload> {
    let mut w = match (&args.trace, &args.workload) {
        (Some(path), _) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?;
            let name = path
                .file_name()
                .map_or_else(|| path.display().to_string(), |n| n.to_string_lossy().into_owned());
            let format = match args.format {
                Format::Auto => detect_format(&text)?,
                Format::Mooncake => TraceFormat::Mooncake,
                Format::Messages => TraceFormat::Messages,
            };
            match format {
                TraceFormat::Mooncake => parse_mooncake(&text, args.strict, &name)?,
                TraceFormat::Messages => {
                    let tok = kvgate_tokenize::ChatTokenizer::bundled()
                        .context("loading the bundled Qwen3 tokenizer")?;
                    parse_messages(&text, args.strict, &name, &tok)?
                }
            }
        }
        (None, Some(spec)) => {
            let spec: SyntheticSpec = spec.parse()?;
            let explicit_seed = spec_sets_seed(args.workload.as_deref().unwrap_or(""));
            spec.generate((!explicit_seed).then_some(args.seed))
        }
        (None, None) => bail!("give a workload: --trace FILE or --workload synthetic:KIND"),
    };
    for e in w.skipped.iter().take(20) {
        eprintln!("kvgate replay: skipped {e}");
    }
    if w.skipped.len() > 20 {
        eprintln!("kvgate replay: ... and {} more skipped lines", w.skipped.len() - 20);
    }
    if let Some(n) = args.limit {
        w.truncate(n);
    }
    if w.requests.is_empty() {
        bail!("the workload has no requests");
    }
    Ok(w)
}

fn spec_sets_seed(spec: &str) -> bool {
    spec.split(',').any(|kv| kv.trim_start().starts_with("seed="))
}

fn fleet_spec(args: &ReplayArgs) -> anyhow::Result<FleetSpec> {
    let mut f = FleetSpec::acceptance();
    f.replicas = args.replicas;
    let timing = TimingModel::preset(&args.timing).with_context(|| {
        format!(
            "unknown timing preset {:?}; expected llmd_qwen3_32b, dynamo_mocker, vllm_cpu_tiny or vllm_cpu_gpu_like",
            args.timing
        )
    })?;
    f.engine.timing = timing;
    if args.block_size != f.engine.block_size {
        // Keep the KV memory, not the block count, when blocks change size.
        let tokens = u64::from(f.engine.num_gpu_blocks) * u64::from(f.engine.block_size);
        f.engine.num_gpu_blocks = (tokens / u64::from(args.block_size.max(1))) as u32;
        f.engine.block_size = args.block_size;
    }
    if let Some(n) = args.num_gpu_blocks {
        f.engine.num_gpu_blocks = n;
    }
    f.engine.num_cpu_blocks =
        args.num_cpu_blocks.unwrap_or(f.engine.num_gpu_blocks.saturating_mul(4));
    f.engine.max_num_batched_tokens = args.max_num_batched_tokens;
    f.engine.max_num_seqs = args.max_num_seqs;
    if !(args.event_delay_ms.is_finite() && args.event_delay_ms >= 0.0) {
        bail!("--event-delay-ms must be a number >= 0");
    }
    f.event_delay = std::time::Duration::from_secs_f64(args.event_delay_ms / 1000.0);
    f.engine.validate().map_err(|e| anyhow::anyhow!("invalid engine settings: {e}"))?;
    if f.replicas == 0 {
        bail!("--replicas must be at least 1");
    }
    Ok(f)
}

fn progress_bar(len: u64, what: &str) -> Progress {
    Progress::new(len, what)
}

/// One workload (or trace) through every policy; `--suite` is
/// `replay_suite::run_suite`, dispatched by `main`.
pub(crate) fn run(args: &ReplayArgs) -> anyhow::Result<()> {
    if args.mode == Mode::Fast && args.speedup.is_some() {
        eprintln!("kvgate replay: --speedup applies to live mode; fast mode runs in virtual time");
    }
    if args.mode == Mode::Fast && args.target.is_some() {
        bail!("--target needs --mode live");
    }
    let setups = parse_ingresses(&args.ingresses)?;
    if args.mode == Mode::Fast && setups != [(1, true)] {
        bail!("--ingresses needs --mode live");
    }
    let policies = parse_policies(&args.policies)?;
    let workload = load_workload(args)?;
    let report = replay_workload(args, &workload, &policies, &setups)?;
    let table = render_table(&report);
    match &args.json {
        Some(p) if p.as_os_str() == "-" => {
            eprint!("{table}");
            println!("{}", report.to_json());
        }
        Some(p) => {
            print!("{table}");
            std::fs::write(p, report.to_json() + "\n")
                .with_context(|| format!("writing {}", p.display()))?;
        }
        None => print!("{table}"),
    }
    if let Some(dir) = &args.plots {
        let files = write_plots(dir, &report)?;
        eprintln!("kvgate replay: wrote {} charts into {}", files.len(), dir.display());
    }
    Ok(())
}

/// The policies of `--policies`.
pub(crate) fn parse_policies(list: &str) -> anyhow::Result<Vec<PolicyKind>> {
    let policies: Vec<PolicyKind> = list
        .split(',')
        .filter(|p| !p.trim().is_empty())
        .map(|p| p.trim().parse::<PolicyKind>())
        .collect::<Result<_, _>>()?;
    if policies.is_empty() {
        bail!("--policies names no policy");
    }
    Ok(policies)
}

/// Replays one workload at the levels `args` asks for, under every policy.
pub(crate) fn replay_workload(
    args: &ReplayArgs,
    workload: &Workload,
    policies: &[PolicyKind],
    setups: &[(usize, bool)],
) -> anyhow::Result<Report> {
    // One pool per model the workload names, and its adapter slots: every
    // policy runs on this same fleet, behind the same model filter.
    let pooled = wants_pools(workload);
    if pooled && args.mode == Mode::Live {
        bail!("model pools and LoRA adapters replay in fast mode only");
    }
    let mut fleet = fleet_spec(args)?;
    let disagg = disagg_spec(args)?;
    if let Some(d) = &disagg {
        if pooled {
            bail!("a prefill/decode replay serves one model: no model pools or adapters");
        }
        if args.mode == Mode::Live {
            bail!("prefill/decode fleets replay in fast mode only");
        }
        fleet.replicas = args.decode_replicas.map_or(args.replicas, |n| d.prefill + n);
    }
    let fleet = if pooled {
        fleet.for_workload(workload).map_err(|e| anyhow::anyhow!("{e} (--replicas)"))?
    } else {
        fleet
    };
    let jobs = args
        .jobs
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .max(1);
    let router = router_config(&args.set)?;
    let opts = RunOptions { fleet: fleet.clone(), router, seed: args.seed, jobs };
    let n = workload.requests.len() as u64;

    let floor = FloorModel {
        timing: fleet.engine.timing.clone(),
        max_num_batched_tokens: fleet.engine.max_num_batched_tokens,
    };
    let bounds = oracle_hit_rates(
        workload,
        fleet.engine.block_size as usize,
        fleet.total_blocks() as usize,
        Some(&floor),
    );
    let (scales, levels) = match args.sweep_rate.as_deref() {
        Some("auto") if args.mode == Mode::Live => {
            bail!("--sweep-rate auto runs in fast mode only; give live mode a list of scales")
        }
        Some("auto") => {
            let targets = parse_list(&args.levels, "--levels")?;
            let pb = progress_bar(0, "finding load levels (least_load)");
            let inc = |k: u64| {
                pb.inc_length(k);
                pb.inc(k);
            };
            let search = find_load_levels(
                workload,
                &opts,
                &targets,
                args.unloaded_rate_scale,
                args.bisect_iterations,
                args.bisect_tolerance,
                &inc,
            )?;
            pb.finish_and_clear();
            (search.levels.iter().map(|l| l.rate_scale).collect(), Some(search))
        }
        Some(list) => (parse_list(list, "--sweep-rate")?, None),
        None => {
            if !(args.rate_scale.is_finite() && args.rate_scale > 0.0) {
                bail!("--rate-scale must be a number > 0");
            }
            (vec![args.rate_scale], None)
        }
    };
    let pools = pooled.then(|| pool_bounds(workload, &fleet));
    let pb = progress_bar(n * (scales.len() * policies.len() * setups.len()) as u64, "replaying");
    let mut pool_runs = Vec::new();
    let runs = match (args.mode, &disagg) {
        (Mode::Fast, Some(d)) => {
            let setups = parse_disagg_modes(&args.disagg_modes)?;
            pb.set_length(n * (scales.len() * setups.len()) as u64);
            let inc = |k: u64| pb.inc(k);
            kvgate_replay::run_disagg_matrix(workload, &setups, d, &scales, &opts, bounds, &inc)?
        }
        (Mode::Fast, None) => {
            let inc = |k: u64| pb.inc(k);
            let runs = run_matrix_pools(
                workload,
                policies,
                &scales,
                &opts,
                bounds,
                pools.as_deref(),
                &inc,
            )?;
            let (runs, p): (Vec<_>, Vec<_>) = runs.into_iter().unzip();
            pool_runs = p;
            runs
        }
        (Mode::Live, _) => {
            if args.target.is_some() && policies.len() != 1 {
                bail!("with --target the running kvgate's policy is used: name it with one --policies entry");
            }
            let live = LiveOptions {
                kvgate_bin: std::env::current_exe()
                    .context("cannot find the kvgate executable to spawn")?,
                target: args.target.clone(),
                target_pid: args.target_pid,
                api_key: args.api_key.clone(),
                speedup: args.speedup.unwrap_or(1.0),
                timing: args.timing.clone(),
                max_in_flight: args.max_in_flight.max(1),
                model: args.model.clone(),
                ingresses: 1,
                peer_sharing: true,
                set: args.set.clone(),
            };
            let label = setups.len() > 1 || setups.iter().any(|s| s.0 > 1);
            let mut runs = Vec::new();
            for &scale in &scales {
                for policy in policies {
                    for &(ingresses, peer_sharing) in setups {
                        let base = pb.position();
                        let set = |k: u64| pb.set_position(base + k);
                        let run = LiveRun {
                            workload,
                            spec: &fleet,
                            policy: policy.name(),
                            seed: args.seed,
                            rate_scale: scale,
                            bounds,
                        };
                        let opts = LiveOptions { ingresses, peer_sharing, ..live.clone() };
                        let mut summary = run_live(run, &opts, &set)?;
                        if label {
                            let mark = if peer_sharing || ingresses == 1 { "" } else { "i" };
                            summary.policy = format!("{}×{ingresses}{mark}", policy.name());
                        }
                        runs.push(summary);
                    }
                }
            }
            runs
        }
    };
    pb.finish_and_clear();

    let report = Report::new(
        args.seed,
        WorkloadInfo::of(workload),
        &fleet,
        (bounds.oracle, bounds.ceiling),
        levels,
        runs,
    );
    Ok(match pools {
        Some(p) => report.with_pools(p, pool_runs),
        None => report,
    })
}
