//! Differential test of the fast encoder: for both tokenizer families, the
//! encoder kvgate picks (`fastokens` for these) must give exactly the ids of
//! the reference, `tokenizers`' own `encode_fast` with its full normalizer,
//! with and without special tokens, on random text made of what breaks
//! tokenizers: many scripts, combining marks (also ones newer than the
//! Unicode tables of either library), text that normalization changes,
//! emoji sequences, whitespace runs, digit runs, contractions, added tokens
//! mid-text and parts of them, and arbitrary code points.
//!
//! `KVGATE_FUZZ_CASES` sets the cases per family (default 5,000; CI runs
//! 200,000, docs/benchmarks.md records a 10M run); `KVGATE_FUZZ_SEED` the
//! first seed. A failure prints the seed and the text; a mismatch found is a
//! bug that gets a regression line in `REGRESSIONS` below.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use kvgate_tokenize::ChatTokenizer;

mod support;
use support::load;

/// Texts that once differed, or nearly did: always checked.
const REGRESSIONS: &[&str] = &[
    // Combining marks whose canonical order changed after Unicode 9 (a
    // crate with newer NFC tables reorders them differently).
    "\u{6e2}\u{c3c}",
    "e\u{301}\u{316}",
    ">\u{338}<|im_start|>",
    "\u{1100}\u{1161}\u{11a8}",
];

/// xorshift64*: small, seedable, the same everywhere.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn pick<'a>(&mut self, xs: &'a [&'a str]) -> &'a str {
        xs[self.below(xs.len())]
    }
    fn char_in(&mut self, lo: u32, hi: u32) -> char {
        let c = lo + (self.next() % u64::from(hi - lo + 1)) as u32;
        char::from_u32(c).unwrap_or('\u{fffd}')
    }
}

const WORDS: &[&str] = &[
    "the",
    "The",
    "THE",
    "tokenizer",
    "naïve",
    "café",
    "Ångström",
    "don't",
    "I'LL",
    "we've",
    "she'd",
    "it's",
    "IT'S",
    "fn",
    "let",
    "return",
    "x_1",
    "camelCase",
    "snake_case",
    "URL",
    "https://example.com/a?b=c&d=e",
    "user@example.com",
    "C++",
    "#include",
    "0x1F",
    "1e-9",
];
const SPACES: &[&str] = &[
    " ", "  ", "\t", "\n", "\r\n", "\n\n", " \n", "\u{a0}", "\u{3000}", "\u{2009}", "\u{200b}",
    "\r", "\u{85}", "\u{2028}", "\u{feff}",
];
const PUNCT: &[&str] = &[
    ".", ",", "!", "?", "...", "—", "–", "\"", "'", "`", "(", ")", "[", "]", "{", "}", "<", ">",
    "«", "»", "¿", "。", "，", "、", "！", "：", "::", "->", "=>", "==", "!=", "//", "/*", "*/",
    "$", "€", "£", "%", "&", "|", "\\", "^", "~", "@", "#",
];
const EMOJI: &[&str] = &["🚀", "🎉", "👩‍💻", "👍🏽", "🇫🇷", "❤️", "☺︎", "🧑‍🤝‍🧑", "1️⃣", "🏳️‍🌈", "😀😃😄"];
const NORMALIZES: &[&str] = &[
    "e\u{301}",
    "A\u{30a}",
    "\u{212b}",
    "\u{2126}",
    "\u{1e9b}\u{323}",
    "\u{1100}\u{1161}",
    "\u{ac00}\u{11a8}",
    ">\u{338}",
    "\u{fb01}",
    "\u{2460}",
    "\u{ff21}",
    "\u{f900}",
    "\u{2f800}",
    "a\u{316}\u{301}",
    "a\u{301}\u{316}",
    "\u{6e2}\u{c3c}",
    "\u{3099}\u{309a}",
];
/// Ranges of code points: scripts, combining marks, and the whole space.
const RANGES: &[(u32, u32)] = &[
    (0x20, 0x7e),
    (0xa0, 0x24f),
    (0x300, 0x36f),
    (0x370, 0x3ff),
    (0x400, 0x4ff),
    (0x590, 0x6ff),
    (0x900, 0x97f),
    (0xe00, 0xe7f),
    (0x1100, 0x11ff),
    (0x1ab0, 0x1aff),
    (0x1dc0, 0x1dff),
    (0x3040, 0x30ff),
    (0x4e00, 0x9fff),
    (0xac00, 0xd7a3),
    (0xfe00, 0xfe0f),
    (0x1f300, 0x1faff),
    (0x1, 0x10ffff),
];

fn piece(rng: &mut Rng, out: &mut String, added: &[String]) {
    match rng.below(12) {
        0 | 1 => out.push_str(rng.pick(WORDS)),
        2 => {
            for _ in 0..1 + rng.below(3) {
                out.push_str(rng.pick(SPACES));
            }
            if rng.below(8) == 0 {
                // A long run, as in indented code.
                out.push_str(&" ".repeat(rng.below(40)));
            }
        }
        3 => out.push_str(rng.pick(PUNCT)),
        4 => {
            for _ in 0..1 + rng.below(12) {
                out.push(rng.char_in(0x30, 0x39));
            }
        }
        5 => out.push_str(rng.pick(EMOJI)),
        6 => out.push_str(rng.pick(NORMALIZES)),
        7 | 8 => {
            let (lo, hi) = RANGES[rng.below(RANGES.len())];
            for _ in 0..1 + rng.below(6) {
                out.push(rng.char_in(lo, hi));
            }
        }
        9 => {
            let t = &added[rng.below(added.len())];
            if rng.below(3) == 0 {
                // A prefix of an added token: must not match.
                let cut =
                    t.char_indices().map(|(i, _)| i).nth(rng.below(t.chars().count())).unwrap_or(0);
                out.push_str(&t[..cut]);
            } else {
                out.push_str(t);
            }
        }
        10 => out
            .push_str(rng.pick(&["'s", "'S", "'ll", "'LL", "'re", "'ve", "'m", "'d", "'t", "’s"])),
        _ => out.push(rng.char_in(0x41, 0x7a)),
    }
}

fn text(rng: &mut Rng, added: &[String]) -> String {
    let mut s = String::new();
    for _ in 0..rng.below(24) {
        piece(rng, &mut s, added);
    }
    s
}

fn check(family: &str) {
    let tok = load(family);
    assert_eq!(
        tok.encoder_path().name,
        "fastokens",
        "{family}: the fast encoder must be chosen for this family ({:?})",
        tok.encoder_path().reason
    );
    let reference = tok.tokenizer();
    let added = tok.added_token_strings().to_vec();
    let cases: usize =
        std::env::var("KVGATE_FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(5_000);
    let seed: u64 =
        std::env::var("KVGATE_FUZZ_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or(1);
    let compare = |label: &str, s: &str| {
        let want = reference.encode_fast(s, false).unwrap().get_ids().to_vec();
        assert_eq!(tok.encode_text_no_special(s).unwrap(), want, "{family} {label}: {s:?}");
        let want = reference.encode_fast(s, true).unwrap().get_ids().to_vec();
        assert_eq!(tok.encode_prompt(s).unwrap(), want, "{family} {label} (special): {s:?}");
    };
    for s in REGRESSIONS {
        compare("regression", s);
    }
    for i in 0..cases as u64 {
        let case_seed = seed.wrapping_add(i).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let s = text(&mut Rng(case_seed), &added);
        compare(&format!("seed {}", seed.wrapping_add(i)), &s);
    }
}

#[test]
fn fast_encoder_equals_tokenizers_qwen3() {
    check("qwen3");
}

#[test]
fn fast_encoder_equals_tokenizers_llama3_1() {
    check("llama3_1");
}

#[test]
fn the_tokenizers_choice_is_honoured() {
    let tok = ChatTokenizer::bundled_with(kvgate_tokenize::EncoderChoice::Tokenizers).unwrap();
    assert_eq!(tok.encoder_path().name, "tokenizers");
    assert_eq!(tok.encoder_path().reason, None);
}

/// The bundled tokenizer.json with `edit` applied, loaded with `choice`.
fn edited(
    edit: impl FnOnce(&mut serde_json::Value),
    choice: kvgate_tokenize::EncoderChoice,
) -> kvgate_tokenize::Result<ChatTokenizer> {
    let dir = kvgate_tokenize::ModelDir::bundled_qwen3().unwrap();
    let mut json: serde_json::Value = serde_json::from_slice(dir.tokenizer_json()).unwrap();
    edit(&mut json);
    let bytes = serde_json::to_vec(&json).unwrap();
    ChatTokenizer::from_model_dir_with(
        kvgate_tokenize::ModelDir::from_bytes("edited", &bytes, None).unwrap(),
        choice,
    )
}

#[test]
fn a_tokenizer_outside_the_proven_shapes_falls_back_with_the_reason() {
    use kvgate_tokenize::EncoderChoice;
    let lowercase =
        |j: &mut serde_json::Value| j["normalizer"] = serde_json::json!({"type": "Lowercase"});
    let tok = edited(lowercase, EncoderChoice::Auto).unwrap();
    assert_eq!(tok.encoder_path().name, "tokenizers");
    let why = tok.encoder_path().reason.clone().unwrap();
    assert!(why.contains("normalizer"), "{why}");
    // Same ids as the reference on the fallback too.
    let s = "Hello WORLD, Ça Va?";
    let want = tok.tokenizer().encode_fast(s, false).unwrap().get_ids().to_vec();
    assert_eq!(tok.encode_text_no_special(s).unwrap(), want);
    assert_eq!(
        &tok.encode_text_no_special("hello").unwrap(),
        &tok.encode_text_no_special("HELLO").unwrap()
    );

    // Another split regex than the two the tests cover: not proven.
    let other_split = |j: &mut serde_json::Value| {
        j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = serde_json::json!(r"\s+|\S+");
    };
    let tok = edited(other_split, EncoderChoice::Auto).unwrap();
    assert_eq!(tok.encoder_path().name, "tokenizers");

    // An added token with rstrip: not proven either.
    let rstrip =
        |j: &mut serde_json::Value| j["added_tokens"][0]["rstrip"] = serde_json::json!(true);
    let tok = edited(rstrip, EncoderChoice::Auto).unwrap();
    assert_eq!(tok.encoder_path().name, "tokenizers");
    assert!(tok.encoder_path().reason.as_deref().unwrap().contains("rstrip"));
}

#[test]
fn insisting_on_fastokens_reports_but_does_not_fall_back() {
    use kvgate_tokenize::EncoderChoice;
    let other_split = |j: &mut serde_json::Value| {
        j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = serde_json::json!(r"\s+|\S+");
    };
    let tok = edited(other_split, EncoderChoice::Fastokens).unwrap();
    assert_eq!(tok.encoder_path().name, "fastokens");
    assert!(tok.encoder_path().reason.is_some());
    // A file that cannot be loaded is a load error, not a silent fallback.
    let unigram = |j: &mut serde_json::Value| j["model"]["type"] = serde_json::json!("NoSuchModel");
    let err = edited(unigram, EncoderChoice::Fastokens);
    assert!(err.is_err());
}
