//! [`ChatTokenizer`]: render a chat and tokenize it the way vLLM does.
//!
//! The pipeline of [`ChatTokenizer::render_chat`], in vLLM 0.33.0's order
//! (`TokenizeChatRequest.build_chat_params`, `OnlineRenderer.preprocess_chat`,
//! `HfRenderer.render_messages`, `safe_apply_chat_template`) and then
//! transformers 5.20's `apply_chat_template`:
//!
//! 1. request checks (`continue_final_message` with `add_generation_prompt`,
//!    untrusted request templates);
//! 2. template kwargs merged: server defaults, then `tools`, then the
//!    request's `chat_template_kwargs`, then the request's own flags;
//! 3. the template chosen (request template or name, `tool_use` when tools
//!    are given, else the default) and analysed (content format,
//!    "developer" mention, variables);
//! 4. messages validated as vLLM's pydantic request model does (module
//!    `validate`), rebuilt (module `preprocess`), developer → system;
//! 5. kwargs filtered to the template's variables plus HF's parameters;
//! 6. rendered with `messages`, `tools`, `documents`,
//!    `add_generation_prompt`, the special tokens and the kwargs; for
//!    `continue_final_message` the text is cut right after the final
//!    message's content, as transformers does.
//!
//! Encoding a rendered chat adds no special tokens (unless the request asks
//! for `add_special_tokens`); a plain prompt is encoded with the tokenizer's
//! own rule (its post-processor, e.g. Llama's BOS).

use std::path::Path;
use std::sync::{Arc, OnceLock};

use serde_json::{Map, Value};
use tokenizers::{AddedToken, Tokenizer};

use crate::anthropic::{MessagesRules, EFFORTS};
use crate::config::{AddedTokenSpec, TokenizerConfig};
use crate::encoder::{Encoder, EncoderChoice, EncoderPath};
use crate::prefix_cache::PrefixRules;

use crate::error::{Result, TokenizeError};
use crate::model_dir::{ChatTemplates, ModelDir};
use crate::preprocess::{self, TemplateKwargs};
use crate::request::{ChatRequest, Endpoint};
use crate::template::{json_to_value, map_value, renders_bare, ChatTemplate, ContentFormat};
use crate::validate::validate_message;

/// transformers' marker for `continue_final_message`.
const CONTINUE_TAG: &str = "CONTINUE_FINAL_MESSAGE_TAG ";

/// vLLM's answer to a request template it does not trust.
const UNTRUSTED_TEMPLATE: &str = "Chat template is passed with request, but \
    --trust-request-chat-template is not set. Refused request with untrusted chat template.";

/// Server-side options that vLLM takes from its command line.
#[derive(Debug, Clone, Default)]
pub struct ChatOptions {
    /// `--trust-request-chat-template`: accept `chat_template` in requests.
    pub trust_request_chat_template: bool,
    /// `--chat-template-content-format`: `None` detects it from the template.
    pub content_format: Option<ContentFormat>,
    /// `--default-chat-template-kwargs`.
    pub default_template_kwargs: Map<String, Value>,
}

/// A model's template, compiled once; compile errors surface per request.
type CompiledSlot = (String, std::result::Result<Arc<ChatTemplate>, String>);

/// A tokenizer with its chat templates: renders and encodes chats and
/// prompts exactly as a vLLM engine serving the same model directory.
///
/// Architecture Invariant: immutable after construction, so one instance is
/// shared (`Arc`) by all tokenization threads.
#[derive(Debug)]
pub struct ChatTokenizer {
    /// The reference (`tokenizers`): encodes when the fast encoder is not
    /// proven on this file, and decodes. Alongside the fast encoder it is
    /// dropped after the load-time checks and rebuilt on first use (a
    /// decode), so that one copy of the tables stays resident, not two.
    reference: OnceLock<Tokenizer>,
    /// What rebuilds it: `None` once it is built for good.
    reference_source: Option<ReferenceSource>,
    /// The cut points a prefix cache may use, taken from the reference.
    prefix_rules: PrefixRules,
    /// What encodes (see `encoder.rs`).
    encoder: Encoder,
    encoder_path: EncoderPath,
    templates: ChatTemplates,
    compiled: Vec<CompiledSlot>,
    special_tokens: Vec<(&'static str, String)>,
    added_tokens: Vec<String>,
    clean_up_spaces: bool,
    options: ChatOptions,
    /// What vLLM's Messages conversion reads from the template, probed on
    /// first use.
    messages_rules: OnceLock<MessagesRules>,
}

impl ChatTokenizer {
    /// Loads a Hugging Face model directory.
    pub fn from_dir(dir: impl AsRef<Path>) -> Result<ChatTokenizer> {
        ChatTokenizer::from_model_dir(ModelDir::open(dir)?)
    }

    /// The bundled Qwen3 tokenizer (see [`ModelDir::bundled_qwen3`]).
    pub fn bundled() -> Result<ChatTokenizer> {
        ChatTokenizer::from_model_dir(ModelDir::bundled_qwen3()?)
    }

    /// Loads a Hugging Face model directory with this encoder choice.
    pub fn from_dir_with(dir: impl AsRef<Path>, encoder: EncoderChoice) -> Result<ChatTokenizer> {
        ChatTokenizer::from_model_dir_with(ModelDir::open(dir)?, encoder)
    }

    /// The bundled Qwen3 tokenizer with this encoder choice.
    pub fn bundled_with(encoder: EncoderChoice) -> Result<ChatTokenizer> {
        ChatTokenizer::from_model_dir_with(ModelDir::bundled_qwen3()?, encoder)
    }

    /// Builds a tokenizer from loaded files (encoder `auto`).
    pub fn from_model_dir(dir: ModelDir) -> Result<ChatTokenizer> {
        ChatTokenizer::from_model_dir_with(dir, EncoderChoice::Auto)
    }

    /// Builds a tokenizer from loaded files with this encoder choice.
    pub fn from_model_dir_with(mut dir: ModelDir, encoder: EncoderChoice) -> Result<ChatTokenizer> {
        let (tokenizer, extra) = reference(&dir.origin, &dir.tokenizer_json, &dir.config)?;
        let mut added: Vec<(u32, String)> = tokenizer
            .get_added_tokens_decoder()
            .into_iter()
            .map(|(id, token)| (id, token.content))
            .collect();
        added.sort();
        let mut added_tokens: Vec<String> = Vec::with_capacity(added.len());
        for (_, content) in added {
            if !content.is_empty() && !added_tokens.contains(&content) {
                added_tokens.push(content);
            }
        }
        let is_bpe = matches!(tokenizer.get_model(), tokenizers::ModelWrapper::BPE(_));
        let sources: Vec<&str> = match &dir.templates {
            ChatTemplates::None => Vec::new(),
            ChatTemplates::Single(t) => vec![t.as_str()],
            ChatTemplates::Named(named) => named.iter().map(|(_, t)| t.as_str()).collect(),
        };
        let compiled = sources
            .into_iter()
            .map(|source| {
                let compiled =
                    ChatTemplate::compile(source).map(Arc::new).map_err(|e| e.to_string());
                (source.to_owned(), compiled)
            })
            .collect();
        let prefix_rules = PrefixRules::of(&tokenizer);
        let extra: Vec<&AddedTokenSpec> = extra.iter().collect();
        let built = Encoder::build(
            encoder,
            tokenizer,
            &dir.tokenizer_json,
            &extra,
            dir.config.split_special_tokens,
            || reference(&dir.origin, &dir.tokenizer_json, &dir.config).map(|(t, _)| t),
        )
        .map_err(|e| match e {
            TokenizeError::InvalidModelDir(m) => {
                TokenizeError::InvalidModelDir(format!("{}: {m}", dir.origin))
            }
            e => e,
        })?;
        let (encoder, encoder_path) = (built.encoder, built.path);
        let reference = OnceLock::new();
        let reference_source = match built.reference {
            Some(tokenizer) => {
                let _ = reference.set(tokenizer);
                None
            }
            None if dir.bundled => Some(ReferenceSource::Bundled),
            None => Some(ReferenceSource::Files {
                origin: dir.origin.clone(),
                tokenizer_json: std::mem::take(&mut dir.tokenizer_json),
                config: dir.config.clone(),
            }),
        };
        Ok(ChatTokenizer {
            reference,
            reference_source,
            prefix_rules,
            encoder,
            encoder_path,
            templates: dir.templates,
            compiled,
            special_tokens: dir.config.special_tokens.clone(),
            added_tokens,
            // transformers 5 skips the cleanup for BPE models.
            clean_up_spaces: dir.config.clean_up_tokenization_spaces && !is_bpe,
            options: ChatOptions::default(),
            messages_rules: OnceLock::new(),
        })
    }

    /// Replaces the server-side options.
    pub fn with_options(mut self, options: ChatOptions) -> ChatTokenizer {
        self.options = options;
        self.messages_rules = OnceLock::new();
        self
    }

    /// What vLLM's Anthropic Messages conversion reads from this model's
    /// template, found by the probes vLLM runs when it starts (rendered
    /// once, on first use).
    pub fn messages_rules(&self) -> MessagesRules {
        *self.messages_rules.get_or_init(|| MessagesRules {
            merge_inline_system: self.requires_system_first(),
            disabled_thinking_effort: self.disabled_thinking_effort(),
        })
    }

    /// `_should_merge_inline_system`: whether the template (for no tools, or
    /// for tools) fails on `[system, user, system, user]` in plain Jinja2;
    /// a model without a template merges.
    fn requires_system_first(&self) -> bool {
        let message = |role: &str| serde_json::json!({"role": role, "content": "t"});
        let messages = Value::Array(vec![
            message("system"),
            message("user"),
            message("system"),
            message("user"),
        ]);
        let context = || {
            map_value([
                ("messages".into(), json_to_value(&messages)),
                ("add_generation_prompt".into(), false.into()),
            ])
        };
        [false, true].into_iter().any(|tools| match self.templates.select(None, tools) {
            Ok(source) => !renders_bare(source, context()),
            Err(_) => true,
        })
    }

    /// `DisabledThinkingEffortResolver._probe`: `"none"` unless the
    /// template fails on it or renders it like some thinking effort (it
    /// ignores it), then `"low"`.
    fn disabled_thinking_effort(&self) -> &'static str {
        let render = |effort: &str| {
            let mut r =
                ChatRequest::new(vec![serde_json::json!({"role": "user", "content": "Hi"})]);
            r.endpoint = Endpoint::ChatCompletions;
            r.extra.insert("reasoning_effort".into(), Value::String(effort.into()));
            self.render_chat(&r).ok()
        };
        let Some(none) = render("none") else { return "low" };
        if EFFORTS.iter().any(|e| render(e).as_ref() == Some(&none)) {
            "low"
        } else {
            "none"
        }
    }

    /// The encoder in use and, when it is not the preferred one, why.
    pub fn encoder_path(&self) -> &EncoderPath {
        &self.encoder_path
    }

    /// The reference `tokenizers` tokenizer, built on first use when the
    /// fast encoder is in use.
    pub fn tokenizer(&self) -> &Tokenizer {
        self.reference.get_or_init(|| {
            #[allow(clippy::expect_used)]
            // The source is kept whenever the reference is not, and these are
            // the bytes it was first built from, at load time: only running
            // out of memory could fail now.
            self.reference_source
                .as_ref()
                .and_then(|source| source.rebuild().ok())
                .expect("the reference tokenizer rebuilds from the files it loaded from")
        })
    }

    /// Where a prefix cache may cut this tokenizer's texts.
    pub fn prefix_rules(&self) -> &PrefixRules {
        &self.prefix_rules
    }

    /// The strings of all added tokens (special or not), by id. Each one is
    /// always a token of its own, so text can be cut right after one of them
    /// without changing how the rest tokenizes.
    pub fn added_token_strings(&self) -> &[String] {
        &self.added_tokens
    }

    /// Renders a chat to the prompt text the engine would tokenize.
    pub fn render_chat(&self, request: &ChatRequest) -> Result<String> {
        if request.continue_final_message && request.add_generation_prompt {
            return Err(TokenizeError::InvalidRequest(
                "Cannot set both `continue_final_message` and `add_generation_prompt` to True."
                    .into(),
            ));
        }
        let user_kwargs = request.chat_template_kwargs.clone().unwrap_or_default();
        let kwargs_template = user_kwargs.get("chat_template").filter(|v| !v.is_null());
        if !self.options.trust_request_chat_template
            && (request.chat_template.is_some() || kwargs_template.is_some())
        {
            return Err(TokenizeError::InvalidRequest(UNTRUSTED_TEMPLATE.into()));
        }
        let mut kwargs = self.merged_kwargs(request, user_kwargs)?;

        // safe_apply_chat_template's named parameters.
        let tools = kwargs.shift_remove("tools").filter(|v| !v.is_null());
        let requested_template = match kwargs.shift_remove("chat_template") {
            Some(Value::String(s)) => Some(s),
            Some(Value::Null) | None => None,
            Some(_) => {
                return Err(TokenizeError::InvalidRequest("chat_template must be a string".into()))
            }
        };
        kwargs.shift_remove("tokenize");

        // vLLM analyses the string it resolved (a template, or a name), and
        // transformers renders the template that string selects.
        let render_source =
            self.templates.select(requested_template.as_deref(), tools.is_some())?;
        let render_template = self.template_for(render_source)?;
        let analysis_template = match &requested_template {
            Some(requested) if requested != render_source => self.template_for(requested)?,
            _ => Arc::clone(&render_template),
        };
        let format = self.options.content_format.unwrap_or(analysis_template.content_format());

        let mut conversation = Vec::with_capacity(request.messages.len());
        for message in &request.messages {
            let validated = if request.endpoint == Endpoint::ChatCompletions {
                let mut message = message.clone();
                preprocess::rename_reasoning_content(&mut message);
                validate_message(&message)?
            } else {
                validate_message(message)?
            };
            conversation.push(preprocess::parse_message(&validated, format)?);
        }
        preprocess::postprocess_tool_calls(&mut conversation)?;
        let has_developer =
            conversation.iter().any(|m| m.get("role").and_then(Value::as_str) == Some("developer"));
        if has_developer && !analysis_template.mentions_developer() {
            preprocess::developer_to_system(&mut conversation);
            conversation = preprocess::consolidate_system_messages(conversation);
        }
        let resolved =
            TemplateKwargs::resolve(kwargs, |name| analysis_template.uses_variable(name))?;
        self.apply_chat_template(&render_template, conversation, tools, resolved)
    }

    /// The template kwargs after vLLM's merges: server defaults and `tools`,
    /// then the request's kwargs, then the request's flags.
    fn merged_kwargs(
        &self,
        request: &ChatRequest,
        user: Map<String, Value>,
    ) -> Result<Map<String, Value>> {
        let tools = match &request.tools {
            Some(tools) => Value::Array(preprocess::normalize_tools(tools)?),
            None => Value::Null,
        };
        let mut flags = Map::new();
        flags.insert("add_generation_prompt".into(), request.add_generation_prompt.into());
        flags.insert("continue_final_message".into(), request.continue_final_message.into());
        if request.endpoint == Endpoint::ChatCompletions {
            let documents = request.chat_completions_field("documents").cloned();
            flags.insert("documents".into(), documents.unwrap_or(Value::Null));
            let effort = request.chat_completions_field("reasoning_effort").cloned();
            if let Some(effort) = &effort {
                if !user.contains_key("enable_thinking") {
                    flags
                        .insert("enable_thinking".into(), (effort.as_str() != Some("none")).into());
                }
            }
            flags.insert("reasoning_effort".into(), effort.unwrap_or(Value::Null));
        }
        let request_kwargs = preprocess::merge_kwargs(user, flags);
        let mut named = Map::new();
        named.insert("tools".into(), tools);
        named.insert("tokenize".into(), false.into());
        let defaults =
            preprocess::merge_kwargs(self.options.default_template_kwargs.clone(), named);
        let merged = preprocess::merge_kwargs(defaults, request_kwargs);
        let mut last = Map::new();
        last.insert(
            "chat_template".into(),
            request.chat_template.clone().map_or(Value::Null, Value::String),
        );
        Ok(preprocess::merge_kwargs(merged, last))
    }

    /// The compiled template for a source: the model's (compiled at load)
    /// or a request's (compiled now).
    fn template_for(&self, source: &str) -> Result<Arc<ChatTemplate>> {
        for (known, compiled) in &self.compiled {
            if known == source {
                return compiled.clone().map_err(TokenizeError::Template);
            }
        }
        ChatTemplate::compile(source).map(Arc::new)
    }

    /// transformers' `apply_chat_template(tokenize=False)` on a prepared
    /// conversation.
    fn apply_chat_template(
        &self,
        template: &ChatTemplate,
        mut conversation: Vec<Map<String, Value>>,
        tools: Option<Value>,
        kwargs: TemplateKwargs,
    ) -> Result<String> {
        if conversation.is_empty() {
            return Err(TokenizeError::InvalidRequest(
                "Cannot apply chat template to an empty conversation. Provide at least one message."
                    .into(),
            ));
        }
        if kwargs.continue_final_message && kwargs.add_generation_prompt {
            return Err(TokenizeError::InvalidRequest(
                "continue_final_message and add_generation_prompt are not compatible.".into(),
            ));
        }
        if let Some(tools) = &tools {
            preprocess::validate_tools(tools)?;
        }
        if let Some(documents) = &kwargs.documents {
            preprocess::validate_documents(documents)?;
        }
        let continued = if kwargs.continue_final_message {
            Some(mark_final_message(template.source(), &mut conversation)?)
        } else {
            None
        };
        let mut context: Vec<(minijinja::Value, minijinja::Value)> =
            Vec::with_capacity(8 + kwargs.variables.len());
        for (name, token) in &self.special_tokens {
            context.push(((*name).into(), token.as_str().into()));
        }
        for (name, value) in &kwargs.variables {
            context.push((name.as_str().into(), json_to_value(value)));
        }
        let messages = Value::Array(conversation.into_iter().map(Value::Object).collect());
        context.push(("messages".into(), json_to_value(&messages)));
        context.push(("tools".into(), tools.as_ref().map_or(().into(), json_to_value)));
        context
            .push(("documents".into(), kwargs.documents.as_ref().map_or(().into(), json_to_value)));
        context.push(("add_generation_prompt".into(), kwargs.add_generation_prompt.into()));
        let rendered = template.render(map_value(context))?;
        match continued {
            Some(final_text) => cut_after_final_message(rendered, &final_text),
            None => Ok(rendered),
        }
    }

    /// Renders and encodes a chat: the token ids the engine would compute.
    pub fn encode_chat(&self, request: &ChatRequest) -> Result<Vec<u32>> {
        let text = self.render_chat(request)?;
        self.encode(&text, request.add_special_tokens)
    }

    /// Encodes a completion prompt with the tokenizer's special-token rule
    /// (`add_special_tokens=True`, vLLM's default for `/v1/completions`).
    pub fn encode_prompt(&self, prompt: &str) -> Result<Vec<u32>> {
        self.encode(prompt, true)
    }

    /// Encodes text without adding special tokens (special-token strings in
    /// the text still map to their ids): how a rendered chat is encoded.
    pub fn encode_text_no_special(&self, text: &str) -> Result<Vec<u32>> {
        self.encode(text, false)
    }

    fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        self.encoder.encode(self.reference.get(), text, add_special_tokens)
    }

    /// Decodes token ids to text (`/detokenize`).
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String> {
        let text = self
            .tokenizer()
            .decode(ids, skip_special_tokens)
            .map_err(|e| TokenizeError::Tokenizer(e.to_string()))?;
        Ok(if self.clean_up_spaces { clean_up_tokenization(&text) } else { text })
    }
}

/// transformers' `clean_up_tokenization`.
fn clean_up_tokenization(text: &str) -> String {
    text.replace(" .", ".")
        .replace(" ?", "?")
        .replace(" !", "!")
        .replace(" ,", ",")
        .replace(" ' ", "'")
        .replace(" n't", "n't")
        .replace(" 'm", "'m")
        .replace(" 's", "'s")
        .replace(" 've", "'ve")
        .replace(" 're", "'re")
}

/// transformers 5.20 `render_jinja_template`, before rendering: appends the
/// continue tag to the final message's content (its last text part for a
/// part list) and returns the content as it was.
fn mark_final_message(
    template_source: &str,
    conversation: &mut [Map<String, Value>],
) -> Result<String> {
    let invalid = |m: &str| TokenizeError::InvalidRequest(m.to_owned());
    let Some(last) = conversation.last_mut() else {
        return Err(invalid("continue_final_message is set but the conversation is empty!"));
    };
    let Some(content) = last.get_mut("content").filter(|c| !c.is_null()) else {
        return Err(invalid(
            "continue_final_message is set but the final message has no \"content\" to continue!",
        ));
    };
    if !template_source.contains("content") {
        return Err(invalid(
            "continue_final_message is set to \"content\" but this is not an accepted field in the chat_template",
        ));
    }
    match content {
        Value::Array(parts) => {
            for part in parts.iter_mut().rev() {
                if let Some(text) = part.as_object_mut().and_then(|o| o.get_mut("text")) {
                    let Value::String(s) = text else {
                        return Err(invalid(
                            "continue_final_message: the final text part is not a string",
                        ));
                    };
                    let original = s.clone();
                    s.push_str(CONTINUE_TAG);
                    return Ok(original);
                }
            }
            Err(invalid(
                "continue_final_message is set but we could not find any text to continue in the final message!",
            ))
        }
        Value::String(s) => {
            let original = s.clone();
            s.push_str(CONTINUE_TAG);
            Ok(original)
        }
        _ => Err(invalid("continue_final_message: the final message content is not text")),
    }
}

/// transformers 5.20 `render_jinja_template`, after rendering: cut at the
/// last continue tag, trimming trailing whitespace if the template trimmed
/// the tag's own.
fn cut_after_final_message(rendered: String, final_text: &str) -> Result<String> {
    let tag = CONTINUE_TAG.trim_end();
    let stripped = final_text.trim_matches(crate::template::is_py_space);
    if !rendered.contains(stripped) || !rendered.contains(tag) {
        return Err(TokenizeError::InvalidRequest(format!(
            "continue_final_message is set but the final message does not appear in the chat after \
             applying the chat template! This can happen if the chat template deletes portions of \
             the final message. Please verify the chat template and final message in your chat to \
             ensure they are compatible.Final message to continue: {stripped}"
        )));
    }
    let Some(at) = rendered.rfind(tag) else {
        return Ok(rendered);
    };
    if rendered[at..].starts_with(CONTINUE_TAG) {
        let mut out = rendered;
        out.truncate(at);
        Ok(out)
    } else {
        Ok(rendered[..at].trim_end_matches(crate::template::is_py_space).to_owned())
    }
}

/// The reference tokenizer, as transformers builds it: the file,
/// plus the config's added tokens the file lacks (returned too), plus
/// `split_special_tokens`.
fn reference(
    origin: &str,
    tokenizer_json: &[u8],
    config: &TokenizerConfig,
) -> Result<(Tokenizer, Vec<AddedTokenSpec>)> {
    let mut tokenizer = Tokenizer::from_bytes(tokenizer_json)
        .map_err(|e| TokenizeError::InvalidModelDir(format!("{origin}: tokenizer.json: {e}")))?;
    let mut extra = Vec::new();
    for (_, spec) in &config.added_tokens {
        if tokenizer.token_to_id(&spec.content).is_none() {
            extra.push(spec.clone());
            let token = AddedToken::from(spec.content.clone(), spec.special)
                .lstrip(spec.lstrip)
                .rstrip(spec.rstrip)
                .single_word(spec.single_word)
                .normalized(spec.normalized);
            if spec.special {
                tokenizer.add_special_tokens(&[token]);
            } else {
                tokenizer.add_tokens(&[token]);
            }
        }
    }
    if config.split_special_tokens {
        tokenizer.set_encode_special_tokens(true);
    }
    Ok((tokenizer, extra))
}

/// What rebuilds the reference tokenizer: the bundled files are in the
/// binary already; of a model directory, the `tokenizer.json` bytes and the
/// config are kept (a tenth of the tables they build).
enum ReferenceSource {
    Bundled,
    Files { origin: String, tokenizer_json: Vec<u8>, config: TokenizerConfig },
}

impl std::fmt::Debug for ReferenceSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReferenceSource::Bundled => f.write_str("Bundled"),
            ReferenceSource::Files { origin, tokenizer_json, .. } => {
                write!(f, "Files({origin}, {} bytes)", tokenizer_json.len())
            }
        }
    }
}

impl ReferenceSource {
    fn rebuild(&self) -> Result<Tokenizer> {
        let tokenizer = match self {
            ReferenceSource::Bundled => {
                let d = ModelDir::bundled_qwen3()?;
                reference(&d.origin, &d.tokenizer_json, &d.config)?
            }
            ReferenceSource::Files { origin, tokenizer_json, config } => {
                reference(origin, tokenizer_json, config)?
            }
        };
        Ok(tokenizer.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn conv(v: Value) -> Vec<Map<String, Value>> {
        v.as_array().unwrap().iter().map(|m| m.as_object().unwrap().clone()).collect()
    }

    #[test]
    fn continue_marks_and_cuts() {
        let mut c = conv(json!([{"role": "assistant", "content": "Hel"}]));
        let original = mark_final_message("{{ m.content }}", &mut c).unwrap();
        assert_eq!(original, "Hel");
        assert_eq!(c[0]["content"], json!("HelCONTINUE_FINAL_MESSAGE_TAG "));
        let cut =
            cut_after_final_message("<a>HelCONTINUE_FINAL_MESSAGE_TAG </a>".into(), "Hel").unwrap();
        assert_eq!(cut, "<a>Hel");
        let trimmed =
            cut_after_final_message("<a>Hel  CONTINUE_FINAL_MESSAGE_TAG</a>".into(), "Hel  ")
                .unwrap();
        assert_eq!(trimmed, "<a>Hel");
        assert!(cut_after_final_message("<a></a>".into(), "Hel").is_err());
    }

    #[test]
    fn continue_needs_content_in_template() {
        let mut c = conv(json!([{"role": "assistant", "content": "x"}]));
        assert!(mark_final_message("{{ m.text }}", &mut c).is_err());
        let mut parts = conv(
            json!([{"role": "assistant", "content": [{"type": "text", "text": "a"}, {"type": "image"}]}]),
        );
        assert_eq!(mark_final_message("content", &mut parts).unwrap(), "a");
    }

    #[test]
    fn cleanup_like_transformers() {
        assert_eq!(clean_up_tokenization("a , b . c n't"), "a, b. cn't");
    }
}
