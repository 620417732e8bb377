#!/usr/bin/env python3
"""The official `anthropic` SDK's Messages API through kvgate, checked.

Runs, through one or more kvgate base URLs taken in turn: a multi-turn,
tool-calling conversation of --turns turns (each turn sends the whole
history: a tool definition, the assistant's tool_use block and the user's
tool_result, then text turns), whole and streamed (`messages.stream`),
`count_tokens` (which must grow with the history), and a bad request (which
must come back as Anthropic's error). With --engine URL (repeatable) it also
reads each engine's prefix-cache counters and checks that the conversation's
turns after the first were served mostly from cache. With --compare-chat
(engines with `/reset_prefix_cache`, as real vLLM has), it sends the same
conversation again as chat completions from cold caches, and checks that
the Messages conversation got at least as many prefix hits.

Needs a Python with `anthropic` (the test venv has one: scripts/setup-test-env.sh):

    .cache/venv/bin/python tests/py/sdk/messages_sdk.py --base http://127.0.0.1:8000 [--base ...]

Exit status 0 when every check holds; the first failed check is printed.
"""
import argparse
import json
import re
import sys
import urllib.request

import anthropic
import openai

MODEL = "Qwen/Qwen3-0.6B"
SYSTEM = "You are a terse assistant for a weather service. " * 20
TOOLS = [{"name": "get_weather", "description": "Weather for a city",
          "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]


def prefix_counters(engine):
    """(queries, hits) in tokens, from the engine's /metrics."""
    text = urllib.request.urlopen(f"{engine}/metrics", timeout=10).read().decode()
    out = [0.0, 0.0]
    for line in text.splitlines():
        for i, name in enumerate(("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total")):
            if re.match(re.escape(name) + r"[{ ]", line):
                out[i] += float(line.rsplit(" ", 1)[1])
    return out


def reset_caches(engines):
    for e in engines:
        req = urllib.request.Request(f"{e}/reset_prefix_cache", data=b"", method="POST")
        urllib.request.urlopen(req, timeout=30).read()


def as_chat(history):
    """The conversation as chat messages (OpenAI's shapes), turn for turn."""
    out = [{"role": "system", "content": SYSTEM}]
    for m in history:
        if isinstance(m["content"], str):
            out.append({"role": m["role"], "content": m["content"]})
            continue
        for b in m["content"]:
            if b["type"] == "tool_use":
                out.append({"role": "assistant", "content": None, "tool_calls": [{
                    "id": b["id"], "type": "function",
                    "function": {"name": b["name"], "arguments": json.dumps(b["input"])}}]})
            elif b["type"] == "tool_result":
                out.append({"role": "tool", "tool_call_id": b["tool_use_id"], "content": b["content"]})
    return out


CHAT_TOOLS = [{"type": "function", "function": {
    "name": t["name"], "description": t["description"], "parameters": t["input_schema"]}} for t in TOOLS]


def check(ok, what):
    if not ok:
        print(f"FAILED: {what}")
        sys.exit(1)


def text_of(message):
    return "".join(b.text for b in message.content if b.type == "text")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", action="append", required=True, help="a kvgate base URL (repeatable)")
    ap.add_argument("--engine", action="append", default=[], help="an engine's URL (repeatable)")
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--api-key", default="unused")
    ap.add_argument("--compare-chat", action="store_true",
                    help="also send the conversation as chat completions from cold caches and compare hits")
    args = ap.parse_args()
    if args.compare_chat:
        check(args.engine, "--compare-chat needs --engine")
        reset_caches(args.engine)
    clients = [anthropic.Anthropic(base_url=b, api_key=args.api_key, max_retries=0) for b in args.base]

    history = [
        {"role": "user", "content": "What is the weather in Oslo?"},
        {"role": "assistant", "content": [
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Oslo"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "4 C, rain"}]},
    ]
    before = [prefix_counters(e) for e in args.engine]
    counted = []
    first_turn_tokens = None
    for turn in range(args.turns):
        client = clients[turn % len(clients)]
        n = client.messages.count_tokens(model=MODEL, system=SYSTEM, tools=TOOLS, messages=history)
        counted.append(n.input_tokens)
        if turn % 2 == 0:
            m = client.messages.create(model=MODEL, system=SYSTEM, tools=TOOLS, messages=history,
                                       max_tokens=4)
            check(m.role == "assistant" and m.stop_reason in ("end_turn", "max_tokens", "tool_use"),
                  f"turn {turn}: a whole answer ({m.stop_reason})")
            answer = text_of(m)
        else:
            with client.messages.stream(model=MODEL, system=SYSTEM, tools=TOOLS, messages=history,
                                        max_tokens=4) as s:
                events = [e.type for e in s]
                m = s.get_final_message()
            check(events[0] == "message_start" and "content_block_delta" in events,
                  f"turn {turn}: a stream of Anthropic events ({events[:3]}...)")
            answer = text_of(m)
        # Anthropic's input_tokens leaves out the tokens read from the cache
        # and those written to it (vLLM reports both where it knows them).
        u = m.usage
        usage = u.input_tokens + (u.cache_read_input_tokens or 0) + (u.cache_creation_input_tokens or 0)
        check(usage == n.input_tokens, f"turn {turn}: usage {usage} = count_tokens {n.input_tokens}")
        if first_turn_tokens is None:
            first_turn_tokens = usage
        # A fixed reply, so that the chat replay below sends the same text.
        check(answer is not None, f"turn {turn}: an answer")
        history.append({"role": "assistant", "content": f"Noted, step {turn}."})
        history.append({"role": "user", "content": f"And tomorrow, step {turn}?"})
    check(all(a < b for a, b in zip(counted, counted[1:])), f"count_tokens grows with the history: {counted}")
    print(f"conversation: {args.turns} turns through {len(clients)} instance(s), "
          f"{counted[0]} to {counted[-1]} prompt tokens, whole and streamed, tools in the history")

    if args.engine:
        after = [prefix_counters(e) for e in args.engine]
        queries = sum(a[0] - b[0] for a, b in zip(after, before))
        hits = sum(a[1] - b[1] for a, b in zip(after, before))
        later = queries - first_turn_tokens
        check(later > 0 and hits >= 0.5 * later,
              f"turns after the first served from cache: {hits:.0f} hits of {later:.0f} later prompt tokens")
        print(f"engines: {hits:.0f} of {queries:.0f} prompt tokens from cache")
    if args.compare_chat:
        # The same turns as chat completions, from cold caches.
        reset_caches(args.engine)
        before = [prefix_counters(e) for e in args.engine]
        chats = [openai.OpenAI(base_url=f"{b}/v1", api_key=args.api_key, max_retries=0) for b in args.base]
        turns = [history[:3]]
        for t in range(1, args.turns):
            turns.append(history[:3 + 2 * t])
        for t, h in enumerate(turns):
            chats[t % len(chats)].chat.completions.create(model=MODEL, messages=as_chat(h), tools=CHAT_TOOLS,
                                                          max_tokens=4)
        after = [prefix_counters(e) for e in args.engine]
        chat_hits = sum(a[1] - b[1] for a, b in zip(after, before))
        chat_queries = sum(a[0] - b[0] for a, b in zip(after, before))
        print(f"as chat completions: {chat_hits:.0f} of {chat_queries:.0f} prompt tokens from cache")
        check(hits >= chat_hits, f"Messages got at least the chat form's hits: {hits:.0f} against {chat_hits:.0f}")

    try:
        clients[0].messages.create(model=MODEL, max_tokens=4, messages=[
            {"role": "user", "content": [{"type": "image", "source": {
                "type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}]}])
        check(False, "an image without a multimodal pool is refused")
    except anthropic.BadRequestError as e:
        check(e.body and e.body.get("type") == "error", f"in Anthropic's error shape: {e.body}")
    print("refusal: Anthropic's error shape")
    print("ok")


if __name__ == "__main__":
    main()
