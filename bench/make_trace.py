#!/usr/bin/env python3
"""Generate bench/traces/agentic.jsonl, the Mooncake-format agentic trace of the peer bench.

Standard library only, deterministic (seeded). The committed file is this
script's output with the defaults; re-run it to check or to change the trace:

    python3 bench/make_trace.py > bench/traces/agentic.jsonl

`--seed N` draws another trace of the same shape (other session lengths,
start times and gaps), for checking that a result holds beyond the one
committed draw (docs/peers.md):

    python3 bench/make_trace.py --seed 18 > /tmp/agentic-18.jsonl
    bash bench/peers.sh --quick --workloads timed_trace --trace /tmp/agentic-18.jsonl

The real-engine bench's two traces (bench/peers.sh --engines real) are the
same generator sized to engines of 512 blocks of 32 tokens and an 8,192-token
context:

    python3 bench/make_trace.py --sessions 20 --steps 6 --shared-blocks 2 --context-blocks 2 \
        --output 16 48 --start-spread 20 --step-gap 4 > bench/traces/real-agentic.jsonl
    python3 bench/make_trace.py --sessions 24 --steps 8 --shared-blocks 1 --context-blocks 0 \
        --max-growth 1 --output 16 48 --start-spread 30 --step-gap 3 > bench/traces/real-multi-turn.jsonl

Format (Mooncake FAST'25 traces, what `vllm bench serve --dataset-name
timed_trace --timed-trace-chunk-hash-size 512` reads): one JSON object per
line, `timestamp` (ms from the start, non-decreasing), `input_length`
(tokens), `output_length` (tokens) and `hash_ids`, one id per 512-token block
of the prompt (the last block may be partial); equal ids mean equal tokens.

Shape: `SESSIONS` agent sessions share a system/tool prefix of
`SHARED_BLOCKS` blocks; each has its own context of `CONTEXT_BLOCKS` blocks
and then `STEPS` tool-loop steps. Every step re-sends the whole history plus
1-2 new full blocks (the last call and tool result) and a partial last block
that is new every time (its content changes as the history grows). Sessions
start spread over the first part of the trace; steps follow each other after
a short exponential gap.
"""

import argparse
import json
import random
import sys

SEED = 17
SESSIONS = 20
STEPS = 12
SHARED_BLOCKS = 2
CONTEXT_BLOCKS = 6
BLOCK = 512
START_SPREAD_S = 40.0  # sessions start uniformly in [0, START_SPREAD_S)
STEP_GAP_S = 6.0  # mean gap between a session's steps (exponential), model time
OUTPUT_RANGE = (32, 96)


def main() -> None:
    ap = argparse.ArgumentParser(description="Write the peer bench's agentic trace (Mooncake JSONL) to stdout.")
    ap.add_argument("--seed", type=int, default=SEED, help=f"random seed (default {SEED}: the committed trace)")
    ap.add_argument("--sessions", type=int, default=SESSIONS, help=f"agent sessions (default {SESSIONS})")
    ap.add_argument("--steps", type=int, default=STEPS, help=f"requests per session (default {STEPS})")
    ap.add_argument("--shared-blocks", type=int, default=SHARED_BLOCKS,
                    help=f"512-token blocks of the prefix every session shares (default {SHARED_BLOCKS})")
    ap.add_argument("--context-blocks", type=int, default=CONTEXT_BLOCKS,
                    help=f"each session's own blocks before its first step (default {CONTEXT_BLOCKS})")
    ap.add_argument("--max-growth", type=int, default=2, choices=(1, 2),
                    help="new full blocks per step: 1, or 1 or 2 at random (default 2)")
    ap.add_argument("--output", type=int, nargs=2, default=OUTPUT_RANGE, metavar=("MIN", "MAX"),
                    help=f"output tokens, uniform in [MIN, MAX] (default {OUTPUT_RANGE[0]} {OUTPUT_RANGE[1]})")
    ap.add_argument("--start-spread", type=float, default=START_SPREAD_S,
                    help=f"sessions start uniformly in [0, S) seconds (default {START_SPREAD_S:g})")
    ap.add_argument("--step-gap", type=float, default=STEP_GAP_S,
                    help=f"mean gap between a session's steps, seconds (default {STEP_GAP_S:g})")
    args = ap.parse_args()
    if min(args.sessions, args.steps) < 1 or min(args.shared_blocks, args.context_blocks) < 0 \
            or not 1 <= args.output[0] <= args.output[1] or args.start_spread < 0 or args.step_gap < 0:
        ap.error("sessions and steps must be >= 1, block counts >= 0, 1 <= MIN <= MAX, times >= 0")
    rng = random.Random(args.seed)
    SHARED, CONTEXT = args.shared_blocks, args.context_blocks
    next_id = SHARED  # ids 0..SHARED-1 are the shared prefix

    def fresh(n: int) -> list[int]:
        nonlocal next_id
        ids = list(range(next_id, next_id + n))
        next_id += n
        return ids

    rows = []
    for _s in range(args.sessions):
        history = list(range(SHARED)) + fresh(CONTEXT)
        t = rng.uniform(0.0, args.start_spread)
        for _step in range(args.steps):
            partial = rng.randint(64, BLOCK)
            ids = history + fresh(1)  # the partial last block, new every step
            input_length = BLOCK * (len(ids) - 1) + partial
            rows.append(
                {
                    "timestamp": int(round(t * 1000)),
                    "input_length": input_length,
                    "output_length": rng.randint(*args.output),
                    "hash_ids": ids,
                }
            )
            history = history + fresh(rng.choice((1, 2)) if args.max_growth == 2 else 1)
            t += rng.expovariate(1.0 / args.step_gap) if args.step_gap > 0 else 0.0
    rows.sort(key=lambda r: r["timestamp"])
    t0 = rows[0]["timestamp"]
    out = sys.stdout
    for r in rows:
        r["timestamp"] -= t0
        out.write(json.dumps(r, separators=(", ", ": ")) + "\n")


if __name__ == "__main__":
    main()
