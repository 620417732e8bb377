//! The gateway's "one owner of fleet state" invariant (ARCHITECTURE.md),
//! checked on its sources: fleet state changes only inside the fleet core
//! (`kvgate-fleet`), only the fleet's shell takes its lock (every other file,
//! the request path included, sees only the handle's named methods), a
//! replica's failure is reported from three places, both doors share one
//! placement path and one watcher of answers, and the replica directory is
//! read without a lock.

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

/// The files that may take the fleet's lock (`fleet.with(..)`): the handle
/// itself and the replicas' and observers' shell around the core. Every
/// other file, the whole request path (`request/`, the endpoint picker)
/// included, calls the handle's named methods (`route`, `finish`,
/// `failed`, `adapter_pool`...), each one short hold of the lock.
const FLEET_SHELL: [&str; 11] = [
    // The handle: its named methods.
    "replicas/fleet_handle.rs",
    // KV events into the index; a dead feed's view cleared.
    "replicas/feed.rs",
    "replicas/supervise.rs",
    // Replicas added, drained, removed; probes and scrapes; the clock.
    "replicas/registry.rs",
    "replicas/monitor.rs",
    "replicas/upkeep.rs",
    // What metrics, admin and the dashboard read.
    "replicas/fleet_view.rs",
    "observe/decision_json.rs",
    "doors/admin.rs",
    // Ledger changes to and from peers (the mesh, and what it shares with
    // the NATS bus: applying a batch, releasing a silent peer).
    "doors/peers.rs",
    "doors/peer_wire.rs",
];

/// The files that may report a replica's failure (`fleet.failed(..)`),
/// once each: the retry loop (`forward::report`, which the endpoint
/// picker's response side calls too), the stream watcher, the health
/// monitor.
const FAILURE_REPORTERS: [&str; 3] =
    ["request/forward.rs", "request/relay.rs", "replicas/monitor.rs"];

/// The one request path behind both doors: only `placement.rs` asks the
/// fleet for a decision (the proxy's placements and retries, the endpoint
/// picker's placements and its gateway's fallbacks), only
/// `stream_watch.rs` looks for a streamed answer's first token, and only
/// `booking.rs` presumes a whole answer's.
const ONE_PATH: [(&str, &[&str]); 4] = [
    ("fleet.route(", &["request/placement.rs"]),
    ("fleet.plan(", &["request/placement.rs"]),
    ("is_output_event(", &["request/stream_watch.rs"]),
    ("first_token_unmeasured(", &["request/booking.rs", "replicas/fleet_handle.rs"]),
];

/// A file's code without `//` comments, without its inline `#[cfg(test)]`
/// module, and with all whitespace removed, so that a call split over lines
/// (`self.fleet\n    .with(`) reads as one.
fn squeezed(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    // An inline test module: `#[cfg(test)]`, then `mod NAME {`.
    let tests = (0..lines.len()).find(|&i| {
        lines[i].starts_with("#[cfg(test)]")
            && lines.get(i + 1).is_some_and(|l| l.starts_with("mod ") && l.ends_with('{'))
    });
    let code = lines[..tests.unwrap_or(lines.len())].iter();
    code.map(|l| l.split("//").next().unwrap_or(""))
        .flat_map(str::chars)
        .filter(|c| !c.is_whitespace())
        .collect()
}

/// Test files (the tests may look inside the fleet).
fn is_test(file: &str) -> bool {
    file.ends_with("tests.rs") || file.contains("/tests/") || file.ends_with("engine_fake.rs")
}

/// Where `files` call `call` (whitespace-free, e.g. `fleet.with(`) outside
/// `allowed`, or more than `max` times in one allowed file: one line per
/// violation.
fn calls_outside(
    files: &[(String, String)],
    call: &str,
    allowed: &[&str],
    max: usize,
) -> Vec<String> {
    let mut found = Vec::new();
    for (file, text) in files {
        if is_test(file) {
            continue;
        }
        let n = squeezed(text).matches(call).count();
        if n > 0 && !allowed.contains(&file.as_str()) {
            found.push(format!("{file}: {n} × `{call}..)`"));
        } else if n > max {
            found.push(format!("{file}: {n} × `{call}..)`, at most {max}"));
        }
    }
    found
}

/// Fleet accesses outside the fleet's shell, and failure reports outside
/// the three reporters.
fn fleet_violations(files: &[(String, String)]) -> Vec<String> {
    let mut found = calls_outside(files, "fleet.with(", &FLEET_SHELL, usize::MAX);
    found.extend(calls_outside(files, "fleet.failed(", &FAILURE_REPORTERS, 1));
    for (call, allowed) in ONE_PATH {
        found.extend(calls_outside(files, call, allowed, usize::MAX));
    }
    found.extend(calls_outside(files, "StreamTap::new(", &["request/stream_watch.rs"], 1));
    for (file, text) in files {
        let request_path = file.starts_with("request/") || file.starts_with("doors/epp");
        if request_path && !is_test(file) && !uses(text, "Fleet;").is_empty() {
            found.push(format!("{file}: imports the fleet core"));
        }
    }
    found
}

#[test]
fn only_the_shell_takes_the_fleet_lock_and_three_places_report_failures() {
    let all = sources();
    for file in FLEET_SHELL.iter().chain(&FAILURE_REPORTERS) {
        let text = all.iter().find(|(f, _)| f == file).map(|(_, t)| t);
        assert!(text.is_some(), "{file} is gone: update this check");
    }
    // The checks see the real calls, so they cannot pass on nothing.
    let sees =
        |file: &str, call: &str| all.iter().any(|(f, t)| f == file && squeezed(t).contains(call));
    assert!(sees("replicas/registry.rs", "fleet.with("), "the lock check finds no lock");
    assert!(sees("request/forward.rs", "fleet.failed("), "the report check finds no report");
    assert!(sees("request/placement.rs", "fleet.route("), "the placement check finds no decision");
    assert!(
        sees("request/stream_watch.rs", "is_output_event("),
        "the watcher check finds no watcher"
    );
    let found = fleet_violations(&all);
    assert!(found.is_empty(), "the fleet reached outside its owners:\n{}", found.join("\n"));
}

#[test]
fn a_planted_fleet_access_or_failure_report_fails_the_check() {
    let file = |name: &str, text: &str| (name.to_owned(), text.to_owned());
    let clean = [
        file("request/forward.rs", "fn report() { fleet.failed(id, e, f, now); }"),
        file("request/placement.rs", "let p = self.fleet.adapter_pool(a); // fleet.with(|f| ..)"),
        file("replicas/feed.rs", "fleet.with(|f| f.apply_events(id, &b, now));"),
        file("request/forward/tests.rs", "api.fleet.with(|f| f.status(id)); fleet.failed(a, b, c, d);"),
        file(
            "request/relay.rs",
            "fn end() {}\n#[cfg(test)]\nmod tests {\n    fn t() { fleet.with(|f| f.tick(now)); }\n}",
        ),
    ];
    assert_eq!(fleet_violations(&clean), Vec::<String>::new());
    let planted = [
        // The request path reaching into the lock, over two lines.
        file("request/placement.rs", "let x = self\n    .fleet\n    .with(|f| f.adapter_pool(a));"),
        // A second reporter, and a second report in an allowed file.
        file("request/pd_forward.rs", "fwd.fleet.failed(id, why, Failure::Error, clock::now());"),
        file("request/forward.rs", "fleet.failed(a, b, c, d); fleet.failed(a, b, c, d);"),
        // A door deciding, watching or presuming on its own.
        file("doors/epp/wire.rs", "match ctx.fleet\n    .route(pool, &req, now) {"),
        file("request/relay.rs", "output |= anthropic::is_output_event(item);"),
        file("request/forward.rs", "booking.first_token_unmeasured(clock::now());"),
        file("request/response.rs", "let tap = StreamTap::new();"),
        file("doors/epp/exchange.rs", "use kvgate_fleet::Fleet;"),
    ];
    let found = fleet_violations(&planted);
    assert_eq!(found.len(), planted.len(), "{found:#?}");
    for ((name, _), line) in planted.iter().zip(&found) {
        assert!(line.starts_with(name.as_str()), "{line}");
    }
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
