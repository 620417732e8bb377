//! What the future-work charge remembers (docs/routing.md, "Future work"):
//! per replica, the prefill work recently routed there, and for the fleet,
//! how much of recently routed prompts was already cached somewhere.
//!
//! Both decay per decision, not per second, so the estimator needs no clock
//! and no rate knob: each decision keeps `1 − 1 / (ATTRACT_MEMORY × R)` of
//! what came before, with `R` replicas, so it remembers about
//! `ATTRACT_MEMORY` decisions per replica.

/// How many decisions per replica the shares remember.
pub(crate) const ATTRACT_MEMORY: f64 = 8.0;

/// Decayed per-replica shares of routed prefill work, and the decayed
/// reuse ratio of routed prompts.
#[derive(Clone, Debug, Default)]
pub(crate) struct Attraction {
    /// Per replica slot: prefill tokens routed there, decayed.
    shares: Vec<f64>,
    /// Prompt tokens of routed requests that some replica already held
    /// (the prompt less the fewest uncached tokens of any candidate), decayed.
    reused_tokens: f64,
    /// Prompt tokens of routed requests, decayed the same way.
    prompt_tokens: f64,
}

impl Attraction {
    /// The decayed work routed to `slot` (0 before it was first seen).
    pub(crate) fn share(&self, slot: usize) -> f64 {
        self.shares.get(slot).copied().unwrap_or(0.0)
    }

    /// The fraction of recently routed prompt tokens that were cached
    /// somewhere in the fleet when they were routed: how much of what is
    /// routed gets reused later. On traffic without reuse it is 0, and a
    /// request there has no later turns that its placement could attract,
    /// so the future-work charge, scaled by it, vanishes.
    pub(crate) fn reuse(&self) -> f64 {
        if self.prompt_tokens > 0.0 {
            (self.reused_tokens / self.prompt_tokens).clamp(0.0, 1.0)
        } else {
            0.0
        }
    }

    /// Records a routed decision: `work` uncached tokens to `slot`, of a
    /// prompt of `prompt` tokens whose least uncached work on any candidate
    /// was `floor`; `slots` are the replica slots that took part (the chosen one among them).
    ///
    /// A slot seen for the first time starts at the mean share of the slots
    /// already known, and the very first decision starts every slot at the
    /// steady share of that request's size (`ATTRACT_MEMORY × work`): shares
    /// counted from zero over a handful of decisions are mostly noise, and
    /// measured as such they made the replica that had happened to get the
    /// least in the first decisions (or a replica just added) the cheapest
    /// place for everything, queue or not.
    pub(crate) fn record<I>(&mut self, slot: usize, slots: I, work: u64, prompt: u64, floor: u64)
    where
        I: Iterator<Item = usize> + Clone,
    {
        let replicas = slots.clone().count().max(1) as f64;
        let keep = 1.0 - 1.0 / (ATTRACT_MEMORY * replicas);
        let top = slots.clone().chain([slot]).max().unwrap_or(slot);
        if self.shares.len() <= top {
            self.shares.resize(top + 1, 0.0);
        }
        // Only when a slot is new (rare): no allocation on the decision path.
        if slots.clone().chain([slot]).any(|s| self.shares[s] <= 0.0) {
            let (sum, n) = self
                .shares
                .iter()
                .filter(|s| **s > 0.0)
                .fold((0.0, 0usize), |(sum, n), s| (sum + s, n + 1));
            let start = if n == 0 { ATTRACT_MEMORY * work as f64 } else { sum / n as f64 };
            for s in slots.chain([slot]) {
                if self.shares[s] <= 0.0 {
                    self.shares[s] = start;
                }
            }
        }
        for a in &mut self.shares {
            *a *= keep;
        }
        self.shares[slot] += work as f64;
        self.reused_tokens = keep * self.reused_tokens + prompt.saturating_sub(floor) as f64;
        self.prompt_tokens = keep * self.prompt_tokens + prompt as f64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_decisions_do_not_make_one_replica_a_magnet() {
        let mut a = Attraction::default();
        let slots = [0, 1, 2, 3];
        for slot in 0..3 {
            a.record(slot, slots.iter().copied(), 2048, 2048, 2048);
        }
        // Counted from zero, slot 3 would have no share against three
        // requests elsewhere: an excess of 4/3 of a request for the others.
        let total: f64 = slots.iter().map(|&s| a.share(s)).sum();
        let least = slots.iter().map(|&s| a.share(s)).fold(f64::INFINITY, f64::min);
        let excess = 4.0 * (a.share(0) - least) / total;
        assert!(excess > 0.0 && excess < 0.15, "{excess}");
    }

    #[test]
    fn a_new_replica_starts_at_the_mean_share() {
        let mut a = Attraction::default();
        for i in 0..40 {
            a.record(i % 2, 0..2, 1000 + 100 * (i as u64 % 3), 4000, 1000);
        }
        let mean = (a.share(0) + a.share(1)) / 2.0;
        a.record(0, 0..3, 1000, 4000, 1000);
        let keep = 1.0 - 1.0 / (ATTRACT_MEMORY * 3.0);
        assert!((a.share(2) - mean * keep).abs() < 1e-9, "{} vs {}", a.share(2), mean * keep);
    }

    #[test]
    fn reuse_is_the_cached_share_of_routed_prompts() {
        let mut a = Attraction::default();
        assert_eq!(a.reuse(), 0.0);
        for _ in 0..100 {
            a.record(0, 0..2, 3000, 3000, 3000);
        }
        assert_eq!(a.reuse(), 0.0, "nothing cached anywhere: nothing to attract");
        for _ in 0..400 {
            a.record(1, 0..2, 500, 4000, 500);
        }
        assert!((a.reuse() - 0.875).abs() < 1e-3, "{}", a.reuse());
    }
}
