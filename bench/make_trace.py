#!/usr/bin/env python3
"""Generate bench/traces/agentic.jsonl, the Mooncake-format agentic trace of the peer bench.

Standard library only, deterministic (seeded). The committed file is this
script's output with the defaults; re-run it to check or to change the trace:

    python3 bench/make_trace.py > bench/traces/agentic.jsonl

`--seed N` draws another trace of the same shape (other session lengths,
start times and gaps), for checking that a result holds beyond the one
committed draw (docs/peers.md, Run 20):

    python3 bench/make_trace.py --seed 18 > /tmp/agentic-18.jsonl
    bash bench/peers.sh --quick --workloads timed_trace --trace /tmp/agentic-18.jsonl

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
    rng = random.Random(ap.parse_args().seed)
    next_id = SHARED_BLOCKS  # ids 0..SHARED_BLOCKS-1 are the shared prefix

    def fresh(n: int) -> list[int]:
        nonlocal next_id
        ids = list(range(next_id, next_id + n))
        next_id += n
        return ids

    rows = []
    for _s in range(SESSIONS):
        history = list(range(SHARED_BLOCKS)) + fresh(CONTEXT_BLOCKS)
        t = rng.uniform(0.0, START_SPREAD_S)
        for _step in range(STEPS):
            partial = rng.randint(64, BLOCK)
            ids = history + fresh(1)  # the partial last block, new every step
            input_length = BLOCK * (len(ids) - 1) + partial
            rows.append(
                {
                    "timestamp": int(round(t * 1000)),
                    "input_length": input_length,
                    "output_length": rng.randint(*OUTPUT_RANGE),
                    "hash_ids": ids,
                }
            )
            history = history + fresh(rng.choice((1, 2)))
            t += rng.expovariate(1.0 / STEP_GAP_S)
    rows.sort(key=lambda r: r["timestamp"])
    t0 = rows[0]["timestamp"]
    out = sys.stdout
    for r in rows:
        r["timestamp"] -= t0
        out.write(json.dumps(r, separators=(", ", ": ")) + "\n")


if __name__ == "__main__":
    main()
