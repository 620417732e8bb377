#!/usr/bin/env python3
"""Write the vLLM KV-event payload fixtures for kvgate-events' decoder tests.

Each fixture is one msgpack-encoded KV event batch, produced by msgspec from
the per-release Struct classes in vllm_publisher.py, and expected.json lists
for every file the batch a correct decoder should see, normalised:

  {"ts": float, "dp_rank": int | null, "events": [
     {"type": "BlockStored", "block_hashes": [..], "parent_block_hash": ..,
      "token_ids": [..], "block_size": int, "lora_id": .., "medium": ..,
      "lora_name": .., "group_idx": .., "kv_cache_spec_kind": ..,
      "kv_cache_spec_sliding_window": ..},
     {"type": "BlockRemoved", "block_hashes": [..], "medium": .., "group_idx": ..},
     {"type": "AllBlocksCleared"}]}

Hashes are JSON integers (u64) in int form and lowercase hex strings (32 bytes)
in bytes form; fields absent from the payload are null. Fields outside that
list (extra_keys, locality, ownership, session_id, lookahead_token_ids and
other unknown fields) are not part of the expectation: decoders must skip them.

Usage (after scripts/setup-test-env.sh):
  .cache/venv/bin/python tests/py/gen_fixtures.py [--out DIR] [--check]

The output is deterministic: re-running rewrites identical bytes. --check
exits 1 when the files on disk differ from what would be written.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import msgspec

sys.dont_write_bytecode = True  # no __pycache__ next to the sources
sys.path.insert(0, str(Path(__file__).resolve().parent))
import vllm_publisher as vp  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_OUT = ROOT / "crates" / "kvgate-events" / "tests" / "fixtures"

TS = 1700000000.5
H_A = 1001
H_B = 15760518052499183552  # above 2**63: must be read as u64, not i64
H_C = 2**63 + 1
H_D = 42

STORED_KEYS = (
    "block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium",
    "lora_name", "group_idx", "kv_cache_spec_kind", "kv_cache_spec_sliding_window",
)
REMOVED_KEYS = ("block_hashes", "medium", "group_idx")

# Positional field order of array events, widest version first; older versions
# are prefixes of it.
ARRAY_STORED_ORDER = (
    "block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium",
    "lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind", "kv_cache_spec_sliding_window",
)
ARRAY_REMOVED_ORDER = ("block_hashes", "medium", "group_idx")


# A producer that leaves out every null field, even ones vLLM always writes
# (lora_id, medium, lora_name, parent_block_hash). Not a vLLM release; it checks
# that absent keys decode as null.
class StoredMinimal(vp.EventMap, tag="BlockStored"):
    block_hashes: list[Any]
    token_ids: list[int]
    block_size: int
    parent_block_hash: Any = None
    lora_id: int | None = None
    medium: str | None = None
    lora_name: str | None = None


class RemovedMinimal(vp.EventMap, tag="BlockRemoved"):
    block_hashes: list[Any]
    medium: str | None = None


SYNTHETIC = vp.Layout("synthetic", vp.BatchArray, StoredMinimal, RemovedMinimal, vp.ClearedMap, 3)


def stored(hashes, parent, tokens, block_size, medium="GPU", **more) -> dict[str, Any]:
    ev = {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent,
          "token_ids": tokens, "block_size": block_size, "lora_id": None, "medium": medium,
          "lora_name": None}
    ev.update(more)
    return ev


def removed(hashes, medium="GPU", **more) -> dict[str, Any]:
    ev = {"type": "BlockRemoved", "block_hashes": hashes, "medium": medium}
    ev.update(more)
    return ev


CLEARED = {"type": "AllBlocksCleared"}

BASIC_EVENTS = [
    # Two full GPU blocks of 4 tokens at the start of a sequence.
    stored([H_A, H_B], None, [1, 2, 3, 4, 5, 6, 7, 8], 4),
    # One more block chained onto the second.
    stored([H_C], H_B, [9, 10, 11, 12], 4),
    removed([H_A]),
    # CPU offload placeholder: hashes only.
    stored([H_A, H_B], None, [], 0, medium="CPU"),
    CLEARED,
]

UNKNOWN_FIELD_EVENTS = [
    stored([H_A, H_B], None, [1, 2, 3, 4, 5, 6, 7, 8], 4,
           lora_id=3, lora_name="adapter-1",
           extra_keys=[["adapter-1", ["mm-7f3a", 0], "salt-1"], ["adapter-1"]],
           group_idx=0, kv_cache_spec_kind="full_attention",
           extra_fields={"locality": "LOCAL", "ownership": "tier-a", "session_id": "sess-1",
                         "lookahead_token_ids": [13, 14],
                         "some_future_field": {"nested": [1, "x", None], "flag": True}}),
    stored([H_C], H_B, [9, 10, 11, 12], 4, group_idx=1, kv_cache_spec_kind="sliding_window",
           kv_cache_spec_sliding_window=4096,
           extra_keys=[[b"\x00\x01prompt-embeds-digest"]],
           extra_fields={"some_future_field": 1.25}),
    removed([H_A], group_idx=1,
            extra_fields={"locality": "REMOTE", "ownership": "tier-b", "some_future_field": [b"\xff"]}),
    CLEARED,
]

# A hybrid model: the same hashes in a full-attention and a sliding-window group.
HYBRID_EVENTS = [
    stored([H_A, H_B], None, [1, 2, 3, 4, 5, 6, 7, 8], 4, group_idx=0,
           kv_cache_spec_kind="full_attention", extra_keys=[None, None]),
    stored([H_A, H_B], None, [1, 2, 3, 4, 5, 6, 7, 8], 4, group_idx=1,
           kv_cache_spec_kind="sliding_window", kv_cache_spec_sliding_window=128,
           extra_keys=[None, None]),
    removed([H_A], group_idx=1),
]

MINIMAL_EVENTS = [
    {"type": "BlockStored", "block_hashes": [H_A, H_B], "token_ids": [1, 2, 3, 4, 5, 6, 7, 8],
     "block_size": 4},
    {"type": "BlockRemoved", "block_hashes": [H_A]},
    CLEARED,
]

MEDIA = ["GPU", "CPU", "STORAGE", "FS", "OBJ", None]
MEDIA_EVENTS = [stored([H_D + i], None, [i, i + 1], 2, medium=m) for i, m in enumerate(MEDIA)] + [
    removed([H_D + i], medium=m) for i, m in enumerate(MEDIA)
]

LORA_ARRAY_EVENTS = [
    {**stored([H_A, H_B], None, [1, 2, 3, 4, 5, 6, 7, 8], 4, lora_name="adapter-1",
              extra_keys=[["adapter-1"], ["adapter-1"]], group_idx=0,
              kv_cache_spec_kind="full_attention"), "lora_id": 7},
    removed([H_A], group_idx=0),
    CLEARED,
]

LAYOUT_NAMES = {"0.9": "v09", "0.11": "v011", "array-ext": "array_ext", "0.26": "v026",
                "main": "main", "latest": "latest", "synthetic": "synthetic"}

# (case, layout, hash form, events, dp_rank, description)
CASES: list[tuple[str, vp.Layout, str, list[dict[str, Any]], int | None, str]] = []
for _lay in ("0.11", "0.26", "main"):
    for _form in ("int", "bytes"):
        CASES.append((f"basic_{LAYOUT_NAMES[_lay]}_{_form}", vp.LAYOUTS[_lay], _form, BASIC_EVENTS, 0,
                      "GPU chain of 2 blocks, chained store, removal, CPU placeholder, clear"))
CASES += [
    ("unknown_fields_v026_int", vp.LAYOUTS["0.26"], "int", UNKNOWN_FIELD_EVENTS, 0,
     "map events with extra_keys, group fields and unknown fields (to be ignored)"),
    ("unknown_fields_v026_bytes", vp.LAYOUTS["0.26"], "bytes", UNKNOWN_FIELD_EVENTS, 0,
     "as unknown_fields_v026_int with 32-byte hashes; extra_keys hold msgpack bin"),
    ("unknown_fields_main_int", vp.LAYOUTS["main"], "int", UNKNOWN_FIELD_EVENTS, 1,
     "map batch with map events carrying unknown fields"),
    ("hybrid_groups_v026_int", vp.LAYOUTS["0.26"], "int", HYBRID_EVENTS, 0,
     "same hashes stored in group 0 (full attention) and group 1 (sliding window 128); removal in group 1"),
    ("omitted_defaults_v026_int", vp.LAYOUTS["0.26"], "int", MINIMAL_EVENTS, None,
     "map events with every defaulted field omitted; array batch with nil dp rank"),
    ("omitted_defaults_main_int", vp.LAYOUTS["main"], "int", MINIMAL_EVENTS, None,
     "map batch without data_parallel_rank; map events with defaulted fields omitted"),
    ("minimal_keys_synthetic_int", SYNTHETIC, "int", MINIMAL_EVENTS, 0,
     "not a vLLM release: map events that also omit parent_block_hash, lora_id, medium, lora_name"),
    ("media_v026_int", vp.LAYOUTS["0.26"], "int", MEDIA_EVENTS, 0,
     "one store and one removal per medium: GPU, CPU, STORAGE, FS, OBJ, null"),
    ("media_v011_int", vp.LAYOUTS["0.11"], "int", MEDIA_EVENTS, 0,
     "array events, one store and one removal per medium"),
    ("map_batch_dp_main_int", vp.LAYOUTS["main"], "int", BASIC_EVENTS[:1], 3,
     "map batch with data_parallel_rank 3"),
    ("array_batch_no_dp_v09_int", vp.LAYOUTS["0.9"], "int", BASIC_EVENTS, None,
     "vLLM 0.9: 2-element array batch, stores without medium, removals with hashes only"),
    ("dp_nil_v011_int", vp.LAYOUTS["0.11"], "int", BASIC_EVENTS[:2], None,
     "0.11 array batch whose dp rank is nil (3 elements: msgspec never omits array fields)"),
    ("array_ext_int", vp.LAYOUTS["array-ext"], "int", LORA_ARRAY_EVENTS, 0,
     "array events with lora_name, extra_keys, group_idx, kv_cache_spec_* appended"),
    ("array_ext_trailing_unknown_int", vp.LAYOUTS["array-ext"], "int",
     [{**LORA_ARRAY_EVENTS[0], "extra_fields": {"locality": "LOCAL", "future": [1, 2]}},
      {**LORA_ARRAY_EVENTS[1], "extra_fields": {"locality": "LOCAL"}}, CLEARED], 0,
     "array events with unknown trailing elements after the known ones"),
    ("empty_events_v026_int", vp.LAYOUTS["0.26"], "int", [], 0, "a batch with no events"),
]


def norm_hash(h: Any) -> Any:
    if h is None:
        return None
    if isinstance(h, (bytes, bytearray)):
        return bytes(h).hex()
    if isinstance(h, int):
        return h
    raise TypeError(f"unexpected hash {h!r}")


def normalise_event(ev: Any) -> dict[str, Any]:
    """A decoded (generic msgpack) event in the normalised JSON shape."""
    if isinstance(ev, list):
        kind, values = ev[0], ev[1:]
        order = {"BlockStored": ARRAY_STORED_ORDER, "BlockRemoved": ARRAY_REMOVED_ORDER}.get(kind, ())
        fields = dict(zip(order, values))
    else:
        kind = ev["type"]
        fields = ev
    if kind == "AllBlocksCleared":
        return {"type": kind}
    keys = STORED_KEYS if kind == "BlockStored" else REMOVED_KEYS
    out: dict[str, Any] = {"type": kind}
    for k in keys:
        v = fields.get(k)
        if k == "block_hashes":
            v = [norm_hash(h) for h in v]
        elif k == "parent_block_hash":
            v = norm_hash(v)
        out[k] = v
    return out


def normalise_payload(payload: bytes) -> dict[str, Any]:
    d = msgspec.msgpack.decode(payload)
    if isinstance(d, dict):
        ts, events, dp = d["ts"], d["events"], d.get("data_parallel_rank")
    else:
        ts, events = d[0], d[1]
        dp = d[2] if len(d) > 2 else None
    return {"ts": ts, "dp_rank": dp, "events": [normalise_event(e) for e in events]}


def expected_from_input(layout: vp.Layout, form: str, events: list[dict[str, Any]],
                        dp: int | None) -> dict[str, Any]:
    """What the batch should decode to, computed from the input, not the bytes."""
    out_events = []
    for ev in events:
        kind = ev["type"]
        if kind == "AllBlocksCleared":
            out_events.append({"type": kind})
            continue
        cls = layout.stored if kind == "BlockStored" else layout.removed
        keys = STORED_KEYS if kind == "BlockStored" else REMOVED_KEYS
        e: dict[str, Any] = {"type": kind}
        for k in keys:
            v = ev.get(k) if k in cls.__struct_fields__ else None
            if k == "block_hashes":
                v = [norm_hash(vp.convert_hash(h, form)) for h in v]
            elif k == "parent_block_hash":
                v = norm_hash(vp.convert_hash(v, form))
            e[k] = v
        out_events.append(e)
    return {"ts": TS, "dp_rank": dp if layout.has_dp_rank else None, "events": out_events}


def render() -> dict[str, bytes]:
    files: dict[str, bytes] = {}
    manifest = []
    for case, layout, form, events, dp, description in CASES:
        batch = vp.build_batch(layout, events, form, TS, dp)
        payload = vp.encode_batch(batch)
        got = normalise_payload(payload)
        want = expected_from_input(layout, form, events, dp)
        if got != want:
            raise SystemExit(f"{case}: decoded {got} != intended {want}")
        files[f"{case}.msgpack"] = payload
        manifest.append({"file": f"{case}.msgpack", "layout": layout.name, "hash_form": form,
                         "description": description, "expected": want})
    # One entry per line keeps the file small and its diffs readable.
    lines = ",\n".join(json.dumps(entry, separators=(",", ":")) for entry in manifest)
    files["expected.json"] = ("[\n" + lines + "\n]\n").encode()
    return files


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--check", action="store_true", help="compare with the files on disk, write nothing")
    args = ap.parse_args()
    files = render()
    out: Path = args.out
    stale = sorted(p.name for p in out.glob("*.msgpack") if p.name not in files) if out.is_dir() else []
    if args.check:
        bad = [n for n, data in files.items() if not (out / n).is_file() or (out / n).read_bytes() != data]
        if bad or stale:
            print(f"fixtures out of date: {bad + stale}", file=sys.stderr)
            return 1
        print(f"{len(files)} fixture files up to date in {out}")
        return 0
    out.mkdir(parents=True, exist_ok=True)
    for name in stale:
        (out / name).unlink()
    for name, data in files.items():
        (out / name).write_bytes(data)
    total = sum(len(d) for d in files.values())
    print(f"wrote {len(files)} files ({total} bytes) to {out} with msgspec {msgspec.__version__}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
