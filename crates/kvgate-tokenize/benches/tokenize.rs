//! Ingress CPU: render + tokenize a chat versus raw `tokenizers` encoding of
//! the same final text, at 1k, 4k and 32k tokens, and a 10-turn conversation
//! replayed turn by turn with and without the prefix cache.
//!
//! `cargo bench -p kvgate-tokenize --bench tokenize`; the ratios go to
//! docs/benchmarks.md.

// Bench setup: a failure to load the bundled tokenizer should stop the run loudly.
#![allow(clippy::expect_used)]

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BatchSize, BenchmarkId, Criterion};
use kvgate_tokenize::prefix_cache::PrefixCacheConfig;
use kvgate_tokenize::service::Tokenize;
use kvgate_tokenize::{ChatRequest, ChatTokenizer};
use serde_json::{json, Value};

const WORDS: &[&str] = &[
    "the",
    "router",
    "cache",
    "prefix",
    "replica",
    "token",
    "latency",
    "engine",
    "request",
    "stream",
    "block",
    "memory",
    "schedule",
    "batch",
    "decode",
    "prefill",
    "model",
    "fleet",
    "operator",
    "throughput",
    "queue",
    "hit",
    "miss",
    "evict",
    "weight",
    "attention",
    "layer",
    "context",
    "window",
    "sequence",
    "Rust",
    "async",
    "fast",
    "honest",
    "measure",
    "2048",
    "é",
    "naïve",
    "über",
    "数据",
    "🚀",
    "configuration",
    "(optional)",
    "x=1;",
    "\n",
];

/// Deterministic prose of about `n_words` words.
fn prose(seed: u64, n_words: usize) -> String {
    let mut state = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    let mut out = String::with_capacity(n_words * 7);
    for i in 0..n_words {
        state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let word = WORDS[(state >> 33) as usize % WORDS.len()];
        if i > 0 && word != "\n" {
            out.push(' ');
        }
        out.push_str(word);
        if i % 17 == 16 {
            out.push('.');
        }
    }
    out
}

fn message(role: &str, content: String) -> Value {
    json!({"role": role, "content": content})
}

/// A conversation of `turns` user/assistant exchanges after a system prompt.
fn conversation(seed: u64, turns: usize, words_per_message: usize) -> Vec<Value> {
    let mut messages = vec![message("system", format!("Session {seed}. {}", prose(seed, 150)))];
    for t in 0..turns {
        messages.push(message("user", prose(seed * 1000 + 2 * t as u64, words_per_message)));
        messages
            .push(message("assistant", prose(seed * 1000 + 2 * t as u64 + 1, words_per_message)));
    }
    messages
}

fn request(messages: Vec<Value>) -> ChatRequest {
    let mut r = ChatRequest::new(messages);
    r.chat_template_kwargs =
        Some([("enable_thinking".to_owned(), Value::Bool(false))].into_iter().collect());
    r
}

/// A chat of roughly `target` tokens (last message from the user).
fn chat_of(tokenizer: &ChatTokenizer, target: usize) -> ChatRequest {
    let mut turns = 1;
    loop {
        let mut messages = conversation(7, turns, 120);
        messages.pop();
        let req = request(messages);
        let n = tokenizer.encode_chat(&req).map(|ids| ids.len()).unwrap_or(0);
        if n >= target {
            return req;
        }
        turns += (target - n) / 300 + 1;
    }
}

fn raw(tokenizer: &ChatTokenizer, text: &str) -> usize {
    tokenizer.tokenizer().encode_fast(text, false).map(|e| e.get_ids().len()).unwrap_or(0)
}

fn single_chats(c: &mut Criterion) {
    let tokenizer = ChatTokenizer::bundled().expect("bundled tokenizer");
    let mut group = c.benchmark_group("chat");
    group.sample_size(20);
    for target in [1_000usize, 4_000, 32_000] {
        let req = chat_of(&tokenizer, target);
        let text = tokenizer.render_chat(&req).expect("render");
        let label = format!("{}k", target / 1000);
        group.bench_with_input(BenchmarkId::new("raw_encode", &label), &text, |b, text| {
            b.iter(|| black_box(raw(&tokenizer, text)))
        });
        group.bench_with_input(BenchmarkId::new("render_encode", &label), &req, |b, req| {
            b.iter(|| black_box(tokenizer.encode_chat(req).map(|v| v.len()).unwrap_or(0)))
        });
    }
    group.finish();
}

/// The 10 requests a client sends in a 10-turn conversation: each re-sends
/// the whole history plus a new user message.
fn replay_requests(seed: u64) -> Vec<ChatRequest> {
    let full = conversation(seed, 10, 120);
    (1..=10).map(|turn| request(full[..1 + 2 * turn - 1].to_vec())).collect()
}

fn multi_turn(c: &mut Criterion) {
    let tokenize = Tokenize::new(
        ChatTokenizer::bundled().expect("bundled tokenizer"),
        Some(PrefixCacheConfig::default()),
    );
    let tokenizer = tokenize.tokenizer();
    let mut group = c.benchmark_group("multi_turn_10");
    group.sample_size(20);
    // Every iteration is a new conversation (new system prompt), so turn 1
    // always misses and turns 2..10 can only hit on that conversation.
    let mut seed = 0u64;
    group.bench_function("raw_encode_per_conversation", |b| {
        b.iter_batched(
            || {
                seed += 1;
                replay_requests(seed)
                    .iter()
                    .map(|req| tokenizer.render_chat(req).unwrap_or_default())
                    .collect::<Vec<_>>()
            },
            |texts| black_box(texts.iter().map(|t| raw(tokenizer, t)).sum::<usize>()),
            BatchSize::SmallInput,
        )
    });
    group.bench_function("render_encode_cached_per_conversation", |b| {
        b.iter_batched(
            || {
                seed += 1;
                replay_requests(seed)
            },
            |requests| {
                black_box(
                    requests
                        .iter()
                        .map(|req| tokenize.encode_chat(req).map(|v| v.len()).unwrap_or(0))
                        .sum::<usize>(),
                )
            },
            BatchSize::SmallInput,
        )
    });
    group.finish();
    eprintln!("prefix cache after the runs: {:?}", tokenize.cache_stats());
}

criterion_group!(benches, single_chats, multi_turn);
criterion_main!(benches);
