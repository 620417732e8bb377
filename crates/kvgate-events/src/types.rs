//! Typed KV-cache events, independent of the layout they arrived in.
//!
//! The shapes follow vLLM's `KVEventBatch`, `BlockStored`, `BlockRemoved` and
//! `AllBlocksCleared` (FIELD.md §1). Optional fields stay `Option` so that an
//! encoder can reproduce "omitted" versus "null" faithfully, and so that the
//! index can tell a CPU placeholder (no tokens, no parent) from a full store.

/// One engine block hash. vLLM sends either a msgpack int (u64, the default)
/// or 32 raw sha256 bytes; one engine always uses one form.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum BlockHash {
    /// `VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1` (default): a 64-bit int.
    Int(u64),
    /// Raw hash bytes (normally 32 bytes of sha256).
    Bytes(Vec<u8>),
}

impl BlockHash {
    /// A 64-bit identity for this hash, used as a map key by the index.
    ///
    /// Ints are taken as they are. Byte hashes are folded with xxh3-style
    /// mixing over all bytes, so that short or non-random byte strings still
    /// spread well; a 64-bit collision inside one replica is as unlikely as a
    /// collision of the engine's own hash.
    pub fn fold_u64(&self) -> u64 {
        match self {
            BlockHash::Int(v) => *v,
            BlockHash::Bytes(b) => fold_bytes(b),
        }
    }
}

/// FNV-1a followed by a murmur3-style finaliser: dependency-free, stable
/// across releases (the fold is part of no wire format, but tests pin it).
fn fold_bytes(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

/// Where a block lives, as named by the `medium` field.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Medium {
    /// `"GPU"`.
    Gpu,
    /// `"CPU"` (offloading connector).
    Cpu,
    /// `"STORAGE"` (vLLM 0.33).
    Storage,
    /// `"FS"` (vLLM 0.26).
    Fs,
    /// `"OBJ"` (vLLM 0.26).
    Obj,
    /// Any other name; kept verbatim so that it can be reported and re-encoded.
    Other(String),
}

impl Medium {
    /// Parses a wire name. Unknown names are kept, not rejected.
    pub fn from_wire(name: &str) -> Medium {
        match name {
            "GPU" => Medium::Gpu,
            "CPU" => Medium::Cpu,
            "STORAGE" => Medium::Storage,
            "FS" => Medium::Fs,
            "OBJ" => Medium::Obj,
            other => Medium::Other(other.to_owned()),
        }
    }

    /// The wire name.
    pub fn as_wire(&self) -> &str {
        match self {
            Medium::Gpu => "GPU",
            Medium::Cpu => "CPU",
            Medium::Storage => "STORAGE",
            Medium::Fs => "FS",
            Medium::Obj => "OBJ",
            Medium::Other(s) => s,
        }
    }

    /// The residency tier this medium maps to. `None` (null or omitted) is
    /// the GPU, as in vLLM. Every non-GPU, non-CPU medium is a storage tier.
    pub fn tier(medium: Option<&Medium>) -> Tier {
        match medium {
            None | Some(Medium::Gpu) => Tier::Gpu,
            Some(Medium::Cpu) => Tier::Cpu,
            Some(_) => Tier::Storage,
        }
    }
}

/// Residency tiers, fastest first. A lower tier costs a transfer, not a
/// recompute.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Tier {
    /// On the engine's GPU: a hit costs nothing.
    Gpu = 0,
    /// Offloaded to host memory.
    Cpu = 1,
    /// Disk, file system or object store.
    Storage = 2,
}

impl Tier {
    /// All tiers, fastest first.
    pub const ALL: [Tier; 3] = [Tier::Gpu, Tier::Cpu, Tier::Storage];

    /// Upper-case label used in logs, JSON and metrics.
    pub fn label(self) -> &'static str {
        match self {
            Tier::Gpu => "GPU",
            Tier::Cpu => "CPU",
            Tier::Storage => "STORAGE",
        }
    }
}

/// vLLM's `BlockStored`: `block_hashes.len()` full blocks, chained.
#[derive(Clone, Debug, PartialEq)]
pub struct BlockStored {
    /// One hash per stored block; block `i`'s parent is block `i - 1`.
    pub block_hashes: Vec<BlockHash>,
    /// The parent of the first block; `None` at the start of a sequence.
    pub parent_block_hash: Option<BlockHash>,
    /// `block_size * block_hashes.len()` tokens, or empty for a CPU placeholder.
    pub token_ids: Vec<u32>,
    /// Tokens per block; 0 in CPU placeholders.
    pub block_size: u32,
    /// Deprecated LoRA id.
    pub lora_id: Option<i64>,
    /// Where the blocks were stored; `None` means GPU.
    pub medium: Option<Medium>,
    /// LoRA adapter name; part of the block identity.
    pub lora_name: Option<String>,
    /// One entry per block (LoRA name, multimodal ids, cache_salt...), kept
    /// as raw msgpack values because their shape varies by feature.
    pub extra_keys: Option<Vec<rmpv::Value>>,
    /// KV cache group (hybrid models).
    pub group_idx: Option<u32>,
    /// `"full_attention"`, `"sliding_window"`, `"mamba"`, ...
    pub kv_cache_spec_kind: Option<String>,
    /// Sliding window size for sliding-window groups.
    pub kv_cache_spec_sliding_window: Option<u32>,
}

impl BlockStored {
    /// A GPU store of full blocks with every optional field unset, as a
    /// base-model engine without hybrid groups publishes it.
    pub fn new(
        block_hashes: Vec<BlockHash>,
        parent_block_hash: Option<BlockHash>,
        token_ids: Vec<u32>,
        block_size: u32,
    ) -> BlockStored {
        BlockStored {
            block_hashes,
            parent_block_hash,
            token_ids,
            block_size,
            lora_id: None,
            medium: None,
            lora_name: None,
            extra_keys: None,
            group_idx: None,
            kv_cache_spec_kind: None,
            kv_cache_spec_sliding_window: None,
        }
    }

    /// A CPU-offload placeholder names hashes that GPU events already
    /// described, without tokens.
    pub fn is_placeholder(&self) -> bool {
        self.token_ids.is_empty()
    }

    /// Whether this store belongs to the group that decides prefix reuse.
    /// Stores without a spec kind are from engines without hybrid groups.
    pub fn is_full_attention(&self) -> bool {
        self.kv_cache_spec_kind.as_deref().is_none_or(|k| k == FULL_ATTENTION)
    }
}

/// The spec kind of the KV group that decides prefix reuse.
pub const FULL_ATTENTION: &str = "full_attention";

/// vLLM's `BlockRemoved`.
#[derive(Clone, Debug, PartialEq)]
pub struct BlockRemoved {
    /// Hashes of removed blocks.
    pub block_hashes: Vec<BlockHash>,
    /// Tier they were removed from; `None` means GPU.
    pub medium: Option<Medium>,
    /// KV cache group (hybrid models).
    pub group_idx: Option<u32>,
}

/// One KV-cache event.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// Blocks became resident.
    Stored(BlockStored),
    /// Blocks were evicted.
    Removed(BlockRemoved),
    /// Everything on the replica was dropped (prefix-cache reset).
    AllCleared,
}

impl Event {
    /// The wire tag (`"BlockStored"`, ...).
    pub fn tag(&self) -> &'static str {
        match self {
            Event::Stored(_) => "BlockStored",
            Event::Removed(_) => "BlockRemoved",
            Event::AllCleared => "AllBlocksCleared",
        }
    }
}

/// One published batch (one msgpack payload).
#[derive(Clone, Debug, PartialEq)]
pub struct Batch {
    /// Engine wall-clock timestamp, seconds.
    pub ts: f64,
    /// Events in publication order.
    pub events: Vec<Event>,
    /// Data-parallel rank, when the engine sent one.
    pub dp_rank: Option<u32>,
    /// Events with a tag this decoder does not know (a newer vLLM). They are
    /// skipped rather than failing the batch, and counted here so that the
    /// caller can surface them.
    pub skipped_events: u32,
}
