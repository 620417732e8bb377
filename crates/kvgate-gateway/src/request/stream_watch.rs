//! What both doors see of an engine's streamed answer: its first token (the
//! booking moves to decoding and TTFT is measured) and its end, each as the
//! answer's API marks it. The proxy's relay and the endpoint picker's
//! exchange feed it the same bytes, so the two doors cannot disagree on
//! when a request started decoding or whether it ended well.
//!
//! Until the first token each SSE event is parsed; from then on only the
//! framing is scanned, for the end: decoding every token's event cost more
//! than the rest of the relay together. An event over [`MAX_EVENT_BYTES`]
//! is skipped, not inspected (its bytes still pass, and the events around
//! it in the chunk still count).

use kvgate_openai::{anthropic, responses, SseFraming, SseItem, SseParser, StreamTap};

use crate::request::route::Api;

/// Largest single SSE event parsed for the first token (bigger events pass
/// through but are not inspected).
pub(crate) const MAX_EVENT_BYTES: usize = 4 << 20;

/// One streamed answer's first token and end.
#[derive(Debug)]
pub(crate) struct StreamWatch {
    api: Api,
    parser: SseParser,
    items: Vec<SseItem>,
    tap: StreamTap,
    framing: SseFraming,
    first_seen: bool,
}

impl StreamWatch {
    pub(crate) fn new(api: Api) -> StreamWatch {
        StreamWatch {
            api,
            parser: SseParser::new(MAX_EVENT_BYTES),
            items: Vec::new(),
            tap: StreamTap::new(),
            framing: SseFraming::new(),
            first_seen: false,
        }
    }

    /// Takes the answer's next chunk; true for the chunk that carries its
    /// first token (once per answer).
    pub(crate) fn feed(&mut self, chunk: &[u8]) -> bool {
        self.framing.feed(chunk);
        if self.first_seen {
            return false;
        }
        self.items.clear();
        // The only error is an oversized event, dropped by the parser; the
        // chunk's other events are in `items` and the parser stays usable.
        let _too_large = self.parser.feed(chunk, &mut self.items).is_err();
        let mut output = false;
        for item in &self.items {
            output |= match self.api {
                Api::OpenAi => self.tap.observe(item).first_output,
                Api::Anthropic => anthropic::is_output_event(item),
                Api::Responses => responses::is_output_event(item),
            };
        }
        self.first_seen = output || self.tap.has_output();
        self.first_seen
    }

    /// Whether the engine ended the stream as its API ends one (`[DONE]`,
    /// or the named end event of Messages and Responses).
    pub(crate) fn ended(&self) -> bool {
        match self.api {
            Api::OpenAi => self.framing.is_done(),
            Api::Anthropic | Api::Responses => self.framing.named_end(),
        }
    }

    /// Whether the bytes so far stop inside an event (an error event
    /// appended now needs a blank line first).
    pub(crate) fn mid_event(&self) -> bool {
        self.framing.mid_event()
    }

    /// SSE events seen so far (`[DONE]` included).
    pub(crate) fn events(&self) -> u64 {
        self.framing.events()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openai_first_token_is_the_first_content_and_the_end_is_done() {
        let mut w = StreamWatch::new(Api::OpenAi);
        let role = b"data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\"}}]}\n\n";
        assert!(!w.feed(role), "a role-only chunk is no token");
        let text = b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"}}]}\n\n";
        // Split mid-event: the token is seen when its event completes.
        assert!(!w.feed(&text[..20]));
        assert!(w.feed(&text[20..]));
        assert!(!w.feed(text), "the first token is reported once");
        assert!(!w.ended());
        assert!(!w.feed(b"data: [DONE]\n\n"));
        assert!(w.ended());
        assert_eq!(w.events(), 4);
    }

    #[test]
    fn anthropic_needs_a_content_delta_and_message_stop() {
        let mut w = StreamWatch::new(Api::Anthropic);
        assert!(!w.feed(b"event: message_start\ndata: {\"type\":\"message_start\"}\n\n"));
        assert!(w.feed(
            b"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\
              \"delta\":{\"type\":\"text_delta\",\"text\":\"Hi\"}}\n\n"
        ));
        assert!(!w.ended(), "[DONE] is not how a Messages stream ends");
        w.feed(b"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n");
        assert!(w.ended());
    }

    #[test]
    fn an_oversized_event_is_skipped_and_the_next_one_counts() {
        let mut w = StreamWatch::new(Api::OpenAi);
        let mut big = b"data: ".to_vec();
        big.resize(MAX_EVENT_BYTES + 16, b'x');
        assert!(!w.feed(&big));
        let text = b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"}}]}\n\n";
        let mut rest = b"\n\n".to_vec();
        rest.extend_from_slice(text);
        assert!(w.feed(&rest), "the token after the skipped event is seen");
        w.feed(b"data: [DONE]\n\n");
        assert!(w.ended());
    }
}
