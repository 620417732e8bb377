//! Parity with vLLM for OpenAI Responses requests: every body of
//! `tests/responses_parity/corpus.jsonl`, converted by `responses_to_chat`
//! and rendered by the chat path, must give the token ids of
//! `tests/responses_parity/expected-<family>.jsonl`, which
//! `tests/responses_parity/gen_expected.py` computes with vLLM 0.33.0's own
//! request model, conversion and renderer. A body vLLM refuses must be
//! refused too; a body marked `unsupported` (media vLLM renders only for a
//! multimodal model) must be refused as unsupported. All mismatches are
//! reported at once.
//!
//! qwen3 uses the bundled tokenizer; llama3_1 needs
//! `.cache/tokenizers/llama3_1/` (`scripts/fetch-tokenizers.sh`).

// Helpers outside #[test] functions panic on broken fixtures on purpose.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;

use kvgate_tokenize::{responses_to_chat, ChatTokenizer, TokenizeError};
use serde_json::Value;

mod support;
use support::{load, mismatch, read_jsonl};

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/responses_parity")
}

/// kvgate's ids for one corpus case, or its refusal.
fn compute(tokenizer: &ChatTokenizer, case: &Value) -> Result<Vec<u32>, TokenizeError> {
    let body = case["request"].as_object().expect("the request is an object");
    let chat = responses_to_chat(body)?;
    tokenizer.encode_chat(&chat)
}

#[test]
fn responses_parity_with_vllm_for_every_case_and_family() {
    let corpus = read_jsonl(&dir().join("corpus.jsonl"));
    assert!(corpus.len() >= 40, "the corpus has only {} cases", corpus.len());
    let mut failures = Vec::new();
    let mut summary = Vec::new();
    for family in ["qwen3", "llama3_1"] {
        let tokenizer = load(family);
        let expected = read_jsonl(&dir().join(format!("expected-{family}.jsonl")));
        let mut passed = 0;
        for case in &corpus {
            let id = case["id"].as_str().unwrap_or("?");
            let got = compute(&tokenizer, case);
            let problem = if case["unsupported"] == true {
                match got {
                    Err(TokenizeError::Unsupported(_)) => None,
                    other => Some(format!("expected an unsupported refusal, got {other:?}")),
                }
            } else {
                let Some(want) = expected.iter().find(|e| e["id"] == case["id"]) else {
                    failures.push(format!("[{family}] {id}: no expected line"));
                    continue;
                };
                mismatch(want, got.map_err(|e| e.to_string()))
            };
            match problem {
                None => passed += 1,
                Some(p) => failures.push(format!("[{family}] {id}: {p}")),
            }
        }
        summary.push(format!("{family}: {passed}/{}", corpus.len()));
    }
    assert!(
        failures.is_empty(),
        "responses parity: {}\n{} mismatches:\n{}",
        summary.join(", "),
        failures.len(),
        failures.join("\n")
    );
    eprintln!("responses parity: {}", summary.join(", "));
}
