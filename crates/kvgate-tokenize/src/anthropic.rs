//! Anthropic Messages requests (`POST /v1/messages`,
//! `/v1/messages/count_tokens`) as the chat request vLLM 0.33 renders for
//! them.
//!
//! vLLM does not render a Messages request itself: it validates it with
//! pydantic (`entrypoints/anthropic/protocol.py`), converts it to a chat
//! completion request (`AnthropicServingMessages.to_chat_completion_request`
//! in `entrypoints/anthropic/serving.py`) and hands that to the chat
//! renderer. [`messages_to_chat`] does the same two steps, so that the chat
//! path of this crate (`ChatTokenizer::render_chat` with
//! [`Endpoint::ChatCompletions`]) gives the engine's token ids. What the
//! conversion reads from the model's template (whether inline system
//! messages must be merged, which effort a disabled thinking maps to) is
//! [`MessagesRules`], computed once per tokenizer by the same probes vLLM
//! runs at start-up (`ChatTokenizer::messages_rules`).
//!
//! Content kvgate cannot render (images) is refused with
//! [`TokenizeError::Unsupported`]: the gateway has no multimodal pool to
//! send it to, and routing it blind would claim a cache match it cannot
//! know. Everything vLLM's request model rejects is
//! [`TokenizeError::InvalidRequest`].

use serde_json::{Map, Value};

use crate::error::{Result, TokenizeError};
use crate::preprocess::is_truthy;
use crate::request::{ChatRequest, Endpoint};
use crate::template::{json_to_value, py_str};

type Object = Map<String, Value>;

/// Which endpoint a Messages body came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MessagesEndpoint {
    /// `POST /v1/messages` (`AnthropicMessagesRequest`).
    Create,
    /// `POST /v1/messages/count_tokens` (`AnthropicCountTokensRequest`).
    CountTokens,
}

/// What vLLM's conversion takes from the served template (probed once at
/// start-up, see `ChatTokenizer::messages_rules`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MessagesRules {
    /// The template refuses a system message after the first one, so inline
    /// system messages are merged into the leading system prompt
    /// (`_should_merge_inline_system`).
    pub merge_inline_system: bool,
    /// The `reasoning_effort` that `thinking: {"type": "disabled"}` becomes:
    /// `"none"`, or `"low"` where the template ignores `"none"`
    /// (`DisabledThinkingEffortResolver`).
    pub disabled_thinking_effort: &'static str,
}

impl Default for MessagesRules {
    fn default() -> Self {
        MessagesRules { merge_inline_system: false, disabled_thinking_effort: "none" }
    }
}

/// The efforts vLLM's probe compares with `"none"` (`AnthropicEffort`).
pub(crate) const EFFORTS: [&str; 5] = ["low", "medium", "high", "xhigh", "max"];

/// Claude Code's per-request attribution header: system text blocks that
/// start with it are dropped (it would defeat prefix caching).
const BILLING_HEADER: &str = "x-anthropic-billing-header";

const BLOCK_TYPES: [&str; 9] = [
    "text",
    "image",
    "tool_use",
    "tool_result",
    "tool_reference",
    "thinking",
    "redacted_thinking",
    "tool_addition",
    "tool_removal",
];

fn invalid(message: impl Into<String>) -> TokenizeError {
    TokenizeError::InvalidRequest(message.into())
}

fn no_images(at: &str) -> TokenizeError {
    TokenizeError::Unsupported(format!(
        "image content ({at}) needs a multimodal model; kvgate serves /v1/messages for text \
         models only and does not route images blind"
    ))
}

/// `/v1/messages` or `/v1/messages/count_tokens` `body` as the chat
/// request vLLM renders for it. `now_unix` stands in for vLLM's clock in
/// the one place the conversion reads it (the id of a `tool_use` block
/// that has none).
pub fn messages_to_chat(
    body: &Map<String, Value>,
    endpoint: MessagesEndpoint,
    rules: &MessagesRules,
    now_unix: u64,
) -> Result<ChatRequest> {
    match body.get("model") {
        Some(Value::String(m)) if !m.is_empty() => {}
        Some(Value::String(_)) => return Err(invalid("Model is required")),
        _ => return Err(invalid("`model` is required and must be a string")),
    }
    let messages = match body.get("messages") {
        Some(Value::Array(messages)) => messages
            .iter()
            .enumerate()
            .map(|(i, m)| Message::parse(m, i))
            .collect::<Result<Vec<_>>>()?,
        _ => return Err(invalid("`messages` is required and must be a list")),
    };
    let system = match body.get("system") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(Content::Text(s.clone())),
        Some(Value::Array(blocks)) => {
            let blocks = parse_blocks(blocks, "system")?;
            reject_tool_changes(&blocks)?;
            Some(Content::Blocks(blocks))
        }
        Some(_) => return Err(invalid("`system` must be a string or a list of content blocks")),
    };
    let tools = match body.get("tools") {
        None | Some(Value::Null) => None,
        Some(Value::Array(tools)) => Some(
            tools
                .iter()
                .enumerate()
                .map(|(i, t)| Tool::parse(t, &format!("tools[{i}]")))
                .collect::<Result<Vec<_>>>()?,
        ),
        Some(_) => return Err(invalid("`tools` must be a list")),
    };
    check_tool_choice(body.get("tool_choice"))?;
    let chat_template_kwargs = match body.get("chat_template_kwargs") {
        None | Some(Value::Null) => None,
        Some(Value::Object(k)) => Some(k.clone()),
        Some(_) => return Err(invalid("`chat_template_kwargs` must be an object")),
    };
    let thinking = Thinking::parse(body.get("thinking"))?;
    let effort = output_effort(body.get("output_config"))?;
    if endpoint == MessagesEndpoint::Create {
        let max_tokens = match body.get("max_tokens") {
            Some(Value::Number(n)) => {
                n.as_i64().ok_or_else(|| invalid("`max_tokens` must be an integer"))?
            }
            _ => return Err(invalid("`max_tokens` is required and must be an integer")),
        };
        if max_tokens <= 0 {
            return Err(invalid("max_tokens must be positive"));
        }
        let remote_decode = body
            .get("kv_transfer_params")
            .and_then(|k| k.get("do_remote_decode"))
            .is_some_and(is_truthy);
        if let Thinking::Enabled { budget_tokens } = thinking {
            if !remote_decode && budget_tokens >= max_tokens {
                return Err(invalid("thinking.budget_tokens must be less than max_tokens"));
            }
        }
        if !matches!(body.get("stream"), None | Some(Value::Null | Value::Bool(_))) {
            return Err(invalid("`stream` must be a boolean"));
        }
    }

    // _convert_system_message, then _convert_messages.
    let mut out: Vec<Value> = Vec::new();
    let mut system_parts: Vec<String> = Vec::new();
    match &system {
        Some(Content::Text(s)) if !s.is_empty() => system_parts.push(s.clone()),
        Some(Content::Blocks(blocks)) => {
            for b in blocks {
                if let Some(text) = b.text.as_deref().filter(|t| b.kind == "text" && !t.is_empty())
                {
                    if !text.starts_with(BILLING_HEADER) {
                        system_parts.push(text.to_owned());
                    }
                }
            }
        }
        _ => {}
    }
    if rules.merge_inline_system {
        for m in messages.iter().filter(|m| m.role == "system") {
            if let Some(text) = m.system_text() {
                system_parts.push(text);
            }
        }
    }
    if !system_parts.is_empty() {
        out.push(chat_message("system", Value::String(system_parts.concat())));
    }
    for m in &messages {
        if m.role == "system" {
            if !rules.merge_inline_system {
                if let Some(text) = m.system_text() {
                    out.push(chat_message("system", Value::String(text)));
                }
            }
            continue;
        }
        let mut msg = Object::new();
        msg.insert("role".into(), Value::String(m.role.clone()));
        match &m.content {
            Content::Text(s) => {
                msg.insert("content".into(), Value::String(s.clone()));
            }
            Content::Blocks(blocks) => {
                convert_blocks(blocks, &m.role, &mut msg, &mut out, now_unix)?
            }
        }
        // A user message left without content (only tool results) is dropped.
        if m.role != "user" || msg.contains_key("content") {
            out.push(Value::Object(msg));
        }
    }

    let mut chat = ChatRequest::new(out);
    chat.endpoint = Endpoint::ChatCompletions;
    chat.chat_template_kwargs = chat_template_kwargs;
    // _handle_output_config, then _handle_thinking (which wins).
    let effort = match thinking {
        Thinking::Disabled => Some(rules.disabled_thinking_effort),
        _ => effort,
    };
    if let Some(effort) = effort {
        chat.extra.insert("reasoning_effort".into(), Value::String(effort.to_owned()));
    }
    if let Some(tools) = resolve_tools(tools, &messages)? {
        chat.tools = Some(tools.iter().map(Tool::to_chat).collect());
    }
    Ok(chat)
}

fn chat_message(role: &str, content: Value) -> Value {
    let mut m = Object::new();
    m.insert("role".into(), Value::String(role.into()));
    m.insert("content".into(), content);
    Value::Object(m)
}

/// A message's or the system prompt's content.
#[derive(Debug)]
enum Content {
    Text(String),
    Blocks(Vec<Block>),
}

/// One `AnthropicMessage`.
#[derive(Debug)]
struct Message {
    role: String,
    content: Content,
}

impl Message {
    fn parse(value: &Value, i: usize) -> Result<Message> {
        let at = format!("messages[{i}]");
        let Value::Object(m) = value else {
            return Err(invalid(format!("{at} must be an object")));
        };
        let role = match m.get("role").and_then(Value::as_str) {
            Some(r @ ("user" | "assistant" | "system")) => r.to_owned(),
            _ => {
                return Err(invalid(format!(
                    "{at}.role must be one of 'user', 'assistant' or 'system'"
                )))
            }
        };
        let content = match m.get("content") {
            Some(Value::String(s)) => Content::Text(s.clone()),
            Some(Value::Array(blocks)) => {
                let blocks = parse_blocks(blocks, &format!("{at}.content"))?;
                if role != "system" {
                    reject_tool_changes(&blocks)?;
                }
                Content::Blocks(blocks)
            }
            _ => {
                return Err(invalid(format!(
                    "{at}.content must be a string or a list of content blocks"
                )))
            }
        };
        Ok(Message { role, content })
    }

    /// `_extract_system_text`: the text of a system message, billing
    /// headers dropped; `None` when nothing is left.
    fn system_text(&self) -> Option<String> {
        match &self.content {
            Content::Text(s) if s.starts_with(BILLING_HEADER) || s.is_empty() => None,
            Content::Text(s) => Some(s.clone()),
            Content::Blocks(blocks) => {
                let parts: Vec<&str> = blocks
                    .iter()
                    .filter(|b| b.kind == "text")
                    .filter_map(|b| b.text.as_deref())
                    .filter(|t| !t.is_empty() && !t.starts_with(BILLING_HEADER))
                    .collect();
                let text = parts.concat();
                (!text.is_empty()).then_some(text)
            }
        }
    }
}

/// One `AnthropicContentBlock`, with the fields the conversion reads.
#[derive(Debug)]
struct Block {
    kind: String,
    text: Option<String>,
    source: Option<Object>,
    id: Option<String>,
    tool_use_id: Option<String>,
    name: Option<String>,
    input: Option<Object>,
    content: Option<Value>,
    thinking: Option<String>,
    /// The tool a `tool_addition` / `tool_removal` block names or defines.
    tool: Option<ToolChange>,
}

#[derive(Debug)]
enum ToolChange {
    Reference(String),
    Definition(Tool),
}

fn opt_str(b: &Object, key: &str, at: &str) -> Result<Option<String>> {
    match b.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(invalid(format!("{at}.{key} must be a string"))),
    }
}

fn opt_object(b: &Object, key: &str, at: &str) -> Result<Option<Object>> {
    match b.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Object(o)) => Ok(Some(o.clone())),
        Some(_) => Err(invalid(format!("{at}.{key} must be an object"))),
    }
}

fn opt_bool(b: &Object, key: &str, at: &str) -> Result<Option<bool>> {
    match b.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(v)) => Ok(Some(*v)),
        Some(_) => Err(invalid(format!("{at}.{key} must be a boolean"))),
    }
}

fn parse_blocks(blocks: &[Value], at: &str) -> Result<Vec<Block>> {
    blocks.iter().enumerate().map(|(i, b)| Block::parse(b, &format!("{at}[{i}]"))).collect()
}

impl Block {
    fn parse(value: &Value, at: &str) -> Result<Block> {
        let Value::Object(b) = value else {
            return Err(invalid(format!("{at} must be an object")));
        };
        let kind = match b.get("type").and_then(Value::as_str) {
            Some(t) if BLOCK_TYPES.contains(&t) => t.to_owned(),
            Some(t) => {
                return Err(invalid(format!(
                    "{at}: unknown content block type {t:?} (vLLM 0.33 takes {})",
                    BLOCK_TYPES.join(", ")
                )))
            }
            None => return Err(invalid(format!("{at}.type is required"))),
        };
        let content = match b.get("content") {
            None | Some(Value::Null) => None,
            Some(v @ Value::String(_)) => Some(v.clone()),
            Some(Value::Array(items)) if items.iter().all(Value::is_object) => {
                Some(Value::Array(items.clone()))
            }
            Some(_) => {
                return Err(invalid(format!("{at}.content must be a string or a list of objects")))
            }
        };
        opt_bool(b, "is_error", at)?;
        for key in ["tool_name", "signature", "data"] {
            opt_str(b, key, at)?;
        }
        let tool = match b.get("tool") {
            None | Some(Value::Null) => None,
            Some(Value::Object(t)) => Some(ToolChange::parse(t, &format!("{at}.tool"))?),
            Some(_) => return Err(invalid(format!("{at}.tool must be an object"))),
        };
        let is_change = kind == "tool_addition" || kind == "tool_removal";
        match (&tool, is_change) {
            (None, true) => return Err(invalid(format!("tool is required for {kind} blocks"))),
            (Some(ToolChange::Definition(_)), true) if kind == "tool_removal" => {
                return Err(invalid("tool_removal only accepts a tool_reference"))
            }
            _ => {}
        }
        Ok(Block {
            text: opt_str(b, "text", at)?,
            source: opt_object(b, "source", at)?,
            id: opt_str(b, "id", at)?,
            tool_use_id: opt_str(b, "tool_use_id", at)?,
            name: opt_str(b, "name", at)?,
            input: opt_object(b, "input", at)?,
            content,
            thinking: opt_str(b, "thinking", at)?,
            tool,
            kind,
        })
    }
}

impl ToolChange {
    fn parse(t: &Object, at: &str) -> Result<ToolChange> {
        match t.get("type").and_then(Value::as_str) {
            Some("tool_reference") => match t.get("name") {
                Some(Value::String(n)) => Ok(ToolChange::Reference(n.clone())),
                _ => Err(invalid(format!("{at}.name must be a string"))),
            },
            Some("tool_definition") => match t.get("definition") {
                Some(d) => Ok(ToolChange::Definition(Tool::parse(d, &format!("{at}.definition"))?)),
                None => Err(invalid(format!("{at}.definition is required"))),
            },
            _ => Err(invalid(format!("{at}.type must be 'tool_reference' or 'tool_definition'"))),
        }
    }
}

/// `_reject_tool_changes`: tool changes live only in system messages.
fn reject_tool_changes(blocks: &[Block]) -> Result<()> {
    match blocks.iter().find(|b| b.kind == "tool_addition" || b.kind == "tool_removal") {
        Some(b) => Err(invalid(format!(
            "{} blocks are only allowed in messages with role \"system\"",
            b.kind
        ))),
        None => Ok(()),
    }
}

/// One `AnthropicTool`.
#[derive(Clone, Debug)]
struct Tool {
    name: String,
    description: Option<String>,
    input_schema: Object,
    strict: Option<bool>,
    defer_loading: Option<bool>,
}

impl Tool {
    fn parse(value: &Value, at: &str) -> Result<Tool> {
        let Value::Object(t) = value else {
            return Err(invalid(format!("{at} must be an object")));
        };
        let name = match t.get("name") {
            Some(Value::String(n)) => n.clone(),
            _ => return Err(invalid(format!("{at}.name is required and must be a string"))),
        };
        let mut input_schema = match t.get("input_schema") {
            Some(Value::Object(s)) => s.clone(),
            _ => {
                return Err(invalid(format!("{at}.input_schema is required and must be an object")))
            }
        };
        // `validate_input_schema`: a schema without a type is an object's
        // (the key lands last, as in the Python dict).
        if !input_schema.contains_key("type") {
            input_schema.insert("type".into(), Value::String("object".into()));
        }
        Ok(Tool {
            name,
            description: opt_str(t, "description", at)?,
            input_schema,
            strict: opt_bool(t, "strict", at)?,
            defer_loading: opt_bool(t, "defer_loading", at)?,
        })
    }

    /// `_convert_tools`: the chat tool vLLM builds from it.
    fn to_chat(&self) -> Value {
        let opt = |v: Option<bool>| v.map_or(Value::Null, Value::Bool);
        let mut f = Object::new();
        f.insert("name".into(), Value::String(self.name.clone()));
        f.insert("description".into(), self.description.clone().map_or(Value::Null, Value::String));
        f.insert("parameters".into(), Value::Object(self.input_schema.clone()));
        f.insert("strict".into(), opt(self.strict));
        f.insert("defer_loading".into(), opt(self.defer_loading));
        let mut t = Object::new();
        t.insert("type".into(), Value::String("function".into()));
        t.insert("function".into(), Value::Object(f));
        Value::Object(t)
    }
}

/// `_resolve_tools`: the tools in effect after the conversation's
/// `tool_addition` / `tool_removal` blocks (by name, in first-declared
/// order, as a Python dict keeps them); without such blocks, `tools` as
/// given.
fn resolve_tools(tools: Option<Vec<Tool>>, messages: &[Message]) -> Result<Option<Vec<Tool>>> {
    let changes: Vec<&Block> = messages
        .iter()
        .filter_map(|m| match &m.content {
            Content::Blocks(blocks) => Some(blocks),
            Content::Text(_) => None,
        })
        .flatten()
        .filter(|b| b.kind == "tool_addition" || b.kind == "tool_removal")
        .collect();
    if changes.is_empty() {
        return Ok(tools);
    }
    let tools = tools.unwrap_or_default();
    // Assigning to a name keeps its place, as in a Python dict.
    fn put(by_name: &mut Vec<(String, Tool)>, tool: Tool) {
        match by_name.iter_mut().find(|(n, _)| *n == tool.name) {
            Some(slot) => slot.1 = tool,
            None => by_name.push((tool.name.clone(), tool)),
        }
    }
    let mut by_name: Vec<(String, Tool)> = Vec::new();
    for t in tools {
        put(&mut by_name, t);
    }
    let mut removed: Vec<String> = Vec::new();
    for b in changes {
        let name = match &b.tool {
            Some(ToolChange::Definition(def)) => {
                put(&mut by_name, def.clone());
                def.name.clone()
            }
            Some(ToolChange::Reference(name)) => {
                let Some((_, tool)) = by_name.iter_mut().find(|(n, _)| n == name) else {
                    return Err(invalid(format!(
                        "{} references tool '{name}', which is not declared in tools",
                        b.kind
                    )));
                };
                if b.kind == "tool_addition" {
                    tool.defer_loading = None;
                }
                name.clone()
            }
            None => continue,
        };
        if b.kind == "tool_removal" {
            if !removed.contains(&name) {
                removed.push(name);
            }
        } else {
            removed.retain(|r| *r != name);
        }
    }
    Ok(Some(by_name.into_iter().filter(|(n, _)| !removed.contains(n)).map(|(_, t)| t).collect()))
}

/// `AnthropicToolChoice`, checked (it does not change the prompt).
fn check_tool_choice(choice: Option<&Value>) -> Result<()> {
    let c = match choice {
        None | Some(Value::Null) => return Ok(()),
        Some(Value::Object(c)) => c,
        Some(_) => return Err(invalid("`tool_choice` must be an object")),
    };
    let kind = match c.get("type").and_then(Value::as_str) {
        Some(k @ ("auto" | "any" | "tool" | "none")) => k,
        _ => return Err(invalid("tool_choice.type must be one of 'auto', 'any', 'tool', 'none'")),
    };
    let name = opt_str(c, "name", "tool_choice")?;
    opt_bool(c, "disable_parallel_tool_use", "tool_choice")?;
    if kind == "tool" && name.as_deref().is_none_or(str::is_empty) {
        return Err(invalid("tool_choice.name is required when type is 'tool'"));
    }
    Ok(())
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Thinking {
    None,
    Enabled { budget_tokens: i64 },
    Disabled,
    Adaptive,
}

impl Thinking {
    fn parse(value: Option<&Value>) -> Result<Thinking> {
        let t = match value {
            None | Some(Value::Null) => return Ok(Thinking::None),
            Some(Value::Object(t)) => t,
            Some(_) => return Err(invalid("`thinking` must be an object")),
        };
        match t.get("type").and_then(Value::as_str) {
            Some("enabled") => match t.get("budget_tokens").and_then(Value::as_i64) {
                Some(b) if b >= 1024 => Ok(Thinking::Enabled { budget_tokens: b }),
                _ => Err(invalid("thinking.budget_tokens must be an integer of at least 1024")),
            },
            Some("disabled") => Ok(Thinking::Disabled),
            Some("adaptive") => Ok(Thinking::Adaptive),
            _ => Err(invalid("thinking.type must be 'enabled', 'disabled' or 'adaptive'")),
        }
    }
}

/// `output_config.effort`, which becomes the chat request's
/// `reasoning_effort`.
fn output_effort(config: Option<&Value>) -> Result<Option<&'static str>> {
    let c = match config {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Object(c)) => c,
        Some(_) => return Err(invalid("`output_config` must be an object")),
    };
    match c.get("effort") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(e)) => match EFFORTS.iter().find(|x| **x == e) {
            Some(x) => Ok(Some(x)),
            None => {
                Err(invalid(format!("output_config.effort must be one of {}", EFFORTS.join(", "))))
            }
        },
        Some(_) => Err(invalid("output_config.effort must be a string")),
    }
}

/// `_convert_message_content` and `_convert_block`: a user or assistant
/// message's blocks into `msg`; a user's tool results go to `out` first,
/// as separate tool messages.
fn convert_blocks(
    blocks: &[Block],
    role: &str,
    msg: &mut Object,
    out: &mut Vec<Value>,
    now_unix: u64,
) -> Result<()> {
    let mut parts: Vec<Value> = Vec::new();
    let mut tool_calls: Vec<Value> = Vec::new();
    let mut reasoning: Vec<String> = Vec::new();
    for b in blocks {
        match b.kind.as_str() {
            "text" => {
                if let Some(text) = b.text.as_deref().filter(|t| !t.is_empty()) {
                    parts.push(text_part(text));
                }
            }
            "image" if b.source.as_ref().is_some_and(|s| !s.is_empty()) => {
                return Err(no_images("an image block"))
            }
            "thinking" => {
                if let Some(t) = &b.thinking {
                    reasoning.push(t.clone());
                }
            }
            "tool_use" => {
                let id = b.id.clone().filter(|i| !i.is_empty());
                let id = id.unwrap_or_else(|| format!("call_{now_unix}"));
                let input = b.input.clone().unwrap_or_default();
                // vLLM writes the input with json.dumps; the chat renderer
                // parses it back into the same object.
                let arguments =
                    serde_json::to_string(&input).map_err(|e| invalid(e.to_string()))?;
                let mut function = Object::new();
                function.insert("name".into(), Value::String(b.name.clone().unwrap_or_default()));
                function.insert("arguments".into(), Value::String(arguments));
                let mut call = Object::new();
                call.insert("id".into(), Value::String(id));
                call.insert("type".into(), Value::String("function".into()));
                call.insert("function".into(), Value::Object(function));
                tool_calls.push(Value::Object(call));
            }
            "tool_result" if role == "user" => user_tool_result(b, out)?,
            "tool_result" => {
                // `str(block.content)`: Python's str of a string or a list.
                let text = match &b.content {
                    None => String::new(),
                    Some(Value::String(s)) => s.clone(),
                    Some(Value::Array(items)) if items.is_empty() => String::new(),
                    Some(v) => py_str(&json_to_value(v)),
                };
                parts.push(text_part(&format!("Tool result: {text}")));
            }
            // Images without a source, redacted thinking, tool references
            // and tool changes add nothing to the message.
            _ => {}
        }
    }
    if !reasoning.is_empty() {
        msg.insert("reasoning".into(), Value::String(reasoning.concat()));
    }
    let has_calls = !tool_calls.is_empty();
    if has_calls {
        msg.insert("tool_calls".into(), Value::Array(tool_calls));
    }
    match parts.len() {
        0 => {}
        1 if parts[0].get("type").and_then(Value::as_str) == Some("text") => {
            let text = parts[0].get("text").cloned().unwrap_or(Value::Null);
            msg.insert("content".into(), text);
        }
        _ => {
            msg.insert("content".into(), Value::Array(parts));
        }
    }
    Ok(())
}

fn text_part(text: &str) -> Value {
    let mut p = Object::new();
    p.insert("type".into(), Value::String("text".into()));
    p.insert("text".into(), Value::String(text.into()));
    Value::Object(p)
}

/// `_convert_user_tool_result`: a tool message with the result's text, and
/// one more with its tool references.
fn user_tool_result(b: &Block, out: &mut Vec<Value>) -> Result<()> {
    let mut text = String::new();
    let mut references: Vec<Value> = Vec::new();
    match &b.content {
        Some(Value::String(s)) => text = s.clone(),
        Some(Value::Array(items)) => {
            let mut texts: Vec<String> = Vec::new();
            for item in items.iter().filter_map(Value::as_object) {
                match item.get("type").and_then(Value::as_str) {
                    Some("text") => match item.get("text") {
                        None => texts.push(String::new()),
                        Some(Value::String(t)) => texts.push(t.clone()),
                        Some(_) => return Err(invalid("tool_result text must be a string")),
                    },
                    Some("image") => return Err(no_images("an image in a tool_result")),
                    Some("tool_reference") => {
                        // `item.get("tool_name") or item.get("name")`.
                        let name = item
                            .get("tool_name")
                            .filter(|v| is_truthy(v))
                            .or_else(|| item.get("name"))
                            .filter(|v| is_truthy(v));
                        if let Some(name) = name {
                            let mut r = Object::new();
                            r.insert("type".into(), Value::String("tool_reference".into()));
                            r.insert("name".into(), name.clone());
                            references.push(Value::Object(r));
                        }
                    }
                    _ => {}
                }
            }
            text = texts.join("\n");
        }
        _ => {}
    }
    let call_id = Value::String(b.tool_use_id.clone().unwrap_or_default());
    let mut tool = Object::new();
    tool.insert("role".into(), Value::String("tool".into()));
    tool.insert("tool_call_id".into(), call_id.clone());
    tool.insert("content".into(), Value::String(text));
    out.push(Value::Object(tool));
    if !references.is_empty() {
        let mut tool = Object::new();
        tool.insert("role".into(), Value::String("tool".into()));
        tool.insert("tool_call_id".into(), call_id);
        tool.insert("content".into(), Value::Array(references));
        out.push(Value::Object(tool));
    }
    Ok(())
}

#[cfg(test)]
#[path = "anthropic/tests.rs"]
mod tests;
