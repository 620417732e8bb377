//! Skipping the normalizer on already-normalized text must never change a
//! token: on random text (ASCII, precomposed and decomposed accents, marks
//! out of canonical order, compatibility characters, Hangul jamo, special
//! tokens next to combining marks), `ChatTokenizer`'s ids equal those of the
//! full `tokenizers` pipeline, for the bundled Qwen3 tokenizer (NFC) and for
//! the same tokenizer declared with NFKC.

// Test harness code: a failed unwrap is a failed test, with its message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use kvgate_tokenize::{ChatTokenizer, ModelDir};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

fn qwen3_files() -> (Vec<u8>, Vec<u8>) {
    let dir =
        std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../assets/tokenizers/qwen3");
    let mut decoder = ruzstd::decoding::StreamingDecoder::new(
        std::fs::File::open(dir.join("tokenizer.json.zst")).unwrap(),
    )
    .unwrap();
    let mut json = Vec::new();
    std::io::Read::read_to_end(&mut decoder, &mut json).unwrap();
    (json, std::fs::read(dir.join("tokenizer_config.json")).unwrap())
}

/// The bundled tokenizer with its normalizer replaced by `normalizer`.
fn with_normalizer(normalizer: serde_json::Value) -> ChatTokenizer {
    let (json, config) = qwen3_files();
    let mut v: serde_json::Value = serde_json::from_slice(&json).unwrap();
    v["normalizer"] = normalizer;
    let dir =
        ModelDir::from_bytes("test", &serde_json::to_vec(&v).unwrap(), Some(&config)).unwrap();
    ChatTokenizer::from_model_dir(dir).unwrap()
}

fn fragment() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-zA-Z0-9 .,'\n]{0,30}",
        // Precomposed (already NFC) and decomposed (NFC composes them).
        Just("café naïve Ångström".to_owned()),
        Just("cafe\u{301} nai\u{308}ve".to_owned()),
        // Combining marks out of canonical order (normalization reorders).
        Just("a\u{301}\u{316}".to_owned()),
        Just("\u{301}".to_owned()),
        // NFC "No": angstrom sign, a CJK compatibility ideograph.
        Just("\u{212B} \u{F900}".to_owned()),
        // NFKC-only changes: ligature, full-width letters, superscript.
        Just("ﬁle ＡＢＣ x²".to_owned()),
        // Hangul jamo (compose to syllables) and syllables.
        Just("\u{1100}\u{1161}\u{11A8} 한국어".to_owned()),
        Just("你好，世界 🚀🧪 👩\u{200D}💻 مرحبا".to_owned()),
        Just("<|im_end|>".to_owned()),
        Just("<|im_start|>\u{301}".to_owned()),
        Just("<think>\n\n</think>".to_owned()),
        "\\PC{0,12}",
    ]
}

fn text() -> impl Strategy<Value = String> {
    prop::collection::vec(fragment(), 0..10).prop_map(|parts| parts.concat())
}

fn check(tokenizer: &ChatTokenizer, cases: u32) {
    let mut runner =
        TestRunner::new(Config { cases, failure_persistence: None, ..Config::default() });
    runner
        .run(&text(), |s| {
            let full = |add: bool| tokenizer.tokenizer().encode_fast(s.as_str(), add).unwrap();
            prop_assert_eq!(
                tokenizer.encode_text_no_special(&s).unwrap(),
                full(false).get_ids().to_vec(),
                "text {:?}",
                s
            );
            prop_assert_eq!(
                tokenizer.encode_prompt(&s).unwrap(),
                full(true).get_ids().to_vec(),
                "text {:?}",
                s
            );
            Ok(())
        })
        .unwrap();
}

#[test]
fn nfc_skip_keeps_every_token() {
    let tokenizer = ChatTokenizer::bundled().unwrap();
    assert!(matches!(
        tokenizer.tokenizer().get_normalizer(),
        Some(tokenizers::NormalizerWrapper::NFC(_))
    ));
    check(&tokenizer, 512);
}

#[test]
fn nfkc_skip_keeps_every_token() {
    let tokenizer = with_normalizer(serde_json::json!({"type": "NFKC"}));
    assert!(matches!(
        tokenizer.tokenizer().get_normalizer(),
        Some(tokenizers::NormalizerWrapper::NFKC(_))
    ));
    check(&tokenizer, 256);
}

/// The cases the quick check must send down the full path really do change
/// under normalization (so the property test above exercises both paths).
#[test]
fn normalization_changes_the_tokens_of_non_normalized_text() {
    let tokenizer = ChatTokenizer::bundled().unwrap();
    let nfc = tokenizer.encode_text_no_special("cafe\u{301}").unwrap();
    let precomposed = tokenizer.encode_text_no_special("café").unwrap();
    assert_eq!(nfc, precomposed, "NFC must compose e + U+0301");
    let mut without = tokenizer.tokenizer().clone();
    without.with_normalizer(None::<tokenizers::NormalizerWrapper>);
    let raw = without.encode_fast("cafe\u{301}", false).unwrap().get_ids().to_vec();
    assert_ne!(raw, precomposed, "without NFC the decomposed form tokenizes differently");
}
