"""Processes and clients for the real-engine suite (suite.py).

Engines are started with `scripts/real-vllm.sh serve`, the command that
docs/real-vllm.md shows; kvgate is the binary under test. Every process
started here is stopped by `Procs.stop_all`, also on errors.
"""

import http.client
import json
import os
import signal
import subprocess
import threading
import time
from urllib.parse import urlsplit

import msgspec
import zmq

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODEL = "Qwen/Qwen3-0.6B"


class Fail(Exception):
    """A check that did not hold."""


def http_json(url, method="GET", body=None, timeout=120, headers=None):
    """(status, parsed body or text, response headers)."""
    u = urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
    data = None if body is None else json.dumps(body).encode()
    h = {"content-type": "application/json"} if data is not None else {}
    h.update(headers or {})
    path = u.path + (("?" + u.query) if u.query else "")
    conn.request(method, path, body=data, headers=h)
    resp = conn.getresponse()
    raw = resp.read()
    conn.close()
    try:
        parsed = json.loads(raw) if raw else None
    except ValueError:
        parsed = raw.decode(errors="replace")
    return resp.status, parsed, dict(resp.getheaders())


def http_stream(url, body, timeout=120):
    """Streams an SSE answer: (status, list of data payloads, headers)."""
    u = urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
    conn.request("POST", u.path, body=json.dumps(body).encode(),
                 headers={"content-type": "application/json"})
    resp = conn.getresponse()
    events = []
    if resp.status != 200:
        raw = resp.read()
        conn.close()
        return resp.status, [raw.decode(errors="replace")], dict(resp.getheaders())
    for line in resp:
        line = line.strip()
        if line.startswith(b"data:"):
            events.append(line[5:].strip().decode())
    conn.close()
    return resp.status, events, dict(resp.getheaders())


def wait_http(url, timeout, proc=None, what="process"):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc is not None and proc.poll() is not None:
            raise Fail(f"{what} exited with {proc.returncode} during start-up")
        try:
            status, _, _ = http_json(url, timeout=2)
            if status == 200:
                return
        except OSError:
            pass
        time.sleep(0.5)
    raise Fail(f"{what}: {url} not ready after {timeout} s")


class Procs:
    """Every child process, stopped as a group."""

    def __init__(self, log_dir):
        self.log_dir = log_dir
        os.makedirs(log_dir, exist_ok=True)
        self.procs = {}
        self.lock = threading.Lock()

    def start(self, name, argv, env=None):
        log = open(os.path.join(self.log_dir, f"{name}.log"), "ab")
        full_env = dict(os.environ)
        full_env.update(env or {})
        p = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             env=full_env, start_new_session=True, cwd=ROOT)
        with self.lock:
            self.procs[name] = p
        return p

    def stop(self, name, sig=signal.SIGTERM, wait=20):
        with self.lock:
            p = self.procs.pop(name, None)
        if p is None:
            return
        try:
            os.killpg(p.pid, sig)
        except ProcessLookupError:
            return
        try:
            p.wait(wait)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(10)

    def stop_all(self):
        for name in list(self.procs):
            self.stop(name)

    def log_tail(self, name, lines=20):
        try:
            with open(os.path.join(self.log_dir, f"{name}.log"), "rb") as f:
                return b"".join(f.readlines()[-lines:]).decode(errors="replace")
        except OSError:
            return ""


class Engine:
    """One real vLLM engine on loopback: HTTP port, event PUB +1, replay +2."""

    def __init__(self, procs, index, port, cpu):
        self.procs, self.index, self.port, self.cpu = procs, index, port, cpu
        self.name = f"engine-{index}"
        self.url = f"http://127.0.0.1:{port}"
        self.pub = f"tcp://127.0.0.1:{port + 1}"
        self.replay = f"tcp://127.0.0.1:{port + 2}"
        self.proc = None

    def spec(self, block_size=32):
        return f"{self.url},events={self.pub},replay={self.replay},block_size={block_size},name={self.name}"

    def start(self, env=None):
        self.proc = self.procs.start(
            self.name, ["bash", os.path.join(ROOT, "scripts/real-vllm.sh"), "serve", "--port", str(self.port)],
            # The Responses API's store (previous_response_id, GET by id):
            # off by default in vLLM; the suite's engines are short-lived.
            env={"REAL_VLLM_CPU": str(self.cpu), "VLLM_ENABLE_RESPONSES_API_STORE": "1", **(env or {})})

    def healthy(self):
        try:
            return http_json(self.url + "/health", timeout=2)[0] == 200
        except OSError:
            return False

    def wait_ready(self, timeout=300):
        try:
            wait_http(self.url + "/health", timeout, self.proc, self.name)
        except Fail as e:
            raise Fail(f"{e}\n{self.procs.log_tail(self.name)}") from None

    def stop(self, sig=signal.SIGTERM):
        self.procs.stop(self.name, sig)


class Kvgate:
    def __init__(self, procs, binary, name, port, specs, extra=()):
        self.procs, self.binary, self.name, self.port = procs, binary, name, port
        self.specs, self.extra = specs, list(extra)
        self.url = f"http://127.0.0.1:{port}"
        self.admin = f"http://127.0.0.1:{port + 1}"
        self.proc = None

    def start(self, env=None):
        argv = [self.binary, "serve", "--listen", f"127.0.0.1:{self.port}",
                "--admin-listen", f"127.0.0.1:{self.port + 1}", "--served-model-name", MODEL]
        for s in self.specs:
            argv += ["--replica", s]
        self.proc = self.procs.start(self.name, argv + self.extra, env={"RUST_LOG": "info", **(env or {})})

    def wait_ready(self, timeout=120):
        wait_http(self.url + "/ready", timeout, self.proc, self.name)

    def stop(self):
        self.procs.stop(self.name)

    def replicas(self):
        _, body, _ = http_json(self.admin + "/admin/replicas")
        return {r["name"]: r for r in body["replicas"]}

    def blocks(self, name):
        _, body, _ = http_json(f"{self.admin}/admin/replicas/{name}/blocks")
        return set(body["gpu"]), set(body["cpu"])

    def last_decision(self):
        _, body, _ = http_json(self.admin + "/admin/decisions?limit=1")
        return body["decisions"][0] if body["decisions"] else None


class EventRecorder:
    """An independent pyzmq subscriber on one engine's PUB socket: every
    batch's seq, and the GPU block set the events imply. It is the
    reference kvgate's subscriber and view are held to."""

    def __init__(self, endpoint, name):
        self.endpoint, self.name = endpoint, name
        self.seqs = []
        self.replayed_from = 1 << 62
        self.blocks = set()
        self.lock = threading.Lock()
        self.stop_flag = threading.Event()
        self.decoder = msgspec.msgpack.Decoder()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def start(self):
        self.thread.start()

    def _run(self):
        ctx = zmq.Context.instance()
        sock = ctx.socket(zmq.SUB)
        sock.setsockopt(zmq.RCVHWM, 0)
        sock.setsockopt(zmq.SUBSCRIBE, b"")
        sock.connect(self.endpoint)
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        while not self.stop_flag.is_set():
            if not poller.poll(100):
                continue
            frames = sock.recv_multipart()
            seq = int.from_bytes(frames[-2], "big", signed=True)
            with self.lock:
                if self.seqs and seq <= self.seqs[-1]:
                    if seq >= self.replayed_from:
                        continue  # already applied from the start-up replay
                    # The seq went back: a new engine process, a new cache.
                    self.blocks.clear()
                self.seqs.append(seq)
                self._apply(self.decoder.decode(frames[-1]))
        sock.close(0)

    def catch_up(self, replay_endpoint, timeout=10):
        """For an engine that was already running: applies its whole replay
        buffer (vLLM's replay protocol), so the block set starts complete.
        Live batches that the replay already held are skipped."""
        ctx = zmq.Context.instance()
        dealer = ctx.socket(zmq.DEALER)
        dealer.connect(replay_endpoint)
        time.sleep(0.3)  # let the SUB connect first, so nothing falls between
        dealer.send_multipart([b"", (0).to_bytes(8, "big")])
        batches = []
        deadline = time.time() + timeout
        while time.time() < deadline:
            if not dealer.poll(500):
                continue
            frames = dealer.recv_multipart()
            seq = int.from_bytes(frames[-2], "big", signed=True)
            if seq == -1:
                break
            batches.append((seq, frames[-1]))
        dealer.close(0)
        with self.lock:
            live = {s for s in self.seqs}
            self.replayed_from = batches[0][0] if batches else 0
            merged = sorted(set(self.seqs) | {s for s, _ in batches})
            for seq, payload in batches:
                if seq not in live:
                    self._apply(self.decoder.decode(payload))
            self.seqs = merged

    def _apply(self, batch):
        events = batch[1] if isinstance(batch, (list, tuple)) else batch.get("events", [])
        for ev in events:
            if isinstance(ev, dict):
                kind, fields = ev.get("type"), ev
            else:
                kind, fields = ev[0], {"block_hashes": ev[1] if len(ev) > 1 else []}
            if kind == "BlockStored":
                medium = fields.get("medium") or "GPU"
                if medium.upper() == "GPU":
                    self.blocks.update(fold(h) for h in fields["block_hashes"])
            elif kind == "BlockRemoved":
                medium = fields.get("medium") or "GPU"
                if medium.upper() == "GPU":
                    self.blocks.difference_update(fold(h) for h in fields["block_hashes"])
            elif kind == "AllBlocksCleared":
                self.blocks.clear()

    def snapshot(self):
        with self.lock:
            return list(self.seqs), set(self.blocks)

    def gaps(self, since=0):
        """Gaps in the live seqs from index `since` on (a restart is not one)."""
        seqs, _ = self.snapshot()
        seqs = seqs[since:]
        return sum(1 for a, b in zip(seqs, seqs[1:]) if b > a + 1)

    def close(self):
        self.stop_flag.set()
        self.thread.join(2)


def fold(h):
    """kvgate's `BlockHash::fold_u64` for the u64 hashes vLLM publishes."""
    if isinstance(h, int):
        return h & 0xFFFFFFFFFFFFFFFF
    raise Fail(f"a block hash that is not an int ({type(h).__name__}): this suite expects vLLM's u64 hashes")
