//! A workload: requests with arrival times, prompts and output lengths, read
//! from a trace file or made by a generator (`synthetic.rs`).
//!
//! Two trace formats, one JSON object per line:
//! - **Mooncake** (`timestamp` ms, `input_length`, `output_length`,
//!   `hash_ids` of 512-token prefix blocks). A prompt stays in its compact
//!   block form ([`Prompt::Blocks`]) until it is sent, because the whole
//!   conversation trace holds about 145M tokens; [`mooncake_tokens`] derives
//!   512 tokens from each hash id, so equal ids give equal tokens and the
//!   16-token engine blocks share exactly where the trace shares, and cuts
//!   the last block to `input_length`.
//! - **messages**: OpenAI chat bodies (`messages`, optional `timestamp` ms
//!   and `max_tokens` or `output_length`), rendered and tokenized with the
//!   chat template as the engine would.
//!
//! A bad line is a [`LineError`] with its 1-based line number: skipped and
//! kept in [`Workload::skipped`], or, when parsing is strict, the error.

use std::time::Duration;

use kvgate_tokenize::{ChatRequest, ChatTokenizer};
use serde::Deserialize;

use crate::error::{LineError, ReplayError};

/// Tokens per Mooncake hash id.
pub const MOONCAKE_BLOCK_TOKENS: usize = 512;
/// Token ids are drawn below this (inside every real vocabulary we ship).
const VOCAB: u64 = 150_000;
/// Output tokens of a `messages` line that sets none.
const DEFAULT_OUTPUT_TOKENS: u32 = 256;
/// Spacing of `messages` lines without a `timestamp`.
const DEFAULT_SPACING: Duration = Duration::from_secs(1);

/// A request's prompt, compact until sent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Prompt {
    /// Mooncake's form: 512-token blocks named by id, cut to `input_length`.
    Blocks {
        /// The blocks, in order.
        hash_ids: Vec<u64>,
        /// Prompt tokens.
        input_length: u32,
    },
    /// Token ids.
    Tokens(Vec<u32>),
}

impl Prompt {
    /// Prompt length in tokens.
    pub fn len(&self) -> usize {
        match self {
            Prompt::Blocks { input_length, .. } => *input_length as usize,
            Prompt::Tokens(t) => t.len(),
        }
    }

    /// Whether the prompt is empty (never, for parsed or generated ones).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The token ids.
    pub fn tokens(&self) -> Vec<u32> {
        match self {
            Prompt::Blocks { hash_ids, input_length } => {
                mooncake_tokens(hash_ids, *input_length as usize)
            }
            Prompt::Tokens(t) => t.clone(),
        }
    }
}

/// One request of a workload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceRequest {
    /// Arrival time at rate scale 1.
    pub arrival: Duration,
    /// The prompt.
    pub prompt: Prompt,
    /// Output tokens to generate (`max_tokens`, EOS ignored).
    pub output_tokens: u32,
    /// The base model it names: an index into [`Workload::models`] (0 when
    /// the workload has one model). Only that model's pool may serve it.
    pub model: u32,
    /// The LoRA adapter it names, if any. It is folded into the block keys,
    /// as vLLM folds it into its block hashes.
    pub adapter: Option<String>,
}

impl TraceRequest {
    /// A request for the base model (pool 0), without an adapter.
    pub fn plain(arrival: Duration, prompt: Prompt, output_tokens: u32) -> TraceRequest {
        TraceRequest { arrival, prompt, output_tokens, model: 0, adapter: None }
    }

    /// The block keys of `tokens` (this request's prompt) as the index and
    /// the router see them: the adapter's name folded in.
    pub fn block_keys(&self, tokens: &[u32], block_size: usize) -> Vec<kvgate_index::BlockKey> {
        kvgate_index::block_keys(tokens, block_size, self.adapter.as_deref())
    }
}

/// A whole workload.
#[derive(Clone, Debug, Default)]
pub struct Workload {
    /// What it is (file name or generator spec), for reports.
    pub name: String,
    /// Requests in arrival order.
    pub requests: Vec<TraceRequest>,
    /// Lines skipped as malformed.
    pub skipped: Vec<LineError>,
    /// The base models its requests name (`TraceRequest::model` indexes
    /// it); empty for a one-model workload. A fleet gives each its own pool.
    pub models: Vec<String>,
    /// GPU LoRA slots per engine the workload asks for (`synthetic:lora`'s
    /// `max_loras`); `None` keeps the fleet's.
    pub max_loras: Option<u32>,
}

impl Workload {
    /// Keeps the first `n` requests.
    pub fn truncate(&mut self, n: usize) {
        self.requests.truncate(n);
    }

    /// Arrival time of request `i` at `rate_scale` × the workload's rate.
    pub fn arrival(&self, i: usize, rate_scale: f64) -> Duration {
        self.requests[i].arrival.div_f64(rate_scale)
    }

    /// The workload's own request rate (requests ÷ span, per second); the
    /// span is at least one second.
    pub fn base_rate(&self) -> f64 {
        let span = self.requests.last().map_or(0.0, |r| r.arrival.as_secs_f64());
        self.requests.len() as f64 / span.max(1.0)
    }

    /// Total prompt tokens.
    pub fn prompt_tokens(&self) -> u64 {
        self.requests.iter().map(|r| r.prompt.len() as u64).sum()
    }

    /// Whether any request names a LoRA adapter.
    pub fn has_adapters(&self) -> bool {
        self.requests.iter().any(|r| r.adapter.is_some())
    }

    /// The name of request `i`'s model (`""` for a one-model workload).
    pub fn model_name(&self, i: usize) -> &str {
        self.models.get(self.requests[i].model as usize).map_or("", String::as_str)
    }

    fn sort(&mut self) {
        // Stable: requests with equal timestamps keep file order.
        self.requests.sort_by_key(|r| r.arrival);
    }
}

/// The trace formats `--trace` reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TraceFormat {
    /// Mooncake JSONL.
    Mooncake,
    /// OpenAI `messages` JSON lines.
    Messages,
}

impl std::str::FromStr for TraceFormat {
    type Err = ReplayError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "mooncake" => Ok(TraceFormat::Mooncake),
            "messages" => Ok(TraceFormat::Messages),
            _ => Err(ReplayError::UnknownFormat(format!(
                "unknown format {s:?}; expected mooncake or messages"
            ))),
        }
    }
}

/// The format of the first parseable line: `hash_ids` means Mooncake,
/// `messages` means a conversation file.
pub fn detect_format(text: &str) -> Result<TraceFormat, ReplayError> {
    for line in text.lines().filter(|l| !l.trim().is_empty()).take(16) {
        let Ok(serde_json::Value::Object(m)) = serde_json::from_str::<serde_json::Value>(line)
        else {
            continue;
        };
        if m.contains_key("hash_ids") {
            return Ok(TraceFormat::Mooncake);
        }
        if m.contains_key("messages") {
            return Ok(TraceFormat::Messages);
        }
    }
    Err(ReplayError::UnknownFormat(
        "no line among the first 16 has `hash_ids` (mooncake) or `messages`; pass --format".into(),
    ))
}

/// splitmix64's finaliser: a fixed, well-mixed function of `z`.
pub(crate) fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The tokens of a Mooncake prompt: 512 per hash id, a function of the id
/// and the position in the block only, cut to `input_length`.
pub fn mooncake_tokens(hash_ids: &[u64], input_length: usize) -> Vec<u32> {
    let mut out = Vec::with_capacity(input_length);
    for &h in hash_ids {
        let base = h.wrapping_mul(MOONCAKE_BLOCK_TOKENS as u64);
        for j in 0..MOONCAKE_BLOCK_TOKENS as u64 {
            if out.len() == input_length {
                return out;
            }
            out.push((mix(base.wrapping_add(j)) % VOCAB) as u32);
        }
    }
    out
}

#[derive(Deserialize)]
struct MooncakeLine {
    timestamp: f64,
    input_length: u64,
    output_length: u64,
    hash_ids: Vec<u64>,
}

fn mooncake_line(line: &str) -> Result<TraceRequest, String> {
    let m: MooncakeLine = serde_json::from_str(line).map_err(|e| e.to_string())?;
    if !(m.timestamp.is_finite() && m.timestamp >= 0.0) {
        return Err(format!("timestamp {} is not a finite number >= 0", m.timestamp));
    }
    if m.input_length == 0 {
        return Err("input_length is 0".into());
    }
    if m.input_length > u64::from(u32::MAX) {
        return Err(format!("input_length {} is too large", m.input_length));
    }
    let blocks = m.input_length.div_ceil(MOONCAKE_BLOCK_TOKENS as u64);
    if blocks != m.hash_ids.len() as u64 {
        return Err(format!(
            "input_length {} needs {blocks} hash_ids of {MOONCAKE_BLOCK_TOKENS} tokens, found {}",
            m.input_length,
            m.hash_ids.len()
        ));
    }
    Ok(TraceRequest::plain(
        Duration::from_secs_f64(m.timestamp / 1000.0),
        Prompt::Blocks { hash_ids: m.hash_ids, input_length: m.input_length as u32 },
        // The engine needs at least one output token.
        m.output_length.clamp(1, u64::from(u32::MAX)) as u32,
    ))
}

/// Collects parsed lines; a bad one is skipped or, when `strict`, the error.
fn parse_lines(
    text: &str,
    strict: bool,
    name: &str,
    mut parse: impl FnMut(usize, &str) -> Result<TraceRequest, String>,
) -> Result<Workload, ReplayError> {
    let mut w = Workload { name: name.to_owned(), ..Workload::default() };
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        match parse(i, line) {
            Ok(r) => w.requests.push(r),
            Err(message) => {
                let e = LineError { line: i + 1, message };
                if strict {
                    return Err(ReplayError::BadLine(e));
                }
                w.skipped.push(e);
            }
        }
    }
    w.sort();
    Ok(w)
}

/// Parses a Mooncake JSONL trace.
pub fn parse_mooncake(text: &str, strict: bool, name: &str) -> Result<Workload, ReplayError> {
    parse_lines(text, strict, name, |_, l| mooncake_line(l))
}

#[derive(Deserialize)]
struct MessagesLine {
    messages: Vec<serde_json::Value>,
    #[serde(default)]
    timestamp: Option<f64>,
    #[serde(default)]
    max_tokens: Option<u32>,
    #[serde(default)]
    output_length: Option<u32>,
    /// The base model (pool) the line is for; lines without one go to the
    /// pool named [`DEFAULT_MODEL`] when others name one.
    #[serde(default)]
    model: Option<String>,
    /// A LoRA adapter of that model.
    #[serde(default)]
    adapter: Option<String>,
}

/// The model of `messages` lines that name none, in a file where some do.
pub const DEFAULT_MODEL: &str = "default";

/// Parses OpenAI `messages` lines, rendering each through `tokenizer`'s chat
/// template (generation prompt on, as a chat request). Lines without a
/// `timestamp` (ms) arrive one second after the previous line. An optional
/// `model` picks the base model's pool and `adapter` a LoRA adapter of it
/// (replay's own keys: vLLM names the adapter in `model`, which needs a
/// model→adapter table that a trace line does not carry).
pub fn parse_messages(
    text: &str,
    strict: bool,
    name: &str,
    tokenizer: &ChatTokenizer,
) -> Result<Workload, ReplayError> {
    let mut previous = Duration::ZERO;
    let mut first = true;
    let mut models: Vec<String> = Vec::new();
    let mut w = parse_lines(text, strict, name, |_, l| {
        let m: MessagesLine = serde_json::from_str(l).map_err(|e| e.to_string())?;
        let arrival = match m.timestamp {
            Some(t) if t.is_finite() && t >= 0.0 => Duration::from_secs_f64(t / 1000.0),
            Some(t) => return Err(format!("timestamp {t} is not a finite number >= 0")),
            None if first => Duration::ZERO,
            None => previous + DEFAULT_SPACING,
        };
        if m.messages.is_empty() {
            return Err("messages is empty".into());
        }
        let tokens = tokenizer
            .encode_chat(&ChatRequest::new(m.messages))
            .map_err(|e| format!("chat template: {e}"))?;
        if tokens.is_empty() {
            return Err("the rendered prompt is empty".into());
        }
        first = false;
        previous = arrival;
        let output = m.max_tokens.or(m.output_length).unwrap_or(DEFAULT_OUTPUT_TOKENS).max(1);
        let model = m.model.as_deref().filter(|s| !s.is_empty()).unwrap_or(DEFAULT_MODEL);
        let model = match models.iter().position(|x| x == model) {
            Some(k) => k,
            None => {
                models.push(model.to_owned());
                models.len() - 1
            }
        } as u32;
        let adapter = m.adapter.filter(|a| !a.is_empty());
        Ok(TraceRequest {
            arrival,
            prompt: Prompt::Tokens(tokens),
            output_tokens: output,
            model,
            adapter,
        })
    })?;
    // A file that names no model is a one-model workload, as before.
    if models.len() > 1 || models.first().is_some_and(|m| m != DEFAULT_MODEL) {
        w.models = models;
    }
    Ok(w)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn tokens_share_exactly_where_ids_share(
            a in prop::collection::vec(0u64..6, 1..6),
            b in prop::collection::vec(0u64..6, 1..6),
            cut_a in 0usize..512,
            cut_b in 0usize..512,
        ) {
            let (na, nb) = (a.len() * 512 - cut_a, b.len() * 512 - cut_b);
            let (ta, tb) = (mooncake_tokens(&a, na), mooncake_tokens(&b, nb));
            prop_assert_eq!(ta.len(), na);
            prop_assert_eq!(tb.len(), nb);
            // Blocks at the same position with equal ids hold equal tokens.
            for (k, (x, y)) in a.iter().zip(&b).enumerate() {
                let (ra, rb) = (k * 512..((k + 1) * 512).min(na), k * 512..((k + 1) * 512).min(nb));
                let n = ra.len().min(rb.len());
                let (sa, sb) = (&ta[ra.start..ra.start + n], &tb[rb.start..rb.start + n]);
                prop_assert_eq!(x == y, sa == sb);
            }
        }

        #[test]
        fn any_text_parses_without_panicking_and_errors_name_real_lines(
            lines in prop::collection::vec(".{0,40}", 0..20),
        ) {
            let text = lines.join("\n");
            let w = parse_mooncake(&text, false, "p").unwrap();
            let n_lines = text.lines().count();
            for e in &w.skipped {
                prop_assert!(e.line >= 1 && e.line <= n_lines);
            }
            prop_assert!(w.requests.len() + w.skipped.len() <= n_lines);
        }
    }

    #[test]
    fn a_wrong_block_count_or_length_is_a_numbered_error() {
        let w = parse_mooncake(
            "{\"timestamp\": 0, \"input_length\": 0, \"output_length\": 1, \"hash_ids\": []}\n\
             {\"timestamp\": -1, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": [1]}\n\
             {\"timestamp\": 0, \"input_length\": 513, \"output_length\": 1, \"hash_ids\": [1]}",
            false,
            "t",
        )
        .unwrap();
        assert!(w.requests.is_empty());
        let msgs: Vec<String> = w.skipped.iter().map(LineError::to_string).collect();
        assert!(msgs[0].starts_with("line 1: input_length is 0"), "{msgs:?}");
        assert!(msgs[1].starts_with("line 2: timestamp"), "{msgs:?}");
        assert!(msgs[2].starts_with("line 3: input_length 513 needs 2 hash_ids"), "{msgs:?}");
    }

    #[test]
    fn equal_ids_give_equal_tokens_and_the_last_block_is_cut() {
        let a = mooncake_tokens(&[7, 8, 9], 1100);
        let b = mooncake_tokens(&[7, 8, 10], 1300);
        assert_eq!(a.len(), 1100);
        assert_eq!(b.len(), 1300);
        assert_eq!(a[..1024], b[..1024]);
        assert_ne!(a[1024..1100], b[1024..1100]);
        // Position matters inside a block, and ids differ from each other.
        let c = mooncake_tokens(&[8], 512);
        assert_eq!(c[..], a[512..1024]);
        assert_ne!(a[..512], c[..]);
    }

    #[test]
    fn bad_lines_are_numbered_and_skipped_or_fatal() {
        let text = "{\"timestamp\": 0, \"input_length\": 600, \"output_length\": 5, \"hash_ids\": [1, 2]}\n\
                    \n\
                    not json\n\
                    {\"timestamp\": 5, \"input_length\": 600, \"output_length\": 5, \"hash_ids\": [1]}\n\
                    {\"timestamp\": 3, \"input_length\": 10, \"output_length\": 0, \"hash_ids\": [4]}\n";
        let w = parse_mooncake(text, false, "t").unwrap();
        assert_eq!(w.requests.len(), 2);
        assert_eq!(w.skipped.iter().map(|e| e.line).collect::<Vec<_>>(), vec![3, 4]);
        assert!(w.skipped[1].message.contains("needs 2 hash_ids"), "{}", w.skipped[1]);
        // Sorted by arrival; output 0 becomes 1.
        assert_eq!(w.requests[1].arrival, Duration::from_millis(3));
        assert_eq!(w.requests[1].output_tokens, 1);
        let err = parse_mooncake(text, true, "t").unwrap_err();
        assert!(err.to_string().starts_with("line 3: "), "{err}");
    }

    #[test]
    fn formats_are_detected() {
        let m =
            "\n{\"timestamp\": 0, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": [0]}";
        assert_eq!(detect_format(m).unwrap(), TraceFormat::Mooncake);
        let c = "garbage\n{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}";
        assert_eq!(detect_format(c).unwrap(), TraceFormat::Messages);
        assert!(detect_format("{}\n[1]").is_err());
    }

    #[test]
    fn messages_may_name_a_model_and_an_adapter() {
        let tok = ChatTokenizer::bundled().unwrap();
        let hi = "[{\"role\": \"user\", \"content\": \"hi\"}]";
        let text = format!(
            "{{\"messages\": {hi}, \"model\": \"a\"}}\n\
             {{\"messages\": {hi}, \"model\": \"b\", \"adapter\": \"b-sql\"}}\n\
             {{\"messages\": {hi}}}\n"
        );
        let w = parse_messages(&text, true, "m", &tok).unwrap();
        assert_eq!(w.models, ["a", "b", DEFAULT_MODEL]);
        assert_eq!(w.requests.iter().map(|r| r.model).collect::<Vec<_>>(), [0, 1, 2]);
        assert_eq!(w.requests[1].adapter.as_deref(), Some("b-sql"));
        assert_eq!(w.model_name(1), "b");
        assert!(w.has_adapters());
        // Without any `model`, a one-model workload as before.
        let plain = parse_messages(&format!("{{\"messages\": {hi}}}"), true, "m", &tok).unwrap();
        assert!(plain.models.is_empty() && !plain.has_adapters());
    }

    #[test]
    fn messages_render_through_the_template() {
        let tok = ChatTokenizer::bundled().unwrap();
        let text = "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", \"content\": \"Hello\"}], \"max_tokens\": 9}\n\
                    {\"messages\": []}\n\
                    {\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", \"content\": \"Hello again\"}]}\n";
        let w = parse_messages(text, false, "c", &tok).unwrap();
        assert_eq!(w.requests.len(), 2);
        assert_eq!(w.skipped[0].line, 2);
        assert_eq!(w.requests[0].output_tokens, 9);
        assert_eq!(w.requests[1].output_tokens, DEFAULT_OUTPUT_TOKENS);
        assert_eq!(w.requests[1].arrival, Duration::from_secs(1));
        let (a, b) = (w.requests[0].prompt.tokens(), w.requests[1].prompt.tokens());
        let common = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
        assert!(common >= 5, "shared system prompt renders to a shared prefix");
    }
}
