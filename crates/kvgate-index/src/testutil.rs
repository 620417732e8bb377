//! Event builders shared by the unit tests, so each test reads as the event
//! stream it feeds.

use kvgate_events::{BlockHash, BlockRemoved, BlockStored, Event, Medium};

use crate::{Index, ReplicaId, ReplicaSpec};

/// A full store of `hashes.len()` blocks of `block_size` tokens each.
pub(crate) fn stored(
    hashes: &[u64],
    parent: Option<u64>,
    tokens: &[u32],
    block_size: u32,
) -> Event {
    Event::Stored(BlockStored::new(
        hashes.iter().map(|h| BlockHash::Int(*h)).collect(),
        parent.map(BlockHash::Int),
        tokens.to_vec(),
        block_size,
    ))
}

/// A hashless CPU-offload placeholder store.
pub(crate) fn placeholder(hashes: &[u64], medium: Medium) -> Event {
    Event::Stored(BlockStored {
        medium: Some(medium),
        ..BlockStored::new(hashes.iter().map(|h| BlockHash::Int(*h)).collect(), None, Vec::new(), 0)
    })
}

/// A removal from `medium` (`None` is GPU).
pub(crate) fn removed(hashes: &[u64], medium: Option<Medium>) -> Event {
    Event::Removed(BlockRemoved {
        block_hashes: hashes.iter().map(|h| BlockHash::Int(*h)).collect(),
        medium,
        group_idx: None,
    })
}

/// Tokens of `n_blocks` blocks of 4 tokens, block `b` filled with `fill(b)`.
pub(crate) fn tokens(n_blocks: usize, fill: impl Fn(usize) -> u32) -> Vec<u32> {
    (0..n_blocks * 4).map(|t| fill(t / 4)).collect()
}

/// An index with `n` replicas of block size 4.
pub(crate) fn index_with(n: usize) -> (Index, Vec<ReplicaId>) {
    let mut index = Index::new();
    let ids = (0..n)
        .map(|i| index.add_replica(ReplicaSpec::new(format!("r{i}"), 0, 4)))
        .collect::<Result<Vec<_>, _>>()
        .unwrap_or_default();
    (index, ids)
}
