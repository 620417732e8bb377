//! `POST /v1/chat/completions` requests.
//!
//! Only the fields kvgate reads or edits are typed: the model, the messages
//! and the rendering switches (the tokenizer needs them), streaming, and
//! `kv_transfer_params` (where a router hands vLLM the prompt's token ids).
//! Sampling parameters and every engine-specific key stay in `extra` and are
//! forwarded untouched.

use serde_json::{Map, Value};

use crate::error::Error;
use crate::message::ChatMessage;
use crate::wire::wire_object;

wire_object! {
    /// `stream_options`.
    #[derive(Clone, Debug, PartialEq)]
    pub struct StreamOptions {
        /// Ask for a final chunk carrying `usage`. vLLM treats a missing value
        /// inside a present `stream_options` as `true`.
        optional include_usage: bool = "include_usage",
        /// vLLM: attach `usage` to every chunk.
        optional continuous_usage_stats: bool = "continuous_usage_stats",
    }
}

wire_object! {
    /// A `POST /v1/chat/completions` body.
    #[derive(Clone, Debug, PartialEq)]
    pub struct ChatCompletionRequest {
        /// The served model name; vLLM allows it to be left out.
        optional model: String = "model",
        /// The conversation.
        required messages: Vec<ChatMessage> = "messages",
        /// Stream the answer as SSE.
        optional stream: bool = "stream",
        /// Streaming options.
        optional stream_options: StreamOptions = "stream_options",
        /// Tool definitions, kept as JSON (templates render them verbatim).
        optional tools: Vec<Value> = "tools",
        /// Documents for RAG templates (vLLM).
        optional documents: Vec<Value> = "documents",
        /// A chat template overriding the model's (vLLM).
        optional chat_template: String = "chat_template",
        /// Extra template variables, e.g. `enable_thinking` (vLLM).
        optional chat_template_kwargs: Map<String, Value> = "chat_template_kwargs",
        /// Append the assistant turn header (vLLM; default `true`).
        optional add_generation_prompt: bool = "add_generation_prompt",
        /// Leave the last message open for the model to continue (vLLM;
        /// default `false`).
        optional continue_final_message: bool = "continue_final_message",
        /// Add the tokenizer's special tokens on top of the template's (vLLM;
        /// default `false`).
        optional add_special_tokens: bool = "add_special_tokens",
        /// KV-transfer parameters (vLLM), where a router may put
        /// `prompt_token_ids`.
        optional kv_transfer_params: Map<String, Value> = "kv_transfer_params",
    }
}

impl ChatCompletionRequest {
    /// A request for `model` with `messages` and nothing else.
    pub fn new(model: impl Into<String>, messages: Vec<ChatMessage>) -> Self {
        ChatCompletionRequest {
            model: Some(model.into()),
            messages,
            ..ChatCompletionRequest::default()
        }
    }

    /// Parses a request body.
    pub fn from_slice(body: &[u8]) -> Result<Self, Error> {
        Ok(serde_json::from_slice(body)?)
    }

    /// The body to forward.
    pub fn to_vec(&self) -> Result<Vec<u8>, Error> {
        Ok(serde_json::to_vec(self)?)
    }

    /// The `model` field, if given.
    pub fn model(&self) -> Option<&str> {
        self.model.as_deref()
    }

    /// Whether the client asked for a stream.
    pub fn is_stream(&self) -> bool {
        self.stream.unwrap_or(false)
    }

    /// Whether the stream will end with a usage chunk.
    pub fn include_usage(&self) -> bool {
        include_usage(self.stream, self.stream_options.as_ref())
    }

    /// Makes a streaming request end with a usage chunk, so that the gateway
    /// can account tokens. Returns whether the client had asked for it
    /// itself; if not, the caller should drop that chunk before relaying.
    pub fn ensure_include_usage(&mut self) -> bool {
        ensure_include_usage(self.stream, &mut self.stream_options)
    }

    /// `add_generation_prompt`, with vLLM's default.
    pub fn add_generation_prompt(&self) -> bool {
        self.add_generation_prompt.unwrap_or(true)
    }

    /// `continue_final_message`, with vLLM's default.
    pub fn continue_final_message(&self) -> bool {
        self.continue_final_message.unwrap_or(false)
    }

    /// `add_special_tokens`, with vLLM's chat default.
    pub fn add_special_tokens(&self) -> bool {
        self.add_special_tokens.unwrap_or(false)
    }

    /// `max_completion_tokens`, else `max_tokens`, when an integer.
    pub fn max_output_tokens(&self) -> Option<u64> {
        max_output_tokens(&self.extra)
    }

    /// Whether any message carries non-text content (images, audio, ...).
    pub fn has_non_text_content(&self) -> bool {
        !self.messages.iter().all(ChatMessage::is_text_only)
    }

    /// The rules vLLM enforces before rendering that kvgate can check
    /// without a tokenizer: `add_generation_prompt` and
    /// `continue_final_message` may not both be set to `true`, and
    /// `stream_options` needs `stream: true`.
    pub fn validate(&self) -> Result<(), Error> {
        check_generation_flags(self.add_generation_prompt, self.continue_final_message)?;
        if self.stream_options.is_some() && !self.is_stream() {
            return Err(Error::invalid_request(
                "stream_options can only be set when stream is true",
                Some("stream_options"),
            ));
        }
        Ok(())
    }

    /// Hands vLLM the prompt's token ids in
    /// `kv_transfer_params.prompt_token_ids`, so that it skips its own
    /// template and tokenizer. Other `kv_transfer_params` keys are kept.
    ///
    /// vLLM rejects this together with multimodal content, so a request
    /// with non-text parts is refused here.
    pub fn set_prompt_token_ids(&mut self, token_ids: &[u32]) -> Result<(), Error> {
        if self.has_non_text_content() {
            return Err(Error::invalid_request(
                "prompt_token_ids cannot be combined with non-text content",
                Some("messages"),
            ));
        }
        let params = self.kv_transfer_params.get_or_insert_with(Map::new);
        params.insert("prompt_token_ids".to_owned(), token_ids_value(token_ids));
        Ok(())
    }

    /// The client's `body` (from which `self` was parsed) with
    /// `kv_transfer_params.prompt_token_ids` added. When the body names no
    /// `kv_transfer_params` at all, the key is appended to its bytes: every
    /// other byte stays as the client sent it, and the request is neither
    /// cloned nor re-serialised (a 4k-token chat spends most of its non-
    /// tokenizer CPU there otherwise). Otherwise the request is re-serialised
    /// through [`Self::set_prompt_token_ids`], which merges the keys.
    pub fn body_with_prompt_token_ids(
        &self,
        body: &[u8],
        token_ids: &[u32],
    ) -> Result<Vec<u8>, Error> {
        if let Some(spliced) = append_prompt_token_ids(body, token_ids) {
            if !self.has_non_text_content() {
                return Ok(spliced);
            }
        }
        let mut r = self.clone();
        r.set_prompt_token_ids(token_ids)?;
        r.to_vec()
    }

    /// `kv_transfer_params.prompt_token_ids`, when present and well formed.
    pub fn prompt_token_ids(&self) -> Option<Vec<u32>> {
        let ids = self.kv_transfer_params.as_ref()?.get("prompt_token_ids")?.as_array()?;
        ids.iter().map(|id| id.as_u64().and_then(|id| u32::try_from(id).ok())).collect()
    }
}

/// Shared by chat and completion requests: whether a usage chunk will come.
pub(crate) fn include_usage(stream: Option<bool>, options: Option<&StreamOptions>) -> bool {
    // An absent `include_usage` defaults to true in vLLM; an explicit `null` is falsy.
    stream.unwrap_or(false)
        && options.is_some_and(|o| o.include_usage.unwrap_or(!o.sent_as_null("include_usage")))
}

/// Shared by chat and completion requests: turns the usage chunk on.
pub(crate) fn ensure_include_usage(
    stream: Option<bool>,
    options: &mut Option<StreamOptions>,
) -> bool {
    let had = include_usage(stream, options.as_ref());
    if stream.unwrap_or(false) && !had {
        options.get_or_insert_with(StreamOptions::default).include_usage = Some(true);
    }
    had
}

/// vLLM's rule: both flags may not be explicitly `true`.
pub(crate) fn check_generation_flags(
    add_generation_prompt: Option<bool>,
    continue_final_message: Option<bool>,
) -> Result<(), Error> {
    if add_generation_prompt == Some(true) && continue_final_message == Some(true) {
        return Err(Error::invalid_request(
            "cannot set both continue_final_message and add_generation_prompt to true",
            Some("continue_final_message"),
        ));
    }
    Ok(())
}

/// `max_completion_tokens`, else `max_tokens`, from the unmodelled keys.
pub(crate) fn max_output_tokens(extra: &Map<String, Value>) -> Option<u64> {
    ["max_completion_tokens", "max_tokens"].iter().find_map(|key| extra.get(*key)?.as_u64())
}

/// Token ids as a JSON array.
/// `body` with `"kv_transfer_params":{"prompt_token_ids":[...]}` appended
/// as its last key, or `None` when that is not safe by bytes alone: the body
/// is not a non-empty object, or mentions `kv_transfer_params` anywhere (a
/// duplicate key would be rejected or resolved differently by the engine).
pub(crate) fn append_prompt_token_ids(body: &[u8], token_ids: &[u32]) -> Option<Vec<u8>> {
    const KEY: &[u8] = b"kv_transfer_params";
    // memmem, not a window-by-window compare: the body is the whole prompt
    // (tens of kilobytes), and the naive scan cost ~2 ns per byte.
    if memchr::memmem::find(body, KEY).is_some() {
        return None;
    }
    let end = body.iter().rposition(|b| !b.is_ascii_whitespace())?;
    let start = body.iter().position(|b| !b.is_ascii_whitespace())?;
    if body[start] != b'{' || body[end] != b'}' {
        return None;
    }
    let inner_end = body[..end].iter().rposition(|b| !b.is_ascii_whitespace())?;
    let empty = inner_end == start;
    let mut out = Vec::with_capacity(end + 48 + token_ids.len() * 7);
    out.extend_from_slice(&body[..end]);
    if !empty {
        out.push(b',');
    }
    out.extend_from_slice(br#""kv_transfer_params":{"prompt_token_ids":["#);
    let mut buf = itoa::Buffer::new();
    for (i, id) in token_ids.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(buf.format(*id).as_bytes());
    }
    out.extend_from_slice(b"]}}");
    Some(out)
}

pub(crate) fn token_ids_value(token_ids: &[u32]) -> Value {
    Value::Array(token_ids.iter().map(|&id| Value::from(id)).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::{ContentPart, MessageContent, Role};
    use serde_json::json;

    fn parse(text: &str) -> ChatCompletionRequest {
        serde_json::from_str(text).unwrap()
    }

    #[test]
    fn round_trips_byte_for_byte() {
        let body = r#"{"temperature":0.5,"model":"m","top_k":null,"messages":[{"content":"be brief","role":"system","x":1},{"role":"user","content":[{"type":"text","text":"hi"},"bare",{"type":"image_url","image_url":{"url":"u"}}],"name":null}],"stream":null,"kv_transfer_params":{"do_remote_decode":false},"max_tokens":5}"#;
        let request = parse(body);
        assert_eq!(serde_json::to_string(&request).unwrap(), body);
        assert_eq!(request.model(), Some("m"));
        assert_eq!(request.messages[0].role, Role::System);
        assert_eq!(request.messages[0].extra["x"], 1);
        assert!(request.has_non_text_content());
        assert_eq!(request.max_output_tokens(), Some(5));
        assert!(!request.is_stream());
    }

    #[test]
    fn set_prompt_token_ids_keeps_everything_else() {
        let mut request = parse(
            r#"{"messages":[{"role":"user","content":"hi"}],"kv_transfer_params":{"a":1},"seed":3}"#,
        );
        request.set_prompt_token_ids(&[1, 2, 3]).unwrap();
        assert_eq!(
            serde_json::to_string(&request).unwrap(),
            r#"{"messages":[{"role":"user","content":"hi"}],"kv_transfer_params":{"a":1,"prompt_token_ids":[1,2,3]},"seed":3}"#
        );
        assert_eq!(request.prompt_token_ids(), Some(vec![1, 2, 3]));

        let mut fresh = parse(r#"{"model":"m","messages":[],"seed":3}"#);
        fresh.set_prompt_token_ids(&[7]).unwrap();
        assert_eq!(
            serde_json::to_string(&fresh).unwrap(),
            r#"{"model":"m","messages":[],"kv_transfer_params":{"prompt_token_ids":[7]},"seed":3}"#
        );
    }

    /// Found by fuzz/openai_request: without serde_json's `float_roundtrip`
    /// a re-serialised unknown number could come back one ULP off.
    #[test]
    fn unknown_numbers_survive_reserialisation_exactly() {
        for n in ["1.6666666666666663e+40", "0.1", "2.2250738585072014e-308", "0.30000000000000004"]
        {
            let body = format!(r#"{{"messages":[],"x":{n},"temperature":{n}}}"#);
            let req = ChatCompletionRequest::from_slice(body.as_bytes()).unwrap();
            let again = ChatCompletionRequest::from_slice(&req.to_vec().unwrap()).unwrap();
            assert_eq!(again, req, "{n}");
            let v: f64 = n.parse().unwrap();
            assert_eq!(req.extra["x"].as_f64(), Some(v), "{n} parsed inexactly");
        }
    }

    #[test]
    fn body_with_prompt_token_ids_appends_to_the_clients_bytes() {
        let body = br#" {"model":"m", "messages":[{"role":"user","content":"hi"}],"x":{"y":[1]}}
"#;
        let request = ChatCompletionRequest::from_slice(body).unwrap();
        let out = request.body_with_prompt_token_ids(body, &[5, 0, 4294967295]).unwrap();
        assert_eq!(
            std::str::from_utf8(&out).unwrap(),
            r#" {"model":"m", "messages":[{"role":"user","content":"hi"}],"x":{"y":[1]},"kv_transfer_params":{"prompt_token_ids":[5,0,4294967295]}}"#
        );
        let again = ChatCompletionRequest::from_slice(&out).unwrap();
        assert_eq!(again.prompt_token_ids(), Some(vec![5, 0, 4294967295]));
        let mut expected = request.clone();
        expected.set_prompt_token_ids(&[5, 0, 4294967295]).unwrap();
        assert_eq!(again, expected);
    }

    #[test]
    fn body_with_prompt_token_ids_merges_when_the_key_is_there() {
        for body in [
            &br#"{"messages":[],"kv_transfer_params":{"a":1}}"#[..],
            br#"{"messages":[],"kv_transfer_params":null}"#,
            br#"{"messages":[{"role":"user","content":"kv_transfer_params"}]}"#,
        ] {
            let request = ChatCompletionRequest::from_slice(body).unwrap();
            let out = request.body_with_prompt_token_ids(body, &[9]).unwrap();
            let mut expected = request.clone();
            expected.set_prompt_token_ids(&[9]).unwrap();
            assert_eq!(out, expected.to_vec().unwrap(), "{}", String::from_utf8_lossy(body));
        }
        assert_eq!(
            append_prompt_token_ids(b"{}", &[1, 2]).unwrap(),
            br#"{"kv_transfer_params":{"prompt_token_ids":[1,2]}}"#
        );
        assert_eq!(
            append_prompt_token_ids(b"{ \n}\n", &[]).unwrap(),
            b"{ \n\"kv_transfer_params\":{\"prompt_token_ids\":[]}}"
        );
        assert!(append_prompt_token_ids(b"[1]", &[1]).is_none());
        assert!(append_prompt_token_ids(b"  ", &[1]).is_none());
    }

    #[test]
    fn set_prompt_token_ids_refuses_multimodal_content() {
        let mut request = ChatCompletionRequest::new(
            "m",
            vec![ChatMessage::new(
                Role::User,
                MessageContent::Parts(vec![ContentPart::text("look"), ContentPart::image_url("u")]),
            )],
        );
        assert!(matches!(
            request.set_prompt_token_ids(&[1]),
            Err(Error::InvalidRequest { param: Some("messages"), .. })
        ));
        assert!(request.kv_transfer_params.is_none());
    }

    #[test]
    fn include_usage_follows_vllm_defaults() {
        let base = r#"{"messages":[]"#;
        let case = |rest: &str| parse(&format!("{base}{rest}}}")).include_usage();
        assert!(!case(r#","stream":true"#));
        assert!(case(r#","stream":true,"stream_options":{}"#));
        assert!(case(r#","stream":true,"stream_options":{"include_usage":true}"#));
        assert!(!case(r#","stream":true,"stream_options":{"include_usage":false}"#));
        assert!(!case(r#","stream":true,"stream_options":{"include_usage":null}"#));
        assert!(!case(r#","stream":false,"stream_options":{}"#));
    }

    #[test]
    fn ensure_include_usage_turns_it_on_once() {
        let mut request = parse(r#"{"messages":[],"stream":true}"#);
        assert!(!request.ensure_include_usage());
        assert!(request.include_usage());
        assert_eq!(
            serde_json::to_value(&request).unwrap(),
            json!({"messages": [], "stream": true, "stream_options": {"include_usage": true}})
        );
        assert!(request.ensure_include_usage());
        let mut not_streaming = parse(r#"{"messages":[]}"#);
        assert!(!not_streaming.ensure_include_usage());
        assert!(not_streaming.stream_options.is_none());
    }

    #[test]
    fn validate_mirrors_vllm() {
        let both =
            parse(r#"{"messages":[],"add_generation_prompt":true,"continue_final_message":true}"#);
        assert!(both.validate().is_err());
        let continuing = parse(r#"{"messages":[],"continue_final_message":true}"#);
        assert!(continuing.validate().is_ok());
        assert!(!continuing.add_generation_prompt() || continuing.continue_final_message());
        let options_without_stream = parse(r#"{"messages":[],"stream_options":{}}"#);
        assert!(options_without_stream.validate().is_err());
    }

    #[test]
    fn malformed_bodies_are_errors() {
        for body in [
            r#"{"model":"m"}"#,
            r#"{"messages":[],"messages":[]}"#,
            r#"{"messages":"hi"}"#,
            r#"{"messages":[{"content":"no role"}]}"#,
            r#"{"messages":[],"stream":"yes"}"#,
            r#"[1,2]"#,
            r#"{"messages":[]"#,
        ] {
            let err = ChatCompletionRequest::from_slice(body.as_bytes()).unwrap_err();
            assert!(err.to_string().starts_with("invalid json body"), "{body}: {err}");
        }
        let missing = ChatCompletionRequest::from_slice(b"{}").unwrap_err().to_string();
        assert!(missing.contains("missing field `messages`"), "{missing}");
        let duplicate =
            ChatCompletionRequest::from_slice(br#"{"messages":[],"messages":[]}"#).unwrap_err();
        assert!(duplicate.to_string().contains("duplicate field `messages`"));
    }

    #[test]
    fn built_requests_put_known_fields_first() {
        let mut request = ChatCompletionRequest::new("m", vec![ChatMessage::new(Role::User, "hi")]);
        request.extra.insert("temperature".into(), json!(0.0));
        request.stream = Some(true);
        assert_eq!(
            serde_json::to_string(&request).unwrap(),
            r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"temperature":0.0}"#
        );
    }
}
