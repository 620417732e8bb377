//! `deploy/kubernetes/`, the `Dockerfile` and `docs/deploy.md` against the
//! binary they run. Every document parses; the kvgate container passes only
//! flags and `KVGATE_*` variables that `kvgate serve --help` lists; the
//! ConfigMap's TOML and the Deployment's whole command line pass kvgate's own
//! validation (`--print-config`); the probes, Services, Secret references and
//! NetworkPolicies fit together; the engines publish their events where
//! kvgate's discovery looks for them; the image builds and exposes kvgate.
//! `scripts/check-manifests.sh` adds the strict Kubernetes schema check.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use serde::Deserialize;
use serde_json::Value;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn manifest_dir() -> PathBuf {
    root().join("deploy/kubernetes")
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// One YAML document of one manifest file.
#[derive(Debug)]
struct Doc {
    file: String,
    v: Value,
}

/// Every YAML file in deploy/kubernetes (sorted), kustomization.yaml included.
fn yaml_files() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(manifest_dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".yaml") || n.ends_with(".yml"))
        .collect();
    names.sort();
    names
}

fn parse_yaml(file: &str) -> Vec<Value> {
    let text = read(&manifest_dir().join(file));
    serde_norway::Deserializer::from_str(&text)
        .map(|d| Value::deserialize(d).unwrap_or_else(|e| panic!("{file}: {e}")))
        .filter(|v| !v.is_null())
        .collect()
}

/// Every Kubernetes resource (all files but kustomization.yaml).
fn docs() -> &'static [Doc] {
    static DOCS: OnceLock<Vec<Doc>> = OnceLock::new();
    DOCS.get_or_init(|| {
        let mut out = Vec::new();
        for file in yaml_files().into_iter().filter(|f| f != "kustomization.yaml") {
            for v in parse_yaml(&file) {
                out.push(Doc { file: file.clone(), v });
            }
        }
        out
    })
}

fn kustomization() -> Value {
    let mut v = parse_yaml("kustomization.yaml");
    assert_eq!(v.len(), 1, "kustomization.yaml holds one document");
    v.remove(0)
}

/// The namespace everything is deployed into (kustomization.yaml).
fn namespace() -> String {
    s(&kustomization(), "/namespace").to_owned()
}

fn s<'a>(v: &'a Value, ptr: &str) -> &'a str {
    v.pointer(ptr).and_then(Value::as_str).unwrap_or_else(|| panic!("no string at {ptr} in {v}"))
}

fn arr<'a>(v: &'a Value, ptr: &str) -> &'a [Value] {
    v.pointer(ptr).and_then(Value::as_array).map_or(&[], Vec::as_slice)
}

fn find(kind: &str, name: &str) -> &'static Value {
    docs()
        .iter()
        .map(|d| &d.v)
        .find(|v| v["kind"] == kind && v["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} named {name} in deploy/kubernetes"))
}

fn of_kind(kind: &str) -> impl Iterator<Item = &'static Value> + '_ {
    docs().iter().map(|d| &d.v).filter(move |v| v["kind"] == kind)
}

fn container<'a>(deployment: &'a Value, name: &str) -> &'a Value {
    arr(deployment, "/spec/template/spec/containers")
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no container {name}"))
}

fn kvgate() -> &'static Value {
    container(find("Deployment", "kvgate"), "kvgate")
}

fn vllm() -> &'static Value {
    container(find("Deployment", "vllm"), "vllm")
}

fn args(c: &Value) -> Vec<String> {
    arr(c, "/args").iter().map(|a| a.as_str().expect("args are strings").to_owned()).collect()
}

/// The value of `--flag` in an argument list, as `--flag=V` or `--flag V`.
fn flag(args: &[String], name: &str) -> Option<String> {
    let eq = format!("{name}=");
    args.iter().enumerate().find_map(|(i, a)| {
        if let Some(v) = a.strip_prefix(&eq) {
            Some(v.to_owned())
        } else if a == name {
            args.get(i + 1).cloned()
        } else {
            None
        }
    })
}

fn port_of(addr: &str) -> u16 {
    addr.rsplit_once(':').and_then(|(_, p)| p.parse().ok()).unwrap_or_else(|| panic!("{addr}"))
}

/// A container port by name or number.
fn container_port(c: &Value, port: &Value) -> u16 {
    if let Some(n) = port.as_u64() {
        return n as u16;
    }
    let name = port.as_str().unwrap();
    arr(c, "/ports")
        .iter()
        .find(|p| p["name"] == name)
        .and_then(|p| p["containerPort"].as_u64())
        .unwrap_or_else(|| panic!("no container port named {name}")) as u16
}

fn labels_match(selector: &Value, labels: &Value) -> bool {
    let Some(sel) = selector.as_object() else { return false };
    !sel.is_empty() && sel.iter().all(|(k, v)| labels.get(k) == Some(v))
}

fn pod_labels(deployment: &str) -> &'static Value {
    &find("Deployment", deployment)["spec"]["template"]["metadata"]["labels"]
}

fn configmap_toml(name: &str, key: &str) -> String {
    s(find("ConfigMap", name), &format!("/data/{key}")).to_owned()
}

fn discovery() -> toml::Table {
    let cfg: toml::Table = toml::from_str(&configmap_toml("kvgate-config", "kvgate.toml")).unwrap();
    cfg.get("discovery")
        .and_then(|d| d.as_table())
        .cloned()
        .expect("kvgate.toml has a [discovery] table")
}

fn discovery_int(d: &toml::Table, key: &str) -> i64 {
    d.get(key).and_then(toml::Value::as_integer).unwrap_or_else(|| panic!("discovery.{key}"))
}

/// `kvgate COMMAND --help`, with no KVGATE_* variables around.
fn help_of(command: &str) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_kvgate"))
        .args([command, "--help"])
        .env_clear()
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

/// `kvgate serve --help`, run once.
fn serve_help() -> &'static str {
    static HELP: OnceLock<String> = OnceLock::new();
    HELP.get_or_init(|| help_of("serve"))
}

/// The long flags clap lists as options (lines `  -h, --help` / `      --config <C>`).
fn help_flags() -> BTreeSet<String> {
    flags_in(serve_help())
}

fn flags_in(help: &str) -> BTreeSet<String> {
    help.lines()
        .filter_map(|l| {
            let t = l.trim_start();
            let t = if t.starts_with("--") { t } else { t.strip_prefix("-")?.split_once(", ")?.1 };
            let name: String = t
                .strip_prefix("--")?
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
                .collect();
            Some(format!("--{name}"))
        })
        .collect()
}

/// The variables clap names as `[env: NAME=…]` or `[env: NAME]`.
fn help_env() -> BTreeSet<String> {
    serve_help()
        .split("[env: ")
        .skip(1)
        .map(|rest| rest.chars().take_while(|c| *c != '=' && *c != ']').collect())
        .collect()
}

/// The value a container's env entry resolves to, as the kubelet would give it.
fn env_value(entry: &Value) -> String {
    if let Some(v) = entry.get("value").and_then(Value::as_str) {
        return v.to_owned();
    }
    let from = &entry["valueFrom"];
    if let Some(r) = from.get("secretKeyRef") {
        let secret = find("Secret", s(r, "/name"));
        let key = s(r, "/key");
        return secret
            .pointer(&format!("/stringData/{key}"))
            .and_then(Value::as_str)
            .unwrap_or_else(|| panic!("Secret {} has no stringData key {key}", s(r, "/name")))
            .to_owned();
    }
    if let Some(r) = from.get("configMapKeyRef") {
        return configmap_toml(s(r, "/name"), s(r, "/key"));
    }
    if let Some(r) = from.get("fieldRef") {
        assert_eq!(s(r, "/fieldPath"), "metadata.namespace", "unsupported fieldRef");
        return namespace();
    }
    panic!("unsupported env entry {entry}")
}

/// `$(NAME)` references expanded from `env`, as the kubelet expands args.
fn expand(arg: &str, env: &BTreeMap<String, String>) -> String {
    let mut out = arg.to_owned();
    for (k, v) in env {
        out = out.replace(&format!("$({k})"), v);
    }
    out
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kvgate-deploy-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn every_manifest_parses_and_the_kustomization_lists_them_all() {
    let files = yaml_files();
    assert!(files.contains(&"kustomization.yaml".to_owned()));
    for d in docs() {
        for key in ["/apiVersion", "/kind", "/metadata/name"] {
            assert!(d.v.pointer(key).and_then(Value::as_str).is_some(), "{}: no {key}", d.file);
        }
        assert!(
            d.v.pointer("/metadata/namespace").is_none(),
            "{}: leave the namespace to kustomization.yaml",
            d.file
        );
    }
    let listed: BTreeSet<String> = arr(&kustomization(), "/resources")
        .iter()
        .map(|r| r.as_str().unwrap().to_owned())
        .collect();
    let present: BTreeSet<String> =
        files.into_iter().filter(|f| f != "kustomization.yaml").collect();
    assert_eq!(listed, present, "kustomization.yaml must list exactly the manifests");
    assert_eq!(s(find("Namespace", &namespace()), "/metadata/name"), namespace());
    // What issue 9 asks deploy/kubernetes to hold.
    for (kind, name) in [
        ("Deployment", "kvgate"),
        ("Service", "kvgate"),
        ("Service", "kvgate-peers"),
        ("ConfigMap", "kvgate-config"),
        ("Deployment", "vllm"),
        ("Service", "vllm-engines"),
        ("Secret", "kvgate-keys"),
    ] {
        find(kind, name);
    }
    assert!(of_kind("NetworkPolicy").count() >= 2);
    assert!(find("Deployment", "kvgate")["spec"]["replicas"].as_u64().unwrap() >= 2);
}

#[test]
fn kvgate_args_and_env_use_only_what_serve_help_lists() {
    let flags = help_flags();
    let envs = help_env();
    // Sanity: the parse of the help found the long-standing flags.
    assert!(flags.contains("--listen") && flags.contains("--config"), "{flags:?}");
    assert!(envs.contains("KVGATE_LISTEN") && envs.contains("KVGATE_API_KEYS"), "{envs:?}");

    let c = kvgate();
    let a = args(c);
    assert_eq!(a.first().map(String::as_str), Some("serve"), "the image's entrypoint is kvgate");
    let mut missing = Vec::new();
    let mut after_bare_flag = false;
    for arg in &a[1..] {
        if let Some(rest) = arg.strip_prefix("--") {
            let name = format!("--{}", rest.split('=').next().unwrap());
            if !flags.contains(&name) {
                missing.push(name);
            }
            after_bare_flag = !rest.contains('=');
        } else {
            assert!(after_bare_flag, "stray argument {arg:?}");
            after_bare_flag = false;
        }
    }
    let joined = a.join(" ");
    for e in arr(c, "/env") {
        let name = s(e, "/name");
        if name.starts_with("KVGATE_") {
            if !envs.contains(name) {
                missing.push(name.to_owned());
            }
        } else {
            assert!(joined.contains(&format!("$({name})")), "env {name} is set but never used");
        }
    }
    assert!(missing.is_empty(), "not in `kvgate serve --help`: {missing:?}");
}

#[test]
fn the_configmap_holds_a_valid_kvgate_config() {
    let dir = scratch("configmap");
    let path = dir.join("kvgate.toml");
    std::fs::write(&path, configmap_toml("kvgate-config", "kvgate.toml")).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_kvgate"))
        .args(["serve", "--config"])
        .arg(&path)
        .arg("--print-config")
        .env_clear()
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        out.status.success(),
        "kvgate refuses the ConfigMap's kvgate.toml: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The kvgate container's command line, run as the kubelet would start it
/// (env from the Secret, `$(VAR)` expanded, the ConfigMap at its mount
/// path), with `--print-config`: kvgate's own validation must accept the
/// combination, and the flags must land on the keys docs/config.md names.
#[test]
fn the_deployments_command_line_passes_kvgate_validation() {
    let deployment = find("Deployment", "kvgate");
    let c = kvgate();
    let env: BTreeMap<String, String> =
        arr(c, "/env").iter().map(|e| (s(e, "/name").to_owned(), env_value(e))).collect();
    let dir = scratch("cmdline");
    // ConfigMap volumes: mount path -> (config map name).
    let mut mounts = Vec::new();
    for m in arr(c, "/volumeMounts") {
        let vol = arr(deployment, "/spec/template/spec/volumes")
            .iter()
            .find(|v| v["name"] == m["name"])
            .expect("volume of the mount");
        if let Some(cm) = vol.pointer("/configMap/name").and_then(Value::as_str) {
            mounts.push((s(m, "/mountPath").to_owned(), cm.to_owned()));
        }
    }
    let mut argv = Vec::new();
    let mut config_seen = false;
    for a in &args(c)[1..] {
        let mut a = expand(a, &env);
        if let Some(p) = a.strip_prefix("--config=") {
            let (mount, cm) = mounts
                .iter()
                .find(|(m, _)| p.starts_with(&format!("{m}/")))
                .unwrap_or_else(|| panic!("--config={p} is not in a mounted ConfigMap"));
            let key = &p[mount.len() + 1..];
            let local = dir.join(key);
            std::fs::write(&local, configmap_toml(cm, key)).unwrap();
            a = format!("--config={}", local.display());
            config_seen = true;
        }
        assert!(!a.contains("$("), "unexpanded reference in {a}");
        argv.push(a);
    }
    assert!(config_seen, "the kvgate container passes --config");
    let out = Command::new(env!("CARGO_BIN_EXE_kvgate"))
        .arg("serve")
        .args(&argv)
        .arg("--print-config")
        .env_clear()
        .envs(&env)
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "kvgate serve {argv:?} --print-config: {stderr}");
    let printed: toml::Table = toml::from_str(&String::from_utf8(out.stdout).unwrap()).unwrap();
    let get = |path: &str| {
        let mut v: Option<&toml::Value> = None;
        for (i, part) in path.split('.').enumerate() {
            v = if i == 0 { printed.get(part) } else { v.and_then(|t| t.get(part)) };
        }
        v.and_then(toml::Value::as_str).map(str::to_owned)
    };
    let ns = namespace();
    assert_eq!(get("listen").as_deref(), Some("0.0.0.0:8000"));
    assert_eq!(get("peers.listen").as_deref(), Some("0.0.0.0:9000"));
    assert_eq!(
        get("peers.dns").as_deref(),
        Some(format!("kvgate-peers.{ns}.svc.cluster.local:9000").as_str())
    );
    assert_eq!(
        get("discovery.dns").as_deref(),
        Some(format!("vllm-engines.{ns}.svc.cluster.local").as_str())
    );
}

#[test]
fn probes_use_health_and_ready_on_the_api_port() {
    let c = kvgate();
    let listen = flag(&args(c), "--listen").expect("--listen");
    let host = &listen[..listen.rfind(':').unwrap()];
    assert!(
        !["127.0.0.1", "localhost", "[::1]"].contains(&host),
        "--listen {listen} is loopback: the kubelet and the Service could not reach it"
    );
    for (probe, path) in [("livenessProbe", "/health"), ("readinessProbe", "/ready")] {
        let get = &c[probe]["httpGet"];
        assert_eq!(get["path"], path, "{probe}");
        assert_eq!(container_port(c, &get["port"]), port_of(&listen), "{probe} port");
    }
}

#[test]
fn services_select_their_pods_and_target_declared_ports() {
    for svc in of_kind("Service") {
        let name = s(svc, "/metadata/name");
        let sel = &svc["spec"]["selector"];
        let deployment = of_kind("Deployment")
            .find(|d| labels_match(sel, &d["spec"]["template"]["metadata"]["labels"]))
            .unwrap_or_else(|| panic!("Service {name} selects no Deployment's pods"));
        // The Deployment's own selector must match its template too.
        assert!(labels_match(
            &deployment["spec"]["selector"]["matchLabels"],
            &deployment["spec"]["template"]["metadata"]["labels"]
        ));
        let c = &arr(deployment, "/spec/template/spec/containers")[0];
        for p in arr(svc, "/spec/ports") {
            let target = p.get("targetPort").unwrap_or(&p["port"]);
            assert_eq!(container_port(c, target), p["port"].as_u64().unwrap() as u16, "{name}");
        }
    }
    let api = find("Service", "kvgate");
    assert_eq!(api["spec"]["type"], "ClusterIP");
    assert_eq!(arr(api, "/spec/ports")[0]["port"], 8000);

    let ns = namespace();
    let a = args(kvgate());
    let peers = find("Service", "kvgate-peers");
    assert_eq!(peers["spec"]["clusterIP"], "None", "kvgate-peers is headless");
    assert_eq!(peers["spec"]["publishNotReadyAddresses"], true);
    let peer_port = port_of(&flag(&a, "--peer-listen").expect("--peer-listen"));
    assert_eq!(arr(peers, "/spec/ports")[0]["port"].as_u64(), Some(u64::from(peer_port)));
    assert_eq!(
        expand(&flag(&a, "--peer-dns").expect("--peer-dns"), &env_of_namespace(&ns)),
        format!("kvgate-peers.{ns}.svc.cluster.local:{peer_port}")
    );
    let engines = find("Service", "vllm-engines");
    assert_eq!(engines["spec"]["clusterIP"], "None", "vllm-engines is headless");
    assert_eq!(
        expand(&flag(&a, "--discover-dns").expect("--discover-dns"), &env_of_namespace(&ns)),
        format!("vllm-engines.{ns}.svc.cluster.local")
    );
}

fn env_of_namespace(ns: &str) -> BTreeMap<String, String> {
    BTreeMap::from([("POD_NAMESPACE".to_owned(), ns.to_owned())])
}

/// Every secretKeyRef points at a key the Secret holds, and every ConfigMap
/// volume at a ConfigMap that exists.
#[test]
fn secret_and_configmap_references_resolve() {
    let mut refs = 0;
    for d in of_kind("Deployment") {
        for c in arr(d, "/spec/template/spec/containers") {
            for e in arr(c, "/env") {
                if e.pointer("/valueFrom/secretKeyRef").is_some() {
                    let v = env_value(e);
                    assert!(v.len() >= 8, "{}: keys need at least 8 characters", s(e, "/name"));
                    refs += 1;
                }
            }
        }
        for v in arr(d, "/spec/template/spec/volumes") {
            if let Some(cm) = v.pointer("/configMap/name").and_then(Value::as_str) {
                find("ConfigMap", cm);
            }
        }
    }
    assert!(refs >= 5, "kvgate's four keys and the engines' key come from the Secret");
}

#[test]
fn engines_publish_events_where_discovery_looks() {
    let d = discovery();
    let http = discovery_int(&d, "http_port");
    let events = discovery_int(&d, "events_port");
    let replay = discovery_int(&d, "replay_port");
    let topic = d.get("topic").and_then(toml::Value::as_str).expect("discovery.topic");
    let c = vllm();
    let a = args(c);
    let kv: Value =
        serde_json::from_str(&flag(&a, "--kv-events-config").expect("--kv-events-config"))
            .expect("--kv-events-config is JSON");
    assert_eq!(kv["enable_kv_cache_events"], true);
    assert_eq!(kv["publisher"], "zmq");
    // `*` makes vLLM bind; kvgate dials each pod's address on these ports.
    assert_eq!(kv["endpoint"], format!("tcp://*:{events}"));
    assert!(replay > 0, "the example uses replay");
    assert_eq!(kv["replay_endpoint"], format!("tcp://*:{replay}"));
    assert_eq!(kv["topic"], topic);
    assert_eq!(flag(&a, "--port"), Some(http.to_string()));
    if let Some(bs) = d.get("block_size").and_then(toml::Value::as_integer) {
        assert_eq!(flag(&a, "--block-size"), Some(bs.to_string()));
    }
    assert!(a.iter().any(|x| x == "--enable-prefix-caching"));
    assert!(c["resources"]["limits"]["nvidia.com/gpu"].as_u64().unwrap_or(0) >= 1);

    // The engines' key and the key kvgate sends them are one Secret entry.
    assert_eq!(flag(&a, "--api-key").as_deref(), Some("$(VLLM_API_KEY)"));
    let key_ref = |c: &Value, var: &str| {
        arr(c, "/env")
            .iter()
            .find(|e| e["name"] == var)
            .and_then(|e| e.pointer("/valueFrom/secretKeyRef"))
            .cloned()
            .unwrap_or_else(|| panic!("{var} from a Secret"))
    };
    assert_eq!(key_ref(c, "VLLM_API_KEY"), key_ref(kvgate(), "KVGATE_ENGINE_API_KEY"));

    let svc_ports: BTreeSet<i64> = arr(find("Service", "vllm-engines"), "/spec/ports")
        .iter()
        .map(|p| p["port"].as_i64().unwrap())
        .collect();
    assert_eq!(svc_ports, BTreeSet::from([http, events, replay]));
}

/// Which peers a NetworkPolicy ingress set admits to `port` on pods with
/// `labels`: None when no policy selects those pods (all traffic is allowed).
fn admitted(labels: &Value, port: u16) -> Option<Vec<Value>> {
    let mut selected = false;
    let mut from = Vec::new();
    for np in of_kind("NetworkPolicy") {
        if !labels_match(&np["spec"]["podSelector"]["matchLabels"], labels) {
            continue;
        }
        selected = true;
        for rule in arr(np, "/spec/ingress") {
            let ports = arr(rule, "/ports");
            let covers = ports.is_empty() || ports.iter().any(|p| p["port"] == port);
            if covers {
                match rule.get("from").and_then(Value::as_array) {
                    Some(peers) if !peers.is_empty() => from.extend(peers.iter().cloned()),
                    // No `from`: every source.
                    _ => from.push(Value::String("anyone".into())),
                }
            }
        }
    }
    selected.then_some(from)
}

#[test]
fn network_policies_keep_event_and_peer_ports_to_kvgate() {
    let kv_labels = pod_labels("kvgate");
    let only_kvgate = |who: &[Value]| {
        !who.is_empty()
            && who.iter().all(|p| {
                p.get("namespaceSelector").is_none()
                    && p.get("ipBlock").is_none()
                    && labels_match(&p["podSelector"]["matchLabels"], kv_labels)
            })
    };
    let d = discovery();
    for key in ["events_port", "replay_port", "http_port"] {
        let port = discovery_int(&d, key) as u16;
        let who = admitted(pod_labels("vllm"), port)
            .unwrap_or_else(|| panic!("no NetworkPolicy selects the engines (port {port} open)"));
        assert!(only_kvgate(&who), "engines' port {port} admits {who:?}");
    }
    let peer = port_of(&flag(&args(kvgate()), "--peer-listen").unwrap());
    let who = admitted(kv_labels, peer).expect("a NetworkPolicy selects the kvgate pods");
    assert!(only_kvgate(&who), "peer port {peer} admits {who:?}");
    let api = port_of(&flag(&args(kvgate()), "--listen").unwrap());
    let who = admitted(kv_labels, api).unwrap();
    assert!(!who.is_empty(), "clients must reach kvgate's API port {api}");
}

#[test]
fn the_dockerfile_builds_kvgate_and_exposes_the_manifests_ports() {
    let text = read(&root().join("Dockerfile"));
    let lines: Vec<&str> =
        text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')).collect();
    let froms: Vec<usize> =
        (0..lines.len()).filter(|&i| lines[i].to_ascii_uppercase().starts_with("FROM ")).collect();
    assert!(froms.len() >= 2, "a multi-stage build");
    let build_stage = lines[froms[0]]
        .rsplit_once(" AS ")
        .or_else(|| lines[froms[0]].rsplit_once(" as "))
        .map(|(_, n)| n.trim().to_owned())
        .expect("the build stage is named");
    let build = lines[froms[0]..froms[1]].join("\n");
    assert!(build.contains("cargo build --release -p kvgate --locked"), "{build}");

    let last = &lines[*froms.last().unwrap()..];
    let inst = |name: &str| -> Vec<&str> {
        last.iter().filter_map(|l| l.strip_prefix(name)).map(str::trim).collect()
    };
    let copies = inst("COPY ");
    assert!(
        copies
            .iter()
            .any(|c| c.starts_with(&format!("--from={build_stage} ")) && c.contains("kvgate")),
        "the runtime stage copies the kvgate binary from {build_stage}: {copies:?}"
    );
    assert_eq!(inst("ENTRYPOINT "), vec![r#"["kvgate"]"#]);
    assert_eq!(inst("CMD "), vec![r#"["serve"]"#]);
    let user = inst("USER ");
    assert_eq!(user.len(), 1, "the runtime stage sets one USER");
    let uid = user[0].split(':').next().unwrap();
    assert!(uid != "0" && uid != "root", "non-root user");
    let run_as = find("Deployment", "kvgate")["spec"]["template"]["spec"]["securityContext"]
        ["runAsUser"]
        .as_u64()
        .expect("runAsUser");
    assert_eq!(uid, run_as.to_string(), "the Deployment runs as the image's user");

    let exposed: BTreeSet<u16> = inst("EXPOSE ")
        .iter()
        .flat_map(|l| l.split_whitespace())
        .map(|p| p.trim_end_matches("/tcp").parse().unwrap())
        .collect();
    assert!(exposed.is_superset(&BTreeSet::from([8000, 8001, 9000])), "{exposed:?}");
    for p in arr(kvgate(), "/ports") {
        let port = p["containerPort"].as_u64().unwrap() as u16;
        assert!(exposed.contains(&port), "container port {port} is not EXPOSEd");
    }

    // The build context keeps what the binary embeds (the bundled tokenizer,
    // the dashboard) and drops the build outputs.
    let ignore = read(&root().join(".dockerignore"));
    let patterns: Vec<&str> = ignore
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| l.trim_end_matches('/'))
        .collect();
    for must in ["target", ".cache"] {
        assert!(patterns.contains(&must), ".dockerignore lacks {must}");
    }
    for keep in [
        "Cargo.lock",
        "assets/tokenizers/qwen3/tokenizer.json.zst",
        "crates/kvgate-gateway/assets/dashboard/index.html",
        "crates/kvgate/src/main.rs",
    ] {
        assert!(root().join(keep).exists(), "{keep} moved: update this test");
        for p in &patterns {
            let hit = *p == "*"
                || *p == "**"
                || keep == *p
                || keep.starts_with(&format!("{p}/"))
                || (p.ends_with('*') && keep.starts_with(p.trim_end_matches('*')));
            assert!(!hit, ".dockerignore pattern {p:?} drops {keep}");
        }
    }
}

/// docs/deploy.md names only flags and variables that exist: `kvgate serve`'s
/// (per its --help), or the few of vLLM, docker, kubectl and cargo it quotes.
#[test]
fn docs_deploy_md_names_only_real_flags() {
    let text = read(&root().join("docs/deploy.md"));
    let others: BTreeSet<&str> = [
        // vLLM
        "--kv-events-config",
        "--enable-prefix-caching",
        "--block-size",
        "--port",
        "--host",
        // docker, kubectl, cargo
        "--rm",
        "--from-literal",
        "--release",
        "--locked",
        "--test",
    ]
    .into();
    // The endpoint picker's section names `kvgate epp`'s own flags.
    let epp_help = help_of("epp");
    let mut flags = help_flags();
    flags.extend(flags_in(&epp_help));
    let mut envs = help_env();
    envs.extend(
        epp_help
            .split("[env: ")
            .skip(1)
            .map(|r| r.chars().take_while(|c| *c != '=' && *c != ']').collect::<String>()),
    );
    let mut unknown = BTreeSet::new();
    let bytes = text.as_bytes();
    for (i, _) in text.match_indices("--") {
        if i > 0 && (bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'-') {
            continue;
        }
        let name: String =
            text[i + 2..].chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '-').collect();
        if name.is_empty() || !name.starts_with(|c: char| c.is_ascii_lowercase()) {
            continue;
        }
        let f = format!("--{name}");
        if !flags.contains(&f) && !others.contains(f.as_str()) {
            unknown.insert(f);
        }
    }
    for (i, _) in text.match_indices("KVGATE_") {
        let name: String = text[i..]
            .chars()
            .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
            .collect();
        // `KVGATE_*` stands for all of them.
        if !name.ends_with('_') && !envs.contains(&name) {
            unknown.insert(name);
        }
    }
    assert!(
        unknown.is_empty(),
        "docs/deploy.md names what `kvgate serve` and `kvgate epp` lack: {unknown:?}"
    );
}
