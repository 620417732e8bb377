//! vLLM's request preprocessing before the chat template runs.
//!
//! vLLM does not hand the client's messages to `apply_chat_template` as they
//! are. Each rule below is one small function, named after and verified
//! against vLLM 0.33.0 (`vllm/renderers/chat_utils/chat_message.py`,
//! `vllm/renderers/hf.py`, `vllm/renderers/params.py`,
//! `vllm/entrypoints/openai/chat_completion/protocol.py`,
//! `vllm/entrypoints/generate/base/protocol.py`):
//!
//! - [`parse_message`]: rebuild each message with only the fields vLLM keeps
//!   (`role`, `content`, plus `tool_calls`/`reasoning` for assistants,
//!   `tool_call_id` for tools, `name`, `task`, `tools` for developers);
//!   content becomes one string ("string" format, text parts joined with
//!   `"\n"`, empty parts dropped) or a list of text parts ("openai").
//! - [`strip_billing_header`]: system text parts that start with Claude
//!   Code's `x-anthropic-billing-header` line lose that line.
//! - [`postprocess_tool_calls`]: assistant tool-call `arguments` JSON strings
//!   become objects (invalid or non-object JSON becomes `{}`), and an empty
//!   `tool_calls` list is dropped.
//! - [`developer_to_system`] + [`consolidate_system_messages`]: when the
//!   template never mentions `"developer"`, developer messages become system
//!   messages and all system messages are merged into one at position 0.
//! - [`normalize_tools`]: tools as pydantic re-serializes them.
//! - [`merge_kwargs`] and [`TemplateKwargs::resolve`]: the template kwargs,
//!   filtered to the variables the template uses plus HF's standard
//!   `apply_chat_template` parameters.

use serde_json::{Map, Value};

use crate::error::{Result, TokenizeError};
use crate::template::ContentFormat;

type Object = Map<String, Value>;

fn invalid(message: impl Into<String>) -> TokenizeError {
    TokenizeError::InvalidRequest(message.into())
}

/// The line Claude Code prepends to its system prompt; its value changes on
/// every request (`_CLAUDE_CODE_BILLING_HEADER`).
const BILLING_HEADER: &str = "x-anthropic-billing-header";

/// Content-part types that carry text, and the key holding it
/// (`TEXT_PART_TYPES` and `MM_PARSER_MAP`).
fn text_key(part_type: &str) -> Option<&'static str> {
    match part_type {
        "text" | "input_text" | "output_text" => Some("text"),
        "refusal" => Some("refusal"),
        "thinking" => Some("thinking"),
        _ => None,
    }
}

/// Content-part types that are multimodal data (`MM_PARSER_MAP` minus text).
const MEDIA_PART_TYPES: [&str; 11] = [
    "image_url",
    "input_image",
    "image_embeds",
    "audio_embeds",
    "video_embeds",
    "prompt_embeds",
    "image_pil",
    "audio_url",
    "input_audio",
    "video_url",
    "file",
];

/// Whether a content part carries multimodal data (a media `type`, or a
/// media key without `type`).
pub(crate) fn is_media_part(part: &Object) -> bool {
    let typed =
        part.get("type").and_then(Value::as_str).is_some_and(|t| MEDIA_PART_TYPES.contains(&t));
    typed || MEDIA_PART_TYPES.iter().any(|k| part.contains_key(*k))
}

/// Keys of vLLM's content-part types (`_KNOWN_CONTENT_PART_FIELDS`); other
/// keys of a text part are kept in "openai" format.
const KNOWN_PART_FIELDS: [&str; 18] = [
    "audio_embeds",
    "audio_url",
    "closed",
    "data",
    "file",
    "image_embeds",
    "image_pil",
    "image_url",
    "input_audio",
    "name",
    "prompt_cache_breakpoint",
    "refusal",
    "text",
    "thinking",
    "type",
    "uuid",
    "video_embeds",
    "video_url",
];

/// One parsed content part.
enum Part {
    /// Text (`None` when the part has none) and the part's extra keys.
    Text(Option<String>, Object),
    /// `tool_reference`: kept as `{"type": "tool_reference", "name": ...}`.
    ToolReference(Option<String>),
}

/// `_strip_claude_code_billing_header`: drops the first line of system text
/// parts that start with the billing header, and the part if nothing is left.
pub(crate) fn strip_billing_header(parts: Vec<Value>) -> Vec<Value> {
    let mut out = Vec::with_capacity(parts.len());
    for part in parts {
        let text = match &part {
            Value::String(s) => Some(s.as_str()),
            Value::Object(o) if o.get("type").and_then(Value::as_str) == Some("text") => {
                o.get("text").and_then(Value::as_str)
            }
            _ => None,
        };
        let Some(text) = text.filter(|t| t.starts_with(BILLING_HEADER)) else {
            out.push(part);
            continue;
        };
        let rest = text.split_once('\n').map_or("", |(_, rest)| rest).to_owned();
        if rest.is_empty() {
            continue;
        }
        out.push(match part {
            Value::Object(mut o) => {
                o.insert("text".into(), Value::String(rest));
                Value::Object(o)
            }
            _ => Value::String(rest),
        });
    }
    out
}

/// `parse_chat_message_content_mm_part` + `parse_chat_message_content_part`
/// for text-only models.
fn parse_part(part: &Value) -> Result<Part> {
    let obj = match part {
        Value::String(s) => return Ok(Part::Text(Some(s.clone()), Object::new())),
        Value::Object(o) => o,
        _ => return Err(invalid("content parts must be strings or objects")),
    };
    let part_type = obj.get("type");
    let has_uuid = obj.get("uuid").is_some_and(|u| !u.is_null());
    let media_key = MEDIA_PART_TYPES.iter().any(|k| obj.contains_key(*k));
    match part_type {
        Some(Value::String(t)) if !has_uuid => {
            if let Some(key) = text_key(t) {
                let text = match obj.get(key) {
                    None | Some(Value::Null) => None,
                    Some(Value::String(s)) => Some(s.clone()),
                    Some(_) => return Err(invalid(format!("content part {key} must be a string"))),
                };
                let extra: Object = obj
                    .iter()
                    .filter(|(k, _)| !KNOWN_PART_FIELDS.contains(&k.as_str()))
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                return Ok(Part::Text(text, extra));
            }
            if t == "tool_reference" {
                return Ok(Part::ToolReference(
                    obj.get("name").and_then(Value::as_str).map(str::to_owned),
                ));
            }
            if MEDIA_PART_TYPES.contains(&t.as_str()) {
                return Err(TokenizeError::Unsupported(format!(
                    "content part type {t:?} (multimodal input)"
                )));
            }
            Err(invalid(format!("Unsupported chat content part type: {t:?}")))
        }
        None | Some(Value::Null) | Some(Value::String(_)) => {
            if media_key {
                Err(TokenizeError::Unsupported("multimodal content part".into()))
            } else if obj.contains_key("tool_reference") {
                Ok(Part::ToolReference(obj.get("name").and_then(Value::as_str).map(str::to_owned)))
            } else {
                Err(invalid("Missing 'type' field in multimodal part."))
            }
        }
        Some(_) => Err(invalid("Invalid 'type' field in multimodal part.")),
    }
}

/// `parse_chat_message_content_parts`: one string joined with `"\n"`
/// (empty texts dropped) or a list of text parts.
fn content_from_parts(parts: &[Value], format: ContentFormat) -> Result<Value> {
    let mut out: Vec<Value> = Vec::with_capacity(parts.len());
    let mut texts: Vec<String> = Vec::with_capacity(parts.len());
    for part in parts {
        match (parse_part(part)?, format) {
            // "text"/"refusal" parts without text are skipped in both formats.
            (Part::Text(None, _), _)
                if matches!(part.get("type").and_then(Value::as_str), Some("text" | "refusal")) => {
            }
            (Part::Text(text, extra), ContentFormat::OpenAi) => {
                let mut obj = Object::new();
                obj.insert("type".into(), Value::String("text".into()));
                obj.insert("text".into(), text.map_or(Value::Null, Value::String));
                obj.extend(extra);
                out.push(Value::Object(obj));
            }
            (Part::ToolReference(name), ContentFormat::OpenAi) => {
                let mut obj = Object::new();
                obj.insert("type".into(), Value::String("tool_reference".into()));
                obj.insert("name".into(), name.map_or(Value::Null, Value::String));
                out.push(Value::Object(obj));
            }
            (Part::Text(text, _) | Part::ToolReference(text), ContentFormat::String) => {
                if let Some(text) = text.filter(|t| !t.is_empty()) {
                    texts.push(text);
                }
            }
        }
    }
    Ok(match format {
        ContentFormat::OpenAi => Value::Array(out),
        ContentFormat::String => Value::String(texts.join("\n")),
    })
}

/// For the chat-completions endpoint: `reasoning_content` is renamed to
/// `reasoning` (`ChatCompletionRequest._normalize_messages_before`).
pub(crate) fn rename_reasoning_content(message: &mut Value) {
    if let Value::Object(obj) = message {
        if let Some(reasoning) = obj.shift_remove("reasoning_content") {
            if !reasoning.is_null() && obj.get("reasoning").is_none_or(Value::is_null) {
                obj.insert("reasoning".into(), reasoning);
            }
        }
    }
}

/// `parse_chat_message_content`: the message as vLLM rebuilds it from the
/// validated one (see `validate::validate_message`).
pub(crate) fn parse_message(msg: &Object, format: ContentFormat) -> Result<Object> {
    let role = match msg.get("role") {
        Some(Value::String(r)) => r.as_str(),
        _ => return Err(invalid("each message needs a string `role`")),
    };
    let mut parts = match msg.get("content") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(s)) => {
            let mut part = Object::new();
            part.insert("type".into(), Value::String("text".into()));
            part.insert("text".into(), Value::String(s.clone()));
            vec![Value::Object(part)]
        }
        Some(Value::Array(items)) => items.clone(),
        Some(_) => {
            return Err(invalid("message content must be a string, a list of parts or null"))
        }
    };
    if role == "system" {
        parts = strip_billing_header(parts);
    }
    let mut out = Object::new();
    out.insert("role".into(), Value::String(role.to_owned()));
    out.insert("content".into(), content_from_parts(&parts, format)?);
    match role {
        "assistant" => {
            match msg.get("tool_calls") {
                None | Some(Value::Null) => {}
                Some(Value::Array(calls)) => {
                    out.insert("tool_calls".into(), Value::Array(calls.clone()));
                }
                Some(_) => return Err(invalid("assistant tool_calls must be a list")),
            }
            match msg.get("reasoning") {
                None | Some(Value::Null) => {}
                Some(Value::Object(o))
                    if o.get("type").and_then(Value::as_str) == Some("prompt_embeds") =>
                {
                    return Err(TokenizeError::Unsupported(
                        "assistant reasoning given as prompt embeddings".into(),
                    ))
                }
                Some(reasoning) => {
                    out.insert("reasoning".into(), reasoning.clone());
                    out.insert("reasoning_content".into(), reasoning.clone());
                }
            }
        }
        "tool" => {
            if let Some(id) = msg.get("tool_call_id") {
                out.insert("tool_call_id".into(), id.clone());
            }
            flatten_tool_content(&mut out);
        }
        _ => {}
    }
    for key in ["name", "task"] {
        if let Some(Value::String(s)) = msg.get(key) {
            out.insert(key.into(), Value::String(s.clone()));
        }
    }
    if role == "developer" {
        out.insert("tools".into(), msg.get("tools").cloned().unwrap_or(Value::Null));
    }
    Ok(out)
}

/// Tool results given as text parts become one string joined with `"\n"`,
/// unless a part is not text.
fn flatten_tool_content(message: &mut Object) {
    let Some(Value::Array(items)) = message.get("content") else {
        return;
    };
    let has_non_text = items.iter().any(|item| {
        item.as_object().is_some_and(|o| o.get("type").and_then(Value::as_str) != Some("text"))
    });
    if has_non_text {
        return;
    }
    let texts: Vec<&str> =
        items.iter().filter_map(|item| item.get("text").and_then(Value::as_str)).collect();
    let joined = texts.join("\n");
    message.insert("content".into(), Value::String(joined));
}

/// `_postprocess_messages`: parse assistant tool-call arguments, drop empty
/// tool-call lists.
pub(crate) fn postprocess_tool_calls(conversation: &mut [Object]) -> Result<()> {
    for message in conversation.iter_mut() {
        if message.get("role").and_then(Value::as_str) != Some("assistant") {
            continue;
        }
        let Some(Value::Array(calls)) = message.get_mut("tool_calls") else {
            continue;
        };
        if calls.is_empty() {
            message.shift_remove("tool_calls");
            continue;
        }
        for call in calls.iter_mut() {
            let Value::Object(call) = call else {
                return Err(invalid("assistant tool_calls entries must be objects."));
            };
            let is_function = match call.get("type") {
                None => true,
                Some(t) => t.as_str() == Some("function"),
            };
            let Some(Value::Object(function)) = call.get_mut("function").filter(|_| is_function)
            else {
                return Err(invalid(
                    "chat completions only support assistant tool_calls of type 'function'.",
                ));
            };
            let parsed = parse_arguments(function.get("arguments"));
            function.insert("arguments".into(), parsed);
        }
    }
    Ok(())
}

/// One tool call's `arguments`: an object as is; a JSON string parsed, kept
/// only if it is an object; anything falsy or else `{}`.
fn parse_arguments(arguments: Option<&Value>) -> Value {
    let empty = || Value::Object(Object::new());
    let Some(arguments) = arguments.filter(|a| is_truthy(a)) else {
        return empty();
    };
    let parsed = match arguments {
        Value::String(s) => serde_json::from_str::<Value>(s).ok(),
        other => Some(other.clone()),
    };
    match parsed {
        Some(v @ Value::Object(_)) => v,
        _ => empty(),
    }
}

/// Python truthiness of a JSON value.
pub(crate) fn is_truthy(value: &Value) -> bool {
    match value {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64().is_some_and(|f| f != 0.0),
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
    }
}

/// `_convert_developer_to_system`: developer messages become system ones
/// (their `tools` dropped). Returns whether any was converted.
pub(crate) fn developer_to_system(conversation: &mut [Object]) -> bool {
    let mut converted = false;
    for message in conversation.iter_mut() {
        if message.get("role").and_then(Value::as_str) == Some("developer") {
            message.insert("role".into(), Value::String("system".into()));
            message.shift_remove("tools");
            converted = true;
        }
    }
    converted
}

/// `_consolidate_system_messages`: if a system message is not first, or
/// there are several, merge their non-empty texts with `"\n\n"` into one
/// system message at position 0.
pub(crate) fn consolidate_system_messages(conversation: Vec<Object>) -> Vec<Object> {
    let mut texts: Vec<String> = Vec::new();
    let mut others: Vec<Object> = Vec::with_capacity(conversation.len());
    let mut needed = false;
    for (i, message) in conversation.iter().enumerate() {
        if message.get("role").and_then(Value::as_str) != Some("system") {
            others.push(message.clone());
            continue;
        }
        if i > 0 || !texts.is_empty() {
            needed = true;
        }
        let text = match message.get("content") {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Array(parts)) => parts
                .iter()
                .filter_map(|p| match p {
                    Value::String(s) => Some(s.clone()),
                    Value::Object(o) => o.get("text").map(|t| match t {
                        Value::String(s) => s.clone(),
                        other => other.to_string(),
                    }),
                    _ => None,
                })
                .collect::<Vec<_>>()
                .join("\n"),
            _ => String::new(),
        };
        if !text.is_empty() {
            texts.push(text);
        }
    }
    if !needed {
        return conversation;
    }
    let mut merged = Object::new();
    merged.insert("role".into(), Value::String("system".into()));
    merged.insert("content".into(), Value::String(texts.join("\n\n")));
    let mut out = Vec::with_capacity(others.len() + 1);
    out.push(merged);
    out.extend(others);
    out
}

/// `ChatCompletionToolsParam.model_dump()`: `{"type": "function",
/// "function": {"name", "description", "parameters"[, "strict"]
/// [, "defer_loading"]}[, "defer_loading"]}`; unknown keys dropped,
/// `description`/`parameters` null when absent.
pub(crate) fn normalize_tools(tools: &[Value]) -> Result<Vec<Value>> {
    tools.iter().map(normalize_tool).collect()
}

fn normalize_tool(tool: &Value) -> Result<Value> {
    let Value::Object(tool) = tool else {
        return Err(invalid("tools: each tool must be an object"));
    };
    match tool.get("type") {
        None => {}
        Some(Value::String(t)) if t == "function" => {}
        Some(_) => return Err(invalid("tools: only type 'function' is supported")),
    }
    let Some(Value::Object(function)) = tool.get("function") else {
        return Err(invalid("tools: each tool needs a `function` object"));
    };
    let Some(Value::String(name)) = function.get("name") else {
        return Err(invalid("tools: function.name must be a string"));
    };
    let optional = |key: &str, ok: fn(&Value) -> bool| -> Result<Value> {
        match function.get(key) {
            None => Ok(Value::Null),
            Some(v) if v.is_null() || ok(v) => Ok(v.clone()),
            Some(_) => Err(invalid(format!("tools: function.{key} has the wrong type"))),
        }
    };
    let description = optional("description", Value::is_string)?;
    let parameters = optional("parameters", Value::is_object)?;
    let strict = optional("strict", Value::is_boolean)?;
    let mut function_defer = optional("defer_loading", Value::is_boolean)?;
    let tool_defer = match tool.get("defer_loading") {
        None | Some(Value::Null) => Value::Null,
        Some(v @ Value::Bool(_)) => v.clone(),
        Some(_) => return Err(invalid("tools: defer_loading must be a boolean")),
    };
    if function_defer.is_null() && !tool_defer.is_null() {
        function_defer = tool_defer.clone();
    }
    let mut f = Object::new();
    f.insert("name".into(), Value::String(name.clone()));
    f.insert("description".into(), description);
    f.insert("parameters".into(), parameters);
    if !strict.is_null() {
        f.insert("strict".into(), strict);
    }
    if !function_defer.is_null() {
        f.insert("defer_loading".into(), function_defer);
    }
    let mut out = Object::new();
    out.insert("type".into(), Value::String("function".into()));
    out.insert("function".into(), Value::Object(f));
    if !tool_defer.is_null() {
        out.insert("defer_loading".into(), tool_defer);
    }
    Ok(Value::Object(out))
}

/// `merge_kwargs`: `overrides` win over `defaults`, except their null and
/// `"auto"` values, which are dropped.
pub(crate) fn merge_kwargs(defaults: Object, overrides: Object) -> Object {
    let mut out = defaults;
    for (key, value) in overrides {
        if value.is_null() || value.as_str() == Some("auto") {
            continue;
        }
        out.insert(key, value);
    }
    out
}

/// The named parameters of transformers' `apply_chat_template` (5.20,
/// `PythonBackend`); vLLM always accepts them as kwargs
/// (`_get_hf_base_chat_template_params`).
pub(crate) const HF_CHAT_PARAMS: [&str; 17] = [
    "self",
    "conversation",
    "tools",
    "documents",
    "chat_template",
    "add_generation_prompt",
    "continue_final_message",
    "tokenize",
    "sanitize_control_tokens",
    "padding",
    "truncation",
    "max_length",
    "return_tensors",
    "return_dict",
    "return_assistant_tokens_mask",
    "tokenizer_kwargs",
    // Not in the signature, but what `render(messages=...)` receives.
    "messages",
];

/// The template kwargs after vLLM's merging and filtering, split the way
/// `apply_chat_template` consumes them.
#[derive(Debug, Default)]
pub(crate) struct TemplateKwargs {
    /// `tools` (after request/kwargs merging), not yet validated.
    pub tools: Option<Value>,
    /// `documents` from the kwargs.
    pub documents: Option<Value>,
    /// `add_generation_prompt`.
    pub add_generation_prompt: bool,
    /// `continue_final_message`.
    pub continue_final_message: bool,
    /// Everything else that reaches the template as a variable.
    pub variables: Object,
}

impl TemplateKwargs {
    /// `resolve_chat_template_kwargs` + `apply_chat_template`'s parameter
    /// binding: keeps keys the template reads or HF names, and rejects the
    /// combinations transformers rejects.
    pub(crate) fn resolve(
        kwargs: Object,
        uses_variable: impl Fn(&str) -> bool,
    ) -> Result<TemplateKwargs> {
        let mut out = TemplateKwargs::default();
        for (key, value) in kwargs {
            let is_hf_param = HF_CHAT_PARAMS.contains(&key.as_str()) && key != "messages";
            if !is_hf_param && !uses_variable(&key) {
                continue;
            }
            match key.as_str() {
                "tools" => out.tools = Some(value).filter(|v| !v.is_null()),
                "documents" => out.documents = Some(value).filter(|v| !v.is_null()),
                "add_generation_prompt" => out.add_generation_prompt = is_truthy(&value),
                "continue_final_message" => out.continue_final_message = is_truthy(&value),
                "sanitize_control_tokens" | "return_assistant_tokens_mask" if is_truthy(&value) => {
                    return Err(invalid(format!("`{key}=True` requires `tokenize=True`")));
                }
                "self" | "conversation" | "messages" => {
                    return Err(invalid(format!(
                        "chat_template_kwargs: got multiple values for argument '{key}'"
                    )));
                }
                k if HF_CHAT_PARAMS.contains(&k) => {}
                _ => {
                    out.variables.insert(key, value);
                }
            }
        }
        Ok(out)
    }
}

/// transformers' `render_jinja_template` check on `documents`: each entry
/// must be a dict.
pub(crate) fn validate_documents(documents: &Value) -> Result<()> {
    require_list_of_dicts(
        documents,
        "Documents should be a list of dicts with 'title' and 'text' keys!",
    )
}

/// transformers' check on `tools`: each entry must be a JSON schema (dict).
pub(crate) fn validate_tools(tools: &Value) -> Result<()> {
    require_list_of_dicts(
        tools,
        "Tools should either be a JSON schema, or a callable function with type hints \
         and a docstring suitable for auto-conversion to a schema.",
    )
}

/// Python's truthiness decides what transformers checks: an empty dict or
/// string passes as "no value"; otherwise every entry must be a dict.
fn require_list_of_dicts(value: &Value, message: &str) -> Result<()> {
    let ok = match value {
        Value::Array(items) => items.iter().all(Value::is_object),
        Value::Object(map) => map.is_empty(),
        Value::String(s) => s.is_empty(),
        _ => false,
    };
    if ok {
        Ok(())
    } else {
        Err(invalid(message))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(v: Value) -> Object {
        match v {
            Value::Object(o) => o,
            _ => panic!("not an object"),
        }
    }

    #[test]
    fn string_format_joins_text_parts() {
        let m = json!({"role": "user", "content": [
            {"type": "text", "text": "a"}, {"type": "text", "text": ""}, "b",
            {"type": "text", "text": null}, {"type": "input_text", "text": "c"}]});
        let parsed = parse_message(&obj(m.clone()), ContentFormat::String).unwrap();
        assert_eq!(parsed["content"], json!("a\nb\nc"));
        let null =
            parse_message(&obj(json!({"role": "user", "content": null})), ContentFormat::String)
                .unwrap();
        assert_eq!(null["content"], json!(""));
    }

    #[test]
    fn openai_format_wraps_strings_and_keeps_empty_parts_and_extra_keys() {
        let m =
            json!({"role": "user", "content": [{"type": "text", "text": "", "cache_control": 1}]});
        let parsed = parse_message(&obj(m), ContentFormat::OpenAi).unwrap();
        assert_eq!(parsed["content"], json!([{"type": "text", "text": "", "cache_control": 1}]));
        let s = parse_message(&obj(json!({"role": "user", "content": "x"})), ContentFormat::OpenAi)
            .unwrap();
        assert_eq!(s["content"], json!([{"type": "text", "text": "x"}]));
    }

    #[test]
    fn only_known_fields_are_kept() {
        let m = json!({"role": "assistant", "content": "x", "weird": 1, "name": "bob",
                       "reasoning": "r", "reasoning_content": "ignored", "tool_calls": null});
        let parsed = parse_message(&obj(m.clone()), ContentFormat::String).unwrap();
        assert_eq!(
            Value::Object(parsed),
            json!({"role": "assistant", "content": "x", "reasoning": "r", "reasoning_content": "r", "name": "bob"})
        );
        let dev = parse_message(
            &obj(json!({"role": "developer", "content": "d"})),
            ContentFormat::String,
        )
        .unwrap();
        assert_eq!(dev["tools"], Value::Null);
    }

    #[test]
    fn media_parts_are_unsupported_and_unknown_parts_invalid() {
        let img =
            json!({"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]});
        assert!(matches!(
            parse_message(&obj(img.clone()), ContentFormat::String),
            Err(TokenizeError::Unsupported(_))
        ));
        let bad = json!({"role": "user", "content": [{"type": "bogus"}]});
        assert!(matches!(
            parse_message(&obj(bad.clone()), ContentFormat::String),
            Err(TokenizeError::InvalidRequest(_))
        ));
        let no_role = json!({"content": "x"});
        assert!(parse_message(&obj(no_role.clone()), ContentFormat::String).is_err());
    }

    #[test]
    fn billing_header_is_stripped_from_system_text() {
        let parts = vec![
            json!({"type": "text", "text": "x-anthropic-billing-header: a=1\nkeep"}),
            json!("x-anthropic-billing-header only"),
        ];
        assert_eq!(strip_billing_header(parts), vec![json!({"type": "text", "text": "keep"})]);
    }

    #[test]
    fn tool_messages_are_flattened() {
        let m = json!({"role": "tool", "tool_call_id": "1", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]});
        let parsed = parse_message(&obj(m.clone()), ContentFormat::OpenAi).unwrap();
        assert_eq!(parsed["content"], json!("a\nb"));
        assert_eq!(parsed["tool_call_id"], json!("1"));
    }

    #[test]
    fn tool_call_arguments_are_parsed() {
        let mut conv = vec![
            obj(json!({"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "a", "arguments": "{\"x\": 1}"}},
            {"function": {"name": "b", "arguments": "not json"}},
            {"function": {"name": "c", "arguments": "[1]"}},
            {"function": {"name": "d", "arguments": ""}},
            {"function": {"name": "e", "arguments": {"y": 2}}}]})),
            obj(json!({"role": "assistant", "content": "", "tool_calls": []})),
        ];
        postprocess_tool_calls(&mut conv).unwrap();
        let args: Vec<&Value> = conv[0]["tool_calls"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| &c["function"]["arguments"])
            .collect();
        assert_eq!(args, [&json!({"x": 1}), &json!({}), &json!({}), &json!({}), &json!({"y": 2})]);
        assert!(!conv[1].contains_key("tool_calls"));
        let mut bad = vec![obj(
            json!({"role": "assistant", "tool_calls": [{"type": "custom", "custom": {}}]}),
        )];
        assert!(postprocess_tool_calls(&mut bad).is_err());
    }

    #[test]
    fn developer_becomes_system_and_systems_merge() {
        let mut conv = vec![
            obj(json!({"role": "system", "content": ""})),
            obj(json!({"role": "user", "content": "u"})),
            obj(json!({"role": "developer", "content": "d", "tools": null})),
            obj(
                json!({"role": "system", "content": [{"type": "text", "text": "s1"}, {"type": "text", "text": "s2"}]}),
            ),
        ];
        assert!(developer_to_system(&mut conv));
        let merged = consolidate_system_messages(conv);
        assert_eq!(merged.len(), 2);
        assert_eq!(
            Value::Object(merged[0].clone()),
            json!({"role": "system", "content": "d\n\ns1\ns2"})
        );
        let single = vec![
            obj(json!({"role": "system", "content": "s", "name": "n"})),
            obj(json!({"role": "user", "content": "u"})),
        ];
        assert_eq!(consolidate_system_messages(single.clone()), single);
    }

    #[test]
    fn tools_are_normalized_like_pydantic() {
        let tools = vec![
            json!({"function": {"name": "f", "x-extra": true}, "type": "function", "defer_loading": true}),
        ];
        assert_eq!(
            normalize_tools(&tools).unwrap(),
            vec![
                json!({"type": "function", "function": {"name": "f", "description": null, "parameters": null, "defer_loading": true}, "defer_loading": true})
            ]
        );
        assert!(normalize_tools(&[json!({"type": "function"})]).is_err());
    }

    #[test]
    fn kwargs_merge_and_filter() {
        let merged = merge_kwargs(
            obj(json!({"a": 1, "b": 2})),
            obj(json!({"b": null, "c": "auto", "d": 4})),
        );
        assert_eq!(Value::Object(merged), json!({"a": 1, "b": 2, "d": 4}));
        let kwargs = obj(
            json!({"enable_thinking": false, "unused": 1, "documents": [], "padding": true, "add_generation_prompt": true}),
        );
        let resolved = TemplateKwargs::resolve(kwargs, |v| v == "enable_thinking").unwrap();
        assert_eq!(Value::Object(resolved.variables), json!({"enable_thinking": false}));
        assert_eq!(resolved.documents, Some(json!([])));
        assert!(resolved.add_generation_prompt);
        assert!(TemplateKwargs::resolve(obj(json!({"messages": []})), |_| true).is_err());
    }

    #[test]
    fn documents_and_tools_must_be_dicts() {
        assert!(validate_documents(&json!([{"title": "t"}])).is_ok());
        assert!(validate_documents(&json!(["x"])).is_err());
        assert!(validate_tools(&json!([1])).is_err());
    }
}
