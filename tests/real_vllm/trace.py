"""One request, one trace, across code no one here wrote: a client span made
with OpenTelemetry's Python SDK, then `kvgate serve --otlp-endpoint`, then a
real vLLM engine started with `--otlp-traces-endpoint`. All three export to
an OTLP/gRPC receiver built here from OpenTelemetry's own protobuf
definitions (`opentelemetry-proto` and `grpcio`, which vLLM's tracing
installs). The check: the three services' spans share the client's trace id,
kvgate's request span is the client span's child, and the engine's span is a
child of kvgate's `send` span. It prints the trace as a tree with each
span's duration (docs/operators.md quotes one).

Run by scripts/test-real-vllm.sh after suite.py, with the engine's Python.
"""

import argparse
import json
import os
import socket
import sys
import threading
import time
from concurrent import futures

import grpc
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import MODEL, ROOT, Engine, Fail, Kvgate, Procs, http_json  # noqa: E402


class Receiver(trace_service_pb2_grpc.TraceServiceServicer):
    """Every span exported to it, with its service's name."""

    def __init__(self):
        self.spans = []
        self.lock = threading.Lock()

    def Export(self, request, context):  # noqa: N802 (the service's method name)
        with self.lock:
            for rs in request.resource_spans:
                service = next((a.value.string_value for a in rs.resource.attributes
                                if a.key == "service.name"), "?")
                for ss in rs.scope_spans:
                    self.spans.extend((service, s) for s in ss.spans)
        return trace_service_pb2.ExportTraceServiceResponse()

    def snapshot(self):
        with self.lock:
            return list(self.spans)


def free_port(n=1):
    """The first of `n` consecutive free loopback ports."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + n >= 65535:
            continue
        ok = True
        for p in range(base, base + n):
            with socket.socket() as t:
                try:
                    t.bind(("127.0.0.1", p))
                except OSError:
                    ok = False
                    break
        if ok:
            return base
    raise Fail("no free ports")


def tree(spans, trace_id):
    """The trace as indented lines: service, span name, duration."""
    mine = [(svc, s) for svc, s in spans if s.trace_id.hex() == trace_id]
    by_parent = {}
    ids = {s.span_id for _, s in mine}
    for svc, s in mine:
        parent = s.parent_span_id if s.parent_span_id in ids else b""
        by_parent.setdefault(parent, []).append((svc, s))
    lines = []

    def walk(parent, depth):
        for svc, s in sorted(by_parent.get(parent, []), key=lambda x: x[1].start_time_unix_nano):
            ms = (s.end_time_unix_nano - s.start_time_unix_nano) / 1e6
            lines.append(f"{'  ' * depth}{svc}: {s.name} ({ms:.1f} ms)")
            walk(s.span_id, depth + 1)

    walk(b"", 0)
    return lines


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kvgate", required=True)
    ap.add_argument("--log-dir", default=os.path.join(ROOT, ".cache/real-vllm/logs"))
    ap.add_argument("--out", default=os.path.join(ROOT, ".cache/real-vllm/trace.json"))
    args = ap.parse_args()
    procs = Procs(args.log_dir)
    receiver = Receiver()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(receiver, server)
    otlp_port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    otlp = f"http://127.0.0.1:{otlp_port}"
    # Short batch delays: the spans arrive within a second of the request.
    quick = {"OTEL_BSP_SCHEDULE_DELAY": "200", "OTEL_EXPORTER_OTLP_TRACES_INSECURE": "true"}
    try:
        engine = Engine(procs, "trace", free_port(3), 0)
        engine.start(env={"REAL_VLLM_EXTRA_ARGS": f"--otlp-traces-endpoint {otlp}",
                          "OTEL_SERVICE_NAME": "vllm", **quick})
        engine.wait_ready()
        kv = Kvgate(procs, args.kvgate, "trace-kvgate", free_port(2), [engine.spec()],
                    extra=["--otlp-endpoint", otlp, "--otlp-protocol", "grpc"])
        kv.start(env=quick)
        kv.wait_ready()

        provider = TracerProvider(resource=Resource.create({"service.name": "client"}))
        provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=otlp, insecure=True)))
        tracer = provider.get_tracer("kvgate-trace-check")
        body = {"model": MODEL, "messages": [{"role": "user", "content": "One trace from here to the engine."}],
                "max_tokens": 8}
        with tracer.start_as_current_span("client request") as client_span:
            headers = {}
            TraceContextTextMapPropagator().inject(headers)
            status, _, _ = http_json(kv.url + "/v1/chat/completions", "POST", body, headers=headers)
        if status != 200:
            raise Fail(f"the traced request answered {status}")
        trace_id = format(client_span.get_span_context().trace_id, "032x")
        client_id = client_span.get_span_context().span_id.to_bytes(8, "big")

        deadline = time.time() + 30
        while True:
            spans = [(svc, s) for svc, s in receiver.snapshot() if s.trace_id.hex() == trace_id]
            services = {svc for svc, _ in spans}
            names = {s.name for _, s in spans}
            if {"client", "kvgate", "vllm"} <= services and "send" in names:
                break
            if time.time() > deadline:
                raise Fail(f"spans of the client's trace after 30 s: {sorted((v, s.name) for v, s in spans)}; "
                           f"all received: {sorted({(v, s.name) for v, s in receiver.snapshot()})}")
            time.sleep(0.2)
        time.sleep(1.0)  # the stragglers of the same batch
        spans = [(svc, s) for svc, s in receiver.snapshot() if s.trace_id.hex() == trace_id]
        request = next(s for svc, s in spans if svc == "kvgate" and s.name == "request")
        send = next(s for svc, s in spans if svc == "kvgate" and s.name == "send")
        engine_spans = [s for svc, s in spans if svc == "vllm"]
        problems = []
        if request.parent_span_id != client_id:
            problems.append("kvgate's request span is not the client span's child")
        if send.parent_span_id != request.span_id:
            problems.append("kvgate's send span is not its request span's child")
        if not any(s.parent_span_id == send.span_id for s in engine_spans):
            problems.append(f"no engine span is a child of kvgate's send span "
                            f"(engine spans' parents: {[s.parent_span_id.hex() for s in engine_spans]})")
        lines = tree(receiver.snapshot(), trace_id)
        print("trace " + trace_id)
        print("\n".join(lines), flush=True)
        os.makedirs(os.path.dirname(args.out), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump({"trace_id": trace_id, "tree": lines, "problems": problems}, f, indent=1)
        if problems:
            raise Fail("; ".join(problems))
        print("PASS trace: client, kvgate and the engine in one trace; the engine's span under kvgate's send",
              flush=True)
        return 0
    except Fail as e:
        print(f"FAIL trace: {e}", flush=True)
        for name in ("engine-trace", "trace-kvgate"):
            print(f"--- {name}\n{procs.log_tail(name)}", flush=True)
        return 1
    finally:
        procs.stop_all()
        server.stop(0)


if __name__ == "__main__":
    sys.exit(main())
