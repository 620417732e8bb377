//! Encode → decode round trips for every layout, with arbitrary batches.
//! A layout that lacks a field (0.11 has no `lora_name`...) must decode it
//! as absent; everything it has must come back unchanged.

mod strategies;

use kvgate_events::{
    decode_batch, decode_batch_fast, decode_batch_reference, encode_batch, Batch, Event, Layout,
};
use proptest::prelude::*;

/// What `layout` can carry of `batch`.
fn project(batch: &Batch, layout: Layout) -> Batch {
    let mut b = batch.clone();
    if !layout.has_extended_fields() {
        for e in &mut b.events {
            match e {
                Event::Stored(s) => {
                    s.lora_name = None;
                    s.extra_keys = None;
                    s.group_idx = None;
                    s.kv_cache_spec_kind = None;
                    s.kv_cache_spec_sliding_window = None;
                }
                Event::Removed(r) => r.group_idx = None,
                Event::AllCleared => {}
            }
        }
    }
    b
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn every_layout_round_trips(batch in strategies::batch()) {
        for layout in Layout::ALL {
            let bytes = encode_batch(&batch, layout);
            let decoded = decode_batch(&bytes);
            prop_assert_eq!(&decoded, &Ok(project(&batch, layout)), "layout {}", layout.name());
            // Every shape vLLM sends takes the fast path, and the reference
            // decoder reads the same.
            prop_assert_eq!(decode_batch_fast(&bytes), decoded.clone().ok(), "layout {}", layout.name());
            prop_assert_eq!(decode_batch_reference(&bytes), decoded, "layout {}", layout.name());
        }
    }
}

#[test]
fn unknown_event_tags_are_skipped_and_counted() {
    // [ts, [["BlockFrobbed", 1], ["AllBlocksCleared"]]]
    let value = rmpv::Value::Array(vec![
        rmpv::Value::F64(1.0),
        rmpv::Value::Array(vec![
            rmpv::Value::Array(vec!["BlockFrobbed".into(), 1.into()]),
            rmpv::Value::Array(vec!["AllBlocksCleared".into()]),
        ]),
    ]);
    let mut bytes = Vec::new();
    rmpv::encode::write_value(&mut bytes, &value).unwrap();
    let batch = decode_batch(&bytes).unwrap();
    assert_eq!(batch.events, vec![Event::AllCleared]);
    assert_eq!(batch.skipped_events, 1);
}

#[test]
fn malformed_payloads_are_typed_errors() {
    use kvgate_events::DecodeError;
    assert!(matches!(decode_batch(&[]), Err(DecodeError::Msgpack(_))));
    // A bare int is not a batch.
    assert!(matches!(decode_batch(&[0x05]), Err(DecodeError::Type { what: "batch", .. })));
    // Trailing garbage after a valid batch.
    let mut ok = encode_batch(
        &Batch { ts: 0.0, events: vec![], dp_rank: None, skipped_events: 0 },
        Layout::V0_26,
    );
    ok.push(0xc0);
    assert_eq!(decode_batch(&ok), Err(DecodeError::TrailingBytes(1)));
    // An array header claiming 2^32-1 elements with nothing behind it.
    assert!(decode_batch(&[0xdd, 0xff, 0xff, 0xff, 0xff]).is_err());
    // Deep nesting is refused, not a stack overflow.
    let deep = vec![0x91; 100_000];
    assert!(decode_batch(&deep).is_err());
}
