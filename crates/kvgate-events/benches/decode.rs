//! Decoding the BlockStored that a 4k-token prompt produces (248 blocks of
//! 16 tokens, int hashes), on the fast path and through the reference
//! decoder's `rmpv::Value` tree, side by side, in every layout.
//!
//! `cargo bench -p kvgate-events --bench decode`

#![allow(missing_docs, clippy::unwrap_used)]

use criterion::{criterion_group, criterion_main, Criterion};
use kvgate_events::{
    decode_batch, decode_batch_reference, encode_batch, Batch, BlockHash, BlockStored, Event,
    Layout, Medium,
};

fn prompt_event(blocks: u64) -> Batch {
    let stored = BlockStored {
        block_hashes: (0..blocks)
            .map(|h| BlockHash::Int(h.wrapping_mul(0x9e37_79b9_7f4a_7c15)))
            .collect(),
        parent_block_hash: None,
        token_ids: (0..blocks as u32 * 16)
            .map(|t| t.wrapping_mul(2_654_435_761) % 151_000)
            .collect(),
        block_size: 16,
        lora_id: None,
        medium: Some(Medium::Gpu),
        lora_name: None,
        extra_keys: None,
        group_idx: None,
        kv_cache_spec_kind: None,
        kv_cache_spec_sliding_window: None,
    };
    Batch { ts: 1.0, events: vec![Event::Stored(stored)], dp_rank: None, skipped_events: 0 }
}

fn bench(c: &mut Criterion) {
    let batch = prompt_event(248);
    let mut group = c.benchmark_group("decode_248_blocks");
    for layout in Layout::ALL {
        let payload = encode_batch(&batch, layout);
        assert_eq!(decode_batch(&payload).unwrap(), decode_batch_reference(&payload).unwrap());
        group.bench_function(format!("fast/{}", layout.name()), |b| {
            b.iter(|| decode_batch(std::hint::black_box(&payload)))
        });
        group.bench_function(format!("reference/{}", layout.name()), |b| {
            b.iter(|| decode_batch_reference(std::hint::black_box(&payload)))
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
