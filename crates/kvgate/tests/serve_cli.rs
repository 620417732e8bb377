//! `kvgate serve` as a black box: the README's first command (no replicas
//! configured → simulated ones on loopback) answers a chat request, and
//! SIGTERM shuts it down cleanly.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

struct Kill(Child);

impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// One HTTP/1.1 exchange with `Connection: close`; returns (status, head, body).
fn http(addr: &str, method: &str, path: &str, body: &str) -> Option<(u16, String, String)> {
    let mut s = TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    let status = out.split(' ').nth(1)?.parse().ok()?;
    let (head, body) = out.split_once("\r\n\r\n")?;
    Some((status, head.to_ascii_lowercase(), body.to_owned()))
}

/// `n` distinct free ports: the listeners are held until all are chosen, so
/// the OS cannot hand the same port out twice.
fn free_ports<const N: usize>() -> [u16; N] {
    let ls: Vec<_> = (0..N).map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap()).collect();
    std::array::from_fn(|i| ls[i].local_addr().unwrap().port())
}

#[test]
fn serve_with_no_replicas_runs_simulated_ones_and_stops_on_sigterm() {
    let [port, admin] = free_ports();
    let mut child = Kill(
        Command::new(env!("CARGO_BIN_EXE_kvgate"))
            .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
            .args(["--admin-listen", &format!("127.0.0.1:{admin}"), "--sim-replicas", "2"])
            .args(["--set", "embedded_sims.speedup=50"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let addr = format!("127.0.0.1:{port}");
    let t0 = Instant::now();
    loop {
        if let Some((200, _, body)) = http(&addr, "GET", "/ready", "") {
            assert!(body.contains("\"in_rotation\":2"), "{body}");
            break;
        }
        if let Some(status) = child.0.try_wait().unwrap() {
            let mut err = String::new();
            child.0.stderr.take().unwrap().read_to_string(&mut err).unwrap();
            panic!("kvgate serve exited early ({status}): {err}");
        }
        assert!(t0.elapsed() < Duration::from_secs(30), "not ready in 30 s");
        std::thread::sleep(Duration::from_millis(50));
    }
    let body = r#"{"model":"Qwen/Qwen3-0.6B","messages":[{"role":"user","content":"Hello!"}],"max_tokens":4}"#;
    let (status, head, body) = http(&addr, "POST", "/v1/chat/completions", body).unwrap();
    assert_eq!(status, 200, "{body}");
    assert!(head.contains("x-kvgate-replica: sim-"), "{head}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["usage"]["completion_tokens"], 4);
    // The admin API lists both simulated replicas with their event streams.
    let (status, _, body) =
        http(&format!("127.0.0.1:{admin}"), "GET", "/admin/replicas", "").unwrap();
    assert_eq!(status, 200);
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let names: Vec<&str> =
        v["replicas"].as_array().unwrap().iter().map(|r| r["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["sim-0", "sim-1"]);
    assert!(v["replicas"][0]["problems"].as_array().unwrap().is_empty(), "{body}");
    // The engines' /metrics reached the router: load, KV usage and capacity
    // from `vllm:cache_config_info` (the embedded sims have 8192 GPU blocks).
    for r in v["replicas"].as_array().unwrap() {
        assert!(r["engine_running"].is_u64(), "{body}");
        assert!(r["engine_kv_usage"].is_f64(), "{body}");
        assert_eq!(r["capacity_blocks"][0], 8192, "{body}");
    }

    // SIGTERM: a clean exit, well within the grace period.
    let pid = child.0.id().to_string();
    assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    let t0 = Instant::now();
    let status = loop {
        if let Some(s) = child.0.try_wait().unwrap() {
            break s;
        }
        assert!(t0.elapsed() < Duration::from_secs(15), "no exit after SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "{status:?}");
    let mut out = String::new();
    BufReader::new(child.0.stdout.take().unwrap()).read_line(&mut out).unwrap();
    assert!(out.starts_with("kvgate serving on http://127.0.0.1:"), "{out}");
    let mut err = String::new();
    child.0.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    assert!(err.contains("started simulated vLLM replicas"), "{err}");
    assert!(err.contains("kvgate stopped"), "{err}");
}

/// An event endpoint that cannot be dialled is refused at start, with the
/// replica and the expected form named; not discovered later as a feed that
/// restarts forever.
/// A listen port already in use is refused with its address, before the
/// simulated replicas start (serve holds its ports while they bind theirs).
#[test]
fn serve_refuses_a_listen_port_in_use() {
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = busy.local_addr().unwrap().to_string();
    let [admin] = free_ports();
    let out = Command::new(env!("CARGO_BIN_EXE_kvgate"))
        .args(["serve", "--listen", &addr, "--admin-listen", &format!("127.0.0.1:{admin}")])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&format!("cannot listen on {addr}")), "{err}");
    assert!(!err.contains("started simulated vLLM replicas"), "replicas started first: {err}");
}

#[test]
fn serve_refuses_an_event_endpoint_that_does_not_parse() {
    for ep in ["tcp://127.0.0.1:notaport", "tcp://:5557", "tcp://h:+5", "tcp://h:0", "ipc:///x"] {
        let spec = format!("http://127.0.0.1:9,events={ep}");
        let out = Command::new(env!("CARGO_BIN_EXE_kvgate"))
            .args(["serve", "--replica", &spec, "--print-config"])
            .output()
            .unwrap();
        assert!(!out.status.success(), "{ep} was accepted");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("must be tcp://HOST:PORT") && err.contains(ep), "{ep}: {err}");
    }
}

#[test]
fn serve_refuses_to_expose_itself_without_keys() {
    let out = Command::new(env!("CARGO_BIN_EXE_kvgate"))
        .args(["serve", "--listen", "0.0.0.0:0", "--print-config"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--allow-unauthenticated"), "{err}");
    // With the explicit flag, the effective config prints.
    let out = Command::new(env!("CARGO_BIN_EXE_kvgate"))
        .args(["serve", "--listen", "0.0.0.0:0", "--allow-unauthenticated", "--print-config"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("allow_unauthenticated = true"));
}

#[test]
fn print_config_leaves_secrets_out() {
    let out = Command::new(env!("CARGO_BIN_EXE_kvgate"))
        .args(["serve", "--api-key", "client-secret-1", "--admin-key", "admin-secret-2"])
        .args(["--peer-listen", "127.0.0.1:0", "--peer-key", "peer-secret-3-0123456789"])
        .args(["--replica", "http://127.0.0.1:9,events=tcp://127.0.0.1:10,api_key=engine-secret-4"])
        .arg("--print-config")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("127.0.0.1:9"), "{text}");
    for secret in ["client-secret-1", "admin-secret-2", "peer-secret-3", "engine-secret-4"] {
        assert!(!text.contains(secret), "{secret} printed:\n{text}");
    }
    // What is printed is still a configuration kvgate reads.
    assert!(toml::from_str::<toml::Table>(&text).is_ok());
}
