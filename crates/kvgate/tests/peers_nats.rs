//! Several kvgate instances sharing their load over NATS, as processes: a
//! real `nats-server` (Debian's package; `.ci/run` installs it) on a free
//! loopback port, and kvgate instances in front of the same simulated
//! replicas, each publishing its bookings on one subject. A booking on one
//! instance must show in the others' ledgers and not twice in its own; a
//! batch carrying an instance's own id is dropped by that instance; a peer
//! that dies is released; a lost server never blocks routing and sharing
//! resumes when it returns; wrong credentials stop the start with the reason;
//! an nkey user over TLS connects, and a CA that does not match is refused.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use support::*;

const TOKEN: &str = "nats-token-for-tests";
const SUBJECT: &str = "kvgate.tests.peers";

/// `nats-server`, from `KVGATE_NATS_SERVER` or the `PATH`.
fn nats_server_bin() -> String {
    let bin = std::env::var("KVGATE_NATS_SERVER").unwrap_or_else(|_| "nats-server".to_owned());
    let found = Command::new(&bin).arg("--version").output().is_ok_and(|o| o.status.success());
    assert!(
        found,
        "{bin} not found: these tests start a real NATS server. Install it \
         (`apt-get install nats-server`, as .ci/run does) or point KVGATE_NATS_SERVER at one."
    );
    bin
}

/// A `nats-server` on `port` (loopback), with `auth` flags, killed on drop.
fn spawn_nats(port: u16, auth: &[&str]) -> Kill {
    let child = Command::new(nats_server_bin())
        .args(["-a", "127.0.0.1", "-p", &port.to_string()])
        .args(auth)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let child = Kill(child);
    let t0 = Instant::now();
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(t0.elapsed() < Duration::from_secs(10), "nats-server on {port} did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    child
}

/// Publishes `payloads` on `subject` as a plain NATS client (the wire
/// protocol by hand), and waits for the server's PONG so that they have
/// been delivered to subscribers' connections.
fn publish_raw(port: u16, token: Option<&str>, subject: &str, payloads: &[&[u8]]) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut r = BufReader::new(s.try_clone().unwrap());
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    assert!(line.starts_with("INFO"), "{line}");
    let auth = token.map_or(String::new(), |t| format!(r#","auth_token":"{t}""#));
    let mut out =
        format!("CONNECT {{\"verbose\":false,\"pedantic\":false{auth}}}\r\n").into_bytes();
    for p in payloads {
        out.extend_from_slice(format!("PUB {subject} {}\r\n", p.len()).as_bytes());
        out.extend_from_slice(p);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"PING\r\n");
    s.write_all(&out).unwrap();
    loop {
        line.clear();
        r.read_line(&mut line).unwrap();
        assert!(!line.starts_with("-ERR"), "nats-server refused the test's publish: {line}");
        if line.starts_with("PONG") {
            return;
        }
    }
}

/// Short requests on `base` that must each succeed quickly.
async fn quick_requests(base: &str, n: u32, seed: u32) {
    let url = format!("{base}/v1/completions");
    for i in 0..n {
        let prompt: Vec<u32> = (0..32).map(|t| 50_000 + seed * 1000 + i * 100 + t).collect();
        let t = Instant::now();
        let r =
            client().post(&url).json(&token_completion(&prompt, 2, false)).send().await.unwrap();
        assert_eq!(r.status(), 200);
        let _: Value = r.json().await.unwrap();
        assert!(t.elapsed() < Duration::from_secs(3), "a request took {:?}", t.elapsed());
    }
}

fn instance(sims: &[&Sim], nats: u16, extra: &[&str]) -> Serve {
    let url = format!("nats://127.0.0.1:{nats}");
    let mut args =
        vec!["--peer-nats", &url, "--peer-nats-subject", SUBJECT, "--set", "peers.timeout_ms=900"];
    args.extend_from_slice(extra);
    spawn_serve(sims, &args)
}

/// The instance id of the peer that `base` has received changes from.
async fn busiest_peer(base: &str) -> String {
    let text = client().get(format!("{base}/metrics")).send().await.unwrap().text().await.unwrap();
    text.lines()
        .filter_map(|l| l.strip_prefix("kvgate_peer_changes_received_total{peer=\""))
        .filter_map(|l| {
            let (id, rest) = l.split_once("\"} ")?;
            Some((id.to_owned(), rest.parse::<f64>().ok()?))
        })
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .map(|(id, _)| id)
        .expect("no peer changes received")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_share_load_over_nats() {
    let flags = ["--speedup", "2"];
    let sims = [
        spawn_sim(None, true, &flags),
        spawn_sim(None, true, &flags),
        spawn_sim(None, true, &flags),
    ];
    let refs: Vec<&Sim> = sims.iter().collect();
    let port = free_ports(1)[0];
    let _nats = spawn_nats(port, &["--auth", TOKEN]);
    let token = ["--peer-nats-token", TOKEN];
    let a = instance(&refs, port, &token);
    let b = instance(&refs, port, &token);
    let mut c = instance(&refs, port, &token);
    for s in [&a, &b, &c] {
        wait_ready(&s.base).await;
    }
    for s in [&a, &b, &c] {
        wait_for("connected to NATS", Duration::from_secs(5), async || {
            metric(&s.base, "kvgate_peer_bus_connected").await == 1.0
        })
        .await;
    }

    // 1. A's bookings reach B and C, once each; A holds its own once (its
    // batches are not applied back to it), and their end reaches everyone.
    let streams = long_streams(&a.base, 4, 1);
    for s in [&b, &c] {
        wait_for("a peer sees A's 4 bookings", Duration::from_secs(5), async || {
            booked(&s.admin).await == 4
        })
        .await;
    }
    assert_eq!(booked(&a.admin).await, 4, "A's own bookings counted twice");
    assert!(metric(&b.base, "kvgate_peer_changes_received_total").await >= 4.0);
    let sent = format!("target=\"nats:{SUBJECT}\"");
    assert!(metric_with(&a.base, "kvgate_peer_batches_sent_total", &sent).await >= 1.0);
    for s in streams {
        assert!(s.await.unwrap() > 0);
    }
    for s in [&a, &b, &c] {
        wait_for("A's bookings end everywhere", Duration::from_secs(5), async || {
            booked(&s.admin).await == 0
        })
        .await;
    }

    // 2. A batch that carries A's instance id is dropped by A, applied by B.
    let a_id = busiest_peer(&b.base).await;
    let id = 1u64 << 40;
    let book = format!(
        r#"{{"instance":"{a_id}","sent_unix_ms":0,"changes":[{{"kind":"book","id":{id},"replica":"r0","prefill_tokens":64,"blocks":4}}]}}"#
    );
    publish_raw(port, Some(TOKEN), SUBJECT, &[book.as_bytes(), b"not a batch"]);
    wait_for("B applies the forged batch", Duration::from_secs(5), async || {
        booked(&b.admin).await == 1
    })
    .await;
    assert_eq!(booked(&a.admin).await, 0, "A applied a batch with its own instance id");
    wait_for("undecodable messages counted", Duration::from_secs(5), async || {
        metric(&a.base, "kvgate_peer_bus_undecodable_total").await == 1.0
    })
    .await;
    let finish = format!(
        r#"{{"instance":"{a_id}","sent_unix_ms":0,"changes":[{{"kind":"finish","id":{id}}}]}}"#
    );
    publish_raw(port, Some(TOKEN), SUBJECT, &[finish.as_bytes()]);
    wait_for("B ends the forged booking", Duration::from_secs(5), async || {
        booked(&b.admin).await == 0
    })
    .await;

    // 3. C dies with bookings in flight: A and B keep routing at once, and
    // release C's bookings once it has been silent for the timeout.
    let _streams = long_streams(&c.base, 3, 2);
    for s in [&a, &b] {
        wait_for("a peer sees C's 3 bookings", Duration::from_secs(5), async || {
            booked(&s.admin).await == 3
        })
        .await;
    }
    let _ = c.proc.0.kill();
    let _ = c.proc.0.wait();
    let killed = Instant::now();
    quick_requests(&b.base, 6, 1).await;
    for s in [&a, &b] {
        wait_for("C's bookings released", Duration::from_secs(5), async || {
            booked(&s.admin).await == 0
        })
        .await;
    }
    eprintln!("peer killed: its 3 bookings released after {:?} (timeout 0.9 s)", killed.elapsed());
    for s in [&a, &b] {
        assert!(metric(&s.base, "kvgate_peers_forgotten_total").await >= 1.0);
        let gone =
            metric_with(&s.base, "kvgate_ledger_releases_total", "reason=\"peer_gone\"").await;
        assert!(gone >= 3.0, "peer_gone releases: {gone}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_nats_server_never_blocks_routing_and_sharing_resumes() {
    let flags = ["--speedup", "2"];
    let sims = [spawn_sim(None, true, &flags), spawn_sim(None, true, &flags)];
    let refs: Vec<&Sim> = sims.iter().collect();
    let port = free_ports(1)[0];
    let nats = spawn_nats(port, &[]);
    let a = instance(&refs, port, &[]);
    let b = instance(&refs, port, &[]);
    wait_ready(&a.base).await;
    wait_ready(&b.base).await;
    let streams = long_streams(&a.base, 2, 3);
    wait_for("B sees A's 2 bookings", Duration::from_secs(5), async || booked(&b.admin).await == 2)
        .await;

    // The server goes: both instances keep serving on their own load,
    // say so in metrics, and B releases A's bookings after the timeout.
    drop(nats);
    quick_requests(&a.base, 4, 2).await;
    quick_requests(&b.base, 4, 3).await;
    for s in [&a, &b] {
        wait_for("the lost connection shows", Duration::from_secs(5), async || {
            metric(&s.base, "kvgate_peer_bus_connected").await == 0.0
        })
        .await;
        assert!(metric(&s.base, "kvgate_peer_bus_disconnects_total").await >= 1.0);
    }
    wait_for("B releases A's bookings", Duration::from_secs(5), async || {
        booked(&b.admin).await == 0
    })
    .await;
    for s in streams {
        assert!(s.await.unwrap() > 0, "a stream broke while NATS was down");
    }
    assert!(metric(&a.base, "kvgate_peer_send_failures_total").await >= 1.0);

    // It returns on the same port: both reconnect and subscribe again.
    let _nats = spawn_nats(port, &[]);
    let back = Instant::now();
    for s in [&a, &b] {
        wait_for("reconnected", Duration::from_secs(5), async || {
            metric(&s.base, "kvgate_peer_bus_connected").await == 1.0
        })
        .await;
    }
    let _streams = long_streams(&a.base, 2, 4);
    wait_for("B sees A's bookings again", Duration::from_secs(5), async || {
        booked(&b.admin).await == 2
    })
    .await;
    eprintln!("sharing resumed {:?} after the server returned", back.elapsed());
}

/// Runs `kvgate serve` that is expected to refuse to start; returns its stderr.
fn refused_start(args: &[&str]) -> String {
    let mut cmd = kvgate_cmd();
    cmd.args(["serve", "--listen", "127.0.0.1:0", "--sim-replicas", "1", "--log", "warn"]);
    let mut child =
        Kill(cmd.args(args).stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap());
    let t0 = Instant::now();
    let status = loop {
        if let Some(s) = child.0.try_wait().unwrap() {
            break s;
        }
        assert!(t0.elapsed() < Duration::from_secs(30), "kvgate serve did not stop: {args:?}");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(!status.success(), "kvgate serve started with {args:?}");
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.0.stderr.take().unwrap(), &mut err).unwrap();
    err
}

/// Starts one instance (one simulated replica) on the NATS server at
/// `url` with `args`, and waits until it is ready and connected.
async fn connects(url: &str, args: &[&str], how: &str) {
    let mut all = vec!["--sim-replicas", "1", "--peer-nats", url];
    all.extend_from_slice(args);
    let ok = spawn_serve_with(&[], &all);
    wait_ready(&ok.base).await;
    wait_for(&format!("connected {how}"), Duration::from_secs(5), async || {
        metric(&ok.base, "kvgate_peer_bus_connected").await == 1.0
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_nats_credentials_stop_the_start_with_the_reason() {
    let port = free_ports(1)[0];
    let url = format!("nats://127.0.0.1:{port}");
    let _nats = spawn_nats(port, &["--auth", TOKEN]);
    let err = refused_start(&["--peer-nats", &url, "--peer-nats-token", "not-the-token"]);
    assert!(
        err.contains("peers.nats") && err.contains("refused this instance's credentials"),
        "{err}"
    );
    assert!(err.to_lowercase().contains("authorization violation"), "{err}");
    let err = refused_start(&["--peer-nats", &url]);
    assert!(err.contains("refused this instance's credentials"), "{err}");
    // Configuration mistakes are named before anything connects.
    let err = refused_start(&["--peer-nats", &url, "--peer-nats-subject", "kvgate.*"]);
    assert!(err.contains("peers.nats.subject"), "{err}");
    let err = refused_start(&["--peer-nats", &url, "--peer-listen", "127.0.0.1:0"]);
    assert!(err.contains("not both"), "{err}");

    // User and password: the right pair connects, a wrong one is refused.
    let port = free_ports(1)[0];
    let url = format!("nats://127.0.0.1:{port}");
    let _nats = spawn_nats(port, &["--user", "kvgate", "--pass", "s3cret-pass"]);
    let err = refused_start(&[
        "--peer-nats",
        &url,
        "--peer-nats-user",
        "kvgate",
        "--peer-nats-password",
        "wrong",
    ]);
    assert!(err.contains("refused this instance's credentials"), "{err}");
    let creds = ["--peer-nats-user", "kvgate", "--peer-nats-password", "s3cret-pass"];
    connects(&url, &creds, "with user and password").await;
}

/// A CA and a server certificate for 127.0.0.1 signed by it, as PEM files
/// in `dir`: (CA, certificate, key).
fn tls_files(dir: &std::path::Path, name: &str) -> (String, String, String) {
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};
    let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.distinguished_name.push(DnType::CommonName, name);
    let ca = CertifiedIssuer::self_signed(p, KeyPair::generate().unwrap()).unwrap();
    let leaf =
        CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()]).unwrap();
    let key = KeyPair::generate().unwrap();
    let cert = leaf.signed_by(&key, &ca).unwrap();
    let write = |file: &str, text: String| {
        let path = dir.join(format!("{name}-{file}"));
        std::fs::write(&path, text).unwrap();
        path.to_string_lossy().into_owned()
    };
    (
        write("ca.pem", ca.pem()),
        write("cert.pem", cert.pem()),
        write("key.pem", key.serialize_pem()),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_nkey_user_connects_over_tls_and_a_foreign_ca_is_refused() {
    let dir = std::env::temp_dir().join(format!("kvgate-nats-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (ca, cert, key) = tls_files(&dir, "server");
    let (other_ca, _, _) = tls_files(&dir, "other");
    let user = nkeys::KeyPair::new_user();
    let seed_file = dir.join("user.nk");
    std::fs::write(&seed_file, format!("{}\n", user.seed().unwrap())).unwrap();
    let port = free_ports(1)[0];
    let conf = dir.join("nats.conf");
    std::fs::write(
        &conf,
        format!(
            "listen: \"127.0.0.1:{port}\"\n\
             tls {{ cert_file: \"{cert}\", key_file: \"{key}\", timeout: 2 }}\n\
             authorization {{ users = [ {{ nkey: \"{}\" }} ] }}\n",
            user.public_key()
        ),
    )
    .unwrap();
    let _nats = spawn_nats(port, &["-c", &conf.to_string_lossy()]);
    let url = format!("tls://127.0.0.1:{port}");
    let seed = format!("peers.nats.nkey_seed_file={}", seed_file.display());

    let err = refused_start(&[
        "--peer-nats",
        &url,
        "--set",
        &seed,
        "--set",
        &format!("peers.nats.ca={other_ca}"),
    ]);
    assert!(err.contains("TLS failed"), "{err}");

    let ca = format!("peers.nats.ca={ca}");
    connects(&url, &["--set", &seed, "--set", &ca], "over TLS as the nkey user").await;
    let _ = std::fs::remove_dir_all(&dir);
}
