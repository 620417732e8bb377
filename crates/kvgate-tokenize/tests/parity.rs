//! Parity with vLLM: for every request of `tests/parity/corpus.jsonl` and
//! both tokenizer families, the rendered text and the token ids must equal
//! the fixtures `tests/parity/expected-<family>.jsonl`, which
//! `tests/py/parity/gen_expected.py` computes with transformers plus vLLM
//! 0.33's preprocessing (what `POST /tokenize` returns). A request vLLM
//! rejects must be rejected too. All mismatches are reported at once, each
//! with the first differing character and token.
//!
//! qwen3 uses the bundled tokenizer; llama3_1 needs
//! `.cache/tokenizers/llama3_1/` (`scripts/fetch-tokenizers.sh`).
//!
//! A second corpus, `tests/vllm_probe/`, holds edge cases (validation
//! errors, tool-call and kwargs corner cases) whose expected ids come from
//! vLLM 0.33.0's own `/tokenize` code (`tests/vllm_probe/gen_probe.py`);
//! those lines have no `text`, so only ids (or the error) are compared.
//!
//! `KVGATE_PARITY_DIR=/some/dir` replaces the first corpus with another one
//! of the same layout.

// Helpers outside #[test] functions panic on broken fixtures on purpose.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;

use kvgate_tokenize::{ChatRequest, ChatTokenizer};
use serde_json::Value;

mod support;
use support::load;

fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn fixtures_dir() -> PathBuf {
    match std::env::var_os("KVGATE_PARITY_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => crate_dir().join("tests/parity"),
    }
}

fn read_jsonl(dir: &std::path::Path, name: &str) -> Vec<Value> {
    support::read_jsonl(&dir.join(name))
}

/// What kvgate computes for one corpus request: (text, ids) or an error.
fn compute(tokenizer: &ChatTokenizer, request: &Value) -> Result<(String, Vec<u32>), String> {
    if let Some(prompt) = request.get("prompt") {
        let prompt = prompt.as_str().ok_or("prompt is not a string")?;
        let add_special =
            request.get("add_special_tokens").and_then(Value::as_bool).unwrap_or(true);
        let ids = if add_special {
            tokenizer.encode_prompt(prompt)
        } else {
            tokenizer.encode_text_no_special(prompt)
        }
        .map_err(|e| e.to_string())?;
        return Ok((prompt.to_owned(), ids));
    }
    let chat: ChatRequest =
        serde_json::from_value(request.clone()).map_err(|e| format!("bad request: {e}"))?;
    let text = tokenizer.render_chat(&chat).map_err(|e| e.to_string())?;
    let ids = if chat.add_special_tokens {
        tokenizer.encode_prompt(&text)
    } else {
        tokenizer.encode_text_no_special(&text)
    }
    .map_err(|e| e.to_string())?;
    Ok((text, ids))
}

fn first_diff<T: PartialEq>(a: &[T], b: &[T]) -> usize {
    a.iter().zip(b).position(|(x, y)| x != y).unwrap_or(a.len().min(b.len()))
}

fn excerpt(chars: &[char], at: usize) -> String {
    let start = at.saturating_sub(20);
    let end = (at + 20).min(chars.len());
    chars[start..end].iter().collect::<String>()
}

/// Compares one case; `None` when it matches.
fn compare(tokenizer: &ChatTokenizer, request: &Value, expected: &Value) -> Option<String> {
    let ours = compute(tokenizer, request);
    match (expected.get("error"), ours) {
        (Some(_), Err(_)) => None,
        (Some(err), Ok((text, _))) => Some(format!(
            "vLLM rejects it ({err}) but kvgate rendered {:?}",
            text.chars().take(80).collect::<String>()
        )),
        (None, Err(e)) => Some(format!("kvgate failed: {e}")),
        (None, Ok((text, ids))) => {
            let want_text = expected["text"].as_str().unwrap_or(&text);
            let want_ids: Vec<u32> = expected["ids"]
                .as_array()
                .map(|a| a.iter().filter_map(Value::as_u64).map(|v| v as u32).collect())
                .unwrap_or_default();
            let mut problems = Vec::new();
            if text != want_text {
                let (ours, theirs): (Vec<char>, Vec<char>) =
                    (text.chars().collect(), want_text.chars().collect());
                let at = first_diff(&ours, &theirs);
                problems.push(format!(
                    "text differs at char {at} (len {} vs {}): kvgate {:?} / vLLM {:?}",
                    ours.len(),
                    theirs.len(),
                    excerpt(&ours, at),
                    excerpt(&theirs, at)
                ));
            }
            if ids != want_ids {
                let at = first_diff(&ids, &want_ids);
                problems.push(format!(
                    "ids differ at token {at} (len {} vs {}): kvgate {:?} / vLLM {:?}",
                    ids.len(),
                    want_ids.len(),
                    ids.get(at),
                    want_ids.get(at)
                ));
            }
            (!problems.is_empty()).then(|| problems.join("; "))
        }
    }
}

/// Compares every case of the corpus in `dir` for both families; returns
/// the per-family summary and all mismatches.
fn run_corpus(dir: &std::path::Path) -> (Vec<String>, Vec<String>) {
    let corpus = read_jsonl(dir, "corpus.jsonl");
    let mut failures = Vec::new();
    let mut summary = Vec::new();
    for family in ["qwen3", "llama3_1"] {
        let tokenizer = load(family);
        let expected = read_jsonl(dir, &format!("expected-{family}.jsonl"));
        let mut passed = 0;
        for case in &corpus {
            let id = case["id"].as_str().unwrap_or("?");
            let Some(want) = expected.iter().find(|e| e["id"] == case["id"]) else {
                failures.push(format!("[{family}] {id}: no expected line"));
                continue;
            };
            match compare(&tokenizer, &case["request"], want) {
                None => passed += 1,
                Some(problem) => failures.push(format!("[{family}] {id}: {problem}")),
            }
        }
        summary.push(format!("{family}: {passed}/{}", corpus.len()));
    }
    (summary, failures)
}

#[test]
fn parity_with_vllm_for_every_case_and_family() {
    let dir = fixtures_dir();
    if std::env::var_os("KVGATE_PARITY_DIR").is_none() {
        let n = read_jsonl(&dir, "corpus.jsonl").len();
        assert!(n >= 40, "the corpus has only {n} cases");
    }
    let (summary, failures) = run_corpus(&dir);
    assert!(
        failures.is_empty(),
        "parity: {}\n{} mismatches:\n{}",
        summary.join(", "),
        failures.len(),
        failures.join("\n")
    );
    eprintln!("parity: {}", summary.join(", "));
}

#[test]
fn edge_cases_match_vllm_itself() {
    let (summary, failures) = run_corpus(&crate_dir().join("tests/vllm_probe"));
    assert!(
        failures.is_empty(),
        "vllm probe: {}\n{} mismatches:\n{}",
        summary.join(", "),
        failures.len(),
        failures.join("\n")
    );
    eprintln!("vllm probe: {}", summary.join(", "));
}
