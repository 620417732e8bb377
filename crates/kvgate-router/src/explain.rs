//! Why a decision went where it went: per candidate, the overlap per tier,
//! the load and the predicted TTFT, plus the reason for the winner. Cheap
//! enough to build for every decision and keep the last N.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use kvgate_index::ReplicaId;

use crate::config::PolicyKind;
use crate::replica::Health;

/// One replica as the decision saw it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Candidate {
    /// The replica.
    pub replica: ReplicaId,
    /// Its health at decision time.
    pub health: Health,
    /// Over its busy thresholds.
    pub busy: bool,
    /// Cached prefix blocks per tier from events (GPU, CPU, storage).
    pub overlap_blocks: [u32; 3],
    /// Further prefix blocks counted from tentative (routed, unconfirmed) blocks.
    pub tentative_blocks: u32,
    /// Pending prefill tokens ahead (ledger plus unbooked engine load).
    pub pending_prefill_tokens: u64,
    /// Sequences decoding.
    pub decoding: u32,
    /// Requests in flight (ledger plus unbooked engine load).
    pub requests: u32,
    /// KV blocks the ledger has booked there.
    pub booked_blocks: u64,
    /// Predicted TTFT there, seconds.
    pub predicted_ttft_s: f64,
    /// The policy's score (lower is better; for `approx_prefix`, matched symbols).
    pub score: f64,
}

/// Why the winner won.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Reason {
    /// Lowest cost, alone in its ε band.
    LowestCost,
    /// Drawn uniformly among this many candidates within ε of the best.
    NearTie {
        /// Candidates in the band.
        among: u32,
    },
    /// Drawn by softmax over costs.
    Softmax,
    /// The only routable replica.
    Only,
    /// Round-robin turn.
    RoundRobin,
    /// Uniform draw.
    Random,
    /// Fewest pending prefill tokens.
    LeastLoad,
    /// The lighter of two random replicas.
    PowerOfTwo,
    /// Rendezvous hash of the session key.
    Affinity,
    /// No session key: least load.
    NoSessionKey,
    /// Longest remembered prefix, this share of the prompt.
    ApproxMatch {
        /// Matched fraction, 0–1.
        matched: f64,
    },
    /// Match below threshold: the replica with the least remembered text.
    ApproxSmallestTree,
    /// Load imbalance beyond thresholds: fewest requests.
    ApproxImbalance,
    /// Every replica busy: asked to wait.
    AllBusyWait,
    /// Every replica busy: rejected.
    AllBusyReject,
    /// No routable replica.
    NoReplica,
}

impl Reason {
    /// Every reason's label, in [`Reason::index`] order (the metrics'
    /// per-reason counters).
    pub const LABELS: [&'static str; 16] = [
        "lowest_cost",
        "near_tie",
        "softmax",
        "only",
        "round_robin",
        "random",
        "least_load",
        "power_of_two",
        "affinity",
        "no_session_key",
        "approx_match",
        "approx_smallest_tree",
        "approx_imbalance",
        "all_busy_wait",
        "all_busy_reject",
        "no_replica",
    ];

    /// Its position in [`Reason::LABELS`].
    pub fn index(&self) -> usize {
        match self {
            Reason::LowestCost => 0,
            Reason::NearTie { .. } => 1,
            Reason::Softmax => 2,
            Reason::Only => 3,
            Reason::RoundRobin => 4,
            Reason::Random => 5,
            Reason::LeastLoad => 6,
            Reason::PowerOfTwo => 7,
            Reason::Affinity => 8,
            Reason::NoSessionKey => 9,
            Reason::ApproxMatch { .. } => 10,
            Reason::ApproxSmallestTree => 11,
            Reason::ApproxImbalance => 12,
            Reason::AllBusyWait => 13,
            Reason::AllBusyReject => 14,
            Reason::NoReplica => 15,
        }
    }

    /// Short snake_case label for metrics and logs.
    pub fn label(&self) -> &'static str {
        Reason::LABELS[self.index()]
    }
}

/// A whole decision.
#[derive(Clone, Debug, PartialEq)]
pub struct Explanation {
    /// When it was made.
    pub at: Instant,
    /// Booking id when routed.
    pub booking: Option<u64>,
    /// The policy.
    pub policy: PolicyKind,
    /// Prompt tokens.
    pub prompt_tokens: u64,
    /// Prompt full blocks.
    pub prompt_blocks: u32,
    /// The winner.
    pub chosen: Option<ReplicaId>,
    /// Why.
    pub reason: Reason,
    /// The candidates, in replica order: every registered replica, or the
    /// cheapest `explain_candidates` of them (the chosen one among them).
    pub candidates: Vec<Candidate>,
    /// How many replicas were considered (more than `candidates.len()` when
    /// only the cheapest were kept).
    pub candidates_total: u32,
}

impl Explanation {
    /// The winner's candidate row.
    pub fn chosen_candidate(&self) -> Option<&Candidate> {
        let id = self.chosen?;
        self.candidates.iter().find(|c| c.replica == id)
    }
}

/// The last N decisions.
#[derive(Debug, Default)]
pub(crate) struct DecisionLog {
    cap: usize,
    items: VecDeque<Arc<Explanation>>,
}

impl DecisionLog {
    pub(crate) fn new(cap: usize) -> DecisionLog {
        DecisionLog { cap, items: VecDeque::with_capacity(cap.min(4096)) }
    }

    pub(crate) fn enabled(&self) -> bool {
        self.cap > 0
    }

    pub(crate) fn push(&mut self, e: Arc<Explanation>) {
        if self.cap == 0 {
            return;
        }
        if self.items.len() >= self.cap {
            self.items.pop_front();
        }
        self.items.push_back(e);
    }

    pub(crate) fn iter(&self) -> impl DoubleEndedIterator<Item = &Arc<Explanation>> {
        self.items.iter()
    }
}
