//! Encode throughput, side by side in one run: Hugging Face `tokenizers`
//! (`encode_fast`, the reference), `fastokens` on its own, and kvgate's
//! chosen path (`ChatTokenizer::encode_text_no_special`), on four text
//! classes at about 1k, 4k, 32k and 128k tokens (bundled Qwen3 tokenizer):
//!
//! - `prose`: this repository's own docs (English with some tables);
//! - `code`: this repository's own Rust sources;
//! - `cjk`: text decoded from random CJK tokens of the vocabulary;
//! - `randtok`: text decoded from uniformly random token ids, as benchmark
//!   clients (`vllm bench serve --dataset-name random`) make prompts.
//!
//! Each cell rotates over four distinct texts, so that no encoder sees the
//! same input twice in a row (fastokens caches words; the rotation keeps
//! that honest without defeating what real traffic would also reuse).
//!
//! `cargo bench -p kvgate-tokenize --bench encoders`; the ratios are in
//! docs/benchmarks.md ("Encoders"), computed from criterion's estimates
//! by `scripts/encoder-ratios.py`. Run with `FASTOKENS_BPE_THREADS=1`, as
//! `kvgate` does, for one thread per encode.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::hint::black_box;
use std::path::{Path, PathBuf};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use kvgate_tokenize::{ChatTokenizer, ModelDir};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Every file under `dir` with extension `ext`, concatenated in path order.
fn corpus(dir: &Path, ext: &str) -> String {
    fn walk(dir: &Path, ext: &str, out: &mut Vec<PathBuf>) {
        let mut entries: Vec<_> =
            std::fs::read_dir(dir).unwrap().flatten().map(|e| e.path()).collect();
        entries.sort();
        for p in entries {
            if p.is_dir() {
                walk(&p, ext, out);
            } else if p.extension().is_some_and(|e| e == ext) {
                out.push(p);
            }
        }
    }
    let mut files = Vec::new();
    walk(dir, ext, &mut files);
    files
        .iter()
        .map(|p| std::fs::read_to_string(p).unwrap_or_default())
        .collect::<Vec<_>>()
        .join("\n")
}

/// xorshift64*, for the decoded-token classes.
fn next(state: &mut u64) -> u64 {
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    state.wrapping_mul(0x2545_F491_4F6C_DD1D)
}

/// Text decoded from `n` random ids drawn from `pool`.
fn decoded(tok: &ChatTokenizer, pool: &[u32], n: usize, seed: u64) -> String {
    let mut s = seed | 1;
    let ids: Vec<u32> = (0..n).map(|_| pool[(next(&mut s) % pool.len() as u64) as usize]).collect();
    tok.decode(&ids, true).unwrap()
}

/// About `tokens` tokens of `source`, starting at a variant-dependent
/// offset and wrapping around.
fn slice_of(tok: &ChatTokenizer, source: &str, tokens: usize, variant: usize) -> String {
    let chars: Vec<char> = source.chars().collect();
    let start = (variant * 7919 * 13) % chars.len();
    let mut out = String::new();
    let mut at = start;
    // Grow in steps of a guessed ~4 chars per token, then trim by count.
    while tok.encode_text_no_special(&out).unwrap().len() < tokens {
        for _ in 0..tokens.max(256) {
            out.push(chars[at % chars.len()]);
            at += 1;
        }
    }
    out
}

/// The source of a class: a corpus to slice, or a pool of ids to decode.
enum Source {
    Text(String),
    Ids(Vec<u32>),
}

fn source(tok: &ChatTokenizer, class: &str) -> Source {
    let vocab = tok.tokenizer().get_vocab_size(false) as u32;
    let added: Vec<u32> =
        tok.added_token_strings().iter().filter_map(|t| tok.tokenizer().token_to_id(t)).collect();
    let is_cjk = |c: char| matches!(c as u32, 0x3000..=0x30ff | 0x4e00..=0x9fff | 0xac00..=0xd7a3 | 0xff00..=0xffef);
    match class {
        "prose" => Source::Text(corpus(&repo().join("docs"), "md")),
        "code" => Source::Text(corpus(&repo().join("crates"), "rs")),
        "cjk" => Source::Ids(
            (0..vocab)
                .filter(|id| {
                    let t = tok.decode(&[*id], true).unwrap_or_default();
                    !t.is_empty() && t.chars().all(is_cjk)
                })
                .collect(),
        ),
        _ => Source::Ids((0..vocab).filter(|id| !added.contains(id)).collect()),
    }
}

/// Four distinct texts of about `tokens` tokens.
fn texts(tok: &ChatTokenizer, source: &Source, tokens: usize) -> Vec<String> {
    (0..4)
        .map(|v| match source {
            Source::Text(t) => slice_of(tok, t, tokens, v),
            Source::Ids(pool) => decoded(tok, pool, tokens, 17 + v as u64),
        })
        .collect()
}

fn encoders(c: &mut Criterion) {
    let kvgate = ChatTokenizer::bundled().expect("bundled tokenizer");
    assert_eq!(kvgate.encoder_path().name, "fastokens", "{:?}", kvgate.encoder_path());
    let reference = kvgate.tokenizer().clone();
    let dir = ModelDir::bundled_qwen3().expect("bundled tokenizer");
    let fast =
        fastokens::Tokenizer::from_json(serde_json::from_slice(dir.tokenizer_json()).unwrap())
            .unwrap();
    for class in ["prose", "code", "cjk", "randtok"] {
        let src = source(&kvgate, class);
        let mut group = c.benchmark_group(format!("encode_{class}"));
        group.sample_size(10);
        for tokens in [1_000usize, 4_000, 32_000, 128_000] {
            let variants = texts(&kvgate, &src, tokens);
            // The same ids from all three, or the comparison means nothing.
            for t in &variants {
                let want = reference.encode_fast(t.as_str(), false).unwrap().get_ids().to_vec();
                assert_eq!(fast.encode(t).unwrap(), want);
                assert_eq!(kvgate.encode_text_no_special(t).unwrap(), want);
            }
            let n = variants.len();
            let bytes = variants.iter().map(String::len).sum::<usize>() / n;
            group.throughput(Throughput::Bytes(bytes as u64));
            let label = format!("{}k", tokens / 1000);
            let mut i = 0usize;
            group.bench_function(BenchmarkId::new("tokenizers", &label), |b| {
                b.iter(|| {
                    i += 1;
                    black_box(reference.encode_fast(variants[i % n].as_str(), false).unwrap().len())
                })
            });
            group.bench_function(BenchmarkId::new("fastokens", &label), |b| {
                b.iter(|| {
                    i += 1;
                    black_box(fast.encode(&variants[i % n]).unwrap().len())
                })
            });
            group.bench_function(BenchmarkId::new("kvgate", &label), |b| {
                b.iter(|| {
                    i += 1;
                    black_box(kvgate.encode_text_no_special(&variants[i % n]).unwrap().len())
                })
            });
        }
        group.finish();
    }
}

criterion_group!(benches, encoders);
criterion_main!(benches);
