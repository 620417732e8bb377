//! Unit tests of the Messages → chat conversion, rule by rule of vLLM
//! 0.33's `AnthropicServingMessages` (the parity corpus,
//! `tests/messages_parity.rs`, checks the rendered tokens end to end).

use serde_json::json;

use super::*;
use crate::ChatTokenizer;

fn convert(body: Value) -> Result<ChatRequest> {
    let body = body.as_object().cloned().unwrap_or_default();
    messages_to_chat(&body, MessagesEndpoint::Create, &MessagesRules::default(), 1_700_000_000)
}

fn messages(body: Value) -> Value {
    Value::Array(convert(body).expect("converts").messages)
}

fn base(extra: Value) -> Value {
    let mut b =
        json!({"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]});
    if let (Some(b), Value::Object(extra)) = (b.as_object_mut(), extra) {
        b.extend(extra);
    }
    b
}

#[test]
fn system_blocks_are_joined_without_billing_headers() {
    let m = messages(base(json!({"system": [
        {"type": "text", "text": "x-anthropic-billing-header: cc=1"},
        {"type": "text", "text": "You are "},
        {"type": "text", "text": ""},
        {"type": "image", "source": {"type": "url", "url": "u"}},
        {"type": "text", "text": "helpful."},
    ]})));
    assert_eq!(
        m,
        json!([
            {"role": "system", "content": "You are helpful."},
            {"role": "user", "content": "hi"},
        ])
    );
    let m = messages(base(json!({"system": ""})));
    assert_eq!(m, json!([{"role": "user", "content": "hi"}]));
}

#[test]
fn inline_system_messages_stay_or_merge_by_the_rule() {
    let body = json!({"model": "m", "max_tokens": 4, "system": "S.", "messages": [
        {"role": "user", "content": "a"},
        {"role": "system", "content": [{"type": "text", "text": "R1"}, {"type": "text", "text": "R2"}]},
        {"role": "system", "content": "x-anthropic-billing-header"},
        {"role": "user", "content": "b"},
    ]});
    assert_eq!(
        messages(body.clone()),
        json!([
            {"role": "system", "content": "S."},
            {"role": "user", "content": "a"},
            {"role": "system", "content": "R1R2"},
            {"role": "user", "content": "b"},
        ])
    );
    let rules = MessagesRules { merge_inline_system: true, ..MessagesRules::default() };
    let body = body.as_object().cloned().unwrap_or_default();
    let merged = messages_to_chat(&body, MessagesEndpoint::Create, &rules, 0).unwrap();
    assert_eq!(
        Value::Array(merged.messages),
        json!([
            {"role": "system", "content": "S.R1R2"},
            {"role": "user", "content": "a"},
            {"role": "user", "content": "b"},
        ])
    );
}

#[test]
fn tool_use_and_tool_result_become_calls_and_tool_messages() {
    let m = messages(base(json!({"messages": [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "need a tool", "signature": "s"},
            {"type": "text", "text": "Checking."},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Oslo", "n": 1.5}},
            {"type": "tool_use", "name": "noop"},
        ]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": [
                {"type": "text", "text": "cold"}, {"type": "text", "text": "windy"},
                {"type": "tool_reference", "tool_name": "get_weather"},
            ]},
            {"type": "tool_result", "tool_use_id": "call_x", "content": "ok", "is_error": true},
        ]},
    ]})));
    assert_eq!(
        m,
        json!([
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "reasoning": "need a tool", "tool_calls": [
                {"id": "toolu_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Oslo\",\"n\":1.5}"}},
                {"id": "call_1700000000", "type": "function", "function": {"name": "noop", "arguments": "{}"}},
            ], "content": "Checking."},
            {"role": "tool", "tool_call_id": "toolu_1", "content": "cold\nwindy"},
            {"role": "tool", "tool_call_id": "toolu_1", "content": [{"type": "tool_reference", "name": "get_weather"}]},
            {"role": "tool", "tool_call_id": "call_x", "content": "ok"},
        ])
    );
}

#[test]
fn an_assistant_tool_result_is_python_text() {
    let m = messages(base(json!({"messages": [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": [
            {"type": "tool_result", "tool_use_id": "t", "content": [{"type": "text", "text": "it's", "n": null}]},
            {"type": "text", "text": "done"},
        ]},
    ]})));
    assert_eq!(
        m[1],
        json!({"role": "assistant", "content": [
            {"type": "text", "text": "Tool result: [{'type': 'text', 'text': \"it's\", 'n': None}]"},
            {"type": "text", "text": "done"},
        ]})
    );
}

#[test]
fn tools_get_an_object_type_and_changes_resolve() {
    let chat = convert(base(json!({
        "tools": [
            {"name": "a", "description": "A", "input_schema": {"properties": {}}},
            {"name": "b", "input_schema": {"type": "object"}, "defer_loading": true, "strict": true},
        ],
        "messages": [
            {"role": "system", "content": [
                {"type": "tool_addition", "tool": {"type": "tool_reference", "name": "b"}},
                {"type": "tool_removal", "tool": {"type": "tool_reference", "name": "a"}},
                {"type": "tool_addition", "tool": {"type": "tool_definition", "definition": {"name": "c", "input_schema": {}}}},
            ]},
            {"role": "user", "content": "hi"},
        ],
    })))
    .unwrap();
    assert_eq!(
        Value::Array(chat.tools.unwrap()),
        json!([
            {"type": "function", "function": {"name": "b", "description": null, "parameters": {"type": "object"}, "strict": true, "defer_loading": null}},
            {"type": "function", "function": {"name": "c", "description": null, "parameters": {"type": "object"}, "strict": null, "defer_loading": null}},
        ])
    );
    let plain =
        convert(base(json!({"tools": [{"name": "a", "input_schema": {"properties": {}}}]})))
            .unwrap();
    assert_eq!(
        plain.tools.unwrap()[0]["function"]["parameters"],
        json!({"properties": {}, "type": "object"})
    );
    let undeclared = base(json!({"messages": [
        {"role": "system", "content": [{"type": "tool_addition", "tool": {"type": "tool_reference", "name": "zz"}}]},
        {"role": "user", "content": "x"},
    ]}));
    assert!(matches!(convert(undeclared), Err(TokenizeError::InvalidRequest(_))));
}

#[test]
fn effort_comes_from_output_config_and_disabled_thinking() {
    let chat = convert(base(json!({"output_config": {"effort": "high"}}))).unwrap();
    assert_eq!(chat.extra["reasoning_effort"], "high");
    let chat = convert(base(
        json!({"output_config": {"effort": "high"}, "thinking": {"type": "disabled"}}),
    ))
    .unwrap();
    assert_eq!(chat.extra["reasoning_effort"], "none");
    let chat = convert(base(json!({"thinking": {"type": "adaptive"}}))).unwrap();
    assert!(!chat.extra.contains_key("reasoning_effort"));
    assert_eq!(chat.endpoint, Endpoint::ChatCompletions);
}

#[test]
fn what_vllm_refuses_is_refused() {
    let refused = [
        json!({"model": "m", "messages": []}),
        base(json!({"max_tokens": 0})),
        base(json!({"model": ""})),
        base(json!({"messages": [{"role": "developer", "content": "x"}]})),
        base(
            json!({"messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]}),
        ),
        base(
            json!({"messages": [{"role": "user", "content": [{"type": "tool_addition", "tool": {"type": "tool_reference", "name": "a"}}]}]}),
        ),
        base(
            json!({"system": [{"type": "tool_removal", "tool": {"type": "tool_reference", "name": "a"}}]}),
        ),
        base(json!({"tools": [{"name": "web_search", "type": "web_search_20250305"}]})),
        base(json!({"tool_choice": {"type": "tool"}})),
        base(json!({"thinking": {"type": "enabled", "budget_tokens": 2048}})),
        base(json!({"thinking": {"type": "enabled", "budget_tokens": 10}, "max_tokens": 4096})),
        base(json!({"output_config": {"effort": "turbo"}})),
    ];
    for body in refused {
        match convert(body.clone()) {
            Err(TokenizeError::InvalidRequest(_)) => {}
            other => panic!("{body}: {other:?}"),
        }
    }
    // count_tokens has no max_tokens.
    let count = json!({"model": "m", "messages": [{"role": "user", "content": "x"}]});
    let count = count.as_object().cloned().unwrap_or_default();
    assert!(messages_to_chat(&count, MessagesEndpoint::CountTokens, &MessagesRules::default(), 0)
        .is_ok());
}

#[test]
fn images_are_unsupported_not_dropped() {
    let image = json!({"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}});
    for body in [
        base(json!({"messages": [{"role": "user", "content": [image.clone()]}]})),
        base(json!({"messages": [{"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "t", "content": [image.clone()]},
        ]}]})),
    ] {
        assert!(matches!(convert(body), Err(TokenizeError::Unsupported(_))));
    }
}

#[test]
fn empty_user_messages_vanish_but_empty_assistants_stay() {
    let m = messages(base(json!({"messages": [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": [{"type": "redacted_thinking", "data": "x"}]},
        {"role": "user", "content": []},
        {"role": "user", "content": ""},
    ]})));
    assert_eq!(
        m,
        json!([
            {"role": "user", "content": "a"},
            {"role": "assistant"},
            {"role": "user", "content": ""},
        ])
    );
}

#[test]
fn qwen3_takes_inline_system_and_disables_thinking_with_none() {
    let t = ChatTokenizer::bundled().unwrap();
    assert_eq!(
        t.messages_rules(),
        MessagesRules { merge_inline_system: false, disabled_thinking_effort: "none" }
    );
}

#[test]
fn a_system_first_template_merges_and_one_without_effort_uses_low() {
    // Qwen3.5-style: raises on a system message after the first.
    let template = "{% for m in messages %}{% if m.role == 'system' and not loop.first %}\
        {{ raise_exception('System message must be at the beginning.') }}{% endif %}\
        {{ m.role }}: {{ m.content }}\n{% endfor %}";
    let mut dir = crate::ModelDir::bundled_qwen3().unwrap();
    dir.templates = crate::ChatTemplates::Single(template.into());
    let t = ChatTokenizer::from_model_dir(dir).unwrap();
    assert_eq!(
        t.messages_rules(),
        MessagesRules { merge_inline_system: true, disabled_thinking_effort: "low" }
    );
}
