//! `kvgate replay --mode live`: the workload in real time, over HTTP, through
//! a real `kvgate serve` in front of real `kvgate sim` processes (spawned
//! here, one fresh fleet per policy so that every policy starts from empty
//! caches), or through a kvgate that is already running (`--target`).
//!
//! What it measures, and how:
//! - latencies at the client: time to the first streamed token, mean gap
//!   between tokens, arrival to the last token. The engines run `--speedup`
//!   times faster than their timing model and arrivals are compressed by the
//!   same factor, so the load is the one fast mode simulates; latencies are
//!   multiplied back by the speedup to read in engine time, like fast mode's
//!   (which also multiplies kvgate's own sub-millisecond overhead: documented);
//! - the hit rate from the engines' own counters (`vllm:prefix_cache_*` plus
//!   the connector's `vllm:external_prefix_cache_hits_total` for the CPU
//!   tier), before and after the run; against `--target`, whose engines are
//!   unknown here, from the `cached_tokens` each response reports;
//! - ingress CPU per request: the kvgate process's CPU time over the run
//!   (all threads, `/proc/PID/task/*/schedstat`, read while idle), minus its
//!   idle rate measured just before, ÷ requests;
//! - decision time from kvgate's `kvgate_decide_seconds` histogram.

use std::collections::HashMap;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use futures_util::StreamExt;
use kvgate_replay::{
    max_over_mean, Distribution, FleetSpec, LoadSample, OracleHitRates, RunSummary, Workload,
};

/// How live mode reaches (or builds) its fleet.
#[derive(Debug, Clone)]
pub(crate) struct LiveOptions {
    /// A running kvgate (`http://HOST:PORT`); `None` spawns kvgate + sims.
    pub(crate) target: Option<String>,
    /// The kvgate process to charge ingress CPU to, with `target`.
    pub(crate) target_pid: Option<u32>,
    /// Client key for kvgate, if it requires one.
    pub(crate) api_key: Option<String>,
    /// Engines run this many times faster than real time.
    pub(crate) speedup: f64,
    /// Timing preset of the spawned engines.
    pub(crate) timing: String,
    /// Most requests in flight at once (the client's own bound).
    pub(crate) max_in_flight: usize,
    /// Served model name sent in requests.
    pub(crate) model: String,
    /// kvgate instances spawned in front of the engines; the client
    /// spreads requests over them round-robin.
    pub(crate) ingresses: usize,
    /// With several instances: whether they share their bookings (peers).
    pub(crate) peer_sharing: bool,
    /// `--set` overrides for the spawned kvgate instances.
    pub(crate) set: Vec<String>,
}

/// One request's outcome at the client, in wall time since the run started.
#[derive(Debug, Default, Clone)]
struct Outcome {
    sent: Duration,
    first_token: Option<Duration>,
    last_token: Option<Duration>,
    tokens: u32,
    prompt_tokens: u32,
    cached_tokens: Option<u32>,
    replica: Option<String>,
    ok: bool,
}

/// Processes spawned for one run, killed on drop.
struct Spawned {
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

/// One live run: `workload` under `policy` at `rate_scale`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LiveRun<'a> {
    pub(crate) workload: &'a Workload,
    pub(crate) spec: &'a FleetSpec,
    pub(crate) policy: &'a str,
    pub(crate) seed: u64,
    pub(crate) rate_scale: f64,
    pub(crate) bounds: OracleHitRates,
}

/// Runs `run` live, on a runtime of its own.
pub(crate) fn run_live(
    run: LiveRun<'_>,
    opts: &LiveOptions,
    progress: &(dyn Fn(u64) + Sync),
) -> anyhow::Result<RunSummary> {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(live(run, opts, progress))
}

async fn live(
    run: LiveRun<'_>,
    opts: &LiveOptions,
    progress: &(dyn Fn(u64) + Sync),
) -> anyhow::Result<RunSummary> {
    let LiveRun { workload, spec, policy, seed, rate_scale, bounds } = run;
    if !(opts.speedup > 0.0 && opts.speedup.is_finite()) {
        bail!("--speedup must be a positive number");
    }
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(opts.max_in_flight)
        .tcp_nodelay(true)
        .build()?;
    let (bases, engines, pids, _spawned) = match &opts.target {
        Some(url) => (
            vec![url.trim_end_matches('/').to_owned()],
            Vec::new(),
            opts.target_pid.into_iter().collect(),
            None,
        ),
        None => {
            let longest = workload
                .requests
                .iter()
                .map(|r| r.prompt.len() as u64 + u64::from(r.output_tokens))
                .max()
                .unwrap_or(0);
            let (bases, engines, pids, spawned) = spawn_fleet(spec, policy, seed, longest, opts)?;
            (bases, engines, pids, Some(spawned))
        }
    };
    for base in &bases {
        wait_ready(&client, base, opts).await?;
    }
    let cpu = |pids: &[u32]| pids.iter().map(|&p| process_cpu(p)).sum::<f64>();

    // Idle rate of the kvgate processes, to subtract (health checks, scrapes).
    let idle_rate = if pids.is_empty() {
        0.0
    } else {
        let (c0, t0) = (cpu(&pids), Instant::now());
        tokio::time::sleep(Duration::from_secs(2)).await;
        (cpu(&pids) - c0) / t0.elapsed().as_secs_f64()
    };
    let before = engine_counters(&client, &engines).await?;
    let decide_before = decide_histograms(&client, &bases, opts).await;
    let cpu0 = cpu(&pids);

    let outcomes = send_all(&client, &bases, workload, rate_scale, opts, progress).await;
    let wall = outcomes.wall;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let ingress_cpu = (!pids.is_empty()).then(|| {
        let busy = cpu(&pids) - cpu0 - idle_rate * (wall + 0.3);
        busy.max(0.0) / workload.requests.len().max(1) as f64 * 1e6
    });
    let after = engine_counters(&client, &engines).await?;
    let decide_after = decide_histograms(&client, &bases, opts).await;

    Ok(summarise(
        workload,
        policy,
        rate_scale,
        bounds,
        opts.speedup,
        &outcomes,
        (!engines.is_empty()).then(|| after.delta(&before)),
        decide_after.delta(&decide_before),
        ingress_cpu,
    ))
}

/// Picks `n` consecutive free loopback ports (held while checking).
fn free_port_run(n: usize) -> anyhow::Result<u16> {
    for attempt in 0..200u32 {
        let start = 20_000 + ((std::process::id() * 7919 + attempt * 613) % 40_000) as u16;
        let held: Vec<_> = (0..n as u16)
            .map_while(|i| std::net::TcpListener::bind(("127.0.0.1", start.checked_add(i)?)).ok())
            .collect();
        if held.len() == n {
            return Ok(start);
        }
    }
    bail!("no run of {n} free loopback ports found")
}

/// What `spawn_fleet` started: kvgate base URLs, engine URLs, kvgate pids,
/// and the processes (killed on drop).
type Fleet = (Vec<String>, Vec<String>, Vec<u32>, Spawned);

/// The peer key of spawned instances: only they and loopback see it.
const LIVE_PEER_KEY: &str = "kvgate-replay-live-peer-key";

fn spawn_fleet(
    spec: &FleetSpec,
    policy: &str,
    seed: u64,
    longest: u64,
    opts: &LiveOptions,
) -> anyhow::Result<Fleet> {
    let exe = std::env::current_exe().context("cannot find the kvgate executable")?;
    let n = spec.replicas;
    let k = opts.ingresses.max(1);
    // HTTP, events and replay ports for every replica, then three per
    // kvgate instance (API, admin, peers).
    let first = free_port_run(3 * n + 3 * k)?;
    let (http, events, replay) = (first, first + n as u16, first + 2 * n as u16);
    let gw_port = |i: usize, which: u16| first + 3 * n as u16 + 3 * i as u16 + which;
    let e = &spec.engine;
    let mut sim = Command::new(&exe);
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
            .context("cannot start kvgate sim")?,
    );
    let engines: Vec<String> =
        (0..n as u16).map(|i| format!("http://127.0.0.1:{}", http + i)).collect();
    let (mut bases, mut pids) = (Vec::new(), Vec::new());
    for g in 0..k {
        let mut gw = Command::new(&exe);
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
            .context("cannot start kvgate serve")?;
        pids.push(child.id());
        spawned.children.push(child);
        bases.push(format!("http://127.0.0.1:{}", gw_port(g, 0)));
    }
    Ok((bases, engines, pids, spawned))
}

fn with_key(rb: reqwest::RequestBuilder, opts: &LiveOptions) -> reqwest::RequestBuilder {
    match &opts.api_key {
        Some(k) => rb.bearer_auth(k),
        None => rb,
    }
}

async fn wait_ready(
    client: &reqwest::Client,
    base: &str,
    opts: &LiveOptions,
) -> anyhow::Result<()> {
    let t0 = Instant::now();
    loop {
        let r = with_key(client.get(format!("{base}/ready")), opts).send().await;
        if r.as_ref().is_ok_and(|r| r.status().is_success()) {
            return Ok(());
        }
        if t0.elapsed() > Duration::from_secs(60) {
            bail!("kvgate at {base} not ready after 60 s ({:?})", r.map(|r| r.status()));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// CPU seconds of every thread of `pid`. Exact while the threads wait: a
/// running thread's figure lags by up to a scheduler tick.
fn process_cpu(pid: u32) -> f64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return 0.0 };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next().and_then(|v| v.parse::<f64>().ok()))
        .sum::<f64>()
        / 1e9
}

/// The engines' hit counters, summed over replicas.
#[derive(Debug, Default, Clone, Copy)]
struct Counters {
    queries: f64,
    hits: f64,
    external_hits: f64,
    preemptions: f64,
}

impl Counters {
    fn delta(&self, before: &Counters) -> Counters {
        Counters {
            queries: self.queries - before.queries,
            hits: self.hits - before.hits,
            external_hits: self.external_hits - before.external_hits,
            preemptions: self.preemptions - before.preemptions,
        }
    }
}

/// The value of every sample of `name` (any labels) in a Prometheus text page.
fn samples<'a>(text: &'a str, name: &'a str) -> impl Iterator<Item = f64> + 'a {
    text.lines().filter_map(move |l| {
        let rest = l.strip_prefix(name)?;
        if !(rest.starts_with(' ') || rest.starts_with('{')) {
            return None;
        }
        l.rsplit(' ').next()?.parse::<f64>().ok()
    })
}

async fn engine_counters(client: &reqwest::Client, engines: &[String]) -> anyhow::Result<Counters> {
    let mut c = Counters::default();
    for url in engines {
        let text = client
            .get(format!("{url}/metrics"))
            .send()
            .await
            .and_then(|r| r.error_for_status())
            .with_context(|| format!("cannot scrape {url}/metrics"))?
            .text()
            .await?;
        c.queries += samples(&text, "vllm:prefix_cache_queries_total").sum::<f64>();
        c.hits += samples(&text, "vllm:prefix_cache_hits_total").sum::<f64>();
        c.external_hits += samples(&text, "vllm:external_prefix_cache_hits_total").sum::<f64>();
        c.preemptions += samples(&text, "vllm:num_preemptions_total").sum::<f64>();
    }
    Ok(c)
}

/// kvgate's decision-time histogram: cumulative bucket counts by upper
/// bound, sum and count.
#[derive(Debug, Default, Clone)]
struct Histogram {
    buckets: Vec<(f64, f64)>,
    sum: f64,
    count: f64,
}

impl Histogram {
    fn delta(&self, before: &Histogram) -> Histogram {
        let prior: HashMap<u64, f64> =
            before.buckets.iter().map(|(le, c)| (le.to_bits(), *c)).collect();
        Histogram {
            buckets: self
                .buckets
                .iter()
                .map(|(le, c)| (*le, c - prior.get(&le.to_bits()).copied().unwrap_or(0.0)))
                .collect(),
            sum: self.sum - before.sum,
            count: self.count - before.count,
        }
    }

    /// The upper bound of the bucket holding quantile `q`, µs.
    fn quantile_us(&self, q: f64) -> f64 {
        let want = q * self.count;
        self.buckets
            .iter()
            .find(|(_, c)| *c >= want && *c > 0.0)
            .map_or(f64::NAN, |(le, _)| le * 1e6)
    }
}

/// The decision-time histograms of every instance, added up.
async fn decide_histograms(
    client: &reqwest::Client,
    bases: &[String],
    opts: &LiveOptions,
) -> Histogram {
    let mut total = Histogram::default();
    for base in bases {
        let h = decide_histogram(client, base, opts).await;
        if total.buckets.is_empty() {
            total.buckets = h.buckets;
        } else {
            for (t, b) in total.buckets.iter_mut().zip(&h.buckets) {
                t.1 += b.1;
            }
        }
        total.sum += h.sum;
        total.count += h.count;
    }
    total
}

async fn decide_histogram(client: &reqwest::Client, base: &str, opts: &LiveOptions) -> Histogram {
    let Ok(r) = with_key(client.get(format!("{base}/metrics")), opts).send().await else {
        return Histogram::default();
    };
    let Ok(text) = r.text().await else { return Histogram::default() };
    let mut h = Histogram::default();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("kvgate_decide_seconds_bucket{le=\"") {
            let Some((le, tail)) = rest.split_once('"') else { continue };
            let le = if le == "+Inf" { f64::INFINITY } else { le.parse().unwrap_or(f64::NAN) };
            if let Some(c) = tail.rsplit(' ').next().and_then(|v| v.parse().ok()) {
                h.buckets.push((le, c));
            }
        }
    }
    h.sum = samples(&text, "kvgate_decide_seconds_sum").sum();
    h.count = samples(&text, "kvgate_decide_seconds_count").sum();
    h
}

struct Sent {
    outcomes: Vec<Outcome>,
    samples: Vec<LoadSample>,
    replicas: Vec<String>,
    wall: f64,
}

/// Sends every request at its (compressed) arrival time and collects what
/// the client saw.
async fn send_all(
    client: &reqwest::Client,
    bases: &[String],
    workload: &Workload,
    rate_scale: f64,
    opts: &LiveOptions,
    progress: &(dyn Fn(u64) + Sync),
) -> Sent {
    // Round-robin over the instances, as a plain load balancer would.
    let urls: Vec<String> = bases.iter().map(|b| format!("{b}/v1/completions")).collect();
    let limit = Arc::new(tokio::sync::Semaphore::new(opts.max_in_flight.max(1)));
    let in_flight: Arc<Mutex<HashMap<String, Arc<AtomicU32>>>> = Arc::default();
    let start = tokio::time::Instant::now();
    let mut tasks = Vec::with_capacity(workload.requests.len());
    let done = Arc::new(AtomicU32::new(0));
    let sampler = {
        let (in_flight, done) = (Arc::clone(&in_flight), Arc::clone(&done));
        let total = workload.requests.len() as u32;
        let speedup = opts.speedup;
        tokio::spawn(async move {
            let mut samples = Vec::new();
            let mut tick = tokio::time::interval(Duration::from_millis(100));
            while done.load(Ordering::Relaxed) < total {
                tick.tick().await;
                let map = in_flight.lock().map(|m| m.clone()).unwrap_or_default();
                let mut names: Vec<_> = map.keys().cloned().collect();
                names.sort();
                samples.push((
                    start.elapsed().as_secs_f64() * speedup,
                    names.iter().map(|n| map[n].load(Ordering::Relaxed)).collect::<Vec<_>>(),
                    names,
                ));
            }
            samples
        })
    };
    for (i, req) in workload.requests.iter().enumerate() {
        let at = workload.arrival(i, rate_scale).div_f64(opts.speedup);
        tokio::time::sleep_until(start + at).await;
        let Ok(permit) = Arc::clone(&limit).acquire_owned().await else { break };
        let body = serde_json::json!({
            "model": opts.model,
            "prompt": req.prompt.tokens(),
            "max_tokens": req.output_tokens.max(1),
            "ignore_eos": true,
            "stream": true,
            "stream_options": {"include_usage": true},
        });
        let prompt_tokens = req.prompt.len() as u32;
        let rb = with_key(client.post(&urls[i % urls.len()]), opts).json(&body);
        let (in_flight, done) = (Arc::clone(&in_flight), Arc::clone(&done));
        tasks.push(tokio::spawn(async move {
            let out = one_request(rb, start, prompt_tokens, &in_flight).await;
            done.fetch_add(1, Ordering::Relaxed);
            drop(permit);
            out
        }));
    }
    let mut outcomes = Vec::with_capacity(tasks.len());
    for (k, t) in tasks.into_iter().enumerate() {
        outcomes.push(t.await.unwrap_or_default());
        if k % 16 == 0 {
            progress(k as u64);
        }
    }
    progress(outcomes.len() as u64);
    let wall = start.elapsed().as_secs_f64();
    let raw = sampler.await.unwrap_or_default();
    let mut replicas: Vec<String> = raw.last().map(|(_, _, n)| n.clone()).unwrap_or_default();
    replicas.sort();
    let samples = raw
        .into_iter()
        .map(|(at_s, counts, names)| LoadSample {
            at_s,
            requests: replicas
                .iter()
                .map(|r| names.iter().position(|n| n == r).map_or(0, |i| counts[i]))
                .collect(),
        })
        .collect();
    Sent { outcomes, samples, replicas, wall }
}

async fn one_request(
    rb: reqwest::RequestBuilder,
    start: tokio::time::Instant,
    prompt_tokens: u32,
    in_flight: &Mutex<HashMap<String, Arc<AtomicU32>>>,
) -> Outcome {
    let mut out = Outcome { sent: start.elapsed(), prompt_tokens, ..Outcome::default() };
    let Ok(resp) = rb.send().await else { return out };
    if !resp.status().is_success() {
        return out;
    }
    let replica = resp
        .headers()
        .get("x-kvgate-replica")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("?")
        .to_owned();
    let counter = in_flight
        .lock()
        .map(|mut m| Arc::clone(m.entry(replica.clone()).or_default()))
        .unwrap_or_default();
    counter.fetch_add(1, Ordering::Relaxed);
    out.replica = Some(replica);
    let mut stream = resp.bytes_stream();
    let mut pending: Vec<u8> = Vec::new();
    let mut finished = false;
    while let Some(chunk) = stream.next().await {
        let Ok(chunk) = chunk else { break };
        pending.extend_from_slice(&chunk);
        while let Some(end) = find(&pending, b"\n\n") {
            let event: Vec<u8> = pending.drain(..end + 2).collect();
            for line in event.split(|b| *b == b'\n') {
                let Some(data) = line.strip_prefix(b"data: ") else { continue };
                if data == b"[DONE]" {
                    finished = true;
                    continue;
                }
                let Ok(v) = serde_json::from_slice::<serde_json::Value>(data) else { continue };
                if v.get("error").is_some() {
                    continue;
                }
                let has_text = v["choices"].as_array().is_some_and(|c| !c.is_empty());
                if has_text {
                    let now = start.elapsed();
                    out.first_token.get_or_insert(now);
                    out.last_token = Some(now);
                    out.tokens += 1;
                }
                if let Some(c) = v["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64() {
                    out.cached_tokens = u32::try_from(c).ok();
                }
            }
        }
    }
    counter.fetch_sub(1, Ordering::Relaxed);
    out.ok = finished && out.first_token.is_some();
    out
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

#[allow(clippy::too_many_arguments)]
fn summarise(
    workload: &Workload,
    policy: &str,
    rate_scale: f64,
    bounds: OracleHitRates,
    speedup: f64,
    sent: &Sent,
    engine: Option<Counters>,
    decide: Histogram,
    ingress_cpu_us_per_req: Option<f64>,
) -> RunSummary {
    let ms = |d: Duration| d.as_secs_f64() * 1e3 * speedup;
    let (mut ttft, mut itl, mut e2e, mut ttft_s) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut out_tokens, mut prompt, mut cached, mut completed) = (0u64, 0u64, 0u64, 0u64);
    let mut per_replica: HashMap<&str, (u64, f64)> = HashMap::new();
    let mut end = Duration::ZERO;
    for o in &sent.outcomes {
        let (Some(first), Some(last)) = (o.first_token, o.last_token) else { continue };
        if !o.ok {
            continue;
        }
        completed += 1;
        ttft.push(ms(first - o.sent));
        ttft_s.push((first - o.sent).as_secs_f64() * speedup);
        e2e.push(ms(last - o.sent));
        if o.tokens >= 2 {
            itl.push(ms(last - first) / f64::from(o.tokens - 1));
        }
        end = end.max(last);
        out_tokens += u64::from(o.tokens);
        prompt += u64::from(o.prompt_tokens);
        let c = o.cached_tokens.unwrap_or(0);
        cached += u64::from(c);
        let e = per_replica.entry(o.replica.as_deref().unwrap_or("?")).or_default();
        e.0 += 1;
        e.1 += f64::from(o.prompt_tokens.saturating_sub(c));
    }
    let span = sent.outcomes.first().map_or(Duration::ZERO, |o| end.saturating_sub(o.sent));
    let span_s = (span.as_secs_f64() * speedup).max(1e-9);
    let first_admission = if prompt > 0 { cached as f64 / prompt as f64 } else { 0.0 };
    let hit_rate = match engine {
        Some(c) if c.queries > 0.0 => (c.hits + c.external_hits) / c.queries,
        _ => first_admission,
    };
    let replica_requests: Vec<u64> =
        sent.replicas.iter().map(|r| per_replica.get(r.as_str()).map_or(0, |e| e.0)).collect();
    let prefill: Vec<f64> =
        sent.replicas.iter().map(|r| per_replica.get(r.as_str()).map_or(0.0, |e| e.1)).collect();
    let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { f64::NAN };
    let decision_us = Distribution {
        mean: if decide.count > 0.0 { decide.sum / decide.count * 1e6 } else { f64::NAN },
        p50: decide.quantile_us(0.5),
        p90: decide.quantile_us(0.9),
        p99: decide.quantile_us(0.99),
    };
    let requests = workload.requests.len() as u64;
    RunSummary {
        policy: policy.to_owned(),
        rate: workload.base_rate() * rate_scale,
        rate_scale,
        requests,
        completed,
        unserved: requests - completed,
        ttft_ms: Distribution::of(&mut ttft),
        itl_ms: Distribution::of(&mut itl),
        e2e_ms: Distribution::of(&mut e2e),
        throughput_tok_s: out_tokens as f64 / span_s,
        prompt_tok_s: prompt as f64 / span_s,
        hit_rate,
        first_admission_hit_rate: first_admission,
        oracle_hit_rate: bounds.oracle,
        ceiling_hit_rate: bounds.ceiling,
        hit_rate_vs_oracle: ratio(hit_rate, bounds.oracle),
        first_admission_vs_oracle: ratio(first_admission, bounds.oracle),
        ttft_floor_ms: bounds.ttft_floor_ms,
        load_imbalance: max_over_mean(&prefill),
        request_imbalance: max_over_mean(
            &replica_requests.iter().map(|&r| r as f64).collect::<Vec<_>>(),
        ),
        replica_requests,
        decision_us,
        ingress_cpu_us_per_req,
        preemptions: engine.map_or(0, |c| c.preemptions.max(0.0) as u64),
        makespan_s: span_s,
        wall_s: sent.wall,
        ttft_s,
        load: sent.samples.clone(),
        disagg: None,
    }
}
