//! `kvgate replay` end to end, as a black box: a fast-mode comparison on the
//! fixture trace shipped in kvgate-replay with `--json` and `--plots`, the
//! documented JSON schema, bad-line handling, a short live-mode run through
//! real `kvgate serve` and `kvgate sim` processes, and `--help`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::process::{Command, Output};

use serde_json::Value;

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../kvgate-replay/tests/fixtures/mooncake_conversation_head200.jsonl")
}

fn scratch(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("replay_cli_{name}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn kvgate(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kvgate")).arg("replay").args(args).output().unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn a_fast_comparison_writes_the_documented_json_and_charts() {
    let dir = scratch("schema");
    let json = dir.join("report.json");
    let plots = dir.join("plots");
    let out = kvgate(&[
        "--trace",
        fixture().to_str().unwrap(),
        "--limit",
        "100",
        "--policies",
        "kv_aware,least_load,round_robin",
        "--sweep-rate",
        "2,4",
        "--jobs",
        "2",
        "--json",
        json.to_str().unwrap(),
        "--plots",
        plots.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    let table = text(&out.stdout);
    assert!(table.contains("kv_aware") && table.contains("round_robin"), "{table}");
    // stderr is a pipe here: no bar, but the plain progress line at the end
    // (3 policies × 2 rates × 100 requests).
    let err = text(&out.stderr);
    assert!(err.contains("kvgate replay: replaying: 600/600 requests (100 %)"), "{err}");

    let doc: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(doc["mode"], "fast");
    assert_eq!(doc["workload"]["requests"], 100);
    let runs = doc["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 6, "3 policies × 2 rates");
    for run in runs {
        for key in ["policy", "rate", "hit_rate", "oracle_hit_rate", "ceiling_hit_rate"] {
            assert!(run.get(key).is_some(), "{key} missing in {run}");
        }
        for q in ["mean", "p50", "p90", "p99"] {
            assert!(run["ttft_ms"][q].as_f64().unwrap() > 0.0, "ttft_ms.{q}");
        }
        assert!(run["throughput_tok_s"].as_f64().unwrap() > 0.0);
        assert!(run["ingress_cpu_us_per_req"].is_null(), "fast mode has no ingress CPU");
        let (hit, oracle, ceiling) = (
            run["hit_rate"].as_f64().unwrap(),
            run["oracle_hit_rate"].as_f64().unwrap(),
            run["ceiling_hit_rate"].as_f64().unwrap(),
        );
        assert!((0.0..=1.0).contains(&hit) && oracle <= ceiling + 1e-12);
        assert_eq!(run["completed"], 100);
    }
    assert_eq!(runs[0]["rate_scale"], 2.0);
    assert_eq!(runs[3]["rate_scale"], 4.0);
    let rate = runs[3]["rate"].as_f64().unwrap() / runs[0]["rate"].as_f64().unwrap();
    assert!((rate - 2.0).abs() < 1e-9);

    for chart in ["ttft_vs_load.svg", "ttft_cdf_x2_000.svg", "hit_rate_x4_000.svg"] {
        let svg = std::fs::read_to_string(plots.join(chart)).unwrap();
        assert!(svg.starts_with("<svg") && svg.contains("</svg>"), "{chart}");
    }
    assert!(plots.join("replica_load_kv_aware.svg").exists());
}

#[test]
fn bad_lines_are_skipped_with_their_number_or_fail_the_run_when_strict() {
    let dir = scratch("bad_lines");
    let trace = dir.join("trace.jsonl");
    let good = std::fs::read_to_string(fixture()).unwrap();
    let mut lines: Vec<&str> = good.lines().take(5).collect();
    lines.insert(2, "{\"timestamp\": 1, \"input_length\": 10}");
    lines.push("not json at all");
    std::fs::write(&trace, lines.join("\n")).unwrap();
    let t = trace.to_str().unwrap();

    let out = kvgate(&["--trace", t, "--policies", "least_load", "--json", "-"]);
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    let err = text(&out.stderr);
    assert!(err.contains("skipped line 3:") && err.contains("skipped line 7:"), "{err}");
    let doc: Value = serde_json::from_str(&text(&out.stdout)).unwrap();
    assert_eq!(doc["workload"]["skipped_lines"], 2);
    assert_eq!(doc["workload"]["requests"], 5);

    let out = kvgate(&["--trace", t, "--policies", "least_load", "--strict"]);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("line 3:"), "{}", text(&out.stderr));
}

#[test]
fn conversation_files_go_through_the_chat_template() {
    let dir = scratch("messages");
    let trace = dir.join("chats.jsonl");
    let system = "You are a careful assistant. ".repeat(40);
    let mut lines = Vec::new();
    for i in 0..12 {
        let body = serde_json::json!({
            "timestamp": i * 200,
            "max_tokens": 8,
            "messages": [
                {"role": "system", "content": system},
                {"role": "user", "content": format!("Question number {i}?")}
            ]
        });
        lines.push(body.to_string());
    }
    std::fs::write(&trace, lines.join("\n")).unwrap();
    let out = kvgate(&[
        "--trace",
        trace.to_str().unwrap(),
        "--policies",
        "kv_aware,round_robin",
        "--json",
        "-",
    ]);
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    let doc: Value = serde_json::from_str(&text(&out.stdout)).unwrap();
    assert_eq!(doc["workload"]["requests"], 12);
    // The shared system prompt renders to a shared prefix: the bounds see reuse.
    assert!(doc["ceiling_hit_rate"].as_f64().unwrap() > 0.5, "{}", doc["ceiling_hit_rate"]);
    let kv = &doc["runs"][0];
    assert_eq!(kv["policy"], "kv_aware");
    assert!(kv["hit_rate"].as_f64().unwrap() > 0.4, "{kv}");
}

#[test]
fn synthetic_workloads_and_errors() {
    let out = kvgate(&[
        "--workload",
        "synthetic:noreuse,requests=60,input_tokens=512",
        "--policies",
        "kv_aware,least_load",
        "--json",
        "-",
    ]);
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    let doc: Value = serde_json::from_str(&text(&out.stdout)).unwrap();
    assert_eq!(doc["ceiling_hit_rate"], 0.0);

    let out = kvgate(&["--mode", "live", "--workload", "synthetic:chat", "--sweep-rate", "auto"]);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("fast mode only"));

    let out = kvgate(&["--workload", "synthetic:video"]);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("unknown generator"));

    let out = kvgate(&["--workload", "synthetic:chat", "--policies", "fastest"]);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("unknown policy"));
}

#[test]
fn help_documents_every_flag() {
    let out = kvgate(&["--help"]);
    assert!(out.status.success());
    let help = text(&out.stdout);
    for flag in [
        "--mode",
        "--trace",
        "--format",
        "--workload",
        "--strict",
        "--limit",
        "--rate-scale",
        "--sweep-rate",
        "--levels",
        "--unloaded-rate-scale",
        "--bisect-iterations",
        "--bisect-tolerance",
        "--speedup",
        "--policies",
        "--seed",
        "--replicas",
        "--block-size",
        "--num-gpu-blocks",
        "--num-cpu-blocks",
        "--max-num-batched-tokens",
        "--max-num-seqs",
        "--timing",
        "--event-delay-ms",
        "--jobs",
        "--json",
        "--plots",
        "--target",
        "--target-pid",
        "--api-key",
        "--max-in-flight",
        "--model",
        "--set",
        "--suite",
        "--suite-traces",
    ] {
        assert!(help.contains(flag), "{flag} missing from --help");
    }
}

/// `--suite` on stand-in traces (the fixture under both names): five
/// reports, one scoreboard row per workload and level, ratios to the best
/// policy, and a TTFT floor no policy beats.
#[test]
fn the_suite_scores_every_workload_and_level_against_the_best_policy() {
    let dir = scratch("suite");
    for name in ["mooncake_conversation_trace.jsonl", "mooncake_synthetic_trace.jsonl"] {
        std::fs::copy(fixture(), dir.join(name)).unwrap();
    }
    let json = dir.join("suite.json");
    let out = kvgate(&[
        "--suite",
        "--suite-traces",
        dir.to_str().unwrap(),
        "--limit",
        "60",
        "--replicas",
        "2",
        "--policies",
        "kv_aware,least_load",
        "--levels",
        "2",
        "--bisect-iterations",
        "2",
        "--set",
        "router.cost.work_weight=2",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let table = text(&out.stdout);
    assert!(table.contains("ttft_vs_floor") && table.contains("synthetic:noreuse"), "{table}");
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let reports = doc["reports"].as_array().unwrap();
    assert_eq!(reports.len(), 5);
    for r in reports {
        for run in r["runs"].as_array().unwrap() {
            let floor = run["ttft_floor_ms"].as_f64().unwrap();
            let mean = run["ttft_ms"]["mean"].as_f64().unwrap();
            assert!(floor > 0.0 && floor <= mean + 1e-9, "floor {floor} above mean {mean}: {run}");
        }
    }
    let board = doc["scoreboard"].as_array().unwrap();
    assert_eq!(board.len(), 5, "one level per workload");
    for level in board {
        let policies = level["policies"].as_array().unwrap();
        assert_eq!(policies.len(), 2);
        // The best policy's mean TTFT ratio is 1, the other's at least 1.
        let ratios: Vec<f64> =
            policies.iter().map(|p| p["metrics"][0][2].as_f64().unwrap()).collect();
        assert_eq!(p_min(&ratios), 1.0, "{level}");
        assert!(ratios.iter().all(|r| *r >= 1.0), "{level}");
    }
    // A router setting that is not a router key is refused.
    let bad = kvgate(&["--workload", "synthetic:noreuse", "--set", "model.served_name=x"]);
    assert!(!bad.status.success());
    assert!(text(&bad.stderr).contains("router settings only"), "{}", text(&bad.stderr));
}

fn p_min(xs: &[f64]) -> f64 {
    xs.iter().copied().fold(f64::INFINITY, f64::min)
}

/// Live mode end to end: a fresh `kvgate sim` fleet and `kvgate serve` per
/// policy, every request served over HTTP, engine-counter hit rates, and the
/// ingress CPU measured; the hit rate agrees with fast mode on the same
/// workload (issue 7: within 5 points).
#[test]
fn a_live_run_serves_every_request_and_agrees_with_fast_mode() {
    let dir = scratch("live");
    let workload =
        "synthetic:chat,conversations=6,turns=3,system_tokens=512,user_tokens=64,output_tokens=8,think_s=2,rate=4";
    let common = [
        "--workload",
        workload,
        "--policies",
        "kv_aware",
        "--replicas",
        "2",
        "--num-gpu-blocks",
        "2048",
        "--timing",
        "dynamo_mocker",
    ];
    let live_json = dir.join("live.json");
    let mut args = common.to_vec();
    // Speedup 2, not 10: at 10× the model's gaps between arrivals (25 ms of
    // wall time) are no longer than a loaded 2-core machine's scheduling
    // delays, so requests really overlap live, the router rightly spills a
    // turn to the idle replica, and the hit rate drops one decision (6
    // points) below fast mode's. Measured under three CPU burners: 3 of 8
    // runs at 10×, 0 of 8 at 2×.
    args.extend(["--mode", "live", "--speedup", "2", "--json", live_json.to_str().unwrap()]);
    let out = kvgate(&args);
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    let live: Value = serde_json::from_str(&std::fs::read_to_string(&live_json).unwrap()).unwrap();
    let run = &live["runs"][0];
    assert_eq!(run["completed"], run["requests"], "{run}");
    assert_eq!(run["requests"], 18);
    assert!(run["ingress_cpu_us_per_req"].as_f64().unwrap() > 0.0, "{run}");
    assert!(run["ttft_ms"]["mean"].as_f64().unwrap() > 0.0);

    let fast_json = dir.join("fast.json");
    let mut args = common.to_vec();
    args.extend(["--json", fast_json.to_str().unwrap()]);
    let out = kvgate(&args);
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    let fast: Value = serde_json::from_str(&std::fs::read_to_string(&fast_json).unwrap()).unwrap();
    let (l, f) = (run["hit_rate"].as_f64().unwrap(), fast["runs"][0]["hit_rate"].as_f64().unwrap());
    eprintln!("hit rate: live {l}, fast {f}");
    assert!(l > 0.3, "live hit rate {l}: the conversations share prefixes");
    assert!((l - f).abs() <= 0.05, "live {l} vs fast {f}");
}
