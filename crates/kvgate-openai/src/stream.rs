//! Streaming chunks of `/v1/chat/completions` and `/v1/completions`, and a
//! cheap reader of a relayed stream.
//!
//! The full chunk types ([`ChatCompletionChunk`], [`CompletionChunk`]) are
//! for whoever writes a stream (the simulator) or wants every field. The
//! gateway relays engine streams byte for byte and only needs three facts
//! from them: when the first output arrived, the final usage, and whether
//! the engine reported an error. [`summarize_chunk`] reads just that from
//! one `data:` payload, borrowing strings where it can, and [`StreamTap`]
//! keeps the tally over a whole stream. Time is the caller's: the tap says
//! *which* event carried the first output, the caller notes *when*.

use std::borrow::Cow;

use serde::de::IgnoredAny;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::api_error::ErrorInfo;
use crate::error::Error;
use crate::message::Role;
use crate::response::{Envelope, Usage};
use crate::sse::SseItem;

/// The function part of a streamed tool-call fragment.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct FunctionCallDelta {
    /// The function name, in the fragment that starts the call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// A piece of the arguments text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arguments: Option<String>,
    /// Anything else.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// A streamed fragment of a tool call.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ToolCallDelta {
    /// Which tool call of the choice this fragment extends.
    #[serde(default)]
    pub index: u32,
    /// The call id, in the fragment that starts the call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// `"function"`, in the fragment that starts the call.
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// The function fragment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub function: Option<FunctionCallDelta>,
    /// Anything else.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// What one chat chunk adds to the assistant's message.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ChatDelta {
    /// Set on the first chunk.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<Role>,
    /// A piece of the answer text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    /// A piece of reasoning text (vLLM's older name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    /// A piece of reasoning text (vLLM's newer name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<String>,
    /// Tool-call fragments.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCallDelta>>,
    /// Anything else.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl ChatDelta {
    /// Whether the delta carries generated output (text, reasoning or a
    /// tool call), as opposed to only a role or empty strings.
    pub fn has_output(&self) -> bool {
        let non_empty = |s: &Option<String>| s.as_ref().is_some_and(|s| !s.is_empty());
        non_empty(&self.content)
            || non_empty(&self.reasoning_content)
            || non_empty(&self.reasoning)
            || self.tool_calls.as_ref().is_some_and(|calls| !calls.is_empty())
    }
}

/// One choice of a chat chunk.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ChatChunkChoice {
    /// The choice's position.
    #[serde(default)]
    pub index: u32,
    /// What this chunk adds.
    #[serde(default)]
    pub delta: ChatDelta,
    /// Log-probabilities, kept as JSON.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<Value>,
    /// Set on the choice's last chunk; written as `null` before that.
    #[serde(default)]
    pub finish_reason: Option<String>,
    /// Anything else (vLLM's `stop_reason`, ...).
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// One `data:` payload of a chat stream (`object: chat.completion.chunk`).
pub type ChatCompletionChunk = Envelope<ChatChunkChoice>;

impl Envelope<ChatChunkChoice> {
    /// Whether any choice carries generated output.
    pub fn has_output(&self) -> bool {
        self.choices.iter().any(|c| c.delta.has_output())
    }
}

/// One choice of a completion chunk.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CompletionChunkChoice {
    /// The choice's position.
    #[serde(default)]
    pub index: u32,
    /// A piece of the generated text.
    #[serde(default)]
    pub text: String,
    /// Log-probabilities, kept as JSON.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<Value>,
    /// Set on the choice's last chunk.
    #[serde(default)]
    pub finish_reason: Option<String>,
    /// Anything else.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// One `data:` payload of a completion stream (`object: text_completion`).
pub type CompletionChunk = Envelope<CompletionChunkChoice>;

impl Envelope<CompletionChunkChoice> {
    /// Whether any choice carries generated text.
    pub fn has_output(&self) -> bool {
        self.choices.iter().any(|c| !c.text.is_empty())
    }
}

/// The facts the gateway needs from one chunk of either kind.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ChunkSummary {
    /// How many choices the chunk has (0 on a final usage chunk).
    pub n_choices: usize,
    /// Some choice carries generated output (text, reasoning, tool call).
    pub has_output: bool,
    /// The first `finish_reason` set in the chunk.
    pub finish_reason: Option<String>,
    /// The chunk's `usage`.
    pub usage: Option<Usage>,
    /// An error the engine sent mid-stream (`{"error": {...}}`).
    pub error: Option<ErrorInfo>,
}

#[derive(Deserialize)]
struct PeekDelta<'a> {
    #[serde(default, borrow)]
    content: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    reasoning_content: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    reasoning: Option<Cow<'a, str>>,
    #[serde(default)]
    tool_calls: Option<Vec<IgnoredAny>>,
}

#[derive(Deserialize)]
struct PeekChoice<'a> {
    #[serde(default, borrow)]
    delta: Option<PeekDelta<'a>>,
    #[serde(default, borrow)]
    text: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    finish_reason: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct PeekChunk<'a> {
    #[serde(default, borrow)]
    choices: Option<Vec<PeekChoice<'a>>>,
    #[serde(default)]
    usage: Option<Usage>,
    #[serde(default)]
    error: Option<ErrorInfo>,
}

fn non_empty(text: &Option<Cow<'_, str>>) -> bool {
    text.as_ref().is_some_and(|t| !t.is_empty())
}

/// Reads the [`ChunkSummary`] of one `data:` payload of a chat or
/// completion stream, skipping everything else in it.
pub fn summarize_chunk(data: &str) -> Result<ChunkSummary, Error> {
    let chunk: PeekChunk<'_> = serde_json::from_str(data)?;
    let choices = chunk.choices.unwrap_or_default();
    let has_output = choices.iter().any(|choice| {
        non_empty(&choice.text)
            || choice.delta.as_ref().is_some_and(|d| {
                non_empty(&d.content)
                    || non_empty(&d.reasoning_content)
                    || non_empty(&d.reasoning)
                    || d.tool_calls.as_ref().is_some_and(|calls| !calls.is_empty())
            })
    });
    Ok(ChunkSummary {
        n_choices: choices.len(),
        has_output,
        finish_reason: choices.iter().find_map(|c| c.finish_reason.as_deref().map(str::to_owned)),
        usage: chunk.usage,
        error: chunk.error,
    })
}

/// What one event of a stream turned out to be.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Observation {
    /// This event carried the stream's first output: note the time now.
    pub first_output: bool,
    /// This event is a usage-only chunk (no choices, `usage` set); a
    /// gateway that turned usage on itself drops it before relaying.
    pub usage_only: bool,
    /// This event is an engine error.
    pub error: bool,
    /// This event is `[DONE]`.
    pub done: bool,
}

/// A running tally over one relayed stream.
#[derive(Clone, Debug, Default)]
pub struct StreamTap {
    n_events: u64,
    n_output_events: u64,
    n_unreadable: u64,
    usage: Option<Usage>,
    finish_reason: Option<String>,
    error: Option<ErrorInfo>,
    done: bool,
}

impl StreamTap {
    /// A tap that has seen nothing.
    pub fn new() -> Self {
        StreamTap::default()
    }

    /// Takes in one parsed item.
    pub fn observe(&mut self, item: &SseItem) -> Observation {
        let event = match item {
            SseItem::Done => {
                self.done = true;
                return Observation { done: true, ..Observation::default() };
            }
            SseItem::Event(event) => event,
        };
        self.n_events += 1;
        let Ok(summary) = summarize_chunk(&event.data) else {
            self.n_unreadable += 1;
            return Observation::default();
        };
        let mut seen = Observation::default();
        if summary.has_output {
            seen.first_output = self.n_output_events == 0;
            self.n_output_events += 1;
        }
        if summary.finish_reason.is_some() {
            self.finish_reason = summary.finish_reason;
        }
        if let Some(usage) = summary.usage {
            seen.usage_only = summary.n_choices == 0;
            self.usage = Some(usage);
        }
        if let Some(error) = summary.error {
            seen.error = true;
            self.error = Some(error);
        }
        seen
    }

    /// Whether output has arrived yet.
    pub fn has_output(&self) -> bool {
        self.n_output_events > 0
    }

    /// Events that carried output (about one per token for vLLM).
    pub fn n_output_events(&self) -> u64 {
        self.n_output_events
    }

    /// Events seen, `[DONE]` excluded.
    pub fn n_events(&self) -> u64 {
        self.n_events
    }

    /// Events whose data was not a readable chunk.
    pub fn n_unreadable(&self) -> u64 {
        self.n_unreadable
    }

    /// The last usage reported.
    pub fn usage(&self) -> Option<&Usage> {
        self.usage.as_ref()
    }

    /// The last finish reason reported.
    pub fn finish_reason(&self) -> Option<&str> {
        self.finish_reason.as_deref()
    }

    /// The error the engine sent, if any.
    pub fn error(&self) -> Option<&ErrorInfo> {
        self.error.as_ref()
    }

    /// Whether `[DONE]` arrived.
    pub fn is_done(&self) -> bool {
        self.done
    }
}

/// How an answer ended, read from its last events or its whole body, for
/// any of the three APIs: the finish reason and the output tokens.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AnswerEnd {
    /// OpenAI's `finish_reason`, Anthropic's `stop_reason`, or the
    /// Responses API's `incomplete_details.reason`, else its `status`.
    pub finish_reason: Option<String>,
    /// `usage.completion_tokens` (OpenAI) or `usage.output_tokens`
    /// (Anthropic, Responses); a stream has it only in its final usage
    /// chunk or end event.
    pub output_tokens: Option<u64>,
}

#[derive(Deserialize)]
struct PeekEndChoice<'a> {
    #[serde(default, borrow)]
    finish_reason: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct PeekEndUsage {
    #[serde(default)]
    completion_tokens: Option<u64>,
    #[serde(default)]
    output_tokens: Option<u64>,
}

/// Anthropic's `message_delta` carries `delta.stop_reason`; other events'
/// `delta` is a text delta or (Responses) a string.
#[derive(Deserialize)]
#[serde(untagged)]
enum PeekEndDelta {
    Stop {
        #[serde(default)]
        stop_reason: Option<String>,
    },
    Other(IgnoredAny),
}

#[derive(Deserialize)]
struct PeekIncomplete<'a> {
    #[serde(default, borrow)]
    reason: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct PeekEnd<'a> {
    #[serde(default, borrow)]
    choices: Option<Vec<PeekEndChoice<'a>>>,
    #[serde(default)]
    usage: Option<PeekEndUsage>,
    #[serde(default, borrow)]
    stop_reason: Option<Cow<'a, str>>,
    #[serde(default)]
    delta: Option<PeekEndDelta>,
    #[serde(default, borrow)]
    status: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    incomplete_details: Option<PeekIncomplete<'a>>,
    /// A Responses stream event's response.
    #[serde(default, borrow)]
    response: Option<Box<PeekEnd<'a>>>,
}

impl AnswerEnd {
    /// Takes in one JSON payload (an event's data, or a whole answer's
    /// body): what it says replaces what earlier ones said. Anything that
    /// is not such JSON (`[DONE]`, a cut event) is passed over.
    pub fn read(&mut self, data: &[u8]) {
        if let Ok(peek) = serde_json::from_slice::<PeekEnd<'_>>(data) {
            self.take(&peek);
        }
    }

    fn take(&mut self, p: &PeekEnd<'_>) {
        let choice = p.choices.iter().flatten().find_map(|c| c.finish_reason.as_deref());
        let stop = match &p.delta {
            Some(PeekEndDelta::Stop { stop_reason }) => stop_reason.as_deref(),
            _ => None,
        };
        // Responses: `status` is `completed`, or `incomplete` with a reason.
        let incomplete = p.incomplete_details.as_ref().and_then(|d| d.reason.as_deref());
        let status = p.status.as_deref().filter(|s| *s != "in_progress" && *s != "queued");
        let reason = choice.or(p.stop_reason.as_deref()).or(stop).or(incomplete).or(status);
        if let Some(r) = reason {
            self.finish_reason = Some(r.to_owned());
        }
        if let Some(n) = p.usage.as_ref().and_then(|u| u.completion_tokens.or(u.output_tokens)) {
            self.output_tokens = Some(n);
        }
        if let Some(r) = &p.response {
            self.take(r);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sse::{SseEvent, SseParser};

    /// A vLLM chat stream with `include_usage`, as the engine writes it.
    const VLLM_CHAT: &str = concat!(
        "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"logprobs\":null,\"finish_reason\":null}]}\n\n",
        "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hel\"},\"logprobs\":null,\"finish_reason\":null}]}\n\n",
        "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"lo\"},\"logprobs\":null,\"finish_reason\":\"stop\",\"stop_reason\":null}]}\n\n",
        "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"total_tokens\":9,\"completion_tokens\":2,\"prompt_tokens_details\":{\"cached_tokens\":4}}}\n\n",
        "data: [DONE]\n\n",
    );

    #[test]
    fn tap_reads_first_output_and_usage() {
        let mut parser = SseParser::default();
        let mut items = Vec::new();
        parser.feed(VLLM_CHAT.as_bytes(), &mut items).unwrap();
        let mut tap = StreamTap::new();
        let seen: Vec<Observation> = items.iter().map(|item| tap.observe(item)).collect();
        assert_eq!(seen.iter().position(|o| o.first_output), Some(1));
        assert_eq!(seen.iter().filter(|o| o.first_output).count(), 1);
        assert!(seen[3].usage_only);
        assert!(seen[4].done);
        assert_eq!(tap.n_output_events(), 2);
        assert_eq!(tap.finish_reason(), Some("stop"));
        let usage = tap.usage().unwrap();
        assert_eq!(
            (usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens()),
            (7, Some(2), Some(4))
        );
        assert!(tap.is_done() && tap.error().is_none());
    }

    #[test]
    fn full_chunk_types_read_the_same_stream() {
        let mut parser = SseParser::default();
        let mut items = Vec::new();
        parser.feed(VLLM_CHAT.as_bytes(), &mut items).unwrap();
        let chunks: Vec<ChatCompletionChunk> = items
            .iter()
            .filter_map(|item| match item {
                SseItem::Event(e) => Some(serde_json::from_str(&e.data).unwrap()),
                SseItem::Done => None,
            })
            .collect();
        assert_eq!(chunks[0].choices[0].delta.role, Some(Role::Assistant));
        assert!(!chunks[0].has_output() && chunks[1].has_output());
        assert_eq!(chunks[3].usage.as_ref().map(|u| u.total_tokens), Some(9));
        // Written back, a chunk keeps `finish_reason: null` and vLLM's extras.
        let back = serde_json::to_value(&chunks[2]).unwrap();
        assert_eq!(back["choices"][0]["stop_reason"], Value::Null);
        assert_eq!(back["choices"][0]["finish_reason"], "stop");
    }

    #[test]
    fn completion_chunks_and_tool_calls_count_as_output() {
        let text = summarize_chunk(r#"{"choices":[{"index":0,"text":" a","finish_reason":null}]}"#)
            .unwrap();
        assert!(text.has_output);
        let empty =
            summarize_chunk(r#"{"choices":[{"index":0,"text":"","finish_reason":"length"}]}"#)
                .unwrap();
        assert!(!empty.has_output);
        assert_eq!(empty.finish_reason.as_deref(), Some("length"));
        let tool = summarize_chunk(
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"c","type":"function","function":{"name":"f","arguments":""}}]}}]}"#,
        )
        .unwrap();
        assert!(tool.has_output);
        let reasoning =
            summarize_chunk(r#"{"choices":[{"delta":{"reasoning_content":"hm\"m"}}]}"#).unwrap();
        assert!(reasoning.has_output);
    }

    #[test]
    fn tap_records_engine_errors_and_unreadable_events() {
        let mut tap = StreamTap::new();
        let error = SseItem::Event(SseEvent::data(
            r#"{"error":{"message":"boom","type":"InternalServerError","param":null,"code":500}}"#,
        ));
        assert!(tap.observe(&error).error);
        assert_eq!(tap.error().map(|e| e.message.as_str()), Some("boom"));
        assert_eq!(
            tap.observe(&SseItem::Event(SseEvent::data("not json"))),
            Observation::default()
        );
        assert_eq!(tap.n_unreadable(), 1);
        assert!(!tap.has_output());
    }

    #[test]
    fn the_end_of_an_answer_in_each_api() {
        let read = |events: &[&str]| {
            let mut end = AnswerEnd::default();
            for e in events {
                end.read(e.as_bytes());
            }
            end
        };
        let end = |reason: &str, tokens: Option<u64>| AnswerEnd {
            finish_reason: Some(reason.to_owned()),
            output_tokens: tokens,
        };
        // An OpenAI stream's last chunks, with and without usage; a whole answer.
        let last = r#"{"choices":[{"index":0,"delta":{"content":"lo"},"finish_reason":"length"}]}"#;
        let usage =
            r#"{"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":2,"total_tokens":7}}"#;
        assert_eq!(read(&[last, usage, "[DONE]"]), end("length", Some(2)));
        assert_eq!(read(&[last, "[DONE]"]), end("length", None));
        let whole = r#"{"choices":[{"index":0,"message":{"role":"assistant","content":"a \"finish_reason\": \"x\""},"finish_reason":"stop"}],"usage":{"prompt_tokens":5,"completion_tokens":9}}"#;
        assert_eq!(read(&[whole]), end("stop", Some(9)));
        // Anthropic: message_delta, then message_stop; a whole message.
        let delta = r#"{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":2}}"#;
        let text =
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"lo"}}"#;
        assert_eq!(read(&[text, delta, r#"{"type":"message_stop"}"#]), end("end_turn", Some(2)));
        let message = r#"{"type":"message","stop_reason":"max_tokens","usage":{"input_tokens":3,"output_tokens":4}}"#;
        assert_eq!(read(&[message]), end("max_tokens", Some(4)));
        // Responses: string deltas, then the end event; a cut answer's reason.
        let d = r#"{"type":"response.output_text.delta","sequence_number":2,"delta":"lo"}"#;
        let done = r#"{"type":"response.completed","response":{"status":"completed","usage":{"input_tokens":3,"output_tokens":5}}}"#;
        let created = r#"{"type":"response.created","response":{"status":"in_progress"}}"#;
        assert_eq!(read(&[created, d, done]), end("completed", Some(5)));
        let cut = r#"{"status":"incomplete","incomplete_details":{"reason":"max_output_tokens"},"usage":{"output_tokens":8}}"#;
        assert_eq!(read(&[cut]), end("max_output_tokens", Some(8)));
        // Nothing to say: nothing recorded.
        assert_eq!(read(&["[DONE]", "{\"choices\":[{\"fin", created]), AnswerEnd::default());
    }
}
