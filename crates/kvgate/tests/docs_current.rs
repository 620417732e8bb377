//! The docs describe the present (README.md, ARCHITECTURE.md, `docs/*.md`):
//! no diary markers, and a quickstart whose commands are ones the project
//! runs. History belongs in CHANGELOG.md and `git log`.
//!
//! Diary markers, and the rule for each (case-insensitive words):
//! - a numbered run: `Run 20`, `run #3`, `Runs 19 and 20` (`run` then a
//!   number that does not start a date; `runs` then a number followed by
//!   `, `, `and`, `to` or a dash and another number, so that "each rate runs
//!   20 s" and "CI runs 200,000" are not);
//! - a numbered work period: `session 46`, `sessions 32 and 38`, `stop 44`;
//! - an issue number: `issue 18`, `issues 3, 5`;
//! - a commit hash: a word of 7 to 40 hexadecimal digits with at least one
//!   digit and one letter (`a`–`f`). Not flagged: text inside links
//!   (`http://`, `https://`: an upstream file at a pinned commit is a
//!   reference, not a diary entry), words joined to others by `-`, `_`, `.`,
//!   `:`, `/`, `@`, `#`, `+` or `=` (identifiers, keys such as
//!   `admin-key-7c1e0b5a`, float exponents such as `4.209989e-7`), and
//!   longer runs of hex (a sha256 digest is 64 digits). A `.` or `:` after
//!   the word joins only when a letter or digit follows it: `at cba13aa.`
//!   ends a sentence.
//!
//! The quickstart (`docs/quickstart.md`) is held to what the project runs:
//! its `kvgate` commands parse (`crates/kvgate/src/cli/tests.rs` checks every
//! doc's) and, for `serve` and `epp`, pass `--print-config`; every
//! `scripts/real-vllm.sh` subcommand it quotes is one the script has; every
//! `kubectl apply` names manifests that exist and parse as YAML, as does
//! every `deploy/` path it quotes in backticks; every
//! `--kv-events-config` it gives an engine is JSON that turns events on.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "support/shell.rs"]
mod shell;

use std::collections::BTreeSet;
use std::process::Command;

fn read(rel: &str) -> String {
    std::fs::read_to_string(shell::repo_root().join(rel))
        .unwrap_or_else(|e| panic!("cannot read {rel}: {e}"))
}

/// `text` with every `http://` and `https://` link blanked out.
fn without_links(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(p) = rest.find("http://").into_iter().chain(rest.find("https://")).min() {
        out.push_str(&rest[..p]);
        let end = rest[p..]
            .find(|c: char| c.is_whitespace() || matches!(c, ')' | '>' | '`' | '"' | '\'' | ']'))
            .map_or(rest.len(), |e| p + e);
        out.push_str(&" ".repeat(rest[p..end].chars().count()));
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

/// Characters that join a word to its neighbours (an identifier, a key, a
/// path, a number's exponent).
fn joins(c: char) -> bool {
    c.is_alphanumeric() || "-_.:/@#+=".contains(c)
}

/// The words of a line: (start, end) byte offsets.
fn words(line: &str) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut start = None;
    for (i, c) in line.char_indices() {
        match (c.is_alphanumeric(), start) {
            (true, None) => start = Some(i),
            (false, Some(s)) => {
                out.push((s, i));
                start = None;
            }
            _ => {}
        }
    }
    if let Some(s) = start {
        out.push((s, line.len()));
    }
    out
}

fn is_number(w: &str) -> bool {
    !w.is_empty() && w.chars().all(|c| c.is_ascii_digit())
}

/// The diary markers of one line: a description of each.
fn markers(line: &str) -> Vec<String> {
    let line = without_links(line);
    let ws = words(&line);
    let word = |i: usize| ws.get(i).map_or("", |&(s, e)| &line[s..e]);
    // What lies between word i and word i + 1.
    let gap = |i: usize| match (ws.get(i), ws.get(i + 1)) {
        (Some(&(_, e)), Some(&(s, _))) => &line[e..s],
        _ => "",
    };
    let mut out = Vec::new();
    for (i, &(s, e)) in ws.iter().enumerate() {
        let w = &line[s..e];
        // `Run 20`, `run #3`: a number right after, a `#` allowed.
        // A date after the word (`run 2026-12-04`) is not a number.
        let date = gap(i + 1) == "-" && is_number(word(i + 2));
        let numbered = is_number(word(i + 1)) && matches!(gap(i), " " | " #") && !date;
        let marker = || format!("\"{w} {}\"", word(i + 1));
        match w.to_lowercase().as_str() {
            "run" | "session" | "sessions" | "stop" | "issue" | "issues" if numbered => {
                out.push(marker());
            }
            "runs" if numbered => {
                // Only a list of runs: `Runs 19 and 20`, `runs 3, 4`, `runs 5–7`.
                // (`runs 200,000` is one number: a comma without a space.)
                let list = (matches!(gap(i + 1), ", " | "–" | "-") && is_number(word(i + 2)))
                    || (gap(i + 1) == " "
                        && matches!(word(i + 2), "and" | "to")
                        && is_number(word(i + 3)));
                if list {
                    out.push(marker());
                }
            }
            _ => {}
        }
        let before = line[..s].chars().next_back();
        let mut rest = line[e..].chars();
        let joined_after = match rest.next() {
            // Punctuation that may end a sentence joins only a word after it.
            Some('.' | ':') => rest.next().is_some_and(char::is_alphanumeric),
            after => after.is_some_and(joins),
        };
        let hex = (7..=40).contains(&w.len())
            && w.chars().all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c))
            && w.chars().any(|c| c.is_ascii_digit())
            && w.chars().any(|c| c.is_ascii_alphabetic());
        if hex && !before.is_some_and(joins) && !joined_after {
            out.push(format!("commit-like hash `{w}`"));
        }
    }
    out
}

/// Every diary marker of the docs, as `path:line: marker`.
fn diary_markers_in(files: &[(String, String)]) -> Vec<String> {
    let mut out = Vec::new();
    for (path, text) in files {
        for (i, line) in text.lines().enumerate() {
            for m in markers(line) {
                out.push(format!("{path}:{}: {m}: {}", i + 1, line.trim()));
            }
        }
    }
    out
}

#[test]
fn the_docs_hold_no_diary_markers() {
    let files: Vec<(String, String)> =
        shell::doc_files().into_iter().map(|f| (f.clone(), read(&f))).collect();
    let found = diary_markers_in(&files);
    assert!(
        found.is_empty(),
        "the docs describe the present; history goes to CHANGELOG.md:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_diary_rule_flags_what_it_should_and_nothing_else() {
    let flagged = [
        "### Run 20: the knee cell",
        "as in run #3",
        "Runs 19 and 20 agree",
        "runs 5–7",
        "measured in session 46",
        "Sessions 32 and 38 tried it",
        "stop 44 did this",
        "issue 18's suite",
        "binary of 772b6fc (main)",
        "commit `cba13aa`",
        "sha256 f6108dfb…",
        "measured at commit cba13aa.",
        "since 772b6fc: the relay",
    ];
    for line in flagged {
        assert!(!markers(line).is_empty(), "not flagged: {line}");
    }
    let clean = [
        "Each rate runs 20 s (the first 2 s not counted)",
        "three runs of 20 requests; runs 20 s each",
        "Latest run 2026-12-04, on this machine",
        "CI runs 200,000 cases per family",
        "admin_key = \"admin-key-7c1e0b5a\"",
        "4.209989e-7·T² + 1.518344e-2·T",
        "1.6666666666666663e+40 came back one ULP off",
        "the file's sha256 9f2c1e0d8b7a6f5e4d3c2b1a09f8e7d6c5b4a39281706f5e4d3c2b1a09f8e7d6",
        "toy_proxy_server.py (https://github.com/vllm-project/vllm/blob/030ea52e/x.py)",
        "decade deadbeef facade",
        "16777216 tokens, 1048576 blocks",
        "`block_hashes` are lowercase hex",
        "tests/py/gen_fixtures.py reads 1a2b3c4.json",
        "the key 7c1e0b5a:v2",
    ];
    for line in clean {
        assert!(markers(line).is_empty(), "flagged: {line}: {:?}", markers(line));
    }
}

/// The subcommands `scripts/real-vllm.sh` dispatches (its `case` labels).
fn real_vllm_subcommands() -> BTreeSet<String> {
    let script = read("scripts/real-vllm.sh");
    let dispatch = script
        .rfind("case \"${1:-}\" in")
        .expect("scripts/real-vllm.sh dispatches on its first argument");
    script[dispatch..]
        .lines()
        .skip(1)
        .take_while(|l| l.trim() != "esac")
        .filter_map(|l| l.trim().split_once(')').map(|(label, _)| label.trim().to_owned()))
        .filter(|l| l.chars().all(|c| c.is_ascii_lowercase() || c == '-'))
        .collect()
}

fn yaml_documents(rel: &str) -> usize {
    use serde::Deserialize as _;
    let text = read(rel);
    let mut n = 0;
    for doc in serde_norway::Deserializer::from_str(&text) {
        let v = serde_norway::Value::deserialize(doc)
            .unwrap_or_else(|e| panic!("{rel} is not YAML: {e}"));
        if !v.is_null() {
            n += 1;
        }
    }
    n
}

/// `kubectl apply -k DIR` / `-f FILE`: the manifests exist and parse; a
/// kustomization's resources too.
fn check_manifests(target: &str, kustomize: bool, problems: &mut Vec<String>) {
    let root = shell::repo_root();
    if !kustomize {
        if root.join(target).is_file() {
            if yaml_documents(target) == 0 {
                problems.push(format!("{target} holds no manifest"));
            }
        } else {
            problems.push(format!("{target} does not exist"));
        }
        return;
    }
    let k = format!("{}/kustomization.yaml", target.trim_end_matches('/'));
    if !root.join(&k).is_file() {
        problems.push(format!("{k} does not exist"));
        return;
    }
    let text = read(&k);
    let v: serde_norway::Value = serde_norway::from_str(&text).unwrap();
    let resources = v.get("resources").and_then(|r| r.as_sequence()).cloned().unwrap_or_default();
    if resources.is_empty() {
        problems.push(format!("{k} lists no resources"));
    }
    for r in resources {
        let f = format!("{}/{}", target.trim_end_matches('/'), r.as_str().unwrap());
        if !root.join(&f).is_file() {
            problems.push(format!("{k} names {f}, which does not exist"));
        } else if yaml_documents(&f) == 0 {
            problems.push(format!("{f} holds no manifest"));
        }
    }
}

#[test]
fn the_quickstart_shows_commands_the_project_runs() {
    let path = "docs/quickstart.md";
    let text = read(path);
    let commands = shell::commands_in(path, &text);
    let mut problems = Vec::new();

    // Three ways in, each with commands.
    let sections: Vec<&str> = text.split("\n## ").skip(1).collect();
    let with_commands = sections.iter().filter(|s| !shell::shell_blocks(s).is_empty()).count();
    assert!(with_commands >= 3, "{path}: the three ways in each need their commands");

    // kvgate serve / epp: the whole configuration is accepted.
    let mut kvgate = 0;
    for c in &commands {
        let Some(args) = shell::kvgate_args(c) else { continue };
        kvgate += 1;
        if !matches!(args.first().map(String::as_str), Some("serve" | "epp")) {
            continue;
        }
        let out = Command::new(env!("CARGO_BIN_EXE_kvgate"))
            .args(&args)
            .arg("--print-config")
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .output()
            .unwrap();
        if !out.status.success() {
            problems.push(format!(
                "{}: kvgate {} --print-config fails: {}",
                c.at,
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
    }
    assert!(kvgate >= 3, "{path}: expected kvgate commands, found {kvgate}");

    // scripts/real-vllm.sh SUBCOMMAND, also inside `$(...)`.
    let subcommands = real_vllm_subcommands();
    assert!(subcommands.contains("install"), "read no subcommands from scripts/real-vllm.sh");
    let mut real = 0;
    for (start, lines) in shell::shell_blocks(&text) {
        for (i, line) in lines.iter().enumerate() {
            for (at, _) in line.match_indices("scripts/real-vllm.sh") {
                real += 1;
                let sub = line[at + "scripts/real-vllm.sh".len()..]
                    .split_whitespace()
                    .next()
                    .unwrap_or("")
                    .trim_end_matches(')');
                if !subcommands.contains(sub) {
                    problems.push(format!(
                        "{path}:{}: scripts/real-vllm.sh has no subcommand {sub:?} (it has {subcommands:?})",
                        start + i
                    ));
                }
            }
        }
    }
    assert!(real >= 2, "{path}: the real-engine way in quotes scripts/real-vllm.sh");
    // The real-engine suite installs and runs engines with the same script.
    let suite = read("scripts/test-real-vllm.sh");
    assert!(
        suite.contains("scripts/real-vllm.sh install"),
        "the suite no longer installs with the script"
    );

    // kubectl apply -k DIR / -f FILE.
    let mut kubectl = 0;
    for c in &commands {
        let w = &c.words;
        if w.first().map(String::as_str) != Some("kubectl") || !w.iter().any(|x| x == "apply") {
            continue;
        }
        for pair in w.windows(2) {
            if matches!(pair[0].as_str(), "-k" | "-f") {
                kubectl += 1;
                check_manifests(&pair[1], pair[0] == "-k", &mut problems);
            }
        }
    }
    assert!(kubectl >= 2, "{path}: the Kubernetes way in applies the manifests under deploy/");

    // Every path under deploy/ the page names in backticks exists.
    let mut fenced = false;
    let prose: String = text
        .lines()
        .filter(|l| {
            let fence = l.trim_start().starts_with("```");
            fenced ^= fence;
            !fence && !fenced
        })
        .collect::<Vec<_>>()
        .join("\n");
    let quoted = prose.split('`').skip(1).step_by(2);
    let mut paths = 0;
    for word in quoted.flat_map(|q| q.split(|c: char| c.is_whitespace() || c == ',')) {
        if word.starts_with("deploy/") {
            paths += 1;
            let p = word.trim_end_matches(['.', ':', ';']);
            if !shell::repo_root().join(p).exists() {
                problems.push(format!("{path} names {p}, which does not exist"));
            }
        }
    }

    assert!(paths >= 3, "{path}: the Kubernetes way in names its manifests under deploy/");

    // The engines' --kv-events-config turns KV events on.
    let mut events = 0;
    for c in &commands {
        for pair in c.words.windows(2) {
            if pair[0] == "--kv-events-config" {
                events += 1;
                match serde_json::from_str::<serde_json::Value>(&pair[1]) {
                    Ok(v) if v["enable_kv_cache_events"] == true && v["publisher"] == "zmq" => {}
                    Ok(v) => problems
                        .push(format!("{}: --kv-events-config {v} does not publish events", c.at)),
                    Err(e) => {
                        problems.push(format!("{}: --kv-events-config is not JSON: {e}", c.at))
                    }
                }
            }
        }
    }
    assert!(events >= 1, "{path}: the GPU engines' flags include --kv-events-config");

    assert!(problems.is_empty(), "{path} is out of step:\n{}", problems.join("\n"));
}
