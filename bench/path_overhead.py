#!/usr/bin/env python3
"""What the HTTP path adds to an engine's TTFT, one request at a time.

Sends the same kind of chat request (a shared ~2,000-token system prompt,
so the engine's prefix cache holds it after the first, and a new question)
straight to a vLLM engine and through a kvgate in front of it, in turns,
and prints for each batch the client's mean TTFT beside the engine's own
(from its `vllm:time_to_first_token_seconds` histogram) and its queue and
prefill times. At idle the difference is the HTTP path; under load, what
else competes for the machine. Standard library only:

    bash scripts/real-vllm.sh fleet 1            # prints the engine's --replica spec
    kvgate serve --listen 127.0.0.1:18650 --replica 'SPEC' &
    python3 bench/path_overhead.py --engine http://127.0.0.1:18100 --kvgate http://127.0.0.1:18650

docs/real-vllm.md, "Fast mode against the real engine", quotes its output.
"""

import argparse
import http.client
import json
import random
import sys
import time
import urllib.parse
import urllib.request

MODEL = "Qwen/Qwen3-0.6B"
SERIES = {
    "ttft": "vllm:time_to_first_token_seconds",
    "queue": "vllm:request_queue_time_seconds",
    "prefill": "vllm:request_prefill_time_seconds",
}


def sums(engine: str) -> dict:
    """Each series' `_sum` and the TTFT `_count`, summed over label sets."""
    text = urllib.request.urlopen(engine + "/metrics", timeout=10).read().decode()
    out = {k: 0.0 for k in SERIES}
    out["count"] = 0.0
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        for k, series in SERIES.items():
            if name == series + "_sum":
                out[k] += float(line.rsplit(" ", 1)[1])
        if name == SERIES["ttft"] + "_count":
            out["count"] += float(line.rsplit(" ", 1)[1])
    return out


def ttft_ms(base: str, system: str, question: str) -> float:
    """One streamed chat; ms until the first chunk that carries content."""
    url = urllib.parse.urlsplit(base)
    body = {"model": MODEL, "stream": True, "max_tokens": 4, "ignore_eos": True,
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}]}
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=60)
    t0 = time.perf_counter()
    conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise SystemExit(f"{base}: HTTP {resp.status}: {resp.read()[:300]!r}")
    first = None
    while True:
        line = resp.readline()
        if not line:
            break
        if first is None and line.startswith(b"data: {") and b'"content"' in line:
            first = time.perf_counter() - t0
    conn.close()
    if first is None:
        raise SystemExit(f"{base}: the stream carried no content")
    return first * 1000


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engine", required=True, help="the engine's base URL")
    ap.add_argument("--kvgate", required=True, help="kvgate's base URL, in front of that engine only")
    ap.add_argument("--requests", type=int, default=20, help="requests per batch (default 20)")
    ap.add_argument("--rounds", type=int, default=2, help="batches per path, alternating (default 2)")
    args = ap.parse_args()
    rng = random.Random(5)
    system = " ".join(f"w{rng.randrange(10**6)}" for _ in range(700))
    for _ in range(args.rounds):
        for name, base in (("direct", args.engine), ("kvgate", args.kvgate)):
            ttft_ms(base, system, "warm-up")
            before = sums(args.engine)
            xs = [ttft_ms(base, system, f"question {i} {rng.random()}") for i in range(args.requests)]
            after = sums(args.engine)
            n = after["count"] - before["count"]
            if n <= 0:
                raise SystemExit("the engine's TTFT histogram did not move: is --kvgate in front of --engine?")
            eng = {k: (after[k] - before[k]) / n * 1000 for k in SERIES}
            print(f"{name}: client TTFT mean {sum(xs) / len(xs):.1f} ms; the engine's own TTFT {eng['ttft']:.1f}, "
                  f"queue {eng['queue']:.1f}, prefill {eng['prefill']:.1f} (n={int(n)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
