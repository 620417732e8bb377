//! `deploy/gateway-api/` (kvgate as a Gateway API Inference Extension pool's
//! endpoint picker) and `deploy/envoy/envoy.yaml` (plain Envoy with kvgate
//! as its ext_proc service) against kvgate and each other: every document
//! parses; the kustomization lists every file; the picker's command line
//! passes `kvgate epp`'s own validation; the pool selects the vLLM pods of
//! `deploy/kubernetes` on their port and names the picker's Service and
//! port, which reach the container's gRPC listener; the route sends to the
//! pool; and the Envoy bootstrap's ext_proc filter and clusters use only
//! fields and enum values of Envoy's protobuf schema (envoy-types), in the
//! modes the protocol needs. `scripts/check-manifests.sh` adds the strict
//! schema checks (Kubernetes kinds, and the InferencePool against its CRD).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use envoy_types::pb::envoy::config::cluster::v3::cluster;
use envoy_types::pb::envoy::extensions::filters::http::ext_proc::v3::processing_mode::{
    BodySendMode, HeaderSendMode,
};
use envoy_types::pb::envoy::extensions::filters::http::ext_proc::v3::{
    ExternalProcessor, ProcessingMode,
};
use envoy_types::pb::envoy::extensions::filters::http::router::v3::Router;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::HttpConnectionManager;
use envoy_types::pb::envoy::extensions::upstreams::http::v3::HttpProtocolOptions;
use prost::Name;
use serde::Deserialize;
use serde_json::Value;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn parse(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_norway::Deserializer::from_str(&text)
        .map(|d| Value::deserialize(d).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
        .filter(|v| !v.is_null())
        .collect()
}

fn gateway_api(file: &str) -> Vec<Value> {
    parse(&root().join("deploy/gateway-api").join(file))
}

fn one(file: &str, kind: &str) -> Value {
    let docs = gateway_api(file);
    let mut of_kind = docs.into_iter().filter(|d| d["kind"] == kind);
    let d = of_kind.next().unwrap_or_else(|| panic!("{file} has no {kind}"));
    assert!(of_kind.next().is_none(), "{file} has two {kind}s");
    d
}

fn s<'a>(v: &'a Value, ptr: &str) -> &'a str {
    v.pointer(ptr).and_then(Value::as_str).unwrap_or_else(|| panic!("no string at {ptr} in {v}"))
}

fn n(v: &Value, ptr: &str) -> u64 {
    v.pointer(ptr).and_then(Value::as_u64).unwrap_or_else(|| panic!("no number at {ptr} in {v}"))
}

fn args(deployment: &Value) -> Vec<String> {
    let c = &deployment["spec"]["template"]["spec"]["containers"][0];
    c["args"].as_array().unwrap().iter().map(|a| a.as_str().unwrap().to_owned()).collect()
}

fn flag(args: &[String], name: &str) -> Option<String> {
    args.iter().find_map(|a| a.strip_prefix(&format!("{name}=")).map(str::to_owned))
}

fn port_of(addr: &str) -> u64 {
    addr.rsplit(':').next().unwrap().parse().unwrap()
}

#[test]
fn every_file_parses_and_the_kustomization_lists_them() {
    let dir = root().join("deploy/gateway-api");
    let mut files: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".yaml"))
        .collect();
    files.sort();
    for f in &files {
        assert!(!gateway_api(f).is_empty(), "{f} is empty");
    }
    let k = one("kustomization.yaml", "Kustomization");
    let listed: BTreeSet<&str> =
        k["resources"].as_array().unwrap().iter().map(|r| r.as_str().unwrap()).collect();
    let present: BTreeSet<&str> =
        files.iter().map(String::as_str).filter(|f| *f != "kustomization.yaml").collect();
    assert_eq!(listed, present, "the kustomization must list every manifest");
    assert_eq!(k["namespace"], "kvgate", "the same namespace as deploy/kubernetes");
}

#[test]
fn the_pickers_command_line_passes_kvgate_validation() {
    let d = one("kvgate-epp.yaml", "Deployment");
    let mut a = args(&d);
    assert_eq!(a[0], "epp");
    // The config file is deploy/kubernetes' ConfigMap; the environment's
    // names are expanded as the kubelet would.
    let config = std::env::temp_dir().join(format!("kvgate-epp-{}.toml", std::process::id()));
    let cm = parse(&root().join("deploy/kubernetes/kvgate-config.yaml"));
    let cm = cm.iter().find(|d| d["kind"] == "ConfigMap").expect("kvgate-config");
    std::fs::write(&config, s(cm, "/data/kvgate.toml")).unwrap();
    for x in &mut a {
        if x.starts_with("--config=") {
            *x = format!("--config={}", config.display());
        }
        *x = x.replace("$(POD_NAMESPACE)", "kvgate");
    }
    let out = support::kvgate_cmd()
        .args(&a)
        .arg("--print-config")
        .env("KVGATE_API_KEYS", "client-key-0123")
        .env("KVGATE_ADMIN_KEY", "admin-key-0123")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{a:?}: {}", String::from_utf8_lossy(&out.stderr));
    let printed: toml::Table = toml::from_str(&text).unwrap();
    assert_eq!(printed["epp"]["listen"].as_str(), Some("0.0.0.0:9002"), "{text}");
    assert_eq!(printed["listen"].as_str(), Some("0.0.0.0:8000"), "{text}");
}

#[test]
fn the_pool_selects_the_engines_and_names_the_pickers_service() {
    let pool = one("inferencepool.yaml", "InferencePool");
    let svc = one("kvgate-epp-service.yaml", "Service");
    let epp = one("kvgate-epp.yaml", "Deployment");
    // The picker's Service, on the port the gateway is told.
    assert_eq!(s(&pool, "/spec/endpointPickerRef/name"), s(&svc, "/metadata/name"));
    assert_eq!(s(&pool, "/spec/endpointPickerRef/kind"), "Service");
    let port = n(&pool, "/spec/endpointPickerRef/port/number");
    let sp = svc["spec"]["ports"].as_array().unwrap().iter().find(|p| p["port"] == port);
    let sp = sp.unwrap_or_else(|| panic!("the Service has no port {port}"));
    assert_eq!(sp["appProtocol"], "kubernetes.io/h2c", "ext_proc is HTTP/2");
    // The Service reaches the picker's pods on the gRPC listener.
    let labels = &epp["spec"]["template"]["metadata"]["labels"];
    for (k, v) in svc["spec"]["selector"].as_object().unwrap() {
        assert_eq!(&labels[k], v, "the Service does not select the picker's pods");
    }
    let c = &epp["spec"]["template"]["spec"]["containers"][0];
    let target = s(sp, "/targetPort");
    let cp = c["ports"].as_array().unwrap().iter().find(|p| p["name"] == target).unwrap();
    let listen = flag(&args(&epp), "--listen").expect("--listen");
    assert_eq!(cp["containerPort"].as_u64(), Some(port_of(&listen)));
    // Its gRPC probes ask the health services kvgate's picker serves.
    assert_eq!(s(c, "/readinessProbe/grpc/service"), "readiness");
    assert_eq!(s(c, "/livenessProbe/grpc/service"), "liveness");
    assert_eq!(c["readinessProbe"]["grpc"]["port"].as_u64(), Some(port_of(&listen)));
    // The pool's selector and port are the vLLM pods'.
    let vllm = parse(&root().join("deploy/kubernetes/vllm.yaml"));
    let vllm = vllm.iter().find(|d| d["kind"] == "Deployment").unwrap();
    let vlabels = &vllm["spec"]["template"]["metadata"]["labels"];
    for (k, v) in pool["spec"]["selector"]["matchLabels"].as_object().unwrap() {
        assert_eq!(&vlabels[k], v, "the pool does not select the vLLM pods");
    }
    let vports: Vec<u64> = vllm["spec"]["template"]["spec"]["containers"][0]["ports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["containerPort"].as_u64().unwrap())
        .collect();
    for p in pool["spec"]["targetPorts"].as_array().unwrap() {
        assert!(vports.contains(&p["number"].as_u64().unwrap()), "{p} is not a vLLM port");
    }
}

/// Whether a NetworkPolicy of deploy/gateway-api admits pods labelled
/// `from` (or a namespace labelled `from_ns`) to pods labelled `to` on `port`.
fn admitted(to: &str, from: Option<&str>, from_ns: Option<&str>, port: u64) -> bool {
    gateway_api("networkpolicy.yaml").iter().any(|np| {
        np["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/name"] == to
            && np["spec"]["ingress"].as_array().unwrap().iter().any(|rule| {
                let ports = rule["ports"].as_array().unwrap();
                let on_port = ports.iter().any(|p| p["port"].as_u64() == Some(port));
                let froms = rule["from"].as_array();
                let by = froms.is_none_or(|f| {
                    f.iter().any(|peer| {
                        from.is_some_and(|l| {
                            peer["podSelector"]["matchLabels"]["app.kubernetes.io/name"] == l
                        }) || from_ns
                            .is_some_and(|l| peer["namespaceSelector"]["matchLabels"][l] == "true")
                    })
                });
                on_port && by
            })
    })
}

#[test]
fn network_policies_let_the_picker_and_the_gateway_through() {
    // deploy/kubernetes admits only the proxy pods to the engines.
    for port in [8000, 5557, 5558] {
        assert!(admitted("vllm", Some("kvgate-epp"), None, port), "picker → engines :{port}");
    }
    let gw = "kvgate.io/inference-gateway";
    assert!(admitted("vllm", None, Some(gw), 8000), "gateway → engines :8000");
    assert!(admitted("kvgate-epp", None, Some(gw), 9002), "gateway → picker :9002");
    assert!(
        !admitted("kvgate-epp", Some("anything"), None, 9002),
        "the picker's gRPC port is open"
    );
}

#[test]
fn the_route_sends_to_the_pool() {
    let route = one("httproute.yaml", "HTTPRoute");
    let pool = one("inferencepool.yaml", "InferencePool");
    assert_eq!(s(&route, "/apiVersion"), "gateway.networking.k8s.io/v1");
    let rules = route["spec"]["rules"].as_array().unwrap();
    assert!(!rules.is_empty());
    for r in rules {
        for b in r["backendRefs"].as_array().unwrap() {
            assert_eq!(b["group"], "inference.networking.k8s.io");
            assert_eq!(b["kind"], "InferencePool");
            assert_eq!(b["name"], pool["metadata"]["name"]);
        }
    }
}

/// The keys a YAML object of Envoy message `$ty` may use: each is checked at
/// compile time to be a field of envoy-types' `$ty`.
macro_rules! fields {
    ($ty:ty { $($f:ident),* $(,)? }) => {{
        #[allow(dead_code)]
        fn check(v: &$ty) {
            $(let _ = &v.$f;)*
        }
        [$(stringify!($f)),*]
    }};
}

fn keys_within(v: &Value, allowed: &[&str], what: &str) {
    for k in v.as_object().unwrap_or_else(|| panic!("{what} is not a map")).keys() {
        assert!(k == "@type" || allowed.contains(&k.as_str()), "{what}: `{k}` is not a field");
    }
}

#[test]
fn the_envoy_bootstrap_uses_envoys_schema_and_the_protocols_modes() {
    let boot = parse(&root().join("deploy/envoy/envoy.yaml")).remove(0);
    let listener = &boot["static_resources"]["listeners"][0];
    let hcm = &listener["filter_chains"][0]["filters"][0]["typed_config"];
    assert_eq!(s(hcm, "/@type"), HttpConnectionManager::type_url());
    let filters = hcm["http_filters"].as_array().unwrap();
    let last = &filters[filters.len() - 1]["typed_config"];
    assert_eq!(s(last, "/@type"), Router::type_url(), "the router filter comes last");
    let ext = filters
        .iter()
        .map(|f| &f["typed_config"])
        .find(|t| t["@type"] == ExternalProcessor::type_url().as_str())
        .expect("an ext_proc filter");
    let ext_fields = fields!(ExternalProcessor {
        grpc_service,
        failure_mode_allow,
        message_timeout,
        allow_mode_override,
        processing_mode,
    });
    keys_within(ext, &ext_fields, "ext_proc");
    assert_eq!(ext["failure_mode_allow"], false);
    let mode = &ext["processing_mode"];
    let mode_fields = fields!(ProcessingMode {
        request_header_mode,
        response_header_mode,
        request_body_mode,
        response_body_mode,
        request_trailer_mode,
        response_trailer_mode,
    });
    keys_within(mode, &mode_fields, "processing_mode");
    for k in ["request_body_mode", "response_body_mode"] {
        assert_eq!(
            BodySendMode::from_str_name(s(mode, &format!("/{k}"))),
            Some(BodySendMode::FullDuplexStreamed),
            "{k}"
        );
    }
    for k in [
        "request_header_mode",
        "response_header_mode",
        "request_trailer_mode",
        "response_trailer_mode",
    ] {
        assert_eq!(
            HeaderSendMode::from_str_name(s(mode, &format!("/{k}"))),
            Some(HeaderSendMode::Send),
            "{k}"
        );
    }
    // The picker's cluster: HTTP/2 to kvgate epp's default gRPC port.
    let clusters = boot["static_resources"]["clusters"].as_array().unwrap();
    let by_name = |name: &str| {
        clusters.iter().find(|c| c["name"] == name).unwrap_or_else(|| panic!("no cluster {name}"))
    };
    let epp = by_name(s(ext, "/grpc_service/envoy_grpc/cluster_name"));
    let opts = &epp["typed_extension_protocol_options"]
        ["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"];
    assert_eq!(s(opts, "/@type"), HttpProtocolOptions::type_url());
    assert!(opts["explicit_http_config"]["http2_protocol_options"].is_object());
    let addr = &epp["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]
        ["socket_address"];
    assert_eq!(
        addr["port_value"].as_u64(),
        Some(u64::from(kvgate_gateway::config::DEFAULT_EPP_LISTEN.port()))
    );
    // The engines' cluster: the address the picker names.
    let route = &hcm["route_config"]["virtual_hosts"][0]["routes"][0]["route"];
    let engines = by_name(s(route, "/cluster"));
    assert_eq!(
        cluster::DiscoveryType::from_str_name(s(engines, "/type")),
        Some(cluster::DiscoveryType::OriginalDst)
    );
    assert_eq!(
        cluster::LbPolicy::from_str_name(s(engines, "/lb_policy")),
        Some(cluster::LbPolicy::ClusterProvided)
    );
    let odst = &engines["original_dst_lb_config"];
    let odst_fields = fields!(cluster::OriginalDstLbConfig { use_http_header, http_header_name });
    keys_within(odst, &odst_fields, "original_dst_lb_config");
    assert_eq!(odst["use_http_header"], true);
    assert_eq!(s(odst, "/http_header_name"), "x-gateway-destination-endpoint");
}
