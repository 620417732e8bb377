//! `deploy/kubernetes/`, the `Dockerfile` and `docs/deploy.md` against the
//! binary they run. Every document parses; the kvgate container passes only
//! flags and `KVGATE_*` variables that `kvgate serve --help` lists; the
//! ConfigMap's files and the Deployment's whole command line pass kvgate's
//! own validation (`--print-config`); each model pool finds its own engine
//! Deployment through a headless Service of its own, and those engines serve
//! the pool's model and publish their events where the pool's discovery
//! looks for them; the probes, Services, Secret references and
//! NetworkPolicies fit together; the image builds and exposes kvgate.
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

/// The ConfigMap volumes of a Deployment's container: (mount path, ConfigMap).
fn configmap_mounts(deployment: &Value, c: &Value) -> Vec<(String, String)> {
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
    mounts
}

/// The ConfigMap and key a `--config=PATH` of `c` reads.
fn config_source(deployment: &Value, c: &Value, path: &str) -> (String, String) {
    configmap_mounts(deployment, c)
        .into_iter()
        .find(|(m, _)| path.starts_with(&format!("{m}/")))
        .map(|(m, cm)| (cm, path[m.len() + 1..].to_owned()))
        .unwrap_or_else(|| panic!("--config={path} is not in a mounted ConfigMap"))
}

/// The kvgate container's configuration file: (ConfigMap, key).
fn kvgate_config_source() -> (String, String) {
    let path = flag(&args(kvgate()), "--config").expect("the kvgate container passes --config");
    config_source(find("Deployment", "kvgate"), kvgate(), &path)
}

/// The kvgate container's configuration file, parsed.
fn kvgate_config() -> toml::Table {
    let (cm, key) = kvgate_config_source();
    toml::from_str(&configmap_toml(&cm, &key)).unwrap_or_else(|e| panic!("{cm}/{key}: {e}"))
}

/// The `[[pools]]` of the kvgate container's configuration file.
fn pools() -> Vec<toml::Table> {
    let cfg = kvgate_config();
    let pools =
        cfg.get("pools").and_then(toml::Value::as_array).expect("kvgate's file has [[pools]]");
    pools.iter().map(|p| p.as_table().expect("a [[pools]] entry is a table").clone()).collect()
}

fn pool_name(p: &toml::Table) -> String {
    p.get("name").and_then(toml::Value::as_str).expect("every pool is named").to_owned()
}

fn table(t: &toml::Table, key: &str) -> toml::Table {
    t.get(key).and_then(toml::Value::as_table).cloned().unwrap_or_default()
}

fn pool_served_name(p: &toml::Table) -> String {
    table(p, "model")
        .get("served_name")
        .and_then(toml::Value::as_str)
        .unwrap_or_else(|| panic!("pool {}: model.served_name", pool_name(p)))
        .to_owned()
}

/// A pool's `discovery` table.
fn discovery(p: &toml::Table) -> toml::Table {
    let d = table(p, "discovery");
    assert!(!d.is_empty(), "pool {} has a discovery table", pool_name(p));
    d
}

fn discovery_str(d: &toml::Table, key: &str) -> String {
    d.get(key).and_then(toml::Value::as_str).unwrap_or_else(|| panic!("discovery.{key}")).to_owned()
}

/// The Deployments whose pods `selector` (matchLabels) selects.
fn deployments_selected_by(selector: &Value) -> Vec<&'static Value> {
    of_kind("Deployment")
        .filter(|d| labels_match(selector, &d["spec"]["template"]["metadata"]["labels"]))
        .collect()
}

/// The vLLM container of an engine Deployment (`vllm serve`), if it is one.
fn vllm_container(d: &Value) -> Option<&Value> {
    arr(d, "/spec/template/spec/containers")
        .iter()
        .find(|c| arr(c, "/command").first().and_then(Value::as_str) == Some("vllm"))
}

fn engine_deployments() -> Vec<&'static Value> {
    of_kind("Deployment").filter(|d| vllm_container(d).is_some()).collect()
}

/// The headless Service a pool's `discovery.dns` names, and the one engine
/// Deployment whose pods it selects.
fn pool_engines(p: &toml::Table) -> (&'static Value, &'static Value) {
    let name = pool_name(p);
    let dns = discovery_str(&discovery(p), "dns");
    // A short name resolves through the pod's search path in its own
    // namespace; a namespace in the file would tie it to one.
    assert!(
        !dns.contains('.') && !dns.contains(':'),
        "pool {name}: discovery.dns {dns:?} should be the Service's short name"
    );
    let svc = find("Service", &dns);
    assert_eq!(svc["spec"]["clusterIP"], "None", "pool {name}: Service {dns} is headless");
    assert_ne!(
        svc["spec"]["publishNotReadyAddresses"], true,
        "pool {name}: Service {dns} publishes engines before they are ready"
    );
    let selected = deployments_selected_by(&svc["spec"]["selector"]);
    assert_eq!(
        selected.len(),
        1,
        "pool {name}: Service {dns} must select exactly one Deployment's pods, selects {:?}",
        selected.iter().map(|d| s(d, "/metadata/name")).collect::<Vec<_>>()
    );
    let d = selected[0];
    assert!(
        vllm_container(d).is_some(),
        "pool {name}: Service {dns} selects {}, which runs no `vllm serve`",
        s(d, "/metadata/name")
    );
    (svc, d)
}

/// The names a `vllm serve` command line serves its base model under:
/// `--served-model-name` (one or more values), else the model (the
/// positional argument, or `--model`).
fn vllm_served_names(a: &[String]) -> Vec<String> {
    if let Some(i) = a.iter().position(|x| x.starts_with("--served-model-name")) {
        if let Some(v) = a[i].strip_prefix("--served-model-name=") {
            return vec![v.to_owned()];
        }
        return a[i + 1..].iter().take_while(|x| !x.starts_with("--")).cloned().collect();
    }
    if let Some(m) = flag(a, "--model") {
        return vec![m];
    }
    let first = a.first().expect("vllm serve MODEL");
    assert!(!first.starts_with('-'), "`vllm serve` takes the model first, not {first:?}");
    vec![first.clone()]
}

/// The adapter names of `--lora-modules` (`NAME=PATH` or JSON with `name`),
/// each value given as `--lora-modules=V` or after a bare `--lora-modules`.
fn vllm_lora_names(a: &[String]) -> BTreeSet<String> {
    let mut values = Vec::new();
    for (i, x) in a.iter().enumerate() {
        if let Some(v) = x.strip_prefix("--lora-modules=") {
            values.push(v.to_owned());
        } else if x == "--lora-modules" {
            values.extend(a[i + 1..].iter().take_while(|y| !y.starts_with("--")).cloned());
        }
    }
    values
        .iter()
        .map(|v| match serde_json::from_str::<Value>(v) {
            Ok(j) => s(&j, "/name").to_owned(),
            Err(_) => v.split_once('=').expect("--lora-modules NAME=PATH").0.to_owned(),
        })
        .collect()
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
    // Issue 23: two model pools, each with its own engine Deployment.
    let pools = pools();
    assert!(pools.len() >= 2, "kvgate serves two model pools, not {}", pools.len());
    let served: BTreeSet<String> = pools.iter().map(pool_served_name).collect();
    assert_eq!(served.len(), pools.len(), "each pool serves another model");
    assert!(engine_deployments().len() >= 2, "an engine Deployment per model");
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

/// `kvgate serve --config FILE --print-config` with nothing else around.
fn print_config(name: &str, text: &str) -> toml::Table {
    let dir = scratch(&format!("configmap-{name}"));
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
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
        "kvgate refuses the ConfigMap's {name}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    toml::from_str(&String::from_utf8(out.stdout).unwrap()).unwrap()
}

/// Every file of the ConfigMap passes kvgate's validation on its own; the
/// proxy's shows each pool as the file declares it.
#[test]
fn the_configmap_holds_valid_kvgate_configs() {
    let cm = find("ConfigMap", "kvgate-config");
    let files: Vec<&String> = cm["data"].as_object().expect("data").keys().collect();
    assert!(!files.is_empty());
    let (_, proxy) = kvgate_config_source();
    assert!(files.contains(&&proxy), "the ConfigMap holds {proxy}, the file kvgate reads");
    for f in files {
        let printed = print_config(f, &configmap_toml("kvgate-config", f));
        if *f != proxy {
            continue;
        }
        let shown = printed.get("pools").and_then(toml::Value::as_array).expect("pools");
        let declared = pools();
        assert_eq!(shown.len(), declared.len());
        for (s, d) in shown.iter().zip(&declared) {
            assert_eq!(s.get("name").and_then(toml::Value::as_str), Some(pool_name(d).as_str()));
            assert_eq!(
                s.get("model").and_then(|m| m.get("served_name")).and_then(toml::Value::as_str),
                Some(pool_served_name(d).as_str())
            );
            assert_eq!(
                s.get("discovery").and_then(|x| x.get("dns")).and_then(toml::Value::as_str),
                Some(discovery_str(&discovery(d), "dns").as_str())
            );
        }
    }
}

/// The ConfigMap's other files (deploy/gateway-api's picker reads
/// kvgate.toml, one model) keep the proxy's shared settings, and their one
/// model and discovery ports are one of the proxy's pools'.
#[test]
fn the_configmaps_other_files_agree_with_the_proxys() {
    let cm = find("ConfigMap", "kvgate-config");
    let (_, proxy_key) = kvgate_config_source();
    let proxy = kvgate_config();
    let pools = pools();
    for f in cm["data"].as_object().unwrap().keys().filter(|k| **k != proxy_key) {
        let other: toml::Table = toml::from_str(&configmap_toml("kvgate-config", f)).unwrap();
        for key in ["admin_listen", "replica_header", "router", "peers", "limits"] {
            assert_eq!(other.get(key), proxy.get(key), "{f} and {proxy_key} differ in {key}");
        }
        if other.contains_key("pools") {
            continue;
        }
        let model = table(&other, "model");
        let served = model.get("served_name").and_then(toml::Value::as_str).expect("served_name");
        let pool = pools
            .iter()
            .find(|p| pool_served_name(p) == served)
            .unwrap_or_else(|| panic!("{f} serves {served}, which no pool of {proxy_key} serves"));
        assert_eq!(model, table(pool, "model"), "{f}: [model] differs from the pool's");
        let mut d = discovery(pool);
        d.remove("dns");
        assert_eq!(table(&other, "discovery"), d, "{f}: [discovery] differs from the pool's");
    }
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
    let mut argv = Vec::new();
    let mut config_seen = false;
    for a in &args(c)[1..] {
        let mut a = expand(a, &env);
        if let Some(p) = a.strip_prefix("--config=") {
            let (cm, key) = config_source(deployment, c, p);
            let local = dir.join(&key);
            std::fs::write(&local, configmap_toml(&cm, &key)).unwrap();
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
    // The engines are the pools': each finds its own through the Service
    // the file names, and nothing is discovered outside a pool.
    assert_eq!(get("discovery.dns"), None, "no top-level discovery with [[pools]]");
    let shown = printed.get("pools").and_then(toml::Value::as_array).expect("pools");
    let dns: Vec<Option<&str>> = shown
        .iter()
        .map(|p| p.get("discovery").and_then(|d| d.get("dns")).and_then(toml::Value::as_str))
        .collect();
    let declared: Vec<String> =
        pools().iter().map(|p| discovery_str(&discovery(p), "dns")).collect();
    assert_eq!(dns, declared.iter().map(|d| Some(d.as_str())).collect::<Vec<_>>());
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
        let selected = deployments_selected_by(&svc["spec"]["selector"]);
        assert_eq!(
            selected.len(),
            1,
            "Service {name} must select one Deployment's pods, selects {:?}",
            selected.iter().map(|d| s(d, "/metadata/name")).collect::<Vec<_>>()
        );
        let deployment = selected[0];
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
    // With [[pools]] each pool names its engines' Service in the file.
    assert_eq!(flag(&a, "--discover-dns"), None, "--discover-dns cannot be used with [[pools]]");

    // No Deployment's selector takes another's pods (the engine Deployments
    // differ by `app.kubernetes.io/instance`).
    for d in of_kind("Deployment") {
        let taken = deployments_selected_by(&d["spec"]["selector"]["matchLabels"]);
        assert_eq!(
            taken.iter().map(|x| s(x, "/metadata/name")).collect::<Vec<_>>(),
            vec![s(d, "/metadata/name")],
            "Deployment selectors overlap"
        );
    }
}

/// Each pool finds its engines through a headless Service of its own that
/// selects one engine Deployment, and every engine Deployment is a pool's.
#[test]
fn every_pool_discovers_its_own_engine_deployment() {
    let mut claimed = BTreeMap::new();
    for p in pools() {
        let (svc, d) = pool_engines(&p);
        let deployment = s(d, "/metadata/name");
        if let Some(other) = claimed.insert(deployment.to_owned(), pool_name(&p)) {
            panic!("pools {other} and {} both discover Deployment {deployment}", pool_name(&p));
        }
        let dd = discovery(&p);
        let svc_ports: BTreeSet<i64> =
            arr(svc, "/spec/ports").iter().map(|x| x["port"].as_i64().unwrap()).collect();
        let want: BTreeSet<i64> = ["http_port", "events_port", "replay_port"]
            .iter()
            .map(|k| discovery_int(&dd, k))
            .collect();
        assert_eq!(
            svc_ports,
            want,
            "Service {} ports for pool {}",
            s(svc, "/metadata/name"),
            pool_name(&p)
        );
    }
    let engines: BTreeSet<String> =
        engine_deployments().iter().map(|d| s(d, "/metadata/name").to_owned()).collect();
    let discovered: BTreeSet<String> = claimed.into_keys().collect();
    assert_eq!(engines, discovered, "every engine Deployment is one pool's");
}

/// What each pool offers is what its engines serve: the base model under
/// the pool's served name, and every adapter the pool declares.
#[test]
fn every_pool_serves_the_model_its_engines_serve() {
    for p in pools() {
        let name = pool_name(&p);
        let (_, d) = pool_engines(&p);
        let a = args(vllm_container(d).unwrap());
        let served = vllm_served_names(&a);
        assert!(
            served.contains(&pool_served_name(&p)),
            "pool {name} serves {} but Deployment {} serves {served:?}",
            pool_served_name(&p),
            s(d, "/metadata/name")
        );
        let declared: BTreeSet<String> = table(&p, "model")
            .get("lora_adapters")
            .and_then(toml::Value::as_array)
            .map(|v| v.iter().map(|x| x.as_str().unwrap().to_owned()).collect())
            .unwrap_or_default();
        let loaded = vllm_lora_names(&a);
        assert!(
            declared.is_subset(&loaded),
            "pool {name} declares adapters {declared:?}; its engines load {loaded:?}"
        );
        if !loaded.is_empty() {
            assert!(a.iter().any(|x| x == "--enable-lora"), "--lora-modules needs --enable-lora");
            let max = flag(&a, "--max-loras").map_or(1, |m| m.parse::<usize>().unwrap());
            assert!(max >= 1);
        }
    }
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
    let pools = pools();
    let mut block_sizes = BTreeSet::new();
    for p in &pools {
        let name = pool_name(p);
        let d = discovery(p);
        let http = discovery_int(&d, "http_port");
        let events = discovery_int(&d, "events_port");
        let replay = discovery_int(&d, "replay_port");
        let topic = discovery_str(&d, "topic");
        let (_, deployment) = pool_engines(p);
        let c = vllm_container(deployment).unwrap();
        let a = args(c);
        let kv: Value =
            serde_json::from_str(&flag(&a, "--kv-events-config").expect("--kv-events-config"))
                .expect("--kv-events-config is JSON");
        assert_eq!(kv["enable_kv_cache_events"], true, "pool {name}");
        assert_eq!(kv["publisher"], "zmq", "pool {name}");
        // `*` makes vLLM bind; kvgate dials each pod's address on these ports.
        assert_eq!(kv["endpoint"], format!("tcp://*:{events}"), "pool {name}");
        assert!(replay > 0, "the example uses replay");
        assert_eq!(kv["replay_endpoint"], format!("tcp://*:{replay}"), "pool {name}");
        assert_eq!(kv["topic"], topic, "pool {name}");
        assert_eq!(flag(&a, "--port"), Some(http.to_string()), "pool {name}");
        let bs = discovery_int(&d, "block_size");
        assert_eq!(flag(&a, "--block-size"), Some(bs.to_string()), "pool {name}");
        block_sizes.insert(bs);
        assert!(a.iter().any(|x| x == "--enable-prefix-caching"), "pool {name}");
        assert!(c["resources"]["limits"]["nvidia.com/gpu"].as_u64().unwrap_or(0) >= 1);
        // The ports the Service targets are the container's.
        for (port, pname) in [(http, "http"), (events, "kv-events"), (replay, "kv-replay")] {
            assert_eq!(
                i64::from(container_port(c, &Value::String(pname.into()))),
                port,
                "pool {name}: container port {pname}"
            );
        }

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
    }
    assert_eq!(block_sizes.len(), 1, "kvgate's pools share one block size: {block_sizes:?}");
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
    for p in pools() {
        let d = discovery(&p);
        let (_, deployment) = pool_engines(&p);
        let engine = s(deployment, "/metadata/name");
        for key in ["events_port", "replay_port", "http_port"] {
            let port = discovery_int(&d, key) as u16;
            let who = admitted(pod_labels(engine), port).unwrap_or_else(|| {
                panic!("no NetworkPolicy selects the {engine} pods (port {port} open)")
            });
            assert!(only_kvgate(&who), "{engine}'s port {port} admits {who:?}");
        }
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
        "--enable-lora",
        "--lora-modules",
        "--max-loras",
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
