//! Skipping a Unicode normalizer on text it would leave unchanged.
//!
//! Many tokenizers (Qwen2/3 among them) declare an `NFC` normalizer. The
//! `tokenizers` crate runs it on every piece of every input, with per-byte
//! alignment bookkeeping: about an eighth of the CPU of encoding a long
//! English prompt, to produce the very same string (ASCII text, and almost
//! all real text, is already in NFC). Whether a text is already normalized
//! is a quick, allocation-free check (Unicode's quick-check property,
//! UAX #15), answered from the same tables the normalizer uses (the
//! `unicode-normalization-alignments` crate that `tokenizers` normalizes
//! with), so both always agree on the Unicode version.
//!
//! When the check says "yes", we encode with a copy of the tokenizer that
//! has no normalizer. The ids are the same: the added-token split runs on
//! the raw text either way, every piece of a normalized text is itself
//! normalized (the check is a property of each character and of the order
//! of adjacent combining marks, both kept by substrings), and with an
//! identity normalization the pre-tokenizer and model see the same string.
//! When the check says "no" or "maybe", the full tokenizer runs. A property
//! test (`tests/normalizer_skip.rs`) compares both paths on random text.

use tokenizers::{NormalizerWrapper, Tokenizer};
use unicode_normalization_alignments::{is_nfc_quick, is_nfkc_quick, IsNormalized};

/// Which normalization form the skipped normalizer applies.
#[derive(Clone, Copy, Debug)]
enum Form {
    Nfc,
    Nfkc,
}

/// A tokenizer without its (NFC or NFKC) normalizer, for text already in
/// that form.
#[derive(Debug)]
pub(crate) struct SkipNormalizer {
    form: Form,
    tokenizer: Tokenizer,
}

impl SkipNormalizer {
    /// `Some` when `tokenizer`'s whole normalizer is NFC or NFKC (anything
    /// else, a sequence included, is always run).
    pub(crate) fn for_tokenizer(tokenizer: &Tokenizer) -> Option<SkipNormalizer> {
        let form = match tokenizer.get_normalizer()? {
            NormalizerWrapper::NFC(_) => Form::Nfc,
            NormalizerWrapper::NFKC(_) => Form::Nfkc,
            _ => return None,
        };
        let mut plain = tokenizer.clone();
        plain.with_normalizer(None::<NormalizerWrapper>);
        Some(SkipNormalizer { form, tokenizer: plain })
    }

    /// Whether normalizing `text` certainly leaves it unchanged.
    pub(crate) fn is_unchanged(&self, text: &str) -> bool {
        // ASCII is in every normalization form; `is_ascii` is vectorised.
        text.is_ascii()
            || match self.form {
                Form::Nfc => is_nfc_quick(text.chars()) == IsNormalized::Yes,
                Form::Nfkc => is_nfkc_quick(text.chars()) == IsNormalized::Yes,
            }
    }

    /// The tokenizer without a normalizer.
    pub(crate) fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quick_check_answers() {
        let tokenizer = crate::ChatTokenizer::bundled().unwrap();
        let skip = SkipNormalizer::for_tokenizer(tokenizer.tokenizer()).unwrap();
        assert!(skip.is_unchanged("plain ASCII <|im_end|>\n"));
        assert!(skip.is_unchanged("café 你好 🚀"));
        assert!(!skip.is_unchanged("cafe\u{301}"));
        assert!(!skip.is_unchanged("\u{212B}"));
        assert!(!skip.is_unchanged("a\u{301}\u{316}"));
    }

    #[test]
    fn only_plain_nfc_or_nfkc_is_skipped() {
        let mut tokenizer = crate::ChatTokenizer::bundled().unwrap().tokenizer().clone();
        tokenizer.with_normalizer(Some(tokenizers::normalizers::Lowercase));
        assert!(SkipNormalizer::for_tokenizer(&tokenizer).is_none());
        tokenizer.with_normalizer(None::<NormalizerWrapper>);
        assert!(SkipNormalizer::for_tokenizer(&tokenizer).is_none());
    }
}
