//! No panic on any input: random `/tokenize` chat bodies (odd roles, content
//! of every JSON type, broken tool calls, stray kwargs) either render and
//! encode or return an error.

// Helpers outside #[test] functions panic on purpose.
#![allow(clippy::expect_used)]

use kvgate_tokenize::{ChatRequest, ChatTokenizer};
use proptest::prelude::*;
use serde_json::{json, Value};

fn leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_filter("finite", |f| f.is_finite()).prop_map(Value::from),
        "\\PC{0,12}".prop_map(Value::from),
        prop::sample::select(vec!["<|im_start|>", "</think>", "<think>", "{{", "%}", "\n", ""])
            .prop_map(Value::from),
    ]
}

fn json_value() -> impl Strategy<Value = Value> {
    leaf().prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
            prop::collection::btree_map(
                prop::sample::select(vec![
                    "type",
                    "text",
                    "name",
                    "arguments",
                    "function",
                    "id",
                    "x"
                ])
                .prop_map(String::from),
                inner,
                0..4
            )
            .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn message() -> impl Strategy<Value = Value> {
    let role = prop::sample::select(vec![
        "system",
        "user",
        "assistant",
        "tool",
        "developer",
        "critic",
        "",
    ]);
    let content = prop_oneof![
        "\\PC{0,20}".prop_map(Value::from),
        json_value(),
        prop::collection::vec(
            (
                "\\PC{0,8}",
                prop::sample::select(vec!["text", "refusal", "thinking", "image_url", "bogus"])
            )
                .prop_map(|(text, ty)| json!({"type": ty, "text": text, "thinking": text})),
            0..3
        )
        .prop_map(Value::from),
    ];
    let tool_calls = prop_oneof![
        Just(Value::Null),
        json_value(),
        ("\\PC{0,10}", any::<bool>()).prop_map(|(args, typed)| json!([{"id": "i",
            "type": if typed { "function" } else { "custom" },
            "function": {"name": "f", "arguments": args}}])),
    ];
    (role, content, tool_calls, json_value(), any::<bool>()).prop_map(
        |(role, content, calls, extra, reason)| {
            let mut m =
                json!({"role": role, "content": content, "tool_calls": calls, "name": extra});
            if reason {
                m["reasoning"] = json!("because");
            }
            m
        },
    )
}

fn body() -> impl Strategy<Value = Value> {
    (
        prop::collection::vec(message(), 0..5),
        any::<bool>(),
        any::<bool>(),
        prop::option::of(json_value()),
        prop::option::of(json_value()),
    )
        .prop_map(|(messages, agp, cont, kwargs, tools)| {
            let mut b = json!({"messages": messages, "add_generation_prompt": agp, "continue_final_message": cont});
            if let Some(Value::Object(k)) = kwargs {
                b["chat_template_kwargs"] = Value::Object(k);
            }
            if let Some(Value::Array(t)) = tools {
                b["tools"] = Value::Array(t);
            }
            b
        })
}

/// One tokenizer for all cases: loading the bundled one takes a while.
fn tokenizer() -> &'static ChatTokenizer {
    static TOKENIZER: std::sync::OnceLock<ChatTokenizer> = std::sync::OnceLock::new();
    TOKENIZER.get_or_init(|| ChatTokenizer::bundled().expect("bundled tokenizer"))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn random_requests_never_panic(body in body()) {
        let tokenizer = tokenizer();
        if let Ok(request) = serde_json::from_value::<ChatRequest>(body) {
            if let Ok(text) = tokenizer.render_chat(&request) {
                let ids = tokenizer.encode_text_no_special(&text).unwrap();
                let _ = tokenizer.decode(&ids, true).unwrap();
            }
        }
    }
}
