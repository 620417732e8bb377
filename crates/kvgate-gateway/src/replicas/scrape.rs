//! Reading an engine's `/metrics` (vLLM's names, FIELD.md §2) into what the
//! router needs: load, KV usage, prefix-cache counters, and the cache
//! configuration used to check the configured block size.
//!
//! The sample lines of the Prometheus text format are parsed here rather
//! than with `prometheus-parse`: that crate matches metric names with `\w+`,
//! so it cannot read vLLM's `vllm:`-prefixed names (colons are legal in
//! Prometheus names); `tests::prometheus_parse_cannot_read_vllm_names` keeps
//! the proof. Only what this module needs is parsed: name, labels, value.

use std::collections::HashMap;

use kvgate_router::EngineTiming;

/// One sample line: `name{k="v",...} value [timestamp]`.
#[derive(Debug, PartialEq)]
struct Sample<'a> {
    name: &'a str,
    labels: HashMap<String, String>,
    value: f64,
}

/// Parses one sample line; `None` for comments, blanks and malformed lines.
fn parse_sample(line: &str) -> Option<Sample<'_>> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return None;
    }
    let name_end = line.find(|c: char| c == '{' || c.is_whitespace())?;
    let name = &line[..name_end];
    let valid = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    if name.is_empty() || !name.chars().all(valid) {
        return None;
    }
    let mut rest = &line[name_end..];
    let mut labels = HashMap::new();
    if let Some(body) = rest.strip_prefix('{') {
        let (parsed, after) = parse_labels(body)?;
        labels = parsed;
        rest = after;
    }
    let value = rest.split_whitespace().next()?;
    let value = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse().ok()?,
    };
    Some(Sample { name, labels, value })
}

/// Parses `k="v",k2="v2"}` (escapes `\\`, `\"`, `\n`); returns the labels and
/// what follows the closing brace.
fn parse_labels(mut s: &str) -> Option<(HashMap<String, String>, &str)> {
    let mut out = HashMap::new();
    loop {
        s = s.trim_start_matches([',', ' ']);
        if let Some(after) = s.strip_prefix('}') {
            return Some((out, after));
        }
        let eq = s.find('=')?;
        let key = s[..eq].trim().to_owned();
        s = s[eq + 1..].trim_start().strip_prefix('"')?;
        let mut value = String::new();
        let mut chars = s.char_indices();
        let end = loop {
            let (i, c) = chars.next()?;
            match c {
                '"' => break i,
                '\\' => match chars.next()?.1 {
                    'n' => value.push('\n'),
                    other => value.push(other),
                },
                c => value.push(c),
            }
        };
        out.insert(key, value);
        s = &s[end + 1..];
    }
}

pub(crate) use kvgate_fleet::{EngineScrape, LoraScrape, TransferTotals};

/// Adapter names in one comma-separated label, bounded: a hostile engine
/// cannot make the router intern without end.
const MAX_LISTED_ADAPTERS: usize = 256;

fn lora_of(labels: &HashMap<String, String>, at: f64) -> Option<LoraScrape> {
    let max_loras = labels.get("max_lora")?.parse::<u32>().ok()?;
    let mut adapters: Vec<String> = Vec::new();
    for key in ["running_lora_adapters", "waiting_lora_adapters"] {
        let names = labels.get(key).map(String::as_str).unwrap_or("");
        for n in names.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            if adapters.len() < MAX_LISTED_ADAPTERS && !adapters.iter().any(|a| a == n) {
                adapters.push(n.to_owned());
            }
        }
    }
    Some(LoraScrape { max_loras, adapters, at })
}

/// The request-level series calibration reads, summed over engines.
#[derive(Clone, Copy, Debug, Default)]
struct TimingSeries {
    prefill_count: Option<f64>,
    prefill_sum: Option<f64>,
    queue_sum: Option<f64>,
    kv_computed_sum: Option<f64>,
    prompt_sum: Option<f64>,
    itl_count: Option<f64>,
    itl_sum: Option<f64>,
}

fn add(slot: &mut Option<f64>, v: f64) {
    *slot = Some(slot.unwrap_or(0.0) + v);
}

impl TimingSeries {
    /// Records `s` if it is one of the series; returns whether it was.
    fn take(&mut self, name: &str, v: f64) -> bool {
        let slot = match name {
            "vllm:request_prefill_time_seconds_count" => &mut self.prefill_count,
            "vllm:request_prefill_time_seconds_sum" => &mut self.prefill_sum,
            "vllm:request_queue_time_seconds_sum" => &mut self.queue_sum,
            "vllm:request_prefill_kv_computed_tokens_sum" => &mut self.kv_computed_sum,
            "vllm:request_prompt_tokens_sum" => &mut self.prompt_sum,
            "vllm:inter_token_latency_seconds_count" => &mut self.itl_count,
            "vllm:inter_token_latency_seconds_sum" => &mut self.itl_sum,
            _ => return false,
        };
        add(slot, v);
        true
    }

    /// The totals, when the engine exports prefill times and some count of
    /// computed tokens. Without `request_prefill_kv_computed_tokens` (older
    /// vLLM), computed tokens are the finished requests' prompt tokens minus
    /// the prefix-cache hits: both are cumulative, so their differences
    /// between scrapes still match up to requests in flight.
    fn totals(&self, prefix_hits: u64) -> Option<EngineTiming> {
        let requests = self.prefill_count?;
        let computed = match (self.kv_computed_sum, self.prompt_sum) {
            (Some(c), _) => c,
            (None, Some(p)) => (p - prefix_hits as f64).max(0.0),
            (None, None) => return None,
        };
        Some(EngineTiming {
            requests: requests as u64,
            prefill_s: self.prefill_sum?,
            queue_s: self.queue_sum.unwrap_or(0.0),
            computed_tokens: computed as u64,
            itl_count: self.itl_count.unwrap_or(0.0) as u64,
            itl_s: self.itl_sum.unwrap_or(0.0),
        })
    }
}

/// Parses the text exposition. Fails when none of vLLM's load gauges is
/// present (the URL is probably not a vLLM server).
#[cfg(test)]
pub(crate) fn parse_engine_metrics(text: &str) -> Result<EngineScrape, String> {
    parse_rank_metrics(text, None)
}

/// [`parse_engine_metrics`] for one data-parallel rank: series labelled with
/// another `engine` are skipped (vLLM labels each engine's series by its
/// index); series without the label count for every rank.
pub(crate) fn parse_rank_metrics(text: &str, rank: Option<u32>) -> Result<EngineScrape, String> {
    let mut out = EngineScrape::default();
    let mut seen_load = false;
    let (mut usage_sum, mut usage_n) = (0.0, 0u32);
    let mut timing = TimingSeries::default();
    let mut transfers: Option<TransferTotals> = None;
    let rank = rank.map(|r| r.to_string());
    let mine = |s: &Sample<'_>| match (&rank, s.labels.get("engine")) {
        (Some(want), Some(engine)) => engine == want,
        _ => true,
    };
    for s in text.lines().filter_map(parse_sample).filter(mine) {
        let v = s.value;
        if !v.is_finite() || v < 0.0 {
            continue;
        }
        if timing.take(s.name, v.min(1e18)) {
            continue;
        }
        // Saturating casts: a hostile or broken engine cannot overflow us.
        match s.name {
            "vllm:num_requests_running" => {
                out.running = out.running.saturating_add(v as u32);
                seen_load = true;
            }
            "vllm:num_requests_waiting" => {
                out.waiting = out.waiting.saturating_add(v as u32);
                seen_load = true;
            }
            "vllm:kv_cache_usage_perc" | "vllm:gpu_cache_usage_perc" => {
                usage_sum += v.min(1.0);
                usage_n += 1;
            }
            "vllm:prefix_cache_queries_total" | "vllm:prefix_cache_queries" => {
                out.prefix_queries = out.prefix_queries.saturating_add(v as u64);
            }
            "vllm:prefix_cache_hits_total" | "vllm:prefix_cache_hits" => {
                out.prefix_hits = out.prefix_hits.saturating_add(v as u64);
            }
            "vllm:cache_config_info" => {
                let num = |k: &str| s.labels.get(k).and_then(|x| x.parse::<u64>().ok());
                out.block_size = num("block_size").and_then(|b| u32::try_from(b).ok());
                out.num_gpu_blocks = num("num_gpu_blocks");
                out.num_cpu_blocks = num("num_cpu_blocks").filter(|&n| n > 0);
            }
            "vllm:nixl_xfer_time_seconds_count" => {
                transfers.get_or_insert_default().count += v.min(1e18);
            }
            "vllm:nixl_xfer_time_seconds_sum" => {
                transfers.get_or_insert_default().seconds += v.min(1e18);
            }
            "vllm:nixl_bytes_transferred_sum" => {
                transfers.get_or_insert_default().bytes += v.min(1e18);
            }
            "vllm:lora_requests_info" if out.lora.as_ref().is_none_or(|l| v >= l.at) => {
                out.lora = lora_of(&s.labels, v).or(out.lora.take());
            }
            _ => {}
        }
    }
    if !seen_load {
        return Err("no vllm:num_requests_running / vllm:num_requests_waiting series".into());
    }
    if usage_n > 0 {
        out.kv_usage = usage_sum / f64::from(usage_n);
    }
    out.timing = timing.totals(out.prefix_hits);
    out.transfers = transfers;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const VLLM: &str = r#"# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="Qwen/Qwen3-0.6B"} 3.0
vllm:num_requests_running{engine="1",model_name="Qwen/Qwen3-0.6B"} 2.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="Qwen/Qwen3-0.6B"} 4.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="Qwen/Qwen3-0.6B"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="Qwen/Qwen3-0.6B"} 0.75
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{engine="0",model_name="Qwen/Qwen3-0.6B"} 1000.0
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{engine="0",model_name="Qwen/Qwen3-0.6B"} 640.0
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",num_cpu_blocks="None",num_gpu_blocks="27000",prefix_caching_hash_algo="sha256"} 1.0
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{le="0.001",model_name="m"} 0.0
vllm:time_to_first_token_seconds_bucket{le="+Inf",model_name="m"} 5.0
vllm:time_to_first_token_seconds_count{model_name="m"} 5.0
vllm:time_to_first_token_seconds_sum{model_name="m"} 1.5
"#;

    /// vLLM 0.33's NIXL series (a decode replica pulling KV), summed over
    /// engines; an engine without them reports no transfers.
    #[test]
    fn nixl_transfer_series_are_summed_over_engines() {
        assert_eq!(parse_engine_metrics(VLLM).unwrap().transfers, None);
        let text = format!(
            "{VLLM}# TYPE vllm:nixl_xfer_time_seconds histogram\n\
             vllm:nixl_xfer_time_seconds_bucket{{engine=\"0\",le=\"0.1\",model_name=\"m\"}} 3.0\n\
             vllm:nixl_xfer_time_seconds_count{{engine=\"0\",model_name=\"m\"}} 3.0\n\
             vllm:nixl_xfer_time_seconds_sum{{engine=\"0\",model_name=\"m\"}} 0.25\n\
             vllm:nixl_xfer_time_seconds_count{{engine=\"1\",model_name=\"m\"}} 1.0\n\
             vllm:nixl_xfer_time_seconds_sum{{engine=\"1\",model_name=\"m\"}} 0.05\n\
             # TYPE vllm:nixl_bytes_transferred histogram\n\
             vllm:nixl_bytes_transferred_count{{engine=\"0\",model_name=\"m\"}} 3.0\n\
             vllm:nixl_bytes_transferred_sum{{engine=\"0\",model_name=\"m\"}} 3.0e9\n\
             vllm:nixl_bytes_transferred_sum{{engine=\"1\",model_name=\"m\"}} 1.0e9\n"
        );
        let t = parse_engine_metrics(&text).unwrap().transfers.unwrap();
        assert_eq!((t.count, t.bytes), (4.0, 4.0e9));
        assert!((t.seconds - 0.3).abs() < 1e-12);
        let earlier = TransferTotals { count: 2.0, seconds: 0.1, bytes: 1.0e9 };
        let (bytes, secs) = t.since(&earlier).unwrap();
        assert_eq!(bytes, 3.0e9);
        assert!((secs - 0.2).abs() < 1e-12);
        assert_eq!(t.since(&t), None, "no transfer since");
    }

    #[test]
    fn lora_slots_come_from_the_newest_info_sample() {
        let text = format!(
            "{VLLM}# TYPE vllm:lora_requests_info gauge\n\
             vllm:lora_requests_info{{max_lora=\"4\",running_lora_adapters=\"a,b\",waiting_lora_adapters=\"\"}} 1700000002.0\n\
             vllm:lora_requests_info{{max_lora=\"4\",running_lora_adapters=\"\",waiting_lora_adapters=\"c\"}} 1700000001.0\n"
        );
        let lora = parse_engine_metrics(&text).unwrap().lora.unwrap();
        assert_eq!((lora.max_loras, lora.adapters), (4, vec!["a".to_owned(), "b".to_owned()]));
        assert!(parse_engine_metrics(VLLM).unwrap().lora.is_none());
        let bad = format!("{VLLM}vllm:lora_requests_info{{max_lora=\"x\"}} 1.0\n");
        assert!(parse_engine_metrics(&bad).unwrap().lora.is_none(), "unparsable: ignored");
    }

    #[test]
    fn a_rank_reads_its_own_engine_only() {
        let one = parse_rank_metrics(VLLM, Some(1)).unwrap();
        assert_eq!((one.running, one.kv_usage), (2, 0.75));
        let zero = parse_rank_metrics(VLLM, Some(0)).unwrap();
        assert_eq!((zero.running, zero.waiting, zero.kv_usage), (3, 4, 0.25));
        assert!(parse_rank_metrics(VLLM, Some(7)).is_err(), "no series for engine 7");
    }

    #[test]
    fn reads_vllm_names_across_engines() {
        let s = parse_engine_metrics(VLLM).unwrap();
        assert_eq!((s.running, s.waiting), (5, 4));
        assert!((s.kv_usage - 0.5).abs() < 1e-12);
        assert_eq!((s.prefix_queries, s.prefix_hits), (1000, 640));
        assert_eq!(s.block_size, Some(16));
        assert_eq!(s.num_gpu_blocks, Some(27_000));
        assert_eq!(s.num_cpu_blocks, None);
    }

    #[test]
    fn reads_request_timing_totals() {
        assert_eq!(parse_engine_metrics(VLLM).unwrap().timing, None);
        let text = format!(
            "{VLLM}vllm:request_prefill_time_seconds_count{{engine=\"0\"}} 4.0\n\
             vllm:request_prefill_time_seconds_count{{engine=\"1\"}} 2.0\n\
             vllm:request_prefill_time_seconds_sum{{engine=\"0\"}} 0.5\n\
             vllm:request_prefill_time_seconds_sum{{engine=\"1\"}} 0.25\n\
             vllm:request_queue_time_seconds_sum{{engine=\"0\"}} 1.5\n\
             vllm:request_prompt_tokens_sum{{engine=\"0\"}} 1640.0\n\
             vllm:inter_token_latency_seconds_count{{engine=\"0\"}} 100.0\n\
             vllm:inter_token_latency_seconds_sum{{engine=\"0\"}} 2.0\n"
        );
        let t = parse_engine_metrics(&text).unwrap().timing.unwrap();
        assert_eq!((t.requests, t.computed_tokens, t.itl_count), (6, 1000, 100));
        assert!((t.prefill_s - 0.75).abs() < 1e-12 && (t.queue_s - 1.5).abs() < 1e-12);
        // The engine's own computed-token count wins over prompt − hits.
        let text =
            format!("{text}vllm:request_prefill_kv_computed_tokens_sum{{engine=\"0\"}} 900.0\n");
        assert_eq!(parse_engine_metrics(&text).unwrap().timing.unwrap().computed_tokens, 900);
    }

    #[test]
    fn non_vllm_and_garbage_are_errors_not_panics() {
        assert!(parse_engine_metrics("up 1\n").is_err());
        assert_eq!(parse_sample("# HELP x y"), None);
        assert_eq!(parse_sample("bad name 1"), None);
        assert_eq!(parse_sample("x{a=\"unterminated} 1"), None);
        let s = parse_sample(r#"m:x{a="q\"uo\\te",b="2"} 3.5 1700000000"#).unwrap();
        assert_eq!((s.name, s.value), ("m:x", 3.5));
        assert_eq!(s.labels["a"], "q\"uo\\te");
        assert!(parse_engine_metrics("").is_err());
        let hostile = "vllm:num_requests_running 1e300\nvllm:num_requests_waiting NaN\n\
                       vllm:kv_cache_usage_perc -3\n";
        let s = parse_engine_metrics(hostile).unwrap();
        assert_eq!((s.running, s.waiting, s.kv_usage), (u32::MAX, 0, 0.0));
        let _ = parse_engine_metrics("{{{{ \u{0} \n vllm:num_requests_running{a=\"b} 2\n");
    }

    /// Why this module parses samples itself: `prometheus-parse` 0.2.5
    /// drops every `vllm:` series (its name pattern is `\w+`).
    #[test]
    fn prometheus_parse_cannot_read_vllm_names() {
        let lines = VLLM.lines().map(|l| Ok(l.to_owned()));
        let scrape = prometheus_parse::Scrape::parse(lines).unwrap();
        assert!(scrape.samples.iter().all(|s| !s.metric.starts_with("vllm:")));
        assert!(parse_engine_metrics(VLLM).is_ok());
    }
}
