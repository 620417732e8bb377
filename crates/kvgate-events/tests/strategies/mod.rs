//! Proptest strategies for arbitrary batches, shared by the round-trip and
//! fuzz tests (included with `mod strategies;`).

#![allow(dead_code, unreachable_pub)]

use kvgate_events::{Batch, BlockHash, BlockRemoved, BlockStored, Event, Medium};
use proptest::prelude::*;

pub fn hash(bytes_form: bool) -> BoxedStrategy<BlockHash> {
    if bytes_form {
        proptest::collection::vec(any::<u8>(), 32).prop_map(BlockHash::Bytes).boxed()
    } else {
        any::<u64>().prop_map(BlockHash::Int).boxed()
    }
}

pub fn medium() -> impl Strategy<Value = Option<Medium>> {
    prop_oneof![
        Just(None),
        Just(Some(Medium::Gpu)),
        Just(Some(Medium::Cpu)),
        Just(Some(Medium::Storage)),
        Just(Some(Medium::Fs)),
        Just(Some(Medium::Obj)),
        "[a-z]{1,6}".prop_map(|s| Some(Medium::Other(s))),
    ]
}

pub fn extra_value() -> impl Strategy<Value = rmpv::Value> {
    let leaf = prop_oneof![
        Just(rmpv::Value::Nil),
        any::<u32>().prop_map(rmpv::Value::from),
        "[a-z0-9]{0,8}".prop_map(rmpv::Value::from),
    ];
    leaf.prop_recursive(2, 8, 4, |inner| {
        proptest::collection::vec(inner, 0..4).prop_map(rmpv::Value::Array)
    })
}

pub fn stored(bytes_form: bool) -> impl Strategy<Value = BlockStored> {
    (
        proptest::collection::vec(hash(bytes_form), 0..4),
        proptest::option::of(hash(bytes_form)),
        proptest::collection::vec(any::<u32>(), 0..20),
        any::<u32>(),
        proptest::option::of(any::<i64>()),
        medium(),
        proptest::option::of("[a-z]{1,8}"),
        proptest::option::of(proptest::collection::vec(extra_value(), 0..3)),
        proptest::option::of(any::<u32>()),
        proptest::option::of(prop_oneof![
            Just("full_attention".to_owned()),
            Just("sliding_window".to_owned())
        ]),
        proptest::option::of(any::<u32>()),
    )
        .prop_map(|(h, p, t, bs, lid, m, ln, ek, g, k, w)| BlockStored {
            block_hashes: h,
            parent_block_hash: p,
            token_ids: t,
            block_size: bs,
            lora_id: lid,
            medium: m,
            lora_name: ln,
            extra_keys: ek,
            group_idx: g,
            kv_cache_spec_kind: k,
            kv_cache_spec_sliding_window: w,
        })
}

pub fn event(bytes_form: bool) -> impl Strategy<Value = Event> {
    prop_oneof![
        stored(bytes_form).prop_map(Event::Stored),
        (
            proptest::collection::vec(hash(bytes_form), 0..4),
            medium(),
            proptest::option::of(any::<u32>())
        )
            .prop_map(|(h, m, g)| Event::Removed(BlockRemoved {
                block_hashes: h,
                medium: m,
                group_idx: g
            })),
        Just(Event::AllCleared),
    ]
}

pub fn batch() -> impl Strategy<Value = Batch> {
    any::<bool>().prop_flat_map(|bytes_form| {
        (
            -1e12f64..1e12f64,
            proptest::collection::vec(event(bytes_form), 0..5),
            proptest::option::of(0u32..64),
        )
            .prop_map(|(ts, events, dp_rank)| Batch {
                ts,
                events,
                dp_rank,
                skipped_events: 0,
            })
    })
}
