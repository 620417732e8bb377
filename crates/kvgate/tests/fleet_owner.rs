//! The gateway's "one owner of fleet state" invariant (ARCHITECTURE.md),
//! checked on its sources: fleet state changes only inside the fleet core
//! (`kvgate-fleet`), the request path sees only the handle's named methods, and
//! the replica directory is read without a lock.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};

fn gateway_src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../kvgate-gateway/src")
}

/// Every `.rs` file under the gateway's `src/`, as (path relative to `src/`, text).
fn sources() -> Vec<(String, String)> {
    fn walk(dir: &Path, root: &Path, out: &mut Vec<(String, String)>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(&p, root, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                let rel = p.strip_prefix(root).unwrap().to_string_lossy().replace('\\', "/");
                out.push((rel, std::fs::read_to_string(&p).unwrap()));
            }
        }
    }
    let root = gateway_src();
    let mut out = Vec::new();
    walk(&root, &root, &mut out);
    assert!(out.len() > 20, "found only {} files under {}", out.len(), root.display());
    out
}

/// Lines of `text` that contain `needle` outside `//` comments.
fn uses(text: &str, needle: &str) -> Vec<String> {
    text.lines()
        .filter(|l| l.split("//").next().is_some_and(|code| code.contains(needle)))
        .map(|l| l.trim().to_owned())
        .collect()
}

#[test]
fn only_the_fleet_core_changes_replica_health() {
    // The core is its own crate (`kvgate-fleet`): no gateway file may change
    // what it owns.
    let mut found = Vec::new();
    for (file, text) in sources() {
        for field in [".probe_ok =", ".degraded =", ".draining =", ".purged ="] {
            for line in uses(&text, field) {
                found.push(format!("{file}: {line}"));
            }
        }
        for call in ["set_health(", "begin_clear(", "apply_batch(", ".decide("] {
            for line in uses(&text, call) {
                found.push(format!("{file}: {line}"));
            }
        }
    }
    assert!(found.is_empty(), "fleet state changed outside kvgate-fleet:\n{}", found.join("\n"));
}

#[test]
fn the_request_path_sees_handles_never_the_fleet() {
    let path =
        ["request/prepare.rs", "request/forward.rs", "request/relay.rs", "request/booking.rs"];
    let mut seen = 0;
    for (file, text) in sources() {
        if !path.contains(&file.as_str()) {
            continue;
        }
        seen += 1;
        let direct = uses(&text, "fleet.with(");
        assert!(direct.is_empty(), "{file} reaches into the fleet: {direct:?}");
        assert!(uses(&text, "Fleet;").is_empty(), "{file} imports the fleet core");
    }
    assert_eq!(seen, path.len(), "the request path's files moved: {path:?}");
}

#[test]
fn no_gateway_state_sits_behind_a_read_write_lock() {
    for (file, text) in sources() {
        let locks = uses(&text, "RwLock");
        assert!(locks.is_empty(), "{file}: {locks:?} (the replica directory is an ArcSwap)");
    }
}

/// The type that holds every handle of the gateway, and the wiring files
/// that alone may name it: every other module gets a context with only the
/// handles it uses (`ApiContext`, `Forwarder`, `AdminContext`, `Registry`...).
const WHOLE_STATE: &str = "Shared";
const WIRING: [&str; 2] = ["doors/server.rs", "state.rs"];

/// Whether `code` names `ident` as a whole word (not `shared`, not
/// `SharedFoo`).
fn names(code: &str, ident: &str) -> bool {
    let word = |c: char| c.is_alphanumeric() || c == '_';
    code.match_indices(ident).any(|(at, _)| {
        let before = code[..at].chars().next_back();
        let after = code[at + ident.len()..].chars().next();
        !before.is_some_and(word) && !after.is_some_and(word)
    })
}

#[test]
fn only_the_wiring_names_the_whole_state() {
    let all = sources();
    // Renaming the type must not turn this check into one that passes on
    // nothing.
    let definition = format!("struct {WHOLE_STATE} {{");
    let defined = all.iter().any(|(file, text)| file == "state.rs" && text.contains(&definition));
    assert!(defined, "state.rs no longer defines `{WHOLE_STATE}`: update this check");
    let mut found = Vec::new();
    for (file, text) in &all {
        if WIRING.contains(&file.as_str()) {
            continue;
        }
        for (n, line) in text.lines().enumerate() {
            if line.split("//").next().is_some_and(|code| names(code, WHOLE_STATE)) {
                found.push(format!("{file}:{}: {}", n + 1, line.trim()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "`{WHOLE_STATE}` named outside the wiring ({}); give the module a context with \
         only the handles it uses:\n{}",
        WIRING.join(", "),
        found.join("\n")
    );
}

#[test]
fn the_whole_state_check_matches_whole_words_only() {
    assert!(names("use crate::state::Shared;", "Shared"));
    assert!(names("fn f(s: &Arc<Shared>) {", "Shared"));
    assert!(!names("let shared = x;", "Shared"));
    assert!(!names("struct SharedState;", "Shared"));
    assert!(!names("UnShared", "Shared"));
}

/// Every duration in the configuration is converted once, in `settings.rs`:
/// no other gateway file builds a `Duration` from a config field (a
/// `config` path, or a field named `*_ms` or `*_s`).
#[test]
fn config_durations_are_converted_only_in_settings() {
    let mut found = Vec::new();
    for (file, text) in sources() {
        if file == "config/settings.rs" || file.ends_with("tests.rs") || file.contains("/tests/") {
            continue;
        }
        let code: String =
            text.lines().map(|l| l.split("//").next().unwrap_or("")).collect::<Vec<_>>().join("\n");
        for ctor in ["Duration::from_millis(", "Duration::from_secs("] {
            for (at, _) in code.match_indices(ctor) {
                // The argument: up to the parenthesis that closes the call.
                let mut depth = 1;
                let arg: String = code[at + ctor.len()..]
                    .chars()
                    .take_while(|&c| {
                        depth += match c {
                            '(' => 1,
                            ')' => -1,
                            _ => 0,
                        };
                        depth > 0
                    })
                    .collect();
                let raw = arg.contains("config")
                    || arg
                        .split(|c: char| !(c.is_alphanumeric() || c == '_'))
                        .any(|w| w.ends_with("_ms") || (w.ends_with("_s") && w.len() > 2));
                if raw {
                    let line = code[..at].matches('\n').count() + 1;
                    found.push(format!("{file}:{line}: {ctor}{}", arg.trim()));
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "config durations converted outside settings.rs:\n{}",
        found.join("\n")
    );
}
