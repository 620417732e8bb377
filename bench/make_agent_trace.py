#!/usr/bin/env python3
"""Write a long-context agentic trace (Mooncake JSONL) to stdout.

Standard library only, deterministic (seeded). The shape is what agent
services send a shared fleet: a few apps, each with its own system and tool
prefix of 2k-12k tokens, skewed popularity between apps, sessions that grow
turn by turn (the whole history, the previous answer, a new message), and
one-shot requests between them. With the defaults (seeds 1-3): 340-450
requests over 400 s, prompts of 0.7k to 20k tokens (median 8.7k-12.9k),
answers with a median of 400-460 tokens.

    python3 bench/make_agent_trace.py --seed 1 > /tmp/long-agentic-1.jsonl
    python3 bench/make_agent_trace.py --seed 2 > /tmp/long-agentic-2.jsonl
    python3 bench/make_agent_trace.py --seed 1 --summary   # the shape, on stderr

Replay one against four simulated engines with GPU-like timing, in fast mode
and live (docs/peers.md, "Long agent contexts"):

    kvgate replay --trace /tmp/long-agentic-1.jsonl --replicas 4 --timing llmd_qwen3_32b
    bash bench/peers.sh --workloads timed_trace --trace /tmp/long-agentic-1.jsonl --levels knee

The real-engine bench's long agentic trace (`bench/peers.sh --engines real
--preset gpu_like`, workload `long_agentic`) is the same shape sized to two
CPU engines of 512 blocks of 32 tokens, on which a cold 4k-token prompt
takes about 2 s (173 requests over 238 s, prompts of 0.8k-6k tokens, median
3.1k):

    python3 bench/make_agent_trace.py --seed 1 --prefix-min 1024 --prefix-max 2048 --max-prompt 4096 \
        --output-median 48 --duration 240 > bench/traces/real-long-agentic.jsonl

Format (Mooncake FAST'25 traces): one JSON object per line, `timestamp` (ms
from the start, non-decreasing), `input_length` (tokens), `output_length`
(tokens) and `hash_ids`, one id per 512-token block of the prompt (the last
block may be partial); equal ids mean equal tokens. A turn re-sends the
previous turn's prompt exactly, so its full blocks keep their ids; the block
that held the previous prompt's end gets a new id (its content grew).

Model:
- `--apps` apps; app a's prefix is uniform in [`--prefix-min`, `--prefix-max`]
  tokens, rounded to whole blocks; app a is picked with weight 1/(a+1)^`--zipf`.
- Sessions start as a Poisson process at `--session-rate` per second over
  `--duration` seconds. A session has 1 + Geometric(`--continue-p`) turns and
  ends early when its next prompt would pass `--max-prompt` tokens or its
  next turn would come after `--duration`. Its first
  message is uniform in [300, 2,000] tokens; every later turn adds the
  previous answer and a new message (a tool result or a user turn, uniform
  in [100, 1,500] tokens), after an exponential gap of mean `--turn-gap`.
- One-shot requests arrive as a Poisson process at `--oneshot-rate`: half
  with an app's prefix and a new message of 500-4,000 tokens, half with no
  prefix at all (700-3,000 new tokens).
- Answers are lognormal with median `--output-median` tokens (sigma 0.6),
  clipped to [32, 2,048].
"""

import argparse
import json
import math
import random
import statistics
import sys

BLOCK = 512


def main() -> None:
    ap = argparse.ArgumentParser(description="Write a long-context agentic trace (Mooncake JSONL) to stdout.")
    ap.add_argument("--seed", type=int, default=1, help="random seed (default 1)")
    ap.add_argument("--duration", type=float, default=400.0, help="seconds of arrivals (default 400)")
    ap.add_argument("--apps", type=int, default=6, help="apps, each with its own shared prefix (default 6)")
    ap.add_argument("--zipf", type=float, default=1.0, help="app popularity exponent, 0 = uniform (default 1)")
    ap.add_argument("--prefix-min", type=int, default=2048, help="shortest app prefix, tokens (default 2048)")
    ap.add_argument("--prefix-max", type=int, default=12288, help="longest app prefix, tokens (default 12288)")
    ap.add_argument("--session-rate", type=float, default=0.35, help="new sessions per second (default 0.35)")
    ap.add_argument("--continue-p", type=float, default=0.6,
                    help="probability that a session has another turn (default 0.6)")
    ap.add_argument("--turn-gap", type=float, default=8.0, help="mean seconds between turns (default 8)")
    ap.add_argument("--oneshot-rate", type=float, default=0.1, help="one-shot requests per second (default 0.1)")
    ap.add_argument("--max-prompt", type=int, default=20480, help="longest prompt, tokens (default 20480)")
    ap.add_argument("--output-median", type=int, default=420, help="median answer, tokens (default 420)")
    ap.add_argument("--summary", action="store_true", help="also print the trace's shape to stderr")
    args = ap.parse_args()
    if (args.apps < 1 or args.duration <= 0 or not 0 < args.prefix_min <= args.prefix_max
            or args.session_rate < 0 or args.oneshot_rate < 0 or not 0 <= args.continue_p < 1
            or args.turn_gap < 0 or args.max_prompt < args.prefix_max + 2000 or args.output_median < 1
            or args.zipf < 0):
        ap.error("need apps >= 1, duration > 0, 0 < prefix-min <= prefix-max, rates >= 0, "
                 "0 <= continue-p < 1, turn-gap >= 0, max-prompt >= prefix-max + 2000, output-median >= 1, zipf >= 0")
    rng = random.Random(args.seed)
    next_id = 0

    def fresh(n: int) -> list[int]:
        nonlocal next_id
        ids = list(range(next_id, next_id + n))
        next_id += n
        return ids

    app_blocks = [fresh(max(1, round(rng.uniform(args.prefix_min, args.prefix_max) / BLOCK)))
                  for _ in range(args.apps)]
    weights = [1.0 / (a + 1) ** args.zipf for a in range(args.apps)]

    def output_len() -> int:
        return int(min(2048, max(32, round(args.output_median * math.exp(rng.gauss(0.0, 0.6))))))

    def request(t: float, full: list[int], length: int) -> dict:
        """A prompt of `length` tokens whose whole blocks are `full`; a partial
        tail, if any, gets a new id."""
        ids = list(full[: length // BLOCK])
        if length % BLOCK:
            ids += fresh(1)
        return {"timestamp": int(round(t * 1000)), "input_length": length,
                "output_length": output_len(), "hash_ids": ids}

    rows = []
    t = rng.expovariate(args.session_rate) if args.session_rate > 0 else args.duration
    while t < args.duration:
        app = rng.choices(range(args.apps), weights)[0]
        stream = list(app_blocks[app])  # the session's token stream, in whole blocks
        length = len(stream) * BLOCK
        add = rng.randint(300, 2000)
        ts = t
        while True:
            # Extend the stream by `add` tokens: the old partial tail is
            # replaced (its content grew), new whole blocks get new ids.
            whole = length // BLOCK
            length += add
            stream = stream[:whole] + fresh(length // BLOCK - whole)
            rows.append(request(ts, stream, length))
            out = rows[-1]["output_length"]
            add = out + rng.randint(100, 1500)
            ts += rng.expovariate(1.0 / args.turn_gap) if args.turn_gap > 0 else 0.0
            if rng.random() >= args.continue_p or length + add > args.max_prompt or ts >= args.duration:
                break
        t += rng.expovariate(args.session_rate)
    t = rng.expovariate(args.oneshot_rate) if args.oneshot_rate > 0 else args.duration
    while t < args.duration:
        if rng.random() < 0.5:
            app = rng.choices(range(args.apps), weights)[0]
            length = len(app_blocks[app]) * BLOCK + rng.randint(500, 4000)
            stream = app_blocks[app] + fresh(length // BLOCK - len(app_blocks[app]))
        else:
            length = rng.randint(700, 3000)
            stream = fresh(length // BLOCK)
        rows.append(request(t, stream, length))
        t += rng.expovariate(args.oneshot_rate)
    rows.sort(key=lambda r: r["timestamp"])
    t0 = rows[0]["timestamp"] if rows else 0
    for r in rows:
        r["timestamp"] -= t0
        sys.stdout.write(json.dumps(r, separators=(", ", ": ")) + "\n")
    if args.summary and rows:
        ins = sorted(r["input_length"] for r in rows)
        outs = sorted(r["output_length"] for r in rows)
        print(f"{len(rows)} requests over {rows[-1]['timestamp'] / 1000:.0f} s; prompts {ins[0]}-{ins[-1]} "
              f"(median {statistics.median(ins):.0f}); answers median {statistics.median(outs):.0f}; "
              f"app prefixes {[len(b) * BLOCK for b in app_blocks]}", file=sys.stderr)


if __name__ == "__main__":
    main()
