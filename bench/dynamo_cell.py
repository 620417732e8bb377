"""The NVIDIA Dynamo cell of the peer bench: `python -m dynamo.frontend --router-mode kv` over
`python -m dynamo.mocker` (4 workers, --block-size 16), driven by the same `vllm bench serve`.

Dynamo 1.6.1 binds its ZMQ event-plane publishers on 0.0.0.0 whatever DYN_EVENT_PLANE_HOST
says (that variable only sets the advertised address). So that nothing listens off loopback,
peers.py runs this file in a private network namespace (`unshare -n`, only `lo` up) together
with the frontend, the mocker and the client; nothing outside the namespace can reach them.
It writes its record to WORKDIR/record.json.

    unshare -n -- PY bench/dynamo_cell.py SPEC.json      (peers.py does this)
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import peers as P  # noqa: E402

MODEL_DIR = P.CACHE / "model-qwen3"

# A minimal config.json so that Dynamo's model-card loader accepts the bundled
# tokenizer directory (Qwen3-0.6B's shape; no weights are ever read).
QWEN3_CONFIG = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
    "bos_token_id": 151643, "eos_token_id": 151645,
    "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28,
    "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
    "max_position_embeddings": 40960, "rms_norm_eps": 1e-06, "rope_theta": 1000000,
    "tie_word_embeddings": True, "torch_dtype": "bfloat16", "vocab_size": 151936,
}


def ensure_model_dir() -> Path:
    MODEL_DIR.mkdir(parents=True, exist_ok=True)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        dst = MODEL_DIR / f
        if not dst.exists():
            dst.symlink_to(P.TOKENIZER_DIR / f)
    cfg = MODEL_DIR / "config.json"
    if not cfg.exists():
        cfg.write_text(json.dumps(QWEN3_CONFIG, indent=1) + "\n")
    return MODEL_DIR


def dyn_env(kvdir: Path) -> dict:
    return {
        "DYN_DISCOVERY_BACKEND": "file", "DYN_FILE_KV": str(kvdir),
        "DYN_REQUEST_PLANE": "tcp", "DYN_EVENT_PLANE": "zmq",
        "DYN_TCP_RPC_HOST": "127.0.0.1", "DYN_EVENT_PLANE_HOST": "127.0.0.1",
        "DYN_TCP_RESPONSE_STREAM_HOST": "127.0.0.1", "DYN_SYSTEM_HOST": "127.0.0.1",
        "DYN_HTTP_RPC_HOST": "127.0.0.1", "DYN_HTTP_HOST": "127.0.0.1",
        "HF_HUB_OFFLINE": "1", "NO_COLOR": "1",
    }


def frontend_metrics(url: str) -> dict:
    st, body = P.http("GET", url + "/metrics", timeout=5.0)
    out = {"workers": set()}
    if st != 200:
        return out
    for line in body.decode(errors="replace").splitlines():
        if not line or line[0] == "#":
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        try:
            val = float(line.rsplit(" ", 1)[1])
        except ValueError:
            continue
        if name in ("dynamo_frontend_cached_tokens_sum", "dynamo_frontend_input_sequence_tokens_sum",
                    "dynamo_frontend_requests_total"):
            out[name] = out.get(name, 0.0) + val
        if name.startswith("dynamo_frontend_worker_") and 'worker_id="' in line:
            out["workers"].add(line.split('worker_id="', 1)[1].split('"', 1)[0])
    return out


def main() -> int:
    # stop the frontend, the mocker and the client when peers.py stops this cell
    signal.signal(signal.SIGTERM, P._on_signal)
    signal.signal(signal.SIGINT, P._on_signal)
    spec = json.loads(Path(sys.argv[1]).read_text())
    workdir = Path(spec["workdir"])
    rec = spec["rec"]
    wname, rate, n, seed = spec["workload"], spec["rate"], spec["n"], spec["seed"]
    args = type("A", (), {"client_timeout": spec.get("client_timeout")})()
    fleet = P.DYNAMO_FLEET
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    model_dir = ensure_model_dir()
    kvdir = workdir / "discovery"
    kvdir.mkdir(parents=True, exist_ok=True)
    env = dyn_env(kvdir)
    py = str(P.VENV_DYNAMO / "bin" / "python")
    port = P.free_port_block(2)
    url = f"http://127.0.0.1:{port}"
    mocker = frontend = None
    try:
        mocker = P.Proc("dynamo.mocker (4 workers)", [
            py, "-m", "dynamo.mocker", "--model-path", str(model_dir), "--model-name", P.MODEL,
            "--block-size", str(fleet["block_size"]), "--num-gpu-blocks-override", str(rec["gpu_blocks"]),
            "--max-num-seqs", str(fleet["max_num_seqs"]), "--max-num-batched-tokens", str(fleet["max_num_batched_tokens"]),
            "--enable-prefix-caching", "--enable-chunked-prefill",
            "--speedup-ratio", str(fleet["speedup"]), "--num-workers", str(fleet["replicas"]),
            "--discovery-backend", "file", "--request-plane", "tcp", "--event-plane", "zmq",
        ], workdir / "sim.log", env=env)
        frontend = P.Proc("dynamo.frontend --router-mode kv", [
            py, "-m", "dynamo.frontend", "--router-mode", "kv",
            "--http-host", "127.0.0.1", "--http-port", str(port),
            "--kv-cache-block-size", str(fleet["block_size"]),
            "--model-name", P.MODEL, "--model-path", str(model_dir),
            "--discovery-backend", "file", "--request-plane", "tcp", "--event-plane", "zmq",
        ], workdir / "router.log", env=env)
        t0 = time.time()
        while True:
            for p in (mocker, frontend):
                if not p.alive():
                    raise p.fail("exited during startup")
            st, body = P.http("GET", url + "/v1/models", timeout=2.0)
            if st == 200 and P.MODEL.encode() in body:
                break
            if time.time() - t0 > 180:
                raise frontend.fail("not ready after 180 s")
            time.sleep(0.5)
        time.sleep(3.0)  # the four workers register together; let the router see them all
        ls = P.listening_addrs(frontend.pid) + P.listening_addrs(mocker.pid)
        rec["listeners"] = {"count": len(ls), "off_loopback": [a for a in ls if not P.is_loopback(a)],
                            "note": "inside a private network namespace (unshare -n): only lo exists"}
        rec["cold_prompt_ttft_ms"] = P.cold_prompt_ttft(url)
        wl = P.WORKLOADS[wname]
        extra = (["--timed-trace-sec-multiplier", f"{P.trace_multiplier(rate):.8g}"] if wname == "timed_trace"
                 else ["--request-rate", str(rate)])
        t_ready = time.time()
        cpu_r_ready = P.tree_cpu_s(frontend.pid)
        rss_idle = P.tree_rss_mib(frontend.pid)
        snap: dict = {}
        peak = {"rss": rss_idle}
        stop = threading.Event()
        client_pid: list[int] = []

        def sampler():
            while not stop.wait(0.5):
                peak["rss"] = max(peak["rss"], P.tree_rss_mib(frontend.pid))

        def on_start():
            snap["t"] = time.time()
            snap["cpu_router"] = P.tree_cpu_s(frontend.pid)
            snap["cpu_sim"] = P.tree_cpu_s(mocker.pid)
            snap["fm"] = frontend_metrics(url)
            snap["machine"] = P.machine_cpu()
            snap["client_cpu"] = P.tree_cpu_s(client_pid[0]) if client_pid else 0.0

        th = threading.Thread(target=sampler, daemon=True)
        th.start()
        res, client_tail, wall = P.run_client(args, wl, rate, n, seed, url, workdir, on_start, extra, client_pid)
        t_end = time.time()
        m_busy, m_total = P.machine_cpu()
        cpu_router = P.tree_cpu_s(frontend.pid) - snap.get("cpu_router", cpu_r_ready)
        cpu_sim = P.tree_cpu_s(mocker.pid) - snap.get("cpu_sim", 0.0)
        stop.set()
        th.join(timeout=2)
        fm_after = frontend_metrics(url)
        (workdir / "frontend_metrics.txt").write_bytes(P.http("GET", url + "/metrics", timeout=5.0)[1] or b"")
        rec["workers_seen"] = len(fm_after["workers"])
        if res is None:
            rec.update(status="error", reason=client_tail)
            return 0
        completed, failed = int(res.get("completed", 0)), int(res.get("failed", 0))
        errs = [str(e).strip().splitlines()[-1][:240] for e in (res.get("errors") or []) if e and str(e).strip()]
        distinct = list(dict.fromkeys(errs))[:3]
        if completed == 0:
            rec.update(status="cannot_run", reason=f"every request failed through Dynamo ({failed}); first errors: {distinct}")
            return 0
        fb = snap.get("fm", {})
        cached = fm_after.get("dynamo_frontend_cached_tokens_sum", 0.0) - fb.get("dynamo_frontend_cached_tokens_sum", 0.0)
        inputs = fm_after.get("dynamo_frontend_input_sequence_tokens_sum", 0.0) - fb.get("dynamo_frontend_input_sequence_tokens_sum", 0.0)
        if inputs <= 0:
            inputs = float(res.get("total_input_tokens") or 0)
        raw = res.get("ttfts") or []
        errl = res.get("errors") or [""] * len(raw)
        ttfts = [t * 1000 for t, e in zip(raw, errl) if not e and t and t > 0]
        rec.update(
            status="ok", reason=None, completed=completed, failed=failed, errors=distinct,
            duration_s=res.get("duration"), request_throughput=res.get("request_throughput"),
            ttft_mean_ms=res.get("mean_ttft_ms"), ttft_p50_ms=res.get("p50_ttft_ms"),
            ttft_p90_ms=res.get("p90_ttft_ms"), ttft_p99_ms=res.get("p99_ttft_ms"),
            tpot_mean_ms=res.get("mean_tpot_ms"),
            itl_mean_ms=res.get("mean_itl_ms"), itl_p50_ms=res.get("p50_itl_ms"),
            itl_p90_ms=res.get("p90_itl_ms"), itl_p99_ms=res.get("p99_itl_ms"),
            e2el_mean_ms=res.get("mean_e2el_ms"), e2el_p50_ms=res.get("p50_e2el_ms"),
            e2el_p90_ms=res.get("p90_e2el_ms"), e2el_p99_ms=res.get("p99_e2el_ms"),
            total_input_tokens=res.get("total_input_tokens"),
            prefix_queries_tokens=inputs, prefix_hits_tokens=cached,
            hit_rate=(cached / inputs) if inputs > 0 else None,
            hit_rate_source="frontend usage.cached_tokens / input tokens (the mocker exports no vllm: counters)",
            router_cpu_s=cpu_router, sim_cpu_s=cpu_sim,
            router_cpu_ms_per_req=cpu_router * 1000 / completed, sim_cpu_ms_per_req=cpu_sim * 1000 / completed,
            total_cpu_ms_per_req=(cpu_router + cpu_sim) * 1000 / completed,
            router_idle_cores=((snap["cpu_router"] - cpu_r_ready) / (snap["t"] - t_ready)) if snap.get("t", t_ready) - t_ready > 1 else None,
            router_rss_idle_mib=rss_idle, router_rss_peak_mib=max(peak["rss"], P.tree_rss_mib(frontend.pid)),
            router_vmhwm_mib=P.tree_hwm_mib(frontend.pid),
            client_wall_s=wall, measured_window_s=t_end - snap.get("t", t_end),
            client_cpu_ms_per_req=(res.get("_client_cpu_s", 0.0) - snap.get("client_cpu", 0.0)) * 1000 / completed,
            machine_cpu_busy=(m_busy - snap["machine"][0]) / max(1, m_total - snap["machine"][1]),
            other_cpu_cores=((m_busy - snap["machine"][0]) / P.CLK_TCK - cpu_router - cpu_sim
                             - (res.get("_client_cpu_s", 0.0) - snap.get("client_cpu", 0.0))) / max(1e-9, t_end - snap["t"]),
            ttft_cdf_ms=[round(x, 3) for x in P.quantiles(ttfts)],
        )
        return 0
    except P.BenchError as e:
        rec.update(status="error", reason=str(e))
        return 0
    finally:
        for p in (frontend, mocker):
            if p is not None:
                p.stop()
        (workdir / "record.json").write_text(json.dumps(P.sanitize(rec), default=str))


if __name__ == "__main__":
    sys.exit(main())
