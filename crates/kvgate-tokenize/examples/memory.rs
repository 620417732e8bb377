//! Resident memory of each piece of a loaded tokenizer, step by step (the
//! bundled Qwen3 one): `cargo run --release -p kvgate-tokenize --example memory
//! [tokenizers|fastokens]`; without an argument, kvgate's own
//! `ChatTokenizer` (encoder `auto`). It uses the gateway's allocator and purges
//! freed pages before each reading, as the gateway does after its load, so
//! each step shows what stays resident, not what the allocator kept.

#![allow(clippy::unwrap_used, clippy::print_stdout)]

// The gateway's global allocator, linked by this use.
use kvgate_alloc as _;

fn rss_mb() -> f64 {
    kvgate_alloc::release_free_memory(true);
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next().and_then(|k| k.parse::<f64>().ok()))
        .unwrap_or(0.0)
        / 1024.0
}

fn main() {
    let step = |what: &str, before: &mut f64| {
        let now = rss_mb();
        println!("{what:<48} {now:7.1} MB ({:+.1})", now - *before);
        *before = now;
    };
    let which = std::env::args().nth(1).unwrap_or_else(|| "both".into());
    let mut last = rss_mb();
    step("start", &mut last);
    let dir = kvgate_tokenize::ModelDir::bundled_qwen3().unwrap();
    step("tokenizer.json decompressed", &mut last);
    let text = "The quick brown fox jumps over the lazy dog. ".repeat(20_000);
    if which == "tokenizers" {
        let hf = tokenizers::Tokenizer::from_bytes(dir.tokenizer_json()).unwrap();
        step("tokenizers::Tokenizer", &mut last);
        hf.encode_fast(text.as_str(), false).unwrap();
        step("tokenizers after a 200k-token encode", &mut last);
    } else if which == "fastokens" {
        let value: serde_json::Value = serde_json::from_slice(dir.tokenizer_json()).unwrap();
        step("tokenizer.json as serde_json::Value", &mut last);
        let fast = fastokens::Tokenizer::from_json(value).unwrap();
        step("fastokens::Tokenizer (Value consumed)", &mut last);
        fast.encode("Hello, world! 你好").unwrap();
        step("fastokens first encode", &mut last);
        fast.encode(&text).unwrap();
        step("fastokens after a 200k-token encode", &mut last);
    } else {
        drop(dir);
        let tok = kvgate_tokenize::ChatTokenizer::bundled().unwrap();
        step("ChatTokenizer::bundled() (auto)", &mut last);
        println!("encoder: {:?}", tok.encoder_path());
    }
}
