//! `kvgate serve`: builds the gateway config (file, then `--set`, then
//! flags and their `KVGATE_*` variables), starts simulated replicas when
//! none are configured, runs the gateway until SIGTERM or ctrl-c, and shuts
//! it down gracefully.

use std::sync::Arc;

use anyhow::Context;
use kvgate_events::publisher::{loopback_endpoint, PublisherConfig};
use kvgate_gateway::config::ModelConfig;
use kvgate_gateway::{Gateway, GatewayConfig, ReplicaConfig};
use kvgate_sim::server::{start, Replica, ServerConfig};
use kvgate_sim::{EngineConfig, TimingModel};
use kvgate_tokenize::service::{Tokenize, TokenizeService};
use kvgate_tokenize::ChatTokenizer;
use tokio::net::TcpListener;

use crate::cli::{EppArgs, GatewayArgs, ServeArgs};

/// `kvgate serve`'s effective configuration.
pub(crate) fn config(args: &ServeArgs) -> anyhow::Result<GatewayConfig> {
    config_with(&args.gateway, |c| {
        if let Some(a) = args.listen {
            c.listen = a;
        }
    })
}

/// `kvgate epp`'s: `serve`'s, with the gRPC listener always on.
pub(crate) fn epp_config(args: &EppArgs) -> anyhow::Result<GatewayConfig> {
    config_with(&args.gateway, |c| {
        if let Some(a) = args.http_listen {
            c.listen = a;
        }
        c.epp.listen =
            args.listen.or(c.epp.listen).or(Some(kvgate_gateway::config::DEFAULT_EPP_LISTEN));
    })
}

/// The file, then `--set`, then `edit` (the command's listeners), then the
/// shared flags; validated once.
fn config_with(
    args: &GatewayArgs,
    edit: impl FnOnce(&mut GatewayConfig),
) -> anyhow::Result<GatewayConfig> {
    let text = match &args.config {
        Some(p) => {
            std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?
        }
        None => String::new(),
    };
    let mut c = GatewayConfig::from_toml_with_overrides(&text, &args.set).with_context(|| {
        args.config.as_ref().map_or_else(|| "--set".to_owned(), |p| p.display().to_string())
    })?;
    edit(&mut c);
    if let Some(a) = args.admin_listen {
        c.admin_listen = Some(a);
    }
    if let Some(a) = args.metrics_listen {
        c.metrics_listen = Some(a);
    }
    if !args.replicas.is_empty() {
        c.replicas = args
            .replicas
            .iter()
            .filter(|s| !s.trim().is_empty())
            .map(|s| ReplicaConfig::parse_spec(s))
            .collect::<Result<_, _>>()?;
    }
    if let Some(p) = &args.policy {
        c.router.policy = p.parse()?;
    }
    if let Some(d) = &args.model_dir {
        c.model.dir = Some(d.clone());
    }
    if let Some(n) = &args.served_model_name {
        c.model.served_name = n.clone();
    }
    if !args.api_keys.is_empty() {
        c.auth.api_keys = args.api_keys.iter().filter(|k| !k.is_empty()).cloned().collect();
    }
    if let Some(k) = &args.admin_key {
        c.auth.admin_key = Some(k.clone());
    }
    if args.allow_unauthenticated {
        c.auth.allow_unauthenticated = true;
    }
    if let Some(n) = args.sim_replicas {
        c.embedded_sims.replicas = n;
    }
    if !args.peers.is_empty() {
        c.peers.urls = args.peers.iter().filter(|u| !u.trim().is_empty()).cloned().collect();
    }
    if let Some(d) = &args.peer_dns {
        c.peers.dns = Some(d.clone());
    }
    if let Some(a) = args.peer_listen {
        c.peers.listen = Some(a);
    }
    if let Some(k) = &args.peer_key {
        c.peers.key = Some(k.clone());
    }
    if let Some(u) = &args.peer_nats {
        c.peers.nats.url = Some(u.clone());
    }
    if let Some(s) = &args.peer_nats_subject {
        c.peers.nats.subject = s.clone();
    }
    if let Some(t) = &args.peer_nats_token {
        c.peers.nats.token = Some(t.clone());
    }
    if let Some(u) = &args.peer_nats_user {
        c.peers.nats.user = Some(u.clone());
    }
    if let Some(p) = &args.peer_nats_password {
        c.peers.nats.password = Some(p.clone());
    }
    if let Some(k) = &args.affinity_key {
        c.auth.affinity_key = Some(k.clone());
    }
    if let Some(d) = &args.discover_dns {
        c.discovery.dns = Some(d.clone());
    }
    if let Some(k) = &args.engine_api_key {
        // The flag is the fleet-wide default: every pool's discovery that
        // names no key of its own uses it too.
        c.discovery.api_key = Some(k.clone());
        for p in &mut c.pools {
            if p.discovery.api_key.is_none() {
                p.discovery.api_key = Some(k.clone());
            }
        }
    }
    c.validate()?;
    Ok(c)
}

/// Starts one pool's embedded simulated fleet on loopback (serving `model`,
/// its replicas named `prefix-i`) and returns it with the replica entries
/// that point at it.
async fn embedded_fleet(
    c: &GatewayConfig,
    model: &ModelConfig,
    prefix: &str,
) -> anyhow::Result<(Vec<Replica>, Vec<ReplicaConfig>)> {
    let s = &c.embedded_sims;
    let timing = TimingModel::preset(&s.timing)
        .with_context(|| format!("unknown embedded_sims.timing {:?}", s.timing))?;
    let tokenizer = ChatTokenizer::bundled().context("loading the bundled Qwen3 tokenizer")?;
    let tokenizer = Arc::new(TokenizeService::new(Tokenize::new(tokenizer, None), 1)?);
    let mut sims = Vec::new();
    let mut replicas = Vec::new();
    for i in 0..s.replicas {
        let mut events = PublisherConfig::new("tcp://127.0.0.1:0");
        // Loopback only: bind where vLLM's rule would connect.
        events.force_bind = true;
        events.replay_endpoint = Some("tcp://127.0.0.1:0".into());
        let config = ServerConfig {
            engine: EngineConfig {
                num_gpu_blocks: s.num_gpu_blocks,
                timing: timing.clone(),
                ..EngineConfig::default()
            },
            model: model.served_name.clone(),
            lora_adapters: model.lora_adapters.clone(),
            // kvgate may load `model.loadable_adapters` at runtime.
            allow_runtime_lora_updating: !model.loadable_adapters.is_empty(),
            data_parallel_size: 1,
            speedup: s.speedup,
            api_key: None,
            events: Some(events),
            default_max_tokens: s.default_max_tokens,
            ..ServerConfig::default()
        };
        let listener =
            TcpListener::bind("127.0.0.1:0").await.context("binding a simulated replica")?;
        let sim = start(config, listener, Arc::clone(&tokenizer))
            .await
            .with_context(|| format!("starting simulated replica {i}"))?;
        let mut r = ReplicaConfig::new(sim.url());
        r.name = Some(format!("{prefix}-{i}"));
        if let Some(ep) = sim.events() {
            r.events = Some(loopback_endpoint(&ep.events));
            r.replay = ep.replay.as_deref().map(loopback_endpoint);
        }
        replicas.push(r);
        sims.push(sim);
    }
    Ok((sims, replicas))
}

fn log_embedded(config: &GatewayConfig, pool: &str, r: &[ReplicaConfig]) {
    tracing::info!(
        pool,
        replicas = r.len(),
        timing = %config.embedded_sims.timing,
        urls = ?r.iter().map(|x| x.url.as_str()).collect::<Vec<_>>(),
        "no replicas configured: started simulated vLLM replicas (kvgate-sim) on loopback with the bundled Qwen3 tokenizer"
    );
}

/// Holds the configured listen addresses (fixed ports only) while the
/// embedded simulated replicas bind theirs: those take ephemeral loopback
/// ports, and without the hold one could take the port the gateway is
/// about to listen on (seen in CI: `cannot listen on 127.0.0.1:44423`, the
/// port of a replica the same process had just started). A port already in
/// use fails here, before any replica starts.
fn hold_listen_ports(config: &GatewayConfig) -> anyhow::Result<Vec<std::net::TcpListener>> {
    let addrs = [
        Some(config.listen),
        config.admin_listen,
        config.metrics_listen,
        config.peers.listen,
        config.epp.listen,
    ];
    addrs
        .into_iter()
        .flatten()
        .filter(|a| a.port() != 0)
        .map(|a| std::net::TcpListener::bind(a).with_context(|| format!("cannot listen on {a}")))
        .collect()
}

pub(crate) async fn run(mut config: GatewayConfig) -> anyhow::Result<()> {
    let mut sims = Vec::new();
    let held = hold_listen_ports(&config)?;
    if config.pools.is_empty() {
        if config.replicas.is_empty() && config.discovery.dns.is_none() {
            let model = config.model.clone();
            let (s, r) = embedded_fleet(&config, &model, "sim").await?;
            log_embedded(&config, "default", &r);
            config.replicas = r;
            sims = s;
        }
    } else {
        // Each pool without engines gets its own simulated ones.
        for i in 0..config.pools.len() {
            let p = &config.pools[i];
            if !p.replicas.is_empty() || p.discovery.dns.is_some() {
                continue;
            }
            let (name, model) = (p.display_name().to_owned(), p.model.clone());
            let (s, r) = embedded_fleet(&config, &model, &format!("sim-{name}")).await?;
            log_embedded(&config, &name, &r);
            config.pools[i].replicas = r;
            sims.extend(s);
        }
    }
    let release = config.memory_release_ms > 0;
    drop(held);
    let gateway = Gateway::start(config).await?;
    // Loading the tokenizer freed its JSON parse (~200 MB); give it back
    // now rather than leave it resident until traffic starts.
    if release {
        kvgate_alloc::release_free_memory(true);
    }
    if let Some(epp) = gateway.epp_addr() {
        println!("kvgate endpoint picker (ext_proc gRPC) on {epp}");
    }
    println!(
        "kvgate serving on http://{} (admin: {}) with {} replicas",
        gateway.local_addr(),
        gateway
            .admin_addr()
            .map_or_else(|| "on the API address".to_owned(), |a| format!("http://{a}")),
        gateway.replica_names().len()
    );
    wait_for_signal().await?;
    tracing::info!("shutting down: draining in-flight requests");
    let left = gateway.shutdown().await;
    if left > 0 {
        tracing::warn!(left, "requests still in flight at the end of the grace period");
    }
    for s in sims {
        s.shutdown().await;
    }
    Ok(())
}

async fn wait_for_signal() -> anyhow::Result<()> {
    #[cfg(unix)]
    {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .context("installing the SIGTERM handler")?;
        tokio::select! {
            r = tokio::signal::ctrl_c() => r.context("waiting for ctrl-c")?,
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    tokio::signal::ctrl_c().await.context("waiting for ctrl-c")?;
    Ok(())
}
