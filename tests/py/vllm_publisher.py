#!/usr/bin/env python3
"""A stand-in for vLLM's ZMQ KV-event publisher, for kvgate's wire tests.

It speaks vLLM's KV-event wire protocol: a PUB socket that sends
``[topic, seq (8-byte big-endian), msgpack payload]`` and a ROUTER socket that
replays buffered batches on request. The payloads are encoded by msgspec from
Struct classes shaped like each vLLM release (our own definitions, written from
reading vLLM's ``vllm/distributed/kv_events.py``; no vLLM code is copied).

Layouts (``--layout``):

  0.9        array batch ``[ts, events]`` (no dp rank field); array events
             ``["BlockStored", hashes, parent, tokens, block_size, lora_id]``,
             ``["BlockRemoved", hashes]``; replay ``[seq, payload]``.
  0.11       array batch ``[ts, events, dp_rank]``; array events with
             ``medium`` appended; replay ``[seq, payload]``, end ``[-1, b""]``.
  array-ext  releases between 0.11 and the switch to map events (vLLM PR
             #42892): array batch, array events with ``lora_name``,
             ``extra_keys``, ``group_idx``, ``kv_cache_spec_kind`` and
             ``kv_cache_spec_sliding_window`` appended; replay ``[seq, payload]``.
  0.26       array batch; map events tagged by ``"type"`` (omit_defaults);
             replay ``[topic, seq, payload]``, end ``[b"", -1, b""]``.
  latest     as 0.26, plus the newest optional fields seen on upstream main:
             ``locality``, ``ownership``, ``session_id`` (BlockStored) and
             ``locality``, ``ownership`` (BlockRemoved).
  main       map batch ``{"ts", "events", "data_parallel_rank"}`` and map
             events, replay ``[seq, payload]``: the shape of the stored
             vllm-project/vllm snapshot whose EventBatch has no array_like.
             Current upstream main uses the 0.26/latest shape instead; this
             layout is kept so that the map-batch variant stays covered.

msgspec never omits defaults from ``array_like`` structs (msgspec issue #720),
so an array batch has 3 elements whenever its struct has the dp rank field
(``nil`` when unset) and array events always carry every field of their
version. Only map encodings drop defaulted fields.

Usage::

  vllm_publisher.py [--layout L] [--topic T] [--hash-form int|bytes]
                    [--buffer-steps N] [--dp-rank R] [--replay-frames auto|2|3]

It binds PUB and ROUTER on 127.0.0.1 random ports, prints one line
``READY pub=tcp://127.0.0.1:P1 replay=tcp://127.0.0.1:P2`` and then answers
JSON commands read from stdin, one per line, with one line each on stdout:

  {"cmd":"publish","events":[E...],"skip_pub":false,"dp_rank":0,"ts":1.5}
        -> "OK seq=N". Takes the next seq (from 0), encodes the batch, appends
        it to the replay buffer (the last --buffer-steps batches are kept) and
        sends it on PUB unless skip_pub is true (a batch the subscriber
        missed). "dp_rank" absent: --dp-rank; null: unset (omitted from a map
        batch, nil in an array batch). "ts" absent: time.time().
  {"cmd":"publish_raw","payload_hex":"..","skip_pub":false}
        -> "OK seq=N". Same, with a payload given as hex (for malformed input).
  {"cmd":"restart"}  -> "OK". Seq restarts at 0, the replay buffer is emptied.
  {"cmd":"stats"}    -> "OK next_seq=N buffered=M replay_requests=K".
  {"cmd":"quit"}     -> "OK", closes the sockets (linger 0) and exits 0.
  Anything malformed -> "ERR <reason>" (the publisher keeps running).

Event JSON (hash ints become ``h.to_bytes(32, "big")`` with --hash-form bytes;
a hex string is taken as raw hash bytes in either form):

  {"type":"BlockStored","block_hashes":[..],"parent_block_hash":h|null,
   "token_ids":[..],"block_size":16,"lora_id":null,"medium":"GPU"|null,
   "lora_name":null, optional "extra_keys","group_idx","kv_cache_spec_kind",
   "kv_cache_spec_sliding_window","locality","ownership","session_id"}
  {"type":"BlockRemoved","block_hashes":[..],"medium":..,"group_idx":..}
  {"type":"AllBlocksCleared"}

Fields the layout's struct lacks are dropped. ``"extra_fields": {name: value}``
on an event adds fields the layout does not know (new map keys, or trailing
array elements for array layouts) to test that decoders ignore them; a null
extra value is omitted in map layouts.

Note that a SUB socket only sees batches published after its subscription has
reached the PUB (ZMQ's slow-joiner behaviour): tests should wait a moment after
connecting, or recover what they missed through replay, as kvgate must.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
import types
from collections import deque
from dataclasses import dataclass
from typing import Any

import msgspec
import zmq

END_SEQ = (-1).to_bytes(8, "big", signed=True)

Hash = Any  # int (u64) or bytes (32-byte sha256)


# --- struct definitions, one set per layout -----------------------------------
#
# Field order matters for the array layouts: it is the wire order.

# vLLM 0.9 (before medium and data_parallel_rank).
class BatchV09(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]


class EventArray(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    pass


class StoredV09(EventArray, tag="BlockStored"):
    block_hashes: list[Hash]
    parent_block_hash: Hash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None


class RemovedV09(EventArray, tag="BlockRemoved"):
    block_hashes: list[Hash]


class ClearedArray(EventArray, tag="AllBlocksCleared"):
    pass


# vLLM 0.11: array batch with dp rank, array events with medium.
class BatchArray(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class StoredV011(EventArray, tag="BlockStored"):
    block_hashes: list[Hash]
    parent_block_hash: Hash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None


class RemovedV011(EventArray, tag="BlockRemoved"):
    block_hashes: list[Hash]
    medium: str | None


# Releases after 0.11 that still used array events, with fields appended.
class StoredArrayExt(EventArray, tag="BlockStored"):
    block_hashes: list[Hash]
    parent_block_hash: Hash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[Any] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None


class RemovedArrayExt(EventArray, tag="BlockRemoved"):
    block_hashes: list[Hash]
    medium: str | None
    group_idx: int | None = None


# Map events (vLLM 0.26 and later): tagged maps, defaults omitted.
class EventMap(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    pass


class StoredMap(EventMap, tag="BlockStored"):
    block_hashes: list[Hash]
    parent_block_hash: Hash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[Any] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None


class RemovedMap(EventMap, tag="BlockRemoved"):
    block_hashes: list[Hash]
    medium: str | None
    group_idx: int | None = None


class ClearedMap(EventMap, tag="AllBlocksCleared"):
    pass


class StoredLatest(StoredMap, tag="BlockStored"):
    locality: str | None = None
    ownership: str | None = None
    session_id: str | None = None


class RemovedLatest(RemovedMap, tag="BlockRemoved"):
    locality: str | None = None
    ownership: str | None = None


# Map batch (the "main" layout).
class BatchMap(msgspec.Struct, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


@dataclass(frozen=True)
class Layout:
    name: str
    batch: type
    stored: type
    removed: type
    cleared: type
    replay_frames: int  # frames per replayed batch after the delimiter: 2 or 3

    @property
    def has_dp_rank(self) -> bool:
        return "data_parallel_rank" in self.batch.__struct_fields__


LAYOUTS: dict[str, Layout] = {
    "0.9": Layout("0.9", BatchV09, StoredV09, RemovedV09, ClearedArray, 2),
    "0.11": Layout("0.11", BatchArray, StoredV011, RemovedV011, ClearedArray, 2),
    "array-ext": Layout("array-ext", BatchArray, StoredArrayExt, RemovedArrayExt, ClearedArray, 2),
    "0.26": Layout("0.26", BatchArray, StoredMap, RemovedMap, ClearedMap, 3),
    "latest": Layout("latest", BatchArray, StoredLatest, RemovedLatest, ClearedMap, 3),
    "main": Layout("main", BatchMap, StoredMap, RemovedMap, ClearedMap, 2),
}

# Required fields that may not default to null when absent from the JSON.
_REQUIRED = {"block_hashes", "token_ids", "block_size"}
_HASH_FIELDS = {"parent_block_hash"}
_HASH_LIST_FIELDS = {"block_hashes"}

_extended_cache: dict[tuple[type, tuple[str, ...]], type] = {}


def _with_extra_fields(cls: type, names: tuple[str, ...]) -> type:
    """A subclass of ``cls`` (same tag) with extra trailing fields, default None."""
    key = (cls, names)
    found = _extended_cache.get(key)
    if found is not None:
        return found

    def body(ns: dict[str, Any]) -> None:
        ns["__annotations__"] = {n: Any for n in names}
        for n in names:
            ns[n] = None

    sub = types.new_class(cls.__name__ + "Extra", (cls,), {"tag": cls.__struct_config__.tag}, body)
    _extended_cache[key] = sub
    return sub


def convert_hash(value: Any, form: str) -> Any:
    """An event hash from JSON to the wire form: int, or 32 bytes."""
    if value is None:
        return None
    if isinstance(value, str):
        return bytes.fromhex(value.removeprefix("0x"))
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"hash must be an int or a hex string, not {value!r}")
    if form == "bytes":
        if value < 0:
            raise ValueError(f"negative hash {value} has no bytes form")
        return value.to_bytes(32, "big")
    return value


def build_event(layout: Layout, ev: dict[str, Any], hash_form: str) -> msgspec.Struct:
    """One JSON event as the layout's msgspec struct."""
    if not isinstance(ev, dict):
        raise ValueError(f"event must be an object, not {ev!r}")
    kind = ev.get("type")
    cls = {
        "BlockStored": layout.stored,
        "BlockRemoved": layout.removed,
        "AllBlocksCleared": layout.cleared,
    }.get(kind)
    if cls is None:
        raise ValueError(f"unknown event type {kind!r}")
    extra = ev.get("extra_fields") or {}
    if not isinstance(extra, dict):
        raise ValueError("extra_fields must be an object")
    if extra:
        clash = set(extra) & set(cls.__struct_fields__)
        if clash:
            raise ValueError(f"extra_fields {sorted(clash)} are known fields of layout {layout.name}")
        cls = _with_extra_fields(cls, tuple(extra))
    kwargs: dict[str, Any] = {}
    for name in cls.__struct_fields__:
        if name in extra:
            kwargs[name] = extra[name]
            continue
        if name not in ev:
            if name in _REQUIRED:
                raise ValueError(f"{kind} needs {name!r}")
            kwargs[name] = None
            continue
        value = ev[name]
        if name in _HASH_LIST_FIELDS:
            if not isinstance(value, list):
                raise ValueError(f"{name} must be a list")
            value = [convert_hash(h, hash_form) for h in value]
        elif name in _HASH_FIELDS:
            value = convert_hash(value, hash_form)
        kwargs[name] = value
    return cls(**kwargs)


def build_batch(
    layout: Layout, events: list[dict[str, Any]], hash_form: str, ts: float, dp_rank: int | None
) -> msgspec.Struct:
    built = [build_event(layout, ev, hash_form) for ev in events]
    if layout.has_dp_rank:
        return layout.batch(ts=ts, events=built, data_parallel_rank=dp_rank)
    return layout.batch(ts=ts, events=built)


_ENCODER = msgspec.msgpack.Encoder()


def encode_batch(batch: msgspec.Struct) -> bytes:
    return _ENCODER.encode(batch)


# --- the publisher -------------------------------------------------------------


class Publisher:
    def __init__(self, layout: Layout, topic: str, hash_form: str, buffer_steps: int,
                 dp_rank: int, replay_frames: int, pub_port: int = 0,
                 replay_port: int = 0) -> None:
        self.layout = layout
        self.topic = topic.encode("utf-8")
        self.hash_form = hash_form
        self.dp_rank = dp_rank
        self.replay_frames = replay_frames
        self.ctx = zmq.Context()
        self.pub = self.ctx.socket(zmq.PUB)
        self.pub.setsockopt(zmq.SNDHWM, 100_000)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.router = self.ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        # Fixed ports let a test restart the process on the same endpoints.
        self.pub_port = self._bind(self.pub, pub_port)
        self.replay_port = self._bind(self.router, replay_port)
        self.lock = threading.Lock()
        self.buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self.next_seq = 0
        self.replay_requests = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve_replay, name="replay", daemon=True)

    @staticmethod
    def _bind(sock: zmq.Socket, port: int) -> int:
        if port == 0:
            return sock.bind_to_random_port("tcp://127.0.0.1")
        sock.bind(f"tcp://127.0.0.1:{port}")
        return port

    def start(self) -> None:
        self.thread.start()

    # Main thread only: the PUB socket is not shared.
    def publish_payload(self, payload: bytes, skip_pub: bool) -> int:
        with self.lock:
            seq = self.next_seq
            self.next_seq += 1
            self.buffer.append((seq, payload))
        if not skip_pub:
            self.pub.send_multipart((self.topic, seq.to_bytes(8, "big"), payload))
        return seq

    def restart(self) -> None:
        with self.lock:
            self.next_seq = 0
            self.buffer.clear()

    def stats(self) -> str:
        with self.lock:
            return f"next_seq={self.next_seq} buffered={len(self.buffer)} replay_requests={self.replay_requests}"

    # Replay thread only: the ROUTER socket is not shared.
    def _serve_replay(self) -> None:
        poller = zmq.Poller()
        poller.register(self.router, zmq.POLLIN)
        while not self.stop.is_set():
            try:
                if not dict(poller.poll(100)):
                    continue
                frames = self.router.recv_multipart()
            except zmq.ZMQError:
                return
            if len(frames) != 3:
                # vLLM logs and ignores these too (a DEALER must send b"" first).
                print(f"vllm_publisher: ignoring replay request with {len(frames)} frames",
                      file=sys.stderr, flush=True)
                continue
            ident, _delim, start_bytes = frames
            start = int.from_bytes(start_bytes, "big")
            with self.lock:
                self.replay_requests += 1
                batches = [(s, p) for s, p in self.buffer if s >= start]
            try:
                for seq, payload in batches:
                    if self.replay_frames == 3:
                        self.router.send_multipart((ident, b"", self.topic, seq.to_bytes(8, "big"), payload))
                    else:
                        self.router.send_multipart((ident, b"", seq.to_bytes(8, "big"), payload))
                if self.replay_frames == 3:
                    self.router.send_multipart((ident, b"", b"", END_SEQ, b""))
                else:
                    self.router.send_multipart((ident, b"", END_SEQ, b""))
            except zmq.ZMQError as e:
                print(f"vllm_publisher: replay send failed: {e}", file=sys.stderr, flush=True)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=2.0)
        self.pub.close(linger=0)
        self.router.close(linger=0)
        self.ctx.term()


def handle(pub: Publisher, line: str) -> tuple[str, bool]:
    """Answer one command line; the bool is True when the publisher should exit."""
    try:
        cmd = json.loads(line)
    except json.JSONDecodeError as e:
        return f"ERR bad json: {e}", False
    if not isinstance(cmd, dict):
        return "ERR command must be a JSON object", False
    name = cmd.get("cmd")
    try:
        if name == "publish":
            events = cmd.get("events", [])
            if not isinstance(events, list):
                raise ValueError("events must be a list")
            dp_rank = cmd["dp_rank"] if "dp_rank" in cmd else pub.dp_rank
            ts = float(cmd["ts"]) if cmd.get("ts") is not None else time.time()
            batch = build_batch(pub.layout, events, pub.hash_form, ts, dp_rank)
            seq = pub.publish_payload(encode_batch(batch), bool(cmd.get("skip_pub", False)))
            return f"OK seq={seq}", False
        if name == "publish_raw":
            payload = bytes.fromhex(cmd.get("payload_hex", ""))
            seq = pub.publish_payload(payload, bool(cmd.get("skip_pub", False)))
            return f"OK seq={seq}", False
        if name == "restart":
            pub.restart()
            return "OK", False
        if name == "stats":
            return f"OK {pub.stats()}", False
        if name == "quit":
            return "OK", True
    except (ValueError, TypeError, KeyError) as e:
        return f"ERR {e}", False
    return f"ERR unknown cmd {name!r}", False


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Stand-in vLLM KV-event publisher (PUB + replay ROUTER).")
    ap.add_argument("--layout", choices=sorted(LAYOUTS), default="0.26")
    ap.add_argument("--topic", default="")
    ap.add_argument("--hash-form", choices=("int", "bytes"), default="int")
    ap.add_argument("--buffer-steps", type=int, default=10_000)
    ap.add_argument("--dp-rank", type=int, default=0,
                    help="data_parallel_rank put in batches whose command gives none")
    ap.add_argument("--replay-frames", choices=("auto", "2", "3"), default="auto",
                    help="override the layout's replay frame shape")
    ap.add_argument("--pub-port", type=int, default=0, help="PUB port (0: random)")
    ap.add_argument("--replay-port", type=int, default=0, help="ROUTER port (0: random)")
    args = ap.parse_args(argv)
    if args.buffer_steps < 1:
        ap.error("--buffer-steps must be at least 1")

    layout = LAYOUTS[args.layout]
    frames = layout.replay_frames if args.replay_frames == "auto" else int(args.replay_frames)
    pub = Publisher(layout, args.topic, args.hash_form, args.buffer_steps, args.dp_rank, frames,
                    args.pub_port, args.replay_port)
    pub.start()
    print(f"READY pub=tcp://127.0.0.1:{pub.pub_port} replay=tcp://127.0.0.1:{pub.replay_port}", flush=True)
    try:
        for raw in sys.stdin:
            line = raw.strip()
            if not line:
                continue
            answer, done = handle(pub, line)
            if done:
                pub.close()
                print(answer, flush=True)
                return 0
            print(answer, flush=True)
    except KeyboardInterrupt:
        pass
    pub.close()  # stdin closed: exit quietly
    return 0


if __name__ == "__main__":
    sys.exit(main())
