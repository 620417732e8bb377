//! Decoding payloads produced by a Python publisher (msgspec structs shaped
//! like each vLLM release; see tests/fixtures/README.md), compared with the
//! normalised batch the generator says a correct decoder must see.

use std::path::PathBuf;

use kvgate_events::{decode_batch, decode_batch_fast, Batch, BlockHash, Event};
use serde_json::{json, Value};

fn hash_json(h: &BlockHash) -> Value {
    match h {
        BlockHash::Int(v) => json!(v),
        BlockHash::Bytes(b) => json!(b.iter().map(|x| format!("{x:02x}")).collect::<String>()),
    }
}

/// The same normal form as `tests/py/gen_fixtures.py` writes.
fn normalise(batch: &Batch) -> Value {
    let events: Vec<Value> = batch
        .events
        .iter()
        .map(|e| match e {
            Event::Stored(s) => json!({
                "type": "BlockStored",
                "block_hashes": s.block_hashes.iter().map(hash_json).collect::<Vec<_>>(),
                "parent_block_hash": s.parent_block_hash.as_ref().map(hash_json),
                "token_ids": s.token_ids,
                "block_size": s.block_size,
                "lora_id": s.lora_id,
                "medium": s.medium.as_ref().map(|m| m.as_wire()),
                "lora_name": s.lora_name,
                "group_idx": s.group_idx,
                "kv_cache_spec_kind": s.kv_cache_spec_kind,
                "kv_cache_spec_sliding_window": s.kv_cache_spec_sliding_window,
            }),
            Event::Removed(r) => json!({
                "type": "BlockRemoved",
                "block_hashes": r.block_hashes.iter().map(hash_json).collect::<Vec<_>>(),
                "medium": r.medium.as_ref().map(|m| m.as_wire()),
                "group_idx": r.group_idx,
            }),
            Event::AllCleared => json!({"type": "AllBlocksCleared"}),
        })
        .collect();
    json!({"ts": batch.ts, "dp_rank": batch.dp_rank, "events": events})
}

#[test]
fn python_publisher_payloads_decode_exactly() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let manifest: Vec<Value> =
        serde_json::from_str(&std::fs::read_to_string(dir.join("expected.json")).unwrap()).unwrap();
    assert!(manifest.len() >= 20, "fixture manifest unexpectedly small");
    let mut layouts = std::collections::BTreeSet::new();
    let mut hash_forms = std::collections::BTreeSet::new();
    for entry in &manifest {
        let file = entry["file"].as_str().unwrap();
        let bytes = std::fs::read(dir.join(file)).unwrap();
        let batch = decode_batch(&bytes).unwrap_or_else(|e| panic!("{file}: {e}"));
        assert_eq!(batch.skipped_events, 0, "{file}");
        // Real publishers' payloads all take the fast path.
        assert_eq!(decode_batch_fast(&bytes).as_ref(), Some(&batch), "{file}: fast path");
        assert_eq!(normalise(&batch), entry["expected"], "{file}: {}", entry["description"]);
        layouts.insert(entry["layout"].as_str().unwrap().to_owned());
        hash_forms.insert(entry["hash_form"].as_str().unwrap().to_owned());
    }
    // The manifest must keep covering every layout and both hash forms.
    for layout in ["0.11", "0.26", "main"] {
        assert!(layouts.contains(layout), "no fixture for layout {layout}");
    }
    assert!(hash_forms.contains("int") && hash_forms.contains("bytes"));
}

#[test]
fn cpu_placeholders_decode_as_placeholders() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let batch = decode_batch(&std::fs::read(dir.join("basic_v026_int.msgpack")).unwrap()).unwrap();
    let placeholders: Vec<_> = batch
        .events
        .iter()
        .filter_map(|e| match e {
            Event::Stored(s) if s.is_placeholder() => Some(s),
            _ => None,
        })
        .collect();
    assert_eq!(placeholders.len(), 1);
    assert_eq!(placeholders[0].block_size, 0);
    assert!(placeholders[0].parent_block_hash.is_none());
}
