#!/usr/bin/env python3
"""Parity fixtures for Anthropic Messages requests, computed by vLLM 0.33.0 itself.

Each case below is an Anthropic `/v1/messages` or `/v1/messages/count_tokens`
body. This script runs it through vLLM's own code, exactly as its API server
does (`vllm/entrypoints/anthropic/`): the pydantic request model
(`AnthropicMessagesRequest` / `AnthropicCountTokensRequest`), the start-up
probes (`AnthropicServingMessages._should_merge_inline_system`,
`DisabledThinkingEffortResolver`), the conversion
(`AnthropicServingMessages.to_chat_completion_request`) and the chat renderer
(`OnlineRenderer.render_chat`, which `create_chat_completion` and
`count_tokens` both call). It writes, next to itself, corpus.jsonl
(`{"id", "endpoint", "request"}`) and expected-<family>.jsonl (`{"id", "ids"}`
or `{"id", "error"}`). `tests/messages_parity.rs` checks kvgate against them.

The renderer is built as tests/py/parity/vllm_crosscheck.py builds it, with
`--enable-auto-tool-choice` and the family's tool parser (hermes for Qwen3,
pythonic for the short Llama 3 template, whose tokenizer lacks
the `<|python_tag|>` token llama3_json needs), since a Messages request with tools asks for
`tool_choice: "auto"`, which vLLM refuses without them.

Needs a Python with vllm==0.33.0 installed (the bench venv has one) and the
tokenizers (scripts/fetch-tokenizers.sh):

    .cache/bench/venv/bin/python crates/kvgate-tokenize/tests/messages_parity/gen_expected.py
"""
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
TOOL_PARSERS = {"qwen3": "hermes", "llama3_1": "pythonic"}

U = {"role": "user", "content": "What's the weather in Oslo?"}
WEATHER = {
    "name": "get_weather",
    "description": "Current weather for a city.",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
CLOCK = {"name": "get_time", "input_schema": {"properties": {"tz": {"type": "string"}}}}
CALL = {"type": "tool_use", "id": "toolu_01", "name": "get_weather", "input": {"city": "Oslo"}}
RESULT = {"type": "tool_result", "tool_use_id": "toolu_01", "content": "4 °C, light rain"}


def M(*messages, **kw):
    return {"model": "m", "max_tokens": 256, "messages": list(messages), **kw}


def C(*messages, **kw):
    return {"model": "m", "messages": list(messages), **kw}


cases = {
    "basic": M({"role": "user", "content": "Hello!"}),
    "system_string": M(U, system="You are a terse assistant."),
    "system_blocks": M(U, system=[
        {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1; cch=ab12"},
        {"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}},
        {"type": "text", "text": "\nWork in /repo."},
    ]),
    "system_string_billing": M(U, system="x-anthropic-billing-header: a=1\nKeep this line."),
    "system_empty": M(U, system=""),
    "system_empty_blocks": M(U, system=[]),
    "multi_turn": M(
        {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "Name three rivers."}, {"role": "assistant", "content": "Nile, Amazon, Danube."},
        {"role": "user", "content": "Longest?"}, system="Be brief."),
    "assistant_text_blocks": M(U, {"role": "assistant", "content": [
        {"type": "text", "text": "Part one."}, {"type": "text", "text": "Part two."}]}, {"role": "user", "content": "go on"}),
    "user_text_blocks": M({"role": "user", "content": [
        {"type": "text", "text": "First."}, {"type": "text", "text": ""}, {"type": "text", "text": "Second."}]}),
    "user_one_text_block": M({"role": "user", "content": [{"type": "text", "text": "Only.", "cache_control": {"type": "ephemeral"}}]}),
    "tools": M(U, tools=[WEATHER]),
    "tools_no_type_and_strict": M(U, tools=[CLOCK, {**WEATHER, "strict": True, "defer_loading": True}]),
    "tools_empty_list": M(U, tools=[]),
    "tool_loop": M(U, {"role": "assistant", "content": [{"type": "text", "text": "Let me check."}, CALL]},
                   {"role": "user", "content": [RESULT]}, tools=[WEATHER]),
    "tool_loop_result_blocks": M(U, {"role": "assistant", "content": [CALL]}, {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_01", "is_error": True,
         "content": [{"type": "text", "text": "timeout"}, {"type": "text", "text": "retry later"}]},
        {"type": "text", "text": "Try again please."}]}, tools=[WEATHER]),
    "tool_parallel": M(U, {"role": "assistant", "content": [
        CALL, {"type": "tool_use", "id": "toolu_02", "name": "get_time", "input": {"tz": "Europe/Oslo", "n": [1, 2.5, None, True]}}]},
        {"role": "user", "content": [RESULT, {"type": "tool_result", "tool_use_id": "toolu_02", "content": "12:00"}]},
        tools=[WEATHER, CLOCK]),
    "tool_use_no_input": M(U, {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_03", "name": "get_time"}]},
                           {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_03"}]}, tools=[CLOCK]),
    "tool_result_reference": M(U, {"role": "assistant", "content": [CALL]}, {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_01", "content": [
            {"type": "text", "text": "see tool"}, {"type": "tool_reference", "tool_name": "get_time"}]}]},
        tools=[WEATHER, CLOCK]),
    "tool_choice_auto": M(U, tools=[WEATHER], tool_choice={"type": "auto"}),
    "tool_choice_any": M(U, tools=[WEATHER], tool_choice={"type": "any", "disable_parallel_tool_use": True}),
    "tool_choice_tool": M(U, tools=[WEATHER, CLOCK], tool_choice={"type": "tool", "name": "get_time"}),
    "tool_choice_none": M(U, tools=[WEATHER], tool_choice={"type": "none"}),
    "thinking_history": M(U, {"role": "assistant", "content": [
        {"type": "thinking", "thinking": "The user wants weather.", "signature": "sig"},
        {"type": "redacted_thinking", "data": "b64"}, {"type": "text", "text": "It is raining."}]},
        {"role": "user", "content": "Thanks!"}),
    "thinking_disabled": M(U, thinking={"type": "disabled"}),
    "thinking_enabled": M(U, max_tokens=4096, thinking={"type": "enabled", "budget_tokens": 2048}),
    "thinking_adaptive_effort": M(U, thinking={"type": "adaptive"}, output_config={"effort": "low"}),
    "effort_max": M(U, output_config={"effort": "max"}),
    "kwargs_no_thinking": M(U, chat_template_kwargs={"enable_thinking": False}),
    "inline_system": M({"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                       {"role": "system", "content": "<system-reminder>Todo list is empty.</system-reminder>"},
                       {"role": "user", "content": "c"}, system="Top."),
    "inline_system_blocks_billing": M({"role": "system", "content": [
        {"type": "text", "text": "x-anthropic-billing-header: z"}, {"type": "text", "text": "Rules."}]}, U),
    "inline_system_empty": M({"role": "system", "content": ""}, U),
    "assistant_tool_result": M(U, {"role": "assistant", "content": [
        {"type": "tool_result", "tool_use_id": "t", "content": "42"}, {"type": "text", "text": "so 42"}]},
        {"role": "user", "content": "ok"}),
    "assistant_tool_result_list": M(U, {"role": "assistant", "content": [
        {"type": "tool_result", "tool_use_id": "t", "content": [{"type": "text", "text": "it's \"x\""}]}]},
        {"role": "user", "content": "ok"}),
    "empty_user_blocks": M(U, {"role": "assistant", "content": "Sure."}, {"role": "user", "content": []},
                           {"role": "user", "content": "again"}),
    "assistant_last": M(U, {"role": "assistant", "content": "The weather is"}),
    "tool_changes": M({"role": "system", "content": [
        {"type": "tool_addition", "tool": {"type": "tool_reference", "name": "get_time"}},
        {"type": "tool_removal", "tool": {"type": "tool_reference", "name": "get_weather"}},
        {"type": "tool_addition", "tool": {"type": "tool_definition", "definition": {
            "name": "search", "description": "Web search", "input_schema": {"properties": {"q": {"type": "string"}}}}}}]},
        U, tools=[WEATHER, {**CLOCK, "defer_loading": True}]),
    "sampling_fields": M(U, stop_sequences=["\n\n"], temperature=0.2, top_p=0.9, top_k=20,
                         metadata={"user_id": "u1"}, stream=True, cache_salt="salt"),
    "unicode": M({"role": "user", "content": "Grüße 👋🏽 — 你好, мир! \u200b\ttab\r\nCRLF"}),
    "count_basic": C({"role": "user", "content": "Hello!"}),
    "count_tools_system": C(U, {"role": "assistant", "content": [CALL]}, {"role": "user", "content": [RESULT]},
                            system=[{"type": "text", "text": "Sys."}], tools=[WEATHER], tool_choice={"type": "any"}),
    "count_thinking_disabled": C(U, thinking={"type": "disabled"}),
    # vLLM refuses these; kvgate must too.
    "err_no_max_tokens": C(U),
    "err_unknown_block": M({"role": "user", "content": [{"type": "document", "source": {"type": "text", "data": "x"}}]}),
    "err_developer_role": M({"role": "developer", "content": "x"}),
    "err_tool_change_in_user": M({"role": "user", "content": [
        {"type": "tool_addition", "tool": {"type": "tool_reference", "name": "get_weather"}}]}, tools=[WEATHER]),
    "err_tool_change_undeclared": M({"role": "system", "content": [
        {"type": "tool_addition", "tool": {"type": "tool_reference", "name": "nope"}}]}, U),
    "err_budget_over_max": M(U, max_tokens=1024, thinking={"type": "enabled", "budget_tokens": 2048}),
    "err_tool_without_schema": M(U, tools=[{"type": "web_search_20250305", "name": "web_search"}]),
    "err_no_messages": M(),
    "err_image": M({"role": "user", "content": [
        {"type": "text", "text": "What is this?"},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}]}),
}


async def run_case(online, merge, endpoint, body):
    from pydantic import ValidationError

    from vllm.entrypoints.anthropic.protocol import AnthropicCountTokensRequest, AnthropicMessagesRequest
    from vllm.entrypoints.anthropic.serving import AnthropicServingMessages, DisabledThinkingEffortResolver
    from vllm.entrypoints.serve.engine.protocol import ErrorResponse

    model = AnthropicMessagesRequest if endpoint == "messages" else AnthropicCountTokensRequest
    try:
        request = model.model_validate(json.loads(json.dumps(body)))
        effort = await DisabledThinkingEffortResolver(online).resolve_for(request)
        chat = AnthropicServingMessages.to_chat_completion_request(
            request, merge_inline_system=merge, disabled_thinking_effort=effort)
        result = await online.render_chat(chat)
    except (ValidationError, ValueError, TypeError) as e:
        return {"error": f"{type(e).__name__}: {e}".split("\n")[0]}
    except Exception as e:  # what the API server turns into an error response
        return {"error": f"{type(e).__name__}: {e}".split("\n")[0]}
    if isinstance(result, ErrorResponse):
        return {"error": f"ErrorResponse: {result.error.message}"}
    _, engine_inputs = result
    return {"ids": [i for e in engine_inputs for i in e["prompt_token_ids"]]}


def build_online(vc, model_dir, family):
    from vllm.config import DeviceConfig, ModelConfig, VllmConfig
    from vllm.renderers.hf import HfRenderer
    from vllm.renderers.online_renderer import OnlineRenderer
    from vllm.tokenizers import get_tokenizer

    model_config = ModelConfig(model=model_dir, tokenizer=model_dir, dtype="float32")
    vllm_config = VllmConfig(model_config=model_config, device_config=DeviceConfig(device="cpu"))
    renderer = HfRenderer(vllm_config, get_tokenizer(model_dir))
    return OnlineRenderer(
        model_config, renderer, request_logger=None, chat_template=None,
        chat_template_content_format="auto", enable_auto_tools=True,
        tool_parser=TOOL_PARSERS[family])


def main():
    spec = importlib.util.spec_from_file_location("vc", str(REPO / "tests/py/parity/vllm_crosscheck.py"))
    vc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(vc)
    logging.disable(logging.WARNING)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from vllm.entrypoints.anthropic.serving import AnthropicServingMessages

    with open(HERE / "corpus.jsonl", "w", encoding="utf-8") as f:
        for k, v in cases.items():
            endpoint = "count_tokens" if k.startswith("count_") else "messages"
            f.write(json.dumps({"id": k, "endpoint": endpoint, "request": v}, ensure_ascii=False) + "\n")
    for family in ["qwen3", "llama3_1"]:
        tmp = tempfile.mkdtemp(prefix=f"kvgate-messages-{family}-")
        for f in (REPO / ".cache/tokenizers" / family).iterdir():
            if f.is_file():
                shutil.copy(f, tmp)
        (Path(tmp) / "config.json").write_text(json.dumps(vc.CONFIGS[family]))
        online = build_online(vc, tmp, family)
        merge = AnthropicServingMessages._should_merge_inline_system(online)
        n_err = 0
        with open(HERE / f"expected-{family}.jsonl", "w", encoding="utf-8") as out:
            for k, v in cases.items():
                endpoint = "count_tokens" if k.startswith("count_") else "messages"
                got = asyncio.run(run_case(online, merge, endpoint, v))
                if "error" in got:
                    n_err += 1
                    got["error"] = got["error"].replace(tmp, "<model dir>")
                out.write(json.dumps({"id": k, **got}, ensure_ascii=False) + "\n")
        shutil.rmtree(tmp)
        print(f"{family}: {len(cases)} requests, {n_err} errors, merge_inline_system={merge}")


if __name__ == "__main__":
    main()
