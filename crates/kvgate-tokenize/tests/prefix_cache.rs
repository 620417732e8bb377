//! The prefix cache must never change a token: on random multi-turn
//! conversations (text with unicode, whitespace runs, digits and fragments
//! of special tokens), encoding through the cache equals encoding the whole
//! text at once, for every turn, with real tokenizers of two families.

// Test harness code: a failed unwrap is a failed test, with its message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;

use kvgate_tokenize::prefix_cache::{PrefixCache, PrefixCacheConfig};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn load(family: &str) -> tokenizers::Tokenizer {
    let cached = repo_root().join(format!(".cache/tokenizers/{family}/tokenizer.json"));
    if cached.exists() {
        return tokenizers::Tokenizer::from_file(&cached).unwrap();
    }
    let zst = repo_root().join(format!("assets/tokenizers/{family}/tokenizer.json.zst"));
    assert!(
        zst.exists(),
        "no tokenizer for {family}: run `bash scripts/fetch-tokenizers.sh` (the README's test command does)"
    );
    let mut decoder =
        ruzstd::decoding::StreamingDecoder::new(std::fs::File::open(zst).unwrap()).unwrap();
    let mut bytes = Vec::new();
    std::io::Read::read_to_end(&mut decoder, &mut bytes).unwrap();
    tokenizers::Tokenizer::from_bytes(bytes).unwrap()
}

/// Chat markup per family: (turn start for a role, turn end).
fn turn(family: &str, role: &str, text: &str) -> String {
    match family {
        "qwen3" => format!("<|im_start|>{role}\n{text}<|im_end|>\n"),
        _ => format!("<|start_header_id|>{role}<|end_header_id|>\n\n{text}<|eot_id|>"),
    }
}

fn generation_prompt(family: &str) -> &'static str {
    match family {
        "qwen3" => "<|im_start|>assistant\n",
        _ => "<|start_header_id|>assistant<|end_header_id|>\n\n",
    }
}

fn fragment() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-zA-Z0-9 ]{0,40}",
        Just(" ".repeat(5)),
        Just("\n\n\n".to_owned()),
        Just("\r\n\t ".to_owned()),
        Just("héllo wörld — 你好，世界 🚀🧪 مرحبا".to_owned()),
        Just("<|im".to_owned()),
        Just("|>".to_owned()),
        Just("<think>".to_owned()),
        Just("</think>\n\n".to_owned()),
        Just("<|im_end|>".to_owned()),
        Just("<|eot_id|>".to_owned()),
        Just("  <tool_call>{\"a\": 1}</tool_call>".to_owned()),
        Just("1234567890".to_owned()),
        Just("'s 're don't".to_owned()),
    ]
}

fn message() -> impl Strategy<Value = String> {
    prop::collection::vec(fragment(), 0..8).prop_map(|parts| parts.concat())
}

fn check_family(family: &str, cases: u32) {
    let tokenizer = load(family);
    let cache = PrefixCache::new(&tokenizer, PrefixCacheConfig::default());
    assert!(cache.is_enabled(), "{family}: cuts should be sound for this tokenizer");
    let encode = |s: &str| -> Result<Vec<u32>, String> {
        tokenizer.encode(s, false).map(|e| e.get_ids().to_vec()).map_err(|e| e.to_string())
    };
    let mut runner =
        TestRunner::new(Config { cases, failure_persistence: None, ..Config::default() });
    let conversations = (message(), prop::collection::vec((message(), message()), 1..6));
    runner
        .run(&conversations, |(system, turns)| {
            let mut history = turn(family, "system", &system);
            for (user, reply) in &turns {
                history.push_str(&turn(family, "user", user));
                let prompt = format!("{history}{}", generation_prompt(family));
                let cached = cache.encode(&prompt, encode).map_err(TestCaseError::fail)?;
                let full = encode(&prompt).map_err(TestCaseError::fail)?;
                prop_assert_eq!(&cached, &full, "{}: prompt {:?}", family, prompt);
                history.push_str(&turn(family, "assistant", reply));
            }
            Ok(())
        })
        .unwrap();
    let stats = cache.stats();
    assert!(stats.hits > 0, "{family}: multi-turn prompts never hit the cache: {stats:?}");
    assert!(stats.reused_tokens > 0);
}

#[test]
fn cached_equals_full_qwen3() {
    check_family("qwen3", 64);
}

#[test]
fn cached_equals_full_llama3_1() {
    check_family("llama3_1", 64);
}

#[test]
fn budget_bounds_the_cache() {
    let tokenizer = load("qwen3");
    let cache = PrefixCache::new(
        &tokenizer,
        PrefixCacheConfig { max_tokens: 2_000, boundaries_per_prompt: 4 },
    );
    let encode = |s: &str| -> Result<Vec<u32>, String> {
        tokenizer.encode(s, false).map(|e| e.get_ids().to_vec()).map_err(|e| e.to_string())
    };
    for i in 0..200 {
        let prompt = format!(
            "<|im_start|>user\nconversation {i}: {}<|im_end|>\n<|im_start|>assistant\n",
            "words ".repeat(50)
        );
        cache.encode(&prompt, encode).unwrap();
    }
    let stats = cache.stats();
    assert!(stats.tokens <= 2_000, "{stats:?}");
    assert!(stats.evictions > 0, "{stats:?}");
}
