use serde_json::{json, Value};

use super::*;

fn chat(body: Value) -> Result<ChatRequest> {
    responses_to_chat(body.as_object().unwrap())
}

#[test]
fn string_input_and_instructions_become_system_then_user() {
    let c = chat(json!({"model": "m", "input": "Hi", "instructions": "Be brief."})).unwrap();
    assert_eq!(
        c.messages,
        vec![
            json!({"role": "system", "content": "Be brief."}),
            json!({"role": "user", "content": "Hi"})
        ]
    );
    assert!(c.add_generation_prompt && !c.continue_final_message);
    assert_eq!(c.endpoint, Endpoint::ChatCompletions);
}

#[test]
fn calls_and_reasoning_merge_into_the_assistant_turn() {
    let c = chat(json!({"input": [
        {"role": "user", "content": "q"},
        {"type": "reasoning", "id": "r", "summary": [{"type": "summary_text", "text": "think"}]},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
        {"type": "function_call", "call_id": "c2", "name": "g", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "ok"},
    ]}))
    .unwrap();
    assert_eq!(c.messages.len(), 3);
    assert_eq!(c.messages[1]["reasoning"], "think");
    assert_eq!(c.messages[1]["tool_calls"].as_array().unwrap().len(), 2);
    assert_eq!(c.messages[2], json!({"role": "tool", "content": "ok", "tool_call_id": "c1"}));
}

#[test]
fn an_unfinished_last_message_is_continued() {
    let c = chat(json!({"input": [
        {"role": "user", "content": "q"},
        {"type": "message", "role": "assistant", "status": "incomplete",
         "content": [{"type": "output_text", "text": "It is"}]},
    ]}))
    .unwrap();
    assert!(c.continue_final_message && !c.add_generation_prompt);
    assert_eq!(c.messages[1], json!({"role": "assistant", "content": "It is"}));
}

#[test]
fn media_and_custom_tools_are_unsupported_unknown_items_invalid() {
    let image = json!({"input": [{"role": "user", "content": [
        {"type": "input_image", "image_url": "data:image/png;base64,AA=="}]}]});
    assert!(matches!(chat(image), Err(TokenizeError::Unsupported(_))));
    let custom = json!({"input": "q", "tools": [{"type": "custom", "name": "x"}]});
    assert!(matches!(chat(custom), Err(TokenizeError::Unsupported(_))));
    let unknown = json!({"input": [{"type": "item_reference", "id": "x"}]});
    assert!(matches!(chat(unknown), Err(TokenizeError::InvalidRequest(_))));
    let previous = json!({"input": "q", "previous_response_id": "resp_1"});
    assert!(matches!(chat(previous), Err(TokenizeError::InvalidRequest(_))));
    assert!(matches!(chat(json!({"model": "m"})), Err(TokenizeError::InvalidRequest(_))));
}

#[test]
fn function_tools_become_chat_tools_and_built_ins_are_hidden() {
    let c = chat(json!({"input": "q", "tools": [
        {"type": "web_search_preview"},
        {"type": "function", "name": "f", "parameters": {"type": "object"}, "strict": true},
    ]}))
    .unwrap();
    assert_eq!(
        c.tools.unwrap(),
        vec![json!({"type": "function", "function":
            {"name": "f", "parameters": {"type": "object"}, "strict": true}})]
    );
}
