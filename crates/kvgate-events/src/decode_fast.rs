//! The fast path of [`crate::decode_batch`]: reads the payload straight from
//! msgpack into a [`Batch`], without first building an `rmpv::Value` per
//! element. A `BlockStored` for a 4k-token prompt carries ~4,000 token ids
//! and ~250 hashes; through a `Value` tree that costs ~120 µs, read directly
//! about a tenth of it, and the gateway decodes one per uncached prefill.
//!
//! It answers only when it is sure: anything it does not expect (a type it
//! does not read, a duplicated key, an out-of-range number, a value nested
//! near the depth limit, trailing bytes) returns `None`, and the caller runs
//! the reference decoder in [`crate::decode`], which is then the one that
//! accepts it or names the error. So both decoders agree on every input by
//! construction; `tests/fuzz_decode.rs` checks it differentially.

use rmp::Marker;
use rmpv::Value;

use crate::fields::{REMOVED_FIELDS, STORED_FIELDS};
use crate::types::{Batch, BlockHash, BlockRemoved, BlockStored, Event, Medium};

/// Depth left for skipped or kept-as-`Value` fields: well under the reference
/// decoder's limit, so that the fast path gives up before the reference
/// decoder would reject a payload for nesting.
const VALUE_DEPTH: usize = 16;

/// Decodes `payload` on the fast path alone: `None` when it is not a shape
/// this path reads (then [`crate::decode_batch`] asks the reference decoder).
/// Public so that tests can check which payloads take it.
pub fn decode_batch_fast(payload: &[u8]) -> Option<Batch> {
    let mut rd = Reader(payload);
    let batch = rd.batch()?;
    rd.0.is_empty().then_some(batch)
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn peek(&self) -> Option<Marker> {
        self.0.first().map(|b| Marker::from_u8(*b))
    }

    /// Consumes a nil, if that is what comes next.
    fn nil(&mut self) -> bool {
        if self.peek() == Some(Marker::Null) {
            self.0 = &self.0[1..];
            true
        } else {
            false
        }
    }

    fn array_len(&mut self) -> Option<usize> {
        match self.peek()? {
            Marker::FixArray(_) | Marker::Array16 | Marker::Array32 => {}
            _ => return None,
        }
        rmp::decode::read_array_len(&mut self.0).ok().map(|n| n as usize)
    }

    fn map_len(&mut self) -> Option<usize> {
        match self.peek()? {
            Marker::FixMap(_) | Marker::Map16 | Marker::Map32 => {}
            _ => return None,
        }
        rmp::decode::read_map_len(&mut self.0).ok().map(|n| n as usize)
    }

    fn str(&mut self) -> Option<&'a str> {
        match self.peek()? {
            Marker::FixStr(_) | Marker::Str8 | Marker::Str16 | Marker::Str32 => {}
            _ => return None,
        }
        let len = rmp::decode::read_str_len(&mut self.0).ok()? as usize;
        let bytes = self.0.get(..len)?;
        self.0 = &self.0[len..];
        std::str::from_utf8(bytes).ok()
    }

    fn bin(&mut self) -> Option<&'a [u8]> {
        let len = rmp::decode::read_bin_len(&mut self.0).ok()? as usize;
        let bytes = self.0.get(..len)?;
        self.0 = &self.0[len..];
        Some(bytes)
    }

    /// An unsigned int in one of msgpack's unsigned encodings (what every
    /// encoder writes for token ids and hashes), read inline: this loop runs
    /// once per token. Signed encodings go through `rmp`.
    fn unsigned(&mut self) -> Option<u64> {
        let (&marker, rest) = self.0.split_first()?;
        let width = match marker {
            0x00..=0x7f => {
                self.0 = rest;
                return Some(u64::from(marker));
            }
            0xcc => 1,
            0xcd => 2,
            0xce => 4,
            0xcf => 8,
            _ => return rmp::decode::read_int(&mut self.0).ok(),
        };
        let bytes = rest.get(..width)?;
        self.0 = &rest[width..];
        Some(bytes.iter().fold(0u64, |v, b| (v << 8) | u64::from(*b)))
    }

    fn u64(&mut self) -> Option<u64> {
        self.unsigned()
    }

    fn u32(&mut self) -> Option<u32> {
        self.unsigned().and_then(|v| u32::try_from(v).ok())
    }

    fn i64(&mut self) -> Option<i64> {
        rmp::decode::read_int(&mut self.0).ok()
    }

    fn f64(&mut self) -> Option<f64> {
        match self.peek()? {
            Marker::F64 => rmp::decode::read_f64(&mut self.0).ok(),
            Marker::F32 => rmp::decode::read_f32(&mut self.0).ok().map(f64::from),
            _ => self.u64().map(|v| v as f64),
        }
    }

    /// Any value, kept (extra keys) or skipped (unknown fields).
    fn value(&mut self) -> Option<Value> {
        rmpv::decode::read_value_with_max_depth(&mut self.0, VALUE_DEPTH).ok()
    }

    fn opt_u32(&mut self) -> Option<Option<u32>> {
        if self.nil() {
            return Some(None);
        }
        self.u32().map(Some)
    }

    fn opt_string(&mut self) -> Option<Option<String>> {
        if self.nil() {
            return Some(None);
        }
        self.str().map(|s| Some(s.to_owned()))
    }

    fn hash(&mut self) -> Option<BlockHash> {
        match self.peek()? {
            Marker::Bin8 | Marker::Bin16 | Marker::Bin32 => {
                self.bin().map(|b| BlockHash::Bytes(b.to_vec()))
            }
            _ => self.u64().map(BlockHash::Int),
        }
    }

    fn hashes(&mut self) -> Option<Vec<BlockHash>> {
        let n = self.array_len()?;
        // Every element takes at least one byte: the length cannot make us
        // allocate more than the payload justifies.
        let mut out = Vec::with_capacity(n.min(self.0.len()));
        for _ in 0..n {
            out.push(self.hash()?);
        }
        Some(out)
    }

    fn token_ids(&mut self) -> Option<Vec<u32>> {
        let n = self.array_len()?;
        let mut out = Vec::with_capacity(n.min(self.0.len()));
        for _ in 0..n {
            out.push(self.u32()?);
        }
        Some(out)
    }

    fn batch(&mut self) -> Option<Batch> {
        if self.peek().is_some_and(is_map) {
            let n = self.map_len()?;
            let (mut ts, mut events, mut dp) = (None, None, None);
            for _ in 0..n {
                // A duplicated key: the reference decoder keeps the last.
                match self.str()? {
                    "ts" if ts.is_none() => ts = Some(self.f64()?),
                    "events" if events.is_none() => events = Some(self.events()?),
                    "data_parallel_rank" | "dp_rank" if dp.is_none() => dp = Some(self.opt_u32()?),
                    "ts" | "events" | "data_parallel_rank" | "dp_rank" => return None,
                    _ => {
                        self.value()?;
                    }
                }
            }
            let (events, skipped_events) = events?;
            return Some(Batch { ts: ts?, events, dp_rank: dp.flatten(), skipped_events });
        }
        let n = self.array_len()?;
        if n < 2 {
            return None;
        }
        let ts = self.f64()?;
        let (events, skipped_events) = self.events()?;
        let dp_rank = if n >= 3 { self.opt_u32()? } else { None };
        for _ in 3..n {
            self.value()?;
        }
        Some(Batch { ts, events, dp_rank, skipped_events })
    }

    fn events(&mut self) -> Option<(Vec<Event>, u32)> {
        let n = self.array_len()?;
        let mut out = Vec::with_capacity(n.min(self.0.len()));
        let mut skipped = 0u32;
        for _ in 0..n {
            match self.event()? {
                Some(ev) => out.push(ev),
                None => skipped = skipped.saturating_add(1),
            }
        }
        Some((out, skipped))
    }

    /// `Some(None)`: an unknown tag, skipped.
    fn event(&mut self) -> Option<Option<Event>> {
        let mut f = EventFields::default();
        if self.peek().is_some_and(is_map) {
            let n = self.map_len()?;
            for _ in 0..n {
                let key = self.str()?;
                if key == "type" {
                    if f.tag.is_some() {
                        return None;
                    }
                    f.tag = Some(self.str()?);
                } else {
                    f.read(self, key)?;
                }
            }
        } else {
            let n = self.array_len()?;
            if n == 0 {
                return None;
            }
            let tag = self.str()?;
            f.tag = Some(tag);
            let order: &[&str] = match tag {
                "BlockStored" => &STORED_FIELDS,
                "BlockRemoved" => &REMOVED_FIELDS,
                _ => &[],
            };
            for i in 1..n {
                match order.get(i - 1) {
                    Some(name) => f.read(self, name)?,
                    None => {
                        self.value()?;
                    }
                }
            }
        }
        f.into_event()
    }
}

fn is_map(m: Marker) -> bool {
    matches!(m, Marker::FixMap(_) | Marker::Map16 | Marker::Map32)
}

/// The fields of either event kind, as read so far (`BlockRemoved`'s are a
/// subset of `BlockStored`'s, with the same types).
#[derive(Default)]
struct EventFields<'a> {
    tag: Option<&'a str>,
    seen: u16,
    block_hashes: Option<Vec<BlockHash>>,
    parent_block_hash: Option<BlockHash>,
    token_ids: Vec<u32>,
    block_size: u32,
    lora_id: Option<i64>,
    medium: Option<Medium>,
    lora_name: Option<String>,
    extra_keys: Option<Vec<Value>>,
    group_idx: Option<u32>,
    kv_cache_spec_kind: Option<String>,
    kv_cache_spec_sliding_window: Option<u32>,
}

impl EventFields<'_> {
    fn read(&mut self, rd: &mut Reader<'_>, name: &str) -> Option<()> {
        let Some(bit) = STORED_FIELDS.iter().position(|f| *f == name) else {
            rd.value()?;
            return Some(());
        };
        // A field named twice: the reference decoder takes the first.
        if self.seen & (1 << bit) != 0 {
            return None;
        }
        self.seen |= 1 << bit;
        // Absent and nil are the same everywhere (block_hashes: missing,
        // which the reference decoder reports).
        if rd.nil() {
            return (name != "block_hashes").then_some(());
        }
        match name {
            "block_hashes" => self.block_hashes = Some(rd.hashes()?),
            "parent_block_hash" => self.parent_block_hash = Some(rd.hash()?),
            "token_ids" => self.token_ids = rd.token_ids()?,
            "block_size" => self.block_size = rd.u32()?,
            "lora_id" => self.lora_id = Some(rd.i64()?),
            "medium" => self.medium = Some(Medium::from_wire(rd.str()?)),
            "lora_name" => self.lora_name = Some(rd.str()?.to_owned()),
            "extra_keys" => match rd.value()? {
                Value::Array(items) => self.extra_keys = Some(items),
                _ => return None,
            },
            "group_idx" => self.group_idx = Some(rd.u32()?),
            "kv_cache_spec_kind" => self.kv_cache_spec_kind = rd.opt_string()?,
            "kv_cache_spec_sliding_window" => self.kv_cache_spec_sliding_window = rd.opt_u32()?,
            _ => return None,
        }
        Some(())
    }

    fn into_event(self) -> Option<Option<Event>> {
        // Fields that only BlockStored has: in a BlockRemoved the reference
        // decoder ignores them whatever they hold, so leave those to it.
        let stored_only = self.seen & !removed_mask() != 0;
        match self.tag? {
            "BlockStored" => Some(Some(Event::Stored(BlockStored {
                block_hashes: self.block_hashes?,
                parent_block_hash: self.parent_block_hash,
                token_ids: self.token_ids,
                block_size: self.block_size,
                lora_id: self.lora_id,
                medium: self.medium,
                lora_name: self.lora_name,
                extra_keys: self.extra_keys,
                group_idx: self.group_idx,
                kv_cache_spec_kind: self.kv_cache_spec_kind,
                kv_cache_spec_sliding_window: self.kv_cache_spec_sliding_window,
            }))),
            "BlockRemoved" if !stored_only => Some(Some(Event::Removed(BlockRemoved {
                block_hashes: self.block_hashes?,
                medium: self.medium,
                group_idx: self.group_idx,
            }))),
            "AllBlocksCleared" if self.seen == 0 => Some(Some(Event::AllCleared)),
            "BlockRemoved" | "AllBlocksCleared" => None,
            _ if self.seen == 0 => Some(None),
            _ => None,
        }
    }
}

fn removed_mask() -> u16 {
    REMOVED_FIELDS
        .iter()
        .filter_map(|r| STORED_FIELDS.iter().position(|f| f == r))
        .fold(0, |m, bit| m | (1 << bit))
}
