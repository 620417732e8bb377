//! What the tokenizer's test binaries share: loading a tokenizer family,
//! reading JSONL fixtures and comparing ids with vLLM's. Helpers panic with the path on broken fixtures.
#![allow(clippy::unwrap_used, dead_code)]

use std::path::{Path, PathBuf};

use kvgate_tokenize::ChatTokenizer;
use serde_json::Value;

/// `qwen3` is bundled; other families come from `.cache/tokenizers/<family>`
/// (`scripts/fetch-tokenizers.sh`).
pub(crate) fn load(family: &str) -> ChatTokenizer {
    if family == "qwen3" {
        return ChatTokenizer::bundled().unwrap();
    }
    let dir =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.cache/tokenizers").join(family);
    assert!(
        dir.join("tokenizer.json").exists(),
        "{} is missing: run `bash scripts/fetch-tokenizers.sh`",
        dir.display()
    );
    ChatTokenizer::from_dir(&dir).unwrap()
}

/// Every non-blank line of `path` as JSON.
pub(crate) fn read_jsonl(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            serde_json::from_str(l).unwrap_or_else(|e| panic!("{}: bad line: {e}", path.display()))
        })
        .collect()
}

/// What is wrong with kvgate's answer `got` for a parity case whose vLLM
/// answer is `want` (`{"ids": [...]}` or `{"error": ...}`), if anything:
/// both must refuse, or both give the same ids.
pub(crate) fn mismatch(want: &Value, got: Result<Vec<u32>, String>) -> Option<String> {
    match (want.get("error"), got) {
        (Some(_), Err(_)) => None,
        (Some(err), Ok(ids)) => {
            Some(format!("vLLM refuses it ({err}) but kvgate gave {} ids", ids.len()))
        }
        (None, Err(e)) => Some(format!("kvgate refused: {e}")),
        (None, Ok(ids)) => {
            let want: Vec<u32> = want["ids"]
                .as_array()
                .map(|a| a.iter().filter_map(Value::as_u64).map(|v| v as u32).collect())
                .unwrap_or_default();
            (ids != want).then(|| {
                let at = ids.iter().zip(&want).position(|(a, b)| a != b);
                let at = at.unwrap_or(ids.len().min(want.len()));
                format!(
                    "ids differ at token {at} (len {} vs {}): kvgate {:?} / vLLM {:?}",
                    ids.len(),
                    want.len(),
                    ids.get(at),
                    want.get(at)
                )
            })
        }
    }
}

/// Checks every case of `dir/corpus.jsonl` (at least `min_cases`) for the
/// Qwen3 and Llama 3 families against `dir/expected-<family>.jsonl`:
/// `judge(tokenizer, case, expected line)` says what is wrong with a case,
/// if anything. Every mismatch is reported at once, under `what`.
pub(crate) fn check_corpus(
    dir: &Path,
    what: &str,
    min_cases: usize,
    judge: impl Fn(&ChatTokenizer, &Value, Option<&Value>) -> Option<String>,
) {
    let corpus = read_jsonl(&dir.join("corpus.jsonl"));
    assert!(corpus.len() >= min_cases, "the corpus has only {} cases", corpus.len());
    let mut failures = Vec::new();
    let mut summary = Vec::new();
    for family in ["qwen3", "llama3_1"] {
        let tokenizer = load(family);
        let expected = read_jsonl(&dir.join(format!("expected-{family}.jsonl")));
        let mut passed = 0;
        for case in &corpus {
            let id = case["id"].as_str().unwrap_or("?");
            let want = expected.iter().find(|e| e["id"] == case["id"]);
            match judge(&tokenizer, case, want) {
                None => passed += 1,
                Some(p) => failures.push(format!("[{family}] {id}: {p}")),
            }
        }
        summary.push(format!("{family}: {passed}/{}", corpus.len()));
    }
    assert!(
        failures.is_empty(),
        "{what}: {}\n{} mismatches:\n{}",
        summary.join(", "),
        failures.len(),
        failures.join("\n")
    );
    eprintln!("{what}: {}", summary.join(", "));
}
