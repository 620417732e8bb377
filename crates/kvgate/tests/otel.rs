//! One request end to end in one trace: a client's `traceparent` goes into
//! `kvgate serve --otlp-endpoint`, in front of a simulated engine. kvgate
//! exports its spans over OTLP/HTTP to a collector played by this test; the
//! request's span is the client span's child, its stages (render and
//! tokenize, decide, send) the request's children, all in the client's trace;
//! and the engine receives a `traceparent` naming kvgate's send span as its
//! parent (read off the wire by a byte pipe between kvgate and the engine).
//! With `--log-format json`, the request's log lines carry the trace id.
//!
//! The endpoint picker (`kvgate epp`) continues the trace from the headers
//! Envoy passes and names its pick's span in the `traceparent` it sets on
//! the request Envoy forwards (this test plays Envoy's side of ext_proc).
//! A collector that never answers fills the export queue: the spans that
//! find no room are dropped, never waited for, and counted on `/metrics`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::config::core::v3::{HeaderMap, HeaderValue};
use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_client::ExternalProcessorClient;
use envoy_types::pb::envoy::service::ext_proc::v3::processing_request::Request as Msg;
use envoy_types::pb::envoy::service::ext_proc::v3::processing_response::Response as Reply;
use envoy_types::pb::envoy::service::ext_proc::v3::{HttpBody, HttpHeaders, ProcessingRequest};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use serde_json::Value;
use support::{chat_ok, kvgate_cmd, metric, spawn_sim, wait_ready, Kill};

mod support;

const CLIENT_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CLIENT_SPAN: &str = "00f067aa0ba902b7";

/// A collector for OTLP/HTTP: every span of every POST to /v1/traces.
fn collector() -> (String, Arc<Mutex<Vec<Span>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let spans = Arc::new(Mutex::new(Vec::new()));
    let out = Arc::clone(&spans);
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(conn) = conn else { return };
            let out = Arc::clone(&out);
            std::thread::spawn(move || serve_collector(conn, &out));
        }
    });
    (url, spans)
}

fn serve_collector(conn: TcpStream, out: &Mutex<Vec<Span>>) {
    let mut reader = BufReader::new(conn.try_clone().unwrap());
    let mut conn = conn;
    loop {
        let mut len = 0usize;
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let path_ok = line.starts_with("POST /v1/traces ");
        loop {
            line.clear();
            reader.read_line(&mut line).unwrap();
            if line == "\r\n" {
                break;
            }
            if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                len = v.trim().parse().unwrap();
            }
        }
        let mut body = vec![0; len];
        reader.read_exact(&mut body).unwrap();
        if path_ok {
            let req = ExportTraceServiceRequest::decode(body.as_slice()).unwrap();
            let mut spans = out.lock().unwrap();
            for r in req.resource_spans {
                for s in r.scope_spans {
                    spans.extend(s.spans);
                }
            }
        }
        let status = if path_ok { "200 OK" } else { "404 Not Found" };
        let answer = format!(
            "HTTP/1.1 {status}\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n"
        );
        conn.write_all(answer.as_bytes()).unwrap();
    }
}

/// A byte pipe to `upstream` that keeps every `traceparent` header value
/// it sees going up.
fn header_tap(upstream: &str) -> (String, Arc<Mutex<Vec<String>>>) {
    let upstream = upstream.trim_start_matches("http://").to_owned();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let out = Arc::clone(&seen);
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(down) = conn else { return };
            let up = TcpStream::connect(&upstream).unwrap();
            let (mut down_r, mut up_w) = (down.try_clone().unwrap(), up.try_clone().unwrap());
            let (mut up_r, mut down_w) = (up, down);
            let out = Arc::clone(&out);
            std::thread::spawn(move || {
                let mut buf = vec![0; 64 << 10];
                while let Ok(n) = down_r.read(&mut buf) {
                    if n == 0 || up_w.write_all(&buf[..n]).is_err() {
                        break;
                    }
                    let text = String::from_utf8_lossy(&buf[..n]).to_ascii_lowercase();
                    for l in text.lines() {
                        if let Some(v) = l.strip_prefix("traceparent:") {
                            out.lock().unwrap().push(v.trim().to_owned());
                        }
                    }
                }
            });
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut up_r, &mut down_w);
            });
        }
    });
    (url, seen)
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_is_one_trace_from_the_client_through_kvgate_to_the_engine() {
    let (collector_url, spans) = collector();
    let sim = spawn_sim(None, false, &[]);
    let (engine_url, traceparents) = header_tap(&sim.url);
    let log = std::env::temp_dir().join(format!("kvgate-otel-{}.log", std::process::id()));
    let mut cmd = kvgate_cmd();
    cmd.args(["serve", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"])
        .args(["--log", "info,kvgate_gateway=debug", "--log-format", "json"])
        .args(["--otlp-endpoint", &collector_url, "--otlp-protocol", "http/protobuf"])
        .args(["--replica", &format!("{engine_url},name=r0,events={}", sim.events)])
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
        .env_remove("OTEL_SERVICE_NAME")
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log).unwrap());
    let mut proc = Kill(cmd.spawn().unwrap());
    let mut first = String::new();
    BufReader::new(proc.0.stdout.take().unwrap()).read_line(&mut first).unwrap();
    let base = first
        .strip_prefix("kvgate serving on ")
        .and_then(|r| r.split(' ').next())
        .unwrap_or_else(|| panic!("unexpected first line {first:?}"))
        .to_owned();
    wait_ready(&base).await;

    let traceparent = format!("00-{CLIENT_TRACE}-{CLIENT_SPAN}-01");
    chat_ok(&base, "One trace, end to end.", true, &[("traceparent", traceparent)]).await;

    // The batch processor exports within its schedule delay (5 s).
    let t0 = Instant::now();
    let names = |s: &[Span]| s.iter().map(|s| s.name.clone()).collect::<Vec<_>>();
    loop {
        let got = spans.lock().unwrap().clone();
        let have = names(&got);
        if ["request", "render_and_tokenize", "decide", "send"]
            .iter()
            .all(|n| have.iter().any(|h| h == n))
        {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(30), "spans exported: {have:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let got = spans.lock().unwrap().clone();
    let by_name = |n: &str| got.iter().find(|s| s.name == n).unwrap().clone();
    let request = by_name("request");
    assert_eq!(hex(&request.trace_id), CLIENT_TRACE, "kvgate continues the client's trace");
    assert_eq!(hex(&request.parent_span_id), CLIENT_SPAN, "the client's span is the parent");
    for stage in ["render_and_tokenize", "decide", "send"] {
        let s = by_name(stage);
        assert_eq!(hex(&s.trace_id), CLIENT_TRACE, "{stage}");
        assert_eq!(s.parent_span_id, request.span_id, "{stage} is the request's child");
    }
    let attr = |s: &Span, k: &str| {
        s.attributes
            .iter()
            .find(|a| a.key == k)
            .and_then(|a| a.value.clone())
            .map(|v| format!("{v:?}"))
    };
    let keys = ["replica", "prompt_tokens", "predicted_ttft_s", "reason", "ttft_s", "outcome"];
    for key in keys.into_iter().chain(["finish_reason"]) {
        assert!(
            attr(&request, key).is_some(),
            "request span lacks {key}: {:?}",
            request.attributes
        );
    }

    // Counts are integer attributes, not their text.
    for key in ["prompt_tokens", "cached_blocks"] {
        let v = attr(&request, key).unwrap();
        assert!(v.contains("IntValue"), "{key}: {v}");
    }

    // The engine saw kvgate's send span as the parent, in the same trace.
    let send = by_name("send");
    let expected = format!("00-{CLIENT_TRACE}-{}-01", hex(&send.span_id));
    let seen = traceparents.lock().unwrap().clone();
    assert!(seen.contains(&expected), "engine got {seen:?}, expected {expected}");

    // Every JSON log line logged inside the request carries its trace id.
    drop(proc);
    let text = std::fs::read_to_string(&log).unwrap();
    let inside: Vec<Value> = text
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["spans"].as_array().is_some_and(|s| s.iter().any(|s| s["name"] == "request")))
        .collect();
    assert!(!inside.is_empty(), "no log line inside a request:\n{text}");
    for line in &inside {
        let ids: Vec<&str> = line["spans"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|s| s["trace_id"].as_str())
            .collect();
        assert_eq!(ids, [CLIENT_TRACE], "{line}");
    }
    let _ = std::fs::remove_file(&log);
}

/// `kvgate ARGS` exporting to `collector` within 100 ms of a span's end,
/// up to its "kvgate serving on" line: the process, the endpoint picker's
/// address (`kvgate epp`) and the HTTP base.
fn start(args: &[&str], collector: &str, env: &[(&str, &str)]) -> (Kill, Option<String>, String) {
    let mut cmd = kvgate_cmd();
    cmd.args(args)
        .args(["--admin-listen", "127.0.0.1:0", "--log", "warn"])
        .args(["--otlp-endpoint", collector, "--otlp-protocol", "http/protobuf"])
        .env("OTEL_BSP_SCHEDULE_DELAY", "100")
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
        .env_remove("OTEL_SERVICE_NAME")
        .env_remove("OTEL_TRACES_SAMPLER")
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    let mut proc = Kill(cmd.spawn().unwrap());
    let mut out = BufReader::new(proc.0.stdout.take().unwrap());
    let mut epp = None;
    loop {
        let mut line = String::new();
        assert!(out.read_line(&mut line).unwrap() > 0, "kvgate ended before serving");
        if let Some(a) = line.strip_prefix("kvgate endpoint picker (ext_proc gRPC) on ") {
            epp = Some(a.trim().to_owned());
        } else if let Some(r) = line.strip_prefix("kvgate serving on ") {
            let base = r.split(' ').next().unwrap().to_owned();
            return (proc, epp, base);
        }
    }
}

/// Waits until spans named `names` have been exported; all spans so far.
async fn exported(spans: &Mutex<Vec<Span>>, names: &[&str]) -> Vec<Span> {
    let t0 = Instant::now();
    loop {
        let got = spans.lock().unwrap().clone();
        if names.iter().all(|n| got.iter().any(|s| s.name == *n)) {
            return got;
        }
        let have: Vec<_> = got.iter().map(|s| s.name.clone()).collect();
        assert!(t0.elapsed() < Duration::from_secs(30), "spans exported: {have:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn envoy_header(key: &str, value: &str) -> HeaderValue {
    HeaderValue { key: key.to_owned(), value: String::new(), raw_value: value.as_bytes().to_vec() }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoint_pick_continues_envoys_trace_and_names_itself_on_the_forwarded_request() {
    let (collector_url, spans) = collector();
    let sim = spawn_sim(None, false, &[]);
    let replica = format!("{},name=r0,events={}", sim.url, sim.events);
    let args = ["epp", "--listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0"];
    let args: Vec<&str> = args.iter().copied().chain(["--replica", &replica]).collect();
    let (_proc, epp, base) = start(&args, &collector_url, &[]);
    wait_ready(&base).await;
    let epp = epp.expect("kvgate epp names its ext_proc address");
    let mut client = ExternalProcessorClient::connect(format!("http://{epp}")).await.unwrap();

    // Envoy's side: the client's headers (its traceparent among them), then
    // the body, in one stream.
    let traceparent = format!("00-{CLIENT_TRACE}-{CLIENT_SPAN}-01");
    let headers = [
        (":method", "POST"),
        (":path", "/v1/chat/completions"),
        ("content-type", "application/json"),
        ("traceparent", traceparent.as_str()),
    ];
    let headers = headers.iter().map(|(k, v)| envoy_header(k, v)).collect();
    let body = serde_json::json!({
        "model": "Qwen/Qwen3-0.6B",
        "messages": [{"role": "user", "content": "One pick, one trace."}],
        "max_tokens": 4,
    });
    let msg = |m| ProcessingRequest { request: Some(m), ..ProcessingRequest::default() };
    let (tx, rx) = tokio::sync::mpsc::channel::<ProcessingRequest>(8);
    tx.send(msg(Msg::RequestHeaders(HttpHeaders {
        headers: Some(HeaderMap { headers }),
        ..HttpHeaders::default()
    })))
    .await
    .unwrap();
    let body = HttpBody {
        body: serde_json::to_vec(&body).unwrap(),
        end_of_stream: true,
        ..HttpBody::default()
    };
    tx.send(msg(Msg::RequestBody(body))).await.unwrap();
    let out =
        futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|m| (m, rx)) });
    let mut inbound = client.process(out).await.unwrap().into_inner();
    let first = inbound.message().await.unwrap().and_then(|r| r.response);
    let Some(Reply::RequestHeaders(picked)) = first else { panic!("no pick: {first:?}") };
    let set = picked.response.and_then(|c| c.header_mutation).map(|m| m.set_headers);
    let forwarded: Vec<String> = set
        .unwrap_or_default()
        .into_iter()
        .filter_map(|o| o.header)
        .filter(|h| h.key == "traceparent")
        .map(|h| String::from_utf8(h.raw_value).unwrap())
        .collect();
    drop(tx);

    let got = exported(&spans, &["request", "render_and_tokenize", "decide"]).await;
    let by_name = |n: &str| got.iter().find(|s| s.name == n).unwrap().clone();
    let request = by_name("request");
    assert_eq!(hex(&request.trace_id), CLIENT_TRACE, "the pick continues the client's trace");
    assert_eq!(hex(&request.parent_span_id), CLIENT_SPAN, "the client's span is the parent");
    let door = request.attributes.iter().find(|a| a.key == "door").and_then(|a| a.value.clone());
    assert!(format!("{door:?}").contains("epp"), "door: {door:?}");
    for stage in ["render_and_tokenize", "decide"] {
        let s = by_name(stage);
        assert_eq!(hex(&s.trace_id), CLIENT_TRACE, "{stage}");
        assert_eq!(s.parent_span_id, request.span_id, "{stage} is the pick's child");
    }
    // The request Envoy forwards names the pick's span: the engine's span
    // becomes its child.
    let expected = format!("00-{CLIENT_TRACE}-{}-01", hex(&request.span_id));
    assert_eq!(forwarded, [expected], "traceparent set on the forwarded request");
}

/// Spans are exported in batches of one, the collector never answers, and
/// two spans may wait: requests are answered as ever, and what finds no
/// room in the queue is counted on `/metrics`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_the_export_queue_has_no_room_for_are_dropped_and_counted() {
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", silent.local_addr().unwrap());
    // Accepts and holds every connection, never answering.
    std::thread::spawn(move || {
        let held: Vec<TcpStream> = silent.incoming().map_while(Result::ok).collect();
        drop(held);
    });
    let sim = spawn_sim(None, false, &[]);
    let replica = format!("{},name=r0,events={}", sim.url, sim.events);
    let args = ["serve", "--listen", "127.0.0.1:0", "--replica", &replica];
    let env = [("OTEL_BSP_MAX_QUEUE_SIZE", "2"), ("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "1")];
    let (_proc, _, base) = start(&args, &url, &env);
    wait_ready(&base).await;
    let t0 = Instant::now();
    for i in 0..5 {
        chat_ok(&base, &format!("Dropped span {i}"), i % 2 == 0, &[]).await;
    }
    assert!(t0.elapsed() < Duration::from_secs(5), "requests waited for the exporter");
    // Four spans a request, one in the stuck export and two waiting at most.
    let dropped = metric(&base, "kvgate_trace_spans_dropped_total").await;
    assert!(dropped >= 17.0, "dropped {dropped}");
}
