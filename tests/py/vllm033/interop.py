#!/usr/bin/env python3
"""vLLM 0.33's own code produces what kvgate's interop tests check against.

Usage: interop.py VLLM_ROOT SEED  -> one JSON document on stdout:

  "extra_keys": requests with random tokens, LoRA adapters and cache salts.
      For each: its tokens, adapter, salt; the block hashes vLLM computes for
      it (hash_block_tokens over generate_block_hash_extra_keys, hex); and
      the GPU BlockStored that vLLM's block pool would publish for it (vLLM's
      event classes, to_event_extra_keys), msgpack-encoded in a KVEventBatch
      as the ZMQ publisher encodes it (hex).
  "offload": scenarios of the offloading connector. Each has batches (hex)
      built from vLLM's own BlockStored/BlockRemoved for the GPU side and from
      vLLM's OffloadingEventsTracker for the CPU side (self-describing chunks
      that re-announce shared hashes, and legacy placeholders), in the order
      vLLM emits them within a step (manager events first, connector events
      after), and after each batch the residency per tier that the engine
      then has (hex block hashes), computed here from the scenario itself.

Definitions are executed from VLLM_ROOT (see vllm_code.py); the stand-ins
below are what those definitions reference but kvgate does not test:
vLLM's logger, its environment flags, and the Request object's fields.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import enum
import hashlib
import json
import pathlib
import random
import sys
import types
import typing

import msgspec

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from vllm_code import load  # noqa: E402


class _Logger:
    def warning_once(self, *_a, **_k):
        pass

    warning = debug = info = warning_once


def namespace() -> dict:
    # A real module: dataclasses and msgspec look their classes' module up.
    module = types.ModuleType("vllm_033_under_test")
    sys.modules[module.__name__] = module
    ns = module.__dict__
    for mod in (typing, collections.abc, dataclasses, enum):
        ns.update({k: getattr(mod, k) for k in dir(mod) if not k.startswith("_")})
    ns.update(
        msgspec=msgspec,
        hashlib=hashlib,
        TYPE_CHECKING=False,
        logger=_Logger(),
        envs=types.SimpleNamespace(VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=False),
        # Only named in annotations of the definitions loaded.
        Request=object,
        KVCacheGroupSpec=object,
        KVCacheSpec=object,
    )
    return ns


def load_vllm(root: pathlib.Path) -> dict:
    ns = namespace()
    load(
        root,
        "vllm/v1/core/kv_cache_utils.py",
        [
            "BlockHash",
            "ExternalBlockHash",
            "maybe_convert_block_hash",
            "_gen_mm_extra_hash_keys",
            "_gen_lora_extra_hash_keys",
            "_gen_prompt_embeds_extra_hash_keys",
            "generate_block_hash_extra_keys",
            "to_event_extra_keys",
            "hash_block_tokens",
            "BlockHashListWithBlockSize",
            "BlockHashList",
            "resolve_block_hashes",
        ],
        ns,
    )
    load(
        root,
        "vllm/distributed/kv_events.py",
        [
            "EventBatch",
            "KVCacheEvent",
            "MEDIUM_GPU",
            "MEDIUM_CPU",
            "MEDIUM_STORAGE",
            "BlockStored",
            "BlockRemoved",
            "AllBlocksCleared",
            "KVEventBatch",
        ],
        ns,
    )
    load(
        root,
        "vllm/v1/kv_offload/base.py",
        [
            "OffloadKey",
            "make_offload_key",
            "get_offload_block_hash",
            "get_offload_group_idx",
            "Medium",
            "Locality",
            "OffloadingEvent",
            "OffloadingKVEventsConfig",
        ],
        ns,
    )
    load(
        root,
        "vllm/distributed/kv_transfer/kv_connector/v1/offloading/events.py",
        [
            "_MEDIUM_TO_EVENT_STR",
            "_PRIMARY_RESIDENCY",
            "OffloadingEventGroupSpec",
            "_OffloadEventMetadata",
            "OffloadingEventsTracker",
        ],
        ns,
    )
    # The engine's hash function and root: any deterministic digest will do
    # (kvgate never sees what vLLM hashes, only whether two blocks share).
    ns["NONE_HASH"] = ns["BlockHash"](hashlib.sha256(b"kvgate interop NONE_HASH").digest())
    return ns


def hash_fn(obj) -> bytes:
    return hashlib.sha256(repr(obj).encode()).digest()


class Lora:
    def __init__(self, name: str):
        self.lora_name = self.name = name
        self.lora_path = f"/adapters/{name}"
        self.adapter_id = {"l1": 1, "l2": 2}.get(name, 9)


class Req:
    """The fields of vllm.v1.request.Request that the loaded code reads."""

    def __init__(self, tokens, lora, salt, block_size, vllm):
        self.all_token_ids = list(tokens)
        self.lora_request = Lora(lora) if lora else None
        self.cache_salt = salt
        self.mm_features = []
        self.prompt_embeds = None
        self._prompt_embeds_per_block_hashes = {}
        self.extra_keys = []
        self.block_hashes = []
        parent = None
        for b in range(len(tokens) // block_size):
            start, end = b * block_size, (b + 1) * block_size
            extra, _ = vllm["generate_block_hash_extra_keys"](self, start, end, 0)
            h = vllm["hash_block_tokens"](hash_fn, parent, tokens[start:end], extra)
            self.extra_keys.append(extra)
            self.block_hashes.append(h)
            parent = h


def encode(vllm, events) -> str:
    batch = vllm["KVEventBatch"](ts=1.0, events=events, data_parallel_rank=None)
    return msgspec.msgpack.Encoder().encode(batch).hex()


def gpu_store(vllm, req, first, last, bs) -> object:
    """BlockStored for blocks [first, last) as vLLM's block pool builds it."""
    conv = vllm["maybe_convert_block_hash"]
    return vllm["BlockStored"](
        block_hashes=[conv(h) for h in req.block_hashes[first:last]],
        parent_block_hash=conv(req.block_hashes[first - 1]) if first > 0 else None,
        token_ids=req.all_token_ids[first * bs : last * bs],
        block_size=bs,
        lora_id=req.lora_request.adapter_id if req.lora_request else None,
        medium=vllm["MEDIUM_GPU"],
        lora_name=req.lora_request.name if req.lora_request else None,
        extra_keys=vllm["to_event_extra_keys"](req.extra_keys[first:last]),
        group_idx=0,
    )


def gpu_remove(vllm, hashes) -> object:
    conv = vllm["maybe_convert_block_hash"]
    return vllm["BlockRemoved"](
        block_hashes=[conv(h) for h in hashes], medium=vllm["MEDIUM_GPU"], group_idx=0
    )


def extra_keys_cases(vllm, rng: random.Random) -> list[dict]:
    bs = 4
    stems = [[rng.randrange(3) for _ in range(6 * bs)] for _ in range(3)]
    cases = []
    for _ in range(60):
        stem = rng.choice(stems)
        cut = rng.randrange(0, len(stem) + 1)
        tail = [rng.randrange(3) for _ in range(rng.randrange(0, 3 * bs))]
        tokens = stem[:cut] + tail
        if len(tokens) < bs:
            tokens += [0] * bs
        lora = rng.choice([None, None, "l1", "l2"])
        salt = rng.choice([None, None, "a", "b"])
        req = Req(tokens, lora, salt, bs, vllm)
        n = len(req.block_hashes)
        cases.append(
            {
                "tokens": tokens,
                "block_size": bs,
                "lora": lora,
                "salt": salt,
                "vllm_hashes": [h.hex() for h in req.block_hashes],
                "gpu_batch": encode(vllm, [gpu_store(vllm, req, 0, n, bs)]),
            }
        )
    return cases


class Group:
    """The GroupOffloadConfig fields the tracker reads."""

    def __init__(self, blocks_per_chunk: int, bs: int):
        self.group_idx = 0
        self.hashes_per_chunk = blocks_per_chunk
        self.tokens_per_chunk = blocks_per_chunk * bs
        self.tokens_per_block = bs
        self.sliding_window_size_in_chunks = None
        self.kv_event_group_spec = None  # filled in offload_scenario


def offload_scenario(vllm, self_describing: bool) -> dict:
    """Two requests share a prefix that ends mid-chunk. Their GPU blocks are
    stored, offloaded chunk by chunk to CPU, partly evicted from the GPU (in
    the same batch as, and before, the CPU stores); one request's chunks are
    then evicted from CPU while some of its blocks are still on the GPU, and
    last the GPU drops the rest."""
    bs, per_chunk = 4, 2
    group = Group(per_chunk, bs)
    group.kv_event_group_spec = vllm["OffloadingEventGroupSpec"]("full_attention", None)
    config = vllm["OffloadingKVEventsConfig"](
        enable_kv_cache_events=True, self_describing_kv_events=self_describing
    )
    tracker = vllm["OffloadingEventsTracker"](config, {0: group.kv_event_group_spec})
    medium_cpu = vllm["Medium"].CPU
    key_of = vllm["make_offload_key"]
    offload_event = vllm["OffloadingEvent"]
    # Shared: block 0 and half of block 1, so chunk 0 differs but for its
    # first block, which both chunks announce. Eight blocks, four chunks each.
    common = [7, 7, 7, 7, 1, 2]
    r1 = Req(common + list(range(100, 126)), "l1", "tenant", bs, vllm)
    r2 = Req(common + list(range(200, 226)), "l1", "tenant", bs, vllm)
    assert r1.block_hashes[0] == r2.block_hashes[0]
    assert r1.block_hashes[1] != r2.block_hashes[1]
    batches = []
    expected = []
    gpu: set = set()
    cpu: dict = {}  # offload key -> hashes the chunk announces

    def residency() -> dict:
        held = {h.hex() for hashes in cpu.values() for h in hashes}
        return {"GPU": sorted(h.hex() for h in gpu), "CPU": sorted(held)}

    # Step 1: the GPU caches both (r2's first block is a prefix hit).
    batches.append(encode(vllm, [gpu_store(vllm, r1, 0, 8, bs), gpu_store(vllm, r2, 1, 8, bs)]))
    gpu |= set(r1.block_hashes) | set(r2.block_hashes)
    expected.append(residency())

    # Step 2: the GPU evicts r1's blocks 0..3; then the connector's events:
    # every chunk of both requests lands on CPU. Keys in reverse order:
    # "events are self-contained (own parent), so key order is free".
    manager_events = [gpu_remove(vllm, r1.block_hashes[0:4])]
    gpu -= set(r1.block_hashes[0:4])
    keys = []
    for req in (r1, r2):
        for chunk in range(4):
            key = key_of(req.block_hashes[chunk * per_chunk + per_chunk - 1], 0)
            tracker.record_store(req, group, chunk, key)
            keys.append(key)
            announced = req.block_hashes[chunk * per_chunk : (chunk + 1) * per_chunk]
            # Legacy placeholders name the chunk's key hash only.
            cpu[key] = list(announced) if self_describing else [announced[-1]]
    stored = offload_event(keys=list(reversed(keys)), medium=medium_cpu, removed=False)
    connector_events = list(tracker.take_events([stored]))
    batches.append(encode(vllm, manager_events + connector_events))
    expected.append(residency())

    # Step 3: the CPU evicts r1's chunks while the GPU still holds r1's
    # blocks 4..7 (CPU removal first; blocks 0..3 went GPU first, step 2).
    r1_keys = keys[:4]
    evicted = offload_event(keys=r1_keys, medium=medium_cpu, removed=True)
    batches.append(encode(vllm, list(tracker.take_events([evicted]))))
    for key in r1_keys:
        del cpu[key]
    expected.append(residency())

    # Step 4: the GPU drops everything else.
    rest = [h for h in r1.block_hashes[4:] + r2.block_hashes if h in gpu]
    batches.append(encode(vllm, [gpu_remove(vllm, rest)]))
    gpu.clear()
    expected.append(residency())
    return {
        "self_describing": self_describing,
        "block_size": bs,
        "batches": batches,
        # After each batch.
        "expected": expected,
        # The prompts, for a match check under the requests' own keys.
        "prompts": [
            {"tokens": r.all_token_ids, "lora": "l1", "salt": "tenant"} for r in (r1, r2)
        ],
    }


def main() -> None:
    root = pathlib.Path(sys.argv[1])
    seed = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    vllm = load_vllm(root)
    rng = random.Random(seed)
    out = {
        "extra_keys": extra_keys_cases(vllm, rng),
        "offload": [offload_scenario(vllm, True), offload_scenario(vllm, False)],
    }
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
