"""Fits `kvgate sim`'s step-time model (crates/kvgate-sim/src/timing.rs) to a
real vLLM engine on this CPU: the `vllm_cpu_tiny` preset.

    bash scripts/real-vllm.sh install
    PY=$(bash scripts/real-vllm.sh env | sed -n 's/^PYTHON=//p')
    $PY bench/fit_cpu_timing.py [--repeat 5] [--out .cache/real-vllm/fit.json]

It starts one engine with scripts/real-vllm.sh serve and measures, from the
client, one request at a time:
- prefill: the time to first token of fresh token-id prompts of T tokens
  (T up to 2,048, the CPU engine's default per-step token budget, so one
  step each), fitted by least squares to a·T² + b·T + c;
- decode: the mean inter-token time of n concurrent streams (n = 1 … 16),
  fitted to d + e·n.
It prints the coefficients as the preset's fields and writes the raw samples.
"""

import argparse
import http.client
import json
import os
import random
import statistics
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "real_vllm"))
from harness import MODEL, ROOT, Engine, Procs  # noqa: E402


def lstsq(xs, ys, degree):
    """Least squares for y = sum c_k x^k, k = 0..degree (normal equations)."""
    n = degree + 1
    a = [[sum(x ** (i + j) for x in xs) for j in range(n)] for i in range(n)]
    b = [sum(y * x ** i for x, y in zip(xs, ys)) for i in range(n)]
    for col in range(n):  # Gauss-Jordan
        piv = max(range(col, n), key=lambda r: abs(a[r][col]))
        a[col], a[piv] = a[piv], a[col]
        b[col], b[piv] = b[piv], b[col]
        for r in range(n):
            if r != col:
                f = a[r][col] / a[col][col]
                a[r] = [x - f * y for x, y in zip(a[r], a[col])]
                b[r] -= f * b[col]
    return [b[i] / a[i][i] for i in range(n)]


def ttft(url, prompt):
    t0 = time.perf_counter()
    first = None
    conn = http.client.HTTPConnection("127.0.0.1", int(url.rsplit(":", 1)[1]), timeout=120)
    conn.request("POST", "/v1/completions", body=json.dumps(
        {"model": MODEL, "prompt": prompt, "max_tokens": 2, "stream": True}).encode(),
        headers={"content-type": "application/json"})
    resp = conn.getresponse()
    for line in resp:
        if line.startswith(b"data:") and first is None:
            first = time.perf_counter() - t0
    conn.close()
    return first


def itl(url, n, rng, out_tokens=48):
    """Mean inter-token time over n concurrent streams."""
    gaps = []
    lock = threading.Lock()

    def one():
        prompt = [rng.randrange(1000, 150000) for _ in range(64)]
        conn = http.client.HTTPConnection("127.0.0.1", int(url.rsplit(":", 1)[1]), timeout=120)
        conn.request("POST", "/v1/completions", body=json.dumps(
            {"model": MODEL, "prompt": prompt, "max_tokens": out_tokens, "stream": True,
             "ignore_eos": True}).encode(), headers={"content-type": "application/json"})
        resp = conn.getresponse()
        stamps = []
        for line in resp:
            if line.startswith(b"data:") and b"[DONE]" not in line:
                stamps.append(time.perf_counter())
        conn.close()
        # Skip the first few tokens: the streams' prefills overlap them.
        d = [b - a for a, b in zip(stamps[8:], stamps[9:])]
        with lock:
            gaps.extend(d)

    threads = [threading.Thread(target=one) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return statistics.mean(gaps)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--out", default=os.path.join(ROOT, ".cache/real-vllm/fit.json"))
    ap.add_argument("--port", type=int, default=18600)
    args = ap.parse_args()
    procs = Procs(os.path.join(ROOT, ".cache/real-vllm/logs"))
    eng = Engine(procs, 9, args.port, 0)
    rng = random.Random(5)
    try:
        eng.start()
        eng.wait_ready()
        ttft(eng.url, [1000 + i for i in range(100)])  # warm-up
        pre = []
        for _ in range(args.repeat):
            for t in (64, 256, 512, 1024, 1536, 2048):
                p = [rng.randrange(1000, 150000) for _ in range(t)]
                pre.append((t, ttft(eng.url, p) * 1000))
        dec = []
        for _ in range(max(2, args.repeat // 2)):
            for n in (1, 2, 4, 8, 16):
                dec.append((n, itl(eng.url, n, rng) * 1000))
    finally:
        procs.stop_all()
    c, b, a = lstsq([t for t, _ in pre], [y for _, y in pre], 2)
    d, e = lstsq([n for n, _ in dec], [y for _, y in dec], 1)
    fit = {"prefill_quadratic_ms": a, "prefill_linear_ms": b, "prefill_const_ms": c,
           "decode_quadratic_ms": 0.0, "decode_linear_ms": 0.0, "decode_const_ms": d,
           "decode_per_seq_ms": e}
    resid = [y - (a * t * t + b * t + c) for t, y in pre]
    report = {"fit": fit, "prefill_samples_ms": pre, "decode_samples_ms": dec,
              "prefill_residual_ms": {"mean_abs": statistics.mean(abs(r) for r in resid),
                                      "max_abs": max(abs(r) for r in resid)},
              "prefill_tokens_per_s_at_2048": 2048 / ((a * 2048 * 2048 + b * 2048 + c) / 1000),
              "date": time.strftime("%Y-%m-%d")}
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    print(json.dumps({"fit": fit, "prefill_residual_ms": report["prefill_residual_ms"]}, indent=1))


if __name__ == "__main__":
    main()
