//! The peer bench's JSON (`bench/peers.py`, schema in `bench/README.md`): the
//! committed sample, `bench/sample-results.json`, a real `results.json` from
//! one run, parses and keeps its schema. Every field the report and the charts
//! read is present with the right type; every cell has a status; an `ok` cell
//! has finite TTFT statistics in order (p50 ≤ p90 ≤ p99, min ≤ median ≤ max)
//! and a hit rate in [0, 1]; a `cannot_run` cell says why.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

fn sample_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../bench/sample-results.json")
}

fn sample() -> Value {
    let path = sample_path();
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{} does not parse: {e}", path.display()))
}

fn obj<'a>(v: &'a Value, what: &str) -> &'a Map<String, Value> {
    v.as_object().unwrap_or_else(|| panic!("{what} is not an object: {v}"))
}

fn field<'a>(o: &'a Map<String, Value>, key: &str, what: &str) -> &'a Value {
    o.get(key).unwrap_or_else(|| panic!("{what} has no `{key}`"))
}

fn string<'a>(o: &'a Map<String, Value>, key: &str, what: &str) -> &'a str {
    let s = field(o, key, what).as_str().unwrap_or_else(|| panic!("{what}.{key} is not a string"));
    assert!(!s.trim().is_empty(), "{what}.{key} is empty");
    s
}

fn finite(v: &Value, what: &str) -> f64 {
    let x = v.as_f64().unwrap_or_else(|| panic!("{what} is not a number: {v}"));
    assert!(x.is_finite(), "{what} is not finite: {x}");
    x
}

/// A summary entry: `{"median", "min", "max", "n"}`, ordered.
fn stat(summary: &Map<String, Value>, metric: &str, what: &str) -> (f64, f64, f64) {
    let s = obj(field(summary, metric, what), &format!("{what}.{metric}"));
    let w = format!("{what}.{metric}");
    let (med, min, max) = (
        finite(field(s, "median", &w), &format!("{w}.median")),
        finite(field(s, "min", &w), &format!("{w}.min")),
        finite(field(s, "max", &w), &format!("{w}.max")),
    );
    let n = field(s, "n", &w).as_u64().unwrap_or_else(|| panic!("{w}.n is not a count"));
    assert!(n >= 1, "{w}.n is 0");
    assert!(min <= med && med <= max, "{w}: min {min} ≤ median {med} ≤ max {max} does not hold");
    (med, min, max)
}

#[test]
fn the_sample_has_the_top_level_fields() {
    let v = sample();
    let top = obj(&v, "results");
    assert_eq!(field(top, "schema_version", "results").as_u64(), Some(1), "schema_version");
    string(top, "generated_at", "results");
    string(top, "command", "results");

    let machine = obj(field(top, "machine", "results"), "machine");
    let cpus = field(machine, "cpus", "machine").as_u64().expect("machine.cpus is a count");
    assert!(cpus >= 1);

    let versions = obj(field(top, "versions", "results"), "versions");
    for peer in ["vllm", "vllm-router", "smg"] {
        string(versions, peer, "versions");
    }
    let kvgate = obj(field(versions, "kvgate", "versions"), "versions.kvgate");
    let commit = string(kvgate, "commit", "versions.kvgate");
    assert!(
        commit.len() == 40 && commit.chars().all(|c| c.is_ascii_hexdigit()),
        "versions.kvgate.commit is not a git commit: {commit}"
    );
    assert!(field(kvgate, "dirty", "versions.kvgate").is_boolean());
    // Dynamo: its versions, or null when it could not be installed (its cells then say why).
    let dynamo = field(versions, "ai-dynamo", "versions");
    assert!(dynamo.is_null() || dynamo.is_object(), "versions.ai-dynamo: {dynamo}");

    let config = obj(field(top, "config", "results"), "config");
    let fleet = obj(field(config, "fleet", "config"), "config.fleet");
    for key in ["replicas", "block_size", "num_gpu_blocks"] {
        assert!(
            field(fleet, key, "config.fleet").as_u64().is_some_and(|n| n > 0),
            "config.fleet.{key}"
        );
    }
    string(fleet, "timing", "config.fleet");
    finite(field(fleet, "speedup", "config.fleet"), "config.fleet.speedup");
    assert!(field(config, "repeat", "config").as_u64().is_some_and(|n| n >= 1), "config.repeat");
    obj(field(config, "workloads", "config"), "config.workloads");
    obj(field(config, "routers", "config"), "config.routers");

    let cells = field(top, "cells", "results").as_array().expect("cells is an array");
    assert!(!cells.is_empty(), "no cells");
}

#[test]
fn every_cell_has_a_status_and_ok_cells_have_ordered_finite_stats() {
    let v = sample();
    let cells = v["cells"].as_array().expect("cells is an array");
    let (mut ok, mut cannot) = (0, 0);
    for (i, cell) in cells.iter().enumerate() {
        let c = obj(cell, &format!("cells[{i}]"));
        let what = format!(
            "cells[{i}] ({} x {} @ {})",
            c.get("router").and_then(Value::as_str).unwrap_or("?"),
            c.get("workload").and_then(Value::as_str).unwrap_or("?"),
            c.get("level").and_then(Value::as_str).unwrap_or("?"),
        );
        for key in ["router", "label", "workload", "level"] {
            string(c, key, &what);
        }
        finite(field(c, "request_rate", &what), &format!("{what}.request_rate"));
        let repeats =
            field(c, "repeats", &what).as_array().unwrap_or_else(|| panic!("{what}.repeats"));
        let summary = obj(field(c, "summary", &what), &format!("{what}.summary"));
        match string(c, "status", &what) {
            "ok" => {
                ok += 1;
                let (p50, _, _) = stat(summary, "ttft_p50_ms", &what);
                let (p90, _, _) = stat(summary, "ttft_p90_ms", &what);
                let (p99, _, _) = stat(summary, "ttft_p99_ms", &what);
                let (mean, _, _) = stat(summary, "ttft_mean_ms", &what);
                assert!(mean > 0.0, "{what}: mean TTFT {mean}");
                assert!(
                    p50 <= p90 && p90 <= p99,
                    "{what}: p50 {p50} ≤ p90 {p90} ≤ p99 {p99} does not hold"
                );
                let (hit, lo, hi) = stat(summary, "hit_rate", &what);
                assert!(
                    (0.0..=1.0).contains(&lo) && (0.0..=1.0).contains(&hi),
                    "{what}: hit rate {hit} outside [0, 1]"
                );
                for m in [
                    "router_cpu_ms_per_req",
                    "sim_cpu_ms_per_req",
                    "total_cpu_ms_per_req",
                    "completed",
                ] {
                    let (med, lo, _) = stat(summary, m, &what);
                    assert!(lo >= 0.0 && med >= 0.0, "{what}.{m} negative");
                }
                let mut ok_repeats = 0;
                for (j, r) in repeats.iter().enumerate() {
                    let r = obj(r, &format!("{what}.repeats[{j}]"));
                    let w = format!("{what}.repeats[{j}]");
                    if r.get("status").and_then(Value::as_str) != Some("ok") {
                        continue;
                    }
                    ok_repeats += 1;
                    let q: Vec<f64> = ["ttft_p50_ms", "ttft_p90_ms", "ttft_p99_ms"]
                        .iter()
                        .map(|k| finite(field(r, k, &w), &format!("{w}.{k}")))
                        .collect();
                    assert!(
                        q[0] <= q[1] && q[1] <= q[2],
                        "{w}: TTFT percentiles out of order: {q:?}"
                    );
                    let h = finite(field(r, "hit_rate", &w), &format!("{w}.hit_rate"));
                    assert!((0.0..=1.0).contains(&h), "{w}: hit rate {h}");
                    let cdf = field(r, "ttft_cdf_ms", &w)
                        .as_array()
                        .unwrap_or_else(|| panic!("{w}.ttft_cdf_ms"));
                    assert!(cdf.len() >= 2, "{w}: TTFT CDF has {} points", cdf.len());
                    let xs: Vec<f64> =
                        cdf.iter().map(|x| finite(x, &format!("{w}.ttft_cdf_ms[]"))).collect();
                    assert!(xs.windows(2).all(|p| p[0] <= p[1]), "{w}: TTFT CDF is not sorted");
                }
                assert!(ok_repeats >= 1, "{what} is ok without an ok repeat");
            }
            "cannot_run" => {
                cannot += 1;
                string(c, "reason", &what);
            }
            other => panic!("{what}: status {other:?} is neither \"ok\" nor \"cannot_run\""),
        }
    }
    assert!(ok >= 1, "the sample has no ok cell");
    // The sample is a full --quick run: it shows how a peer that cannot run is reported.
    assert!(cannot >= 1, "the sample has no cannot_run cell");
}
