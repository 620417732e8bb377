//! No import cycles between the modules of any crate (issue 19).
//!
//! Reads every `crates/*/src` tree, lists each module's edges (paths written
//! from `crate::`, `super::` or `self::`, in `use` items and inline), and
//! fails on a strongly connected component of more than one module, naming
//! one cycle through it with the file and line of each edge.
//!
//! What counts: a module is a source file (`a.rs` or `a/mod.rs` is `a`,
//! `a/b.rs` is `a::b`). An edge goes to the longest known module prefix of
//! the path. Not edges: the crate root (`lib.rs`/`main.rs` is the facade that
//! declares and re-exports everything), a module's own `mod` declarations,
//! comments, string literals, and `#[cfg(test)] mod` blocks (tests may reach
//! anywhere). Run with `--nocapture` to print every edge.

#![allow(clippy::unwrap_used, clippy::print_stdout)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// One module's source, comments and strings blanked out.
struct Module {
    file: PathBuf,
    code: String,
}

fn modules(src: &Path) -> BTreeMap<String, Module> {
    let mut out = BTreeMap::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            if path.extension().and_then(|e| e.to_str()) != Some("rs") {
                continue;
            }
            let rel = path.strip_prefix(src).unwrap().with_extension("");
            let mut segs: Vec<String> =
                rel.components().map(|c| c.as_os_str().to_string_lossy().into_owned()).collect();
            if matches!(segs.last().map(String::as_str), Some("mod" | "lib" | "main")) {
                segs.pop();
            }
            let text = std::fs::read_to_string(&path).unwrap();
            out.insert(segs.join("::"), Module { file: path, code: blank(&text) });
        }
    }
    out
}

/// `text` with comments, string and char literals replaced by spaces (line
/// breaks kept, so byte offsets still give line numbers), cut before the
/// first `#[cfg(test)]` module.
fn blank(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    let keep = |c: u8| if c == b'\n' { b'\n' } else { b' ' };
    while i < b.len() {
        let c = b[i];
        if c == b'/' && b.get(i + 1) == Some(&b'/') {
            while i < b.len() && b[i] != b'\n' {
                out.push(b' ');
                i += 1;
            }
        } else if c == b'/' && b.get(i + 1) == Some(&b'*') {
            let mut depth = 0;
            while i < b.len() {
                if b[i] == b'/' && b.get(i + 1) == Some(&b'*') {
                    depth += 1;
                    out.extend_from_slice(b"  ");
                    i += 2;
                } else if b[i] == b'*' && b.get(i + 1) == Some(&b'/') {
                    depth -= 1;
                    out.extend_from_slice(b"  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    out.push(keep(b[i]));
                    i += 1;
                }
            }
        } else if c == b'r'
            && (b.get(i + 1) == Some(&b'"') || b.get(i + 1) == Some(&b'#'))
            && (i == 0 || !is_ident(b[i - 1]))
        {
            // Raw string r#"..."#: find the matching number of hashes.
            let mut j = i + 1;
            while b.get(j) == Some(&b'#') {
                j += 1;
            }
            if b.get(j) != Some(&b'"') {
                out.push(c);
                i += 1;
                continue;
            }
            let hashes = j - i - 1;
            let mut k = j + 1;
            while k < b.len() {
                if b[k] == b'"'
                    && b[k + 1..].iter().take(hashes).filter(|&&h| h == b'#').count() == hashes
                {
                    k += 1 + hashes;
                    break;
                }
                k += 1;
            }
            out.extend(b[i..k.min(b.len())].iter().map(|&x| keep(x)));
            i = k;
        } else if c == b'"' {
            out.push(b' ');
            i += 1;
            while i < b.len() && b[i] != b'"' {
                if b[i] == b'\\' {
                    out.push(b' ');
                    i += 1;
                }
                if i < b.len() {
                    out.push(keep(b[i]));
                    i += 1;
                }
            }
            out.push(b' ');
            i += 1;
        } else if c == b'\'' && is_char_literal(&b[i..]) {
            let len = if b.get(i + 1) == Some(&b'\\') {
                b[i + 2..].iter().position(|&x| x == b'\'').map_or(1, |p| p + 3)
            } else {
                // One char, possibly multi-byte.
                let ch_len = text[i + 1..].chars().next().map_or(1, char::len_utf8);
                ch_len + 2
            };
            out.extend(std::iter::repeat_n(b' ', len.min(b.len() - i)));
            i += len;
        } else {
            out.push(c);
            i += 1;
        }
    }
    let code = String::from_utf8_lossy(&out).into_owned();
    match find_test_module(&code) {
        Some(at) => code[..at].to_owned(),
        None => code,
    }
}

fn is_ident(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// `'x'` or `'\n'` (a char literal), not `'a` (a lifetime).
fn is_char_literal(b: &[u8]) -> bool {
    match b.get(1) {
        Some(b'\\') => true,
        Some(_) => {
            let s = String::from_utf8_lossy(&b[1..b.len().min(6)]);
            s.chars().next().is_some_and(|ch| s[ch.len_utf8()..].starts_with('\''))
        }
        None => false,
    }
}

fn find_test_module(code: &str) -> Option<usize> {
    let mut from = 0;
    while let Some(p) = code[from..].find("#[cfg(test)]") {
        let at = from + p;
        let rest = code[at + "#[cfg(test)]".len()..].trim_start();
        if rest.starts_with("mod ") || rest.starts_with("pub mod ") {
            return Some(at);
        }
        from = at + 1;
    }
    None
}

/// Every path in `code` that starts at `crate`, `super` or `self`, with the
/// byte offset it was found at; `use` groups are expanded.
fn paths(code: &str) -> Vec<(usize, Vec<String>)> {
    let b = code.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if !is_ident(b[i]) || (i > 0 && (is_ident(b[i - 1]) || b[i - 1] == b':')) {
            i += 1;
            continue;
        }
        let word_end = i + b[i..].iter().take_while(|&&c| is_ident(c)).count();
        let word = &code[i..word_end];
        if word == "use" {
            let Some(semi) = code[word_end..].find(';') else { break };
            let tree: String =
                code[word_end..word_end + semi].chars().filter(|c| !c.is_whitespace()).collect();
            for p in expand(&tree) {
                out.push((i, p.split("::").map(str::to_owned).collect()));
            }
            i = word_end + semi;
        } else if matches!(word, "crate" | "super" | "self") && code[word_end..].starts_with("::") {
            let mut j = word_end;
            while code[j..].starts_with("::") {
                let seg = code[j + 2..].bytes().take_while(|&c| is_ident(c)).count();
                if seg == 0 {
                    break;
                }
                j += 2 + seg;
            }
            out.push((i, code[i..j].split("::").map(str::to_owned).collect()));
            i = j;
        } else {
            i = word_end;
        }
    }
    out
}

/// `a::{b, c::{d, e}}` → `a::b`, `a::c::d`, `a::c::e`.
fn expand(tree: &str) -> Vec<String> {
    let Some(open) = tree.find('{') else { return vec![tree.to_owned()] };
    let Some(close) = tree.rfind('}') else { return vec![tree.to_owned()] };
    let prefix = &tree[..open];
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0, open + 1);
    for (k, c) in tree[open + 1..close].char_indices() {
        let at = open + 1 + k;
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&tree[start..at]);
                start = at + 1;
            }
            _ => {}
        }
    }
    parts.push(&tree[start..close]);
    parts
        .into_iter()
        .filter(|p| !p.is_empty())
        .flat_map(|p| expand(p).into_iter().map(move |x| format!("{prefix}{x}")))
        .collect()
}

/// The module `path` (found in module `from`) points at, if it is another
/// known module and not the crate root.
fn target(from: &str, path: &[String], known: &BTreeMap<String, Module>) -> Option<String> {
    let mut base: Vec<&str> = if from.is_empty() { Vec::new() } else { from.split("::").collect() };
    let mut segs = path.iter().map(String::as_str).peekable();
    match segs.peek().copied() {
        Some("crate") => {
            base.clear();
            segs.next();
        }
        Some("super") => {
            while segs.peek() == Some(&"super") {
                base.pop();
                segs.next();
            }
        }
        Some("self") => {
            segs.next();
        }
        _ => return None,
    }
    let full: Vec<&str> =
        base.into_iter().chain(segs.filter(|s| *s != "self" && *s != "*")).collect();
    (1..=full.len())
        .rev()
        .map(|k| full[..k].join("::"))
        .find(|m| known.contains_key(m))
        .filter(|m| m != from)
}

/// Strongly connected components with more than one module (Tarjan).
fn cycles(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct T<'a> {
        edges: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on: BTreeSet<&'a str>,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(t: &mut T<'a>, v: &'a str) {
        let n = t.index.len();
        t.index.insert(v, n);
        t.low.insert(v, n);
        t.stack.push(v);
        t.on.insert(v);
        for w in t.edges.get(v).into_iter().flatten() {
            let w = w.as_str();
            if !t.index.contains_key(w) {
                visit(t, w);
                let lw = t.low[w];
                let lv = t.low.get_mut(v).unwrap();
                *lv = (*lv).min(lw);
            } else if t.on.contains(w) {
                let iw = t.index[w];
                let lv = t.low.get_mut(v).unwrap();
                *lv = (*lv).min(iw);
            }
        }
        if t.low[v] == t.index[v] {
            let mut comp = Vec::new();
            while let Some(w) = t.stack.pop() {
                t.on.remove(w);
                comp.push(w.to_owned());
                if w == v {
                    break;
                }
            }
            if comp.len() > 1 {
                comp.sort();
                t.out.push(comp);
            }
        }
    }
    let mut t = T {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in edges.keys() {
        if !t.index.contains_key(v.as_str()) {
            visit(&mut t, v);
        }
    }
    t.out
}

/// One cycle through `comp`, starting at its first module (breadth-first, so
/// the shortest way back).
fn one_cycle(comp: &[String], edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<String> {
    let inside: BTreeSet<&str> = comp.iter().map(String::as_str).collect();
    let start = comp[0].as_str();
    let mut prev: BTreeMap<&str, &str> = BTreeMap::new();
    let mut queue = std::collections::VecDeque::from([start]);
    while let Some(v) = queue.pop_front() {
        for w in edges.get(v).into_iter().flatten() {
            let w = w.as_str();
            if !inside.contains(w) {
                continue;
            }
            if w == start {
                let mut path = vec![v.to_owned()];
                let mut at = v;
                while at != start {
                    at = prev[at];
                    path.push(at.to_owned());
                }
                path.reverse();
                path.push(start.to_owned());
                return path;
            }
            if !prev.contains_key(w) {
                prev.insert(w, v);
                queue.push_back(w);
            }
        }
    }
    comp.to_vec()
}

struct Graph {
    edges: BTreeMap<String, BTreeSet<String>>,
    /// (from, to) → "file:line" of the first reference.
    sites: BTreeMap<(String, String), String>,
}

fn graph(src: &Path) -> Graph {
    let known = modules(src);
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut sites = BTreeMap::new();
    for (name, m) in &known {
        edges.entry(name.clone()).or_default();
        for (at, path) in paths(&m.code) {
            if let Some(to) = target(name, &path, &known) {
                let line = m.code[..at].matches('\n').count() + 1;
                sites
                    .entry((name.clone(), to.clone()))
                    .or_insert_with(|| format!("{}:{line}", m.file.display()));
                edges.entry(name.clone()).or_default().insert(to);
            }
        }
    }
    Graph { edges, sites }
}

fn report(crate_dir: &Path, g: &Graph) -> Vec<String> {
    let mut problems = Vec::new();
    for comp in cycles(&g.edges) {
        let cycle = one_cycle(&comp, &g.edges);
        let mut msg = format!(
            "{}: import cycle among {} modules ({}): {}",
            crate_dir.display(),
            comp.len(),
            comp.join(", "),
            cycle.join(" -> ")
        );
        for pair in cycle.windows(2) {
            let site = g.sites.get(&(pair[0].clone(), pair[1].clone())).map_or("?", String::as_str);
            msg.push_str(&format!("\n    {} -> {} at {site}", pair[0], pair[1]));
        }
        problems.push(msg);
    }
    problems
}

fn crate_dirs() -> Vec<PathBuf> {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").canonicalize().unwrap();
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&crates)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("src").is_dir())
        .collect();
    dirs.sort();
    dirs
}

#[test]
fn no_crate_has_an_import_cycle() {
    let dirs = crate_dirs();
    assert!(dirs.len() >= 9, "expected the workspace's crates, found {dirs:?}");
    let mut problems = Vec::new();
    let mut total = 0;
    for dir in &dirs {
        let g = graph(&dir.join("src"));
        for (from, tos) in &g.edges {
            for to in tos {
                println!("{}: {from} -> {to}", dir.file_name().unwrap().to_string_lossy());
                total += 1;
            }
        }
        problems.extend(report(dir, &g));
    }
    // The scanner must be finding edges at all, or an empty graph would pass.
    assert!(total > 100, "only {total} module edges found: the scanner is broken");
    assert!(problems.is_empty(), "\n{}", problems.join("\n"));
}

/// The checker itself: a planted cycle is found and named, comments and
/// strings do not count, test modules do not count, `use` groups expand.
#[test]
fn the_checker_finds_a_planted_cycle() {
    let dir = std::env::temp_dir().join(format!("kvgate-cycles-{}", std::process::id()));
    let src = dir.join("src");
    std::fs::create_dir_all(src.join("net")).unwrap();
    let files = [
        ("lib.rs", "mod a; mod b; mod c; mod net; use crate::a::X;"),
        ("a.rs", "use crate::{b::Y, net::{self, wire::Z}};\n// crate::c::nope\nfn f() { let s = \"crate::c::no\"; }"),
        ("b.rs", "pub struct Y;\nfn g() { crate::c::h(); }\n#[cfg(test)]\nmod tests { use crate::a::X; }"),
        ("c.rs", "pub fn h() { let _ = r#\"crate::b::no\"#; super::a::X; }"),
        ("net/mod.rs", "pub mod wire;"),
        ("net/wire.rs", "pub struct Z; fn k() { super::super::b::Y; let c = '\"'; }"),
    ];
    for (name, text) in files {
        std::fs::write(src.join(name), text).unwrap();
    }
    let g = graph(&src);
    let _ = std::fs::remove_dir_all(&dir);
    let edges: Vec<String> =
        g.edges.iter().flat_map(|(f, ts)| ts.iter().map(move |t| format!("{f}->{t}"))).collect();
    assert_eq!(edges, ["->a", "a->b", "a->net", "a->net::wire", "b->c", "c->a", "net::wire->b"]);
    let problems = report(Path::new("planted"), &g);
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(problems[0].contains("a -> b -> c -> a"), "{}", problems[0]);
    assert!(problems[0].contains("among 4 modules"), "{}", problems[0]);
    assert!(problems[0].contains("c.rs:1"), "{}", problems[0]);
}
