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
use support::{check_corpus, mismatch};

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
    check_corpus(&dir(), "responses parity", 40, |tokenizer, case, want| {
        let got = compute(tokenizer, case);
        if case["unsupported"] == true {
            return match got {
                Err(TokenizeError::Unsupported(_)) => None,
                other => Some(format!("expected an unsupported refusal, got {other:?}")),
            };
        }
        match want {
            None => Some("no expected line".into()),
            Some(want) => mismatch(want, got.map_err(|e| e.to_string())),
        }
    });
}
