//! The prefix-tokenization cache: multi-turn traffic re-sends the same
//! conversation with a few more messages at the end, so most of each
//! rendered prompt was tokenized before. We keep the tokens of recent
//! rendered prefixes and only tokenize what is new.
//!
//! Correctness rests on where we cut. `tokenizers` first splits the input on
//! its added tokens (`<|im_start|>`, `<|eot_id|>`, ...) with one
//! leftmost-longest scan, then normalizes, pre-tokenizes and encodes every
//! piece on its own. So right after an added token that matches on raw text
//! (`normalized: false`) and does not look at its neighbours (`rstrip` and
//! `single_word` off), nothing can merge across the cut:
//! `tokens(text) == tokens(text[..cut]) ++ tokens(text[cut..])`. Those are
//! the only places we cut. Pre-tokenizers that treat the first piece of a
//! string differently (a prefix space added only at the start) break that
//! equality, so for them the cache switches itself off. A property test
//! checks the equality on random conversations with real tokenizers.
//!
//! Memory is bounded by a token budget; over it, the least recently used
//! eighth of the entries is dropped in one pass.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use aho_corasick::{AhoCorasick, AhoCorasickBuilder, MatchKind};
use xxhash_rust::xxh3::Xxh3;

/// How much the cache may hold.
#[derive(Clone, Copy, Debug)]
pub struct PrefixCacheConfig {
    /// Total token ids kept across entries (each entry counts its prefix
    /// length, so shared prefixes are counted conservatively).
    pub max_tokens: usize,
    /// How many of the last cut points of each prompt are remembered.
    pub boundaries_per_prompt: usize,
}

impl Default for PrefixCacheConfig {
    fn default() -> Self {
        // About 64 MiB of token ids at most.
        Self { max_tokens: 16 << 20, boundaries_per_prompt: 4 }
    }
}

/// Counters, readable at any time.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PrefixCacheStats {
    /// Prompts whose prefix was found.
    pub hits: u64,
    /// Prompts tokenized from the start.
    pub misses: u64,
    /// Tokens reused from the cache.
    pub reused_tokens: u64,
    /// Entries now held.
    pub entries: u64,
    /// Tokens now accounted to entries.
    pub tokens: u64,
    /// Entries dropped to stay within the budget.
    pub evictions: u64,
}

/// One remembered prefix: the first `n_tokens` of `tokens` encode the
/// first `n_bytes` of some rendered prompt.
#[derive(Debug)]
struct Entry {
    n_bytes: usize,
    n_tokens: usize,
    tokens: Arc<[u32]>,
    last_used: u64,
}

#[derive(Debug, Default)]
struct Inner {
    entries: HashMap<u64, Entry>,
    tokens: usize,
    clock: u64,
    evictions: u64,
}

/// A shared, bounded prefix-tokenization cache for one tokenizer.
#[derive(Debug)]
pub struct PrefixCache {
    /// Leftmost-longest automaton over the raw-text added tokens, exactly as
    /// `tokenizers` scans them; `safe[i]` says whether a cut after pattern
    /// `i` is sound.
    added: Option<AhoCorasick>,
    safe: Vec<bool>,
    /// False when the tokenizer's configuration makes cuts unsound.
    enabled: bool,
    config: PrefixCacheConfig,
    inner: Mutex<Inner>,
    hits: AtomicU64,
    misses: AtomicU64,
    reused_tokens: AtomicU64,
}

/// Where texts of one tokenizer may be cut: its raw-text added tokens in
/// id order (with whether a cut right after each is sound), and whether the
/// start of a piece is encoded like any other position. Taken from the
/// `tokenizers` tokenizer once, at load time.
#[derive(Clone, Debug)]
pub struct PrefixRules {
    raw: Vec<(String, bool)>,
    start_free: bool,
}

impl PrefixRules {
    /// The rules of `tokenizer`.
    pub fn of(tokenizer: &tokenizers::Tokenizer) -> PrefixRules {
        let decoder = tokenizer.get_added_tokens_decoder();
        let mut ids: Vec<&u32> = decoder.keys().collect();
        ids.sort();
        let raw = ids
            .iter()
            .filter_map(|id| decoder.get(id))
            .filter(|t| !t.normalized)
            .map(|t| (t.content.clone(), !t.rstrip && !t.single_word && !t.content.is_empty()))
            .collect();
        PrefixRules { raw, start_free: first_piece_is_special_free(tokenizer) }
    }
}

impl PrefixCache {
    /// A cache for `tokenizer`'s cut points.
    pub fn new(tokenizer: &tokenizers::Tokenizer, config: PrefixCacheConfig) -> PrefixCache {
        PrefixCache::with_rules(&PrefixRules::of(tokenizer), config)
    }

    /// A cache for these cut points.
    pub fn with_rules(rules: &PrefixRules, config: PrefixCacheConfig) -> PrefixCache {
        let raw = &rules.raw;
        let safe = raw.iter().map(|t| t.1).collect();
        let added = AhoCorasickBuilder::new()
            .match_kind(MatchKind::LeftmostLongest)
            .build(raw.iter().map(|t| t.0.as_str()))
            .ok()
            .filter(|_| !raw.is_empty());
        let enabled = added.is_some() && rules.start_free;
        PrefixCache {
            added,
            safe,
            enabled,
            config,
            inner: Mutex::new(Inner::default()),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            reused_tokens: AtomicU64::new(0),
        }
    }

    /// Whether cuts are sound for this tokenizer; when false every call
    /// simply encodes the whole text.
    pub fn is_enabled(&self) -> bool {
        self.enabled
    }

    /// Byte offsets right after every added token where a cut is sound, in
    /// increasing order.
    pub fn cut_points(&self, text: &str) -> Vec<usize> {
        let Some(added) = &self.added else { return Vec::new() };
        added
            .find_iter(text)
            .filter(|m| self.safe.get(m.pattern().as_usize()).copied().unwrap_or(false))
            .map(|m| m.end())
            .collect()
    }

    /// Encodes `text` with `encode` (which must encode without adding
    /// special tokens), re-using the longest cached prefix and remembering
    /// the last cut points of this text for later prompts.
    pub fn encode<E>(
        &self,
        text: &str,
        mut encode: impl FnMut(&str) -> Result<Vec<u32>, E>,
    ) -> Result<Vec<u32>, E> {
        if !self.enabled {
            return encode(text);
        }
        let cuts = self.cut_points(text);
        if cuts.is_empty() {
            self.misses.fetch_add(1, Ordering::Relaxed);
            return encode(text);
        }
        let digests = prefix_digests(text, &cuts);

        // Longest remembered prefix of this text.
        let found = {
            let mut inner = self.lock();
            inner.clock += 1;
            let now = inner.clock;
            digests.iter().rev().find_map(|&(cut, digest)| {
                let entry = inner.entries.get_mut(&digest)?;
                (entry.n_bytes == cut).then(|| {
                    entry.last_used = now;
                    (cut, Arc::clone(&entry.tokens), entry.n_tokens)
                })
            })
        };
        let (start, mut tokens) = match &found {
            Some((cut, prefix, n)) => {
                self.hits.fetch_add(1, Ordering::Relaxed);
                self.reused_tokens.fetch_add(*n as u64, Ordering::Relaxed);
                let mut v = Vec::with_capacity(n + (text.len() - cut) / 3);
                v.extend_from_slice(prefix.get(..*n).unwrap_or(prefix));
                (*cut, v)
            }
            None => {
                self.misses.fetch_add(1, Ordering::Relaxed);
                (0, Vec::with_capacity(text.len() / 3))
            }
        };

        // Encode the rest, stopping at the last few cut points so that we
        // know how many tokens each of them ends.
        let keep = self.config.boundaries_per_prompt.max(1);
        let new_cuts: Vec<(usize, u64)> =
            digests.iter().copied().filter(|&(cut, _)| cut > start).collect();
        let remember = &new_cuts[new_cuts.len().saturating_sub(keep)..];
        let mut pos = start;
        let mut marks = Vec::with_capacity(remember.len());
        for &(cut, digest) in remember {
            tokens.extend(encode(text.get(pos..cut).unwrap_or(""))?);
            marks.push((cut, digest, tokens.len()));
            pos = cut;
        }
        if pos < text.len() {
            tokens.extend(encode(text.get(pos..).unwrap_or(""))?);
        }

        if !marks.is_empty() {
            let last_mark = marks.last().map_or(0, |m| m.2);
            let shared: Arc<[u32]> = Arc::from(tokens.get(..last_mark).unwrap_or(&tokens));
            self.remember(&marks, &shared);
        }
        Ok(tokens)
    }

    fn remember(&self, marks: &[(usize, u64, usize)], shared: &Arc<[u32]>) {
        let mut inner = self.lock();
        inner.clock += 1;
        let now = inner.clock;
        for &(cut, digest, n_tokens) in marks {
            let entry =
                Entry { n_bytes: cut, n_tokens, tokens: Arc::clone(shared), last_used: now };
            if let Some(old) = inner.entries.insert(digest, entry) {
                inner.tokens -= old.n_tokens;
            }
            inner.tokens += n_tokens;
        }
        if inner.tokens > self.config.max_tokens {
            evict(&mut inner, self.config.max_tokens);
        }
    }

    /// Current counters.
    pub fn stats(&self) -> PrefixCacheStats {
        let inner = self.lock();
        PrefixCacheStats {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            reused_tokens: self.reused_tokens.load(Ordering::Relaxed),
            entries: inner.entries.len() as u64,
            tokens: inner.tokens as u64,
            evictions: inner.evictions,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic while holding the lock cannot leave `Inner` inconsistent
        // in a way that matters (worst case: a wrong token count), so a
        // poisoned lock is simply taken over.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// `(cut, digest of text[..cut])` for every cut, in one pass over the text.
fn prefix_digests(text: &str, cuts: &[usize]) -> Vec<(usize, u64)> {
    let mut hasher = Xxh3::new();
    let mut pos = 0;
    cuts.iter()
        .map(|&cut| {
            hasher.update(text.as_bytes().get(pos..cut).unwrap_or(&[]));
            pos = cut;
            (cut, hasher.digest())
        })
        .collect()
}

/// Drops the least recently used entries until the budget holds, with
/// headroom so that eviction runs rarely (amortised O(1) per insert).
fn evict(inner: &mut Inner, max_tokens: usize) {
    let target = max_tokens - max_tokens / 8;
    let mut by_age: Vec<(u64, u64)> =
        inner.entries.iter().map(|(k, e)| (e.last_used, *k)).collect();
    by_age.sort_unstable();
    for (_, key) in by_age {
        if inner.tokens <= target {
            break;
        }
        if let Some(e) = inner.entries.remove(&key) {
            inner.tokens -= e.n_tokens;
            inner.evictions += 1;
        }
    }
}

/// Pre-tokenizers and normalizers that add a prefix space (or otherwise
/// treat the start of a string specially) make a suffix encode differently
/// on its own than inside the whole text.
fn first_piece_is_special_free(tokenizer: &tokenizers::Tokenizer) -> bool {
    let parts = [
        serde_json::to_value(tokenizer.get_pre_tokenizer()).ok(),
        serde_json::to_value(tokenizer.get_normalizer()).ok(),
    ];
    !parts.iter().flatten().any(start_sensitive)
}

fn start_sensitive(v: &serde_json::Value) -> bool {
    match v {
        serde_json::Value::Object(map) => map.iter().any(|(k, val)| {
            (k == "add_prefix_space" && val == &serde_json::Value::Bool(true))
                || (k == "prepend_scheme" && val.as_str().is_some_and(|s| s != "never"))
                || (k == "type" && val.as_str() == Some("Prepend"))
                || start_sensitive(val)
        }),
        serde_json::Value::Array(items) => items.iter().any(start_sensitive),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_sensitive_configs_are_detected() {
        let byte_level = serde_json::json!({"type": "ByteLevel", "add_prefix_space": false});
        assert!(!start_sensitive(&byte_level));
        let meta = serde_json::json!({"type": "Sequence", "pretokenizers": [
            {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first"}]});
        assert!(start_sensitive(&meta));
        let prepend = serde_json::json!({"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "▁"}]});
        assert!(start_sensitive(&prepend));
    }

    #[test]
    fn eviction_respects_the_budget_and_keeps_recent_entries() {
        let mut inner = Inner::default();
        let tokens: Arc<[u32]> = Arc::from(vec![0u32; 10]);
        for i in 0..100u64 {
            inner.entries.insert(
                i,
                Entry { n_bytes: 1, n_tokens: 10, tokens: Arc::clone(&tokens), last_used: i },
            );
            inner.tokens += 10;
        }
        evict(&mut inner, 500);
        assert!(inner.tokens <= 500 - 500 / 8);
        assert!(inner.entries.contains_key(&99), "the newest entry survives");
        assert!(!inner.entries.contains_key(&0), "the oldest entry goes first");
        assert_eq!(inner.evictions, 100 - inner.entries.len() as u64);
    }

    #[test]
    fn digests_cover_exact_prefixes() {
        let text = "ab|cd|ef";
        let d = prefix_digests(text, &[3, 6]);
        assert_eq!(d[0].1, xxhash_rust::xxh3::xxh3_64(b"ab|"));
        assert_eq!(d[1].1, xxhash_rust::xxh3::xxh3_64(b"ab|cd|"));
    }
}
