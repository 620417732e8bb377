//! The shell commands the docs quote, read the way a shell would read them.
//! Shared by the CLI's own test of every `kvgate` command in the docs
//! (`crates/kvgate/src/cli/tests.rs`) and by `tests/docs_current.rs`.
//!
//! A doc's shell commands are the lines of its fenced code blocks whose info
//! string starts with `bash`, `sh` or `shell`. Within a block:
//! - a line ending in `\` continues on the next one; `#` outside quotes at
//!   the start of a word begins a comment;
//! - words are split as the shell does: single quotes literal, double quotes
//!   with `\` escapes and `$` expansion, backslash escapes outside quotes;
//! - `|`, `||`, `&&`, `;` and `&` separate commands; a redirection (`>`,
//!   `>>`, `<`, `2>`, `2>&1`, `&>`) is dropped with its target;
//! - `NAME=value` alone on a command sets a variable for the rest of the
//!   block; before a command it is dropped (an environment prefix);
//! - `$NAME` and `${NAME}` expand to the block's value, or to
//!   `placeholder-value` when the block sets none (a placeholder such as
//!   `"$CLIENT_KEY"`); unquoted, the value is split into words. A command
//!   substitution `$(...)` expands to nothing unquoted (its words are
//!   unknown) and to `placeholder-value` in quotes;
//! - the keywords `do`, `then`, `else`, `time` and `!` before a command are
//!   dropped.
//!
//! A `kvgate` command is one whose first word is `kvgate` or ends in
//! `/kvgate`, or `cargo run ... -p kvgate ... -- ARGS` (not an example).

#![allow(dead_code, unreachable_pub, clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// One command of a doc: where it is and its words after expansion.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShellCommand {
    /// `path:line` of the command's first line.
    pub at: String,
    pub words: Vec<String>,
}

/// The repository's root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap()
}

/// README.md, ARCHITECTURE.md and every `docs/*.md`, relative to the root.
pub fn doc_files() -> Vec<String> {
    let root = repo_root();
    let mut out = vec!["README.md".to_owned(), "ARCHITECTURE.md".to_owned()];
    let mut docs: Vec<String> = std::fs::read_dir(root.join("docs"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".md"))
        .map(|n| format!("docs/{n}"))
        .collect();
    docs.sort();
    out.extend(docs);
    out
}

/// The shell blocks of a markdown text: (line of the first line, lines).
pub fn shell_blocks(text: &str) -> Vec<(usize, Vec<String>)> {
    let mut out = Vec::new();
    let mut current: Option<(usize, bool, Vec<String>)> = None;
    for (i, line) in text.lines().enumerate() {
        let t = line.trim_start();
        if let Some(info) = t.strip_prefix("```") {
            match current.take() {
                Some((start, shell, lines)) => {
                    if shell {
                        out.push((start, lines));
                    }
                }
                None => {
                    let lang = info.split(|c: char| c.is_whitespace() || c == ',').next();
                    let shell = matches!(lang, Some("bash" | "sh" | "shell"));
                    current = Some((i + 2, shell, Vec::new()));
                }
            }
            continue;
        }
        if let Some((_, _, lines)) = current.as_mut() {
            lines.push(line.to_owned());
        }
    }
    out
}

#[derive(Debug, PartialEq)]
enum Token {
    Word(String),
    /// A separator between commands.
    Sep,
    /// A redirection; the next word is its target.
    Redirect,
}

/// Splits one logical line into tokens, expanding variables from `vars`.
fn tokens(line: &str, vars: &BTreeMap<String, String>) -> Vec<Token> {
    let chars: Vec<char> = line.chars().collect();
    let mut out = Vec::new();
    let mut word = String::new();
    // Whether the current word has started (an empty quoted word counts).
    let mut started = false;
    let mut i = 0;
    let flush = |word: &mut String, started: &mut bool, out: &mut Vec<Token>| {
        if *started {
            out.push(Token::Word(std::mem::take(word)));
            *started = false;
        }
    };
    while i < chars.len() {
        let c = chars[i];
        match c {
            ' ' | '\t' => {
                flush(&mut word, &mut started, &mut out);
                i += 1;
            }
            '#' if !started => break,
            '\\' => {
                if let Some(&n) = chars.get(i + 1) {
                    word.push(n);
                }
                started = true;
                i += 2;
            }
            '\'' => {
                started = true;
                i += 1;
                while i < chars.len() && chars[i] != '\'' {
                    word.push(chars[i]);
                    i += 1;
                }
                i += 1;
            }
            '"' => {
                started = true;
                i += 1;
                while i < chars.len() && chars[i] != '"' {
                    if chars[i] == '\\' && matches!(chars.get(i + 1), Some('"' | '\\' | '$' | '`'))
                    {
                        word.push(chars[i + 1]);
                        i += 2;
                    } else if chars[i] == '$' {
                        let (value, next) = expand(&chars, i, vars);
                        word.push_str(&value.unwrap_or_else(|| "placeholder-value".to_owned()));
                        i = next;
                    } else {
                        word.push(chars[i]);
                        i += 1;
                    }
                }
                i += 1;
            }
            '$' => {
                let (value, next) = expand(&chars, i, vars);
                i = next;
                // Unquoted: split into words (the first joins the word so far).
                // A command substitution (`None`): unknown words, dropped.
                if let Some(v) = value {
                    for (n, p) in v.split_whitespace().enumerate() {
                        if n > 0 {
                            flush(&mut word, &mut started, &mut out);
                        }
                        word.push_str(p);
                        started = true;
                    }
                }
            }
            '|' | ';' => {
                flush(&mut word, &mut started, &mut out);
                out.push(Token::Sep);
                i += if chars.get(i + 1) == Some(&c) { 2 } else { 1 };
            }
            '&' => {
                flush(&mut word, &mut started, &mut out);
                if chars.get(i + 1) == Some(&'>') {
                    out.push(Token::Redirect);
                    i += 2;
                } else {
                    out.push(Token::Sep);
                    i += if chars.get(i + 1) == Some(&'&') { 2 } else { 1 };
                }
            }
            '>' | '<' => {
                // `2>` and `2>&1`: the digit before belongs to the redirection.
                if word.chars().all(|d| d.is_ascii_digit()) && !word.is_empty() {
                    word.clear();
                    started = false;
                }
                flush(&mut word, &mut started, &mut out);
                i += 1;
                if chars.get(i) == Some(&'>') {
                    i += 1;
                }
                if chars.get(i) == Some(&'&') {
                    // `>&1`: the target is the descriptor that follows.
                    i += 1;
                    while i < chars.len() && chars[i].is_ascii_digit() {
                        i += 1;
                    }
                    continue;
                }
                out.push(Token::Redirect);
            }
            _ => {
                word.push(c);
                started = true;
                i += 1;
            }
        }
    }
    flush(&mut word, &mut started, &mut out);
    out
}

/// Expands the `$` at `chars[i]`: the value (`None` for a command
/// substitution) and the index after it. A `$` before anything else is itself.
fn expand(chars: &[char], i: usize, vars: &BTreeMap<String, String>) -> (Option<String>, usize) {
    let value = |name: &str| {
        Some(vars.get(name).cloned().unwrap_or_else(|| "placeholder-value".to_owned()))
    };
    match chars.get(i + 1) {
        Some('(') => {
            let mut depth = 0;
            let mut j = i + 1;
            while j < chars.len() {
                match chars[j] {
                    '(' => depth += 1,
                    ')' => {
                        depth -= 1;
                        if depth == 0 {
                            return (None, j + 1);
                        }
                    }
                    _ => {}
                }
                j += 1;
            }
            (None, j)
        }
        Some('{') => {
            let end = chars[i..].iter().position(|&c| c == '}').map_or(chars.len(), |p| i + p);
            let name: String = chars[i + 2..end].iter().collect();
            // `${NAME:-default}` and the like: the name before the operator.
            let name = name.split([':', '-', '=', '+', '?']).next().unwrap_or("").to_owned();
            (value(&name), end + 1)
        }
        Some(c) if c.is_ascii_alphanumeric() || *c == '_' => {
            let mut j = i + 1;
            while j < chars.len() && (chars[j].is_ascii_alphanumeric() || chars[j] == '_') {
                j += 1;
            }
            let name: String = chars[i + 1..j].iter().collect();
            (value(&name), j)
        }
        _ => (Some("$".to_owned()), i + 1),
    }
}

/// `NAME=value` (a shell variable assignment).
fn assignment(word: &str) -> Option<(&str, &str)> {
    let (name, value) = word.split_once('=')?;
    let ok = !name.is_empty()
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !name.starts_with(|c: char| c.is_ascii_digit());
    ok.then_some((name, value))
}

/// Every command of one shell block, in order.
pub fn block_commands(path: &str, start: usize, lines: &[String]) -> Vec<ShellCommand> {
    let mut vars = BTreeMap::new();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let first = i;
        let mut logical = String::new();
        loop {
            let line = &lines[i];
            i += 1;
            match line.trim_end().strip_suffix('\\') {
                Some(head) if i < lines.len() => {
                    logical.push_str(head);
                    logical.push(' ');
                }
                _ => {
                    logical.push_str(line);
                    break;
                }
            }
        }
        let mut words = Vec::new();
        let mut redirect = false;
        let mut commands = Vec::new();
        for t in tokens(&logical, &vars) {
            match t {
                Token::Word(_) if redirect => redirect = false,
                Token::Word(w) => words.push(w),
                Token::Redirect => redirect = true,
                Token::Sep => commands.push(std::mem::take(&mut words)),
            }
        }
        commands.push(words);
        for mut words in commands {
            // Assignments alone set variables; before a command they are its environment.
            if !words.is_empty() && words.iter().all(|w| assignment(w).is_some()) {
                for w in &words {
                    let (name, value) = assignment(w).unwrap();
                    vars.insert(name.to_owned(), value.to_owned());
                }
                continue;
            }
            while words.first().is_some_and(|w| {
                assignment(w).is_some()
                    || matches!(w.as_str(), "do" | "then" | "else" | "time" | "!")
            }) {
                words.remove(0);
            }
            if !words.is_empty() {
                out.push(ShellCommand { at: format!("{path}:{}", start + first), words });
            }
        }
    }
    out
}

/// Every shell command of a markdown text.
pub fn commands_in(path: &str, text: &str) -> Vec<ShellCommand> {
    shell_blocks(text)
        .into_iter()
        .flat_map(|(start, lines)| block_commands(path, start, &lines))
        .collect()
}

/// Every shell command of the docs (`doc_files`).
pub fn doc_commands() -> Vec<ShellCommand> {
    let root = repo_root();
    doc_files()
        .iter()
        .flat_map(|f| commands_in(f, &std::fs::read_to_string(root.join(f)).unwrap()))
        .collect()
}

/// The arguments after `kvgate` when `c` runs kvgate, else `None`.
pub fn kvgate_args(c: &ShellCommand) -> Option<Vec<String>> {
    let first = c.words.first()?;
    if first == "kvgate" || first.ends_with("/kvgate") {
        return Some(c.words[1..].to_vec());
    }
    if first == "cargo" && c.words.get(1).map(String::as_str) == Some("run") {
        let sep = c.words.iter().position(|w| w == "--")?;
        let opts = &c.words[2..sep];
        let package = opts
            .windows(2)
            .any(|w| matches!(w[0].as_str(), "-p" | "--package") && w[1] == "kvgate")
            || opts.iter().any(|o| o == "--package=kvgate");
        let other = opts.iter().any(|o| o == "--example" || o.starts_with("--example="));
        if package && !other {
            return Some(c.words[sep + 1..].to_vec());
        }
    }
    None
}
