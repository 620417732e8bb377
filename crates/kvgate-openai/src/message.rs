//! Chat messages as clients send them to `/v1/chat/completions` and
//! `/tokenize`: role, content (string, `null`, or a list of parts), tool
//! calls, reasoning, and whatever else a client or engine adds.
//!
//! The shapes follow OpenAI's message params plus vLLM's extensions (custom
//! roles, bare strings and typeless parts inside content lists,
//! `reasoning_content` / `reasoning`). Everything round-trips exactly:
//! unknown roles stay strings, unknown parts and unknown message keys are
//! kept as they came.

use serde::de::value::{MapAccessDeserializer, SeqAccessDeserializer};
use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::{Serialize, Serializer};
use serde_json::{Map, Value};
use std::fmt;

use crate::wire::wire_object;

/// Who wrote a message. Roles this crate does not know stay as sent.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub enum Role {
    /// `system`
    System,
    /// `developer` (vLLM maps it to `system` when the template ignores it).
    Developer,
    /// `user`
    #[default]
    User,
    /// `assistant`
    Assistant,
    /// `tool`
    Tool,
    /// `function` (the deprecated predecessor of `tool`).
    Function,
    /// Any other role, e.g. `ipython`; vLLM accepts custom roles.
    Other(String),
}

impl Role {
    /// The role as it appears on the wire.
    pub fn as_str(&self) -> &str {
        match self {
            Role::System => "system",
            Role::Developer => "developer",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
            Role::Function => "function",
            Role::Other(name) => name,
        }
    }

    /// The role named `name`; unknown names become [`Role::Other`].
    pub fn from_name(name: &str) -> Role {
        match name {
            "system" => Role::System,
            "developer" => Role::Developer,
            "user" => Role::User,
            "assistant" => Role::Assistant,
            "tool" => Role::Tool,
            "function" => Role::Function,
            other => Role::Other(other.to_owned()),
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for Role {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for Role {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct RoleVisitor;
        impl Visitor<'_> for RoleVisitor {
            type Value = Role;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a role string")
            }
            fn visit_str<E: de::Error>(self, name: &str) -> Result<Role, E> {
                Ok(Role::from_name(name))
            }
        }
        deserializer.deserialize_str(RoleVisitor)
    }
}

/// The `content` of a message when it is not `null`.
#[derive(Clone, Debug, PartialEq)]
pub enum MessageContent {
    /// Plain text.
    Text(String),
    /// A list of parts (text, images, audio, ...).
    Parts(Vec<ContentPart>),
}

impl MessageContent {
    /// Whether every part is text (a plain string counts as text).
    pub fn is_text_only(&self) -> bool {
        match self {
            MessageContent::Text(_) => true,
            MessageContent::Parts(parts) => parts.iter().all(ContentPart::is_text),
        }
    }
}

impl From<String> for MessageContent {
    fn from(text: String) -> Self {
        MessageContent::Text(text)
    }
}

impl From<&str> for MessageContent {
    fn from(text: &str) -> Self {
        MessageContent::Text(text.to_owned())
    }
}

impl Serialize for MessageContent {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            MessageContent::Text(text) => serializer.serialize_str(text),
            MessageContent::Parts(parts) => parts.serialize(serializer),
        }
    }
}

impl<'de> Deserialize<'de> for MessageContent {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ContentVisitor;
        impl<'de> Visitor<'de> for ContentVisitor {
            type Value = MessageContent;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string or a list of content parts")
            }
            fn visit_str<E: de::Error>(self, text: &str) -> Result<MessageContent, E> {
                Ok(MessageContent::Text(text.to_owned()))
            }
            fn visit_string<E: de::Error>(self, text: String) -> Result<MessageContent, E> {
                Ok(MessageContent::Text(text))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<MessageContent, A::Error> {
                Vec::deserialize(SeqAccessDeserializer::new(seq)).map(MessageContent::Parts)
            }
        }
        deserializer.deserialize_any(ContentVisitor)
    }
}

/// What a content part carries, read from its `type` (or, for vLLM's
/// typeless shorthand parts, from its keys).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PartKind {
    /// `{"type": "text", "text": ...}` or a bare string.
    Text,
    /// `image_url` (also vLLM's `{"image_url": "..."}` shorthand).
    ImageUrl,
    /// `input_audio` (base64 audio).
    InputAudio,
    /// `audio_url` (vLLM).
    AudioUrl,
    /// `video_url` (vLLM).
    VideoUrl,
    /// `file`.
    File,
    /// `refusal`.
    Refusal,
    /// `thinking` (vLLM).
    Thinking,
    /// Anything else, including embeddings parts.
    Other,
}

/// One element of a content list, kept exactly as sent.
#[derive(Clone, Debug, PartialEq)]
pub enum ContentPart {
    /// A bare string inside the list; vLLM reads it as text.
    Bare(String),
    /// An object part such as `{"type": "text", "text": "hi"}`.
    Object(Map<String, Value>),
}

impl ContentPart {
    /// A `{"type": "text", "text": ...}` part.
    pub fn text(text: impl Into<String>) -> Self {
        let mut map = Map::new();
        map.insert("type".to_owned(), Value::from("text"));
        map.insert("text".to_owned(), Value::String(text.into()));
        ContentPart::Object(map)
    }

    /// A `{"type": "image_url", "image_url": {"url": ...}}` part.
    pub fn image_url(url: impl Into<String>) -> Self {
        let mut image = Map::new();
        image.insert("url".to_owned(), Value::String(url.into()));
        let mut map = Map::new();
        map.insert("type".to_owned(), Value::from("image_url"));
        map.insert("image_url".to_owned(), Value::Object(image));
        ContentPart::Object(map)
    }

    /// The `type` string, if the part has one (`"text"` for a bare string).
    pub fn part_type(&self) -> Option<&str> {
        match self {
            ContentPart::Bare(_) => Some("text"),
            ContentPart::Object(map) => map.get("type").and_then(Value::as_str),
        }
    }

    /// What the part carries.
    pub fn kind(&self) -> PartKind {
        let Some(map) = self.as_object() else {
            return PartKind::Text;
        };
        match map.get("type").and_then(Value::as_str) {
            Some("text") => PartKind::Text,
            Some("image_url") => PartKind::ImageUrl,
            Some("input_audio") => PartKind::InputAudio,
            Some("audio_url") => PartKind::AudioUrl,
            Some("video_url") => PartKind::VideoUrl,
            Some("file") => PartKind::File,
            Some("refusal") => PartKind::Refusal,
            Some("thinking") => PartKind::Thinking,
            Some(_) => PartKind::Other,
            None if map.contains_key("image_url") => PartKind::ImageUrl,
            None if map.contains_key("audio_url") => PartKind::AudioUrl,
            None if map.contains_key("video_url") => PartKind::VideoUrl,
            None => PartKind::Other,
        }
    }

    /// The text of a text part.
    pub fn as_text(&self) -> Option<&str> {
        match self {
            ContentPart::Bare(text) => Some(text),
            ContentPart::Object(map) => match map.get("type").and_then(Value::as_str) {
                Some("text") => map.get("text").and_then(Value::as_str),
                _ => None,
            },
        }
    }

    /// Whether this is a text part with string text.
    pub fn is_text(&self) -> bool {
        self.as_text().is_some()
    }

    /// The part's fields, unless it is a bare string.
    pub fn as_object(&self) -> Option<&Map<String, Value>> {
        match self {
            ContentPart::Bare(_) => None,
            ContentPart::Object(map) => Some(map),
        }
    }
}

impl Serialize for ContentPart {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            ContentPart::Bare(text) => serializer.serialize_str(text),
            ContentPart::Object(map) => map.serialize(serializer),
        }
    }
}

impl<'de> Deserialize<'de> for ContentPart {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct PartVisitor;
        impl<'de> Visitor<'de> for PartVisitor {
            type Value = ContentPart;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a content part object or string")
            }
            fn visit_str<E: de::Error>(self, text: &str) -> Result<ContentPart, E> {
                Ok(ContentPart::Bare(text.to_owned()))
            }
            fn visit_string<E: de::Error>(self, text: String) -> Result<ContentPart, E> {
                Ok(ContentPart::Bare(text))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<ContentPart, A::Error> {
                Map::deserialize(MapAccessDeserializer::new(map)).map(ContentPart::Object)
            }
        }
        deserializer.deserialize_any(PartVisitor)
    }
}

wire_object! {
    /// The `function` of a tool call: a name and its arguments as a JSON
    /// string (vLLM parses the string into an object before rendering).
    #[derive(Clone, Debug, PartialEq)]
    pub struct FunctionCall {
        /// The function's name.
        required name: String = "name",
        /// The arguments, as the JSON text the model produced.
        required arguments: String = "arguments",
    }
}

wire_object! {
    /// One tool call made by the assistant.
    #[derive(Clone, Debug, PartialEq)]
    pub struct ToolCall {
        /// The call's id, which a later `tool` message refers to.
        optional id: String = "id",
        /// The call's type, `"function"` in practice.
        optional kind: String = "type",
        /// The function called.
        required function: FunctionCall = "function",
    }
}

impl ToolCall {
    /// A `function` tool call.
    pub fn function(
        id: impl Into<String>,
        name: impl Into<String>,
        arguments: impl Into<String>,
    ) -> Self {
        ToolCall {
            id: Some(id.into()),
            kind: Some("function".to_owned()),
            function: FunctionCall {
                name: name.into(),
                arguments: arguments.into(),
                ..FunctionCall::default()
            },
            ..ToolCall::default()
        }
    }
}

wire_object! {
    /// One message of a conversation.
    #[derive(Clone, Debug, PartialEq)]
    pub struct ChatMessage {
        /// Who wrote it.
        required role: Role = "role",
        /// What it says; `None` when absent or `null` (e.g. an assistant
        /// message that only calls tools).
        optional content: MessageContent = "content",
        /// A participant name.
        optional name: String = "name",
        /// Tool calls made by the assistant.
        optional tool_calls: Vec<ToolCall> = "tool_calls",
        /// The tool call a `tool` message answers.
        optional tool_call_id: String = "tool_call_id",
        /// Reasoning text (vLLM's older name).
        optional reasoning_content: String = "reasoning_content",
        /// Reasoning text (vLLM's newer name).
        optional reasoning: String = "reasoning",
    }
}

impl ChatMessage {
    /// A message with text content.
    pub fn new(role: Role, content: impl Into<MessageContent>) -> Self {
        ChatMessage { role, content: Some(content.into()), ..ChatMessage::default() }
    }

    /// Whether the content is absent or text only.
    pub fn is_text_only(&self) -> bool {
        self.content.as_ref().is_none_or(MessageContent::is_text_only)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_round_trip_including_unknown_ones() {
        for name in ["system", "developer", "user", "assistant", "tool", "function", "ipython", ""]
        {
            let role: Role = serde_json::from_value(Value::from(name)).unwrap();
            assert_eq!(role.as_str(), name);
            assert_eq!(serde_json::to_value(&role).unwrap(), Value::from(name));
        }
        assert_eq!(Role::from_name("ipython"), Role::Other("ipython".into()));
    }

    #[test]
    fn content_parts_are_classified() {
        let message: ChatMessage = serde_json::from_str(
            r#"{"role":"user","content":[{"type":"text","text":"a"},"b",{"type":"image_url","image_url":{"url":"u"}},{"image_url":"u"},{"type":"input_audio","input_audio":{"data":"","format":"wav"}},{"type":"thinking","thinking":"t"},{"type":"new_kind"},{"text":"typeless"}]}"#,
        )
        .unwrap();
        let Some(MessageContent::Parts(parts)) = &message.content else { panic!("expected parts") };
        let kinds: Vec<PartKind> = parts.iter().map(ContentPart::kind).collect();
        assert_eq!(
            kinds,
            [
                PartKind::Text,
                PartKind::Text,
                PartKind::ImageUrl,
                PartKind::ImageUrl,
                PartKind::InputAudio,
                PartKind::Thinking,
                PartKind::Other,
                PartKind::Other
            ]
        );
        assert_eq!(parts[0].as_text(), Some("a"));
        assert_eq!(parts[1].as_text(), Some("b"));
        assert_eq!(parts[7].part_type(), None);
        assert!(!message.is_text_only());
        let text_only: ChatMessage =
            serde_json::from_str(r#"{"role":"user","content":[{"type":"text","text":"a"},"b"]}"#)
                .unwrap();
        assert!(text_only.is_text_only());
    }

    #[test]
    fn tool_calls_and_reasoning() {
        let body = r#"{"role":"assistant","content":null,"reasoning_content":"think","tool_calls":[{"id":"call_1","type":"function","function":{"name":"get","arguments":"{\"city\":\"Paris\"}"},"index":0}]}"#;
        let message: ChatMessage = serde_json::from_str(body).unwrap();
        assert_eq!(message.content, None);
        assert!(message.sent_as_null("content"));
        let calls = message.tool_calls.as_ref().unwrap();
        assert_eq!(calls[0].function.arguments, r#"{"city":"Paris"}"#);
        assert_eq!(calls[0].extra["index"], 0);
        assert_eq!(serde_json::to_string(&message).unwrap(), body);
        let built = ToolCall::function("call_1", "get", "{}");
        assert_eq!(
            serde_json::to_string(&built).unwrap(),
            r#"{"id":"call_1","type":"function","function":{"name":"get","arguments":"{}"}}"#
        );
        // Arguments must be a string, as in OpenAI's and vLLM's schemas.
        assert!(serde_json::from_str::<ToolCall>(r#"{"function":{"name":"f","arguments":{}}}"#)
            .is_err());
    }
}
