//! The positional field order of vLLM's KV events (msgspec `array_like`
//! layouts), shared by the general decoder and the fast path. Its own module
//! so that the fast path, which the general decoder calls first, does not
//! import the general decoder back.

/// Positional field order of `BlockStored` in array-like layouts (after the tag).
pub(crate) const STORED_FIELDS: [&str; 11] = [
    "block_hashes",
    "parent_block_hash",
    "token_ids",
    "block_size",
    "lora_id",
    "medium",
    "lora_name",
    "extra_keys",
    "group_idx",
    "kv_cache_spec_kind",
    "kv_cache_spec_sliding_window",
];
/// Positional field order of `BlockRemoved` in array-like layouts.
pub(crate) const REMOVED_FIELDS: [&str; 3] = ["block_hashes", "medium", "group_idx"];
