#!/usr/bin/env python3
"""The official `openai` SDK's Responses API through kvgate, checked.

Runs, through one or more kvgate base URLs taken in turn (as a round-robin
balancer would): a `previous_response_id` chain of --turns turns, a streamed
turn that continues it, a retrieval by id through another instance, a
function-call round trip, and a forged id (which must be refused). With
--engine URL (repeatable) it also reads each engine's
`vllm:request_success_total` before and after the chain, and checks that all
of the chain ran on one engine: the owner of the conversation.

Needs a Python with `openai` (the bench venv has one, with vLLM):

    .cache/bench/venv/bin/python tests/py/sdk/responses_sdk.py \\
        --base http://127.0.0.1:8000 [--base http://127.0.0.1:8002] [--engine URL ...]

Exit status 0 when every check holds; the first failed check is printed.
"""
import argparse
import re
import sys
import urllib.request

from openai import NotFoundError, BadRequestError, OpenAI

MODEL = "Qwen/Qwen3-0.6B"


def finished(engine):
    """Requests the engine finished (every finish reason)."""
    text = urllib.request.urlopen(f"{engine}/metrics", timeout=10).read().decode()
    total = 0.0
    for line in text.splitlines():
        if re.match(r"vllm:request_success_total[{ ]", line):
            total += float(line.rsplit(" ", 1)[1])
    return total


def check(ok, what):
    if not ok:
        print(f"FAILED: {what}")
        sys.exit(1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", action="append", required=True, help="a kvgate base URL (repeatable)")
    ap.add_argument("--engine", action="append", default=[], help="an engine's URL (repeatable)")
    ap.add_argument("--turns", type=int, default=20)
    ap.add_argument("--api-key", default="unused")
    args = ap.parse_args()
    clients = [OpenAI(base_url=f"{b}/v1", api_key=args.api_key, max_retries=0) for b in args.base]

    before = [finished(e) for e in args.engine]
    previous = None
    ids = []
    for turn in range(args.turns):
        client = clients[turn % len(clients)]
        r = client.responses.create(
            model=MODEL, instructions="You are a terse assistant. " * 20,
            input=f"Step {turn}: what next?", max_output_tokens=4,
            previous_response_id=previous,
        )
        check(r.previous_response_id == previous, f"turn {turn} echoes its previous_response_id")
        check(r.id not in ids, f"turn {turn} has a new id")
        ids.append(r.id)
        previous = r.id
    if args.engine:
        ran = [finished(e) - b for e, b in zip(args.engine, before)]
        check(sorted(ran)[-1] == args.turns and sum(ran) == args.turns,
              f"all {args.turns} turns ran on one engine: {ran}")
    print(f"chain: {args.turns} turns through {len(clients)} instance(s), all served")

    other = clients[-1]
    with other.responses.stream(model=MODEL, input="Stream it.", max_output_tokens=3,
                                previous_response_id=previous) as s:
        names = [e.type for e in s]
    check(names[0] == "response.created", f"a stream starts with response.created: {names[:2]}")
    check(names[-1] in ("response.completed", "response.incomplete"), f"and ends: {names[-1]}")
    check(names.count("response.output_text.delta") >= 1, "a stream has text deltas")
    print(f"stream: {len(names)} events, {names.count('response.output_text.delta')} deltas")

    got = clients[0].responses.retrieve(ids[-1])
    check(got.id == ids[-1], "retrieval by id through the first instance")
    print(f"retrieve: {got.status}")

    tools = [{"type": "function", "name": "get_weather", "description": "Weather for a city",
              "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}]
    r = other.responses.create(model=MODEL, tools=tools, tool_choice="none", max_output_tokens=4, input=[
        {"role": "user", "content": "Weather in Oslo?"},
        {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city": "Oslo"}'},
        {"type": "function_call_output", "call_id": "c1", "output": "4 C, rain"},
    ])
    check(r.status in ("completed", "incomplete"), f"a function-call round trip: {r.status}")
    print("tools: served")

    forged = ids[-1][:-4] + ("AAAA" if not ids[-1].endswith("AAAA") else "BBBB")
    try:
        clients[0].responses.retrieve(forged)
        check(False, "a forged id is refused")
    except NotFoundError:
        pass
    try:
        clients[0].responses.create(model=MODEL, input="x", previous_response_id=forged)
        check(False, "a forged previous_response_id is refused")
    except BadRequestError:
        pass
    print("forged ids: refused")
    print("ok")


if __name__ == "__main__":
    main()
