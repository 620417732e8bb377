//! `synthetic:lora`: chat sessions spread over several base models and
//! their LoRA adapters. What it is for: a fleet split into one
//! pool per base model, where each replica holds only `max_loras` adapters
//! in GPU slots, so where a request goes decides both its cache reuse and
//! whether its adapter has to be loaded.
//!
//! - `models` base models, named `model-M`, each with its share of the
//!   sessions (equal).
//! - `adapters` adapters in all (not per model), dealt round-robin: adapter
//!   `j` belongs to model `j % models` with rank `j / models`, named
//!   `model-M-lora-R`. The acceptance shape, two models with eight adapters
//!   each, is `models=2,adapters=16`.
//! - A session uses its model's base weights with probability `base_share`,
//!   else one of its model's adapters with Zipf popularity (rank `r` has
//!   weight `1 / (r + 1)^zipf`; `zipf=0` is uniform).
//! - Sessions are `synthetic:chat` conversations: one of the model's
//!   `system_prompts` shared prompts, then every turn re-sends the history.
//!   The adapter is part of every block key, so reuse exists within one
//!   adapter (same system prompt, later turns), never across adapters.
//! - `max_loras` is the GPU adapter slot count the fleet's engines get.

use super::{Rng, SyntheticSpec};
use crate::error::ReplayError;
use crate::workload::TraceRequest;

/// Keys `synthetic:lora` takes, with defaults.
pub(super) const DEFAULTS: &[(&str, f64)] = &[
    ("seed", 0.0),
    ("models", 2.0),
    ("adapters", 16.0),
    ("zipf", 1.0),
    ("base_share", 0.2),
    ("max_loras", 4.0),
    ("conversations", 400.0),
    ("turns", 4.0),
    ("system_prompts", 4.0),
    ("system_tokens", 1024.0),
    ("user_tokens", 256.0),
    ("output_tokens", 128.0),
    ("think_s", 10.0),
    ("rate", 8.0),
];

/// Keys that may be 0.
pub(super) const MAY_BE_ZERO: &[&str] = &["adapters", "zipf", "base_share"];

/// Limits beyond the generic ones (finite, >= 0, <= 1e9).
pub(super) fn validate(spec: &SyntheticSpec) -> Result<(), ReplayError> {
    let bad = |m: String| Err(ReplayError::InvalidWorkload(m));
    let base = spec.get("base_share");
    if base > 1.0 {
        return bad(format!("base_share={base} must be within 0..=1"));
    }
    // Names and pools stay few: a pool needs at least one replica.
    if spec.get("models") > 256.0 {
        return bad(format!("models={} must be at most 256", spec.get("models")));
    }
    if spec.get("adapters") > 4096.0 {
        return bad(format!("adapters={} must be at most 4096", spec.get("adapters")));
    }
    let slots = spec.get("max_loras");
    if !(1.0..=1024.0).contains(&slots.round()) {
        return bad(format!("max_loras={slots} must be within 1..=1024"));
    }
    if spec.get("zipf") > 16.0 {
        return bad(format!("zipf={} must be at most 16", spec.get("zipf")));
    }
    Ok(())
}

/// The name of model `m`.
pub fn model_name(m: usize) -> String {
    format!("model-{m}")
}

/// The name of the adapter of model `m` with popularity rank `r`.
pub fn adapter_name(m: usize, r: usize) -> String {
    format!("model-{m}-lora-{r}")
}

/// The requests and the model names.
pub(super) fn generate(spec: &SyntheticSpec, seed: u64) -> (Vec<TraceRequest>, Vec<String>) {
    let n_models = spec.count("models");
    let n_adapters = spec.get("adapters").round() as usize;
    let turns = spec.count("turns");
    // Adapters of model m: ranks 0..per_model[m].
    let per_model: Vec<usize> =
        (0..n_models).map(|m| (n_adapters + n_models - 1 - m) / n_models).collect();
    let zipf = spec.get("zipf");
    let cdfs: Vec<Vec<f64>> = per_model
        .iter()
        .map(|&k| {
            let w: Vec<f64> = (0..k).map(|r| ((r + 1) as f64).powf(-zipf)).collect();
            let total: f64 = w.iter().sum();
            w.iter()
                .scan(0.0, |acc, x| {
                    *acc += x / total;
                    Some(*acc)
                })
                .collect()
        })
        .collect();
    let mut shared = Rng::new(seed, 1);
    let systems: Vec<Vec<Vec<u32>>> = (0..n_models)
        .map(|_| {
            (0..spec.count("system_prompts"))
                .map(|_| {
                    let n = shared.around(spec.get("system_tokens"));
                    shared.tokens(n)
                })
                .collect()
        })
        .collect();
    let conv_rate = spec.get("rate") / turns as f64;
    let mut clock = Rng::new(seed, 2);
    let mut start = 0.0;
    let n_conv = spec.count("conversations");
    let mut out = Vec::with_capacity(n_conv * turns);
    for c in 0..n_conv {
        start += clock.exp_s(1.0 / conv_rate);
        let mut rng = Rng::new(seed, 1000 + c as u64);
        let m = (rng.next_u64() % n_models as u64) as usize;
        let use_base = rng.unit() < spec.get("base_share") || per_model[m] == 0;
        let u = rng.unit();
        let adapter = (!use_base).then(|| {
            let r = cdfs[m].iter().position(|&x| u < x).unwrap_or(per_model[m] - 1);
            adapter_name(m, r)
        });
        let prompts = &systems[m];
        let system = prompts[(rng.next_u64() % prompts.len() as u64) as usize].clone();
        spec.conversation(&mut rng, system, start, (m as u32, adapter), &mut out);
    }
    (out, (0..n_models).map(model_name).collect())
}

#[cfg(test)]
mod tests {
    use super::super::SyntheticKind;
    use super::*;

    fn spec(s: &str) -> SyntheticSpec {
        s.parse().unwrap()
    }

    #[test]
    fn bad_specs_are_clear_errors() {
        for s in [
            "lora,base_share=1.5",
            "lora,models=0",
            "lora,models=1000",
            "lora,max_loras=0",
            "lora,max_loras=5000",
            "lora,zipf=-1",
            "lora,adapters=nan",
            "lora,adapters",
            "lora,unknown=1",
        ] {
            let e = s.parse::<SyntheticSpec>().unwrap_err().to_string();
            assert!(e.starts_with("invalid workload: "), "{s}: {e}");
        }
        let s = spec("synthetic:lora,adapters=0,base_share=0,zipf=0");
        assert_eq!(s.kind, SyntheticKind::Lora);
    }

    #[test]
    fn adapters_belong_to_their_model_and_follow_zipf() {
        let w = spec("lora,models=2,adapters=16,conversations=2000,turns=1,base_share=0.2")
            .generate(Some(3));
        assert_eq!(w.models, ["model-0", "model-1"]);
        assert_eq!(w.max_loras, Some(4));
        let mut counts = [[0usize; 8]; 2];
        let mut base = 0;
        for r in &w.requests {
            let m = r.model as usize;
            match &r.adapter {
                None => base += 1,
                Some(a) => {
                    let rank: usize = a
                        .strip_prefix(&format!("model-{m}-lora-"))
                        .expect("an adapter of the request's own model")
                        .parse()
                        .unwrap();
                    counts[m][rank] += 1;
                }
            }
        }
        // 20% base, within sampling noise; rank 0 about 1/H(8) = 37% of the
        // rest and twice rank 1.
        assert!((300..500).contains(&base), "{base}");
        for c in counts {
            let n: usize = c.iter().sum();
            assert!(c[0] as f64 > 0.3 * n as f64 && (c[0] as f64) < 0.45 * n as f64, "{c:?}");
            assert!(c[0] > c[1] && c[1] > c[3] && c[3] > c[7], "{c:?}");
        }
        // Uneven splits: 5 adapters over 2 models give 3 and 2.
        let w = spec("lora,models=2,adapters=5,base_share=0,conversations=300,turns=1")
            .generate(Some(1));
        let names: std::collections::BTreeSet<_> =
            w.requests.iter().filter_map(|r| r.adapter.clone()).collect();
        assert_eq!(names.len(), 5, "{names:?}");
    }

    #[test]
    fn sessions_extend_their_prompt_under_one_adapter() {
        let w = spec("lora,conversations=1,turns=4,think_s=1,base_share=0").generate(Some(5));
        assert_eq!(w.requests.len(), 4);
        let a = &w.requests[0];
        assert!(a.adapter.is_some());
        for pair in w.requests.windows(2) {
            let (x, y) = (pair[0].prompt.tokens(), pair[1].prompt.tokens());
            assert!(y.len() > x.len() && y[..x.len()] == x[..]);
            assert_eq!((pair[0].model, &pair[0].adapter), (pair[1].model, &pair[1].adapter));
        }
        // The same tokens under another adapter share no block key.
        let t = a.prompt.tokens();
        let mut other = a.clone();
        other.adapter = Some("model-0-lora-99".into());
        let (ka, kb) = (a.block_keys(&t, 16), other.block_keys(&t, 16));
        assert!(ka.iter().zip(&kb).all(|(x, y)| x != y));
    }
}
