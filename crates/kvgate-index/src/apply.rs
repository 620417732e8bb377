//! Applying KV events to the index, with every anomaly counted.
//!
//! A store is keyed by our own chained hash ([`chain_key`]) starting from the
//! parent's key, which the replica's engine-hash map supplies; a store whose
//! parent is unknown is dropped whole so that the index stays prefix-closed.
//! Removals and hashless CPU placeholders name engine hashes, which the same
//! map resolves (a placeholder's parent, if any, is not needed and ignored). Nothing here fails or panics: problems become counters in
//! the returned [`ApplyOutcome`] and in the cumulative per-replica and global
//! [`Anomalies`](crate::Anomalies).
//!
//! Holder bits are kept exact when one replica maps the same key from several
//! engine hashes: the first holder sets the bit and later ones are counted in
//! `Replica::extra_holds`, so a removal clears the bit only with the last.

use std::collections::hash_map::Entry;
use std::time::Instant;

use kvgate_events::{Batch, BlockRemoved, BlockStored, Event, Medium};
use rustc_hash::FxHashMap;

use crate::capacity::{capacity_slack, enforce_capacity};
use crate::holders::{lose_tier, Holders};
use crate::index::{clear_slot, Index};
use crate::keys::{chain_key, BlockKey, ROOT_KEY};
use crate::replica::{EngineEntry, Replica, SEQ_LIMIT};
use crate::replica_id::ReplicaId;
use crate::stats::ApplyOutcome;
use crate::Tier;

impl Index {
    /// Applies one event from `replica`'s stream. `now` is recorded as the
    /// replica's last event time. Never fails: see [`ApplyOutcome`].
    pub fn apply(&mut self, replica: ReplicaId, event: &Event, now: Instant) -> ApplyOutcome {
        let mut outcome = ApplyOutcome::default();
        let slot = replica.index();
        match self.replicas.get_mut(slot).and_then(Option::as_mut) {
            None => outcome.anomalies.unknown_replica += 1,
            Some(state) => {
                state.last_event_at = Some(now);
                match event {
                    Event::Stored(stored) => {
                        apply_stored(state, &mut self.holders, slot, stored, now, &mut outcome);
                    }
                    Event::Removed(removed) => {
                        apply_removed(state, &mut self.holders, slot, removed, now, &mut outcome);
                    }
                    Event::AllCleared => {
                        outcome.blocks_removed += clear_slot(state, &mut self.holders, slot);
                    }
                }
                state.anomalies += outcome.anomalies;
            }
        }
        self.anomalies += outcome.anomalies;
        outcome
    }

    /// Applies `events` in order; the outcome is their sum.
    pub fn apply_events(
        &mut self,
        replica: ReplicaId,
        events: &[Event],
        now: Instant,
    ) -> ApplyOutcome {
        let mut outcome = ApplyOutcome::default();
        for event in events {
            outcome += self.apply(replica, event, now);
        }
        outcome
    }

    /// Applies every event of one published batch. The caller routes batches
    /// to replicas by (name, data-parallel rank); `batch.dp_rank` is not
    /// checked here.
    pub fn apply_batch(&mut self, replica: ReplicaId, batch: &Batch, now: Instant) -> ApplyOutcome {
        self.apply_events(replica, &batch.events, now)
    }
}

fn apply_stored(
    replica: &mut Replica,
    holders: &mut Holders,
    slot: usize,
    stored: &BlockStored,
    now: Instant,
    outcome: &mut ApplyOutcome,
) {
    let full_attention = stored.is_full_attention();
    if let Some(group_idx) = stored.group_idx {
        replica.note_group(group_idx, full_attention);
    }
    if !full_attention {
        outcome.anomalies.non_full_group_ignored += 1;
        return;
    }
    let tier = Medium::tier(stored.medium.as_ref());
    let expected_block_size = replica.spec.block_size;
    if stored.is_placeholder() {
        if stored.block_size != 0 && stored.block_size != expected_block_size {
            outcome.anomalies.block_size_mismatch += 1;
            return;
        }
        replica.reserve_seqs(stored.block_hashes.len());
        for hash in &stored.block_hashes {
            apply_placeholder(replica, holders, slot, hash.fold_u64(), tier, now, outcome);
        }
        return;
    }
    if stored.block_size == 0 {
        outcome.anomalies.malformed += 1;
        return;
    }
    if stored.block_size != expected_block_size {
        outcome.anomalies.block_size_mismatch += 1;
        return;
    }
    let block_size = stored.block_size as usize;
    let n_blocks = stored.block_hashes.len();
    let extra_keys = stored.extra_keys.as_deref().unwrap_or(&[]);
    if block_size.checked_mul(n_blocks) != Some(stored.token_ids.len())
        || (stored.extra_keys.is_some() && extra_keys.len() != n_blocks)
    {
        outcome.anomalies.malformed += 1;
        return;
    }
    let mut key = match &stored.parent_block_hash {
        None => ROOT_KEY,
        Some(parent) => match resolve(replica, parent.fold_u64(), now) {
            Some(key) => key,
            None => {
                outcome.anomalies.unknown_parent += 1;
                return;
            }
        },
    };
    // The deprecated lora_id alone (vLLM 0.11) still separates adapter blocks
    // from base-model blocks, under a name no real adapter has.
    let lora_id_name;
    let lora_name = match (&stored.lora_name, stored.lora_id) {
        (Some(name), _) => Some(name.as_str()),
        (None, Some(id)) => {
            lora_id_name = format!("#lora_id={id}");
            Some(lora_id_name.as_str())
        }
        (None, None) => None,
    };
    let capacity = replica.capacity(tier);
    let limit = capacity.saturating_add(capacity_slack(capacity));
    replica.reserve_seqs(n_blocks);
    for (i, (hash, tokens)) in
        stored.block_hashes.iter().zip(stored.token_ids.chunks_exact(block_size)).enumerate()
    {
        let engine = hash.fold_u64();
        // An offloaded copy of a block this engine already named keeps the
        // key the GPU event gave it: vLLM 0.33's connector sends chunk stores
        // without extra keys ("deferred" in `offloading/events.py`), so a
        // recomputed key would drop the cache salt or the LoRA key.
        key = match (tier, resolve(replica, engine, now)) {
            (Tier::Cpu | Tier::Storage, Some(known)) => known,
            _ => chain_key(key, tokens, lora_name, extra_keys.get(i)),
        };
        store_block(replica, holders, slot, engine, key, tier, outcome);
        if replica.counts[tier as usize] > limit {
            outcome.anomalies.over_capacity_evictions +=
                enforce_capacity(replica, holders, slot, tier);
        }
    }
}

/// Stores one block with content `key` under engine hash `engine` in `tier`.
fn store_block(
    replica: &mut Replica,
    holders: &mut Holders,
    slot: usize,
    engine: u64,
    key: BlockKey,
    tier: Tier,
    outcome: &mut ApplyOutcome,
) {
    let tier_bit = 1u8 << (tier as u8);
    let fresh = EngineEntry::new(engine, key, tier_bit, replica.next_seq);
    let (entry, inserted) = replica.entries.get_or_insert(fresh);
    if inserted {
        bump_seq(&mut replica.next_seq);
        gain_tier(holders, &mut replica.extra_holds, key, slot, tier);
        replica.counts[tier as usize] += 1;
    } else if entry.key() == key {
        if entry.tiers() & tier_bit == 0 {
            entry.set(entry.tiers() | tier_bit, bump_seq(&mut replica.next_seq));
            gain_tier(holders, &mut replica.extra_holds, key, slot, tier);
            replica.counts[tier as usize] += 1;
        } else {
            count_repeat(&mut replica.repeats, engine, tier);
        }
    } else {
        // Same engine hash, other contents: the newer store wins, and the old
        // contents' announcements go with them.
        outcome.anomalies.hash_conflict += 1;
        for old_tier in [Tier::Cpu, Tier::Storage] {
            replica.repeats.remove(&(engine, old_tier as u8));
        }
        let (old_key, old_tiers) = (entry.key(), entry.tiers());
        for old_tier in Tier::ALL {
            if old_tiers & (1 << old_tier as u8) != 0 {
                lose_tier(holders, &mut replica.extra_holds, old_key, slot, old_tier);
                replica.counts[old_tier as usize] -= 1;
            }
        }
        *entry = EngineEntry::new(engine, key, tier_bit, bump_seq(&mut replica.next_seq));
        gain_tier(holders, &mut replica.extra_holds, key, slot, tier);
        replica.counts[tier as usize] += 1;
    }
    outcome.blocks_stored += 1;
}

/// A hashless store (CPU offload placeholder): adds `tier` to a block the
/// replica described, now or a moment ago (its GPU copy may be gone already:
/// see `recent.rs`).
fn apply_placeholder(
    replica: &mut Replica,
    holders: &mut Holders,
    slot: usize,
    engine: u64,
    tier: Tier,
    now: Instant,
    outcome: &mut ApplyOutcome,
) {
    let key = match replica.entries.get(engine) {
        Some(entry) => entry.key(),
        None => match replica.recent.get(engine, now) {
            Some(key) => key,
            None => {
                outcome.anomalies.unknown_placeholder += 1;
                return;
            }
        },
    };
    store_block(replica, holders, slot, engine, key, tier, outcome);
    outcome.anomalies.over_capacity_evictions += enforce_capacity(replica, holders, slot, tier);
}

/// The content key of an engine hash the replica holds, or removed within
/// the last [`RECENT_TTL`](crate::RECENT_TTL).
fn resolve(replica: &mut Replica, hash: u64, now: Instant) -> Option<BlockKey> {
    match replica.entries.get(hash) {
        Some(entry) => Some(entry.key()),
        None => replica.recent.get(hash, now),
    }
}

/// One more announcement of a block already held in `tier`. Counted for the
/// offloading tiers only (see `Replica::repeats`).
fn count_repeat(repeats: &mut FxHashMap<(u64, u8), u32>, engine: u64, tier: Tier) {
    if tier != Tier::Gpu {
        *repeats.entry((engine, tier as u8)).or_insert(0) += 1;
    }
}

fn apply_removed(
    replica: &mut Replica,
    holders: &mut Holders,
    slot: usize,
    removed: &BlockRemoved,
    now: Instant,
    outcome: &mut ApplyOutcome,
) {
    if removed.group_idx.is_some_and(|group_idx| replica.is_non_full_group(group_idx)) {
        outcome.anomalies.non_full_group_ignored += 1;
        return;
    }
    let tier = Medium::tier(removed.medium.as_ref());
    let tier_bit = 1u8 << (tier as u8);
    for hash in &removed.block_hashes {
        let engine = hash.fold_u64();
        match replica.entries.get_mut(engine) {
            Some(entry) if entry.tiers() & tier_bit != 0 => {
                if let Entry::Occupied(mut repeats) = replica.repeats.entry((engine, tier as u8)) {
                    // Another chunk still announces this block in this tier.
                    *repeats.get_mut() -= 1;
                    if *repeats.get() == 0 {
                        repeats.remove();
                    }
                    continue;
                }
                let key = entry.key();
                let tiers = entry.tiers() & !tier_bit;
                entry.set_tiers(tiers);
                if tiers == 0 {
                    replica.entries.remove(engine);
                    replica.recent.remember(engine, key, now);
                }
                lose_tier(holders, &mut replica.extra_holds, key, slot, tier);
                replica.counts[tier as usize] -= 1;
                outcome.blocks_removed += 1;
            }
            _ => outcome.anomalies.unknown_removal += 1,
        }
    }
}

/// The replica in `slot` now holds `key` in `tier` through one more engine
/// hash.
pub(crate) fn gain_tier(
    holders: &mut Holders,
    extra_holds: &mut FxHashMap<(u64, u8), u32>,
    key: BlockKey,
    slot: usize,
    tier: Tier,
) {
    if holders.set(key, slot, tier) {
        *extra_holds.entry((key.0, tier as u8)).or_insert(0) += 1;
    }
}

/// Next insertion sequence number; [`Replica::reserve_seqs`] keeps it in
/// range, and it saturates rather than wrap if a caller did not.
fn bump_seq(next_seq: &mut u32) -> u32 {
    let seq = *next_seq;
    *next_seq = (seq + 1).min(SEQ_LIMIT - 1);
    seq
}

impl Replica {
    /// Makes room for `n` sequence numbers, renumbering the replica first if
    /// the packed field would overflow (about once per 5e8 insertions).
    pub(crate) fn reserve_seqs(&mut self, n: usize) {
        if u64::from(self.next_seq) + n as u64 >= u64::from(SEQ_LIMIT) {
            self.renumber();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use kvgate_events::{BlockStored, Event, Medium};

    use crate::testutil::{index_with, placeholder, removed, stored, tokens};
    use crate::{block_keys, PrefixMatch, ReplicaId, Tier};

    fn only(out: &[PrefixMatch], slot: usize) -> PrefixMatch {
        out.get(slot).copied().unwrap_or_default()
    }

    #[test]
    fn chained_stores_match_the_query_side_keys() {
        let (mut index, ids) = index_with(1);
        let now = Instant::now();
        let toks = tokens(3, |b| b as u32);
        let first = index.apply(ids[0], &stored(&[10, 11], None, &toks[..8], 4), now);
        let second = index.apply(ids[0], &stored(&[12], Some(11), &toks[8..], 4), now);
        assert_eq!((first.blocks_stored, second.blocks_stored), (2, 1));
        assert!(first.anomalies.is_empty() && second.anomalies.is_empty());
        let mut out = Vec::new();
        index.find_matches(&block_keys(&toks, 4, None), &mut out);
        assert_eq!(
            only(&out, 0),
            PrefixMatch { total: 3, gpu: 3, gpu_prefix: 3, cpu: 0, storage: 0 }
        );
        assert_eq!(index.stats().replicas[0].last_event_at, Some(now));
    }

    #[test]
    fn engine_hashes_list_what_each_tier_holds() {
        let (mut index, ids) = index_with(2);
        let now = Instant::now();
        index.apply(ids[0], &stored(&[10, 11, 12], None, &tokens(3, |b| b as u32), 4), now);
        index.apply(ids[0], &placeholder(&[11], Medium::Cpu), now);
        index.apply(ids[0], &removed(&[12], None), now);
        let sorted = |tier| {
            let mut v = index.engine_hashes(ids[0], tier).unwrap();
            v.sort_unstable();
            v
        };
        assert_eq!(sorted(Tier::Gpu), vec![10, 11]);
        assert_eq!(sorted(Tier::Cpu), vec![11]);
        assert_eq!(index.engine_hashes(ids[1], Tier::Gpu), Some(vec![]));
        assert_eq!(index.engine_hashes(ReplicaId(9), Tier::Gpu), None);
    }

    #[test]
    fn unknown_parent_drops_the_whole_store() {
        let (mut index, ids) = index_with(1);
        let outcome =
            index.apply(ids[0], &stored(&[1, 2], Some(99), &tokens(2, |_| 1), 4), Instant::now());
        assert_eq!(outcome.blocks_stored, 0);
        assert_eq!(outcome.anomalies.unknown_parent, 1);
        assert_eq!(index.distinct_keys(), 0);
        assert_eq!(index.stats().replicas[0].anomalies.unknown_parent, 1);
        assert_eq!(index.anomalies().unknown_parent, 1);
    }

    #[test]
    fn rejects_mismatched_and_malformed_stores() {
        let (mut index, ids) = index_with(1);
        let now = Instant::now();
        let a = index.apply(ids[0], &stored(&[1], None, &[1; 8], 8), now);
        assert_eq!(a.anomalies.block_size_mismatch, 1);
        let b = index.apply(ids[0], &stored(&[1], None, &[1; 5], 4), now);
        let c = index.apply(ids[0], &stored(&[1], None, &[1; 4], 0), now);
        assert_eq!((b.anomalies.malformed, c.anomalies.malformed), (1, 1));
        let mut with_extras = stored(&[1, 2], None, &[1; 8], 4);
        if let Event::Stored(s) = &mut with_extras {
            s.extra_keys = Some(vec![rmpv::Value::Nil]);
        }
        assert_eq!(index.apply(ids[0], &with_extras, now).anomalies.malformed, 1);
        assert_eq!(index.distinct_keys(), 0);
    }

    #[test]
    fn removal_clears_one_tier_and_unknown_removals_count() {
        let (mut index, ids) = index_with(1);
        let now = Instant::now();
        index.apply(ids[0], &stored(&[1], None, &[7; 4], 4), now);
        index.apply(ids[0], &placeholder(&[1], Medium::Cpu), now);
        let gone = index.apply(ids[0], &removed(&[1], None), now);
        assert_eq!(gone.blocks_removed, 1);
        let mut out = Vec::new();
        index.find_matches(&block_keys(&[7; 4], 4, None), &mut out);
        assert_eq!(only(&out, 0), PrefixMatch { total: 1, cpu: 1, ..PrefixMatch::default() });
        let again = index.apply(ids[0], &removed(&[1, 5], None), now);
        assert_eq!((again.blocks_removed, again.anomalies.unknown_removal), (0, 2));
        let cpu_gone = index.apply(ids[0], &removed(&[1], Some(Medium::Cpu)), now);
        assert_eq!(cpu_gone.blocks_removed, 1);
        assert_eq!(index.distinct_keys(), 0);
        assert_eq!(index.stats().replicas[0].engine_hashes, 0);
    }

    #[test]
    fn placeholders_need_a_known_hash() {
        let (mut index, ids) = index_with(1);
        let outcome = index.apply(ids[0], &placeholder(&[3], Medium::Cpu), Instant::now());
        assert_eq!((outcome.blocks_stored, outcome.anomalies.unknown_placeholder), (0, 1));
    }

    #[test]
    fn hash_conflict_replaces_the_contents() {
        let (mut index, ids) = index_with(1);
        let now = Instant::now();
        index.apply(ids[0], &stored(&[1], None, &[1; 4], 4), now);
        let outcome = index.apply(ids[0], &stored(&[1], None, &[2; 4], 4), now);
        assert_eq!(outcome.anomalies.hash_conflict, 1);
        let mut out = Vec::new();
        index.find_matches(&block_keys(&[1; 4], 4, None), &mut out);
        assert_eq!(only(&out, 0).total, 0);
        index.find_matches(&block_keys(&[2; 4], 4, None), &mut out);
        assert_eq!(only(&out, 0).total, 1);
        assert_eq!(index.distinct_keys(), 1);
    }

    #[test]
    fn two_engine_hashes_for_one_key_keep_the_bit_until_the_last_goes() {
        let (mut index, ids) = index_with(1);
        let now = Instant::now();
        index.apply(ids[0], &stored(&[1], None, &[4; 4], 4), now);
        index.apply(ids[0], &stored(&[2], None, &[4; 4], 4), now);
        let keys = block_keys(&[4; 4], 4, None);
        let mut out = Vec::new();
        index.apply(ids[0], &removed(&[1], None), now);
        index.find_matches(&keys, &mut out);
        assert_eq!(only(&out, 0).total, 1);
        index.apply(ids[0], &removed(&[2], None), now);
        index.find_matches(&keys, &mut out);
        assert_eq!(only(&out, 0).total, 0);
    }

    #[test]
    fn non_full_attention_groups_are_ignored() {
        let (mut index, ids) = index_with(1);
        let now = Instant::now();
        let mut sliding = stored(&[1], None, &[1; 4], 4);
        if let Event::Stored(s) = &mut sliding {
            s.group_idx = Some(1);
            s.kv_cache_spec_kind = Some("sliding_window".into());
        }
        assert_eq!(index.apply(ids[0], &sliding, now).anomalies.non_full_group_ignored, 1);
        let mut full = stored(&[1], None, &[1; 4], 4);
        if let Event::Stored(s) = &mut full {
            s.group_idx = Some(0);
            s.kv_cache_spec_kind = Some("full_attention".into());
        }
        assert_eq!(index.apply(ids[0], &full, now).blocks_stored, 1);
        let mut remove_sliding = removed(&[1], None);
        if let Event::Removed(r) = &mut remove_sliding {
            r.group_idx = Some(1);
        }
        assert_eq!(index.apply(ids[0], &remove_sliding, now).anomalies.non_full_group_ignored, 1);
        assert_eq!(index.distinct_keys(), 1);
    }

    #[test]
    fn lora_and_extra_keys_follow_the_query_side() {
        let (mut index, ids) = index_with(1);
        let mut event = stored(&[1], None, &[3; 4], 4);
        if let Event::Stored(BlockStored { lora_name, extra_keys, .. }) = &mut event {
            *lora_name = Some("adapter".into());
            *extra_keys = Some(vec![rmpv::Value::Nil]);
        }
        index.apply(ids[0], &event, Instant::now());
        let mut out = Vec::new();
        index.find_matches(&block_keys(&[3; 4], 4, Some("adapter")), &mut out);
        assert_eq!(only(&out, 0).total, 1);
        index.find_matches(&block_keys(&[3; 4], 4, None), &mut out);
        assert_eq!(only(&out, 0).total, 0);
    }

    #[test]
    fn all_cleared_and_unknown_replica() {
        let (mut index, ids) = index_with(2);
        let now = Instant::now();
        index.apply(ids[0], &stored(&[1, 2], None, &[1; 8], 4), now);
        index.apply(ids[1], &stored(&[1], None, &[1; 4], 4), now);
        let cleared = index.apply(ids[0], &Event::AllCleared, now);
        assert_eq!(cleared.blocks_removed, 2);
        assert_eq!(index.distinct_keys(), 1);
        let stray = index.apply(crate::ReplicaId(7), &Event::AllCleared, now);
        assert_eq!(stray.anomalies.unknown_replica, 1);
        assert_eq!(index.anomalies().unknown_replica, 1);
    }
}
