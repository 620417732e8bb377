#!/usr/bin/env python3
"""A vLLM-shaped KV-event subscriber (pyzmq + msgspec), for testing kvgate's
Rust publisher (crates/kvgate-events/tests/publisher.rs).

It decodes every payload with msgspec Struct classes shaped like vLLM's for
the given layout (our own definitions, as in vllm_publisher.py), so a payload
vLLM's own consumers could not decode fails here too.

  0.11       array batch ``[ts, events, dp_rank]``; array_like tagged events.
  0.26       array batch; map events tagged by ``"type"``.
  map-batch  map batch ``{"ts", "events", "data_parallel_rank"}``; map events.

Usage::

  msgspec_subscriber.py --layout L --pub EP --replay EP [--topic T] [--replay-only]

With ``--replay-only`` (used against ``kvgate sim``) the live stream is
skipped: it prints ``READY`` and goes straight to the replay below.

It connects a SUB socket to ``--pub`` (subscribed to ``--topic``) and prints
``READY``. It then prints one JSON line per live message,
``{"src":"pub","frames":N,"topic":..,"seq":..,"batch":{..}}``, until a batch
with a negative ``ts`` arrives (the test's stop sentinel). Then, on a DEALER
connected to ``--replay``, it sends one malformed request (which the publisher
must ignore) and a request from seq 0, and prints one line per reply:
``{"src":"replay","frames":N,"topic":..,"seq":..,"batch":{..}}`` (frames
counted as the DEALER sees them, with the empty delimiter), then
``{"src":"end","frames":["<hex>",...]}``, and ``DONE``.

Hashes are printed as ints, or ``"0x<hex>"`` for byte hashes. Any decode error
is fatal (exit 1, the reason on stderr).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Union

import msgspec
import zmq

Hash = Union[int, bytes]
TIMEOUT_MS = 20_000


# --- vLLM 0.11: array_like everything -------------------------------------------

class EventArray(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    pass


class StoredV011(EventArray, tag="BlockStored"):
    block_hashes: list[Hash]
    parent_block_hash: Union[Hash, None]
    token_ids: list[int]
    block_size: int
    lora_id: Union[int, None]
    medium: Union[str, None]


class RemovedV011(EventArray, tag="BlockRemoved"):
    block_hashes: list[Hash]
    medium: Union[str, None]


class ClearedArray(EventArray, tag="AllBlocksCleared"):
    pass


class BatchV011(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Union[StoredV011, RemovedV011, ClearedArray]]
    data_parallel_rank: Union[int, None] = None


# --- vLLM 0.26 / 0.33 and newer main: map events ---------------------------------

class EventMap(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    pass


class StoredMap(EventMap, tag="BlockStored"):
    block_hashes: list[Hash]
    parent_block_hash: Union[Hash, None]
    token_ids: list[int]
    block_size: int
    lora_id: Union[int, None]
    medium: Union[str, None]
    lora_name: Union[str, None]
    extra_keys: Union[list[Any], None] = None
    group_idx: Union[int, None] = None
    kv_cache_spec_kind: Union[str, None] = None
    kv_cache_spec_sliding_window: Union[int, None] = None


class RemovedMap(EventMap, tag="BlockRemoved"):
    block_hashes: list[Hash]
    medium: Union[str, None]
    group_idx: Union[int, None] = None


class ClearedMap(EventMap, tag="AllBlocksCleared"):
    pass


MapEvent = Union[StoredMap, RemovedMap, ClearedMap]


class BatchV026(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[MapEvent]
    data_parallel_rank: Union[int, None] = None


class BatchMap(msgspec.Struct, omit_defaults=True, gc=False):
    ts: float
    events: list[MapEvent]
    data_parallel_rank: Union[int, None] = None


DECODERS = {
    "0.11": msgspec.msgpack.Decoder(BatchV011),
    "0.26": msgspec.msgpack.Decoder(BatchV026),
    "map-batch": msgspec.msgpack.Decoder(BatchMap),
}


def plain(value: Any) -> Any:
    """JSON-able form: bytes as "0x<hex>", lists and dicts recursively."""
    if isinstance(value, bytes):
        return "0x" + value.hex()
    if isinstance(value, list):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    return value


def canonical(batch: msgspec.Struct) -> dict[str, Any]:
    events = []
    for ev in batch.events:
        out: dict[str, Any] = {"type": ev.__struct_config__.tag}
        for name in ev.__struct_fields__:
            out[name] = plain(getattr(ev, name))
        events.append(out)
    return {"ts": batch.ts, "dp_rank": batch.data_parallel_rank, "events": events}


def emit(obj: Any) -> None:
    print(json.dumps(obj), flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layout", choices=sorted(DECODERS), required=True)
    ap.add_argument("--pub", required=True)
    ap.add_argument("--replay", required=True)
    ap.add_argument("--topic", default="")
    ap.add_argument("--replay-only", action="store_true",
                    help="skip the live stream: replay from seq 0, decode, exit")
    args = ap.parse_args()
    decoder = DECODERS[args.layout]

    ctx = zmq.Context()
    if args.replay_only:
        print("READY", flush=True)
    else:
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.RCVTIMEO, TIMEOUT_MS)
        sub.setsockopt(zmq.SUBSCRIBE, args.topic.encode())
        sub.connect(args.pub)
        print("READY", flush=True)

    try:
        while not args.replay_only:
            frames = sub.recv_multipart()
            if len(frames) != 3:
                raise ValueError(f"PUB message with {len(frames)} frames")
            topic, seq, payload = frames
            batch = decoder.decode(payload)
            emit({"src": "pub", "frames": len(frames), "topic": topic.decode(),
                  "seq": int.from_bytes(seq, "big"), "batch": canonical(batch)})
            if batch.ts < 0:
                break

        dealer = ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.setsockopt(zmq.RCVTIMEO, TIMEOUT_MS)
        dealer.connect(args.replay)
        # Malformed (no delimiter): the publisher must log and ignore it.
        dealer.send_multipart([(0).to_bytes(8, "big")])
        dealer.send_multipart([b"", (0).to_bytes(8, "big")])
        while True:
            frames = dealer.recv_multipart()
            seq = int.from_bytes(frames[-2], "big", signed=True)
            if seq == -1:
                emit({"src": "end", "frames": [f.hex() for f in frames]})
                break
            batch = decoder.decode(frames[-1])
            topic = frames[1].decode() if len(frames) == 4 else None
            emit({"src": "replay", "frames": len(frames), "topic": topic, "seq": seq,
                  "batch": canonical(batch)})
    except (zmq.ZMQError, msgspec.DecodeError, msgspec.ValidationError, ValueError) as e:
        print(f"msgspec_subscriber: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        return 1
    finally:
        ctx.destroy(linger=0)
    print("DONE", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
