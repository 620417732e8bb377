//! Engine block hashes, computed the way vLLM computes them: a chain of
//! sha256 digests over (parent hash, block tokens, extra keys), rooted at a
//! seeded `NONE_HASH`.
//!
//! vLLM (`vllm/v1/core/kv_cache_utils.py`, `hash_block_tokens`, `NONE_HASH`,
//! `sha256_cbor`) hashes the CBOR encoding of the tuple
//! `(parent_hash, token_ids, extra_keys)`; its root `NONE_HASH` is random per
//! process unless `PYTHONHASHSEED` is set. We keep the properties the router
//! must not depend on (chained, seeded, opaque, different between replicas)
//! but use a simpler serialisation, which is part of no wire format:
//!
//! ```text
//! NONE_HASH  = sha256("kvgate-sim NONE_HASH" || seed as 8 bytes little-endian)
//! block_hash = sha256(parent (32 bytes, NONE_HASH for the first block)
//!                     || n_tokens as u32 LE || each token as u32 LE
//!                     || n_extra_key_bytes as u32 LE || extra_key_bytes)
//! extra_key_bytes = for each of (LoRA name, cache_salt on block 0 only)
//!                   present: tag byte (1 LoRA, 2 salt) || len as u32 LE || UTF-8
//! ```
//!
//! The extra keys are vLLM 0.33's (`generate_block_hash_extra_keys`): the
//! adapter on every block, the salt on the first. Events publish them as vLLM
//! does (`to_event_extra_keys`): `lora_name`, and per block
//! `[lora_name?, cache_salt?]` or nil ([`CacheIdentity::event_extra_key`]).
//!
//! Published as a u64 (the last 8 bytes, big-endian, as vLLM's
//! `VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1` does) or as the 32 raw bytes.

use std::hash::{BuildHasher, Hasher};

use kvgate_events::BlockHash;
use sha2::{Digest, Sha256};

/// A full 32-byte engine block hash; the engine's internal identity of a block.
pub type Hash32 = [u8; 32];

/// What besides its tokens names a request's blocks: its LoRA adapter and
/// its `cache_salt`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CacheIdentity {
    /// The adapter's name (the request's `model`), if it names one.
    pub lora_name: Option<String>,
    /// `cache_salt`; `None` or empty is no salt.
    pub cache_salt: Option<String>,
}

impl CacheIdentity {
    /// Neither adapter nor salt: blocks hash as plain tokens.
    pub fn is_plain(&self) -> bool {
        self.lora_name.is_none() && self.salt().is_none()
    }

    fn salt(&self) -> Option<&str> {
        self.cache_salt.as_deref().filter(|s| !s.is_empty())
    }

    /// The parts that enter block `index`'s hash, in vLLM's order.
    fn parts(&self, index: usize) -> impl Iterator<Item = (u8, &str)> {
        let salt = if index == 0 { self.salt() } else { None };
        self.lora_name.as_deref().map(|l| (1u8, l)).into_iter().chain(salt.map(|s| (2u8, s)))
    }

    /// Block `index`'s entry in a `BlockStored`'s `extra_keys`, as vLLM 0.33
    /// publishes it: the untagged values, or nil when there are none.
    pub fn event_extra_key(&self, index: usize) -> rmpv::Value {
        let items: Vec<rmpv::Value> = self.parts(index).map(|(_, v)| v.into()).collect();
        if items.is_empty() {
            rmpv::Value::Nil
        } else {
            rmpv::Value::Array(items)
        }
    }
}

/// Computes chained block hashes for one engine process.
#[derive(Clone, Debug)]
pub struct BlockHasher {
    none_hash: Hash32,
    hash_bytes: bool,
}

impl BlockHasher {
    /// A hasher rooted at a `NONE_HASH` derived from `seed`; `None` draws a
    /// random seed for this process (std's `RandomState`, no extra crate).
    pub fn new(seed: Option<u64>, hash_bytes: bool) -> BlockHasher {
        let seed = seed.unwrap_or_else(random_seed);
        let mut h = Sha256::new();
        h.update(b"kvgate-sim NONE_HASH");
        h.update(seed.to_le_bytes());
        BlockHasher { none_hash: h.finalize().into(), hash_bytes }
    }

    /// The root every first block chains from.
    pub fn none_hash(&self) -> &Hash32 {
        &self.none_hash
    }

    /// The hash of one block given its parent (`None` for the first block).
    pub fn hash_block(&self, parent: Option<&Hash32>, tokens: &[u32]) -> Hash32 {
        self.hash_keyed_block(parent, tokens, &CacheIdentity::default(), 0)
    }

    /// The hash of block `index` of a request with `identity`.
    pub fn hash_keyed_block(
        &self,
        parent: Option<&Hash32>,
        tokens: &[u32],
        identity: &CacheIdentity,
        index: usize,
    ) -> Hash32 {
        let mut h = Sha256::new();
        h.update(parent.unwrap_or(&self.none_hash));
        h.update((tokens.len() as u32).to_le_bytes());
        for t in tokens {
            h.update(t.to_le_bytes());
        }
        let mut extra = Vec::new();
        for (tag, value) in identity.parts(index) {
            extra.push(tag);
            extra.extend_from_slice(&(value.len() as u32).to_le_bytes());
            extra.extend_from_slice(value.as_bytes());
        }
        h.update((extra.len() as u32).to_le_bytes());
        h.update(&extra);
        h.finalize().into()
    }

    /// Extends `hashes` with the hashes of every full block of `tokens` not
    /// hashed yet.
    pub fn extend_full_blocks(&self, hashes: &mut Vec<Hash32>, tokens: &[u32], block_size: usize) {
        self.extend_keyed_blocks(hashes, tokens, block_size, &CacheIdentity::default());
    }

    /// [`Self::extend_full_blocks`] for a request with `identity`.
    pub fn extend_keyed_blocks(
        &self,
        hashes: &mut Vec<Hash32>,
        tokens: &[u32],
        block_size: usize,
        identity: &CacheIdentity,
    ) {
        let Some(n_full) = tokens.len().checked_div(block_size) else { return };
        while hashes.len() < n_full {
            let i = hashes.len();
            let parent = hashes.last().copied();
            let block = &tokens[i * block_size..(i + 1) * block_size];
            hashes.push(self.hash_keyed_block(parent.as_ref(), block, identity, i));
        }
    }

    /// The hash as published in events: u64 ints or 32 bytes.
    pub fn publish(&self, hash: &Hash32) -> BlockHash {
        if self.hash_bytes {
            BlockHash::Bytes(hash.to_vec())
        } else {
            BlockHash::Int(to_u64(hash))
        }
    }
}

/// The last 8 bytes, big-endian: vLLM's int form of a sha256 block hash.
pub fn to_u64(hash: &Hash32) -> u64 {
    let mut last = [0u8; 8];
    last.copy_from_slice(&hash[24..]);
    u64::from_be_bytes(last)
}

fn random_seed() -> u64 {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(0x6b76_6761_7465_7369);
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chained_and_seeded() {
        let a = BlockHasher::new(Some(1), false);
        let b = BlockHasher::new(Some(1), false);
        let c = BlockHasher::new(Some(2), false);
        let t = [1u32, 2, 3, 4];
        assert_eq!(a.hash_block(None, &t), b.hash_block(None, &t));
        assert_ne!(a.hash_block(None, &t), c.hash_block(None, &t));
        let p1 = a.hash_block(None, &[9, 9, 9, 9]);
        let p2 = a.hash_block(None, &[8, 8, 8, 8]);
        assert_ne!(a.hash_block(Some(&p1), &t), a.hash_block(Some(&p2), &t));
    }

    #[test]
    fn random_seeds_differ() {
        let t = [1u32, 2];
        let a = BlockHasher::new(None, false).hash_block(None, &t);
        let b = BlockHasher::new(None, false).hash_block(None, &t);
        assert_ne!(a, b);
    }

    #[test]
    fn publish_forms() {
        let h = BlockHasher::new(Some(0), false);
        let x = h.hash_block(None, &[5]);
        assert_eq!(h.publish(&x), BlockHash::Int(u64::from_be_bytes(x[24..].try_into().unwrap())));
        let hb = BlockHasher::new(Some(0), true);
        assert_eq!(hb.publish(&x), BlockHash::Bytes(x.to_vec()));
    }

    #[test]
    fn extend_only_full_blocks() {
        let h = BlockHasher::new(Some(3), false);
        let mut v = Vec::new();
        h.extend_full_blocks(&mut v, &[1, 2, 3, 4, 5], 2);
        assert_eq!(v.len(), 2);
        assert_eq!(v[1], h.hash_block(Some(&v[0]), &[3, 4]));
    }

    #[test]
    fn salt_and_adapter_change_the_hashes_as_in_vllm() {
        let h = BlockHasher::new(Some(1), false);
        let tokens: Vec<u32> = (0..8).collect();
        let hashes = |identity: &CacheIdentity| {
            let mut v = Vec::new();
            h.extend_keyed_blocks(&mut v, &tokens, 4, identity);
            v
        };
        let plain = hashes(&CacheIdentity::default());
        assert_eq!(plain, {
            let mut v = Vec::new();
            h.extend_full_blocks(&mut v, &tokens, 4);
            v
        });
        let salted = |s: &str| CacheIdentity { lora_name: None, cache_salt: Some(s.into()) };
        let a = hashes(&salted("a"));
        assert_ne!(a[0], plain[0]);
        assert_ne!(a[1], plain[1], "the salt reaches later blocks through the chain");
        assert_ne!(a, hashes(&salted("b")));
        assert_eq!(hashes(&salted("")), plain);
        let lora = CacheIdentity { lora_name: Some("ad".into()), cache_salt: Some("a".into()) };
        assert_eq!(lora.event_extra_key(0), rmpv::Value::Array(vec!["ad".into(), "a".into()]));
        assert_eq!(lora.event_extra_key(1), rmpv::Value::Array(vec!["ad".into()]));
        assert_eq!(salted("a").event_extra_key(1), rmpv::Value::Nil);
    }
}
