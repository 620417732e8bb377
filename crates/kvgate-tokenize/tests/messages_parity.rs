//! Parity with vLLM for Anthropic Messages requests: every body of
//! `tests/messages_parity/corpus.jsonl` (`/v1/messages` and
//! `/v1/messages/count_tokens`), converted by `messages_to_chat` with the
//! tokenizer's own `messages_rules` and rendered by the chat path, must give
//! the token ids of `tests/messages_parity/expected-<family>.jsonl`, which
//! `tests/messages_parity/gen_expected.py` computes with vLLM 0.33.0's own
//! request models, start-up probes, conversion and renderer. A body vLLM
//! refuses must be refused too. All mismatches are reported at once.
//!
//! qwen3 uses the bundled tokenizer; llama3_1 needs
//! `.cache/tokenizers/llama3_1/` (`scripts/fetch-tokenizers.sh`).

// Helpers outside #[test] functions panic on broken fixtures on purpose.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;

use kvgate_tokenize::{messages_to_chat, ChatTokenizer, MessagesEndpoint};
use serde_json::Value;

mod support;
use support::{check_corpus, mismatch};

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/messages_parity")
}

/// kvgate's ids for one corpus case, or its refusal.
fn compute(tokenizer: &ChatTokenizer, case: &Value) -> Result<Vec<u32>, String> {
    let endpoint = match case["endpoint"].as_str() {
        Some("count_tokens") => MessagesEndpoint::CountTokens,
        _ => MessagesEndpoint::Create,
    };
    let body = case["request"].as_object().ok_or("the request is not an object")?;
    let rules = tokenizer.messages_rules();
    let chat = messages_to_chat(body, endpoint, &rules, 0).map_err(|e| e.to_string())?;
    tokenizer.encode_chat(&chat).map_err(|e| e.to_string())
}

#[test]
fn messages_parity_with_vllm_for_every_case_and_family() {
    check_corpus(&dir(), "messages parity", 40, |tokenizer, case, want| match want {
        None => Some("no expected line".into()),
        Some(want) => mismatch(want, compute(tokenizer, case)),
    });
}
