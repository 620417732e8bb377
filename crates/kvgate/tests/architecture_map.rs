//! ARCHITECTURE.md stays true (issue 19): every source file of every crate
//! is named in its crate's section, and every file the map names exists.
//!
//! A crate's section is the text under its `` ### `crates/NAME` `` heading.
//! A file is named by its path under `src/` in backticks, or by its bare
//! file name when no other file of that crate has the same name. The crate
//! roots (`lib.rs`, `main.rs`) are the code maps' own subject and need no
//! line. Anything in backticks ending in `.rs` must exist somewhere in the
//! repository (its path, relative to a crate, `src/` or the root, or as the
//! end of some file's path).

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap()
}

fn rs_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        if p.is_dir() {
            if !matches!(name.as_str(), "target" | ".cache" | ".git" | "node_modules") {
                rs_files(&p, out);
            }
        } else if name.ends_with(".rs") {
            out.push(p);
        }
    }
}

/// Backticked `.rs` names in `text`.
fn named(text: &str) -> Vec<String> {
    text.split('`')
        .skip(1)
        .step_by(2)
        .filter(|t| t.ends_with(".rs") && !t.contains(' '))
        .map(str::to_owned)
        .collect()
}

/// Section text per crate name.
fn sections(map: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut current: Option<(String, String)> = None;
    for line in map.lines() {
        if let Some(rest) = line.strip_prefix("### ") {
            if let Some((name, text)) = current.take() {
                out.insert(name, text);
            }
            if let Some(name) = rest.strip_prefix("`crates/").and_then(|r| r.strip_suffix('`')) {
                current = Some((name.to_owned(), String::new()));
            }
            continue;
        }
        if line.starts_with("## ") {
            if let Some((name, text)) = current.take() {
                out.insert(name, text);
            }
        }
        if let Some((_, text)) = current.as_mut() {
            text.push_str(line);
            text.push('\n');
        }
    }
    if let Some((name, text)) = current {
        out.insert(name, text);
    }
    out
}

#[test]
fn every_source_file_is_on_the_map_and_every_named_file_exists() {
    let root = repo();
    let map = std::fs::read_to_string(root.join("ARCHITECTURE.md")).unwrap();
    let sections = sections(&map);
    let mut problems = Vec::new();

    let mut crates: Vec<PathBuf> = std::fs::read_dir(root.join("crates"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("src").is_dir())
        .collect();
    crates.sort();
    assert!(crates.len() >= 9, "expected the workspace's crates, found {crates:?}");
    for dir in &crates {
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        let Some(text) = sections.get(&name) else {
            problems.push(format!("crates/{name} has no `### \\`crates/{name}\\`` section"));
            continue;
        };
        let names = named(text);
        let mut files = Vec::new();
        rs_files(&dir.join("src"), &mut files);
        let rel: Vec<String> = files
            .iter()
            .map(|f| f.strip_prefix(dir.join("src")).unwrap().to_string_lossy().replace('\\', "/"))
            .collect();
        let base = |r: &str| r.rsplit('/').next().unwrap_or(r).to_owned();
        for r in &rel {
            if r == "lib.rs" || r == "main.rs" {
                continue;
            }
            let unique = rel.iter().filter(|o| base(o) == base(r)).count() == 1;
            // Named whole, by a tail with its folder (`forward/tests.rs`), or
            // by its file name where that is unique in the crate.
            let on_map = names.iter().any(|n| {
                n == r
                    || (n.contains('/') && r.ends_with(&format!("/{n}")))
                    || (unique && *n == base(r))
            });
            if !on_map {
                problems.push(format!("crates/{name}/src/{r} is not named in its section"));
            }
        }
    }

    let mut all = Vec::new();
    rs_files(&root, &mut all);
    let all: Vec<String> = all
        .iter()
        .map(|f| f.strip_prefix(&root).unwrap().to_string_lossy().replace('\\', "/"))
        .collect();
    for n in named(&map) {
        let exists = all.iter().any(|f| *f == n || f.ends_with(&format!("/{n}")));
        if !exists {
            problems.push(format!("ARCHITECTURE.md names `{n}`, which does not exist"));
        }
    }
    assert!(problems.is_empty(), "ARCHITECTURE.md is out of date:\n{}", problems.join("\n"));
}

#[test]
fn the_section_reader_splits_by_crate() {
    let map = "# A\n### `crates/x`\n- `a.rs` and `b/c.rs`\n### Other\n`z.rs`\n## Next\n";
    let s = sections(map);
    assert_eq!(s.len(), 1);
    assert_eq!(named(&s["x"]), ["a.rs", "b/c.rs"]);
}
