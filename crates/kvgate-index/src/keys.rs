//! Our own content keys for KV blocks, chained through the parent block.
//!
//! vLLM's block hash depends on the engine's hash function, seed and version
//! (FIELD.md §1 "Hashing"), so two replicas of one model can name the same
//! tokens differently. The index is therefore keyed by [`BlockKey`], a hash of
//! the token contents that we compute ourselves. [`chain_key`] is the one and
//! only definition of that hash: the query side ([`block_keys`]) and event
//! application both go through it, so they can never disagree.
//!
//! Definition (stable; changing it invalidates nothing persistent, but keep
//! the unit tests that pin it in step):
//!
//! ```text
//! seed_i = parent_key                                   if no salt
//!        = xxh3_64_with_seed(salt_bytes, parent_key)    otherwise
//! key_i  = xxh3_64_with_seed(le_bytes(block_tokens), seed_i)
//! salt_bytes = "kvgate/salt/v1"
//!              ++ [0x01, len(lora_name) as u64 LE, lora_name]   if lora_name is Some
//!              ++ [0x02, msgpack(extra_key')]                  if extra_key' is present
//! extra_key' = extra_key without a leading element equal to lora_name
//! parent_key of the first block = ROOT_KEY
//! ```
//!
//! An extra key that is msgpack nil or an empty array counts as absent, so a
//! store whose `extra_keys` are all `null` keys the same as a plain prompt.
//! vLLM 0.33 publishes the adapter's name both as `lora_name` and as the first
//! element of every block's extra key (`to_event_extra_keys` in
//! `v1/core/kv_cache_utils.py`); older releases put it in `lora_name` only.
//! Dropping the repeat makes both key the same, and lets the query side
//! ([`request_block_keys`]) build the key from the request alone.

use std::io;

use xxhash_rust::xxh3::{xxh3_64_with_seed, Xxh3};

/// Our content key for one full KV block: a 64-bit hash of the block's tokens,
/// LoRA name and extra keys, chained through its parent's key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockKey(pub u64);

impl BlockKey {
    /// The raw 64-bit value.
    pub fn get(self) -> u64 {
        self.0
    }
}

/// The parent key of the first block of every sequence ("kvgate" + version).
pub const ROOT_KEY: BlockKey = BlockKey(0x6b76_6761_7465_0001);

/// Domain separator for the salt, so salted seeds cannot mimic a bare parent.
const SALT_DOMAIN: &[u8] = b"kvgate/salt/v1";

/// Tokens hashed through the stack buffer; longer blocks stream.
const STACK_TOKENS: usize = 64;

/// The key of one block given its parent's key: the single definition of our
/// content hash (see the module docs).
///
/// `block_tokens` are the block's tokens (normally `block_size` of them).
/// `extra_key` is the block's entry from vLLM's `extra_keys` (multimodal ids,
/// cache salt, ...); nil or an empty array counts as absent.
pub fn chain_key(
    parent: BlockKey,
    block_tokens: &[u32],
    lora_name: Option<&str>,
    extra_key: Option<&rmpv::Value>,
) -> BlockKey {
    let extra_key = extra_key.and_then(|v| Extra::of(v, lora_name));
    let seed = if lora_name.is_none() && extra_key.is_none() {
        parent.0
    } else {
        salted_seed(parent, lora_name, extra_key)
    };
    BlockKey(hash_tokens(block_tokens, seed))
}

/// Keys of every full block of `tokens`, chained from [`ROOT_KEY`]. A trailing
/// partial block is ignored; `block_size == 0` gives no keys.
pub fn block_keys(tokens: &[u32], block_size: usize, lora_name: Option<&str>) -> Vec<BlockKey> {
    let mut keys = Vec::new();
    extend_block_keys(ROOT_KEY, tokens, block_size, lora_name, &[], &mut keys);
    keys
}

/// Like [`block_keys`] with one extra key per block (multimodal ids, cache
/// salt...), as vLLM publishes them in `extra_keys`. Blocks beyond
/// `extra_keys.len()` have none.
pub fn block_keys_with_extra(
    tokens: &[u32],
    block_size: usize,
    lora_name: Option<&str>,
    extra_keys: &[rmpv::Value],
) -> Vec<BlockKey> {
    let mut keys = Vec::new();
    extend_block_keys(ROOT_KEY, tokens, block_size, lora_name, extra_keys, &mut keys);
    keys
}

/// Appends to `out` the keys of every full block of `tokens`, chained from
/// `parent`, reusing the caller's buffer. Returns the key of the last block
/// appended (or `parent` when none was).
pub fn extend_block_keys(
    parent: BlockKey,
    tokens: &[u32],
    block_size: usize,
    lora_name: Option<&str>,
    extra_keys: &[rmpv::Value],
    out: &mut Vec<BlockKey>,
) -> BlockKey {
    if block_size == 0 {
        return parent;
    }
    out.reserve(tokens.len() / block_size);
    let mut key = parent;
    for (i, block) in tokens.chunks_exact(block_size).enumerate() {
        key = chain_key(key, block, lora_name, extra_keys.get(i));
        out.push(key);
    }
    key
}

/// Keys of every full block of a request's prompt, with what vLLM 0.33 adds
/// to its block hashes from the request itself
/// (`generate_block_hash_extra_keys`): the LoRA adapter on every block, and
/// `cache_salt` on the first block only. An empty salt is no salt (vLLM
/// rejects it, and would ignore it). Events of the same blocks carry the same
/// keys in `lora_name` and `extra_keys`, so both sides agree.
pub fn request_block_keys(
    tokens: &[u32],
    block_size: usize,
    lora_name: Option<&str>,
    cache_salt: Option<&str>,
) -> Vec<BlockKey> {
    let salt = cache_salt.filter(|s| !s.is_empty());
    let Some(salt) = salt else {
        return block_keys(tokens, block_size, lora_name);
    };
    let mut keys = Vec::new();
    if block_size == 0 || tokens.len() < block_size {
        return keys;
    }
    // As vLLM publishes the first block's extra key: (lora name?, salt).
    let first: Vec<rmpv::Value> =
        lora_name.map(rmpv::Value::from).into_iter().chain([salt.into()]).collect();
    let first =
        chain_key(ROOT_KEY, &tokens[..block_size], lora_name, Some(&rmpv::Value::Array(first)));
    keys.push(first);
    extend_block_keys(first, &tokens[block_size..], block_size, lora_name, &[], &mut keys);
    keys
}

/// A block's extra key as it enters the hash: absent when nil or empty, and
/// without a leading repeat of the LoRA name (see the module docs).
#[derive(Clone, Copy)]
enum Extra<'a> {
    Items(&'a [rmpv::Value]),
    Value(&'a rmpv::Value),
}

impl<'a> Extra<'a> {
    fn of(value: &'a rmpv::Value, lora_name: Option<&str>) -> Option<Extra<'a>> {
        match value {
            rmpv::Value::Nil => None,
            rmpv::Value::Array(items) => {
                let items = match (items.split_first(), lora_name) {
                    (Some((head, rest)), Some(name)) if head.as_str() == Some(name) => rest,
                    _ => items.as_slice(),
                };
                (!items.is_empty()).then_some(Extra::Items(items))
            }
            other => Some(Extra::Value(other)),
        }
    }

    /// msgpack of the value (an array: its header, then each element, the
    /// same bytes as encoding the array itself).
    fn write(self, out: &mut HashWriter) {
        // Writing into a hasher cannot fail; an encoder error could only
        // truncate the input, which still hashes deterministically.
        match self {
            Extra::Items(items) => {
                let _ignored = rmp::encode::write_array_len(out, items.len() as u32);
                for item in items {
                    let _ignored = rmpv::encode::write_value(out, item);
                }
            }
            Extra::Value(value) => {
                let _ignored = rmpv::encode::write_value(out, value);
            }
        }
    }
}

/// LoRA names up to this many bytes take the one-shot path of [`salted_seed`].
const STACK_SALT_NAME: usize = 200;

fn salted_seed(parent: BlockKey, lora_name: Option<&str>, extra_key: Option<Extra<'_>>) -> u64 {
    // The common LoRA block (no extra key of its own): the same bytes hashed
    // one-shot from a stack buffer, which xxh3 defines to equal streaming
    // and costs a fraction of a streaming hasher's setup.
    if let (Some(name), None) = (lora_name, extra_key) {
        if name.len() <= STACK_SALT_NAME {
            let mut buf = [0u8; SALT_DOMAIN.len() + 9 + STACK_SALT_NAME];
            let mut n = SALT_DOMAIN.len();
            buf[..n].copy_from_slice(SALT_DOMAIN);
            buf[n] = 0x01;
            buf[n + 1..n + 9].copy_from_slice(&(name.len() as u64).to_le_bytes());
            n += 9;
            buf[n..n + name.len()].copy_from_slice(name.as_bytes());
            return xxh3_64_with_seed(&buf[..n + name.len()], parent.0);
        }
    }
    salted_seed_streaming(parent, lora_name, extra_key)
}

fn salted_seed_streaming(
    parent: BlockKey,
    lora_name: Option<&str>,
    extra_key: Option<Extra<'_>>,
) -> u64 {
    let mut hasher = HashWriter(Xxh3::with_seed(parent.0));
    hasher.0.update(SALT_DOMAIN);
    if let Some(name) = lora_name {
        hasher.0.update(&[0x01]);
        hasher.0.update(&(name.len() as u64).to_le_bytes());
        hasher.0.update(name.as_bytes());
    }
    if let Some(extra) = extra_key {
        hasher.0.update(&[0x02]);
        extra.write(&mut hasher);
    }
    hasher.0.digest()
}

/// xxh3 of the tokens' little-endian bytes. Short blocks (the common 16
/// tokens) go through a stack buffer and the one-shot hash; longer ones
/// stream, which xxh3 defines to give the same value.
fn hash_tokens(tokens: &[u32], seed: u64) -> u64 {
    let mut buf = [0u8; STACK_TOKENS * 4];
    if tokens.len() <= STACK_TOKENS {
        let n = fill_le_bytes(&mut buf, tokens);
        xxh3_64_with_seed(&buf[..n], seed)
    } else {
        let mut hasher = Xxh3::with_seed(seed);
        for chunk in tokens.chunks(STACK_TOKENS) {
            let n = fill_le_bytes(&mut buf, chunk);
            hasher.update(&buf[..n]);
        }
        hasher.digest()
    }
}

/// Writes up to `STACK_TOKENS` tokens as little-endian bytes into `buf` and
/// returns the byte count. A plain index loop on purpose: it compiles to a
/// few vector moves even where iterator adapters are not inlined (the bench
/// profile builds with 16 codegen units and no LTO).
#[inline(always)]
#[allow(clippy::needless_range_loop)]
fn fill_le_bytes(buf: &mut [u8; STACK_TOKENS * 4], tokens: &[u32]) -> usize {
    let n = tokens.len().min(STACK_TOKENS);
    for i in 0..n {
        let bytes = tokens[i].to_le_bytes();
        buf[4 * i] = bytes[0];
        buf[4 * i + 1] = bytes[1];
        buf[4 * i + 2] = bytes[2];
        buf[4 * i + 3] = bytes[3];
    }
    n * 4
}

/// Lets the msgpack encoder write straight into the hasher, no allocation.
struct HashWriter(Xxh3);

impl io::Write for HashWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.update(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn le_bytes(tokens: &[u32]) -> Vec<u8> {
        tokens.iter().flat_map(|t| t.to_le_bytes()).collect()
    }

    #[test]
    fn unsalted_key_is_xxh3_of_le_tokens_seeded_with_parent() {
        let tokens: Vec<u32> = (0..16).collect();
        let key = chain_key(ROOT_KEY, &tokens, None, None);
        assert_eq!(key.0, xxh3_64_with_seed(&le_bytes(&tokens), ROOT_KEY.0));
    }

    #[test]
    fn long_blocks_stream_to_the_same_value_as_one_shot() {
        for len in [63usize, 64, 65, 128, 129, 1000] {
            let tokens: Vec<u32> = (0..len as u32).map(|t| t.wrapping_mul(2_654_435_761)).collect();
            let key = chain_key(BlockKey(7), &tokens, None, None);
            assert_eq!(key.0, xxh3_64_with_seed(&le_bytes(&tokens), 7), "len {len}");
        }
    }

    #[test]
    fn block_keys_chain_full_blocks_and_ignore_the_tail() {
        let tokens: Vec<u32> = (0..40).collect();
        let keys = block_keys(&tokens, 16, None);
        assert_eq!(keys.len(), 2);
        let first = chain_key(ROOT_KEY, &tokens[..16], None, None);
        assert_eq!(keys[0], first);
        assert_eq!(keys[1], chain_key(first, &tokens[16..32], None, None));
        assert!(block_keys(&tokens, 0, None).is_empty());
        assert!(block_keys(&tokens[..15], 16, None).is_empty());
    }

    #[test]
    fn same_tokens_under_different_parents_differ() {
        let tokens = [1u32; 16];
        let keys = block_keys(&[1u32; 32], 16, None);
        assert_ne!(keys[0], keys[1]);
        assert_eq!(keys[1], chain_key(keys[0], &tokens, None, None));
    }

    #[test]
    fn lora_name_and_extra_keys_are_part_of_the_identity() {
        let tokens = [5u32; 16];
        let plain = chain_key(ROOT_KEY, &tokens, None, None);
        let lora_a = chain_key(ROOT_KEY, &tokens, Some("a"), None);
        let lora_b = chain_key(ROOT_KEY, &tokens, Some("b"), None);
        let lora_empty = chain_key(ROOT_KEY, &tokens, Some(""), None);
        let salt = rmpv::Value::from("salt");
        let salted = chain_key(ROOT_KEY, &tokens, None, Some(&salt));
        let keys = [plain, lora_a, lora_b, lora_empty, salted];
        for (i, a) in keys.iter().enumerate() {
            for b in &keys[i + 1..] {
                assert_ne!(a, b);
            }
        }
    }

    #[test]
    fn nil_and_empty_extra_keys_count_as_absent() {
        let tokens = [9u32; 16];
        let plain = chain_key(ROOT_KEY, &tokens, Some("l"), None);
        let nil = rmpv::Value::Nil;
        let empty = rmpv::Value::Array(Vec::new());
        assert_eq!(chain_key(ROOT_KEY, &tokens, Some("l"), Some(&nil)), plain);
        assert_eq!(chain_key(ROOT_KEY, &tokens, Some("l"), Some(&empty)), plain);
        let with_nil_extras =
            block_keys_with_extra(&[9u32; 32], 16, Some("l"), &[rmpv::Value::Nil]);
        assert_eq!(with_nil_extras, block_keys(&[9u32; 32], 16, Some("l")));
    }

    #[test]
    fn extend_block_keys_continues_a_chain() {
        let tokens: Vec<u32> = (0..64).collect();
        let whole = block_keys(&tokens, 16, None);
        let mut out = Vec::new();
        let mid = extend_block_keys(ROOT_KEY, &tokens[..32], 16, None, &[], &mut out);
        let last = extend_block_keys(mid, &tokens[32..], 16, None, &[], &mut out);
        assert_eq!(out, whole);
        assert_eq!(Some(&last), whole.last());
    }

    #[test]
    fn request_keys_equal_what_vllm_0_33_events_carry() {
        let tokens: Vec<u32> = (0..48).collect();
        let s = |v: &str| rmpv::Value::from(v);
        let arr = rmpv::Value::Array;
        // LoRA and salt: (name, salt) on block 0, (name,) after it.
        let events = block_keys_with_extra(
            &tokens,
            16,
            Some("ad"),
            &[arr(vec![s("ad"), s("t1")]), arr(vec![s("ad")]), arr(vec![s("ad")])],
        );
        assert_eq!(request_block_keys(&tokens, 16, Some("ad"), Some("t1")), events);
        // Salt only: (salt,) on block 0, nothing after.
        let events = block_keys_with_extra(&tokens, 16, None, &[arr(vec![s("t1")])]);
        assert_eq!(request_block_keys(&tokens, 16, None, Some("t1")), events);
        // LoRA only, with or without the name repeated in the extra keys.
        let repeated = block_keys_with_extra(&tokens, 16, Some("ad"), &vec![arr(vec![s("ad")]); 3]);
        assert_eq!(repeated, block_keys(&tokens, 16, Some("ad")));
        assert_eq!(request_block_keys(&tokens, 16, Some("ad"), None), repeated);
        // Nothing: plain keys; an empty salt is no salt.
        assert_eq!(request_block_keys(&tokens, 16, None, Some("")), block_keys(&tokens, 16, None));
    }

    #[test]
    fn a_salt_separates_every_block_and_only_its_own_tenant_shares() {
        let tokens: Vec<u32> = (0..48).collect();
        let plain = request_block_keys(&tokens, 16, None, None);
        let a = request_block_keys(&tokens, 16, None, Some("a"));
        let a_again = request_block_keys(&tokens, 16, None, Some("a"));
        let b = request_block_keys(&tokens, 16, None, Some("b"));
        assert_eq!(a, a_again);
        for i in 0..3 {
            assert_ne!(a[i], plain[i]);
            assert_ne!(a[i], b[i]);
        }
        // A name that only looks like the adapter is not dropped.
        let other = rmpv::Value::Array(vec![rmpv::Value::from("x")]);
        assert_ne!(
            chain_key(ROOT_KEY, &tokens[..16], Some("ad"), Some(&other)),
            chain_key(ROOT_KEY, &tokens[..16], Some("ad"), None)
        );
        assert!(request_block_keys(&tokens[..15], 16, None, Some("a")).is_empty());
        assert!(request_block_keys(&tokens, 0, None, Some("a")).is_empty());
    }

    #[test]
    fn the_one_shot_lora_seed_equals_the_streaming_one() {
        for name in
            ["", "a", "adapter-a", &"x".repeat(STACK_SALT_NAME), &"y".repeat(STACK_SALT_NAME + 1)]
        {
            for parent in [ROOT_KEY, BlockKey(7)] {
                assert_eq!(
                    salted_seed(parent, Some(name), None),
                    salted_seed_streaming(parent, Some(name), None),
                    "{name:?}"
                );
            }
        }
    }
}
