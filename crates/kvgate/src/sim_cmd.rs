//! `kvgate sim`: N simulated vLLM engines in one process, each with vLLM's
//! HTTP API on its own port and, optionally, KV events and replay on
//! consecutive ports.

use std::sync::Arc;

use anyhow::{bail, Context};
use kvgate_events::publisher::PublisherConfig;
use kvgate_events::Layout;
use kvgate_sim::server::{
    runtime_lora_updating_from_env, start, Faults, KvTransferConfig, LoraModule, ServerConfig,
};
use kvgate_sim::{EngineConfig, TimingModel};
use kvgate_tokenize::service::{Tokenize, TokenizeService};
use kvgate_tokenize::ChatTokenizer;
use tokio::net::TcpListener;

use crate::cli::SimArgs;

/// `v0.11`, `0.11`, `v0.26`, `map`, `map-batch`.
pub(crate) fn parse_layout(name: &str) -> Option<Layout> {
    let name = name.strip_prefix('v').unwrap_or(name);
    match name {
        "map" => Some(Layout::MapBatch),
        _ => Layout::from_name(name),
    }
}

/// `tcp://HOST:PORT` with PORT + `offset` (vLLM's rule); other endpoints
/// only for one replica.
pub(crate) fn offset_endpoint(endpoint: &str, offset: u16) -> anyhow::Result<String> {
    kvgate_events::offset_endpoint_port(endpoint, u32::from(offset)).map_err(anyhow::Error::msg)
}

pub(crate) async fn run(args: SimArgs) -> anyhow::Result<()> {
    let layout = parse_layout(&args.event_layout).with_context(|| {
        format!("unknown --event-layout {} (v0.11, v0.26, map)", args.event_layout)
    })?;
    let timing = TimingModel::preset(&args.timing).with_context(|| {
        format!(
            "unknown --timing {} (dynamo_mocker, llmd_qwen3_32b, vllm_cpu_tiny, vllm_cpu_gpu_like)",
            args.timing
        )
    })?;
    if args.replicas == 0 {
        bail!("--replicas must be at least 1");
    }
    let lora_modules = args
        .lora_modules
        .iter()
        .map(|m| LoraModule::parse(m).map_err(anyhow::Error::msg))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let env = std::env::var("VLLM_ALLOW_RUNTIME_LORA_UPDATING").ok();
    let allow_runtime_lora_updating =
        args.allow_runtime_lora_updating || runtime_lora_updating_from_env(env.as_deref());
    // On a thread that exits, then purged, as `serve` does (kvgate-alloc):
    // the load's temporaries do not stay resident.
    let tokenizer = kvgate_alloc::on_exiting_thread("kvgate-load", ChatTokenizer::bundled)
        .context("starting the tokenizer load")?
        .context("loading the bundled Qwen3 tokenizer")?;
    kvgate_alloc::release_free_memory(true);
    let tokenizer = Arc::new(TokenizeService::new(Tokenize::new(tokenizer, None), 2)?);
    if !(args.kv_transfer_bandwidth.is_finite() && args.kv_transfer_bandwidth > 0.0) {
        bail!("--kv-transfer-bandwidth must be a number > 0");
    }
    if args.kv_bytes_per_token == 0 {
        bail!("--kv-bytes-per-token must be at least 1");
    }
    let mut replicas = Vec::new();
    for i in 0..args.replicas {
        let kv_transfer = args
            .kv_transfer_config
            .as_deref()
            .map(|json| {
                KvTransferConfig::from_vllm_json(
                    json,
                    &format!("sim-engine-{}-{i}", std::process::id()),
                    args.kv_bytes_per_token,
                    args.kv_transfer_bandwidth * 1e9,
                )
            })
            .transpose()
            .map_err(anyhow::Error::msg)?;
        let engine = EngineConfig {
            block_size: args.block_size,
            num_gpu_blocks: args.num_gpu_blocks,
            num_cpu_blocks: args.num_cpu_blocks,
            max_num_seqs: args.max_num_seqs,
            max_num_batched_tokens: args.max_num_batched_tokens,
            hash_seed: args.hash_seed,
            hash_bytes: args.hash_bytes,
            timing: timing.clone(),
            self_describing_cpu_events: args.self_describing_cpu_events,
            cpu_chunk_blocks: args.cpu_chunk_blocks,
            max_loras: args.max_loras,
            lora_load_ms: args.lora_load_ms,
            ..EngineConfig::default()
        };
        let events = match &args.events {
            Some(ep) => {
                // Each replica's ranks take the next `data_parallel_size`
                // ports (rank r of replica i: port + i*k + r).
                let ranks =
                    u16::try_from(args.data_parallel_size).context("--data-parallel-size")?;
                let first = i.checked_mul(ranks).context("port overflow")?;
                let mut pc = PublisherConfig::new(offset_endpoint(ep, first)?);
                pc.replay_endpoint =
                    args.replay.as_deref().map(|r| offset_endpoint(r, first)).transpose()?;
                pc.topic = args.topic.clone();
                pc.buffer_steps = args.buffer_steps;
                pc.layout = layout;
                pc.drop_rate = args.drop_event_batches;
                pc.drop_seed = u64::from(i);
                pc.replay_delay = std::time::Duration::from_millis(args.replay_delay_ms);
                pc.force_bind = args.bind_events;
                Some(pc)
            }
            None if args.replay.is_some() => bail!("--replay needs --events"),
            None => None,
        };
        let config = ServerConfig {
            engine,
            model: args.model.clone(),
            served_model_names: args.served_model_names.clone(),
            lora_adapters: args.lora_adapters.clone(),
            lora_modules: lora_modules.clone(),
            allow_runtime_lora_updating,
            data_parallel_size: args.data_parallel_size,
            speedup: args.speedup,
            api_key: args.api_key.clone(),
            events,
            default_max_tokens: args.default_max_tokens,
            kv_transfer,
            faults: Faults {
                fail_rate: args.fail_rate,
                fail_seed: u64::from(i),
                stall_after_tokens: args.stall_after_tokens,
                exit_after_requests: args.exit_after_requests,
            },
        };
        let port = args.port.checked_add(i).context("port overflow")?;
        let port = if args.port == 0 { 0 } else { port };
        let listener = TcpListener::bind((args.host.as_str(), port))
            .await
            .with_context(|| format!("binding {}:{port}", args.host))?;
        let replica = start(config, listener, Arc::clone(&tokenizer))
            .await
            .with_context(|| format!("starting replica {i}"))?;
        let ev = match replica.events() {
            Some(e) => {
                format!(" events={} replay={}", e.events, e.replay.as_deref().unwrap_or("-"))
            }
            None => String::new(),
        };
        println!("replica {i}: http={}{ev}", replica.url());
        replicas.push(replica);
    }
    let exited = futures_util::future::select_all(replicas.iter().map(|r| Box::pin(r.exited())));
    tokio::select! {
        res = tokio::signal::ctrl_c() => res.context("waiting for ctrl-c")?,
        _ = exited => {
            eprintln!("kvgate sim: exiting after --exit-after-requests {}", args.exit_after_requests.unwrap_or(0));
            std::process::exit(3);
        }
    }
    for r in replicas {
        r.shutdown().await;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_and_endpoints() {
        assert_eq!(parse_layout("v0.11"), Some(Layout::V0_11));
        assert_eq!(parse_layout("0.26"), Some(Layout::V0_26));
        assert_eq!(parse_layout("map"), Some(Layout::MapBatch));
        assert_eq!(parse_layout("v9"), None);
        assert_eq!(offset_endpoint("tcp://*:5557", 2).unwrap(), "tcp://*:5559");
        assert_eq!(offset_endpoint("tcp://*:0", 2).unwrap(), "tcp://*:0");
        assert_eq!(offset_endpoint("tcp://[::1]:10", 1).unwrap(), "tcp://[::1]:11");
        assert!(offset_endpoint("ipc:///tmp/x", 1).is_err());
    }
}
