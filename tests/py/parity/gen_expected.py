#!/usr/bin/env python3
"""Generate kvgate's tokenizer parity fixtures: what vLLM's POST /tokenize returns.

For every request in crates/kvgate-tokenize/tests/parity/corpus.jsonl and every
tokenizer family (qwen3, llama3_1, from .cache/tokenizers/<family>, see
scripts/fetch-tokenizers.sh) this computes the token ids vLLM 0.33.0 would
compute, by applying vLLM's request preprocessing (re-implemented here, see
README.md for the rules and where they live in vLLM) and then Hugging Face
transformers' `apply_chat_template(..., tokenize=False)` and the tokenizer.

Output: crates/kvgate-tokenize/tests/parity/expected-<family>.jsonl, one line
per corpus id, in corpus order:
    {"id": ..., "text": <rendered prompt>, "ids": [...]}      or
    {"id": ..., "error": "<message>"}
(`text` is the chat-template output for chat requests and the prompt itself for
completion requests.)

    python tests/py/parity/gen_expected.py            # (re)write the fixtures
    python tests/py/parity/gen_expected.py --check    # exit 1 and print diffs if they are stale

Run it with the environment made by scripts/setup-test-env.sh (it pins the
transformers/tokenizers/jinja2 versions that vllm==0.33.0 installs).
"""

from __future__ import annotations

import argparse
import copy
import difflib
import inspect
import json
import os
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
PARITY = ROOT / "crates" / "kvgate-tokenize" / "tests" / "parity"
CORPUS = PARITY / "corpus.jsonl"
TOKENIZERS = ROOT / ".cache" / "tokenizers"
FAMILIES = ("qwen3", "llama3_1")

# The versions the fixtures were generated with (= what vllm==0.33.0 installs).
PINNED = {"transformers": "5.20.2", "tokenizers": "0.23.3", "jinja2": "3.1.6"}

# Characters that some JSON-lines readers (Python's str.splitlines, editors)
# treat as line breaks: always written escaped, so one object is one line.
_LINE_BREAKERS = ("\u2028", "\u2029", "\x85", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e")


class RequestError(Exception):
    """A request that vLLM rejects (validation or chat-template error)."""


# --------------------------------------------------------------------------
# Request validation (vllm/entrypoints/serve/tokenize/protocol.py,
# vllm/entrypoints/openai/chat_completion/protocol.py, generate/base/protocol.py)
# --------------------------------------------------------------------------

def normalize_tools(tools: Any) -> list[dict] | None:
    """`tools` as vLLM re-serializes them: `ChatCompletionToolsParam.model_dump()`.

    Field order and presence come from the pydantic models, not from the
    request: {"type", "function": {"name", "description", "parameters"
    [, "strict"][, "defer_loading"]} [, "defer_loading"]}; description and
    parameters default to null; unknown keys are dropped.
    """
    if tools is None:
        return None
    out = []
    for t in tools:
        if not isinstance(t, dict) or not isinstance(t.get("function"), dict):
            raise RequestError("tools: each tool needs a `function` object")
        if t.get("type", "function") != "function":
            raise RequestError("tools: only type 'function' is supported")
        f = t["function"]
        if not isinstance(f.get("name"), str):
            raise RequestError("tools: function.name must be a string")
        defer = t.get("defer_loading")
        fn = {"name": f["name"], "description": f.get("description"), "parameters": f.get("parameters")}
        if f.get("strict") is not None:
            fn["strict"] = f["strict"]
        f_defer = f.get("defer_loading")
        if f_defer is None and defer is not None:
            f_defer = defer
        if f_defer is not None:
            fn["defer_loading"] = f_defer
        tool = {"type": "function", "function": fn}
        if defer is not None:
            tool["defer_loading"] = defer
        out.append(tool)
    return out


# --------------------------------------------------------------------------
# Content-format detection (vllm/renderers/hf.py, _detect_content_format):
# "openai" when the template loops over a message's content items, else "string".
# --------------------------------------------------------------------------

def _is_name(node, name: str) -> bool:
    import jinja2.nodes as n

    if isinstance(node, n.Name):
        return node.ctx == "load" and node.name == name
    if isinstance(node, n.Getattr) and "." in name:  # `ns.rest` for alias "ns.rest"
        base, _, attr = name.rpartition(".")
        return node.attr == attr and _is_name(node.node, base)
    return False


def _is_key(node, name: str, key: str) -> bool:
    import jinja2.nodes as n

    if isinstance(node, n.Getitem):
        return _is_name(node.node, name) and isinstance(node.arg, n.Const) and node.arg.value == key
    if isinstance(node, n.Getattr):
        return _is_name(node.node, name) and node.attr == key
    return False


def _accesses(node, name: str, key: str | None = None) -> bool:
    """`name` (or `name.key`), possibly through filters, tests and slices."""
    import jinja2.nodes as n

    if isinstance(node, n.Filter):
        return node.node is not None and _accesses(node.node, name, key)
    if isinstance(node, n.Test):
        return _accesses(node.node, name, key)
    if isinstance(node, n.Getitem) and isinstance(node.arg, n.Slice):
        return _accesses(node.node, name, key)
    return _is_key(node, name, key) if key else _is_name(node, name)


def _dotted(node) -> str | None:
    import jinja2.nodes as n

    if isinstance(node, n.NSRef):
        return f"{node.name}.{node.attr}"
    parts = []
    while isinstance(node, n.Getattr):
        parts.append(node.attr)
        node = node.node
    if isinstance(node, n.Name):
        parts.append(node.name)
        return ".".join(reversed(parts))
    return None


def _aliases_of(root, var: str) -> list[str]:
    """`var` plus every variable assigned from it (transitively), namespace attributes included."""
    import jinja2.nodes as n

    names, queue = [var], [var]
    seen = {var}
    while queue:
        cur = queue.pop(0)
        for asg in root.find_all(n.Assign):
            lhs, rhs = asg.target, asg.node
            new = []
            if isinstance(lhs, n.Name) and _accesses(rhs, cur):
                new.append(lhs.name)
            if isinstance(lhs, n.Name) and isinstance(rhs, n.Call) and isinstance(rhs.node, n.Name) \
                    and rhs.node.name == "namespace":
                new += [f"{lhs.name}.{kw.key}" for kw in rhs.kwargs if _accesses(kw.value, cur)]
            elif isinstance(lhs, (n.Getattr, n.NSRef)) and _accesses(rhs, cur):
                d = _dotted(lhs)
                if d:
                    new.append(d)
            for a in new:
                names.append(a)
                if a not in seen:
                    seen.add(a)
                    queue.append(a)
    return names


def detect_content_format(template: str) -> str:
    import jinja2.nodes as n
    from transformers.utils.chat_template_utils import _compile_jinja_template

    try:
        ast = _compile_jinja_template(template).environment.parse(template)
    except Exception:
        return "string"
    msg_lists = _aliases_of(ast, "messages")
    msg_vars = []
    for loop in ast.find_all(n.For):
        if any(_accesses(loop.iter, v) for v in msg_lists) and isinstance(loop.target, n.Name):
            msg_vars.append(loop.target.name)
    # Macro parameters that receive `<message>.content`.
    macro_params: dict[int, set[str]] = {}
    in_macro: set[int] = set()
    for macro in ast.find_all(n.Macro):
        pnames = {a.name for a in macro.args}
        bound: set[str] = set()
        for call in ast.find_all(n.Call):
            if isinstance(call.node, n.Name) and call.node.name == macro.name:
                for i, arg in enumerate(call.args):
                    if i < len(macro.args) and any(_accesses(arg, v, "content") for v in msg_vars):
                        bound.add(macro.args[i].name)
                for kw in call.kwargs:
                    if kw.key in pnames and any(_accesses(kw.value, v, "content") for v in msg_vars):
                        bound.add(kw.key)
        for loop in macro.find_all(n.For):
            in_macro.add(id(loop))
            if bound:
                macro_params[id(loop)] = bound
    for loop in ast.find_all(n.For):
        if any(_accesses(loop.iter, v, "content") for v in msg_vars):
            return "openai"
        if isinstance(loop.iter, n.Name):
            if loop.iter.name in macro_params.get(id(loop), set()):
                return "openai"
            if id(loop) not in in_macro and loop.iter.name == "content":
                return "openai"
    return "string"


# --------------------------------------------------------------------------
# Message preprocessing (vllm/renderers/chat_utils/chat_message.py)
# --------------------------------------------------------------------------

_TEXT_KEYS = {"text": "text", "input_text": "text", "output_text": "text", "refusal": "refusal", "thinking": "thinking"}
_BILLING_HEADER = "x-anthropic-billing-header"


def _strip_billing_header(parts: list) -> list:
    out = []
    for p in parts:
        text = p if isinstance(p, str) else (p.get("text") if isinstance(p, dict) and p.get("type") == "text" else None)
        if not (isinstance(text, str) and text.startswith(_BILLING_HEADER)):
            out.append(p)
            continue
        rest = text.partition("\n")[2]
        if rest:
            out.append(rest if isinstance(p, str) else {**p, "text": rest})
    return out


def _text_of_part(part: Any) -> str | None:
    if isinstance(part, str):
        return part
    if not isinstance(part, dict):
        raise RequestError("content parts must be objects")
    ptype = part.get("type")
    if ptype in _TEXT_KEYS:
        text = part.get(_TEXT_KEYS[ptype])
        if text is None and ptype in ("text", "refusal"):
            return None  # skipped with a warning by vLLM
        return text
    raise RequestError(f"content part type {ptype!r} is not text; this test model is text-only")


def parse_message(msg: dict, content_format: str) -> dict:
    if not isinstance(msg, dict) or not isinstance(msg.get("role"), str):
        raise RequestError("each message needs a string `role`")
    role = msg["role"]
    content = msg.get("content")
    if content is None and "content" in msg and role != "assistant":
        # pydantic: only the OpenAI assistant message type allows `content: null`
        # (vLLM's custom message type allows the key to be absent, not null).
        raise RequestError(f"`content` may be null only in assistant messages (role {role!r})")
    # /tokenize reads only `reasoning`; the deprecated `reasoning_content` is renamed
    # to `reasoning` by ChatCompletionRequest (/v1/chat/completions) only.
    reasoning = msg.get("reasoning")
    if content is None:
        parts: list = []
    elif isinstance(content, str):
        parts = [{"type": "text", "text": content}]
    elif isinstance(content, list):
        parts = list(content)
    else:
        raise RequestError("message content must be a string, a list of parts or null")
    if role == "system":
        parts = _strip_billing_header(parts)
    texts = [t for t in (_text_of_part(p) for p in parts) if t]  # empty texts are dropped
    out: dict[str, Any] = {"role": role}
    if content_format == "openai":
        out["content"] = [{"type": "text", "text": t} for t in texts]
    else:
        out["content"] = "\n".join(texts)
    if role == "assistant":
        if msg.get("tool_calls") is not None:
            out["tool_calls"] = copy.deepcopy(list(msg["tool_calls"]))
        if reasoning is not None:
            out["reasoning"] = reasoning
            out["reasoning_content"] = reasoning
    elif role == "tool":
        if "tool_call_id" in msg:
            out["tool_call_id"] = msg["tool_call_id"]
        if isinstance(out["content"], list):  # tool results are always flattened
            out["content"] = "\n".join(p["text"] for p in out["content"])
    if isinstance(msg.get("name"), str):
        out["name"] = msg["name"]
    if isinstance(msg.get("task"), str):
        out["task"] = msg["task"]
    if role == "developer":
        out["tools"] = msg.get("tools")
    return out


def postprocess_tool_calls(conversation: list[dict]) -> None:
    for m in conversation:
        if m["role"] != "assistant" or "tool_calls" not in m or not isinstance(m["tool_calls"], list):
            continue
        if not m["tool_calls"]:
            del m["tool_calls"]  # empty list: render as a plain assistant turn
            continue
        for tc in m["tool_calls"]:
            if not isinstance(tc, dict):
                raise RequestError("assistant tool_calls entries must be objects.")
            fn = tc.get("function")
            if tc.get("type", "function") != "function" or not isinstance(fn, dict):
                raise RequestError("chat completions only support assistant tool_calls of type 'function'.")
            args = fn.get("arguments")
            if not args:
                fn["arguments"] = {}
                continue
            if isinstance(args, str):
                try:
                    args = json.loads(args)
                except json.JSONDecodeError:
                    args = None
            fn["arguments"] = args if isinstance(args, dict) else {}


def developer_to_system(conversation: list[dict], template: str) -> list[dict]:
    """vllm/renderers/hf.py safe_apply_chat_template: only when a developer message
    is present and the template source has no '"developer"' / "'developer'" literal."""
    if not any(m["role"] == "developer" for m in conversation):
        return conversation
    if '"developer"' in template or "'developer'" in template:
        return conversation
    conv = []
    for m in conversation:
        if m["role"] == "developer":
            m = dict(m)
            m["role"] = "system"
            m.pop("tools", None)
        conv.append(m)
    # Merge all system messages into one at position 0 (only if one is not first
    # or there are several), joined by a blank line; empty ones are dropped.
    texts, rest, merge = [], [], False
    for i, m in enumerate(conv):
        if m["role"] == "system":
            if i > 0 or texts:
                merge = True
            c = m.get("content", "")
            if isinstance(c, list):
                c = "\n".join(p["text"] if isinstance(p, dict) else p for p in c
                              if isinstance(p, str) or (isinstance(p, dict) and "text" in p))
            if c:
                texts.append(c)
        else:
            rest.append(m)
    if not merge:
        return conv
    return [{"role": "system", "content": "\n\n".join(texts)}, *rest]


# --------------------------------------------------------------------------
# Template kwargs (vllm/renderers/params.py merge_kwargs, ChatParams;
# vllm/renderers/online_renderer.py preprocess_chat; hf.py resolve_chat_template_kwargs)
# --------------------------------------------------------------------------

def _merge(defaults: dict | None, overrides: dict | None) -> dict:
    """merge_kwargs: overrides win, except their None / "auto" values."""
    return {**(defaults or {}), **{k: v for k, v in (overrides or {}).items() if v is not None and v != "auto"}}


def _named_params(fn) -> set[str]:
    return {p.name for p in inspect.signature(fn).parameters.values()
            if p.kind not in (inspect.Parameter.VAR_KEYWORD, inspect.Parameter.VAR_POSITIONAL)}


def _template_variables(template: str) -> set[str]:
    import jinja2
    import jinja2.ext
    import jinja2.meta
    import jinja2.sandbox

    class Generation(jinja2.ext.Extension):  # `{% generation %}` blocks, as HF supports
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_noop"), [], [], body).set_lineno(lineno)

    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[Generation, jinja2.ext.loopcontrols])
    return set(jinja2.meta.find_undeclared_variables(env.parse(template)))


def filter_template_kwargs(tokenizer, template: str, kwargs: dict) -> dict:
    from transformers import PythonBackend

    accepted = (_named_params(type(tokenizer).apply_chat_template)
                | _template_variables(template)
                | _named_params(PythonBackend.apply_chat_template)) - {"chat_template", "tokenize"}
    return {k: v for k, v in kwargs.items() if k in accepted}


def _template_error_reason(exc: BaseException) -> str:
    import jinja2

    seen, cur = set(), exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, jinja2.TemplateError):
            return str(cur)
        cur = cur.__cause__ or cur.__context__
    return str(exc)


# --------------------------------------------------------------------------
# The /tokenize request
# --------------------------------------------------------------------------

def tokenize_chat(tokenizer, req: dict) -> tuple[str, list[int]]:
    messages = req.get("messages")
    if not isinstance(messages, list):
        raise RequestError("`messages` must be a list")
    if req.get("continue_final_message") and req.get("add_generation_prompt"):
        raise RequestError("Cannot set both `continue_final_message` and `add_generation_prompt` to True.")
    add_generation_prompt = bool(req.get("add_generation_prompt", True))
    continue_final_message = bool(req.get("continue_final_message", False))
    add_special_tokens = bool(req.get("add_special_tokens", False))
    user_kwargs = req.get("chat_template_kwargs") or {}
    if not isinstance(user_kwargs, dict):
        raise RequestError("`chat_template_kwargs` must be an object")
    if user_kwargs.get("chat_template") is not None or req.get("chat_template") is not None:
        raise RequestError("Chat template is passed with request, but --trust-request-chat-template is not set. "
                           "Refused request with untrusted chat template.")
    # `documents` is not a /tokenize field (ignored like any unknown field); it
    # reaches the template only through chat_template_kwargs.
    tools = normalize_tools(req.get("tools"))

    # TokenizeChatRequest.build_chat_params + ChatParams.with_defaults(
    #   {tools, tokenize=False}) + get_apply_chat_template_kwargs.
    kwargs = _merge(user_kwargs, {"add_generation_prompt": add_generation_prompt,
                                  "continue_final_message": continue_final_message})
    kwargs = _merge(_merge(None, {"tools": tools, "tokenize": False}), kwargs)
    kwargs = _merge(kwargs, {"chat_template": None, "return_dict": False})

    template = tokenizer.get_chat_template(None, tools=kwargs.get("tools"))
    content_format = detect_content_format(template)
    conversation = [parse_message(m, content_format) for m in messages]
    postprocess_tool_calls(conversation)

    tools_arg = kwargs.pop("tools", None)
    kwargs.pop("chat_template", None)
    tokenize = kwargs.pop("tokenize", True)
    conversation = developer_to_system(conversation, template)
    resolved = filter_template_kwargs(tokenizer, template, kwargs)
    try:
        text = tokenizer.apply_chat_template(conversation=conversation, tools=tools_arg, chat_template=template,
                                             tokenize=tokenize, **resolved)
    except Exception as e:
        raise RequestError(_template_error_reason(e)) from e
    if not isinstance(text, str):  # chat_template_kwargs {"tokenize": true}: HF returned ids already
        raise RequestError("unsupported: chat_template_kwargs.tokenize")
    ids = tokenizer(text, truncation=False, max_length=None, add_special_tokens=add_special_tokens)["input_ids"]
    return text, list(ids)


def tokenize_request(tokenizer, req: dict) -> dict:
    try:
        if "messages" in req:
            text, ids = tokenize_chat(tokenizer, req)
        elif isinstance(req.get("prompt"), str):
            text = req["prompt"]
            ids = list(tokenizer(text, truncation=False, max_length=None,
                                 add_special_tokens=bool(req.get("add_special_tokens", True)))["input_ids"])
        else:
            raise RequestError("request needs `messages` or a string `prompt`")
    except RequestError as e:
        return {"error": str(e)}
    return {"text": text, "ids": ids}


# --------------------------------------------------------------------------

def dump_line(obj: dict) -> str:
    line = json.dumps(obj, ensure_ascii=False, separators=(", ", ": "))
    for ch in _LINE_BREAKERS:
        line = line.replace(ch, "\\u%04x" % ord(ch))
    return line


def read_corpus() -> list[dict]:
    items = [json.loads(l) for l in CORPUS.read_text(encoding="utf-8").split("\n") if l.strip()]
    ids = [i["id"] for i in items]
    dup = {i for i in ids if ids.count(i) > 1}
    if dup:
        sys.exit(f"gen_expected: duplicate ids in corpus: {sorted(dup)}")
    return items


def generate(family: str, corpus: list[dict]) -> str:
    from transformers import AutoTokenizer

    d = TOKENIZERS / family
    if not (d / "tokenizer.json").exists():
        sys.exit(f"gen_expected: {d}/tokenizer.json missing; run scripts/fetch-tokenizers.sh")
    tokenizer = AutoTokenizer.from_pretrained(str(d))
    lines = [dump_line({"id": item["id"], **tokenize_request(tokenizer, item["request"])}) for item in corpus]
    return "\n".join(lines) + "\n"


def check_versions() -> None:
    from importlib.metadata import version

    got = {p: version(p) for p in PINNED}
    if got != PINNED:
        print(f"gen_expected: warning: fixtures are pinned to {PINNED}, this environment has {got}; "
              "use the environment from scripts/setup-test-env.sh", file=sys.stderr)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true",
                    help="regenerate in memory; exit 1 and print a diff if the committed files differ")
    ap.add_argument("--family", action="append", choices=FAMILIES, help="default: all")
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    check_versions()
    corpus = read_corpus()
    stale = 0
    for family in args.family or FAMILIES:
        path = PARITY / f"expected-{family}.jsonl"
        new = generate(family, corpus)
        n_err = sum("error" in json.loads(line) for line in new.split("\n") if line)
        if args.check:
            old = path.read_text(encoding="utf-8") if path.exists() else ""
            if old != new:
                stale += 1
                print(f"gen_expected: {path.relative_to(ROOT)} is stale:")
                diff = difflib.unified_diff(old.split("\n"), new.split("\n"), "committed", "regenerated", n=0,
                                            lineterm="")
                for i, d in enumerate(diff):
                    if i >= 60:
                        print("  ... (diff truncated)")
                        break
                    print("  " + (d if len(d) <= 400 else d[:400] + " ..."))
            else:
                print(f"gen_expected: {family}: {len(corpus)} requests ({n_err} errors) match {path.name}")
        else:
            path.write_text(new, encoding="utf-8")
            print(f"gen_expected: {family}: wrote {path.relative_to(ROOT)} ({len(corpus)} requests, {n_err} errors)")
    if stale:
        print("gen_expected: regenerate with: .cache/venv/bin/python tests/py/parity/gen_expected.py")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
