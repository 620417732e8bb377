//! OpenAI Responses requests (`POST /v1/responses`) as the chat request
//! vLLM 0.33 renders for them.
//!
//! vLLM renders a Responses request with its chat renderer: it validates the
//! body (`ResponsesRequest` in `entrypoints/openai/responses/protocol.py`),
//! turns `instructions` and `input` into chat messages
//! (`construct_input_messages` in `responses/utils.py`), the function tools
//! into chat tools (`construct_tool_dicts`), and reads the template flags
//! from the request (`ResponsesRequest.build_chat_params`: a last input item
//! still in progress is continued, `reasoning.effort` becomes
//! `reasoning_effort`). [`responses_to_chat`] does the same for a request
//! without `previous_response_id`; a continued turn's history lives only in
//! the engine that answered the previous one, so the gateway cannot render it.
//!
//! Content kvgate cannot render (images, files, audio) is refused with
//! [`TokenizeError::Unsupported`], as are tool kinds whose conversion it does
//! not implement (namespace and custom tools); what vLLM's request model or
//! conversion refuses is [`TokenizeError::InvalidRequest`].

use serde_json::{Map, Value};

use crate::error::{Result, TokenizeError};
use crate::request::{ChatRequest, Endpoint};

type Object = Map<String, Value>;

/// `ReasoningEffort` of the OpenAI types vLLM validates with.
const EFFORTS: [&str; 7] = ["none", "minimal", "low", "medium", "high", "xhigh", "max"];

/// Message roles an input item may have (`EasyInputMessageParam`).
const ROLES: [&str; 4] = ["user", "assistant", "system", "developer"];

/// Responses tool types vLLM accepts but never shows the model (built-in
/// tools run by a tool server kvgate's engines do not have).
const HIDDEN_TOOLS: [&str; 10] = [
    "file_search",
    "web_search",
    "web_search_preview",
    "web_search_preview_2025_03_11",
    "web_search_2025_08_26",
    "computer_use_preview",
    "mcp",
    "code_interpreter",
    "image_generation",
    "local_shell",
];

fn invalid(message: impl Into<String>) -> TokenizeError {
    TokenizeError::InvalidRequest(message.into())
}

fn unsupported(what: &str) -> TokenizeError {
    TokenizeError::Unsupported(format!(
        "{what} is not supported on /v1/responses through kvgate: it serves text models and \
         function tools only, and does not route what it cannot tokenize"
    ))
}

/// A `/v1/responses` `body` (without `previous_response_id`) as the chat
/// request vLLM renders for it.
pub fn responses_to_chat(body: &Object) -> Result<ChatRequest> {
    if !matches!(body.get("model"), None | Some(Value::Null | Value::String(_))) {
        return Err(invalid("`model` must be a string"));
    }
    if matches!(body.get("previous_response_id"), Some(Value::String(_))) {
        return Err(invalid(
            "previous_response_id: the conversation's history is held by the engine that \
             answered it and cannot be rendered here",
        ));
    }
    if body.get("previous_input_messages").is_some_and(|v| !v.is_null()) {
        return Err(unsupported("`previous_input_messages` (a Harmony history)"));
    }
    let instructions = match body.get("instructions") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.as_str()),
        Some(_) => return Err(invalid("`instructions` must be a string")),
    };
    let mut messages: Vec<Value> = Vec::new();
    if let Some(text) = instructions.filter(|t| !t.is_empty()) {
        messages.push(message("system", Value::String(text.into())));
    }
    let mut continue_final = false;
    match body.get("input") {
        Some(Value::String(s)) => messages.push(message("user", Value::String(s.clone()))),
        Some(Value::Array(items)) => {
            for (i, item) in items.iter().enumerate() {
                let Value::Object(item) = item else {
                    return Err(invalid(format!("input[{i}] must be an object")));
                };
                add_item(item, &format!("input[{i}]"), &mut messages)?;
            }
            continue_final = items.last().and_then(Value::as_object).is_some_and(is_partial);
        }
        _ => return Err(invalid("`input` is required and must be a string or a list of items")),
    }

    let mut chat = ChatRequest::new(messages);
    chat.endpoint = Endpoint::ChatCompletions;
    chat.add_generation_prompt = !continue_final;
    chat.continue_final_message = continue_final;
    // `ResponsesRequest.build_tok_params` leaves the tokenizer's special
    // tokens on (chat turns them off): a template that writes BOS gets a
    // second one, as in vLLM.
    chat.add_special_tokens = true;
    chat.chat_template_kwargs = match body.get("chat_template_kwargs") {
        None | Some(Value::Null) => None,
        Some(Value::Object(k)) => Some(k.clone()),
        Some(_) => return Err(invalid("`chat_template_kwargs` must be an object")),
    };
    if let Some(effort) = reasoning_effort(body.get("reasoning"))? {
        chat.extra.insert("reasoning_effort".into(), Value::String(effort.into()));
    }
    check_tool_choice(body.get("tool_choice"))?;
    chat.tools = chat_tools(body.get("tools"))?;
    Ok(chat)
}

fn message(role: &str, content: Value) -> Value {
    let mut m = Object::new();
    m.insert("role".into(), Value::String(role.into()));
    m.insert("content".into(), content);
    Value::Object(m)
}

fn str_field<'a>(item: &'a Object, key: &str, at: &str) -> Result<&'a str> {
    match item.get(key) {
        Some(Value::String(s)) => Ok(s),
        _ => Err(invalid(format!("{at}.{key} is required and must be a string"))),
    }
}

/// `should_continue_final_message`: the last item is a message or reasoning
/// still being written, so the model continues it instead of answering.
fn is_partial(item: &Object) -> bool {
    let kind = item.get("type").and_then(Value::as_str).unwrap_or("message");
    matches!(kind, "message" | "reasoning")
        && matches!(item.get("status").and_then(Value::as_str), Some("in_progress" | "incomplete"))
}

/// The last message, when it is the assistant's (items that continue an
/// assistant turn merge into it, as vLLM's conversion does).
fn last_assistant(messages: &mut [Value]) -> Option<&mut Object> {
    messages
        .last_mut()
        .and_then(Value::as_object_mut)
        .filter(|m| m.get("role").and_then(Value::as_str) == Some("assistant"))
}

/// `_construct_message_from_response_item` for one input item.
fn add_item(item: &Object, at: &str, messages: &mut Vec<Value>) -> Result<()> {
    let kind = match item.get("type") {
        None | Some(Value::Null) => None,
        Some(Value::String(t)) => Some(t.as_str()),
        Some(_) => return Err(invalid(format!("{at}.type must be a string"))),
    };
    match kind {
        Some("function_call") => {
            if item.get("namespace").is_some_and(|v| !v.is_null()) {
                return Err(unsupported("a namespaced function call"));
            }
            let mut function = Object::new();
            function.insert("name".into(), Value::String(str_field(item, "name", at)?.into()));
            function.insert(
                "arguments".into(),
                Value::String(str_field(item, "arguments", at)?.into()),
            );
            let mut call = Object::new();
            call.insert("id".into(), Value::String(str_field(item, "call_id", at)?.into()));
            call.insert("function".into(), Value::Object(function));
            call.insert("type".into(), Value::String("function".into()));
            let call = Value::Object(call);
            match last_assistant(messages) {
                Some(prev) => match prev.get_mut("tool_calls") {
                    Some(Value::Array(calls)) => calls.push(call),
                    _ => {
                        prev.insert("tool_calls".into(), Value::Array(vec![call]));
                    }
                },
                None => {
                    let mut m = Object::new();
                    m.insert("role".into(), Value::String("assistant".into()));
                    m.insert("tool_calls".into(), Value::Array(vec![call]));
                    messages.push(Value::Object(m));
                }
            }
            Ok(())
        }
        Some("function_call_output" | "custom_tool_call_output") => {
            let output = match item.get("output") {
                Some(v @ Value::String(_)) => v.clone(),
                Some(Value::Array(parts)) => Value::Array(check_parts(parts, at)?),
                _ => return Err(invalid(format!("{at}.output must be a string or a list"))),
            };
            let mut m = Object::new();
            m.insert("role".into(), Value::String("tool".into()));
            m.insert("content".into(), output);
            m.insert("tool_call_id".into(), Value::String(str_field(item, "call_id", at)?.into()));
            messages.push(Value::Object(m));
            Ok(())
        }
        Some("reasoning") => {
            if item
                .get("encrypted_content")
                .is_some_and(|v| v.as_str().is_some_and(|s| !s.is_empty()))
            {
                return Err(invalid("Encrypted content is not supported."));
            }
            let first_text = |key: &str| -> Option<String> {
                item.get(key)?.as_array()?.first()?.get("text")?.as_str().map(str::to_owned)
            };
            let text = first_text("content").or_else(|| first_text("summary")).unwrap_or_default();
            if let Some(prev) = last_assistant(messages) {
                if prev.get("reasoning").is_none_or(Value::is_null) {
                    prev.insert("reasoning".into(), Value::String(text));
                    return Ok(());
                }
            }
            let mut m = Object::new();
            m.insert("role".into(), Value::String("assistant".into()));
            m.insert("reasoning".into(), Value::String(text));
            messages.push(Value::Object(m));
            Ok(())
        }
        Some("custom_tool_call") => Err(unsupported("a custom tool call")),
        None | Some("message") => add_message(item, at, messages),
        Some(other) => Err(invalid(format!("Unsupported input item type: {other}"))),
    }
}

/// A message item: an assistant's text merges into the assistant turn it
/// continues; other roles become a chat message with their content parts.
fn add_message(item: &Object, at: &str, messages: &mut Vec<Value>) -> Result<()> {
    let role = match item.get("role").and_then(Value::as_str) {
        Some(r) if ROLES.contains(&r) => r,
        _ => {
            return Err(invalid(format!(
                "{at}.role must be one of 'user', 'assistant', 'system' or 'developer'"
            )))
        }
    };
    let content = match item.get("content") {
        Some(Value::String(s)) => Value::String(s.clone()),
        Some(Value::Array(parts)) => Value::Array(check_parts(parts, at)?),
        _ => return Err(invalid(format!("{at}.content must be a string or a list of parts"))),
    };
    if role == "assistant" {
        // Only the first part's text counts, as in vLLM's conversion.
        let text = match &content {
            Value::String(s) => Some(s.clone()),
            Value::Array(parts) => {
                parts.first().and_then(|p| p.get("text")).and_then(Value::as_str).map(str::to_owned)
            }
            _ => None,
        };
        if let Some(text) = text {
            if let Some(prev) = last_assistant(messages) {
                if prev.get("content").is_none_or(Value::is_null) {
                    prev.insert("content".into(), Value::String(text));
                    return Ok(());
                }
            }
            messages.push(message("assistant", Value::String(text)));
            return Ok(());
        }
    }
    let mut m = Object::new();
    m.insert("role".into(), Value::String(role.into()));
    m.insert("content".into(), content);
    if let Some(name) = item.get("name").filter(|v| v.is_string()) {
        m.insert("name".into(), name.clone());
    }
    messages.push(Value::Object(m));
    Ok(())
}

/// The content parts of a message or tool output as chat parts: text kinds
/// become `text` parts (vLLM's renderer reads `input_text` and
/// `output_text` as text; the chat request's validation knows only
/// `text`), media are refused (kvgate has no multimodal pool), anything
/// else is invalid.
fn check_parts(parts: &[Value], at: &str) -> Result<Vec<Value>> {
    let mut out = Vec::with_capacity(parts.len());
    for (i, part) in parts.iter().enumerate() {
        let kind = part.get("type").and_then(Value::as_str);
        match kind {
            Some("input_text" | "output_text" | "text") => match part.get("text") {
                Some(text @ Value::String(_)) => {
                    let mut p = Object::new();
                    p.insert("type".into(), Value::String("text".into()));
                    p.insert("text".into(), text.clone());
                    out.push(Value::Object(p));
                }
                _ => return Err(invalid(format!("{at}.content[{i}].text must be a string"))),
            },
            Some("refusal") => out.push(part.clone()),
            Some(media @ ("input_image" | "input_file" | "input_audio")) => {
                return Err(unsupported(&format!("{media} content ({at}.content[{i}])")))
            }
            Some(other) => {
                return Err(invalid(format!("{at}.content[{i}]: unknown content part {other:?}")))
            }
            None => return Err(invalid(format!("{at}.content[{i}].type is required"))),
        }
    }
    Ok(out)
}

/// `reasoning.effort`, which becomes the chat request's `reasoning_effort`.
fn reasoning_effort(reasoning: Option<&Value>) -> Result<Option<&'static str>> {
    let r = match reasoning {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Object(r)) => r,
        Some(_) => return Err(invalid("`reasoning` must be an object")),
    };
    match r.get("effort") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(e)) => match EFFORTS.iter().find(|x| **x == e) {
            Some(x) => Ok(Some(x)),
            None => Err(invalid(format!("reasoning.effort must be one of {}", EFFORTS.join(", ")))),
        },
        Some(_) => Err(invalid("reasoning.effort must be a string")),
    }
}

/// `tool_choice`, checked (vLLM does not let it change the prompt).
fn check_tool_choice(choice: Option<&Value>) -> Result<()> {
    match choice {
        None | Some(Value::Null) => Ok(()),
        Some(Value::String(c)) if matches!(c.as_str(), "auto" | "none" | "required") => Ok(()),
        Some(Value::Object(c)) if c.get("type").is_some_and(Value::is_string) => Ok(()),
        Some(_) => {
            Err(invalid("tool_choice must be 'auto', 'none', 'required' or an object with a type"))
        }
    }
}

/// `construct_tool_dicts`: function tools as chat tools, in request order;
/// built-in tools are never shown to the model.
fn chat_tools(tools: Option<&Value>) -> Result<Option<Vec<Value>>> {
    let tools = match tools {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Array(t)) => t,
        Some(_) => return Err(invalid("`tools` must be a list")),
    };
    if tools.is_empty() {
        return Ok(None);
    }
    let mut out = Vec::new();
    for (i, tool) in tools.iter().enumerate() {
        let at = format!("tools[{i}]");
        let Value::Object(t) = tool else {
            return Err(invalid(format!("{at} must be an object")));
        };
        match t.get("type").and_then(Value::as_str) {
            Some("function") => {}
            Some(kind @ ("namespace" | "custom")) => {
                return Err(unsupported(&format!("a {kind} tool ({at})")))
            }
            Some(kind) if HIDDEN_TOOLS.contains(&kind) => continue,
            _ => return Err(invalid(format!("{at}.type is not a known tool type"))),
        }
        let mut f = Object::new();
        f.insert("name".into(), Value::String(str_field(t, "name", &at)?.into()));
        for key in ["description", "parameters", "strict", "defer_loading"] {
            if let Some(v) = t.get(key) {
                f.insert(key.into(), v.clone());
            }
        }
        let mut chat_tool = Object::new();
        chat_tool.insert("type".into(), Value::String("function".into()));
        chat_tool.insert("function".into(), Value::Object(f));
        out.push(Value::Object(chat_tool));
    }
    Ok(Some(out))
}

#[cfg(test)]
#[path = "responses/tests.rs"]
mod tests;
