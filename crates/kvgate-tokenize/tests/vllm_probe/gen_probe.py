#!/usr/bin/env python3
"""Edge-case fixtures for kvgate-tokenize, computed by vLLM 0.33.0 itself.

Each request below probes one rule of vLLM's request validation and chat
preprocessing (pydantic's message union, tool-call parsing, developer ->
system, kwargs merging and filtering, continue_final_message, ...). This
script runs them through vLLM's real POST /tokenize code path (the serving
objects built by tests/py/parity/vllm_crosscheck.py) and writes, next to
itself, corpus.jsonl and expected-<family>.jsonl ({"id", "ids"} or
{"id", "error"}). `tests/parity.rs` checks kvgate against them.

Needs the vLLM environment (see vllm_crosscheck.py) and the tokenizers:

    scripts/fetch-tokenizers.sh
    .cache/vllm-venv/bin/python crates/kvgate-tokenize/tests/vllm_probe/gen_probe.py
"""
import json, sys, asyncio, importlib.util, logging, os, shutil, tempfile
from pathlib import Path
T = lambda **kw: kw
CALL = lambda args, **kw: {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": args}, **kw}
U = {"role": "user", "content": "Weather?"}
TOOL = {"type": "function", "function": {"name": "get_weather", "description": "Weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
cases = {
 "dev_only": {"messages": [{"role": "developer", "content": "Be terse."}, U]},
 "dev_tools": {"messages": [{"role": "developer", "content": "Use tools.", "tools": [TOOL]}, U]},
 "sys_late": {"messages": [U, {"role": "assistant", "content": "ok"}, {"role": "system", "content": "late"}, U]},
 "dev_late_sys_first": {"messages": [{"role": "system", "content": "S1"}, U, {"role": "developer", "content": "D"}, {"role": "system", "content": ""}, U]},
 "parts_extra": {"messages": [{"role": "user", "content": [{"type": "text", "text": "a", "cache_control": {"type": "ephemeral"}}, {"type": "text", "text": "b"}]}]},
 "name_null": {"messages": [{"role": "user", "content": "x", "name": None}]},
 "name_num": {"messages": [{"role": "user", "content": "x", "name": 3}]},
 "call_no_id": {"messages": [U, {"role": "assistant", "content": None, "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{}"}}]}]},
 "call_dict_args": {"messages": [U, {"role": "assistant", "content": None, "tool_calls": [CALL({"city": "x"})]}]},
 "call_null_args": {"messages": [U, {"role": "assistant", "content": None, "tool_calls": [CALL(None)]}]},
 "call_json_null": {"messages": [U, {"role": "assistant", "content": None, "tool_calls": [CALL("null")]}]},
 "call_json_str": {"messages": [U, {"role": "assistant", "content": None, "tool_calls": [CALL("\"s\"")]}]},
 "call_ws_json": {"messages": [U, {"role": "assistant", "content": None, "tool_calls": [CALL("  {\"city\": \"Oslo\", \"n\": 1.50, \"big\": 12345678901234567890}  ")]}]},
 "call_extra_keys": {"messages": [U, {"role": "assistant", "content": "", "tool_calls": [CALL("{}", index=0)]}]},
 "calls_not_list": {"messages": [U, {"role": "assistant", "content": "", "tool_calls": {"a": 1}}]},
 "tool_null_content": {"messages": [U, {"role": "tool", "content": None, "tool_call_id": "c1"}]},
 "tool_no_id": {"messages": [U, {"role": "assistant", "content": None, "tool_calls": [CALL("{}")]}, {"role": "tool", "content": "r"}]},
 "reasoning_num": {"messages": [U, {"role": "assistant", "content": "a", "reasoning": 5}, U]},
 "reasoning_str_no_content": {"messages": [U, {"role": "assistant", "reasoning": "because"}]},
 "asst_thinking_part": {"messages": [U, {"role": "assistant", "content": [{"type": "thinking", "thinking": "hmm"}, {"type": "text", "text": "ans"}]}, U]},
 "user_tool_reference": {"messages": [{"role": "user", "content": [{"type": "text", "text": "see"}, {"type": "tool_reference", "name": "get_weather"}]}]},
 "user_input_text": {"messages": [{"role": "user", "content": [{"type": "input_text", "text": "x"}]}]},
 "critic_string_parts": {"messages": [{"role": "critic", "content": ["a", "b"]}, U]},
 "user_string_parts": {"messages": [{"role": "user", "content": ["a", "b"]}]},
 "kwargs_tools_override": {"messages": [U], "chat_template_kwargs": {"tools": [TOOL]}},
 "kwargs_tools_null": {"messages": [U], "tools": [TOOL], "chat_template_kwargs": {"tools": None}},
 "kwargs_auto": {"messages": [U], "chat_template_kwargs": {"enable_thinking": "auto"}},
 "kwargs_null": {"messages": [U], "chat_template_kwargs": {"enable_thinking": None}},
 "kwargs_tokenize_true": {"messages": [U], "chat_template_kwargs": {"tokenize": True}},
 "kwargs_template_null": {"messages": [U], "chat_template_kwargs": {"chat_template": None}},
 "kwargs_messages": {"messages": [U], "chat_template_kwargs": {"messages": []}},
 "kwargs_conversation": {"messages": [U], "chat_template_kwargs": {"conversation": []}},
 "kwargs_content_var": {"messages": [U, {"role": "assistant", "content": "x"}], "chat_template_kwargs": {"content": "INJECTED", "reasoning_content": "R"}},
 "kwargs_padding": {"messages": [U], "chat_template_kwargs": {"padding": True, "truncation": True, "max_length": 3}},
 "chat_add_special": {"messages": [U], "add_special_tokens": True},
 "tools_extra_strict": {"messages": [U], "tools": [{"type": "function", "x": 1, "function": {"name": "f", "strict": True, "description": None, "y": 2}}]},
 "tools_empty": {"messages": [U], "tools": []},
 "tools_bad_type": {"messages": [U], "tools": [{"type": "custom", "function": {"name": "f"}}]},
 "cont_parts": {"messages": [U, {"role": "assistant", "content": [{"type": "text", "text": "Part one"}, {"type": "text", "text": "two "}]}], "add_generation_prompt": False, "continue_final_message": True},
 "cont_user_last": {"messages": [U], "add_generation_prompt": False, "continue_final_message": True},
 "cont_empty": {"messages": [U, {"role": "assistant", "content": ""}], "add_generation_prompt": False, "continue_final_message": True},
 "role_empty": {"messages": [{"role": "", "content": "x"}, U]},
 "function_role": {"messages": [U, {"role": "function", "name": "f", "content": "out"}, U]},
 "refusal_part": {"messages": [U, {"role": "assistant", "content": [{"type": "refusal", "refusal": "no"}]}, U]},
 "user_thinking_part": {"messages": [{"role": "user", "content": [{"type": "thinking", "thinking": "t"}]}]},
 "line_seps": {"messages": [{"role": "user", "content": "a\u2028b\u2029c\x85d\x0be\x0cf\x1cg"}]},
 "top_extra": {"messages": [U], "foo": [1], "documents": [{"text": "ignored"}]},
 "prompt_no_special": {"prompt": "Hello <|im_start|> world", "add_special_tokens": False},
 "many_systems": {"messages": [{"role": "system", "content": "a"}, {"role": "system", "content": "b"}, U]},
 "dev_with_name": {"messages": [{"role": "developer", "content": "D", "name": "ops"}, U]},
 "sys_parts_billing": {"messages": [{"role": "system", "content": [{"type": "text", "text": "x-anthropic-billing-header: a\nKeep"}, {"type": "text", "text": "x-anthropic-billing-header"}]}, U]},
 "task_field": {"messages": [{"role": "user", "content": "x", "task": "t"}]},
 "tool_parts_nontext": {"messages": [U, {"role": "assistant", "content": None, "tool_calls": [CALL("{}")]}, {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "a"}, {"type": "tool_reference", "name": "n"}]}]},
 "image_part": {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/a.png"}}]}]},
}
REPO = Path(__file__).resolve().parents[4]
root = Path(__file__).resolve().parent
root.mkdir(parents=True, exist_ok=True)
with open(root / "corpus.jsonl", "w") as f:
    for k, v in cases.items(): f.write(json.dumps({"id": k, "request": v}) + "\n")
spec = importlib.util.spec_from_file_location("vc", str(REPO / "tests/py/parity/vllm_crosscheck.py"))
vc = importlib.util.module_from_spec(spec); spec.loader.exec_module(vc)
logging.disable(logging.WARNING); os.environ.setdefault("HF_HUB_OFFLINE", "1")
for family in ["qwen3", "llama3_1"]:
    tmp = tempfile.mkdtemp(prefix=f"kvgate-probe-{family}-")
    for f in ((REPO / ".cache/tokenizers") / family).iterdir():
        if f.is_file(): shutil.copy(f, tmp)
    (Path(tmp) / "config.json").write_text(json.dumps(vc.CONFIGS[family]))
    serving = vc.build_serving(tmp)
    with open(root / f"expected-{family}.jsonl", "w") as out:
        for k, v in cases.items():
            got = asyncio.run(vc.tokenize_one(serving, v))
            if "error" in got:  # no temporary paths in the fixtures
                got["error"] = got["error"].replace(tmp, "<model dir>")
            out.write(json.dumps({"id": k, **got}, ensure_ascii=False) + "\n")
    shutil.rmtree(tmp)
print(f"wrote {root}: {len(cases)} requests x 2 families")
