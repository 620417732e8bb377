//! The open-loop client: every request at its (compressed) arrival time,
//! streamed from kvgate, timed at the client.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use kvgate_replay::{LoadSample, Workload};

use crate::{LiveError, LiveOptions};

/// One request's outcome at the client, in wall time since the run started.
#[derive(Debug, Default, Clone)]
pub(crate) struct Outcome {
    pub(crate) sent: Duration,
    pub(crate) first_token: Option<Duration>,
    pub(crate) last_token: Option<Duration>,
    pub(crate) tokens: u32,
    pub(crate) prompt_tokens: u32,
    pub(crate) cached_tokens: Option<u32>,
    pub(crate) replica: Option<String>,
    pub(crate) ok: bool,
}

pub(crate) fn with_key(rb: reqwest::RequestBuilder, opts: &LiveOptions) -> reqwest::RequestBuilder {
    match &opts.api_key {
        Some(k) => rb.bearer_auth(k),
        None => rb,
    }
}

pub(crate) async fn wait_ready(
    client: &reqwest::Client,
    base: &str,
    opts: &LiveOptions,
) -> Result<(), LiveError> {
    let t0 = Instant::now();
    loop {
        let r = with_key(client.get(format!("{base}/ready")), opts).send().await;
        if r.as_ref().is_ok_and(|r| r.status().is_success()) {
            return Ok(());
        }
        if t0.elapsed() > Duration::from_secs(60) {
            let last = match r {
                Ok(r) => r.status().to_string(),
                Err(e) => e.to_string(),
            };
            return Err(LiveError::NotReady { base: base.to_owned(), last });
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

pub(crate) struct Sent {
    pub(crate) outcomes: Vec<Outcome>,
    pub(crate) samples: Vec<LoadSample>,
    pub(crate) replicas: Vec<String>,
    pub(crate) wall: f64,
}

/// Sends every request at its (compressed) arrival time and collects what
/// the client saw.
pub(crate) async fn send_all(
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
    memchr::memmem::find(hay, needle)
}
