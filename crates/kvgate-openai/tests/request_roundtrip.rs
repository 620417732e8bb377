//! Requests are forwarded as the client wrote them: for any JSON object that
//! parses as a request, writing the parsed request back gives the same text
//! (same keys, values, explicit nulls, and key order). Checked on valid
//! requests built key by key in random order, and on arbitrary objects that
//! mix known keys (with valid or arbitrary values) and unknown keys.

#![allow(clippy::unwrap_used)]

use kvgate_openai::{
    ChatCompletionRequest, CompletionRequest, DetokenizeRequest, Prompt, TokenizeChatRequest,
    TokenizeCompletionRequest, TokenizeRequest,
};
use proptest::collection::vec;
use proptest::prelude::*;
use proptest::strategy::BoxedStrategy;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{Map, Value};

/// Every key any request object models; unknown keys avoid them.
const KNOWN: &[&str] = &[
    "model",
    "messages",
    "stream",
    "stream_options",
    "include_usage",
    "continuous_usage_stats",
    "tools",
    "documents",
    "chat_template",
    "chat_template_kwargs",
    "add_generation_prompt",
    "continue_final_message",
    "add_special_tokens",
    "kv_transfer_params",
    "prompt",
    "return_token_strs",
    "tokens",
    "role",
    "content",
    "name",
    "tool_calls",
    "tool_call_id",
    "reasoning_content",
    "reasoning",
    "id",
    "type",
    "function",
    "arguments",
];

fn text() -> BoxedStrategy<String> {
    prop_oneof![
        "[a-z]{0,6}",
        "\\PC{0,10}",
        vec(any::<char>(), 0..6).prop_map(|chars| chars.into_iter().collect()),
    ]
    .boxed()
}

fn key() -> BoxedStrategy<String> {
    prop_oneof![text(), proptest::sample::select(KNOWN).prop_map(str::to_owned)].boxed()
}

fn unknown_key() -> BoxedStrategy<String> {
    text().prop_filter("an unknown key", |k| !KNOWN.contains(&k.as_str())).boxed()
}

fn leaf() -> BoxedStrategy<Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        // Dyadic fractions print and parse back exactly.
        (-4000i32..4000).prop_map(|k| Value::from(f64::from(k) / 8.0)),
        text().prop_map(Value::from),
    ]
    .boxed()
}

fn object(entries: Vec<(String, Value)>) -> Value {
    Value::Object(entries.into_iter().collect::<Map<String, Value>>())
}

/// Any JSON value, a few levels deep; object keys may be known names.
fn json() -> BoxedStrategy<Value> {
    leaf()
        .prop_recursive(3, 32, 4, |inner| {
            prop_oneof![
                vec(inner.clone(), 0..4).prop_map(Value::Array),
                vec((key(), inner), 0..4).prop_map(object),
            ]
        })
        .boxed()
}

/// Unknown entries: keys no request models, any values.
fn extras() -> BoxedStrategy<Vec<(String, Value)>> {
    vec((unknown_key(), json()), 0..4).boxed()
}

/// An optional entry: absent, `null`, or a valid value.
fn opt(key: &'static str, value: BoxedStrategy<Value>) -> BoxedStrategy<Vec<(String, Value)>> {
    prop_oneof![
        2 => Just(Vec::new()),
        1 => Just(vec![(key.to_owned(), Value::Null)]),
        3 => value.prop_map(move |v| vec![(key.to_owned(), v)]),
    ]
    .boxed()
}

fn req(key: &'static str, value: BoxedStrategy<Value>) -> BoxedStrategy<Vec<(String, Value)>> {
    value.prop_map(move |v| vec![(key.to_owned(), v)]).boxed()
}

/// Joins entry groups and shuffles them into one object.
fn shuffled(groups: Vec<BoxedStrategy<Vec<(String, Value)>>>) -> BoxedStrategy<Value> {
    groups
        .prop_map(|groups| groups.into_iter().flatten().collect::<Vec<_>>())
        .prop_shuffle()
        .prop_map(object)
        .boxed()
}

fn string_value() -> BoxedStrategy<Value> {
    text().prop_map(Value::from).boxed()
}

fn bool_value() -> BoxedStrategy<Value> {
    any::<bool>().prop_map(Value::from).boxed()
}

fn map_value() -> BoxedStrategy<Value> {
    vec((key(), json()), 0..4).prop_map(object).boxed()
}

fn list_value() -> BoxedStrategy<Value> {
    vec(json(), 0..3).prop_map(Value::Array).boxed()
}

fn token_ids() -> BoxedStrategy<Value> {
    vec(any::<u32>(), 0..6).prop_map(Value::from).boxed()
}

fn role() -> BoxedStrategy<Value> {
    prop_oneof![
        proptest::sample::select(
            &["system", "developer", "user", "assistant", "tool", "function"][..]
        )
        .prop_map(Value::from),
        string_value(),
    ]
    .boxed()
}

fn content_part() -> BoxedStrategy<Value> {
    prop_oneof![
        string_value(),
        shuffled(vec![
            req("type", Just(Value::from("text")).boxed()),
            req("text", string_value()),
            extras()
        ]),
        shuffled(vec![
            req("type", Just(Value::from("image_url")).boxed()),
            req("image_url", map_value()),
            extras()
        ]),
        map_value(),
    ]
    .boxed()
}

fn content() -> BoxedStrategy<Value> {
    prop_oneof![string_value(), vec(content_part(), 0..4).prop_map(Value::Array)].boxed()
}

fn tool_call() -> BoxedStrategy<Value> {
    let function =
        shuffled(vec![req("name", string_value()), req("arguments", string_value()), extras()]);
    shuffled(vec![
        opt("id", string_value()),
        opt("type", string_value()),
        req("function", function),
        extras(),
    ])
}

fn message() -> BoxedStrategy<Value> {
    shuffled(vec![
        req("role", role()),
        opt("content", content()),
        opt("name", string_value()),
        opt("tool_calls", vec(tool_call(), 0..3).prop_map(Value::Array).boxed()),
        opt("tool_call_id", string_value()),
        opt("reasoning_content", string_value()),
        opt("reasoning", string_value()),
        extras(),
    ])
}

fn messages() -> BoxedStrategy<Value> {
    vec(message(), 0..4).prop_map(Value::Array).boxed()
}

fn stream_options() -> BoxedStrategy<Value> {
    shuffled(vec![
        opt("include_usage", bool_value()),
        opt("continuous_usage_stats", bool_value()),
        extras(),
    ])
}

fn chat_request() -> BoxedStrategy<Value> {
    shuffled(vec![
        opt("model", string_value()),
        req("messages", messages()),
        opt("stream", bool_value()),
        opt("stream_options", stream_options()),
        opt("tools", list_value()),
        opt("documents", list_value()),
        opt("chat_template", string_value()),
        opt("chat_template_kwargs", map_value()),
        opt("add_generation_prompt", bool_value()),
        opt("continue_final_message", bool_value()),
        opt("add_special_tokens", bool_value()),
        opt("kv_transfer_params", map_value()),
        extras(),
    ])
}

fn prompt() -> BoxedStrategy<Value> {
    prop_oneof![
        string_value(),
        vec(text(), 0..4).prop_map(Value::from),
        token_ids(),
        vec(vec(any::<u32>(), 0..4), 1..4).prop_map(Value::from),
    ]
    .boxed()
}

fn completion_request() -> BoxedStrategy<Value> {
    shuffled(vec![
        opt("model", string_value()),
        opt("prompt", prompt()),
        opt("stream", bool_value()),
        opt("stream_options", stream_options()),
        opt("add_special_tokens", bool_value()),
        opt("kv_transfer_params", map_value()),
        extras(),
    ])
}

fn tokenize_chat_request() -> BoxedStrategy<Value> {
    shuffled(vec![
        opt("model", string_value()),
        req("messages", messages()),
        opt("add_generation_prompt", bool_value()),
        opt("continue_final_message", bool_value()),
        opt("add_special_tokens", bool_value()),
        opt("return_token_strs", bool_value()),
        opt("chat_template", string_value()),
        opt("chat_template_kwargs", map_value()),
        opt("tools", list_value()),
        extras(),
    ])
}

fn tokenize_completion_request() -> BoxedStrategy<Value> {
    shuffled(vec![
        opt("model", string_value()),
        req("prompt", string_value()),
        opt("add_special_tokens", bool_value()),
        opt("return_token_strs", bool_value()),
        extras(),
    ])
}

fn detokenize_request() -> BoxedStrategy<Value> {
    shuffled(vec![opt("model", string_value()), req("tokens", token_ids()), extras()])
}

/// An object mixing known keys (valid or arbitrary values) and unknown keys.
fn mixed(valid: BoxedStrategy<Value>) -> BoxedStrategy<Value> {
    (valid, vec((key(), json()), 0..4))
        .prop_map(|(valid, noise)| {
            let mut map = match valid {
                Value::Object(map) => map,
                _ => Map::new(),
            };
            for (k, v) in noise {
                map.insert(k, v);
            }
            Value::Object(map)
        })
        .boxed()
}

/// Parses the text of `input` as `T` and, if that works, checks that `T`
/// writes the same text back. Returns whether it parsed.
fn round_trip<T: DeserializeOwned + Serialize>(input: &Value) -> Result<bool, TestCaseError> {
    let text = serde_json::to_string(input).map_err(|e| TestCaseError::fail(e.to_string()))?;
    let Ok(parsed) = serde_json::from_str::<T>(&text) else {
        return Ok(false);
    };
    let back = serde_json::to_string(&parsed).map_err(|e| TestCaseError::fail(e.to_string()))?;
    prop_assert_eq!(&back, &text);
    let back_value: Value =
        serde_json::from_str(&back).map_err(|e| TestCaseError::fail(e.to_string()))?;
    prop_assert_eq!(&back_value, input);
    Ok(true)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn valid_chat_requests_round_trip(input in chat_request()) {
        prop_assert!(round_trip::<ChatCompletionRequest>(&input)?, "did not parse: {input}");
    }

    #[test]
    fn valid_completion_requests_round_trip(input in completion_request()) {
        prop_assert!(round_trip::<CompletionRequest>(&input)?, "did not parse: {input}");
    }

    #[test]
    fn valid_tokenize_and_detokenize_requests_round_trip(
        chat in tokenize_chat_request(),
        completion in tokenize_completion_request(),
        detokenize in detokenize_request(),
    ) {
        prop_assert!(round_trip::<TokenizeChatRequest>(&chat)?, "did not parse: {chat}");
        prop_assert!(round_trip::<TokenizeRequest>(&chat)?, "did not parse: {chat}");
        prop_assert!(round_trip::<TokenizeCompletionRequest>(&completion)?, "did not parse: {completion}");
        prop_assert!(round_trip::<TokenizeRequest>(&completion)?, "did not parse: {completion}");
        prop_assert!(round_trip::<DetokenizeRequest>(&detokenize)?, "did not parse: {detokenize}");
    }

    #[test]
    fn mixed_objects_round_trip_when_they_parse(
        chat in mixed(chat_request()),
        completion in mixed(completion_request()),
        tokenize in mixed(tokenize_chat_request()),
    ) {
        round_trip::<ChatCompletionRequest>(&chat)?;
        round_trip::<CompletionRequest>(&completion)?;
        round_trip::<TokenizeRequest>(&tokenize)?;
        round_trip::<TokenizeRequest>(&completion)?;
        round_trip::<DetokenizeRequest>(&completion)?;
    }

    #[test]
    fn arbitrary_json_round_trips_when_it_parses(input in json()) {
        round_trip::<ChatCompletionRequest>(&input)?;
        round_trip::<CompletionRequest>(&input)?;
        round_trip::<TokenizeRequest>(&input)?;
        round_trip::<DetokenizeRequest>(&input)?;
    }

    #[test]
    fn replacing_the_prompt_changes_only_the_prompt(input in completion_request(), ids in vec(any::<u32>(), 0..8)) {
        let mut request: CompletionRequest = serde_json::from_value(input.clone()).unwrap();
        request.set_prompt_token_ids(ids.clone());
        let mut expected = input.as_object().unwrap().clone();
        // In place when the key was there; appended after the known keys otherwise.
        expected.insert("prompt".to_owned(), Value::from(ids.clone()));
        let back = serde_json::to_value(&request).unwrap();
        prop_assert_eq!(&back, &Value::Object(expected.clone()));
        if input.get("prompt").is_some() {
            prop_assert_eq!(serde_json::to_string(&request).unwrap(), serde_json::to_string(&expected).unwrap());
        }
        prop_assert_eq!(request.prompt, Some(Prompt::Tokens(ids)));
    }

    #[test]
    fn handing_over_token_ids_changes_only_kv_transfer_params(input in chat_request(), ids in vec(any::<u32>(), 0..8)) {
        let mut request: ChatCompletionRequest = serde_json::from_value(input.clone()).unwrap();
        let text_only = !request.has_non_text_content();
        let result = request.set_prompt_token_ids(&ids);
        prop_assert_eq!(result.is_ok(), text_only);
        let mut expected = input.as_object().unwrap().clone();
        if text_only {
            let params = expected.entry("kv_transfer_params").or_insert(Value::Null);
            if !params.is_object() {
                *params = Value::Object(Map::new());
            }
            if let Some(params) = params.as_object_mut() {
                params.insert("prompt_token_ids".to_owned(), Value::from(ids.clone()));
            }
            prop_assert_eq!(request.prompt_token_ids(), Some(ids));
        }
        prop_assert_eq!(serde_json::to_value(&request).unwrap(), Value::Object(expected));
    }
}
