//! The public API on the bundled Qwen3 tokenizer: loading, prompt and chat
//! encoding, decoding, added tokens, server options and the
//! `/v1/chat/completions` differences.

// The helpers below panic on broken fixtures on purpose.
#![allow(clippy::unwrap_used)]

use kvgate_tokenize::{
    ChatOptions, ChatRequest, ChatTokenizer, ContentFormat, Endpoint, TokenizeError,
};
use serde_json::json;

fn bundled() -> ChatTokenizer {
    ChatTokenizer::bundled().unwrap()
}

fn request(body: serde_json::Value) -> ChatRequest {
    serde_json::from_value(body).unwrap()
}

#[test]
fn bundled_encodes_and_decodes() {
    let tok = bundled();
    let ids = tok.encode_prompt("Hello world").unwrap();
    assert_eq!(ids, [9707, 1879]);
    assert_eq!(tok.decode(&ids, false).unwrap(), "Hello world");
    let special = tok.encode_text_no_special("<|im_start|>user").unwrap();
    assert_eq!(special[0], 151644);
    assert_eq!(tok.decode(&special, true).unwrap(), "user");
    assert!(tok.added_token_strings().iter().any(|t| t == "<|im_end|>"));
}

#[test]
fn chat_renders_the_qwen3_template() {
    let tok = bundled();
    let req = request(json!({"messages": [{"role": "user", "content": "Hi"}],
                             "chat_template_kwargs": {"enable_thinking": false}}));
    assert_eq!(
        tok.render_chat(&req).unwrap(),
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    );
    let ids = tok.encode_chat(&req).unwrap();
    assert_eq!(ids[0], 151644);
}

#[test]
fn continue_final_message_leaves_the_turn_open() {
    let tok = bundled();
    let req = request(json!({"messages": [{"role": "user", "content": "Hi"},
                                          {"role": "assistant", "content": "Hel"}],
                             "add_generation_prompt": false, "continue_final_message": true}));
    assert!(tok
        .render_chat(&req)
        .unwrap()
        .ends_with("<|im_start|>assistant\n<think>\n\n</think>\n\nHel"));
    let both = request(
        json!({"messages": [{"role": "user", "content": "Hi"}], "continue_final_message": true}),
    );
    assert!(matches!(tok.render_chat(&both), Err(TokenizeError::InvalidRequest(_))));
}

#[test]
fn request_templates_need_trust() {
    let body = json!({"messages": [{"role": "user", "content": "Hi"}],
                      "chat_template": "{% for m in messages %}[{{ m.content }}]{% endfor %}"});
    let untrusted = bundled();
    assert!(matches!(
        untrusted.render_chat(&request(body.clone())),
        Err(TokenizeError::InvalidRequest(_))
    ));
    let trusted = bundled()
        .with_options(ChatOptions { trust_request_chat_template: true, ..ChatOptions::default() });
    assert_eq!(trusted.render_chat(&request(body)).unwrap(), "[Hi]");
}

#[test]
fn template_errors_carry_the_template_message() {
    let tok = bundled()
        .with_options(ChatOptions { trust_request_chat_template: true, ..ChatOptions::default() });
    let req = request(json!({"messages": [{"role": "user", "content": "Hi"}],
                             "chat_template": "{{ raise_exception('only assistants here') }}"}));
    match tok.render_chat(&req) {
        Err(TokenizeError::Template(message)) => assert_eq!(message, "only assistants here"),
        other => panic!("expected a template error, got {other:?}"),
    }
}

#[test]
fn content_format_override_and_default_kwargs() {
    let template = "{% for m in messages %}{{ m.content }}|{{ greeting }}{% endfor %}";
    let mut defaults = serde_json::Map::new();
    defaults.insert("greeting".into(), json!("hello"));
    let tok = bundled().with_options(ChatOptions {
        trust_request_chat_template: true,
        content_format: Some(ContentFormat::OpenAi),
        default_template_kwargs: defaults,
    });
    let req =
        request(json!({"messages": [{"role": "user", "content": "x"}], "chat_template": template}));
    assert_eq!(tok.render_chat(&req).unwrap(), "[{'type': 'text', 'text': 'x'}]|hello");
}

#[test]
fn chat_completions_reads_documents_and_reasoning_content() {
    let tok = bundled()
        .with_options(ChatOptions { trust_request_chat_template: true, ..ChatOptions::default() });
    let template = "{{ documents }}|{{ enable_thinking }}|{% for m in messages %}{{ m.reasoning_content }};{% endfor %}";
    let body = json!({"messages": [{"role": "user", "content": "q"},
                                   {"role": "assistant", "content": "a", "reasoning_content": "r"}],
                      "documents": [{"title": "t", "text": "x"}], "reasoning_effort": "none",
                      "chat_template": template});
    let mut req = request(body);
    assert_eq!(tok.render_chat(&req).unwrap(), "None||;;");
    req.endpoint = Endpoint::ChatCompletions;
    assert_eq!(tok.render_chat(&req).unwrap(), "[{'title': 't', 'text': 'x'}]|False|;r;");
}

#[test]
fn multimodal_content_is_unsupported() {
    let req = request(json!({"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]}));
    assert!(matches!(bundled().render_chat(&req), Err(TokenizeError::Unsupported(_))));
}

#[test]
fn model_dir_from_disk_matches_bundled() {
    let dir =
        std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.cache/tokenizers/qwen3");
    if !dir.join("tokenizer.json").exists() {
        eprintln!("skipped: {} missing (scripts/fetch-tokenizers.sh)", dir.display());
        return;
    }
    let from_disk = ChatTokenizer::from_dir(&dir).unwrap();
    let req = request(
        json!({"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "ü 😀"}]}),
    );
    assert_eq!(from_disk.encode_chat(&req).unwrap(), bundled().encode_chat(&req).unwrap());
}
