"""Fits `kvgate sim`'s step-time model (crates/kvgate-sim/src/timing.rs) to a
real vLLM engine on this CPU (the `vllm_cpu_tiny` and `vllm_cpu_gpu_like`
presets), or measures an engine preset's cold, warm and ITL figures.

    bash scripts/real-vllm.sh install
    PY=$(bash scripts/real-vllm.sh env | sed -n 's/^PYTHON=//p')
    $PY bench/fit_cpu_timing.py [--repeat 5] [--out .cache/real-vllm/fit.json]
    REAL_VLLM_PRESET=gpu_like $PY bench/fit_cpu_timing.py    # .cache/real-vllm/fit-gpu_like.json
    REAL_VLLM_PRESET=gpu_like $PY bench/fit_cpu_timing.py --costs   # docs/real-vllm.md's preset table

`--costs` measures, median of `--repeat` (default 3 there), one engine on one
core: the TTFT of a fresh ("cold") token-id prompt of 2,048 and 8,000 tokens,
of the same prompt with its last 128 tokens changed ("warm": all but the last
blocks cached), and the inter-token time of one stream (48 tokens out).

It starts one engine with scripts/real-vllm.sh serve and measures, from the
client, one request at a time:
- prefill: the time to first token of fresh token-id prompts of T tokens
  (T up to 2,048, the CPU engine's default per-step token budget, so one
  step each), fitted by least squares to a·T² + b·T + c;
- decode: the mean inter-token time of n concurrent streams (n = 1 … 16),
  fitted to d + e·n;
- prefill context: the TTFT of T = 128 or 512 new tokens after a cached
  prefix of C = 512 … 6,016 tokens, whose excess over the fresh-prompt fit
  is fitted to k·T·C (the new tokens' attention over the cached ones);
- decode context: the inter-token time of one stream after a prompt of
  C = 64 … 6,016 tokens, whose slope over C is k'.
It checks the fit against a cold 8,000-token prompt (four chunks, each
attending over the ones before it), prints the coefficients as the
preset's fields and writes the raw samples.
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


def itl(url, n, rng, out_tokens=48, prompt_tokens=64):
    """Mean inter-token time over n concurrent streams of `prompt_tokens`-token prompts."""
    gaps = []
    lock = threading.Lock()

    def one():
        prompt = [rng.randrange(1000, 150000) for _ in range(prompt_tokens)]
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


def costs(url, repeat, rng):
    """Cold and warm TTFT at 2,048 and 8,000 tokens and one stream's ITL, ms, median of `repeat`."""
    out = {}
    for n in (2048, 8000):
        cold, warm = [], []
        for _ in range(repeat):
            p = [rng.randrange(1000, 150000) for _ in range(n)]
            cold.append(ttft(url, p) * 1000)
            p[-128:] = [rng.randrange(1000, 150000) for _ in range(128)]
            warm.append(ttft(url, p) * 1000)
        out[f"cold_{n}_ms"] = statistics.median(cold)
        out[f"warm_{n}_ms"] = statistics.median(warm)
        out[f"cold_over_warm_{n}"] = out[f"cold_{n}_ms"] / out[f"warm_{n}_ms"]
    out["itl_ms"] = statistics.median(itl(url, 1, rng) * 1000 for _ in range(repeat))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=None, help="samples per point (default 5; 3 with --costs)")
    ap.add_argument("--out", default=None, help="JSON output (default .cache/real-vllm/fit[-PRESET].json, "
                    "costs[-PRESET].json with --costs)")
    ap.add_argument("--port", type=int, default=18600)
    ap.add_argument("--costs", action="store_true", help="measure the preset's cold, warm and ITL figures instead")
    args = ap.parse_args()
    preset = os.environ.get("REAL_VLLM_PRESET", "tiny")
    suffix = "" if preset == "tiny" else f"-{preset}"
    repeat = args.repeat or (3 if args.costs else 5)
    if repeat < 1:
        ap.error("--repeat must be >= 1")
    out_path = args.out or os.path.join(ROOT, ".cache/real-vllm", ("costs" if args.costs else "fit") + suffix + ".json")
    procs = Procs(os.path.join(ROOT, ".cache/real-vllm/logs"))
    eng = Engine(procs, 9, args.port, 0)
    rng = random.Random(5)
    try:
        eng.start()
        eng.wait_ready()
        ttft(eng.url, [1000 + i for i in range(100)])  # warm-up
        report = costs(eng.url, repeat, rng) if args.costs else fit_samples(eng.url, repeat, rng)
    finally:
        procs.stop_all()
    report.update({"preset": preset, "repeat": repeat, "date": time.strftime("%Y-%m-%d")})
    os.makedirs(os.path.dirname(out_path), exist_ok=True)
    with open(out_path, "w") as f:
        json.dump(report, f, indent=1)
    shown = report if args.costs else {k: report[k] for k in ("fit", "prefill_residual_ms", "context_residual_ms", "cold_8000_ms")}
    print(json.dumps(shown, indent=1))


def fit_samples(url, repeat, rng):
    """The step model fitted to fresh prompts' TTFT, concurrent streams' ITL
    and both over cached context, with its samples and a cold 8,000-token check."""
    pre = []
    for _ in range(repeat):
        for t in (64, 256, 512, 1024, 1536, 2048):
            p = [rng.randrange(1000, 150000) for _ in range(t)]
            pre.append((t, ttft(url, p) * 1000))
    dec = []
    for _ in range(max(2, repeat // 2)):
        for n in (1, 2, 4, 8, 16):
            dec.append((n, itl(url, n, rng) * 1000))
    ctx = []  # (new tokens, cached tokens, ms)
    for _ in range(repeat):
        for c in (512, 2048, 4096, 6016):  # multiples of the 32-token block
            for t in (128, 512):
                p = [rng.randrange(1000, 150000) for _ in range(c + t)]
                ttft(url, p)  # caches the prefix
                p[c:] = [rng.randrange(1000, 150000) for _ in range(t)]
                ctx.append((t, c, ttft(url, p) * 1000))
    dctx = []  # (prompt tokens, ms per output token), one stream
    for _ in range(max(2, repeat // 2)):
        for c in (64, 2048, 4096, 6016):
            dctx.append((c, itl(url, 1, rng, prompt_tokens=c) * 1000))
    cold8k = [ttft(url, [rng.randrange(1000, 150000) for _ in range(8000)]) * 1000 for _ in range(max(2, repeat // 2))]
    c0, b, a = lstsq([t for t, _ in pre], [y for _, y in pre], 2)
    d, e = lstsq([n for n, _ in dec], [y for _, y in dec], 1)

    def fresh(t):
        return a * t * t + b * t + c0

    # Least squares through the origin for the excess over the fresh fit.
    xs = [t * c for t, c, _ in ctx]
    k = sum(x * (y - fresh(t)) for x, (t, _, y) in zip(xs, ctx)) / sum(x * x for x in xs)
    # The slope of one stream's inter-token time over its context (a
    # stream's context grows while it decodes: count the middle of its
    # output); its intercept is the concurrent fit's business.
    _, kd = lstsq([c + 28 for c, _ in dctx], [y for _, y in dctx], 1)
    kd = max(0.0, kd)
    fit = {"prefill_quadratic_ms": a, "prefill_linear_ms": b, "prefill_const_ms": c0,
           "decode_quadratic_ms": 0.0, "decode_linear_ms": 0.0, "decode_const_ms": d,
           "decode_per_seq_ms": e, "prefill_context_ms": k, "decode_context_ms": kd}

    def chunked(n, kk, chunk=2048):
        done, ms = 0, 0.0
        while done < n:
            t = min(chunk, n - done)
            ms += fresh(t) + kk * t * done
            done += t
        return ms

    resid = [y - fresh(t) for t, y in pre]
    cresid = [y - fresh(t) - k * t * c for t, c, y in ctx]
    return {"fit": fit, "prefill_samples_ms": pre, "decode_samples_ms": dec,
            "context_samples_ms": ctx, "decode_context_samples_ms": dctx,
            "prefill_residual_ms": {"mean_abs": statistics.mean(abs(r) for r in resid),
                                    "max_abs": max(abs(r) for r in resid)},
            "context_residual_ms": {"mean_abs": statistics.mean(abs(r) for r in cresid),
                                    "max_abs": max(abs(r) for r in cresid)},
            "cold_8000_ms": {"measured_median": statistics.median(cold8k), "model": chunked(8000, k),
                             "model_without_context": chunked(8000, 0.0)},
            "prefill_tokens_per_s_at_2048": 2048 / (fresh(2048) / 1000)}

if __name__ == "__main__":
    main()
