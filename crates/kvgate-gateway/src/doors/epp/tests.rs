//! The endpoint picker against an in-process fake of Envoy's side of
//! ext_proc (a tonic client over `envoy-types`), in front of simulated
//! vLLM replicas. The fake does what Envoy does with the answers: it sends
//! the request to the first endpoint named, with the header changes and the
//! re-emitted body, and streams the engine's response through the picker.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::config::core::v3::Metadata;
use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_client::ExternalProcessorClient;
use envoy_types::pb::envoy::service::ext_proc::v3::processing_request::Request as Msg;
use envoy_types::pb::envoy::service::ext_proc::v3::processing_response::Response as Reply;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    body_mutation, HttpBody, HttpHeaders, HttpTrailers, ProcessingRequest, ProcessingResponse,
    ProtocolConfiguration,
};
use envoy_types::pb::google::protobuf::{value::Kind, ListValue, Struct, Value};
use kvgate_events::publisher::{loopback_endpoint, PublisherConfig};
use kvgate_sim::server::{start, Replica as Sim, ServerConfig};
use kvgate_sim::{EngineConfig, TimingModel};
use kvgate_tokenize::service::{Tokenize, TokenizeService};
use kvgate_tokenize::ChatTokenizer;
use serde_json::{json, Value as Json};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tonic::transport::Channel;
use tonic::Streaming;

use super::wire;
use crate::config::{GatewayConfig, ReplicaConfig};
use crate::doors::server::Gateway;

const MODEL: &str = "Qwen/Qwen3-0.6B";

fn tokenizer() -> Arc<TokenizeService> {
    let t = Tokenize::new(ChatTokenizer::bundled().expect("bundled tokenizer"), None);
    Arc::new(TokenizeService::new(t, 1).expect("tokenizer service"))
}

async fn start_sim(tok: &Arc<TokenizeService>) -> Sim {
    let mut events = PublisherConfig::new("tcp://127.0.0.1:0");
    events.force_bind = true;
    events.replay_endpoint = Some("tcp://127.0.0.1:0".to_owned());
    let config = ServerConfig {
        engine: EngineConfig {
            timing: TimingModel::preset("dynamo_mocker").expect("preset"),
            ..EngineConfig::default()
        },
        speedup: 20.0,
        events: Some(events),
        ..ServerConfig::default()
    };
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    start(config, listener, Arc::clone(tok)).await.expect("sim")
}

fn replica_cfg(name: &str, sim: &Sim) -> ReplicaConfig {
    let mut r = ReplicaConfig::new(sim.url());
    r.name = Some(name.to_owned());
    let ep = sim.events().expect("events");
    r.events = Some(loopback_endpoint(&ep.events));
    r.replay = ep.replay.as_deref().map(loopback_endpoint);
    r
}

struct Setup {
    gw: Gateway,
    sims: Vec<Sim>,
    envoy: FakeEnvoy,
}

impl Setup {
    async fn new(n: usize, edit: impl FnOnce(&mut GatewayConfig)) -> Setup {
        let tok = tokenizer();
        let mut sims = Vec::new();
        for _ in 0..n {
            sims.push(start_sim(&tok).await);
        }
        let replicas = sims.iter().enumerate().map(|(i, s)| replica_cfg(&format!("sim-{i}"), s));
        let mut c = GatewayConfig {
            listen: "127.0.0.1:0".parse().expect("addr"),
            admin_listen: Some("127.0.0.1:0".parse().expect("addr")),
            replicas: replicas.collect(),
            ..GatewayConfig::default()
        };
        c.epp.listen = Some("127.0.0.1:0".parse().expect("addr"));
        c.monitor.health_interval_ms = 200;
        c.monitor.metrics_interval_ms = 200;
        c.model.tokenizer_threads = 1;
        edit(&mut c);
        let gw = Gateway::start(c).await.expect("gateway");
        let epp = gw.epp_addr().expect("epp listener");
        wait_ready(&gw).await;
        let envoy = FakeEnvoy::connect(&format!("http://{epp}")).await;
        Setup { gw, sims, envoy }
    }

    fn endpoint(&self, i: usize) -> String {
        self.sims[i].url().trim_start_matches("http://").to_owned()
    }

    fn in_flight(&self) -> usize {
        self.gw.fleet().with(|f| f.router().in_flight())
    }

    /// Requests booked on the replica serving `endpoint`.
    fn booked_on(&self, endpoint: &str) -> u32 {
        let r = self.gw.directory().all().iter().find(|r| r.endpoint == endpoint).cloned();
        let r = r.expect("replica");
        self.gw.fleet().with(|f| f.router().load(r.id).map_or(0, |l| l.load.requests()))
    }

    async fn wait_in_flight(&self, n: usize) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.in_flight() != n {
            assert!(Instant::now() < deadline, "in flight {} (want {n})", self.in_flight());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn sim_metric(&self, i: usize, name: &str) -> f64 {
        let text = reqwest::get(format!("{}/metrics", self.sims[i].url()))
            .await
            .expect("sim metrics")
            .text()
            .await
            .expect("text");
        text.lines()
            .filter(|l| l.starts_with(name))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }
}

async fn wait_ready(gw: &Gateway) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let r = gw.fleet().with(|f| f.readiness());
        if r.ready() {
            return;
        }
        assert!(Instant::now() < deadline, "fleet not ready");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// How the fake gateway sends one request.
#[derive(Clone, Debug)]
struct Send {
    path: &'static str,
    body: Vec<u8>,
    /// Body chunk size; 0 sends the body in one message.
    chunk: usize,
    subset: Option<Vec<String>>,
    /// End the body with trailers instead of an end-of-stream chunk.
    trailers: bool,
    /// A second, empty end-of-stream chunk after the end (GIE #2988).
    duplicate_end: bool,
    authorization: Option<String>,
    /// Announce the body modes, as newer Envoys do.
    protocol: Option<(i32, i32)>,
}

impl Send {
    fn new(path: &'static str, body: &Json) -> Send {
        Send {
            path,
            body: serde_json::to_vec(body).expect("json"),
            chunk: 0,
            subset: None,
            trailers: false,
            duplicate_end: false,
            authorization: None,
            protocol: None,
        }
    }
}

/// What the picker answered on the request side.
#[derive(Debug, Default)]
struct Picked {
    /// An immediate response: status and body.
    immediate: Option<(i32, Vec<u8>)>,
    set_headers: HashMap<String, String>,
    removed: Vec<String>,
    metadata_endpoint: Option<String>,
    clear_route_cache: bool,
    /// The body re-emitted.
    body: Vec<u8>,
    chunks: usize,
    trailers_answered: bool,
}

impl Picked {
    fn endpoints(&self) -> Vec<String> {
        let v = self.set_headers.get(wire::DESTINATION).expect("destination header");
        v.split(',').map(str::to_owned).collect()
    }
}

/// One open ext_proc stream.
struct Stream {
    tx: mpsc::Sender<ProcessingRequest>,
    rx: Streaming<ProcessingResponse>,
}

impl Stream {
    async fn send(&self, m: Msg, metadata: Option<Metadata>) {
        let r = ProcessingRequest {
            request: Some(m),
            metadata_context: metadata,
            ..Default::default()
        };
        self.tx.send(r).await.expect("stream open");
    }

    async fn next(&mut self) -> ProcessingResponse {
        let r = tokio::time::timeout(Duration::from_secs(20), self.rx.message()).await;
        r.expect("a reply in time").expect("no gRPC error").expect("stream not closed")
    }

    async fn reply(&mut self) -> Reply {
        self.next().await.response.expect("a response")
    }
}

struct FakeEnvoy {
    client: ExternalProcessorClient<Channel>,
    http: reqwest::Client,
}

fn metadata(namespace: &str, key: &str, kind: Kind) -> Metadata {
    let inner = Struct { fields: HashMap::from([(key.to_owned(), Value { kind: Some(kind) })]) };
    Metadata {
        filter_metadata: HashMap::from([(namespace.to_owned(), inner)]),
        ..Default::default()
    }
}

fn header_map(pairs: &[(&str, String)]) -> HttpHeaders {
    let pairs: Vec<(&str, &str)> = pairs.iter().map(|(k, v)| (*k, v.as_str())).collect();
    HttpHeaders { headers: Some(wire::headers_of(&pairs)), ..Default::default() }
}

impl FakeEnvoy {
    async fn connect(url: &str) -> FakeEnvoy {
        let client = ExternalProcessorClient::connect(url.to_owned()).await.expect("connect");
        let http = reqwest::Client::builder().no_proxy().build().expect("client");
        FakeEnvoy { client, http }
    }

    async fn open(&self) -> Stream {
        let (tx, rx) = mpsc::channel(1024);
        let out = futures_util::stream::unfold(
            rx,
            |mut rx: mpsc::Receiver<ProcessingRequest>| async move { rx.recv().await.map(|m| (m, rx)) },
        );
        let mut client = self.client.clone();
        let rx = client.process(out).await.expect("process").into_inner();
        Stream { tx, rx }
    }

    /// Sends the request side and reads the picker's answers to it.
    async fn pick(&self, s: &Send) -> (Stream, Picked) {
        let mut st = self.open().await;
        let mut headers = vec![
            (":method", "POST".to_owned()),
            (":path", s.path.to_owned()),
            ("content-type", "application/json".to_owned()),
        ];
        if let Some(a) = &s.authorization {
            headers.push(("authorization", a.clone()));
        }
        let mut h = header_map(&headers);
        h.end_of_stream = s.body.is_empty();
        let md = s.subset.as_ref().map(|list| {
            let values = list.iter().map(|e| Value { kind: Some(Kind::StringValue(e.clone())) });
            let list = ListValue { values: values.collect() };
            metadata(wire::SUBSET_NAMESPACE, wire::SUBSET_KEY, Kind::ListValue(list))
        });
        let first = ProcessingRequest {
            request: Some(Msg::RequestHeaders(h)),
            metadata_context: md,
            protocol_config: s.protocol.map(|(req, resp)| ProtocolConfiguration {
                request_body_mode: req,
                response_body_mode: resp,
                ..Default::default()
            }),
            ..Default::default()
        };
        st.tx.send(first).await.expect("open");
        let size = if s.chunk == 0 { s.body.len().max(1) } else { s.chunk };
        let chunks: Vec<&[u8]> = s.body.chunks(size).collect();
        for (i, c) in chunks.iter().enumerate() {
            let last = i + 1 == chunks.len() && !s.trailers;
            st.send(
                Msg::RequestBody(HttpBody {
                    body: c.to_vec(),
                    end_of_stream: last,
                    ..Default::default()
                }),
                None,
            )
            .await;
        }
        if s.trailers {
            st.send(Msg::RequestTrailers(HttpTrailers::default()), None).await;
        }
        if s.duplicate_end {
            st.send(Msg::RequestBody(HttpBody { end_of_stream: true, ..Default::default() }), None)
                .await;
        }
        let mut p = Picked::default();
        let first = st.next().await;
        if let Some(md) = &first.dynamic_metadata {
            if let Some(Kind::StructValue(lb)) =
                md.fields.get(wire::LB_NAMESPACE).and_then(|v| v.kind.as_ref())
            {
                if let Some(Kind::StringValue(e)) =
                    lb.fields.get(wire::DESTINATION).and_then(|v| v.kind.as_ref())
                {
                    p.metadata_endpoint = Some(e.clone());
                }
            }
        }
        match first.response.expect("a response") {
            Reply::ImmediateResponse(i) => {
                p.immediate = Some((i.status.map_or(0, |s| s.code), i.body));
                return (st, p);
            }
            Reply::RequestHeaders(h) => {
                let common = h.response.unwrap_or_default();
                p.clear_route_cache = common.clear_route_cache;
                let m = common.header_mutation.unwrap_or_default();
                for o in m.set_headers {
                    let hv = o.header.expect("header");
                    p.set_headers.insert(hv.key, String::from_utf8(hv.raw_value).expect("utf8"));
                }
                p.removed = m.remove_headers;
            }
            other => panic!("expected the headers response first, got {other:?}"),
        }
        assert_eq!(
            p.metadata_endpoint.as_ref(),
            p.set_headers.get(wire::DESTINATION),
            "the header and the envoy.lb metadata must name the same endpoints"
        );
        if !s.body.is_empty() {
            loop {
                let Reply::RequestBody(b) = st.reply().await else {
                    panic!("expected a body chunk")
                };
                let m = b.response.and_then(|c| c.body_mutation).and_then(|m| m.mutation);
                let Some(body_mutation::Mutation::StreamedResponse(sr)) = m else {
                    panic!("the body must come back as a streamed mutation")
                };
                assert!(sr.body.len() <= wire::BODY_CHUNK_BYTES);
                p.chunks += 1;
                p.body.extend_from_slice(&sr.body);
                if sr.end_of_stream {
                    break;
                }
            }
        }
        if s.trailers {
            let r = st.reply().await;
            assert!(matches!(r, Reply::RequestTrailers(_)), "{r:?}");
            p.trailers_answered = true;
        }
        (st, p)
    }

    /// The whole exchange: pick, send to the endpoint as Envoy would, stream
    /// the response through the picker. Returns what the client gets: the
    /// status, the response headers the picker added, and the body.
    async fn exchange(
        &self,
        s: &Send,
        served: Option<&str>,
    ) -> (Picked, u16, HashMap<String, String>, Vec<u8>) {
        let (mut st, p) = self.pick(s).await;
        if let Some((code, _)) = p.immediate {
            return (p, code as u16, HashMap::new(), Vec::new());
        }
        let target = p.endpoints()[0].clone();
        let mut req = self.http.post(format!("http://{target}{}", s.path)).body(p.body.clone());
        for (k, v) in &p.set_headers {
            if k != wire::DESTINATION && k != "content-length" {
                req = req.header(k.as_str(), v.as_str());
            }
        }
        req = req.header("content-type", "application/json");
        let mut resp = req.send().await.expect("engine answered");
        let status = resp.status().as_u16();
        let ctype = resp
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned();
        let h = header_map(&[(":status", status.to_string()), ("content-type", ctype)]);
        let served = served.unwrap_or(&target).to_owned();
        let md = metadata(wire::LB_NAMESPACE, wire::SERVED_KEY, Kind::StringValue(served));
        st.send(Msg::ResponseHeaders(h), Some(md)).await;
        let Reply::ResponseHeaders(hr) = st.reply().await else {
            panic!("expected the response headers' answer")
        };
        let mut added = HashMap::new();
        for o in
            hr.response.and_then(|c| c.header_mutation).map(|m| m.set_headers).unwrap_or_default()
        {
            let hv = o.header.expect("header");
            added.insert(hv.key, String::from_utf8(hv.raw_value).expect("utf8"));
        }
        let mut body = Vec::new();
        loop {
            let chunk = resp.chunk().await.expect("engine body");
            let end = chunk.is_none();
            let bytes = chunk.map(|c| c.to_vec()).unwrap_or_default();
            st.send(
                Msg::ResponseBody(HttpBody {
                    body: bytes,
                    end_of_stream: end,
                    ..Default::default()
                }),
                None,
            )
            .await;
            let Reply::ResponseBody(b) = st.reply().await else { panic!("expected a body echo") };
            let m = b.response.and_then(|c| c.body_mutation).and_then(|m| m.mutation);
            let Some(body_mutation::Mutation::StreamedResponse(sr)) = m else {
                panic!("echo must be streamed")
            };
            assert_eq!(sr.end_of_stream, end);
            body.extend_from_slice(&sr.body);
            if end {
                break;
            }
        }
        (p, status, added, body)
    }
}

fn chat(content: &str, stream: bool) -> Json {
    json!({"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": 3, "stream": stream})
}

fn sse_done(body: &[u8]) -> bool {
    String::from_utf8_lossy(body).contains("data: [DONE]")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_and_completions_streamed_and_whole_reach_the_engine_with_tokens() {
    let s = Setup::new(2, |_| {}).await;
    let endpoints = [s.endpoint(0), s.endpoint(1)];
    for stream in [false, true] {
        for (path, body) in [
            ("/v1/chat/completions", chat("Tell me about the sea.", stream)),
            (
                "/v1/completions",
                json!({"model": MODEL, "prompt": "Once upon a time", "max_tokens": 3, "stream": stream}),
            ),
        ] {
            let (p, status, added, out) = s.envoy.exchange(&Send::new(path, &body), None).await;
            assert_eq!(status, 200, "{}", String::from_utf8_lossy(&out));
            assert!(p.clear_route_cache);
            let list = p.endpoints();
            assert!(endpoints.contains(&list[0]), "{list:?}");
            assert_eq!(p.set_headers["content-length"], p.body.len().to_string());
            let sent: Json = serde_json::from_slice(&p.body).expect("json body");
            if path.contains("chat") {
                let ids = &sent["kv_transfer_params"]["prompt_token_ids"];
                assert!(ids.as_array().is_some_and(|a| !a.is_empty()), "{sent}");
            } else {
                assert!(sent["prompt"].is_array(), "{sent}");
            }
            assert!(added.contains_key("x-kvgate-replica"), "{added:?}");
            if stream {
                assert!(sse_done(&out), "{}", String::from_utf8_lossy(&out));
            } else {
                let v: Json = serde_json::from_slice(&out).expect("whole json");
                assert!(v["choices"].is_array(), "{v}");
            }
        }
    }
    // Every booking left the ledger once its response ended.
    s.wait_in_flight(0).await;
    // The engines never tokenized: they got the ids.
    for i in 0..2 {
        assert_eq!(s.sim_metric(i, "kvgate_sim_tokenizations_total").await, 0.0, "sim-{i}");
    }
    let mut generated = 0.0;
    for i in 0..2 {
        generated += s.sim_metric(i, "vllm:generation_tokens_total").await;
    }
    assert!(generated >= 12.0, "the requests did not reach the engines: {generated}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_of_every_size_in_chunks_of_every_size_come_back_whole() {
    let s = Setup::new(1, |c| {
        c.limits.max_body_bytes = 4 << 20;
        c.model.max_model_len = 1 << 20;
    })
    .await;
    for size in [100usize, 10_000, 70_000, 1 << 20, 2 << 20] {
        // Token-id prompts: no tokenization, the body passes unchanged.
        let n = size / 7;
        let ids: Vec<u32> = (0..n as u32).map(|i| 100_000 + i % 50_000).collect();
        let body = json!({"model": MODEL, "prompt": ids, "max_tokens": 1});
        for chunk in [997usize, 65_536, 0] {
            let mut send = Send::new("/v1/completions", &body);
            send.chunk = chunk;
            let (st, p) = s.envoy.pick(&send).await;
            assert!(p.immediate.is_none(), "size {size}: {:?}", p.immediate);
            assert_eq!(p.body, send.body, "size {size} chunk {chunk}: the body changed");
            assert_eq!(p.chunks, send.body.len().div_ceil(wire::BODY_CHUNK_BYTES));
            assert_eq!(s.in_flight(), 1);
            // The gateway goes away before the response: nothing stays booked.
            drop(st);
            s.wait_in_flight(0).await;
        }
    }
    // A chat body of ~100 KB: the ids are written in, and the length with them.
    let text = "The quick brown fox jumps over the lazy dog. ".repeat(2_300);
    let mut send = Send::new("/v1/chat/completions", &chat(&text, true));
    send.chunk = 4_096;
    let (_st, p) = s.envoy.pick(&send).await;
    let sent: Json = serde_json::from_slice(&p.body).expect("json");
    let ids = sent["kv_transfer_params"]["prompt_token_ids"].as_array().expect("ids").len();
    assert!(ids > 20_000, "{ids} ids");
    assert_eq!(p.set_headers["content-length"], p.body.len().to_string());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subset_hints_restrict_the_pick_and_an_empty_one_is_503() {
    let s = Setup::new(3, |_| {}).await;
    let only = s.endpoint(2);
    for i in 0..6 {
        let mut send = Send::new("/v1/chat/completions", &chat(&format!("question {i}"), true));
        send.subset = Some(vec![only.clone()]);
        let (p, status, _, _) = s.envoy.exchange(&send, None).await;
        assert_eq!(status, 200);
        assert_eq!(
            p.endpoints(),
            std::slice::from_ref(&only),
            "fallbacks must stay inside the subset too"
        );
    }
    for subset in [vec![], vec!["10.255.0.1:8000".to_owned()]] {
        let mut send = Send::new("/v1/chat/completions", &chat("hello", false));
        send.subset = Some(subset.clone());
        let (_, p) = s.envoy.pick(&send).await;
        let (code, body) = p.immediate.expect("refused");
        assert_eq!(code, 503, "subset {subset:?}: {}", String::from_utf8_lossy(&body));
    }
    // Without a hint, fallbacks are listed: the chosen one first, each once.
    let (_, p) = s.envoy.pick(&Send::new("/v1/chat/completions", &chat("hello", false))).await;
    let list = p.endpoints();
    assert_eq!(list.len(), 3, "{list:?}");
    let mut unique = list.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), 3);
}

/// The gateway's SSE response headers, naming `endpoint` as the one that
/// served the request.
async fn served_by(st: &mut Stream, endpoint: &str) {
    let h = header_map(&[
        (":status", "200".to_owned()),
        ("content-type", "text/event-stream".to_owned()),
    ]);
    let md = metadata(wire::LB_NAMESPACE, wire::SERVED_KEY, Kind::StringValue(endpoint.to_owned()));
    st.send(Msg::ResponseHeaders(h), Some(md)).await;
    let Reply::ResponseHeaders(_) = st.reply().await else { panic!() };
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_served_endpoint_moves_the_booking() {
    let s = Setup::new(2, |_| {}).await;
    let (mut st, p) =
        s.envoy.pick(&Send::new("/v1/chat/completions", &chat("retry me", true))).await;
    let chosen = p.endpoints()[0].clone();
    let other = if chosen == s.endpoint(0) { s.endpoint(1) } else { s.endpoint(0) };
    assert_eq!(s.booked_on(&chosen), 1);
    assert_eq!(s.booked_on(&other), 0);
    // The gateway retried on the other endpoint and says so.
    served_by(&mut st, &other).await;
    assert_eq!(s.booked_on(&chosen), 0, "the first endpoint keeps a booking it did not serve");
    assert_eq!(s.booked_on(&other), 1, "the served endpoint was not booked");
    let done =
        b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"x\"}}]}\n\ndata: [DONE]\n\n";
    st.send(
        Msg::ResponseBody(HttpBody {
            body: done.to_vec(),
            end_of_stream: true,
            ..Default::default()
        }),
        None,
    )
    .await;
    let Reply::ResponseBody(_) = st.reply().await else { panic!() };
    s.wait_in_flight(0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_fallback_is_still_booked_for_the_request_it_serves() {
    // Busy as soon as anything is queued: a new request would wait for it.
    let s = Setup::new(2, |c| c.router.busy_pending_tokens = 1).await;
    let (mut st, p) = s.envoy.pick(&Send::new("/v1/chat/completions", &chat("one", true))).await;
    let (_held, p2) = s.envoy.pick(&Send::new("/v1/chat/completions", &chat("two", true))).await;
    let chosen = p.endpoints()[0].clone();
    let other = p2.endpoints()[0].clone();
    assert_ne!(chosen, other, "the second request goes to the idle replica");
    assert_eq!(s.booked_on(&other), 1);
    // The gateway retried the first request on the busy one.
    served_by(&mut st, &other).await;
    assert_eq!(s.booked_on(&chosen), 0);
    assert_eq!(s.booked_on(&other), 2, "the request running there went unbooked");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overload_is_429_and_no_replica_is_503() {
    let s = Setup::new(1, |c| c.limits.max_concurrent_requests = 1).await;
    // A refused request gives its place back at once, its stream still open.
    let mut bad = Send::new("/v1/chat/completions", &json!({}));
    bad.body = b"not json".to_vec();
    let (_open, p0) = s.envoy.pick(&bad).await;
    assert_eq!(p0.immediate.expect("refused").0, 400);
    let (held, p) = s.envoy.pick(&Send::new("/v1/chat/completions", &chat("first", true))).await;
    assert!(p.immediate.is_none());
    let (_, p2) = s.envoy.pick(&Send::new("/v1/chat/completions", &chat("second", true))).await;
    let (code, body) = p2.immediate.expect("shed");
    assert_eq!(code, 429, "{}", String::from_utf8_lossy(&body));
    drop(held);
    s.wait_in_flight(0).await;

    // Its only replica gone: 503.
    let s = Setup::new(1, |_| {}).await;
    let name = s.gw.replica_names()[0].clone();
    let r = s.gw.registry().by_name(&name).expect("replica");
    s.gw.registry().remove(&r);
    let (_, p) = s.envoy.pick(&Send::new("/v1/chat/completions", &chat("nobody", false))).await;
    assert_eq!(p.immediate.expect("refused").0, 503);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn protocol_traps_trailers_duplicate_end_cancel_and_early_close() {
    let s = Setup::new(1, |_| {}).await;
    // Trailers end a body that had no end-of-stream chunk.
    let mut send = Send::new("/v1/chat/completions", &chat("with trailers", true));
    send.trailers = true;
    send.chunk = 10;
    let (p, status, _, out) = s.envoy.exchange(&send, None).await;
    assert_eq!(status, 200);
    assert!(p.trailers_answered);
    assert!(sse_done(&out));
    // A duplicate empty end-of-stream chunk is ignored (GIE #2988).
    let mut send = Send::new("/v1/chat/completions", &chat("twice ended", true));
    send.duplicate_end = true;
    let (_, status, _, out) = s.envoy.exchange(&send, None).await;
    assert_eq!(status, 200);
    assert!(sse_done(&out));
    s.wait_in_flight(0).await;
    // The client cancels mid-body: nothing was booked, the stream just ends.
    let st = s.envoy.open().await;
    let h = header_map(&[(":path", "/v1/chat/completions".to_owned())]);
    st.send(Msg::RequestHeaders(h), None).await;
    st.send(
        Msg::RequestBody(HttpBody { body: b"{\"model\":".to_vec(), ..Default::default() }),
        None,
    )
    .await;
    drop(st);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(s.in_flight(), 0);
    // The gateway closes the stream right after the headers response.
    let (st, p) =
        s.envoy.pick(&Send::new("/v1/chat/completions", &chat("closed early", true))).await;
    assert!(p.immediate.is_none());
    assert_eq!(s.in_flight(), 1);
    drop(st);
    s.wait_in_flight(0).await;
    // A request-body mode other than full duplex is refused clearly.
    let mut send = Send::new("/v1/chat/completions", &chat("buffered", false));
    send.protocol = Some((wire::MODE_BUFFERED, wire::MODE_FULL_DUPLEX_STREAMED));
    let mut st = s.envoy.open().await;
    let h = header_map(&[(":path", "/v1/chat/completions".to_owned())]);
    let first = ProcessingRequest {
        request: Some(Msg::RequestHeaders(h)),
        protocol_config: Some(ProtocolConfiguration {
            request_body_mode: wire::MODE_BUFFERED,
            ..Default::default()
        }),
        ..Default::default()
    };
    st.tx.send(first).await.expect("open");
    let Reply::ImmediateResponse(i) = st.reply().await else { panic!("expected a refusal") };
    assert_eq!(i.status.map(|s| s.code), Some(500));
    assert!(String::from_utf8_lossy(&i.body).contains("FULL_DUPLEX_STREAMED"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_are_checked_and_never_reach_the_engine() {
    let key = "client-key-123456";
    let s = Setup::new(1, |c| c.auth.api_keys = vec![key.to_owned()]).await;
    let (_, p) = s.envoy.pick(&Send::new("/v1/chat/completions", &chat("no key", false))).await;
    assert_eq!(p.immediate.expect("refused").0, 401);
    let mut send = Send::new("/v1/chat/completions", &chat("with key", false));
    send.authorization = Some(format!("Bearer {key}"));
    let (p, status, _, _) = s.envoy.exchange(&send, None).await;
    assert_eq!(status, 200);
    assert_eq!(p.removed, ["authorization"], "the client's key must not reach the engine");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_streams_all_complete_and_release() {
    let s = Arc::new(Setup::new(2, |_| {}).await);
    let mut tasks = Vec::new();
    for i in 0..24 {
        let s = Arc::clone(&s);
        tasks.push(tokio::spawn(async move {
            let send =
                Send::new("/v1/chat/completions", &chat(&format!("concurrent {i}"), i % 2 == 0));
            let (_, status, _, out) = s.envoy.exchange(&send, None).await;
            assert_eq!(status, 200, "{}", String::from_utf8_lossy(&out));
        }));
    }
    for t in tasks {
        t.await.expect("exchange");
    }
    s.wait_in_flight(0).await;
}

/// The fleet's prefix-cache hit rate, from its engines' own counters.
async fn hit_rate(s: &Setup) -> f64 {
    let (mut hits, mut queries) = (0.0, 0.0);
    for i in 0..s.sims.len() {
        hits += s.sim_metric(i, "vllm:prefix_cache_hits_total").await;
        queries += s.sim_metric(i, "vllm:prefix_cache_queries_total").await;
    }
    assert!(queries > 0.0, "no prefix-cache queries");
    hits / queries
}

/// Growing conversations: session `k`'s turn `t` carries every earlier turn.
fn conversation(k: usize, t: usize) -> Json {
    let system =
        format!("You are assistant number {k}. {}", "Answer with care and detail. ".repeat(60));
    let mut messages = vec![json!({"role": "system", "content": system})];
    for turn in 0..=t {
        messages.push(json!({"role": "user", "content": format!("Session {k}, question {turn}: {}", "why? ".repeat(40))}));
        if turn < t {
            messages.push(
                json!({"role": "assistant", "content": format!("Answer {turn} of session {k}.")}),
            );
        }
    }
    json!({"model": MODEL, "messages": messages, "max_tokens": 2, "stream": true})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_front_doors_decide_alike_on_the_same_workload() {
    let proxy = Setup::new(3, |_| {}).await;
    let picker = Setup::new(3, |_| {}).await;
    let http = reqwest::Client::builder().no_proxy().build().expect("client");
    let url = format!("http://{}/v1/chat/completions", proxy.gw.local_addr());
    for t in 0..4 {
        for k in 0..6 {
            let body = conversation(k, t);
            let r = http.post(&url).json(&body).send().await.expect("proxy");
            assert_eq!(r.status(), 200);
            let out = r.bytes().await.expect("body");
            assert!(sse_done(&out));
            let (_, status, _, out) =
                picker.envoy.exchange(&Send::new("/v1/chat/completions", &body), None).await;
            assert_eq!(status, 200);
            assert!(sse_done(&out));
        }
    }
    // Let the last events and metrics land.
    proxy.wait_in_flight(0).await;
    picker.wait_in_flight(0).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (a, b) = (hit_rate(&proxy).await, hit_rate(&picker).await);
    eprintln!("hit rate: proxy {a:.3}, endpoint picker {b:.3}");
    assert!(a > 0.5, "the workload should reuse its prefixes: {a}");
    assert!((a - b).abs() <= 0.01, "proxy {a:.3} vs endpoint picker {b:.3}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_body_is_refused_and_the_rest_of_it_ignored() {
    let s = Setup::new(1, |c| c.limits.max_body_bytes = 1_000).await;
    let mut st = s.envoy.open().await;
    let h = header_map(&[(":path", "/v1/chat/completions".to_owned())]);
    st.send(Msg::RequestHeaders(h), None).await;
    for _ in 0..2 {
        let chunk = HttpBody { body: vec![b' '; 600], ..Default::default() };
        st.send(Msg::RequestBody(chunk), None).await;
    }
    let Reply::ImmediateResponse(i) = st.reply().await else { panic!("expected a refusal") };
    assert_eq!(i.status.map(|s| s.code), Some(400));
    assert!(String::from_utf8_lossy(&i.body).contains("larger than 1000 bytes"));
    // The gateway had sent more before it read the refusal: no error for it.
    let last = HttpBody { body: vec![b' '; 600], end_of_stream: true, ..Default::default() };
    st.send(Msg::RequestBody(last), None).await;
    let next = tokio::time::timeout(Duration::from_millis(300), st.rx.message()).await;
    assert!(next.is_err(), "the picker answered or failed the stream: {next:?}");
    assert_eq!(s.in_flight(), 0);
}

/// Sends `msgs` on a fresh stream and reads what comes back until the
/// picker ends the stream or goes quiet: replies, or the gRPC error.
async fn hostile(envoy: &FakeEnvoy, msgs: Vec<Msg>) -> Result<Vec<Reply>, tonic::Status> {
    let mut st = envoy.open().await;
    for m in msgs {
        st.send(m, None).await;
    }
    let mut out = Vec::new();
    loop {
        match tokio::time::timeout(Duration::from_millis(1_500), st.rx.message()).await {
            Err(_) | Ok(Ok(None)) => return Ok(out),
            Ok(Ok(Some(r))) => out.extend(r.response),
            Ok(Err(status)) => return Err(status),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_out_of_order_end_the_stream_cleanly_and_book_nothing() {
    let s = Setup::new(1, |_| {}).await;
    let headers =
        || Msg::RequestHeaders(header_map(&[(":path", "/v1/chat/completions".to_owned())]));
    let body = |b: &[u8], end: bool| {
        Msg::RequestBody(HttpBody { body: b.to_vec(), end_of_stream: end, ..Default::default() })
    };
    let resp_headers = || Msg::ResponseHeaders(header_map(&[(":status", "200".to_owned())]));
    let resp_body = || {
        Msg::ResponseBody(HttpBody {
            body: b"data: x\n\n".to_vec(),
            end_of_stream: true,
            ..Default::default()
        })
    };
    // A body before any headers, and headers twice: protocol errors.
    let e = hostile(&s.envoy, vec![body(b"{}", true)]).await.expect_err("body first");
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    let e = hostile(&s.envoy, vec![headers(), headers()]).await.expect_err("headers twice");
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    // A response before any request, and trailers alone: passed on, nothing booked.
    let r = hostile(&s.envoy, vec![resp_headers(), resp_body()]).await.expect("answered");
    assert!(matches!(r.as_slice(), [Reply::ResponseHeaders(_), Reply::ResponseBody(_)]), "{r:?}");
    let r = hostile(&s.envoy, vec![Msg::RequestTrailers(HttpTrailers::default())])
        .await
        .expect("trailers");
    assert!(matches!(r.as_slice(), [Reply::RequestTrailers(_)]), "{r:?}");
    // Not JSON, JSON of the wrong shape, an unknown model: OpenAI-style 4xx.
    for (text, code) in [
        (&b"\xff\xfe not json"[..], 400),
        (br#"{"messages": "not a list"}"#, 400),
        (br#"{"model": "nobody", "messages": [{"role": "user", "content": "hi"}]}"#, 404),
    ] {
        let r = hostile(&s.envoy, vec![headers(), body(text, true)]).await.expect("answered");
        let [Reply::ImmediateResponse(i)] = r.as_slice() else { panic!("{r:?}") };
        assert_eq!(
            i.status.as_ref().map(|s| s.code),
            Some(code),
            "{}",
            String::from_utf8_lossy(text)
        );
    }
    // A response body after the request was placed but before its headers.
    let ok = serde_json::to_vec(&chat("fine", true)).expect("json");
    let r =
        hostile(&s.envoy, vec![headers(), body(&ok, true), resp_body()]).await.expect("answered");
    assert!(r.iter().any(|x| matches!(x, Reply::ResponseBody(_))), "{r:?}");
    s.wait_in_flight(0).await;
}
