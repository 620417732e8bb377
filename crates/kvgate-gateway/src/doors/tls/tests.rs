//! TLS end to end, with certificates made here (rcgen): weak files refused,
//! the listeners over TLS and mutual TLS (HTTP and the endpoint picker's
//! gRPC), a certificate reloaded without a restart, and https:// engines
//! that must present a valid certificate (a TLS front in the test forwards
//! to a simulated engine).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_client::ExternalProcessorClient;
use envoy_types::pb::envoy::service::ext_proc::v3::processing_request::Request as Msg;
use envoy_types::pb::envoy::service::ext_proc::v3::processing_response::Response as Reply;
use envoy_types::pb::envoy::service::ext_proc::v3::{HttpBody, HttpHeaders, ProcessingRequest};
use futures_util::StreamExt;
use kvgate_events::publisher::{loopback_endpoint, PublisherConfig};
use kvgate_sim::server::{start, Replica as Sim, ServerConfig as SimConfig};
use kvgate_tokenize::service::{Tokenize, TokenizeService};
use kvgate_tokenize::ChatTokenizer;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::TcpListener;

use super::load_identity;
use crate::config::{GatewayConfig, ReplicaConfig};
use crate::doors::server::Gateway;

type Ca = CertifiedIssuer<'static, KeyPair>;

fn ca(name: &str) -> Ca {
    let mut p = CertificateParams::new(Vec::<String>::new()).expect("params");
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.distinguished_name.push(DnType::CommonName, name);
    p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::DigitalSignature];
    CertifiedIssuer::self_signed(p, KeyPair::generate().expect("key")).expect("ca")
}

/// A certificate for localhost signed by `ca`: (certificate PEM, key PEM).
fn leaf(ca: &Ca, client: bool, expired: bool) -> (String, String) {
    let names = vec!["localhost".to_owned(), "127.0.0.1".to_owned()];
    let mut p = CertificateParams::new(names).expect("params");
    p.distinguished_name.push(DnType::CommonName, if client { "gateway" } else { "kvgate" });
    p.extended_key_usages = vec![if client {
        ExtendedKeyUsagePurpose::ClientAuth
    } else {
        ExtendedKeyUsagePurpose::ServerAuth
    }];
    if expired {
        p.not_before = rcgen::date_time_ymd(2020, 1, 1);
        p.not_after = rcgen::date_time_ymd(2021, 1, 1);
    }
    let key = KeyPair::generate().expect("key");
    let cert = p.signed_by(&key, ca).expect("sign");
    (cert.pem(), key.serialize_pem())
}

/// A scratch directory of its own per call.
fn scratch() -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let d = std::env::temp_dir().join(format!("kvgate-tls-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("scratch dir");
    d
}

fn write(dir: &Path, name: &str, text: &str, mode: u32) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).expect("write");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).expect("chmod");
    }
    p
}

#[test]
fn weak_keys_and_mismatched_pairs_are_refused() {
    let ca = ca("test ca");
    let (cert, key) = leaf(&ca, false, false);
    let (_, other_key) = leaf(&ca, false, false);
    let d = scratch();
    let cert_path = write(&d, "tls.crt", &cert, 0o644);
    let open_key = write(&d, "open.key", &key, 0o644);
    let e = load_identity(&cert_path, &open_key).expect_err("a world-readable key");
    assert!(e.contains("readable by others") && e.contains("644"), "{e}");
    let key_path = write(&d, "tls.key", &key, 0o600);
    load_identity(&cert_path, &key_path).expect("a good pair");
    let group = write(&d, "group.key", &key, 0o640);
    load_identity(&cert_path, &group).expect("group-readable is allowed");
    let wrong = write(&d, "wrong.key", &other_key, 0o600);
    let e = load_identity(&cert_path, &wrong).expect_err("a certificate with another key");
    assert!(e.contains("does not match"), "{e}");
    let junk = write(&d, "junk.crt", "not a certificate", 0o644);
    let e = load_identity(&junk, &key_path).expect_err("no certificate");
    assert!(e.contains("junk.crt"), "{e}");
    // Refused at start too, with the reason.
    let mut c = GatewayConfig::default();
    c.tls.cert = Some(cert_path);
    c.tls.key = Some(open_key);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("rt");
    let e = rt.block_on(Gateway::start(c)).expect_err("refused");
    assert!(e.to_string().contains("readable by others"), "{e}");
}

fn tokenizer() -> Arc<TokenizeService> {
    let t = Tokenize::new(ChatTokenizer::bundled().expect("bundled tokenizer"), None);
    Arc::new(TokenizeService::new(t, 1).expect("tokenizer service"))
}

async fn start_sim() -> Sim {
    let mut events = PublisherConfig::new("tcp://127.0.0.1:0");
    events.force_bind = true;
    let config = SimConfig { speedup: 50.0, events: Some(events), ..SimConfig::default() };
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    start(config, listener, tokenizer()).await.expect("sim")
}

fn replica(url: &str, sim: &Sim) -> ReplicaConfig {
    let mut r = ReplicaConfig::new(url);
    r.name = Some("engine".to_owned());
    r.events = Some(loopback_endpoint(&sim.events().expect("events").events));
    r
}

fn config(replicas: Vec<ReplicaConfig>) -> GatewayConfig {
    let mut c = GatewayConfig {
        listen: "127.0.0.1:0".parse().expect("addr"),
        admin_listen: Some("127.0.0.1:0".parse().expect("addr")),
        replicas,
        ..GatewayConfig::default()
    };
    c.monitor.health_interval_ms = 100;
    c.monitor.metrics_interval_ms = 200;
    c.model.tokenizer_threads = 1;
    c
}

fn client(ca: &str, identity: Option<(&str, &str)>) -> reqwest::Client {
    let mut b = reqwest::Client::builder()
        .use_rustls_tls()
        .no_proxy()
        .timeout(Duration::from_secs(10))
        .add_root_certificate(reqwest::Certificate::from_pem(ca.as_bytes()).expect("ca"));
    if let Some((cert, key)) = identity {
        let pem = format!("{cert}\n{key}");
        b = b.identity(reqwest::Identity::from_pem(pem.as_bytes()).expect("identity"));
    }
    b.build().expect("client")
}

/// The certificate a TLS server at `port` presents now.
async fn presented(port: u16, ca: &str) -> CertificateDer<'static> {
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(ca.as_bytes()) {
        roots.add(c.expect("pem")).expect("root");
    }
    let config = rustls::ClientConfig::builder_with_provider(super::provider())
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.expect("connect");
    let name = rustls::pki_types::ServerName::try_from("localhost").expect("name");
    let tls = connector.connect(name, tcp).await.expect("handshake");
    tls.get_ref().1.peer_certificates().expect("certs")[0].clone().into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listeners_speak_tls_and_reload_their_certificate() {
    let sim = start_sim().await;
    let ca = ca("kvgate ca");
    let (cert, key) = leaf(&ca, false, false);
    let d = scratch();
    let cert_path = write(&d, "tls.crt", &cert, 0o644);
    let key_path = write(&d, "tls.key", &key, 0o600);
    let mut c = config(vec![replica(&sim.url(), &sim)]);
    c.tls.cert = Some(cert_path.clone());
    c.tls.key = Some(key_path.clone());
    c.tls.reload_ms = 100;
    let gw = Gateway::start(c).await.expect("gateway");
    let port = gw.local_addr().port();
    let https = format!("https://localhost:{port}");
    let good = client(&ca.pem(), None);
    let r = good.get(format!("{https}/health")).send().await.expect("health over TLS");
    assert_eq!(r.status(), 200);
    let admin =
        format!("https://localhost:{}/admin/decisions", gw.admin_addr().expect("admin").port());
    assert_eq!(good.get(admin).send().await.expect("admin over TLS").status(), 200);
    // A client that trusts another CA refuses the handshake.
    let other = client(&ca_pem_of(&self::ca("someone else")), None);
    let e = other.get(format!("{https}/health")).send().await.expect_err("wrong CA");
    assert!(format!("{e:?}").contains("UnknownIssuer"), "{e:?}");
    // Plain HTTP gets nowhere.
    let plain =
        reqwest::Client::builder().no_proxy().timeout(Duration::from_secs(5)).build().expect("c");
    assert!(plain.get(format!("http://127.0.0.1:{port}/health")).send().await.is_err());
    // A new certificate in the files is served without a restart.
    let before = presented(port, &ca.pem()).await;
    let (cert2, key2) = leaf(&ca, false, false);
    write(&d, "tls.key", &key2, 0o600);
    write(&d, "tls.crt", &cert2, 0o644);
    let want = CertificateDer::from_pem_slice(cert2.as_bytes()).expect("pem");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let now = presented(port, &ca.pem()).await;
        if now == want {
            break;
        }
        assert_eq!(now, before, "neither the old nor the new certificate");
        assert!(Instant::now() < deadline, "the new certificate was not loaded");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // A broken pair in the files keeps the current one.
    write(&d, "tls.crt", "garbage", 0o644);
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(presented(port, &ca.pem()).await, want);
    assert_eq!(
        good.get(format!("{https}/health")).send().await.expect("still serving").status(),
        200
    );
}

fn ca_pem_of(ca: &Ca) -> String {
    ca.pem()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_is_required_on_the_peer_port_and_the_endpoint_picker() {
    let sim = start_sim().await;
    let server_ca = ca("server ca");
    let client_ca = ca("client ca");
    let (cert, key) = leaf(&server_ca, false, false);
    let (ccert, ckey) = leaf(&client_ca, true, false);
    let (stranger_cert, stranger_key) = leaf(&server_ca, true, false);
    let (old_cert, old_key) = leaf(&client_ca, true, true);
    let d = scratch();
    let mut c = config(vec![replica(&sim.url(), &sim)]);
    c.tls.cert = Some(write(&d, "tls.crt", &cert, 0o644));
    c.tls.key = Some(write(&d, "tls.key", &key, 0o600));
    c.tls.client_ca = Some(write(&d, "client-ca.crt", &client_ca.pem(), 0o644));
    c.epp.listen = Some("127.0.0.1:0".parse().expect("addr"));
    c.peers.listen = Some("127.0.0.1:0".parse().expect("addr"));
    c.peers.key = Some("peer-key-0123456789".to_owned());
    let gw = Gateway::start(c).await.expect("gateway");
    // The peer port: a machine's listener, so a client certificate is required.
    let peer = format!("https://localhost:{}/", gw.peer_addr().expect("peer").port());
    let ok = client(&server_ca.pem(), Some((&ccert, &ckey)));
    let r = ok.get(&peer).send().await.expect("with a client certificate");
    assert_eq!(r.status(), 404, "past the handshake, an unknown route");
    for (what, id) in [
        ("no client certificate", None),
        ("one from another CA", Some((stranger_cert.as_str(), stranger_key.as_str()))),
        ("an expired one", Some((old_cert.as_str(), old_key.as_str()))),
    ] {
        let r = client(&server_ca.pem(), id).get(&peer).send().await;
        assert!(r.is_err(), "{what}: {r:?}");
    }
    // The API port stays open to clients without certificates (keys are
    // its authentication; the kubelet's probes have no certificate).
    let health = format!("https://localhost:{}/health", gw.local_addr().port());
    let r = client(&server_ca.pem(), None)
        .get(&health)
        .send()
        .await
        .expect("API without a certificate");
    assert_eq!(r.status(), 200);
    // The endpoint picker's gRPC, over TLS with the gateway's certificate.
    let epp = gw.epp_addr().expect("epp").port();
    let pick = |identity: Option<(String, String)>| {
        let ca = server_ca.pem();
        async move {
            let mut tls = tonic::transport::ClientTlsConfig::new()
                .ca_certificate(tonic::transport::Certificate::from_pem(ca))
                .domain_name("localhost");
            if let Some((c, k)) = identity {
                tls = tls.identity(tonic::transport::Identity::from_pem(c, k));
            }
            let ch = tonic::transport::Channel::from_shared(format!("https://localhost:{epp}"))
                .expect("uri")
                .tls_config(tls)
                .expect("tls")
                .connect()
                .await
                .map_err(|e| format!("{e:?}"))?;
            let mut client = ExternalProcessorClient::new(ch);
            let headers = envoy_types::pb::envoy::config::core::v3::HeaderMap {
                headers: vec![envoy_types::pb::envoy::config::core::v3::HeaderValue {
                    key: ":path".into(),
                    value: String::new(),
                    raw_value: b"/v1/completions".to_vec(),
                }],
            };
            let body = br#"{"model":"Qwen/Qwen3-0.6B","prompt":[1,2,3],"max_tokens":1}"#.to_vec();
            let msgs = vec![
                Msg::RequestHeaders(HttpHeaders { headers: Some(headers), ..Default::default() }),
                Msg::RequestBody(HttpBody { body, end_of_stream: true, ..Default::default() }),
            ];
            let out = futures_util::stream::iter(
                msgs.into_iter()
                    .map(|m| ProcessingRequest { request: Some(m), ..Default::default() }),
            )
            .chain(futures_util::stream::pending());
            let mut inbound = client.process(out).await.map_err(|s| format!("{s:?}"))?.into_inner();
            Ok::<_, String>(inbound.message().await.ok().flatten().and_then(|r| r.response))
        }
    };
    let reply = pick(Some((ccert.clone(), ckey.clone()))).await.expect("a pick over mutual TLS");
    assert!(matches!(reply, Some(Reply::RequestHeaders(_))), "{reply:?}");
    let refused = pick(None).await;
    assert!(
        !matches!(refused, Ok(Some(Reply::RequestHeaders(_)))),
        "a pick without a client certificate"
    );
}

/// A TLS front for `backend` (a plain HTTP engine) with `cert`/`key`; its
/// https:// URL.
async fn tls_front(backend: &str, cert: &str, key: &str) -> String {
    let certs: Vec<CertificateDer<'static>> =
        CertificateDer::pem_slice_iter(cert.as_bytes()).map(|c| c.expect("pem")).collect();
    let key = PrivateKeyDer::from_pem_slice(key.as_bytes()).expect("key");
    let config = rustls::ServerConfig::builder_with_provider(super::provider())
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .expect("config");
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let backend = backend.trim_start_matches("http://").to_owned();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else { return };
            let (acceptor, backend) = (acceptor.clone(), backend.clone());
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else { return };
                let Ok(mut up) = tokio::net::TcpStream::connect(&backend).await else { return };
                let _ = tokio::io::copy_bidirectional(&mut tls, &mut up).await;
            });
        }
    });
    format!("https://localhost:{port}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_engines_must_present_a_valid_certificate() {
    let ca = ca("engine ca");
    let d = scratch();
    let ca_path = write(&d, "ca.crt", &ca.pem(), 0o644);
    for (expired, should_serve) in [(false, true), (true, false)] {
        let sim = start_sim().await;
        let (cert, key) = leaf(&ca, false, expired);
        let url = tls_front(&sim.url(), &cert, &key).await;
        let mut c = config(vec![replica(&url, &sim)]);
        c.tls.ca = Some(ca_path.clone());
        let gw = Gateway::start(c).await.expect("gateway");
        // The valid engine gets time to come up on a loaded machine; the
        // expired one a few seconds of probes to show it never does.
        let wait = if should_serve { 20 } else { 3 };
        let deadline = Instant::now() + Duration::from_secs(wait);
        let mut last;
        let up = loop {
            let snap = gw.snapshot();
            let r = &snap.replicas[0];
            last = format!("{} {:?} {:?}", r.health, r.reason, r.problems);
            if r.health == "healthy" && gw.fleet().with(|f| f.readiness()).ready() {
                break true;
            }
            if Instant::now() > deadline {
                break false;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        assert_eq!(up, should_serve, "expired certificate {expired}: {last}");
        if should_serve {
            let body =
                serde_json::json!({"model": "Qwen/Qwen3-0.6B", "prompt": "Hello", "max_tokens": 2});
            let r = reqwest::Client::new()
                .post(format!("http://{}/v1/completions", gw.local_addr()))
                .json(&body)
                .send()
                .await
                .expect("through the gateway");
            assert_eq!(r.status(), 200, "{}", r.text().await.unwrap_or_default());
        } else {
            eprintln!("{last}");
            assert!(last.to_lowercase().contains("expired"), "the reason should say why: {last}");
        }
    }
}
