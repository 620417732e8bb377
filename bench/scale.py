#!/usr/bin/env python3
"""Scale bench: N `kvgate serve` instances in front of M simulated engines.

One `kvgate sim` process hosts the M engines (each with its own HTTP port,
KV-event PUB and replay endpoint); N instances of `kvgate serve` subscribe to
every engine and share their load as peers: with `--share http` as a full
HTTP mesh (each instance names every other one's peer endpoint), with
`--share nats` over one `nats-server` (Debian's package) that this script
starts, each instance publishing its changes once on one subject. A client drives a fixed total rate of
streamed completions (open loop, Poisson arrivals) spread round-robin over
the instances: a shared-prefix workload, so that instances that do not see
each other's load would herd onto the same engines.

Each point (N, M) starts fresh processes, so no point inherits another's
caches. It reports, per instance, at idle before the load and at its end:
file descriptors (`/proc/PID/fd`), threads, RSS, and CPU per idle second;
over the measured window, its CPU (utime + stime) divided by the requests it
served and, separately, by the KV events it received (`kvgate_requests_total`
and `kvgate_events_total` from its `/metrics`): two views of one total,
not a split of it. At the end of each point, once the load has stopped, it
compares every instance's view of every engine (`/admin/replicas/{name}/
blocks`) with the engine's own GPU blocks (`/debug/kv_blocks`). For the fleet: mean and p99
TTFT measured by the client, the engines' prefix-cache hit rate (their own
`vllm:prefix_cache_*` counters) over the window, and both against the N = 1
point of the same M at the same total rate.

Load-change lag, two ways: under the load, every instance's
`kvgate_peer_batch_lag_seconds` histogram over the window (a peer's batch
from its flush to its arrival, p50 and p99 from the buckets; the wait for
the flush, at most `peers.flush_ms`, comes on top on either carrier); and
after the load, `--lag-probes` probes end to end: one streamed request sent
to instance 0 while instance 0 and instance N-1 are polled
(`/admin/replicas`) until each ledger shows it; the lag is the difference.
With `--share nats`, the server's own CPU over the window is reported too
(`nats_cpu_s`), apart from the instances'.

Usage:
  python3 bench/scale.py --instances 1,2,4 --engines 16,64 --rate 20 \\
      --seconds 40 --out /tmp/scale.json --progress /tmp/scale.log
  python3 bench/scale.py --share nats --instances 1,2,4,8,16 --engines 16 ...

Only the standard library; the binary is `target/release/kvgate` unless
`--bin` names another. Ports (plus `--port-offset`): engines from 19000
(HTTP), 23000 (events), 27000 (replay); instances from 18400 (API), 18500
(admin), 18600 (peers); NATS on 18399.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import shutil
import random
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CLK_TCK = os.sysconf("SC_CLK_TCK")
PEER_KEY = "scale-bench-peer-key"
NATS_SUBJECT = "kvgate.scale"


def log(progress: Path | None, msg: str) -> None:
    line = f"{time.strftime('%H:%M:%S')} {msg}"
    print(line, flush=True)
    if progress:
        with progress.open("a") as f:
            f.write(line + "\n")


def http_get(url: str, timeout: float = 5.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        return e.code, ""
    except OSError:
        return 0, ""


def proc_stats(pid: int) -> dict:
    """File descriptors, threads, RSS (MiB) and CPU seconds of one process."""
    try:
        fds = len(os.listdir(f"/proc/{pid}/fd"))
        status = Path(f"/proc/{pid}/status").read_text()
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return {}
    fields = {}
    for line in status.splitlines():
        key, _, value = line.partition(":")
        fields[key] = value.strip()
    rest = stat[stat.rindex(")") + 2 :].split()
    utime, stime = int(rest[11]), int(rest[12])
    return {
        "fds": fds,
        "threads": int(fields.get("Threads", "0")),
        "rss_mib": int(fields.get("VmRSS", "0 kB").split()[0]) / 1024,
        "hwm_mib": int(fields.get("VmHWM", "0 kB").split()[0]) / 1024,
        "cpu_s": (utime + stime) / CLK_TCK,
    }


def http_post(req) -> None:
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            r.read()
    except OSError:
        pass


def metric_sum(text: str, name: str) -> float:
    """Sum of every sample of metric `name` (all label sets)."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and (line[len(name)] in " {"):
            try:
                total += float(line.rsplit(" ", 1)[1])
            except ValueError:
                pass
    return total


def histogram(text: str, name: str) -> dict[float, float]:
    """Cumulative bucket counts of histogram `name`, summed over label sets."""
    out: dict[float, float] = {}
    for line in text.splitlines():
        if not line.startswith(name + "_bucket{"):
            continue
        le = line.split('le="', 1)[1].split('"', 1)[0]
        bound = math.inf if le == "+Inf" else float(le)
        out[bound] = out.get(bound, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def quantile(cumulative: dict[float, float], q: float) -> float | None:
    """The `q` quantile from cumulative buckets, interpolated within one."""
    bounds = sorted(cumulative)
    total = cumulative.get(math.inf, 0.0)
    if total <= 0:
        return None
    want, lower, below = q * total, 0.0, 0.0
    for b in bounds:
        c = cumulative[b]
        if c >= want:
            if math.isinf(b):
                return lower
            return lower + (b - lower) * (want - below) / max(c - below, 1e-12)
        lower, below = b, c
    return lower


class Point:
    """The processes of one (N, M) point."""

    def __init__(self, args, n: int, m: int):
        self.args, self.n, self.m = args, n, m
        self.sim: subprocess.Popen | None = None
        self.nats: subprocess.Popen | None = None
        self.serves: list[subprocess.Popen] = []
        self.logs: list = []

    def engine_url(self, i: int) -> str:
        return f"http://127.0.0.1:{self.args.port_offset + 19000 + i}"

    def api(self, k: int) -> str:
        return f"http://127.0.0.1:{self.args.port_offset + 18400 + k}"

    def admin(self, k: int) -> str:
        return f"http://127.0.0.1:{self.args.port_offset + 18500 + k}"

    def nats_port(self) -> int:
        return self.args.port_offset + 18399

    def start_nats(self) -> None:
        exe = shutil.which(self.args.nats_server)
        if exe is None:
            raise RuntimeError(f"{self.args.nats_server} not found: apt-get install nats-server")
        self.nats = self.spawn(
            [exe, "-a", "127.0.0.1", "-p", str(self.nats_port())], f"nats-m{self.m}-n{self.n}"
        )
        deadline = time.time() + 10
        while True:
            try:
                import socket

                socket.create_connection(("127.0.0.1", self.nats_port()), 0.5).close()
                return
            except OSError:
                if self.nats.poll() is not None or time.time() > deadline:
                    raise RuntimeError("nats-server did not start")
                time.sleep(0.05)

    def spawn(self, cmd: list[str], name: str) -> subprocess.Popen:
        out = open(Path(self.args.logs) / f"{name}.log", "w")
        self.logs.append(out)
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def start(self) -> None:
        a = self.args
        o = a.port_offset
        self.sim = self.spawn(
            [
                a.bin, "sim", "--replicas", str(self.m), "--port", str(o + 19000),
                "--events", f"tcp://127.0.0.1:{o + 23000}", "--bind-events",
                "--replay", f"tcp://127.0.0.1:{o + 27000}",
                "--num-gpu-blocks", str(a.gpu_blocks), "--speedup", str(a.speedup),
                "--log", "warn",
            ],
            f"sim-m{self.m}-n{self.n}",
        )
        deadline = time.time() + 300
        for i in range(self.m):
            while http_get(self.engine_url(i) + "/health", 1.0)[0] != 200:
                if self.sim.poll() is not None or time.time() > deadline:
                    raise RuntimeError(f"engine {i} not up")
                time.sleep(0.2)
        if self.n > 1 and a.share == "nats":
            self.start_nats()
        replicas = [
            f"{self.engine_url(i)},events=tcp://127.0.0.1:{o + 23000 + i},"
            f"replay=tcp://127.0.0.1:{o + 27000 + i},name=e{i}"
            for i in range(self.m)
        ]
        for k in range(self.n):
            cmd = [
                a.bin, "serve", "--listen", f"127.0.0.1:{o + 18400 + k}",
                "--admin-listen", f"127.0.0.1:{o + 18500 + k}", "--log", "warn",
            ]
            for r in replicas:
                cmd += ["--replica", r]
            if self.n > 1 and a.share == "nats":
                cmd += [
                    "--peer-nats", f"nats://127.0.0.1:{self.nats_port()}",
                    "--peer-nats-subject", NATS_SUBJECT,
                ]
            elif self.n > 1:
                cmd += ["--peer-listen", f"127.0.0.1:{o + 18600 + k}", "--peer-key", PEER_KEY]
                for j in range(self.n):
                    if j != k:
                        cmd += ["--peer", f"http://127.0.0.1:{o + 18600 + j}"]
            self.serves.append(self.spawn(cmd, f"serve-m{self.m}-n{self.n}-{k}"))
        deadline = time.time() + 300
        for k, p in enumerate(self.serves):
            while http_get(self.api(k) + "/ready", 1.0)[0] != 200:
                if p.poll() is not None or time.time() > deadline:
                    raise RuntimeError(f"instance {k} not ready")
                time.sleep(0.3)

    def stop(self) -> None:
        procs = self.serves + [p for p in (self.sim, self.nats) if p]
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        for f in self.logs:
            f.close()

    def engine_counters(self) -> tuple[float, float]:
        with ThreadPoolExecutor(16) as pool:
            texts = list(pool.map(lambda i: http_get(self.engine_url(i) + "/metrics")[1], range(self.m)))
        hits = sum(metric_sum(t, "vllm:prefix_cache_hits_total") for t in texts)
        queries = sum(metric_sum(t, "vllm:prefix_cache_queries_total") for t in texts)
        return hits, queries

    def views_equal(self) -> dict:
        """Whether every instance's view of every engine holds exactly the
        engine's GPU blocks (`/debug/kv_blocks` against the instance's
        `/admin/replicas/{name}/blocks`)."""
        o = self.args.port_offset

        def engine(i: int) -> set[int]:
            _, text = http_get(self.engine_url(i) + "/debug/kv_blocks", 10.0)
            return {int(h) % (1 << 64) for h in json.loads(text or "{}").get("gpu", [])}

        def view(pair: tuple[int, int]) -> set[int]:
            k, i = pair
            _, text = http_get(f"http://127.0.0.1:{o + 18500 + k}/admin/replicas/e{i}/blocks", 10.0)
            return {int(h) % (1 << 64) for h in json.loads(text or "{}").get("gpu", [])}

        with ThreadPoolExecutor(16) as pool:
            engines = list(pool.map(engine, range(self.m)))
            pairs = [(k, i) for k in range(self.n) for i in range(self.m)]
            views = list(pool.map(view, pairs))
        unequal = [(k, i) for (k, i), v in zip(pairs, views) if v != engines[i]]
        return {
            "views": len(pairs),
            "unequal": len(unequal),
            "engine_blocks": sum(len(e) for e in engines),
            "first_unequal": [f"instance {k}, engine e{i}" for k, i in unequal[:5]],
        }

    def instance_counters(self) -> list[dict]:
        out = []
        for k, p in enumerate(self.serves):
            _, text = http_get(self.api(k) + "/metrics")
            s = proc_stats(p.pid)
            s["events"] = metric_sum(text, "kvgate_events_total")
            s["event_batches"] = metric_sum(text, "kvgate_event_batches_total")
            s["requests"] = metric_sum(text, "kvgate_requests_total")
            s["lag"] = histogram(text, "kvgate_peer_batch_lag_seconds")
            s["dropped"] = metric_sum(text, "kvgate_peer_batches_dropped_total") + metric_sum(
                text, "kvgate_peer_send_failures_total"
            )
            out.append(s)
        if self.nats:
            out.append({"nats_cpu_s": proc_stats(self.nats.pid).get("cpu_s", 0.0)})
        return out

    def booked(self, k: int) -> int:
        """Requests instance k's ledger holds (its own and its peers')."""
        _, text = http_get(self.admin(k) + "/admin/replicas", 2.0)
        try:
            rs = json.loads(text)["replicas"]
        except (ValueError, KeyError):
            return -1
        return sum(r["prefill_requests"] + r["decoding_requests"] for r in rs)

    def lag_probes(self, probes: int, rng: random.Random) -> list[float]:
        """End-to-end load-change lag: a streamed request to instance 0;
        instance 0's and instance N-1's ledgers polled until each shows it."""
        import threading
        import urllib.request as ur

        lags = []
        far = self.n - 1
        for p in range(probes):
            deadline = time.time() + 10
            while (self.booked(0), self.booked(far)) != (0, 0):
                if time.time() > deadline:
                    break
                time.sleep(0.05)
            seen: dict[int, float] = {}

            def watch(k: int) -> None:
                end = time.time() + 5
                while time.time() < end:
                    if self.booked(k) > 0:
                        seen[k] = time.perf_counter()
                        return

            watchers = [threading.Thread(target=watch, args=(k,)) for k in (0, far)]
            for w in watchers:
                w.start()
            body = json.dumps(
                {
                    "model": "Qwen/Qwen3-0.6B",
                    "prompt": f"probe {p} {rng.randrange(10**9)} " * 20,
                    "max_tokens": 40,
                    "ignore_eos": True,
                }
            ).encode()
            req = ur.Request(self.api(0) + "/v1/completions", body, {"Content-Type": "application/json"})
            sender = threading.Thread(target=lambda: http_post(req))
            sender.start()
            for w in watchers:
                w.join()
            sender.join()
            if 0 in seen and far in seen:
                lags.append(max(0.0, seen[far] - seen[0]))
        return lags


def make_prompts(args) -> list[str]:
    rng = random.Random(args.seed)
    words = [f"w{i}" for i in range(4000)]
    return [" ".join(rng.choice(words) for _ in range(args.prefix_words)) for _ in range(args.prefixes)]


async def one_request(host: str, port: int, body: bytes, timeout: float) -> tuple[float | None, bool]:
    """Streams one completion; returns (TTFT in s, ok). Past `timeout`, failed."""
    try:
        return await asyncio.wait_for(stream_one(host, port, body), timeout)
    except asyncio.TimeoutError:
        return None, False


async def stream_one(host: str, port: int, body: bytes) -> tuple[float | None, bool]:
    t0 = time.perf_counter()
    try:
        reader, writer = await asyncio.open_connection(host, port)
    except OSError:
        return None, False
    try:
        head = (
            f"POST /v1/completions HTTP/1.1\r\nHost: {host}:{port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n"
        ).encode()
        writer.write(head + body)
        await writer.drain()
        status = await reader.readline()
        if b" 200 " not in status:
            return None, False
        ttft = None
        buf = b""
        while True:
            chunk = await reader.read(65536)
            if not chunk:
                break
            buf += chunk
            if ttft is None and b"data: {" in buf:
                ttft = time.perf_counter() - t0
            if b"data: [DONE]" in buf:
                break
            buf = buf[-64:]
        return ttft, ttft is not None
    except OSError:
        return None, False
    finally:
        writer.close()


async def drive(args, point: Point, prompts: list[str], seconds: float) -> dict:
    rng = random.Random(args.seed + point.n * 1000 + point.m)
    results: list[tuple[float | None, bool]] = []
    tasks = []
    t_end = time.perf_counter() + seconds
    t_next = time.perf_counter()
    i = 0
    while True:
        t_next += rng.expovariate(args.rate)
        if t_next >= t_end:
            break
        await asyncio.sleep(max(0.0, t_next - time.perf_counter()))
        prefix = prompts[min(int(rng.paretovariate(1.2)) - 1, len(prompts) - 1)]
        suffix = " ".join(f"u{rng.randrange(10**9)}" for _ in range(args.suffix_words))
        body = json.dumps(
            {
                "model": "Qwen/Qwen3-0.6B",
                "prompt": prefix + " " + suffix,
                "max_tokens": args.max_tokens,
                "stream": True,
            }
        ).encode()
        k = i % point.n
        i += 1
        tasks.append(asyncio.create_task(one_request("127.0.0.1", args.port_offset + 18400 + k, body, args.timeout)))
    for t in tasks:
        results.append(await t)
    ttfts = sorted(r[0] for r in results if r[1])
    failed = sum(1 for r in results if not r[1])
    if not ttfts:
        return {"requests": len(results), "failed": failed}
    return {
        "requests": len(results),
        "failed": failed,
        "ttft_mean_ms": 1000 * statistics.fmean(ttfts),
        "ttft_p50_ms": 1000 * ttfts[len(ttfts) // 2],
        "ttft_p99_ms": 1000 * ttfts[min(len(ttfts) - 1, int(0.99 * len(ttfts)))],
    }


def run_point(args, n: int, m: int, prompts: list[str], progress: Path | None) -> dict:
    point = Point(args, n, m)
    try:
        t = time.time()
        point.start()
        log(progress, f"N={n} M={m}: up in {time.time() - t:.1f} s")
        ready = point.instance_counters()
        time.sleep(args.idle)
        idle = point.instance_counters()
        asyncio.run(drive(args, point, prompts, args.warmup))
        # The engines' counters outside the instances' window: scraping M
        # engines takes a while, and the instances' CPU must not count it.
        hits0, queries0 = point.engine_counters()
        before = point.instance_counters()
        t0 = time.time()
        fleet = asyncio.run(drive(args, point, prompts, args.seconds))
        after = point.instance_counters()
        window = time.time() - t0
        hits1, queries1 = point.engine_counters()
        time.sleep(args.settle)
        views = point.views_equal()
        probes = point.lag_probes(args.lag_probes, random.Random(args.seed)) if n > 1 else []
        per_instance = []
        for k in range(n):
            b, a = before[k], after[k]
            served = a.get("requests", 0) - b.get("requests", 0)
            events = a.get("events", 0) - b.get("events", 0)
            cpu = a.get("cpu_s", 0) - b.get("cpu_s", 0)
            per_instance.append(
                {
                    "idle": {key: idle[k].get(key) for key in ("fds", "threads", "rss_mib")},
                    "idle_cores": (idle[k].get("cpu_s", 0) - ready[k].get("cpu_s", 0)) / args.idle,
                    "end": {key: a.get(key) for key in ("fds", "threads", "rss_mib", "hwm_mib")},
                    "cpu_s": cpu,
                    "requests": served,
                    "events": events,
                    "cpu_ms_per_request": 1000 * cpu / served if served else None,
                    "cpu_us_per_event": 1e6 * cpu / events if events else None,
                }
            )
        fleet["window_s"] = window
        if n > 1:
            lag: dict[float, float] = {}
            for k in range(n):
                for bound, c in after[k]["lag"].items():
                    lag[bound] = lag.get(bound, 0.0) + c - before[k]["lag"].get(bound, 0.0)
            q50, q99 = quantile(lag, 0.5), quantile(lag, 0.99)
            fleet["batch_lag_p50_ms"] = None if q50 is None else 1000 * q50
            fleet["batch_lag_p99_ms"] = None if q99 is None else 1000 * q99
            fleet["batches_received"] = lag.get(math.inf, 0.0)
            fleet["batches_dropped"] = sum(after[k]["dropped"] - before[k]["dropped"] for k in range(n))
            probes.sort()
            fleet["probe_lag_ms"] = [round(1000 * x, 2) for x in probes]
            if probes:
                fleet["probe_lag_p50_ms"] = 1000 * probes[len(probes) // 2]
                fleet["probe_lag_max_ms"] = 1000 * probes[-1]
        if point.nats:
            fleet["nats_cpu_s"] = after[-1]["nats_cpu_s"] - before[-1]["nats_cpu_s"]
        fleet["hit_rate"] = (hits1 - hits0) / (queries1 - queries0) if queries1 > queries0 else None
        result = {
            "share": args.share,
            "instances": n,
            "engines": m,
            "rate": args.rate,
            "fleet": fleet,
            "views": views,
            "per_instance": per_instance,
        }
        log(progress, f"N={n} M={m}: {json.dumps(summary(result))}")
        return result
    finally:
        point.stop()


def summary(r: dict) -> dict:
    pi = r["per_instance"]
    f = r["fleet"]
    return {
        "share": r.get("share", "http"),
        "N": r["instances"],
        "M": r["engines"],
        "idle_fds_max": max(p["idle"]["fds"] for p in pi),
        "threads_max": max(p["end"]["threads"] for p in pi),
        "idle_cores_mean": round(statistics.fmean(p["idle_cores"] for p in pi), 4),
        "rss_mib_max": round(max(p["end"]["rss_mib"] for p in pi), 1),
        "cpu_ms_per_req_mean": round(statistics.fmean(p["cpu_ms_per_request"] or 0 for p in pi), 3),
        "cpu_us_per_event_mean": round(statistics.fmean(p["cpu_us_per_event"] or 0 for p in pi), 2),
        "requests": f["requests"],
        "failed": f["failed"],
        "ttft_mean_ms": round(f.get("ttft_mean_ms", float("nan")), 1),
        "ttft_p99_ms": round(f.get("ttft_p99_ms", float("nan")), 1),
        "hit_rate": None if f.get("hit_rate") is None else round(f["hit_rate"], 4),
        "views_unequal": f"{r['views']['unequal']} of {r['views']['views']}",
        "batch_lag_p50_ms": rnd(f.get("batch_lag_p50_ms"), 2),
        "batch_lag_p99_ms": rnd(f.get("batch_lag_p99_ms"), 2),
        "probe_lag_p50_ms": rnd(f.get("probe_lag_p50_ms"), 2),
        "probe_lag_max_ms": rnd(f.get("probe_lag_max_ms"), 2),
        "batches_dropped": f.get("batches_dropped"),
        "nats_cpu_s": rnd(f.get("nats_cpu_s"), 3),
    }


def rnd(v, digits: int):
    return None if v is None else round(v, digits)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bin", default=str(ROOT / "target/release/kvgate"))
    p.add_argument("--instances", default="1,2,4", help="N values, comma-separated")
    p.add_argument("--engines", default="16,64", help="M values, comma-separated")
    p.add_argument("--rate", type=float, default=20.0, help="total requests per second")
    p.add_argument("--seconds", type=float, default=40.0, help="measured window per point")
    p.add_argument("--warmup", type=float, default=10.0, help="load before the window")
    p.add_argument("--idle", type=float, default=5.0, help="seconds idle before the idle snapshot")
    p.add_argument("--prefixes", type=int, default=32, help="shared prefixes (Pareto popularity)")
    p.add_argument("--prefix-words", type=int, default=600)
    p.add_argument("--suffix-words", type=int, default=40)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--gpu-blocks", type=int, default=2048, help="GPU blocks per engine")
    p.add_argument("--speedup", type=float, default=1.0, help="kvgate sim --speedup")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument(
        "--share", choices=["http", "nats"], default="http",
        help="how instances share load: the HTTP peer mesh, or NATS (starts nats-server)",
    )
    p.add_argument("--nats-server", default="nats-server", help="the nats-server executable")
    p.add_argument("--lag-probes", type=int, default=10, help="end-to-end lag probes per point (N > 1)")
    p.add_argument("--settle", type=float, default=2.0, help="seconds after the load before views are compared")
    p.add_argument("--port-offset", type=int, default=0, help="added to every port below")
    p.add_argument("--timeout", type=float, default=30.0, help="a request slower than this failed")
    p.add_argument("--out", default=None, help="JSON results")
    p.add_argument("--progress", default=None, help="append progress lines here")
    p.add_argument("--logs", default="/tmp/kvgate-scale-logs", help="process logs")
    args = p.parse_args()
    Path(args.logs).mkdir(parents=True, exist_ok=True)
    progress = Path(args.progress) if args.progress else None
    prompts = make_prompts(args)
    results = []
    for m in [int(x) for x in args.engines.split(",")]:
        base = None
        for n in [int(x) for x in args.instances.split(",")]:
            r = run_point(args, n, m, prompts, progress)
            if n == 1:
                base = r
            if base and base["fleet"].get("ttft_mean_ms") and r["fleet"].get("ttft_mean_ms"):
                r["vs_one_instance"] = {
                    "ttft_mean_ratio": r["fleet"]["ttft_mean_ms"] / base["fleet"]["ttft_mean_ms"],
                    "hit_rate_points": None
                    if r["fleet"].get("hit_rate") is None or base["fleet"].get("hit_rate") is None
                    else 100 * (r["fleet"]["hit_rate"] - base["fleet"]["hit_rate"]),
                }
            results.append(r)
            if args.out:
                Path(args.out).write_text(json.dumps({"args": vars(args), "points": results}, indent=1))
    for r in results:
        print(json.dumps({**summary(r), **r.get("vs_one_instance", {})}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
