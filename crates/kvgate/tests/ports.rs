//! docs/security.md says what listens by default: `kvgate serve` with no
//! configuration serves the API on 127.0.0.1:8000 and admin on
//! 127.0.0.1:8001 (`kvgate epp` adds its gRPC listener on 127.0.0.1:9002),
//! and everything else it opens (the embedded simulated
//! replicas' HTTP, KV-event and replay sockets) is on loopback too. This
//! test reads the process's listening sockets from /proc and checks it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::HashSet;
use std::io::{BufRead, BufReader};
use std::process::Stdio;

use support::{kvgate_cmd, Kill};

/// Socket inodes the process holds open.
fn socket_inodes(pid: u32) -> HashSet<u64> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .flatten()
        .filter_map(|fd| std::fs::read_link(fd.path()).ok())
        .filter_map(|target| {
            let t = target.to_string_lossy().into_owned();
            t.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok()
        })
        .collect()
}

/// (address, port) of every listening TCP socket of `pid`, as text.
fn listening(pid: u32) -> Vec<(String, u16)> {
    let inodes = socket_inodes(pid);
    let mut out = Vec::new();
    for table in ["tcp", "tcp6"] {
        let text = std::fs::read_to_string(format!("/proc/{pid}/net/{table}")).unwrap();
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            // local_address, st == 0A (LISTEN), inode
            if f.len() < 10 || f[3] != "0A" || !inodes.contains(&f[9].parse().unwrap_or(0)) {
                continue;
            }
            let (addr, port) = f[1].split_once(':').unwrap();
            out.push((decode_addr(addr), u16::from_str_radix(port, 16).unwrap()));
        }
    }
    out
}

/// /proc/net's hex address (32-bit words in host order) as text.
fn decode_addr(hex: &str) -> String {
    let words: Vec<u32> = (0..hex.len() / 8)
        .map(|i| u32::from_str_radix(&hex[i * 8..i * 8 + 8], 16).unwrap())
        .collect();
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    match bytes.len() {
        4 => std::net::Ipv4Addr::new(bytes[0], bytes[1], bytes[2], bytes[3]).to_string(),
        _ => {
            let b: [u8; 16] = bytes.try_into().unwrap();
            std::net::Ipv6Addr::from(b).to_string()
        }
    }
}

fn is_loopback(addr: &str) -> bool {
    addr.parse::<std::net::IpAddr>().is_ok_and(|a| match a {
        std::net::IpAddr::V6(v6) => {
            v6.is_loopback() || v6.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback())
        }
        v4 => v4.is_loopback(),
    })
}

/// Starts `kvgate ARGS`, waits for its first line on stdout, and returns
/// the process, that line and its listening sockets.
fn start(args: &[&str], what: &str) -> (Kill, String, Vec<(String, u16)>) {
    let child =
        kvgate_cmd().args(args).stdout(Stdio::piped()).stderr(Stdio::null()).spawn().unwrap();
    let mut child = Kill(child);
    let line = BufReader::new(child.0.stdout.take().unwrap()).lines().next();
    let line = line.unwrap_or_else(|| panic!("kvgate exited before serving ({what})")).unwrap();
    let sockets = listening(child.0.id());
    eprintln!("listening: {sockets:?}");
    let exposed: Vec<_> = sockets.iter().filter(|(a, _)| !is_loopback(a)).collect();
    assert!(exposed.is_empty(), "listening beyond loopback by default: {exposed:?}");
    (child, line, sockets)
}

#[test]
fn serve_by_default_listens_on_loopback_only() {
    let (child, line, sockets) = start(&["serve", "--log", "warn"], "ports 8000/8001 taken?");
    assert!(
        line.starts_with("kvgate serving on http://127.0.0.1:8000 (admin: http://127.0.0.1:8001)"),
        "{line}"
    );
    let ports: HashSet<u16> = sockets.iter().map(|(_, p)| *p).collect();
    assert!(ports.contains(&8000) && ports.contains(&8001), "{sockets:?}");
    // The embedded replicas: HTTP, events and replay for each of the 4.
    assert!(sockets.len() >= 2 + 4 * 3, "{sockets:?}");
    drop(child);
}

#[test]
fn epp_by_default_listens_on_loopback_only() {
    // The HTTP listeners on ports of the OS's choosing, so that this test
    // and the one above can run at once; the gRPC listener on its default.
    let args =
        ["epp", "--log", "warn", "--http-listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"];
    let (child, line, sockets) = start(&args, "port 9002 taken?");
    assert_eq!(line, "kvgate endpoint picker (ext_proc gRPC) on 127.0.0.1:9002");
    assert!(sockets.iter().any(|(_, p)| *p == 9002), "{sockets:?}");
    drop(child);
}

#[test]
fn proc_net_addresses_decode() {
    assert_eq!(decode_addr("0100007F"), "127.0.0.1");
    assert_eq!(decode_addr("00000000000000000000000001000000"), "::1");
    assert!(is_loopback("::ffff:127.0.0.1"));
    assert!(!is_loopback("0.0.0.0") && !is_loopback("::"));
}
