//! Decoding one msgpack payload into a [`Batch`], for every layout vLLM has
//! shipped (FIELD.md §1):
//!
//! * batch: array `[ts, events, dp_rank?]` or map `{ts, events, data_parallel_rank}`;
//! * event: array `["BlockStored", field, ...]` (positional, trailing fields
//!   may be omitted) or map `{"type": "BlockStored", field: value, ...}`;
//! * hashes: msgpack ints or bytes.
//!
//! Unknown map keys and extra trailing array elements are ignored; unknown
//! event tags are skipped and counted in [`Batch::skipped_events`]. We parse
//! into `rmpv::Value` first because the layouts differ in shape, not only in
//! field order, and one generic tree keeps every branch simple. That tree costs
//! a `Value` per token id, so `decode_fast` reads the usual shapes directly
//! and falls back here for anything else.

use rmpv::Value;

use crate::error::DecodeError;
use crate::fields::{REMOVED_FIELDS, STORED_FIELDS};
use crate::types::{Batch, BlockHash, BlockRemoved, BlockStored, Event, Medium};

/// Nesting deeper than this is rejected before it can exhaust the stack.
/// Real payloads nest at most 5 levels (batch, events, event, extra_keys, tuple).
const MAX_DEPTH: usize = 32;

/// Decodes one KV-event batch payload: the fast path for the shapes vLLM
/// sends, and [`decode_batch_reference`] for everything else (it also names
/// every error).
pub fn decode_batch(payload: &[u8]) -> Result<Batch, DecodeError> {
    match crate::decode_fast::decode_batch_fast(payload) {
        Some(batch) => Ok(batch),
        None => decode_batch_reference(payload),
    }
}

/// The reference decoder: the whole payload as one `rmpv::Value` tree, then
/// the layout rules. [`decode_batch`] returns exactly what this returns, only
/// faster; it is public so that tests and fuzzers can compare the two.
pub fn decode_batch_reference(payload: &[u8]) -> Result<Batch, DecodeError> {
    let mut rd = payload;
    let value = rmpv::decode::read_value_with_max_depth(&mut rd, MAX_DEPTH)
        .map_err(|e| DecodeError::Msgpack(e.to_string()))?;
    if !rd.is_empty() {
        return Err(DecodeError::TrailingBytes(rd.len()));
    }
    batch_from_value(value)
}

fn batch_from_value(value: Value) -> Result<Batch, DecodeError> {
    let (ts, events, dp_rank) = match value {
        Value::Array(items) => {
            let mut it = items.into_iter();
            let ts = it.next().ok_or(DecodeError::Missing("batch.ts"))?;
            let events = it.next().ok_or(DecodeError::Missing("batch.events"))?;
            (ts, events, it.next())
        }
        Value::Map(entries) => {
            let (mut ts, mut events, mut dp) = (None, None, None);
            for (k, v) in entries {
                match k.as_str() {
                    Some("ts") => ts = Some(v),
                    Some("events") => events = Some(v),
                    Some("data_parallel_rank") | Some("dp_rank") => dp = Some(v),
                    _ => {}
                }
            }
            (
                ts.ok_or(DecodeError::Missing("batch.ts"))?,
                events.ok_or(DecodeError::Missing("batch.events"))?,
                dp,
            )
        }
        other => return Err(type_err("batch", "array or map", &other)),
    };
    let ts = as_f64("batch.ts", &ts)?;
    let dp_rank = match dp_rank {
        None | Some(Value::Nil) => None,
        Some(v) => Some(as_u32("batch.dp_rank", &v)?),
    };
    let Value::Array(raw_events) = events else {
        return Err(type_err("batch.events", "array", &events));
    };
    let mut out = Vec::with_capacity(raw_events.len());
    let mut skipped_events = 0u32;
    for raw in raw_events {
        match event_from_value(raw)? {
            Some(ev) => out.push(ev),
            None => skipped_events = skipped_events.saturating_add(1),
        }
    }
    Ok(Batch { ts, events: out, dp_rank, skipped_events })
}

/// A field lookup over either event shape: positional or by name.
enum Fields {
    Positional(Vec<Value>),
    Named(Vec<(Value, Value)>),
}

impl Fields {
    fn take(&mut self, order: &[&str], name: &str) -> Option<Value> {
        match self {
            Fields::Positional(items) => {
                let idx = order.iter().position(|f| *f == name)?;
                items.get_mut(idx).map(|v| std::mem::replace(v, Value::Nil))
            }
            Fields::Named(entries) => entries
                .iter_mut()
                .find(|(k, _)| k.as_str() == Some(name))
                .map(|(_, v)| std::mem::replace(v, Value::Nil)),
        }
    }
}

/// Returns `None` for an unknown event tag (skipped, counted by the caller).
fn event_from_value(value: Value) -> Result<Option<Event>, DecodeError> {
    let (tag, fields) = match value {
        Value::Array(mut items) => {
            if items.is_empty() {
                return Err(DecodeError::Missing("event.tag"));
            }
            let tag = items.remove(0);
            (tag, Fields::Positional(items))
        }
        Value::Map(entries) => {
            let tag = entries
                .iter()
                .find(|(k, _)| k.as_str() == Some("type"))
                .map(|(_, v)| v.clone())
                .ok_or(DecodeError::Missing("event.type"))?;
            (tag, Fields::Named(entries))
        }
        other => return Err(type_err("event", "array or map", &other)),
    };
    let Some(tag) = tag.as_str() else {
        return Err(type_err("event.type", "string", &tag));
    };
    match tag {
        "BlockStored" => stored_from_fields(fields).map(|s| Some(Event::Stored(s))),
        "BlockRemoved" => removed_from_fields(fields).map(|r| Some(Event::Removed(r))),
        "AllBlocksCleared" => Ok(Some(Event::AllCleared)),
        _ => Ok(None),
    }
}

fn stored_from_fields(mut f: Fields) -> Result<BlockStored, DecodeError> {
    let o = &STORED_FIELDS;
    let block_hashes =
        hashes("BlockStored.block_hashes", f.take(o, "block_hashes").unwrap_or(Value::Nil))?;
    let parent_block_hash = opt(f.take(o, "parent_block_hash"))
        .map(|v| hash("BlockStored.parent_block_hash", &v))
        .transpose()?;
    let token_ids = match opt(f.take(o, "token_ids")) {
        None => Vec::new(),
        Some(Value::Array(items)) => items
            .iter()
            .map(|t| as_u32("BlockStored.token_ids", t))
            .collect::<Result<Vec<_>, _>>()?,
        Some(other) => return Err(type_err("BlockStored.token_ids", "array", &other)),
    };
    let block_size = opt(f.take(o, "block_size"))
        .map(|v| as_u32("BlockStored.block_size", &v))
        .transpose()?
        .unwrap_or(0);
    let lora_id =
        opt(f.take(o, "lora_id")).map(|v| as_i64("BlockStored.lora_id", &v)).transpose()?;
    let medium = medium("BlockStored.medium", f.take(o, "medium"))?;
    let lora_name =
        opt(f.take(o, "lora_name")).map(|v| as_string("BlockStored.lora_name", v)).transpose()?;
    let extra_keys = match opt(f.take(o, "extra_keys")) {
        None => None,
        Some(Value::Array(items)) => Some(items),
        Some(other) => return Err(type_err("BlockStored.extra_keys", "array", &other)),
    };
    let group_idx =
        opt(f.take(o, "group_idx")).map(|v| as_u32("BlockStored.group_idx", &v)).transpose()?;
    let kv_cache_spec_kind = opt(f.take(o, "kv_cache_spec_kind"))
        .map(|v| as_string("BlockStored.kv_cache_spec_kind", v))
        .transpose()?;
    let kv_cache_spec_sliding_window = opt(f.take(o, "kv_cache_spec_sliding_window"))
        .map(|v| as_u32("BlockStored.kv_cache_spec_sliding_window", &v))
        .transpose()?;
    Ok(BlockStored {
        block_hashes,
        parent_block_hash,
        token_ids,
        block_size,
        lora_id,
        medium,
        lora_name,
        extra_keys,
        group_idx,
        kv_cache_spec_kind,
        kv_cache_spec_sliding_window,
    })
}

fn removed_from_fields(mut f: Fields) -> Result<BlockRemoved, DecodeError> {
    let o = &REMOVED_FIELDS;
    let block_hashes =
        hashes("BlockRemoved.block_hashes", f.take(o, "block_hashes").unwrap_or(Value::Nil))?;
    let medium = medium("BlockRemoved.medium", f.take(o, "medium"))?;
    let group_idx =
        opt(f.take(o, "group_idx")).map(|v| as_u32("BlockRemoved.group_idx", &v)).transpose()?;
    Ok(BlockRemoved { block_hashes, medium, group_idx })
}

/// Treats an absent field and an explicit nil alike.
fn opt(v: Option<Value>) -> Option<Value> {
    match v {
        None | Some(Value::Nil) => None,
        some => some,
    }
}

fn medium(what: &'static str, v: Option<Value>) -> Result<Option<Medium>, DecodeError> {
    match opt(v) {
        None => Ok(None),
        Some(Value::String(s)) => match s.as_str() {
            Some(name) => Ok(Some(Medium::from_wire(name))),
            None => Err(DecodeError::Type { what, expected: "utf-8 string", found: "bytes" }),
        },
        Some(other) => Err(type_err(what, "string", &other)),
    }
}

fn hashes(what: &'static str, v: Value) -> Result<Vec<BlockHash>, DecodeError> {
    match v {
        Value::Array(items) => items.iter().map(|h| hash(what, h)).collect(),
        Value::Nil => Err(DecodeError::Missing(what)),
        other => Err(type_err(what, "array", &other)),
    }
}

fn hash(what: &'static str, v: &Value) -> Result<BlockHash, DecodeError> {
    match v {
        // vLLM's int hashes are u64; a signed encoder may have written the
        // same 64 bits as a negative i64, so keep the bit pattern.
        Value::Integer(i) => match (i.as_u64(), i.as_i64()) {
            (Some(u), _) => Ok(BlockHash::Int(u)),
            (None, Some(s)) => Ok(BlockHash::Int(s as u64)),
            (None, None) => Err(DecodeError::OutOfRange { what, value: i.to_string() }),
        },
        Value::Binary(b) => Ok(BlockHash::Bytes(b.clone())),
        other => Err(type_err(what, "int or bytes", other)),
    }
}

fn as_f64(what: &'static str, v: &Value) -> Result<f64, DecodeError> {
    match v {
        Value::F64(f) => Ok(*f),
        Value::F32(f) => Ok(f64::from(*f)),
        Value::Integer(i) => i.as_f64().ok_or(DecodeError::Missing(what)),
        other => Err(type_err(what, "number", other)),
    }
}

fn as_i64(what: &'static str, v: &Value) -> Result<i64, DecodeError> {
    match v {
        Value::Integer(i) => {
            i.as_i64().ok_or_else(|| DecodeError::OutOfRange { what, value: i.to_string() })
        }
        other => Err(type_err(what, "int", other)),
    }
}

fn as_u32(what: &'static str, v: &Value) -> Result<u32, DecodeError> {
    match v {
        Value::Integer(i) => i
            .as_u64()
            .and_then(|u| u32::try_from(u).ok())
            .ok_or_else(|| DecodeError::OutOfRange { what, value: i.to_string() }),
        other => Err(type_err(what, "int", other)),
    }
}

fn as_string(what: &'static str, v: Value) -> Result<String, DecodeError> {
    match v {
        Value::String(s) => {
            s.into_str().ok_or(DecodeError::Type { what, expected: "utf-8 string", found: "bytes" })
        }
        other => Err(type_err(what, "string", &other)),
    }
}

fn type_err(what: &'static str, expected: &'static str, found: &Value) -> DecodeError {
    DecodeError::Type { what, expected, found: kind(found) }
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Nil => "nil",
        Value::Boolean(_) => "bool",
        Value::Integer(_) => "int",
        Value::F32(_) | Value::F64(_) => "float",
        Value::String(_) => "string",
        Value::Binary(_) => "bytes",
        Value::Array(_) => "array",
        Value::Map(_) => "map",
        Value::Ext(..) => "ext",
    }
}
