#!/usr/bin/env python3
"""Write the Jinja-compatibility fixtures for kvgate-tokenize's template engine.

Each case is a small chat-template snippet plus a JSON context. This script
renders it with transformers' own chat-template environment
(`transformers.utils.chat_template_utils._compile_jinja_template`: Jinja2's
ImmutableSandboxedEnvironment with trim_blocks, lstrip_blocks, loopcontrols,
HF's tojson / raise_exception / strftime_now) and records the output or the
fact that rendering failed. The Rust unit test `template::compat_tests`
renders the same snippets with kvgate's minijinja environment and requires
identical output (or an error where Jinja2 errs).

    .cache/venv/bin/python crates/kvgate-tokenize/tests/jinja/gen_cases.py          # rewrite
    .cache/venv/bin/python crates/kvgate-tokenize/tests/jinja/gen_cases.py --check  # exit 1 if stale

Pinned to what vllm==0.33.0 installs: transformers 5.20.x, jinja2 3.1.6.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parent / "cases.jsonl"

MSGS = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi 'there' \"you\""},
    {"role": "assistant", "content": "<think>\nplan\n</think>\n\nHello!", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Zürich", "n": 2, "f": 1.5, "ok": True, "none": None}}}]},
    {"role": "tool", "content": "22C", "tool_call_id": "c1"},
]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather \u2603", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}}, "required": ["city"]}}}]
VALUES = {"t": True, "f": False, "n": None, "i": 42, "neg": -7, "fl": 1.0, "fl2": 0.1, "big": 1e20, "small": 1.5e-7,
          "pi": 3.14159, "s": "it's", "s2": "say \"hi\"", "uni": "é\u00a0\u200b😀", "lst": [1, "a", None, True, 2.5],
          "d": {"z": 1, "a": [1, {"b": None}], "k": "v"}, "empty_l": [], "empty_d": {}, "ws": " \t\n x \x1c\n ",
          "text": "a,b,,c", "lines": "one\r\ntwo\rthree\n\nfour\u2028five"}

# (name, template, context)
CASES: list[tuple[str, str, dict]] = [
    # Printing: Python str() of values.
    ("print_scalars", "{{ t }}|{{ f }}|{{ n }}|{{ i }}|{{ neg }}|{{ fl }}|{{ fl2 }}|{{ big }}|{{ small }}|{{ pi }}", VALUES),
    ("print_containers", "{{ lst }}|{{ d }}|{{ empty_l }}|{{ empty_d }}", VALUES),
    ("print_string_reprs", "{{ [s, s2, uni, 'a\\nb\\\\'] }}", VALUES),
    ("print_literals", "{{ [1, 'a', none, true] }}|{{ {'k': [1, 2]} }}|{{ (1, 'x') }}|{{ (1,) }}", {}),
    ("print_message", "{{ messages[2] }}", {"messages": MSGS}),
    ("print_items", "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}", VALUES),
    ("print_math", "{{ 10 / 2 }}|{{ 1 / 3 }}|{{ 7 // 2 }}|{{ 7 % 3 }}|{{ 2 ** 10 }}|{{ -7 // 2 }}|{{ 0.5 + 1 }}", {}),
    ("print_undefined", "[{{ missing }}][{{ d.missing }}][{{ messages[9] }}]", {"messages": MSGS, "d": {}}),
    ("string_filter", "{{ t|string }}|{{ n|string }}|{{ lst|string }}|{{ fl|string }}", VALUES),
    ("join_mixed", "{{ lst|join(', ') }}|{{ [1, 2]|join }}|{{ messages|join('/', attribute='role') }}", {**VALUES, "messages": MSGS}),
    # tojson.
    ("tojson_default", "{{ tools|tojson }}", {"tools": TOOLS}),
    ("tojson_values", "{{ d|tojson }}|{{ lst|tojson }}|{{ uni|tojson }}|{{ ws|tojson }}|{{ big|tojson }}|{{ small|tojson }}|{{ n|tojson }}", VALUES),
    ("tojson_indent", "{{ tools|tojson(indent=2) }}\n{{ d|tojson(indent=4) }}\n{{ empty_d|tojson(indent=2) }}", {**VALUES, "tools": TOOLS}),
    ("tojson_indent0_str", "{{ d|tojson(indent=0) }}|{{ d|tojson(indent='\\t') }}", VALUES),
    ("tojson_sort_ascii", "{{ d|tojson(sort_keys=true) }}|{{ uni|tojson(ensure_ascii=true) }}|{{ d|tojson(separators=(',', ':')) }}", VALUES),
    ("tojson_args", "{{ message.tool_calls[0].function.arguments|tojson }}", {"message": MSGS[2]}),
    ("tojson_string", "{{ 'a\"b\\\\c\\u0001'|tojson }}", {}),
    # str methods.
    ("strip_family", "[{{ ws.strip() }}][{{ ws.lstrip() }}][{{ ws.rstrip() }}][{{ 'xxaxx'.strip('x') }}][{{ '\\n\\nabc\\n'.lstrip('\\n') }}]", VALUES),
    ("split_family", "{{ text.split(',') }}|{{ text.split(',', 1) }}|{{ ' a  b c '.split() }}|{{ ' a  b c '.split(none, 1) }}|{{ text.rsplit(',', 1) }}|{{ 'a b'.rsplit() }}", VALUES),
    ("splitlines", "{{ lines.splitlines() }}|{{ lines.splitlines(true) }}", VALUES),
    ("think_split", "{% set c = messages[2].content %}{{ c.split('</think>')[-1].lstrip('\\n') }}|{{ c.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') }}", {"messages": MSGS}),
    ("str_predicates", "{{ 'abc'.startswith('a') }}{{ 'abc'.startswith(('x', 'ab')) }}{{ 'abc'.endswith('bc') }}{{ '12'.isdigit() }}{{ 'ab'.isalpha() }}{{ '  '.isspace() }}{{ 'Ab'.islower() }}{{ 'AB'.isupper() }}", {}),
    ("str_transform", "{{ 'hello world'.title() }}|{{ 'hELLO'.capitalize() }}|{{ 'aXb'.upper() }}|{{ 'aXb'.lower() }}|{{ 'a-b-c'.replace('-', '+') }}|{{ 'a-b-c'.replace('-', '+', 1) }}", {}),
    ("str_search", "{{ 'banana'.find('an') }}|{{ 'banana'.rfind('an') }}|{{ 'banana'.count('a') }}|{{ 'banana'.find('x') }}|{{ 'héllo'.find('l') }}|{{ 'banana'.index('n') }}", {}),
    ("str_misc", "{{ 'abc'.removeprefix('a') }}|{{ 'abc'.removesuffix('c') }}|{{ 'a=b=c'.partition('=') }}|{{ 'a=b=c'.rpartition('=') }}|[{{ 'ab'.center(5) }}]|[{{ 'ab'.ljust(4, '.') }}]|{{ '-5'.zfill(4) }}", {}),
    ("str_format", "{{ '{} and {}'.format('a', 1) }}|{{ '{x}!'.format(x=2) }}", {}),
    ("str_join_method", "{{ ', '.join(['a', 'b']) }}", {}),
    ("dict_methods", "{{ d.keys()|list }}|{{ d.values()|list }}|{{ d.get('k') }}|{{ d.get('nope', 'dflt') }}|{{ d.get('nope') }}|{{ 'k' in d }}", VALUES),
    ("indexing", "{{ lst[0] }}|{{ lst[-1] }}|{{ lst[1:3] }}|{{ lst[::-1] }}|{{ 'abcdef'[1:4] }}|{{ 'abc'[::-1] }}|{{ lst|length }}", VALUES),
    # Filters.
    ("filters_text", "[{{ ws|trim }}]|{{ 'Hello'|upper }}|{{ 'Hello'|lower }}|{{ 'hello world'|title }}|{{ 'hello'|capitalize }}|{{ 'a-b'|replace('-', '_') }}|{{ s|length }}", VALUES),
    ("filters_seq", "{{ lst|first }}|{{ lst|last }}|{{ [3, 1, 2]|sort }}|{{ [3, 1, 2]|sort(reverse=true) }}|{{ [1, 1, 2]|unique|list }}|{{ [1, 2]|reverse|list }}|{{ [1, 2, 3]|sum }}|{{ [4, 2]|min }}|{{ [4, 2]|max }}", VALUES),
    ("filters_attr", "{{ messages|map(attribute='role')|list }}|{{ messages|selectattr('role', 'equalto', 'user')|list|length }}|{{ messages|rejectattr('role', 'equalto', 'user')|map(attribute='role')|join(',') }}", {"messages": MSGS}),
    ("filters_default", "{{ missing|default('d') }}|{{ ''|default('e', true) }}|{{ n|default('x') }}|{{ none|default('y', true) }}", VALUES),
    ("filters_numbers", "{{ '3'|int + 1 }}|{{ '2.5'|float }}|{{ 2.567|round(1) }}|{{ -3|abs }}|{{ 3|float }}|{{ 2.5|int }}", {}),
    ("filters_dict", "{{ d|dictsort }}|{% for k, v in d|items %}{{ k }};{% endfor %}", VALUES),
    ("filter_indent", "{{ 'a\\nb\\n\\nc'|indent(2) }}|{{ 'a\\nb'|indent(2, true) }}|{{ 'a\\n\\nb'|indent(2, blank=true) }}|{{ 'x\\ny'|indent('> ', first=true) }}", {}),
    ("filter_escape", "{{ '<a href=\"x\">&\\'</a>'|e }}", {}),
    ("filter_list_string", "{{ 'abc'|list }}|{{ d|list }}", VALUES),
    # Tests.
    ("tests_types", "{{ s is string }}{{ i is number }}{{ i is integer }}{{ fl is float }}{{ d is mapping }}{{ lst is sequence }}{{ s is sequence }}{{ lst is iterable }}{{ t is boolean }}{{ n is none }}{{ missing is defined }}{{ missing is undefined }}{{ d is string }}", VALUES),
    ("tests_values", "{{ f is false }}{{ t is true }}{{ 4 is even }}{{ 3 is odd }}{{ 9 is divisibleby 3 }}{{ 'a' is in 'cat' }}{{ 1 is eq 1 }}{{ 'abc' is lower }}{{ 'ABC' is upper }}", VALUES),
    # Loops and scoping.
    ("loop_vars", "{% for m in messages %}{{ loop.index }}{{ loop.index0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ loop.revindex }}{{ loop.revindex0 }};{% endfor %}", {"messages": MSGS}),
    ("loop_adjacent", "{% for m in messages %}{{ loop.previtem.role if loop.previtem is defined else '-' }}>{{ m.role }}>{{ loop.nextitem.role if loop.nextitem is defined else '-' }};{% endfor %}", {"messages": MSGS}),
    ("loop_controls", "{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}{% if x > 4 %}{% break %}{% endif %}{{ x }}{% endfor %}", {}),
    ("loop_filter_else", "{% for m in messages if m.role == 'nobody' %}{{ m }}{% else %}none{% endfor %}|{% for m in messages if m.role != 'tool' %}{{ m.role }}{% endfor %}", {"messages": MSGS}),
    ("loop_cycle", "{% for m in messages %}{{ loop.cycle('a', 'b') }}{% endfor %}", {"messages": MSGS}),
    ("loop_reverse_index", "{% for m in messages[::-1] %}{% set index = (messages|length - 1) - loop.index0 %}{{ index }}{% endfor %}", {"messages": MSGS}),
    ("scoping", "{% set x = 1 %}{% for m in messages %}{% set x = x + 1 %}{% endfor %}{{ x }}|{% set ns = namespace(c=0, last=none) %}{% for m in messages %}{% set ns.c = ns.c + 1 %}{% set ns.last = m.role %}{% endfor %}{{ ns.c }}{{ ns.last }}", {"messages": MSGS}),
    ("set_block", "{% set body %}\n  inner {{ 1 + 1 }}\n{% endset %}[{{ body }}]", {}),
    ("macros", "{% macro render(m, prefix='>') %}{{ prefix }}{{ m.role }}{% if caller is defined %}{{ caller() }}{% endif %}{% endmacro %}{% for m in messages %}{{ render(m) }}{{ render(m, prefix='#') }}{% endfor %}{% call render(messages[0]) %}!{% endcall %}", {"messages": MSGS}),
    ("dict_global", "{% set d2 = dict(a=1, b='x') %}{{ d2 }}|{{ d2.a }}", {}),
    # Whitespace control with trim_blocks / lstrip_blocks.
    ("ws_blocks", "{% for m in messages %}\n    <{{ m.role }}>\n    {% if m.content %}\n        {{ m.content }}\n    {% endif %}\n{% endfor %}\n", {"messages": MSGS[:2]}),
    ("ws_dash", "a  {%- if true -%}  b  {%- endif %}  c\n  {{- ' d ' -}}  \n e", {}),
    ("ws_plus", "x\n    {%+ if true %}y{% endif %}\n  {#- comment -#}  z\n{# c2 #}\nw", {}),
    ("ws_comment_line", "a\n  {# comment #}\nb\n{% raw %}{{ not rendered }}{% endraw %}\n", {}),
    ("ws_trailing_newline", "line\n\n", {}),
    ("ws_inline_if", "<{% if x %}yes{% else %}no{% endif %}>\n", {"x": 0}),
    # Operators.
    ("operators", "{{ 'ab' ~ 1 ~ none }}|{{ 'a' * 3 }}|{{ [1] + [2] }}|{{ 1 < 2 < 3 }}|{{ 'b' > 'a' }}|{{ 'x' in ['x'] }}|{{ 'x' not in 'abc' }}|{{ not none }}|{{ 1 if none else 2 }}", {}),
    ("concat_bool", "{{ 'v:' ~ t }}|{{ 'v:' ~ lst }}", VALUES),
    ("truthiness", "{{ 'y' if empty_l else 'n' }}{{ 'y' if empty_d else 'n' }}{{ 'y' if '' else 'n' }}{{ 'y' if 0 else 'n' }}{{ 'y' if 0.0 else 'n' }}{{ 'y' if missing else 'n' }}{{ 'y' if [0] else 'n' }}", VALUES),
    # Realistic fragments.
    ("tool_call_render", "{% for tc in messages[2].tool_calls %}{% if tc.function %}{% set tc = tc.function %}{% endif %}<tool_call>\n{\"name\": \"{{ tc.name }}\", \"arguments\": {{ tc.arguments|tojson }}}\n</tool_call>{% endfor %}", {"messages": MSGS}),
    ("system_extract", "{%- if messages[0]['role'] == 'system' %}\n    {%- set system_message = messages[0]['content']|trim %}\n    {%- set loop_messages = messages[1:] %}\n{%- else %}\n    {%- set system_message = '' %}\n{%- endif %}\n{{- system_message }}|{{ loop_messages|length }}", {"messages": MSGS}),
    ("alternation_error", "{% for m in messages %}{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% endfor %}", {"messages": MSGS}),
    ("content_parts", "{% for m in messages %}{% if m.content is string %}{{ m.content }}{% else %}{% for p in m.content %}{% if p.type == 'text' %}{{ p.text }}{% endif %}{% endfor %}{% endif %}{% endfor %}", {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image"}, {"type": "text", "text": "b"}]}, {"role": "user", "content": "c"}]}),
    ("tools_pretty", "{%- for tool in tools %}\n{{- tool.function|tojson(indent=4) }}\n\n{% endfor %}", {"tools": TOOLS}),
    ("bos_eos", "{{ bos_token }}{{ eos_token }}[{{ unk_token }}]", {"bos_token": "<s>", "eos_token": "</s>"}),
    ("generation_tag", "{% for m in messages %}{% if m.role == 'assistant' %}{% generation %}{{ m.content }}{% endgeneration %}{% else %}{{ m.content }}{% endif %}\n{% endfor %}", {"messages": MSGS[:3]}),
    ("generation_tag_ws", "{%- for m in messages %}\n    {%- generation -%}\n  {{ m.role }}\n    {%- endgeneration %}\n{% endfor %}", {"messages": MSGS[:2]}),

    # Round two: edge semantics.
    ("undef_ops", "[{{ missing ~ 'x' }}][{{ missing|length }}][{{ missing|list }}][{% for x in missing %}{{ x }}{% endfor %}][{{ missing == none }}][{{ missing is none }}][{{ not missing }}]", {}),
    ("none_attr", "[{{ n.x }}][{{ d['missing'] }}][{{ lst[10] }}]", VALUES),
    ("method_on_list_content", "{{ messages[0].content.strip() }}", {"messages": [{"role": "user", "content": [{"type": "text", "text": "x"}]}]}),
    ("format_filter", "{{ '%s-%d'|format('a', 3) }}|{{ '%02d'|format(7) }}", {}),
    ("safe_filter", "{{ d|tojson|safe }}|{{ '<b>'|safe|e }}", VALUES),
    ("range_list", "{{ range(3)|list }}|{{ range(1, 10, 3)|list }}|{{ range(3)|length }}", {}),
    ("none_tests", "{{ n is not none }}{{ n is defined }}{{ missing is not defined }}", VALUES),
    ("equality", "{{ 1 == 1.0 }}|{{ true == 1 }}|{{ [1, 2] == [1, 2] }}|{{ 'A' < 'a' }}|{{ {'a': 1} == {'a': 1} }}|{{ none == none }}", {}),
    ("div_zero", "{{ 3 / 0 }}", {}),
    ("items_list", "{{ d.items()|list }}|{{ d|items|list }}", VALUES),
    ("unpack_loop", "{% for a, b in [[1, 2], [3, 4]] %}{{ a }}{{ b }};{% endfor %}", {}),
    ("selectattr_join", "{{ content|selectattr('type', 'equalto', 'text')|map(attribute='text')|join('\\n') }}", {"content": [{"type": "text", "text": "a"}, {"type": "image"}, {"type": "text", "text": "b"}]}),
    ("filter_block", "{% filter upper %}abc {{ 'd' }}{% endfilter %}", {}),
    ("tojson_numbers", "{{ [1e16, -0.0, 18446744073709551615, 12345678901234567890, 0.1 + 0.2, 100.0]|tojson }}|{{ 18446744073709551615 }}|{{ 0.1 + 0.2 }}|{{ 1e16 }}|{{ 123456789.123 }}", {}),
    ("tojson_nested_indent", "{{ [1, [2, [3, {}]], {'a': []}]|tojson(indent=2) }}|{{ d|tojson(indent=none) }}", VALUES),
    ("strftime_len", "{{ strftime_now('%Y')|length }}|{{ strftime_now('%d %B %Y')|length > 8 }}", {}),
    ("raise_non_string", "{{ raise_exception(42) }}", {}),
    ("unicode_case", "{{ 'ß'.upper() }}|{{ 'straße'|upper }}|{{ 'ÉCOLE'.lower() }}|{{ 'éa'.capitalize() }}", {}),
    ("sort_case", "{{ ['b', 'A', 'a', 'B']|sort }}|{{ ['a', 'A', 'b']|unique|list }}|{{ {'b': 1, 'A': 2, 'a': 3}|dictsort }}|{{ ['b', 'A']|min }}|{{ ['b', 'A']|max }}", {}),
    ("sort_attr", "{{ messages|sort(attribute='role')|map(attribute='role')|join(',') }}", {"messages": MSGS}),
    ("int_filter", "{{ '0x1A'|int }}|{{ 'abc'|int }}|{{ 'abc'|int(5) }}|{{ '3.7'|int }}|{{ 3.7|int }}|{{ '  4 '|int }}", {}),
    ("round_filter", "{{ 2.5|round }}|{{ 3.5|round }}|{{ 2.345|round(2) }}|{{ 2.1|round(0, 'ceil') }}|{{ 2.9|round(0, 'floor') }}", {}),
    ("sum_attr", "{{ [{'x': 1}, {'x': 2}]|sum(attribute='x') }}", {}),
    ("center_filter", "[{{ 'x'|center(5) }}]", {}),
    ("truncate_wordcount", "{{ 'hello big world'|wordcount }}", {}),
    ("nested_ns", "{% set ns = namespace(a=namespace(b=1)) %}{{ ns.a.b }}", {}),
    ("set_attr_no_ns", "{% set d.x = 1 %}{{ d }}", {"d": {}}),
    ("loop_index_outside", "[{{ loop.index }}]", {}),
    ("startswith_tool_response", "{%- for message in messages %}{%- if message['role'] == 'user' and message['content'] is string and message['content'].startswith('<tool_response>') %}T{% else %}F{% endif %}{% endfor %}", {"messages": [{"role": "user", "content": "<tool_response>x"}, {"role": "user", "content": "x"}]}),
    ("string_escapes", "{{ 'tab\\there' }}|{{ \"dq 'single'\" }}|{{ 'uni \\u00e9 \\x41' }}|{{ 'nl\\nx' }}", {}),
    ("map_filter_names", "{{ ['a', 'b']|map('upper')|join }}|{{ [1, none, 2]|reject('none')|list }}|{{ [1, 'a']|select('string')|list }}", {}),
    ("length_of_dict_and_str", "{{ d|length }}|{{ uni|length }}|{{ ''|length }}", VALUES),
    ("bool_printing_in_concat", "{{ 'x' ~ 1.0 ~ none ~ [true] ~ {'a': none} }}", {}),
    ("number_methods", "{{ (3).__class__ }}", {}),
    ("is_in_list", "{{ 'a' in lst }}{{ 1 in lst }}{{ none in lst }}", VALUES),
    ("string_multiply", "[{{ '-' * 0 }}][{{ '-' * -1 }}][{{ '-' * 3 }}]", {}),
    ("neg_index_str", "{{ s[-1] }}|{{ s[-2:] }}|{{ s[10:] }}", VALUES),
    ("chained_filters_lower_trim", "{{ '  MiXeD  '|trim|lower|replace('x', 'X') }}", {}),
    ("list_concat_join", "{{ (lst + ['z'])|map('string')|join('|') }}", VALUES),
    ("attr_filter", "{{ d|attr('k') }}|{{ messages[0]|attr('role') }}", {**VALUES, "messages": MSGS}),
    ("batch_slice", "{{ [1, 2, 3]|batch(2)|list }}|{{ [1, 2, 3]|slice(2)|list }}", {}),
    ("default_boolean", "{{ false|default('x') }}|{{ false|default('x', true) }}", {}),
    ("test_callable_sameas", "{{ none is sameas none }}{{ raise_exception is callable }}", {}),
    # Errors: Jinja2 fails, so must we.
    ("err_raise", "{{ raise_exception('bad ' ~ 'input') }}", {}),
    ("err_undefined_attr", "{{ missing.attr }}", {}),
    ("err_add_str_int", "{{ 'a' + 1 }}", {}),
    ("err_unknown_filter", "{{ 1|nosuchfilter }}", {}),
    ("err_tojson_undefined", "{{ missing|tojson }}", {}),
    ("err_syntax", "{% for x in %}", {}),
    ("err_mutating_method", "{% set l = [] %}{{ l.append(1) }}", {}),
]


def render_all() -> list[dict]:
    from transformers.utils.chat_template_utils import _compile_jinja_template
    import jinja2

    rows = []
    for name, template, context in CASES:
        row = {"name": name, "template": template, "context": context}
        try:
            row["output"] = _compile_jinja_template(template).render(**context)
        except jinja2.TemplateError as e:
            row["error"] = str(e)
        except Exception as e:  # noqa: BLE001 - Python errors (TypeError, ...) count as errors too
            row["error"] = f"{type(e).__name__}: {e}"
        rows.append(row)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="exit 1 if cases.jsonl is stale")
    args = ap.parse_args()
    text = "".join(json.dumps(r, ensure_ascii=True) + "\n" for r in render_all())
    if args.check:
        if OUT.read_text(encoding="utf-8") != text:
            print(f"{OUT} is stale; regenerate with {Path(__file__).name}")
            return 1
        print(f"{OUT.name}: {len(CASES)} cases up to date")
        return 0
    OUT.write_text(text, encoding="utf-8")
    print(f"wrote {OUT} ({len(CASES)} cases)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
