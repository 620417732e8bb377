//! Seeded workload generators, `--workload synthetic:KIND[,key=value...]`:
//!
//! - `chat`: multi-turn conversations. Each picks one of a few shared system
//!   prompts; turn k re-sends the system prompt, every earlier user and
//!   assistant message, and a new user message. Conversations start as a
//!   Poisson process; turns follow after exponential think times.
//! - `agentic`: tool loops. Every session starts with a prefix shared by all
//!   (tool definitions) and its own task context; each step re-sends the
//!   whole growing context plus the last step's output and tool result.
//! - `noreuse`: independent prompts of random tokens: no two share a block.
//!   With nothing to reuse, a cache-aware policy can only match least load.
//! - `lora`: chat sessions over several base models and their LoRA adapters
//!   (`synthetic/lora.rs`).
//!
//! Lengths are uniform in `[mean/2, 3·mean/2]`; `rate` is the offered
//! request rate (requests/s). Equal seeds give equal workloads.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::error::ReplayError;
use crate::workload::{mix, Prompt, TraceRequest, Workload};

mod lora;
pub use lora::{adapter_name, model_name};

/// Which generator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SyntheticKind {
    /// Multi-turn chat with shared system prompts.
    Chat,
    /// Agentic loops re-sending a growing context.
    Agentic,
    /// Unique prompts, no reuse at all.
    NoReuse,
    /// Chat sessions over base models and their LoRA adapters.
    Lora,
}

/// A parsed `synthetic:KIND[,key=value...]` spec.
#[derive(Clone, Debug, PartialEq)]
pub struct SyntheticSpec {
    /// The generator.
    pub kind: SyntheticKind,
    /// Its parameters, defaults filled in.
    pub params: BTreeMap<String, f64>,
}

/// The keys each generator takes, with defaults.
fn defaults(kind: SyntheticKind) -> &'static [(&'static str, f64)] {
    match kind {
        SyntheticKind::Chat => &[
            ("seed", 0.0),
            ("conversations", 400.0),
            ("turns", 6.0),
            ("system_prompts", 8.0),
            ("system_tokens", 2048.0),
            ("user_tokens", 256.0),
            ("output_tokens", 256.0),
            ("think_s", 20.0),
            ("rate", 8.0),
        ],
        SyntheticKind::Agentic => &[
            ("seed", 0.0),
            ("sessions", 100.0),
            ("steps", 12.0),
            ("shared_tokens", 1024.0),
            ("context_tokens", 4096.0),
            ("step_tokens", 512.0),
            ("output_tokens", 128.0),
            ("step_s", 3.0),
            ("rate", 6.0),
        ],
        SyntheticKind::NoReuse => &[
            ("seed", 0.0),
            ("requests", 2000.0),
            ("input_tokens", 2048.0),
            ("output_tokens", 128.0),
            ("rate", 30.0),
        ],
        SyntheticKind::Lora => lora::DEFAULTS,
    }
}

impl std::str::FromStr for SyntheticSpec {
    type Err = ReplayError;

    /// `chat`, `agentic`, `noreuse` or `lora`, then `,key=value` pairs (with
    /// or without the `synthetic:` prefix).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.strip_prefix("synthetic:").unwrap_or(s);
        let mut parts = s.split(',');
        let kind = match parts.next().unwrap_or("") {
            "chat" => SyntheticKind::Chat,
            "agentic" => SyntheticKind::Agentic,
            "noreuse" => SyntheticKind::NoReuse,
            "lora" => SyntheticKind::Lora,
            k => {
                return Err(ReplayError::InvalidWorkload(format!(
                    "unknown generator {k:?}; expected chat, agentic, noreuse or lora"
                )))
            }
        };
        let table = defaults(kind);
        let mut params: BTreeMap<String, f64> =
            table.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect();
        for p in parts.filter(|p| !p.is_empty()) {
            let bad = |m: String| ReplayError::InvalidWorkload(m);
            let (k, v) = p.split_once('=').ok_or_else(|| bad(format!("{p:?} is not key=value")))?;
            if !params.contains_key(k) {
                let keys: Vec<_> = table.iter().map(|(k, _)| *k).collect();
                return Err(bad(format!("unknown key {k:?}; expected one of {}", keys.join(", "))));
            }
            let v: f64 = v.parse().map_err(|_| bad(format!("{k}={v:?} is not a number")))?;
            let may_be_zero = k == "seed"
                || k == "think_s"
                || k == "step_s"
                || (kind == SyntheticKind::Lora && lora::MAY_BE_ZERO.contains(&k));
            if !v.is_finite() || v < 0.0 || (!may_be_zero && v == 0.0) || v > 1e9 {
                return Err(bad(format!("{k}={v} is out of range")));
            }
            params.insert(k.to_owned(), v);
        }
        let spec = SyntheticSpec { kind, params };
        if kind == SyntheticKind::Lora {
            lora::validate(&spec)?;
        }
        Ok(spec)
    }
}

/// splitmix64 stream.
struct Rng(u64);

impl Rng {
    fn new(seed: u64, stream: u64) -> Rng {
        Rng(mix(seed ^ mix(stream)))
    }
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        mix(self.0)
    }
    fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
    fn exp_s(&mut self, mean_s: f64) -> f64 {
        -mean_s * (1.0 - self.unit()).ln()
    }
    /// Uniform in [mean/2, 3·mean/2], at least 1.
    fn around(&mut self, mean: f64) -> usize {
        ((mean * (0.5 + self.unit())).round() as usize).max(1)
    }
    fn tokens(&mut self, n: usize) -> Vec<u32> {
        // Above the engines' filler range (1000..2000), below every vocab size.
        (0..n).map(|_| 2_000 + (self.next_u64() % 148_000) as u32).collect()
    }
}

impl SyntheticSpec {
    fn get(&self, k: &str) -> f64 {
        self.params.get(k).copied().unwrap_or(0.0)
    }

    fn count(&self, k: &str) -> usize {
        self.get(k).round().max(1.0) as usize
    }

    /// The spec as text, for reports.
    pub fn describe(&self) -> String {
        let kind = match self.kind {
            SyntheticKind::Chat => "chat",
            SyntheticKind::Agentic => "agentic",
            SyntheticKind::NoReuse => "noreuse",
            SyntheticKind::Lora => "lora",
        };
        let kv: Vec<String> = self.params.iter().map(|(k, v)| format!("{k}={v}")).collect();
        format!("synthetic:{kind},{}", kv.join(","))
    }

    /// Generates the workload (`seed` overrides the spec's seed when given).
    pub fn generate(&self, seed: Option<u64>) -> Workload {
        let seed = seed.unwrap_or(self.get("seed") as u64);
        let (mut requests, models) = match self.kind {
            SyntheticKind::Chat => (self.chat(seed), Vec::new()),
            SyntheticKind::Agentic => (self.agentic(seed), Vec::new()),
            SyntheticKind::NoReuse => (self.noreuse(seed), Vec::new()),
            SyntheticKind::Lora => lora::generate(self, seed),
        };
        requests.sort_by_key(|r| r.arrival);
        let mut spec = self.clone();
        spec.params.insert("seed".into(), seed as f64);
        let max_loras =
            (self.kind == SyntheticKind::Lora).then(|| self.get("max_loras").round() as u32);
        Workload { name: spec.describe(), requests, models, max_loras, ..Workload::default() }
    }

    fn chat(&self, seed: u64) -> Vec<TraceRequest> {
        let (n_conv, turns) = (self.count("conversations"), self.count("turns"));
        let mut shared = Rng::new(seed, 1);
        let systems: Vec<Vec<u32>> = (0..self.count("system_prompts"))
            .map(|_| {
                let n = shared.around(self.get("system_tokens"));
                shared.tokens(n)
            })
            .collect();
        let conv_rate = self.get("rate") / turns as f64;
        let mut clock = Rng::new(seed, 2);
        let mut start = 0.0;
        let mut out = Vec::with_capacity(n_conv * turns);
        for c in 0..n_conv {
            start += clock.exp_s(1.0 / conv_rate);
            let mut rng = Rng::new(seed, 1000 + c as u64);
            let system = systems[(rng.next_u64() % systems.len() as u64) as usize].clone();
            self.conversation(&mut rng, system, start, (0, None), &mut out);
        }
        out
    }

    /// One chat conversation of `turns` turns starting at `start` seconds
    /// from `system`: each turn adds a user message, re-sends the whole
    /// history, and its answer joins the history of the next turn. Every
    /// request is for `model` (and its `adapter`, if any).
    fn conversation(
        &self,
        rng: &mut Rng,
        system: Vec<u32>,
        start: f64,
        (model, adapter): (u32, Option<String>),
        out: &mut Vec<TraceRequest>,
    ) {
        let mut context = system;
        let mut at = start;
        for turn in 0..self.count("turns") {
            if turn > 0 {
                at += rng.exp_s(self.get("think_s"));
            }
            let n_user = rng.around(self.get("user_tokens"));
            context.extend(rng.tokens(n_user));
            let output = rng.around(self.get("output_tokens"));
            out.push(TraceRequest {
                arrival: Duration::from_secs_f64(at),
                prompt: Prompt::Tokens(context.clone()),
                output_tokens: output as u32,
                model,
                adapter: adapter.clone(),
            });
            context.extend(rng.tokens(output));
        }
    }

    fn agentic(&self, seed: u64) -> Vec<TraceRequest> {
        let (n_sessions, steps) = (self.count("sessions"), self.count("steps"));
        let mut shared = Rng::new(seed, 1);
        let tools = shared.tokens(self.count("shared_tokens"));
        let session_rate = self.get("rate") / steps as f64;
        let mut clock = Rng::new(seed, 2);
        let mut start = 0.0;
        let mut out = Vec::with_capacity(n_sessions * steps);
        for s in 0..n_sessions {
            start += clock.exp_s(1.0 / session_rate);
            let mut rng = Rng::new(seed, 1000 + s as u64);
            let mut context = tools.clone();
            let n_ctx = rng.around(self.get("context_tokens"));
            context.extend(rng.tokens(n_ctx));
            let mut at = start;
            for step in 0..steps {
                if step > 0 {
                    at += rng.exp_s(self.get("step_s"));
                }
                let output = rng.around(self.get("output_tokens"));
                out.push(TraceRequest {
                    arrival: Duration::from_secs_f64(at),
                    prompt: Prompt::Tokens(context.clone()),
                    output_tokens: output as u32,
                    model: 0,
                    adapter: None,
                });
                // The model's tool call and the tool's result are re-sent.
                let n_step = output + rng.around(self.get("step_tokens"));
                context.extend(rng.tokens(n_step));
            }
        }
        out
    }

    fn noreuse(&self, seed: u64) -> Vec<TraceRequest> {
        let mut clock = Rng::new(seed, 2);
        let mut at = 0.0;
        (0..self.count("requests"))
            .map(|i| {
                at += clock.exp_s(1.0 / self.get("rate"));
                let mut rng = Rng::new(seed, 1000 + i as u64);
                let n = rng.around(self.get("input_tokens"));
                TraceRequest {
                    arrival: Duration::from_secs_f64(at),
                    prompt: Prompt::Tokens(rng.tokens(n)),
                    output_tokens: rng.around(self.get("output_tokens")) as u32,
                    model: 0,
                    adapter: None,
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse_with_defaults_and_reject_unknown_keys() {
        let s: SyntheticSpec = "synthetic:chat,conversations=10,seed=3".parse().unwrap();
        assert_eq!(s.kind, SyntheticKind::Chat);
        assert_eq!(s.get("conversations"), 10.0);
        assert_eq!(s.get("turns"), 6.0);
        assert!("chat,nope=1".parse::<SyntheticSpec>().is_err());
        assert!("chat,turns=0".parse::<SyntheticSpec>().is_err());
        assert!("chat,turns".parse::<SyntheticSpec>().is_err());
        assert!("video".parse::<SyntheticSpec>().is_err());
    }

    #[test]
    fn generators_are_deterministic_and_shaped() {
        let chat: SyntheticSpec = "chat,conversations=5,turns=3".parse().unwrap();
        let a = chat.generate(Some(1));
        assert_eq!(a.requests, chat.generate(Some(1)).requests);
        assert_ne!(a.requests, chat.generate(Some(2)).requests);
        assert_eq!(a.requests.len(), 15);
        let agentic: SyntheticSpec = "agentic,sessions=3,steps=4".parse().unwrap();
        let g = agentic.generate(None);
        assert_eq!(g.requests.len(), 12);
        let noreuse: SyntheticSpec = "noreuse,requests=50".parse().unwrap();
        let n = noreuse.generate(None);
        assert_eq!(n.requests.len(), 50);
        assert!(n.requests.windows(2).all(|w| w[0].arrival <= w[1].arrival));
    }

    #[test]
    fn chat_turns_extend_their_conversation() {
        let chat: SyntheticSpec = "chat,conversations=1,turns=4,think_s=1".parse().unwrap();
        let w = chat.generate(Some(9));
        for pair in w.requests.windows(2) {
            let (a, b) = (pair[0].prompt.tokens(), pair[1].prompt.tokens());
            assert!(b.len() > a.len() && b[..a.len()] == a[..], "turns extend the prompt");
        }
    }
}
