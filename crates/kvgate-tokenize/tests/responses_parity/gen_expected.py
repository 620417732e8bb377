#!/usr/bin/env python3
"""Parity fixtures for OpenAI Responses requests, computed by vLLM 0.33.0 itself.

Each case below is a `POST /v1/responses` body without `previous_response_id`.
This script runs it through vLLM's own code as its API server does
(`vllm/entrypoints/openai/responses/`): the pydantic request model
(`ResponsesRequest`), then `OnlineRenderer.render_responses`, which builds the
chat messages from `instructions` and `input` and the chat tools from the
function tools, and renders them with the chat renderer. It writes, next to
itself, corpus.jsonl (`{"id", "request"}`) and expected-<family>.jsonl
(`{"id", "ids"}` or `{"id", "error"}`). `tests/responses_parity.rs` checks
kvgate against them. With `--show ID[,ID...]` it prints the chat messages, tools and
template kwargs vLLM built for one case instead (to debug a mismatch).

The renderer is the one tests/messages_parity/gen_expected.py builds (the
family's tool parser, auto tool choice on).

Needs a Python with vllm==0.33.0 installed (the bench venv has one) and the
tokenizers (scripts/fetch-tokenizers.sh):

    .cache/bench/venv/bin/python crates/kvgate-tokenize/tests/responses_parity/gen_expected.py
"""
import argparse
import asyncio
import importlib.util
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[4]
HERE = Path(__file__).resolve().parent

Q = "What's the weather in Oslo?"
WEATHER = {
    "type": "function", "name": "get_weather", "description": "Current weather for a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    "strict": True,
}
CLOCK = {"type": "function", "name": "get_time", "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}}}
CALL = {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}
CALL_FULL = {**CALL, "id": "fc_1", "status": "completed"}
OUTPUT = {"type": "function_call_output", "call_id": "call_1", "output": "4 °C, light rain"}


def user(content, **kw):
    return {"role": "user", "content": content, **kw}


def msg(role, content, **kw):
    return {"type": "message", "role": role, "content": content, **kw}


def text(t, kind="input_text"):
    return {"type": kind, "text": t}


def out_msg(t, **kw):
    return {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
            "content": [{"type": "output_text", "text": t, "annotations": []}], **kw}


def R(input, **kw):
    return {"model": "m", "input": input, **kw}


cases = {
    "string": R("Hello!"),
    "string_instructions": R(Q, instructions="You are a terse assistant."),
    "instructions_empty": R(Q, instructions=""),
    "easy_message": R([user(Q)]),
    "typed_message_parts": R([msg("user", [text("First."), text("Second.")])]),
    "typed_message_one_part": R([msg("user", [text("Only.")])]),
    "system_item": R([{"role": "system", "content": "Be brief."}, user(Q)]),
    "developer_item": R([{"role": "developer", "content": "Follow the rules."}, user(Q)]),
    "developer_and_instructions": R([msg("developer", [text("Rules.")]), user(Q)], instructions="Top."),
    "multi_turn_easy": R([user("Hi"), {"role": "assistant", "content": "Hello! How can I help?"},
                          user("Name three rivers."), {"role": "assistant", "content": "Nile, Amazon, Danube."},
                          user("Longest?")], instructions="Be brief."),
    "multi_turn_output_items": R([user("Hi"), out_msg("Hello there."), user("And now?")]),
    "assistant_parts_first_only": R([user("Hi"), msg("assistant", [text("One.", "output_text"), text("Two.", "output_text")]),
                                     user("go on")]),
    "assistant_partial_continue": R([user(Q), out_msg("The weather is", status="in_progress")]),
    "assistant_incomplete_dict": R([user(Q), {"type": "message", "role": "assistant", "status": "incomplete",
                                              "content": [text("It is", "output_text")]}]),
    "tools": R(Q, tools=[WEATHER]),
    "tools_two_no_description": R(Q, tools=[WEATHER, CLOCK]),
    "tools_empty": R(Q, tools=[]),
    "tool_choice_none": R(Q, tools=[WEATHER], tool_choice="none"),
    "tool_choice_required": R(Q, tools=[WEATHER], tool_choice="required"),
    "tool_choice_named": R(Q, tools=[WEATHER, CLOCK], tool_choice={"type": "function", "name": "get_time"}),
    "tool_loop": R([user(Q), CALL, OUTPUT], tools=[WEATHER]),
    "tool_loop_full_items": R([user(Q), CALL_FULL, {**OUTPUT, "id": "fco_1", "status": "completed"}], tools=[WEATHER]),
    "tool_loop_text_then_call": R([user(Q), out_msg("Let me check."), CALL, OUTPUT], tools=[WEATHER]),
    "tool_parallel": R([user(Q), CALL, {**CALL, "call_id": "call_2", "name": "get_time", "arguments": "{\"tz\": \"Europe/Oslo\"}"},
                        OUTPUT, {**OUTPUT, "call_id": "call_2", "output": "12:00"}], tools=[WEATHER, CLOCK]),
    "tool_then_answer": R([user(Q), CALL, OUTPUT, out_msg("It is 4 °C and raining."), user("Thanks!")], tools=[WEATHER]),
    "tool_output_parts": R([user(Q), CALL, {**OUTPUT, "output": [text("4 °C"), text("rain")]}], tools=[WEATHER]),
    "tool_args_nested": R([user(Q), {**CALL, "arguments": "{\"city\": \"Oslo\", \"opts\": {\"units\": [\"C\", 1, 2.5, null, true]}}"},
                           OUTPUT], tools=[WEATHER]),
    "reasoning_item": R([user(Q), {"type": "reasoning", "id": "rs_1", "summary": [],
                                    "content": [{"type": "reasoning_text", "text": "The user wants weather."}]},
                         out_msg("Rainy."), user("Thanks")]),
    "reasoning_summary": R([user(Q), {"type": "reasoning", "id": "rs_1",
                                       "summary": [{"type": "summary_text", "text": "Weather question."}]},
                            CALL, OUTPUT], tools=[WEATHER]),
    "reasoning_effort_low": R(Q, reasoning={"effort": "low"}),
    "reasoning_effort_none": R(Q, reasoning={"effort": "none"}),
    "kwargs_no_thinking": R(Q, chat_template_kwargs={"enable_thinking": False}),
    "sampling_fields": R(Q, temperature=0.2, top_p=0.9, max_output_tokens=64, stream=True, store=True,
                         metadata={"k": "v"}, user="u1", cache_salt="salt", truncation="auto"),
    "unicode": R("Grüße 👋🏽 — 你好, мир! \u200b\ttab\r\nCRLF"),
    "tool_after_system": R([{"role": "system", "content": "Sys."}, user(Q), CALL, OUTPUT], tools=[WEATHER],
                           instructions="Inst."),
    "text_format": R(Q, text={"format": {"type": "json_object"}}),
    "non_function_tool_ignored": R(Q, tools=[WEATHER, {"type": "web_search_preview"}]),
    "user_empty_string": R([user(""), user(Q)]),
    # vLLM refuses these; kvgate must too.
    "err_no_input": {"model": "m"},
    "err_unknown_item": R([user(Q), {"type": "item_reference", "id": "msg_0"}]),
    "err_bad_role_item": R([{"role": "robot", "content": "beep"}]),
    "err_input_number": R(42),
    "err_encrypted_reasoning": R([user(Q), {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "xyz"}]),
    "err_previous_both": R(Q, previous_response_id="resp_1", previous_input_messages=[{"role": "user", "content": "x"}]),
}

# Refused by kvgate only: vLLM renders these, kvgate cannot compute their
# tokens (no multimodal pool), so the ids are not compared.
UNSUPPORTED = {
    "unsupported_image": R([msg("user", [text("What is this?"),
                                         {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo="}])]),
    "unsupported_file": R([msg("user", [{"type": "input_file", "file_id": "file_1"}])]),
}


async def render(online, body):
    from vllm.entrypoints.openai.responses.protocol import ResponsesRequest
    from vllm.entrypoints.serve.engine.protocol import ErrorResponse

    request = ResponsesRequest.model_validate(json.loads(json.dumps(body)))
    if request.previous_input_messages and request.previous_response_id:
        # _validate_create_responses_input, before rendering.
        return "ErrorResponse: Only one of `previous_input_messages` and `previous_response_id` can be set."
    result = await online.render_responses(request)
    if isinstance(result, ErrorResponse):
        return f"ErrorResponse: {result.error.message}"
    return result


async def run_case(online, body):
    try:
        result = await render(online, body)
    except Exception as e:  # what the API server turns into an error response
        return {"error": f"{type(e).__name__}: {e}".split("\n")[0]}
    if isinstance(result, str):
        return {"error": result}
    return {"ids": list(result.engine_input["prompt_token_ids"])}


def build_online(model_dir, family):
    """The renderer exactly as the Messages fixtures build it (one definition)."""
    spec = importlib.util.spec_from_file_location("messages_gen", str(HERE.parent / "messages_parity/gen_expected.py"))
    messages_gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(messages_gen)
    return messages_gen.build_online(None, model_dir, family)


def model_dir(vc, family):
    tmp = tempfile.mkdtemp(prefix=f"kvgate-responses-{family}-")
    for f in (REPO / ".cache/tokenizers" / family).iterdir():
        if f.is_file():
            shutil.copy(f, tmp)
    (Path(tmp) / "config.json").write_text(json.dumps(vc.CONFIGS[family]))
    return tmp


def show(vc, case_ids):
    tmp = model_dir(vc, "qwen3")
    online = build_online(tmp, "qwen3")
    for case_id in case_ids.split(","):
        print(f"== {case_id}")
        show_one(online, case_id)
    shutil.rmtree(tmp)


def show_one(online, case_id):
    from vllm.entrypoints.openai.responses.protocol import ResponsesRequest
    from vllm.entrypoints.openai.responses.utils import construct_input_messages, construct_tool_dicts

    body = {**cases, **UNSUPPORTED}[case_id]
    request = ResponsesRequest.model_validate(json.loads(json.dumps(body)))
    messages = construct_input_messages(request_instructions=request.instructions, request_input=request.input)
    print(json.dumps(messages, default=repr, ensure_ascii=False, indent=1))
    print(json.dumps(construct_tool_dicts(request.tools, request.tool_choice), ensure_ascii=False))
    print(request.build_chat_params(None, "auto").chat_template_kwargs)
    result = asyncio.run(run_case(online, body))
    if "ids" in result:
        print(online.renderer.tokenizer.decode(result["ids"]))
    else:
        print(result)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--show")
    args = ap.parse_args()
    spec = importlib.util.spec_from_file_location("vc", str(REPO / "tests/py/parity/vllm_crosscheck.py"))
    vc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(vc)
    logging.disable(logging.WARNING)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.show:
        show(vc, args.show)
        return
    with open(HERE / "corpus.jsonl", "w", encoding="utf-8") as f:
        for k, v in cases.items():
            f.write(json.dumps({"id": k, "request": v}, ensure_ascii=False) + "\n")
        for k, v in UNSUPPORTED.items():
            f.write(json.dumps({"id": k, "request": v, "unsupported": True}, ensure_ascii=False) + "\n")
    for family in ["qwen3", "llama3_1"]:
        tmp = model_dir(vc, family)
        online = build_online(tmp, family)
        n_err = 0
        with open(HERE / f"expected-{family}.jsonl", "w", encoding="utf-8") as out:
            for k, v in cases.items():
                got = asyncio.run(run_case(online, v))
                if "error" in got:
                    n_err += 1
                    got["error"] = got["error"].replace(tmp, "<model dir>")
                out.write(json.dumps({"id": k, **got}, ensure_ascii=False) + "\n")
        shutil.rmtree(tmp)
        print(f"{family}: {len(cases)} requests, {n_err} errors")


if __name__ == "__main__":
    main()
