//! Encoding a [`Batch`] in the exact layout of a given vLLM release, for the
//! simulator and for round-trip tests of the decoder.
//!
//! Each layout mirrors msgspec's rules for vLLM's structs: `omit_defaults`
//! drops map fields that still hold their default (msgspec ignores it for
//! array-like structs, which always write every field), and tagged structs
//! carry the tag first (arrays) or under `"type"` (maps). Fields a release
//! did not have are not written.

use rmpv::Value;

use crate::types::{Batch, BlockHash, BlockRemoved, BlockStored, Event, Medium};

/// A vLLM release's wire layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Layout {
    /// vLLM 0.11: array batch, array events, `BlockStored` up to `medium`.
    V0_11,
    /// vLLM 0.26 / 0.33: array batch, map events with every field.
    V0_26,
    /// The map-batch snapshot of vLLM main: `{ts, events, data_parallel_rank}`
    /// with map events. Released vLLM keeps the positional batch.
    MapBatch,
}

impl Layout {
    /// Every layout, oldest first.
    pub const ALL: [Layout; 3] = [Layout::V0_11, Layout::V0_26, Layout::MapBatch];

    /// The name used on command lines (`0.11`, `0.26`, `map-batch`).
    pub fn name(self) -> &'static str {
        match self {
            Layout::V0_11 => "0.11",
            Layout::V0_26 => "0.26",
            Layout::MapBatch => "map-batch",
        }
    }

    /// Parses [`Layout::name`].
    pub fn from_name(name: &str) -> Option<Layout> {
        Layout::ALL.into_iter().find(|l| l.name() == name)
    }

    /// Whether `BlockStored` carries `lora_name` and the later fields.
    pub fn has_extended_fields(self) -> bool {
        !matches!(self, Layout::V0_11)
    }
}

/// Encodes one batch as msgpack in `layout`.
pub fn encode_batch(batch: &Batch, layout: Layout) -> Vec<u8> {
    let events = Value::Array(batch.events.iter().map(|e| event_value(e, layout)).collect());
    let dp = batch.dp_rank.map(Value::from);
    let value = match layout {
        // msgspec ignores `omit_defaults` for array-like structs: the
        // positional batch always has its third element, nil when unset.
        Layout::V0_11 | Layout::V0_26 => {
            Value::Array(vec![Value::F64(batch.ts), events, dp.unwrap_or(Value::Nil)])
        }
        Layout::MapBatch => {
            let mut entries =
                vec![(Value::from("ts"), Value::F64(batch.ts)), (Value::from("events"), events)];
            if let Some(dp) = dp {
                entries.push((Value::from("data_parallel_rank"), dp));
            }
            Value::Map(entries)
        }
    };
    let mut out = Vec::with_capacity(64 + 8 * batch.events.len());
    // Writing into a Vec cannot fail: the only error source is the writer.
    let _ = rmpv::encode::write_value(&mut out, &value);
    out
}

fn event_value(event: &Event, layout: Layout) -> Value {
    let fields: Vec<(&'static str, Value, bool)> = match event {
        Event::Stored(s) => stored_fields(s, layout),
        Event::Removed(r) => removed_fields(r, layout),
        Event::AllCleared => Vec::new(),
    };
    match layout {
        Layout::V0_11 => {
            // Positional: every field of the release is written, defaults too.
            let mut items = vec![Value::from(event.tag())];
            items.extend(fields.into_iter().map(|(_, v, _)| v));
            Value::Array(items)
        }
        Layout::V0_26 | Layout::MapBatch => {
            let mut entries = vec![(Value::from("type"), Value::from(event.tag()))];
            entries.extend(
                fields.into_iter().filter(|(_, _, d)| !d).map(|(k, v, _)| (Value::from(k), v)),
            );
            Value::Map(entries)
        }
    }
}

/// `(name, value, omittable_default)`; required fields are never omittable.
fn stored_fields(s: &BlockStored, layout: Layout) -> Vec<(&'static str, Value, bool)> {
    let mut f = vec![
        ("block_hashes", hashes_value(&s.block_hashes), false),
        ("parent_block_hash", opt_hash(s.parent_block_hash.as_ref()), false),
        ("token_ids", Value::Array(s.token_ids.iter().map(|&t| Value::from(t)).collect()), false),
        ("block_size", Value::from(s.block_size), false),
        ("lora_id", s.lora_id.map_or(Value::Nil, Value::from), false),
        ("medium", medium_value(s.medium.as_ref()), false),
    ];
    if layout.has_extended_fields() {
        f.push(("lora_name", s.lora_name.as_deref().map_or(Value::Nil, Value::from), false));
        f.push((
            "extra_keys",
            s.extra_keys.clone().map_or(Value::Nil, Value::Array),
            s.extra_keys.is_none(),
        ));
        f.push(("group_idx", s.group_idx.map_or(Value::Nil, Value::from), s.group_idx.is_none()));
        f.push((
            "kv_cache_spec_kind",
            s.kv_cache_spec_kind.as_deref().map_or(Value::Nil, Value::from),
            s.kv_cache_spec_kind.is_none(),
        ));
        f.push((
            "kv_cache_spec_sliding_window",
            s.kv_cache_spec_sliding_window.map_or(Value::Nil, Value::from),
            s.kv_cache_spec_sliding_window.is_none(),
        ));
    }
    f
}

fn removed_fields(r: &BlockRemoved, layout: Layout) -> Vec<(&'static str, Value, bool)> {
    let mut f = vec![
        ("block_hashes", hashes_value(&r.block_hashes), false),
        ("medium", medium_value(r.medium.as_ref()), false),
    ];
    if layout.has_extended_fields() {
        f.push(("group_idx", r.group_idx.map_or(Value::Nil, Value::from), r.group_idx.is_none()));
    }
    f
}

fn hashes_value(hashes: &[BlockHash]) -> Value {
    Value::Array(hashes.iter().map(hash_value).collect())
}

fn hash_value(h: &BlockHash) -> Value {
    match h {
        BlockHash::Int(v) => Value::from(*v),
        BlockHash::Bytes(b) => Value::Binary(b.clone()),
    }
}

fn opt_hash(h: Option<&BlockHash>) -> Value {
    h.map_or(Value::Nil, hash_value)
}

fn medium_value(m: Option<&Medium>) -> Value {
    m.map_or(Value::Nil, |m| Value::from(m.as_wire()))
}
