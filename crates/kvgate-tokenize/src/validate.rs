//! vLLM's request validation of one chat message.
//!
//! vLLM types `messages` as `list[ChatCompletionMessageParam]`, a union of
//! TypedDicts (`vllm/renderers/chat_utils/types.py`): OpenAI's developer,
//! system, user, assistant, tool and function message types, then vLLM's
//! `CustomChatCompletionMessageParam` (any role, plus `reasoning`, `tools`,
//! `task`, ...). pydantic's smart-union validation keeps the member that
//! validates with the most fields set (nested fields included; ties go to
//! the earlier member). The request model allows extra fields, so unknown
//! keys survive (after the member's declared keys); validation decides
//! which messages are rejected (`"content": null` outside assistant
//! messages, a non-string `name`, a tool call without `id` or with object
//! `arguments`, ...) and how nested tool calls and content parts are laid
//! out. The OpenAI types declare list content and `tool_calls` as
//! `Iterable`, validated lazily; an invalid item then fails when vLLM reads
//! it, which is an error all the same.
//!
//! These rules were checked against vLLM 0.33.0's own
//! `TokenizeChatRequest` validation (pydantic 2.14) on each shape handled
//! here.

use std::borrow::Cow;

use serde_json::{Map, Value};

use crate::error::{Result, TokenizeError};

type Object = Map<String, Value>;

fn invalid(message: impl Into<String>) -> TokenizeError {
    TokenizeError::InvalidRequest(message.into())
}

/// The message types of the union, in its order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Developer,
    System,
    User,
    Assistant,
    Tool,
    Function,
    Custom,
}

impl Kind {
    const ALL: [Kind; 7] = [
        Kind::Developer,
        Kind::System,
        Kind::User,
        Kind::Assistant,
        Kind::Tool,
        Kind::Function,
        Kind::Custom,
    ];

    /// The declared keys, in declaration order.
    fn fields(self) -> &'static [&'static str] {
        match self {
            Kind::Developer | Kind::System | Kind::User => &["content", "role", "name"],
            Kind::Assistant => {
                &["role", "audio", "content", "function_call", "name", "refusal", "tool_calls"]
            }
            Kind::Tool => &["content", "role", "tool_call_id"],
            Kind::Function => &["content", "name", "role"],
            Kind::Custom => &[
                "role",
                "content",
                "name",
                "tool_call_id",
                "tool_calls",
                "reasoning",
                "tools",
                "task",
            ],
        }
    }

    fn role(self) -> Option<&'static str> {
        match self {
            Kind::Developer => Some("developer"),
            Kind::System => Some("system"),
            Kind::User => Some("user"),
            Kind::Assistant => Some("assistant"),
            Kind::Tool => Some("tool"),
            Kind::Function => Some("function"),
            Kind::Custom => None,
        }
    }
}

/// How a part may look in a content list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PartSet {
    /// `{"type": "text", "text": str}` only.
    Text,
    /// Text or media (OpenAI's user message).
    UserParts,
    /// Text or refusal (OpenAI's assistant message).
    AssistantParts,
    /// vLLM's `ChatCompletionContentPartParam`: all of the above, media of
    /// several shapes, `thinking`, `tool_reference`, and plain strings.
    Any,
}

/// The declared keys of a content part type, or `None` if the part matches
/// none of the allowed types.
fn part_fields(part: &Object, set: PartSet) -> Option<&'static [&'static str]> {
    let ty = part.get("type").and_then(Value::as_str);
    let is_str = |k: &str| part.get(k).is_some_and(Value::is_string);
    let is_obj = |k: &str| part.get(k).is_some_and(Value::is_object);
    let text = ty == Some("text") && is_str("text");
    let refusal = ty == Some("refusal") && is_str("refusal");
    let media = match ty {
        Some("image_url") => is_obj("image_url"),
        Some("input_audio") => is_obj("input_audio"),
        Some("file") => is_obj("file"),
        _ => false,
    };
    match set {
        PartSet::Text => text.then_some(&["text", "type"][..]),
        PartSet::AssistantParts => {
            if text {
                Some(&["text", "type"])
            } else if refusal {
                Some(&["refusal", "type"])
            } else {
                None
            }
        }
        PartSet::UserParts => {
            if text {
                Some(&["text", "type"])
            } else if media {
                Some(&["image_url", "input_audio", "file", "type"])
            } else {
                None
            }
        }
        PartSet::Any => {
            if text {
                Some(&["text", "type"])
            } else if refusal {
                Some(&["refusal", "type"])
            } else if ty == Some("thinking") && is_str("thinking") {
                Some(&["thinking", "closed", "type"])
            } else if ty == Some("tool_reference") || part.contains_key("tool_reference") {
                Some(&["name", "type", "tool_reference"])
            } else if media || crate::preprocess::is_media_part(part) {
                Some(&[
                    "type",
                    "image_url",
                    "input_audio",
                    "file",
                    "audio_url",
                    "video_url",
                    "image_pil",
                    "image_embeds",
                    "audio_embeds",
                    "video_embeds",
                    "data",
                    "uuid",
                ])
            } else {
                None
            }
        }
    }
}

/// Validates a content list: `Some(nested fields)` if valid.
fn content_parts(parts: &[Value], set: PartSet) -> Option<usize> {
    let mut nested = 0;
    for part in parts {
        match part {
            Value::String(_) if set == PartSet::Any => {}
            Value::Object(obj) => {
                let fields = part_fields(obj, set)?;
                nested += obj.keys().filter(|k| fields.contains(&k.as_str())).count();
            }
            _ => return None,
        }
    }
    Some(nested)
}

/// Appends the keys of `source` that `declared` does not name, in order.
fn with_extras(mut out: Object, source: &Object, declared: &[&str]) -> Object {
    for (key, value) in source {
        if !declared.contains(&key.as_str()) {
            out.insert(key.clone(), value.clone());
        }
    }
    out
}

/// A function tool call `{id, function: {arguments, name}, type}`; returns
/// its normalized form.
fn function_tool_call(call: &Value) -> Option<Value> {
    let call = call.as_object()?;
    let id = call.get("id")?.as_str()?;
    if call.get("type")?.as_str()? != "function" {
        return None;
    }
    let function = call.get("function")?.as_object()?;
    let arguments = function.get("arguments")?.as_str()?;
    let name = function.get("name")?.as_str()?;
    let mut f = Object::new();
    f.insert("arguments".into(), arguments.into());
    f.insert("name".into(), name.into());
    let f = with_extras(f, function, &["arguments", "name"]);
    let mut out = Object::new();
    out.insert("id".into(), id.into());
    out.insert("function".into(), Value::Object(f));
    out.insert("type".into(), "function".into());
    Some(Value::Object(with_extras(out, call, &["id", "function", "type"])))
}

/// A custom tool call `{id, custom: {input, name}, type: "custom"}`.
fn custom_tool_call(call: &Value) -> Option<Value> {
    let call = call.as_object()?;
    let id = call.get("id")?.as_str()?;
    if call.get("type")?.as_str()? != "custom" {
        return None;
    }
    let custom = call.get("custom")?.as_object()?;
    let input = custom.get("input")?.as_str()?;
    let name = custom.get("name")?.as_str()?;
    let mut c = Object::new();
    c.insert("input".into(), input.into());
    c.insert("name".into(), name.into());
    let c = with_extras(c, custom, &["input", "name"]);
    let mut out = Object::new();
    out.insert("id".into(), id.into());
    out.insert("custom".into(), Value::Object(c));
    out.insert("type".into(), "custom".into());
    Some(Value::Object(with_extras(out, call, &["id", "custom", "type"])))
}

/// A tool definition `{function: {name, description, parameters, strict},
/// type: "function"}` (a developer message's `tools`).
fn function_tool(tool: &Value) -> Option<(Value, usize)> {
    let tool = tool.as_object()?;
    if tool.get("type")?.as_str()? != "function" {
        return None;
    }
    let function = tool.get("function")?.as_object()?;
    let mut f = Object::new();
    f.insert("name".into(), function.get("name")?.as_str()?.into());
    for (key, ok) in [
        ("description", Value::is_string as fn(&Value) -> bool),
        ("parameters", Value::is_object),
        ("strict", |v: &Value| v.is_boolean() || v.is_null()),
    ] {
        if let Some(v) = function.get(key) {
            if !ok(v) {
                return None;
            }
            f.insert(key.into(), v.clone());
        }
    }
    let nested = 2 + f.len();
    let f = with_extras(f, function, &["name", "description", "parameters", "strict"]);
    let mut out = Object::new();
    out.insert("function".into(), Value::Object(f));
    out.insert("type".into(), "function".into());
    Some((Value::Object(with_extras(out, tool, &["function", "type"])), nested))
}

/// One field checked against a message type: `Some((value, nested))` when
/// valid, with the value normalized as pydantic outputs it (borrowed when
/// it is kept as it is).
fn field<'a>(kind: Kind, key: &str, value: &'a Value) -> Result<Option<(Cow<'a, Value>, usize)>> {
    let keep = |v: &'a Value| Ok(Some((Cow::Borrowed(v), 0)));
    let lazy_list = |v: &'a Value| Ok(v.is_array().then_some((Cow::Borrowed(v), 0)));
    match (kind, key, value) {
        (_, "role", Value::String(r)) => match kind.role() {
            Some(role) if role != r => Ok(None),
            _ => keep(value),
        },
        (Kind::Custom, "content", Value::Array(parts)) => {
            Ok(content_parts(parts, PartSet::Any).map(|n| (Cow::Borrowed(value), n)))
        }
        (Kind::Function | Kind::Assistant, "content", Value::Null) => keep(value),
        (Kind::Function, "content", Value::String(_)) => keep(value),
        (Kind::Function, "content", _) => Ok(None),
        (_, "content", Value::String(_)) => keep(value),
        (_, "content", Value::Array(_)) => lazy_list(value),
        (_, "name", Value::String(_)) => keep(value),
        (Kind::Assistant, "refusal", Value::String(_) | Value::Null) => keep(value),
        (Kind::Assistant, "audio", Value::Null) => keep(value),
        (Kind::Assistant, "audio", Value::Object(o)) => {
            Ok(o.get("id").is_some_and(Value::is_string).then_some((Cow::Borrowed(value), 1)))
        }
        (Kind::Assistant, "function_call", Value::Null) => keep(value),
        (Kind::Assistant, "function_call", Value::Object(o)) => {
            Ok((o.get("arguments").is_some_and(Value::is_string)
                && o.get("name").is_some_and(Value::is_string))
            .then_some((Cow::Borrowed(value), 2)))
        }
        (Kind::Assistant, "tool_calls", Value::Array(_)) => lazy_list(value),
        (Kind::Tool, "tool_call_id", Value::String(_)) => keep(value),
        (Kind::Custom, "tool_call_id" | "reasoning" | "task", Value::Null) => keep(value),
        (Kind::Custom, "tool_call_id" | "reasoning" | "task", Value::String(_)) => keep(value),
        (Kind::Custom, "reasoning", Value::Object(o)) => {
            if o.get("type").and_then(Value::as_str) == Some("prompt_embeds") {
                Err(TokenizeError::Unsupported("prompt-embedding reasoning".into()))
            } else {
                Ok(None)
            }
        }
        (Kind::Custom, "tool_calls" | "tools", Value::Null) => keep(value),
        (Kind::Custom, "tool_calls", Value::Array(calls)) => {
            let normalized: Option<Vec<Value>> = calls.iter().map(function_tool_call).collect();
            Ok(normalized.map(|calls| {
                let nested = calls.len() * 5;
                (Cow::Owned(Value::Array(calls)), nested)
            }))
        }
        (Kind::Custom, "tools", Value::Array(tools)) => {
            let mut out = Vec::with_capacity(tools.len());
            let mut nested = 0;
            for tool in tools {
                let Some((tool, n)) = function_tool(tool) else {
                    return Ok(None);
                };
                out.push(tool);
                nested += n;
            }
            Ok(Some((Cow::Owned(Value::Array(out)), nested)))
        }
        _ => Ok(None),
    }
}

/// [`field`]'s verdict alone: `Some(nested)` when valid.
fn check(kind: Kind, key: &str, value: &Value) -> Result<Option<usize>> {
    Ok(field(kind, key, value)?.map(|(_, nested)| nested))
}

/// Validates `message` against one type: its score when valid. Only the
/// winning type's fields are built ([`keep_as`]): a message is tried
/// against all seven, and copying its fields for each cost about a quarter
/// of the validation (~3.5k of ~15k instructions per message).
fn score_as(kind: Kind, message: &Object) -> Result<Option<usize>> {
    let required: &[&str] = match kind {
        Kind::Developer | Kind::System | Kind::User => &["role", "content"],
        Kind::Assistant | Kind::Custom => &["role"],
        Kind::Tool => &["role", "content", "tool_call_id"],
        Kind::Function => &["role", "content", "name"],
    };
    if required.iter().any(|k| !message.contains_key(*k)) {
        return Ok(None);
    }
    let mut score = 0;
    for key in kind.fields() {
        let Some(value) = message.get(*key) else {
            continue;
        };
        let Some(nested) = check(kind, key, value)? else {
            return Ok(None);
        };
        score += 1 + nested;
    }
    Ok(Some(score))
}

/// The fields `kind` keeps of `message` (which [`score_as`] found valid),
/// normalized and in pydantic's order, then the extra keys.
fn keep_as(kind: Kind, message: &Object) -> Result<Object> {
    let mut kept = Object::new();
    for key in kind.fields() {
        let Some(value) = message.get(*key) else {
            continue;
        };
        if let Some((value, _)) = field(kind, key, value)? {
            kept.insert((*key).to_owned(), value.into_owned());
        }
    }
    Ok(with_extras(kept, message, kind.fields()))
}

/// Checks the lazily validated lists of the chosen OpenAI type, as vLLM's
/// later reads of them would, and normalizes tool calls.
fn check_lazy(kind: Kind, message: &mut Object) -> Result<()> {
    if kind == Kind::Custom {
        return Ok(());
    }
    if let Some(Value::Array(parts)) = message.get("content") {
        let set = match kind {
            Kind::User => PartSet::UserParts,
            Kind::Assistant => PartSet::AssistantParts,
            _ => PartSet::Text,
        };
        if content_parts(parts, set).is_none() {
            return Err(invalid(format!(
                "invalid content part in a {} message",
                kind.role().unwrap_or("chat")
            )));
        }
    }
    if let Some(Value::Array(calls)) = message.get("tool_calls") {
        let normalized: Option<Vec<Value>> =
            calls.iter().map(|c| function_tool_call(c).or_else(|| custom_tool_call(c))).collect();
        let Some(normalized) = normalized else {
            return Err(invalid(
                "invalid assistant tool call: it needs a string `id`, `type` \"function\" and \
                 `function` with string `name` and `arguments`",
            ));
        };
        message.insert("tool_calls".into(), Value::Array(normalized));
    }
    Ok(())
}

/// Validates one message as vLLM's request model does and returns it as
/// pydantic lays it out.
pub(crate) fn validate_message(message: &Value) -> Result<Object> {
    let Value::Object(message) = message else {
        return Err(invalid("each message must be an object"));
    };
    if !message.get("role").is_some_and(Value::is_string) {
        return Err(invalid("each message needs a string `role`"));
    }
    let mut best: Option<(Kind, usize)> = None;
    for kind in Kind::ALL {
        if let Some(score) = score_as(kind, message)? {
            if best.is_none_or(|(_, s)| score > s) {
                best = Some((kind, score));
            }
        }
    }
    let Some((kind, _)) = best else {
        let role = message.get("role").and_then(Value::as_str).unwrap_or_default();
        return Err(invalid(format!(
            "the {role:?} message does not match any chat message type \
             (check `content`, `name` and the other fields' types)"
        )));
    };
    let mut kept = keep_as(kind, message)?;
    check_lazy(kind, &mut kept)?;
    Ok(kept)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ok(v: Value) -> Value {
        Value::Object(validate_message(&v).unwrap())
    }

    fn err(v: Value) -> bool {
        validate_message(&v).is_err()
    }

    #[test]
    fn null_content_only_for_assistant_and_function() {
        assert!(err(json!({"role": "user", "content": null})));
        assert!(err(json!({"role": "tool", "content": null, "tool_call_id": "x"})));
        assert!(err(json!({"role": "critic", "content": null})));
        assert_eq!(
            ok(json!({"role": "assistant", "content": null})),
            json!({"role": "assistant", "content": null})
        );
        assert!(!err(json!({"role": "function", "name": "f", "content": null})));
        assert_eq!(ok(json!({"role": "user"})), json!({"role": "user"}));
    }

    #[test]
    fn extra_keys_survive_after_declared_ones() {
        let call =
            json!([{"id": "r1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]);
        let m =
            ok(json!({"role": "assistant", "content": null, "reasoning": "r", "tool_calls": call}));
        assert_eq!(m["reasoning"], "r");
        let tie =
            ok(json!({"role": "assistant", "content": "x", "reasoning": "r", "refusal": "no"}));
        let keys: Vec<&String> = tie.as_object().unwrap().keys().collect();
        assert_eq!(keys, ["role", "content", "refusal", "reasoning"]);
        assert_eq!(ok(json!({"role": "user", "content": "x", "task": 5}))["task"], 5);
        assert!(err(json!({"role": "critic", "content": "x", "task": 5})));
    }

    #[test]
    fn names_and_parts_are_checked() {
        assert!(err(json!({"role": "user", "content": "x", "name": null})));
        assert!(err(json!({"role": "user", "content": "x", "name": 3})));
        assert!(err(json!({"role": "user", "content": ["a"]})));
        assert!(err(json!({"role": "system", "content": ["a"]})));
        assert!(!err(json!({"role": "critic", "content": ["a"]})));
        assert!(!err(json!({"role": "user", "content": [{"type": "text", "text": "a"}, "b"]})));
        assert!(err(json!({"role": "user", "content": [{"type": "text", "text": null}]})));
        assert!(err(json!({"role": "user", "content": [{"type": "input_text", "text": "t"}]})));
        assert!(err(json!({"role": "user", "content": 5})));
        assert!(err(json!({"content": "x"})));
    }

    #[test]
    fn tool_calls_are_strict_and_normalized() {
        let missing_id = json!({"role": "assistant", "content": "x", "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{}"}}]});
        assert!(err(missing_id));
        let dict_args = json!({"role": "assistant", "content": "x", "tool_calls": [{"id": "a", "type": "function", "function": {"name": "f", "arguments": {"x": 1}}}]});
        assert!(err(dict_args));
        let extra = ok(
            json!({"role": "assistant", "content": "x", "tool_calls": [{"type": "function", "index": 0, "function": {"name": "f", "arguments": "{}", "x": 1}, "id": "a"}]}),
        );
        assert_eq!(
            extra["tool_calls"],
            json!([{"id": "a", "function": {"arguments": "{}", "name": "f", "x": 1}, "type": "function", "index": 0}])
        );
        let custom = ok(
            json!({"role": "assistant", "content": null, "tool_calls": [{"id": "z", "type": "custom", "custom": {"name": "n", "input": "i"}}]}),
        );
        assert_eq!(custom["tool_calls"][0]["type"], "custom");
    }

    #[test]
    fn developer_tools_need_valid_definitions() {
        let valid = ok(
            json!({"role": "developer", "content": "d", "tools": [{"type": "function", "function": {"name": "f"}}]}),
        );
        assert_eq!(valid["tools"], json!([{"function": {"name": "f"}, "type": "function"}]));
        let invalid_tools = ok(
            json!({"role": "developer", "content": "d", "tools": [{"function": {"name": "f", "description": 5}}]}),
        );
        assert_eq!(invalid_tools["tools"], json!([{"function": {"name": "f", "description": 5}}]));
        assert_eq!(
            ok(json!({"role": "developer", "content": "d", "tools": null}))["tools"],
            Value::Null
        );
    }
}
