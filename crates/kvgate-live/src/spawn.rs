//! The fleet a live run spawns: one `kvgate sim` process holding every
//! replica, and `kvgate serve` instances in front of it, on a run of free
//! loopback ports; every process is killed when the run ends.

use std::process::{Child, Command, Stdio};

use kvgate_replay::FleetSpec;

use crate::{LiveError, LiveOptions};

/// Processes spawned for one run, killed on drop.
pub(crate) struct Spawned {
    children: Vec<Child>,
}

impl Drop for Spawned {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Picks `n` consecutive free loopback ports (held while checking).
fn free_port_run(n: usize) -> Result<u16, LiveError> {
    for attempt in 0..200u32 {
        let start = 20_000 + ((std::process::id() * 7919 + attempt * 613) % 40_000) as u16;
        let held: Vec<_> = (0..n as u16)
            .map_while(|i| std::net::TcpListener::bind(("127.0.0.1", start.checked_add(i)?)).ok())
            .collect();
        if held.len() == n {
            return Ok(start);
        }
    }
    Err(LiveError::NoPorts(n))
}

/// What `spawn_fleet` started: kvgate base URLs, engine URLs, kvgate pids,
/// and the processes (killed on drop).
pub(crate) type Fleet = (Vec<String>, Vec<String>, Vec<u32>, Spawned);

/// The peer key of spawned instances: only they and loopback see it.
const LIVE_PEER_KEY: &str = "kvgate-replay-live-peer-key";

pub(crate) fn spawn_fleet(
    spec: &FleetSpec,
    policy: &str,
    seed: u64,
    longest: u64,
    opts: &LiveOptions,
) -> Result<Fleet, LiveError> {
    let exe = &opts.kvgate_bin;
    let n = spec.replicas;
    let k = opts.ingresses.max(1);
    // HTTP, events and replay ports for every replica, then three per
    // kvgate instance (API, admin, peers).
    let first = free_port_run(3 * n + 3 * k)?;
    let (http, events, replay) = (first, first + n as u16, first + 2 * n as u16);
    let gw_port = |i: usize, which: u16| first + 3 * n as u16 + 3 * i as u16 + which;
    let e = &spec.engine;
    let mut sim = Command::new(exe);
    sim.arg("sim")
        .args(["--replicas", &n.to_string(), "--port", &http.to_string()])
        .args(["--events", &format!("tcp://127.0.0.1:{events}"), "--bind-events"])
        .args(["--replay", &format!("tcp://127.0.0.1:{replay}")])
        .args(["--block-size", &e.block_size.to_string()])
        .args(["--num-gpu-blocks", &e.num_gpu_blocks.to_string()])
        .args(["--num-cpu-blocks", &e.num_cpu_blocks.to_string()])
        .args(["--max-num-seqs", &e.max_num_seqs.to_string()])
        .args(["--max-num-batched-tokens", &e.max_num_batched_tokens.to_string()])
        .args(["--timing", &opts.timing, "--speedup", &opts.speedup.to_string()])
        .args(["--model", &opts.model, "--log", "warn"]);
    if let Some(s) = e.hash_seed {
        sim.args(["--hash-seed", &s.to_string()]);
    }
    let mut spawned = Spawned { children: Vec::new() };
    spawned.children.push(
        sim.stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|source| LiveError::Spawn { what: "kvgate sim", source })?,
    );
    let engines: Vec<String> =
        (0..n as u16).map(|i| format!("http://127.0.0.1:{}", http + i)).collect();
    let (mut bases, mut pids) = (Vec::new(), Vec::new());
    for g in 0..k {
        let mut gw = Command::new(exe);
        gw.arg("serve")
            .args(["--listen", &format!("127.0.0.1:{}", gw_port(g, 0))])
            .args(["--admin-listen", &format!("127.0.0.1:{}", gw_port(g, 1))])
            .args(["--log", "warn"])
            .args(["--set", &format!("router.policy={policy}")])
            .args(["--set", &format!("router.seed={}", seed + g as u64)])
            .args(["--set", &format!("model.served_name={}", opts.model)])
            .args(["--set", &format!("model.max_model_len={}", longest.max(1) + 1)]);
        for o in &opts.set {
            gw.args(["--set", o]);
        }
        for (i, url) in engines.iter().enumerate() {
            let i = i as u16;
            gw.args([
                "--replica",
                &format!(
                    "{url},events=tcp://127.0.0.1:{},replay=tcp://127.0.0.1:{},block_size={}",
                    events + i,
                    replay + i,
                    e.block_size
                ),
            ]);
        }
        if k > 1 && opts.peer_sharing {
            gw.args(["--peer-listen", &format!("127.0.0.1:{}", gw_port(g, 2))])
                .args(["--peer-key", LIVE_PEER_KEY]);
            for other in (0..k).filter(|&o| o != g) {
                gw.args(["--peer", &format!("http://127.0.0.1:{}", gw_port(other, 2))]);
            }
        }
        let child = gw
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|source| LiveError::Spawn { what: "kvgate serve", source })?;
        pids.push(child.id());
        spawned.children.push(child);
        bases.push(format!("http://127.0.0.1:{}", gw_port(g, 0)));
    }
    Ok((bases, engines, pids, spawned))
}
