//! `kvgate`: the one binary. A thin shell over the library crates: it parses
//! flags, sets up logging and a runtime, and hands off to one subcommand.

mod cli;
mod config_file;
mod events_tail;
mod progress;
mod replay_cmd;
mod replay_suite;
mod serve_cmd;
mod sim_cmd;
mod telemetry;
mod tokenize_cmd;

use clap::Parser;

fn main() -> std::process::ExitCode {
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            // One line with the whole cause chain; no backtrace for operators.
            eprintln!("kvgate: error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// How often an idle `kvgate sim` hands free memory back to the OS (serve:
/// `memory_release_ms`, same default). mimalloc itself waits 1 s after a
/// free before purging; checking every 2 s bounds the wait to about 3 s and
/// costs one cheap call per tick.
const RELEASE_PERIOD: std::time::Duration = std::time::Duration::from_secs(2);

fn run() -> anyhow::Result<()> {
    // fastokens spreads one long input over a pool of its own threads that
    // spin between jobs; kvgate already runs one tokenizer thread per core,
    // each on its own request, so that would only add threads and spinning.
    // Set before any thread starts; an operator's own setting wins.
    if std::env::var_os("FASTOKENS_BPE_THREADS").is_none() {
        std::env::set_var("FASTOKENS_BPE_THREADS", "1");
    }
    let cli = with_config_file(cli::Cli::parse())?;
    let _telemetry = telemetry::init(&telemetry::Options {
        filter: cli.log.as_deref(),
        format: cli.log_format,
        otlp_endpoint: cli.otlp_endpoint.as_deref(),
        otlp_protocol: cli.otlp_protocol,
    })?;
    // Long-running commands give freed memory back when they go quiet
    // (kvgate-alloc: mimalloc purges only while something allocates).
    // (`serve` takes its period from its config: `memory_release_ms`.)
    let _releaser = match cli.command {
        cli::Command::Sim(_) => Some(kvgate_alloc::Releaser::start(RELEASE_PERIOD)?),
        _ => None,
    };
    match cli.command {
        cli::Command::Events(cli::EventsCommand::Tail(args)) => {
            let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
            runtime.block_on(events_tail::run(args))
        }
        cli::Command::Tokenize(args) => tokenize_cmd::run(&args),
        cli::Command::Sim(args) => {
            let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
            runtime.block_on(sim_cmd::run(*args))
        }
        cli::Command::Replay(args) if args.suite => replay_suite::run_suite(&args),
        cli::Command::Replay(args) => replay_cmd::run(&args),
        cli::Command::Serve(args) => {
            let config = serve_cmd::config(&args)?;
            gateway(config, args.gateway.print_config)
        }
        cli::Command::Epp(args) => {
            let config = serve_cmd::epp_config(&args)?;
            gateway(config, args.gateway.print_config)
        }
    }
}

/// `serve` and `epp`: print the configuration, or run the gateway on a
/// runtime sized by it.
fn gateway(config: kvgate_gateway::GatewayConfig, print_config: bool) -> anyhow::Result<()> {
    if print_config {
        println!(
            "# secrets (auth.api_keys, auth.admin_key, peers.key, peers.nats.token, \
             peers.nats.password, discovery.api_key, replicas' api_key) are left out: give them by flag or KVGATE_* variable"
        );
        print!("{}", toml::to_string(&config.resolved().without_secrets())?);
        return Ok(());
    }
    let _releaser =
        kvgate_alloc::Releaser::start(std::time::Duration::from_millis(config.memory_release_ms))?;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(config.runtime_threads(cores))
        .enable_all()
        .build()?;
    runtime.block_on(serve_cmd::run(config))
}

/// Re-parses the command line with `--config FILE` expanded into flags
/// (see `config_file`), so that the file is validated like the flags are.
fn with_config_file(cli: cli::Cli) -> anyhow::Result<cli::Cli> {
    let cli::Command::Sim(args) = &cli.command else { return Ok(cli) };
    let Some(path) = &args.config else { return Ok(cli) };
    let file_flags = config_file::flags_from_file(path)?;
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let Some(at) = argv.iter().position(|a| a == "sim") else { return Ok(cli) };
    let expanded = config_file::expand(&argv, at, file_flags);
    cli::Cli::try_parse_from(expanded).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
}
