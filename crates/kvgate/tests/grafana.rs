//! The Grafana dashboard (`deploy/grafana/kvgate.json`) and the Prometheus
//! alert rules (`deploy/prometheus/kvgate-alerts.yaml`) name only series
//! that exist: every `kvgate_` series their queries read is on a running
//! kvgate's `/metrics` (in front of a simulated replica, after a streamed and
//! a whole request), and every `vllm:` series on the replica's. A renamed
//! metric would otherwise leave an empty panel or an alert that never fires.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::Value;
use support::{chat_ok, client, spawn_serve, spawn_sim, wait_ready};

mod support;

fn deploy(path: &str) -> String {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../deploy").join(path);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// The series names a PromQL expression reads: `kvgate_…` and `vllm:…`.
fn series_in(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    for prefix in ["kvgate_", "vllm:"] {
        let mut rest = expr;
        while let Some(at) = rest.find(prefix) {
            let tail = &rest[at + prefix.len()..];
            let len = tail
                .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'))
                .unwrap_or(tail.len());
            // Not the tail of a longer word (`x_kvgate_…`).
            let boundary =
                rest[..at].chars().last().is_none_or(|c| !(c.is_ascii_alphanumeric() || c == '_'));
            if boundary && len > 0 {
                out.push(format!("{prefix}{}", &tail[..len]));
            }
            rest = &tail[len..];
        }
    }
    out
}

/// vLLM 0.33's own Prometheus code (`scripts/fetch-vllm-code.sh`): the
/// `vllm:` series the dashboard reads must be ones it defines, not only ones
/// the simulator exports.
fn vllm_metrics_code() -> String {
    let code = std::env::var_os("KVGATE_VLLM_CODE").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.cache/vllm-0.33.0"),
        PathBuf::from,
    );
    let file = code.join("vllm/v1/metrics/loggers.py");
    std::fs::read_to_string(&file).unwrap_or_else(|e| {
        panic!(
            "{}: {e}: run `bash scripts/fetch-vllm-code.sh` (scripts/test.sh does)",
            file.display()
        )
    })
}

/// Every query of the dashboard, with its panel's title; the dashboard is
/// Grafana's model: a schema version, a Prometheus data-source variable
/// that every panel and query uses, and panels with grid positions.
fn dashboard_queries() -> Vec<(String, String)> {
    let d: Value = serde_json::from_str(&deploy("grafana/kvgate.json")).unwrap();
    assert_eq!(d["uid"], "kvgate");
    assert!(d["schemaVersion"].as_u64().is_some_and(|v| v >= 30), "schemaVersion");
    let vars = d["templating"]["list"].as_array().unwrap();
    let ds = vars.iter().find(|v| v["type"] == "datasource").expect("a data-source variable");
    assert_eq!(ds["query"], "prometheus");
    let ds_ref = format!("${{{}}}", ds["name"].as_str().unwrap());
    for v in vars.iter().filter(|v| v["type"] == "query") {
        assert_eq!(v["datasource"]["uid"], ds_ref.as_str(), "variable {}", v["name"]);
    }
    let mut out = Vec::new();
    for p in d["panels"].as_array().unwrap() {
        if p["type"] == "row" {
            continue;
        }
        let title = p["title"].as_str().unwrap().to_owned();
        assert_eq!(p["datasource"]["uid"], ds_ref.as_str(), "{title}");
        for k in ["h", "w", "x", "y"] {
            assert!(p["gridPos"][k].as_u64().is_some(), "{title}: gridPos.{k}");
        }
        assert!(
            p["description"].as_str().is_some_and(|s| !s.is_empty()),
            "{title}: no description"
        );
        let targets = p["targets"].as_array().unwrap();
        assert!(!targets.is_empty(), "{title}: no query");
        for t in targets {
            assert_eq!(t["datasource"]["uid"], ds_ref.as_str(), "{title}");
            out.push((title.clone(), t["expr"].as_str().unwrap().to_owned()));
        }
    }
    out
}

/// Every alert's expression, with its name; each has a severity and a summary.
fn alert_queries() -> Vec<(String, String)> {
    let rules: serde_norway::Value =
        serde_norway::from_str(&deploy("prometheus/kvgate-alerts.yaml")).unwrap();
    let mut out = Vec::new();
    for group in rules["groups"].as_sequence().unwrap() {
        for r in group["rules"].as_sequence().unwrap() {
            let name = r["alert"].as_str().unwrap().to_owned();
            assert!(r["labels"]["severity"].as_str().is_some(), "{name}: no severity");
            assert!(r["annotations"]["summary"].as_str().is_some(), "{name}: no summary");
            assert!(r["for"].as_str().is_some(), "{name}: fires on one bad scrape");
            out.push((name, r["expr"].as_str().unwrap().to_owned()));
        }
    }
    out
}

/// The series names on a Prometheus page.
async fn exposed(url: &str) -> BTreeSet<String> {
    let text = client().get(format!("{url}/metrics")).send().await.unwrap().text().await.unwrap();
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| l.split(['{', ' ']).next().unwrap().to_owned())
        .collect()
}

#[test]
fn the_series_reader_finds_names_and_only_names() {
    let q = r#"sum by (pool) (rate(kvgate_pool_prompt_tokens_total{kind="routed",job=~"$job"}[5m])) / on (replica) vllm:num_requests_running"#;
    assert_eq!(series_in(q), ["kvgate_pool_prompt_tokens_total", "vllm:num_requests_running"]);
    assert!(series_in("rate(my_kvgate_x[1m])").is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_and_alerts_read_series_that_exist() {
    let queries: Vec<(String, String)> =
        dashboard_queries().into_iter().chain(alert_queries()).collect();
    assert!(queries.len() >= 20, "{} queries", queries.len());

    let sim = spawn_sim(None, false, &[]);
    // With a tenant queue, so that the tenant panels' series exist.
    let config = std::env::temp_dir().join(format!("kvgate-grafana-{}.toml", std::process::id()));
    std::fs::write(&config, "[tenants]\n").unwrap();
    let serve = spawn_serve(&[&sim], &["--config", config.to_str().unwrap()]);
    wait_ready(&serve.base).await;
    let prompt = "The dashboard reads what kvgate exports. ".repeat(20);
    for stream in [false, true] {
        chat_ok(&serve.base, &prompt, stream, &[]).await;
    }
    // The engine's counters reach kvgate on its next scrape.
    let t0 = Instant::now();
    let (mut have, mut missing) = (BTreeSet::new(), Vec::new());
    while t0.elapsed() < Duration::from_secs(20) {
        have = exposed(&serve.base).await;
        have.extend(exposed(&sim.url).await);
        missing = queries
            .iter()
            .flat_map(|(who, q)| series_in(q).into_iter().map(move |s| (who.clone(), s)))
            .filter(|(_, s)| !have.contains(s))
            .collect();
        if missing.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let _ = std::fs::remove_file(&config);
    assert!(missing.is_empty(), "series no one exports: {missing:?}\nexported: {have:?}");
    // vLLM names its series without the `_total`, `_bucket`, `_sum` and
    // `_count` suffixes its client library adds.
    let vllm = vllm_metrics_code();
    for (who, q) in &queries {
        for s in series_in(q).into_iter().filter(|s| s.starts_with("vllm:")) {
            let base = ["_total", "_bucket", "_sum", "_count"]
                .iter()
                .find_map(|suffix| s.strip_suffix(suffix))
                .unwrap_or(&s);
            assert!(
                vllm.contains(&format!("\"{base}\"")),
                "{who}: {s} is not defined by vLLM 0.33"
            );
        }
    }
}
