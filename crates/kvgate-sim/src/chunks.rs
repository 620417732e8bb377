//! The CPU tier in vLLM 0.33's offloading-connector shape: chunks of
//! `blocks_per_chunk` GPU blocks, stored as a request computes them.
//!
//! vLLM's `OffloadingConnector` offloads a request's KV in chunks keyed by
//! the chunk's last block hash (`OffloadKey`), as soon as the chunk is
//! computed, and evicts whole chunks, least recently used first. Its
//! self-describing events (`offloading/events.py`) announce every block hash
//! of a stored chunk and fan a removal out to all of them. Two requests whose
//! shared prefix ends inside a chunk store two chunks that both announce the
//! shared blocks: a consumer must count announcements, which is what this
//! mode exists to exercise. Placeholder events name the chunk's key only.
//!
//! A block is on the CPU tier while some resident chunk holds it.

use rustc_hash::FxHashMap;

use crate::hash::Hash32;
use crate::lru_map::LruMap;

/// One offloaded chunk.
#[derive(Clone, Debug)]
pub(crate) struct Chunk {
    /// Its blocks' hashes; the last is the chunk's key.
    pub(crate) hashes: Vec<Hash32>,
    /// The hash of the block before the chunk, if any.
    pub(crate) parent: Option<Hash32>,
    /// The chunk's tokens.
    pub(crate) tokens: Vec<u32>,
}

impl Chunk {
    fn key(&self) -> Option<Hash32> {
        self.hashes.last().copied()
    }
}

/// The chunked CPU tier.
#[derive(Clone, Debug)]
pub(crate) struct CpuChunks {
    blocks_per_chunk: usize,
    /// Chunk key → chunk, least recently used first out.
    chunks: LruMap<Chunk>,
    /// Block hash → how many resident chunks hold it.
    refs: FxHashMap<Hash32, u32>,
}

impl CpuChunks {
    /// A tier of `num_blocks / blocks_per_chunk` chunks.
    pub(crate) fn new(num_blocks: usize, blocks_per_chunk: usize) -> CpuChunks {
        let blocks_per_chunk = blocks_per_chunk.max(1);
        CpuChunks {
            blocks_per_chunk,
            chunks: LruMap::new(num_blocks / blocks_per_chunk),
            refs: FxHashMap::default(),
        }
    }

    pub(crate) fn blocks_per_chunk(&self) -> usize {
        self.blocks_per_chunk
    }

    /// Distinct blocks on the tier.
    pub(crate) fn len(&self) -> usize {
        self.refs.len()
    }

    pub(crate) fn contains(&self, hash: &Hash32) -> bool {
        self.refs.contains_key(hash)
    }

    /// Marks the chunk keyed by `hash` most recently used (a load of it).
    pub(crate) fn touch(&mut self, hash: &Hash32) {
        self.chunks.touch(hash);
    }

    /// Stores `chunk` unless a chunk with its key is resident (then it is
    /// touched). Returns whether it was stored, and the chunk evicted to
    /// make room, if any.
    pub(crate) fn store(&mut self, chunk: Chunk) -> (bool, Option<Chunk>) {
        let Some(key) = chunk.key() else { return (false, None) };
        if self.chunks.capacity() == 0 {
            return (false, None);
        }
        if self.chunks.contains(&key) {
            self.chunks.touch(&key);
            return (false, None);
        }
        for h in &chunk.hashes {
            *self.refs.entry(*h).or_insert(0) += 1;
        }
        let (stored, evicted) = self.chunks.insert(key, chunk);
        if let Some((_, old)) = &evicted {
            for h in &old.hashes {
                if let Some(n) = self.refs.get_mut(h) {
                    *n -= 1;
                    if *n == 0 {
                        self.refs.remove(h);
                    }
                }
            }
        }
        (stored, evicted.map(|(_, old)| old))
    }

    pub(crate) fn clear(&mut self) {
        self.chunks.clear();
        self.refs.clear();
    }

    /// Every block hash on the tier.
    pub(crate) fn hashes(&self) -> impl Iterator<Item = &Hash32> {
        self.refs.keys()
    }

    pub(crate) fn check(&self) -> Result<(), String> {
        self.chunks.check()?;
        let mut refs: FxHashMap<Hash32, u32> = FxHashMap::default();
        for chunk in self.chunks.values() {
            for h in &chunk.hashes {
                *refs.entry(*h).or_insert(0) += 1;
            }
        }
        if refs != self.refs {
            return Err("cpu chunks: block references disagree with the chunks".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(n: u8) -> Hash32 {
        [n; 32]
    }

    fn chunk(hashes: &[u8]) -> Chunk {
        Chunk { hashes: hashes.iter().map(|&n| h(n)).collect(), parent: None, tokens: Vec::new() }
    }

    #[test]
    fn shared_blocks_stay_while_a_chunk_holds_them() {
        let mut tier = CpuChunks::new(4, 2);
        assert!(tier.store(chunk(&[1, 2])).0);
        assert!(tier.store(chunk(&[1, 3])).0);
        assert!(!tier.store(chunk(&[1, 3])).0, "same key: touched, not stored");
        assert_eq!(tier.len(), 3);
        // Full (two chunks): the least recently used, [1, 2], goes.
        let (stored, evicted) = tier.store(chunk(&[4, 5]));
        assert!(stored);
        assert_eq!(evicted.map(|c| c.hashes), Some(vec![h(1), h(2)]));
        assert!(tier.contains(&h(1)), "still held by [1, 3]");
        assert!(!tier.contains(&h(2)));
        tier.check().unwrap();
        tier.clear();
        assert_eq!(tier.len(), 0);
        tier.check().unwrap();
    }
}
