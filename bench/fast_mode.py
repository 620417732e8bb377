#!/usr/bin/env python3
"""Fast mode for the live peer bench's cells: how far live mean TTFT is from
fast mode's on the same trace, fleet and model-time rate.

For each workload and level of bench/peers.py this writes the workload as a
Mooncake trace (the timed trace as it is; `prefix_repetition` and `random`
rebuilt from vLLM's dataset parameters: 512-token hash blocks, Poisson
arrivals), runs `kvgate replay` in fast mode on the bench's fleet (4
replicas, `llmd_qwen3_32b`, block 16, 4,096 GPU blocks, no CPU tier, 8,192
batched tokens, 256 sequences) at the live rate divided by the sims'
speedup, and prints kv_aware's fast-mode mean TTFT in wall milliseconds
(model time / speedup) beside the live result of a bench run, if given:

    python3 bench/fast_mode.py [--results .cache/bench/results/RUN] [--kvgate target/release/kvgate] [--trace FILE]

Standard library only. Writes its traces and reports under
.cache/bench/fast_mode/.
"""

import argparse
import json
import random
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
import peers  # noqa: E402  (the bench's own workload and fleet definitions)

OUT = ROOT / ".cache" / "bench" / "fast_mode"
HASH_BLOCK = 512


def write_trace(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def synthetic_rows(wname: str, n: int, rate: float, seed: int) -> list[dict]:
    """`n` requests of the workload at `rate` req/s (model time), Poisson."""
    rng = random.Random(seed)
    rows, t, next_id = [], 0.0, 1 << 20
    wl = peers.WORKLOADS[wname]
    if wname == "prefix_repetition":
        # the workload's own shape (vllm bench serve's prefix_repetition parameters)
        px = wl.get("prefix", {"num": 24, "len": 3072, "suffix": 256, "output": 48})
        prefixes = [[p * 100 + i for i in range(px["len"] // HASH_BLOCK)] for p in range(px["num"])]
        prompt, out = px["len"] + px["suffix"], px["output"]
    else:  # random: new tokens only
        rd = wl.get("random", {"len": 2048, "output": 48})
        prompt, out = rd["len"], rd["output"]
    for _ in range(n):
        if wname == "prefix_repetition":
            ids = list(rng.choice(prefixes)) + [next_id]
            next_id += 1
        else:
            ids = list(range(next_id, next_id + prompt // HASH_BLOCK))
            next_id += len(ids)
        rows.append({"timestamp": int(t * 1000), "input_length": prompt, "output_length": out, "hash_ids": ids})
        t += rng.expovariate(rate)
    return rows


def live_means(results: Path, metric: str = "ttft_mean_ms") -> dict:
    """(workload, level) -> kvgate kv_aware's median `metric` in a bench run
    (`ttft_mean_ms`: the client's mean TTFT; `engine_ttft_mean_ms`: the
    engines' own, from their TTFT histograms)."""
    got = {}
    data = json.loads((results / "results.json").read_text())
    for cell in data.get("cells", []):
        if cell.get("router") == "kvgate-kv_aware" and cell.get("status") == "ok":
            med = (cell.get("summary", {}).get(metric) or {}).get("median")
            if med is not None:
                got[(cell["workload"], cell["level"])] = med
    return got


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", action="append", default=[], help="a bench/peers.py output folder (repeatable)")
    ap.add_argument("--kvgate", default=str(ROOT / "target" / "release" / "kvgate"))
    ap.add_argument("--engines", choices=["sim", "real"], default="sim",
                    help="the fleet and workloads of bench/peers.py --engines sim (default) or real")
    ap.add_argument("--preset", choices=["tiny", "gpu_like"], default="tiny",
                    help="with --engines real: the engines' preset, as bench/peers.py --preset (its fitted timing)")
    ap.add_argument("--full", action="store_true", help="the request counts of a full bench run (default: --quick's)")
    ap.add_argument("--trace", type=Path, default=None,
                    help="the timed_trace cells replay this Mooncake JSONL file, as bench/peers.py --trace does")
    args = ap.parse_args()
    try:
        peers.use_engines(args.engines, args.preset)
    except peers.BenchError as e:
        print(f"fast_mode.py: {e}", file=sys.stderr)
        return 2
    if args.trace is not None:
        try:
            peers.use_trace(args.trace)
        except peers.BenchError as e:
            print(f"fast_mode.py: {e}", file=sys.stderr)
            return 2
    live, engine = {}, {}
    for r in args.results:
        live.update(live_means(Path(r)))
        engine.update(live_means(Path(r), "engine_ttft_mean_ms"))
    OUT.mkdir(parents=True, exist_ok=True)
    f = peers.FLEET
    speed = f["speedup"]
    fleet_name = f.get("preset", "sim")
    print("| workload | level | live req/s (wall) | model req/s | fast kv_aware mean TTFT, wall ms "
          "| live kvgate kv_aware mean TTFT | live ÷ fast | live, the engines' own mean TTFT | engines' ÷ fast |")
    print("|---|---|---|---|---|---|---|---|---|")
    for wname, wl in peers.WORKLOADS.items():
        for level, rate in wl["levels"].items():
            n = wl["n" if args.full else "quick_n"][level]
            model_rate = rate / speed
            trace = OUT / f"{wname}-{level}-{fleet_name}.jsonl"
            if "trace" in wl:
                st = peers.trace_stats(wname)
                native = st["requests"] / st["span_s"]
                trace = wl["trace"]
                scale = model_rate / native
                n = min(n, st["requests"])
            else:
                write_trace(trace, synthetic_rows(wname, n, model_rate, seed=1))
                scale = 1.0
            report = OUT / f"{wname}-{level}-{fleet_name}.json"
            argv = [args.kvgate, "replay", "--trace", str(trace), "--limit", str(n), "--rate-scale", f"{scale:.6f}",
                    "--policies", "kv_aware", "--replicas", str(f["replicas"]), "--timing", f["timing"],
                    "--block-size", str(f["block_size"]), "--num-gpu-blocks", str(f["num_gpu_blocks"]),
                    "--num-cpu-blocks", "0", "--max-num-batched-tokens", str(f["max_num_batched_tokens"]),
                    "--max-num-seqs", str(f["max_num_seqs"]), "--json", str(report)]
            r = subprocess.run(argv, capture_output=True, text=True)
            if r.returncode != 0:
                print(f"| {wname} | {level} | kvgate replay failed: {r.stderr.strip()[-300:]} |||||||")
                continue
            rep = json.loads(report.read_text())
            fast = find_ttft_mean(rep) / speed
            lv = live.get((wname, level))
            ratio = f"{lv / fast:.2f}" if lv else ""
            en = engine.get((wname, level))
            en_ratio = f"{en / fast:.2f}" if en else ""
            print(f"| {wname} | {level} | {rate:g} | {model_rate:g} | {fast:.1f} | {lv if lv is None else round(lv, 1)} "
                  f"| {ratio} | {en if en is None else round(en, 1)} | {en_ratio} |")
    return 0


def find_ttft_mean(rep) -> float:
    """kv_aware's mean TTFT (model ms) in a `kvgate replay --json` report."""
    for run in rep.get("runs", []):
        if run.get("policy") == "kv_aware":
            t = run.get("ttft_ms") or {}
            return float(t["mean"])
    raise SystemExit(f"no kv_aware run in the replay report: {list(rep)[:10]}")


if __name__ == "__main__":
    sys.exit(main())
