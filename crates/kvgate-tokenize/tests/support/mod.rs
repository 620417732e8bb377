//! What the tokenizer's test binaries share: loading a tokenizer family and
//! reading JSONL fixtures. Helpers panic with the path on broken fixtures.
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
