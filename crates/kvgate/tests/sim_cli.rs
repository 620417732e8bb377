//! `kvgate sim` as a black box: replicas start, print their endpoints and
//! serve vLLM's HTTP API on loopback.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

struct Kill(Child);

impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// One HTTP/1.1 exchange with `Connection: close`; returns (status, body).
fn http(url: &str, method: &str, path: &str, body: &str) -> (u16, String) {
    let addr = url.strip_prefix("http://").unwrap();
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let status = out.split(' ').nth(1).unwrap().parse().unwrap();
    let body = out.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default();
    (status, body)
}

#[test]
fn sim_starts_replicas_and_serves_http() {
    let child = Command::new(env!("CARGO_BIN_EXE_kvgate"))
        .args([
            "sim",
            "--port",
            "0",
            "--replicas",
            "2",
            "--events",
            "tcp://[::1]:0",
            "--replay",
            "tcp://127.0.0.1:0",
            "--hash-seed",
            "3",
            "--speedup",
            "20",
            "--event-layout",
            "v0.11",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut child = Kill(child);
    let mut lines = BufReader::new(child.0.stdout.take().unwrap()).lines();
    let mut urls = Vec::new();
    for i in 0..2 {
        let line = lines.next().unwrap().unwrap();
        assert!(line.starts_with(&format!("replica {i}: http=http://127.0.0.1:")), "{line}");
        assert!(line.contains(" events=tcp://[::1]:") && line.contains(" replay=tcp://"), "{line}");
        let url = line.split("http=").nth(1).unwrap().split(' ').next().unwrap().to_owned();
        urls.push(url);
    }
    assert_ne!(urls[0], urls[1]);
    for url in &urls {
        assert_eq!(http(url, "GET", "/health", "").0, 200);
        let (status, body) =
            http(url, "POST", "/v1/completions", r#"{"prompt": [1, 2, 3, 4], "max_tokens": 2}"#);
        assert_eq!(status, 200, "{body}");
        assert!(body.contains(r#""completion_tokens":2"#), "{body}");
        let (status, metrics) = http(url, "GET", "/metrics", "");
        assert_eq!(status, 200);
        assert!(metrics.contains("vllm:prefix_cache_queries_total{"), "{metrics}");
    }
}

#[test]
fn sim_rejects_bad_flags() {
    let out = Command::new(env!("CARGO_BIN_EXE_kvgate"))
        .args(["sim", "--port", "0", "--event-layout", "v9"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--event-layout"));
}

/// The sim's KV events decode with msgspec structs shaped like vLLM's, for
/// every `--event-layout` (tests/py/msgspec_subscriber.py, via replay).
#[test]
fn sim_events_decode_with_python_msgspec_for_every_layout() {
    let root = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let python = std::env::var_os("KVGATE_TEST_PYTHON")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| root.join(".cache/venv/bin/python"));
    assert!(
        python.exists(),
        "run `bash scripts/setup-test-env.sh` (the README's test command does)"
    );
    for (sim_layout, py_layout) in [("v0.11", "0.11"), ("v0.26", "0.26"), ("map", "map-batch")] {
        let child = Command::new(env!("CARGO_BIN_EXE_kvgate"))
            .args(["sim", "--port", "0", "--events", "tcp://[::1]:0"])
            .args(["--replay", "tcp://127.0.0.1:0", "--speedup", "50"])
            .args(["--event-layout", sim_layout])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut child = Kill(child);
        let mut lines = BufReader::new(child.0.stdout.take().unwrap()).lines();
        let line = lines.next().unwrap().unwrap();
        let field = |name: &str| {
            line.split(&format!("{name}=")).nth(1).unwrap().split(' ').next().unwrap().to_owned()
        };
        let (url, events, replay) = (field("http"), field("events"), field("replay"));
        // 40 prompt tokens: two full 16-token blocks get stored.
        let prompt: Vec<u32> = (100..140).collect();
        let body = format!(r#"{{"prompt": {prompt:?}, "max_tokens": 2}}"#);
        let (status, answer) = http(&url, "POST", "/v1/completions", &body);
        assert_eq!(status, 200, "{answer}");

        let out = Command::new(&python)
            .arg(root.join("tests/py/msgspec_subscriber.py"))
            .args(["--layout", py_layout, "--pub", &events, "--replay", &replay, "--replay-only"])
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{sim_layout}: {}\n{stdout}",
            String::from_utf8_lossy(&out.stderr)
        );
        let decoded: Vec<serde_json::Value> = stdout
            .lines()
            .filter(|l| l.starts_with('{'))
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let stored: Vec<&serde_json::Value> = decoded
            .iter()
            .filter(|v| v["src"] == "replay")
            .flat_map(|v| v["batch"]["events"].as_array().unwrap())
            .filter(|e| e["type"] == "BlockStored")
            .collect();
        assert!(!stored.is_empty(), "{sim_layout}: no BlockStored decoded: {stdout}");
        let first = stored[0];
        assert_eq!(first["block_size"], 16, "{sim_layout}");
        let tokens: Vec<u64> =
            first["token_ids"].as_array().unwrap().iter().map(|t| t.as_u64().unwrap()).collect();
        assert_eq!(
            tokens,
            (100..132).collect::<Vec<u64>>(),
            "{sim_layout}: the two full prompt blocks"
        );
        assert!(decoded.iter().any(|v| v["src"] == "end"), "{sim_layout}");
        assert!(stdout.contains("DONE"));
    }
}

/// `--config sim.toml`: keys are the flags' names, the command line wins,
/// and unknown keys are rejected like unknown flags.
#[test]
fn sim_config_file_applies_and_flags_win() {
    let dir = std::env::temp_dir().join(format!("kvgate-sim-config-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("sim.toml");
    std::fs::write(&file, "replicas = 2\nport = 0\nnum_gpu_blocks = 64\nmodel = \"from-file\"\n")
        .unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_kvgate"))
        .args(["sim", "--config"])
        .arg(&file)
        .args(["--replicas", "3"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut child = Kill(child);
    let mut lines = BufReader::new(child.0.stdout.take().unwrap()).lines();
    let mut urls = Vec::new();
    for i in 0..3 {
        let line = lines.next().unwrap().unwrap();
        assert!(line.starts_with(&format!("replica {i}: http=")), "{line}");
        urls.push(line.split("http=").nth(1).unwrap().split(' ').next().unwrap().to_owned());
    }
    let (status, models) = http(&urls[2], "GET", "/v1/models", "");
    assert_eq!(status, 200);
    assert!(models.contains("from-file"), "{models}");
    drop(child);

    std::fs::write(&file, "replicas = 1\nbogus_key = 1\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_kvgate"))
        .args(["sim", "--config"])
        .arg(&file)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("bogus-key"));
    let _ = std::fs::remove_dir_all(&dir);
}
