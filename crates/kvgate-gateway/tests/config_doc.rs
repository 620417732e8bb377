//! `docs/config.md` against the code it documents. Every key of
//! `GatewayConfig` (serialised from its `Default`) must have a row
//! `| `key` | default | meaning |` whose default is the `Default` value, every
//! key row must name a real key, every `[[replicas]]` key must be documented
//! under `replicas.*` and every `[[pools]]` key under `pools.*`, and every flag of `kvgate serve` (read from
//! `crates/kvgate/src/cli.rs` itself, not a copy) must appear with its
//! `KVGATE_*` variable.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;

use kvgate_gateway::config::TenantsSection;
use kvgate_gateway::{GatewayConfig, ReplicaConfig};

const DOC_PATH: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/config.md");
const CLI_PATH: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../kvgate/src/cli.rs");

fn doc() -> String {
    std::fs::read_to_string(DOC_PATH).unwrap_or_else(|e| panic!("reading {DOC_PATH}: {e}"))
}

/// The leaves of a TOML document as dotted keys. Arrays are leaves.
fn flatten(prefix: &str, table: &toml::Table, out: &mut BTreeMap<String, toml::Value>) {
    for (k, v) in table {
        let key = if prefix.is_empty() { k.clone() } else { format!("{prefix}.{k}") };
        match v {
            toml::Value::Table(t) => flatten(&key, t, out),
            other => {
                out.insert(key, other.clone());
            }
        }
    }
}

fn keys_of<T: serde::Serialize>(value: &T) -> BTreeMap<String, toml::Value> {
    let text = toml::to_string(value).expect("serialising to TOML");
    let table: toml::Table = toml::from_str(&text).expect("re-reading the serialised TOML");
    let mut out = BTreeMap::new();
    flatten("", &table, &mut out);
    out
}

/// `GatewayConfig` with every `Option` set, so that its serialisation names
/// every key. A new `Option` field that defaults to `None` must be set here
/// too, or its documented row is reported as not a real key.
fn everything_set() -> GatewayConfig {
    let mut c = GatewayConfig {
        admin_listen: Some("127.0.0.1:8001".parse().unwrap()),
        metrics_listen: Some("127.0.0.1:9100".parse().unwrap()),
        ..GatewayConfig::default()
    };
    c.model.dir = Some("/models/m".into());
    c.auth.admin_key = Some("admin-key-123".into());
    c.auth.affinity_key = Some("affinity-key-123".into());
    c.router.seed = Some(7);
    c.peers.dns = Some("kvgate-peers:9000".into());
    c.peers.listen = Some("0.0.0.0:9000".parse().unwrap());
    c.peers.key = Some("peer-key-0123456789".into());
    c.discovery.dns = Some("vllm-engines".into());
    c.discovery.api_key = Some("engine-key".into());
    c.epp.listen = Some("127.0.0.1:9002".parse().unwrap());
    c.tls.cert = Some("/tls/tls.crt".into());
    c.tls.key = Some("/tls/tls.key".into());
    c.tls.client_ca = Some("/tls/clients.crt".into());
    c.tls.ca = Some("/tls/ca.crt".into());
    c.tls.client_cert = Some("/tls/client.crt".into());
    c.tls.client_key = Some("/tls/client.key".into());
    c.peers.nats.url = Some("nats://nats:4222".into());
    c.peers.nats.token = Some("nats-token".into());
    c.peers.nats.user = Some("kvgate".into());
    c.peers.nats.password = Some("nats-password".into());
    c.peers.nats.nkey_seed_file = Some("/nats/user.nk".into());
    c.peers.nats.ca = Some("/nats/ca.crt".into());
    c.peers.nats.client_cert = Some("/nats/client.crt".into());
    c.peers.nats.client_key = Some("/nats/client.key".into());
    let mut tenants = TenantsSection::default();
    tenants.queue.default_band = Some("interactive".into());
    c.tenants = Some(tenants);
    c
}

/// The defaults documented: a section that is off unless present
/// (`[tenants]`) is documented with the defaults it has when present.
fn documented_defaults() -> GatewayConfig {
    GatewayConfig { tenants: Some(TenantsSection::default()), ..GatewayConfig::default() }
}

/// A `[[replicas]]` entry with every `Option` set.
fn replica_everything_set() -> ReplicaConfig {
    ReplicaConfig {
        name: Some("a".into()),
        events: Some("tcp://h:5557".into()),
        replay: Some("tcp://h:5558".into()),
        api_key: Some("engine-key-1".into()),
        dp_rank: Some(1),
        pool: Some("p".into()),
        ..ReplicaConfig::new("http://x")
    }
}

/// One row of a `| Key | Default | Meaning |` table.
#[derive(Debug)]
struct KeyRow {
    key: String,
    default: String,
    line: usize,
}

fn cells(line: &str) -> Vec<String> {
    let t = line.trim();
    let t = t.strip_prefix('|').unwrap_or(t);
    let t = t.strip_suffix('|').unwrap_or(t);
    t.split('|').map(|c| c.trim().to_owned()).collect()
}

/// The rows of every table whose header is `| Key | Default | Meaning |`.
fn key_rows(doc: &str) -> Vec<KeyRow> {
    let mut rows = Vec::new();
    let mut in_table = false;
    let mut in_key_table = false;
    for (i, line) in doc.lines().enumerate() {
        let t = line.trim();
        if !t.starts_with('|') {
            in_table = false;
            continue;
        }
        let c = cells(t);
        if !in_table {
            in_table = true;
            in_key_table = c.len() == 3 && c[0] == "Key" && c[1] == "Default";
            continue;
        }
        if !in_key_table || c.iter().all(|x| x.chars().all(|ch| matches!(ch, '-' | ':' | ' '))) {
            continue;
        }
        assert_eq!(c.len(), 3, "docs/config.md:{}: a key row has 3 cells: {t}", i + 1);
        let key = c[0].strip_prefix('`').and_then(|k| k.strip_suffix('`')).unwrap_or_else(|| {
            panic!("docs/config.md:{}: the key cell is written `key`: {t}", i + 1)
        });
        rows.push(KeyRow { key: key.to_owned(), default: c[1].clone(), line: i + 1 });
    }
    rows
}

/// The documented default as a TOML value; `None` for `unset`.
fn parse_default(row: &KeyRow) -> Option<toml::Value> {
    let cell = row.default.trim_matches('`');
    if cell == "unset" {
        return None;
    }
    let mut t: toml::Table = toml::from_str(&format!("v = {cell}")).unwrap_or_else(|e| {
        panic!(
            "docs/config.md:{}: default of `{}` is not a TOML value: {:?} ({e})",
            row.line, row.key, row.default
        )
    });
    t.remove("v")
}

/// Equality with integers and floats compared as numbers (`16000` = `16000.0`).
fn same(a: &toml::Value, b: &toml::Value) -> bool {
    use toml::Value::{Array, Float, Integer, Table};
    match (a, b) {
        (Integer(x), Float(y)) | (Float(y), Integer(x)) => (*x as f64) == *y,
        (Array(x), Array(y)) => x.len() == y.len() && x.iter().zip(y).all(|(p, q)| same(p, q)),
        (Table(x), Table(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| same(v, w)))
        }
        _ => a == b,
    }
}

fn rows_by_key(rows: &[KeyRow]) -> BTreeMap<&str, &KeyRow> {
    let mut by_key = BTreeMap::new();
    for r in rows {
        if let Some(prev) = by_key.insert(r.key.as_str(), r) {
            panic!(
                "docs/config.md: `{}` is documented twice (lines {} and {})",
                r.key, prev.line, r.line
            );
        }
    }
    by_key
}

#[test]
fn every_key_is_documented_with_its_default() {
    let doc = doc();
    let rows = key_rows(&doc);
    let by_key = rows_by_key(&rows);
    let defaults = keys_of(&documented_defaults());
    let all = keys_of(&everything_set());
    assert!(all.len() > 60, "expected the whole config, got {} keys", all.len());
    assert!(defaults.keys().all(|k| all.contains_key(k)));

    let mut problems = Vec::new();
    for key in all.keys() {
        let Some(row) = by_key.get(key.as_str()) else {
            problems.push(format!("`{key}` has no row `| `{key}` | default | meaning |`"));
            continue;
        };
        match (defaults.get(key), parse_default(row)) {
            (Some(want), Some(got)) if same(want, &got) => {}
            (None, None) => {}
            (want, _) => problems.push(format!(
                "docs/config.md:{}: `{key}` documents default {:?}, the code has {}",
                row.line,
                row.default,
                want.map_or_else(|| "unset".to_owned(), ToString::to_string)
            )),
        }
    }
    for row in &rows {
        let nested = row.key.starts_with("replicas.") || row.key.starts_with("pools.");
        if !nested && !all.contains_key(&row.key) {
            problems.push(format!(
                "docs/config.md:{}: `{}` is not a key of GatewayConfig",
                row.line, row.key
            ));
        }
    }
    assert!(problems.is_empty(), "docs/config.md is out of step:\n{}", problems.join("\n"));
}

#[test]
fn every_replica_key_is_documented_and_is_a_replica_spec_key() {
    let doc = doc();
    let rows = key_rows(&doc);
    let by_key = rows_by_key(&rows);
    let all = keys_of(&replica_everything_set());
    // The defaults a `[[replicas]]` table with only a URL gets.
    let from_file: ReplicaConfig = toml::from_str("url = \"http://x\"").unwrap();
    assert_eq!(from_file, ReplicaConfig::new("http://x"));
    let defaults = keys_of(&from_file);

    let mut problems = Vec::new();
    for (key, value) in &all {
        let doc_key = format!("replicas.{key}");
        let Some(row) = by_key.get(doc_key.as_str()) else {
            problems.push(format!("`{doc_key}` has no row"));
            continue;
        };
        let ok = if key == "url" {
            row.default == "required"
        } else {
            match (defaults.get(key), parse_default(row)) {
                (Some(want), Some(got)) => same(want, &got),
                (None, None) => true,
                _ => false,
            }
        };
        if !ok {
            problems.push(format!(
                "docs/config.md:{}: `{doc_key}` documents default {:?}, the code has {}",
                row.line,
                row.default,
                defaults.get(key).map_or_else(|| "unset".to_owned(), ToString::to_string)
            ));
        }
        // The doc says every replica key but the URL also works in `--replica`.
        if key != "url" {
            let v = match value {
                toml::Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            if let Err(e) = ReplicaConfig::parse_spec(&format!("http://x,{key}={v}")) {
                problems.push(format!("`{key}` is documented as a --replica key but: {e}"));
            }
        }
    }
    for row in rows.iter().filter(|r| r.key.starts_with("replicas.")) {
        if !all.contains_key(&row.key["replicas.".len()..]) {
            problems.push(format!(
                "docs/config.md:{}: `{}` is not a key of ReplicaConfig",
                row.line, row.key
            ));
        }
    }
    assert!(problems.is_empty(), "docs/config.md is out of step:\n{}", problems.join("\n"));
}

#[test]
fn every_pool_key_is_documented() {
    let doc = doc();
    let rows = key_rows(&doc);
    let by_key = rows_by_key(&rows);
    let pool = kvgate_gateway::config::PoolConfig::default();
    let text = toml::to_string(&pool).expect("serialising a pool");
    let table: toml::Table = toml::from_str(&text).expect("re-reading it");
    let mut problems = Vec::new();
    // A pool's own keys; `model`, `discovery` and `router` take the keys of
    // the top-level tables of those names, documented there.
    let mut keys: Vec<&String> = table.keys().collect();
    let replicas = "replicas".to_owned();
    keys.push(&replicas); // an empty array is not serialised
    for key in keys {
        if !by_key.contains_key(format!("pools.{key}").as_str()) {
            problems.push(format!("`pools.{key}` has no row"));
        }
    }
    for row in rows.iter().filter(|r| r.key.starts_with("pools.")) {
        let key = &row.key["pools.".len()..];
        if !table.contains_key(key) && key != "replicas" {
            problems.push(format!("docs/config.md:{}: `{}` is not a pool key", row.line, row.key));
        }
    }
    let name = by_key.get("pools.name").map(|r| r.default.as_str());
    if name != Some("\"\"") {
        problems.push(format!("`pools.name` documents default {name:?}, the code has \"\""));
    }
    assert!(problems.is_empty(), "docs/config.md is out of step:\n{}", problems.join("\n"));
}

/// The text after `prefix` up to the next `"`.
fn quoted_after(text: &str, prefix: &str) -> Option<String> {
    let at = text.find(prefix)? + prefix.len();
    text[at..].split('"').next().map(str::to_owned)
}

/// The field name of a struct-field line (`pub(crate) name: Type,`).
fn field_name(line: &str) -> Option<&str> {
    let t = line.strip_prefix("pub(crate) ").or_else(|| line.strip_prefix("pub ")).unwrap_or(line);
    let end = t.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))?;
    let rest = &t[end..];
    (end > 0 && rest.starts_with(':') && !rest.starts_with("::")).then(|| &t[..end])
}

/// `(--flag, env var)` for every long flag of `serve` (its own `ServeArgs`
/// and the `GatewayArgs` it shares with `epp`), read from cli.rs.
fn serve_flags(cli: &str) -> Vec<(String, Option<String>)> {
    let mut flags = struct_flags(cli, "ServeArgs");
    flags.extend(struct_flags(cli, "GatewayArgs"));
    flags
}

/// `(--flag, env var)` for every long flag of the args struct `name`.
fn struct_flags(cli: &str, name: &str) -> Vec<(String, Option<String>)> {
    let head = format!("struct {name} {{");
    let start = cli.find(&head).unwrap_or_else(|| panic!("cli.rs has `{head}`"));
    let body = &cli[start..];
    let body = &body[..body.find("\n}").expect("the end of the struct")];
    let mut flags = Vec::new();
    let mut attrs = String::new();
    for line in body.lines().skip(1) {
        let t = line.trim();
        if t.starts_with("//") {
            continue;
        }
        match field_name(t) {
            Some(field) => {
                let is_long = attrs
                    .split(|c: char| !c.is_ascii_alphanumeric() && c != '_')
                    .any(|w| w == "long");
                if is_long {
                    let long = quoted_after(&attrs, "long = \"")
                        .unwrap_or_else(|| field.replace('_', "-"));
                    flags.push((format!("--{long}"), quoted_after(&attrs, "env = \"")));
                }
                attrs.clear();
            }
            None => {
                attrs.push_str(t);
                attrs.push(' ');
            }
        }
    }
    flags
}

/// Whether `doc` mentions `word` as a whole word (`--replica` is not found in
/// `--replicas`).
fn mentions(doc: &str, word: &str) -> bool {
    doc.match_indices(word).any(|(at, _)| {
        let before = doc[..at].chars().next_back();
        let after = doc[at + word.len()..].chars().next();
        let part =
            |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        !part(before) && !part(after)
    })
}

#[test]
fn every_serve_flag_and_env_var_is_documented() {
    let cli =
        std::fs::read_to_string(CLI_PATH).unwrap_or_else(|e| panic!("reading {CLI_PATH}: {e}"));
    let flags = serve_flags(&cli);
    assert!(flags.len() >= 10, "found too few ServeArgs flags in cli.rs: {flags:?}");
    assert!(flags.iter().any(|(f, e)| f == "--api-key" && e.as_deref() == Some("KVGATE_API_KEYS")));
    assert!(flags.iter().any(|(f, _)| f == "--replica"));
    let doc = doc();
    let mut problems = Vec::new();
    for (flag, env) in &flags {
        if !mentions(&doc, flag) {
            problems.push(format!("{flag} is not mentioned"));
        }
        // Its row in the flags table names its environment variable.
        let row = doc.lines().find(|l| {
            l.trim()
                .strip_prefix("| `")
                .and_then(|r| r.strip_prefix(flag.as_str()))
                .is_some_and(|r| r.starts_with(' ') || r.starts_with('`'))
        });
        match (row, env) {
            (None, _) => problems.push(format!("{flag} has no row in the flags table")),
            (Some(row), Some(env)) if !row.contains(&format!("`{env}`")) => {
                problems.push(format!("the row of {flag} does not name `{env}`: {row}"))
            }
            _ => {}
        }
    }
    // `kvgate epp`'s own flags and variables are described below the table.
    let epp = struct_flags(&cli, "EppArgs");
    assert_eq!(epp.len(), 2, "{epp:?}");
    for (flag, env) in &epp {
        let env = env.as_deref().unwrap_or_else(|| panic!("{flag} of EppArgs reads no variable"));
        if !mentions(&doc, flag) || !mentions(&doc, env) {
            problems.push(format!("kvgate epp's {flag} ({env}) is not documented"));
        }
    }
    assert!(
        problems.is_empty(),
        "docs/config.md is out of step with cli.rs:\n{}",
        problems.join("\n")
    );
}

#[test]
fn the_example_files_are_valid_configs() {
    let doc = doc();
    let mut blocks = Vec::new();
    let mut current: Option<String> = None;
    for line in doc.lines() {
        match (&mut current, line.trim()) {
            (None, "```toml") => current = Some(String::new()),
            (Some(text), "```") => {
                blocks.push(std::mem::take(text));
                current = None;
            }
            (Some(text), _) => {
                text.push_str(line);
                text.push('\n');
            }
            (None, _) => {}
        }
    }
    assert!(!blocks.is_empty(), "docs/config.md has no ```toml example");
    for text in &blocks {
        let c = GatewayConfig::from_toml_with_overrides(text, &[])
            .unwrap_or_else(|e| panic!("an example in docs/config.md does not parse: {e}\n{text}"));
        c.validate()
            .unwrap_or_else(|e| panic!("an example in docs/config.md is invalid: {e}\n{text}"));
    }
}
