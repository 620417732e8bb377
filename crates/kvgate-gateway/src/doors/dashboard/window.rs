//! Counter samples over a trailing window, turned into rates. The gateway
//! keeps lifetime counters (routed requests, events, prompt tokens, the
//! engines' prefix-cache hits); the dashboard shows how fast they moved
//! lately, so it compares the newest sample with the oldest one still in
//! the window. A counter that went backwards (an engine restarted) counts
//! as no movement rather than a negative rate.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::observe::snapshot::FleetSnapshot;
use crate::request::route::Route;

/// One replica's counters at one instant.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct ReplicaCounters {
    pub(crate) name: String,
    pub(crate) events: u64,
    pub(crate) routed: u64,
    /// The engine's prefix-cache hits and queries in tokens, when scraped.
    pub(crate) engine_cache: Option<(u64, u64)>,
}

/// The fleet's counters at one instant.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Sample {
    pub(crate) at: Instant,
    pub(crate) routed: u64,
    pub(crate) prompt_tokens: u64,
    pub(crate) predicted_cached_tokens: u64,
    /// Requests answered per generation route (`Route::ALL` order).
    pub(crate) by_route: [u64; Route::COUNT],
    pub(crate) replicas: Vec<ReplicaCounters>,
}

impl Sample {
    /// The counters of `snap`, with the gateway's prompt-token totals.
    pub(crate) fn of(
        snap: &FleetSnapshot,
        prompt_totals: (u64, u64),
        by_route: [u64; Route::COUNT],
        at: Instant,
    ) -> Sample {
        let replicas = snap
            .replicas
            .iter()
            .map(|r| ReplicaCounters {
                name: r.name.clone(),
                events: r.events,
                routed: r.routed,
                engine_cache: r.engine_prefix_hits.zip(r.engine_prefix_queries),
            })
            .collect();
        Sample {
            at,
            routed: snap.decisions[0],
            prompt_tokens: prompt_totals.0,
            predicted_cached_tokens: prompt_totals.1,
            by_route,
            replicas,
        }
    }

    fn replica(&self, name: &str) -> Option<&ReplicaCounters> {
        self.replicas.iter().find(|r| r.name == name)
    }
}

/// How one replica's counters moved over the window.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct ReplicaRates {
    pub(crate) events_per_s: Option<f64>,
    pub(crate) requests_per_s: Option<f64>,
    pub(crate) engine_hit_rate: Option<f64>,
}

/// How the fleet's counters moved over the window.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Rates {
    /// Seconds between the two samples compared (0 with one sample).
    pub(crate) span_s: f64,
    pub(crate) requests_per_s: Option<f64>,
    /// Requests answered per second per generation route (`Route::ALL`
    /// order).
    pub(crate) by_route_per_s: [Option<f64>; Route::COUNT],
    /// Predicted cached / routed prompt tokens.
    pub(crate) predicted_hit_rate: Option<f64>,
    /// The engines' prefix-cache hits / queries, summed over replicas.
    pub(crate) engine_hit_rate: Option<f64>,
    /// Per replica, in the newest sample's order.
    pub(crate) replicas: Vec<ReplicaRates>,
}

/// `part / whole`, or nothing when nothing happened.
fn ratio(part: u64, whole: u64) -> Option<f64> {
    (whole > 0).then(|| part.min(whole) as f64 / whole as f64)
}

/// Samples no older than `span` before the newest.
#[derive(Debug)]
pub(crate) struct Window {
    span: Duration,
    samples: VecDeque<Sample>,
}

impl Window {
    pub(crate) fn new(span: Duration) -> Window {
        Window { span, samples: VecDeque::new() }
    }

    /// Adds the newest sample and forgets those older than the span.
    pub(crate) fn push(&mut self, s: Sample) {
        let horizon = s.at.checked_sub(self.span);
        self.samples.push_back(s);
        while let (Some(h), Some(old)) = (horizon, self.samples.front()) {
            if old.at >= h {
                break;
            }
            self.samples.pop_front();
        }
    }

    /// Rates between the oldest and the newest sample.
    pub(crate) fn rates(&self) -> Rates {
        let (Some(old), Some(new)) = (self.samples.front(), self.samples.back()) else {
            return Rates::default();
        };
        let span_s = new.at.saturating_duration_since(old.at).as_secs_f64();
        let per_s = |a: u64, b: u64| (span_s > 0.0).then(|| b.saturating_sub(a) as f64 / span_s);
        let mut fleet_hits = 0;
        let mut fleet_queries = 0;
        let replicas = new
            .replicas
            .iter()
            .map(|r| {
                let Some(o) = old.replica(&r.name) else { return ReplicaRates::default() };
                let engine = r
                    .engine_cache
                    .zip(o.engine_cache)
                    .map(|((h1, q1), (h0, q0))| (h1.saturating_sub(h0), q1.saturating_sub(q0)));
                if let Some((h, q)) = engine {
                    fleet_hits += h;
                    fleet_queries += q;
                }
                ReplicaRates {
                    events_per_s: per_s(o.events, r.events),
                    requests_per_s: per_s(o.routed, r.routed),
                    engine_hit_rate: engine.and_then(|(h, q)| ratio(h, q)),
                }
            })
            .collect();
        Rates {
            span_s,
            requests_per_s: per_s(old.routed, new.routed),
            by_route_per_s: std::array::from_fn(|i| per_s(old.by_route[i], new.by_route[i])),
            predicted_hit_rate: ratio(
                new.predicted_cached_tokens.saturating_sub(old.predicted_cached_tokens),
                new.prompt_tokens.saturating_sub(old.prompt_tokens),
            ),
            engine_hit_rate: ratio(fleet_hits, fleet_queries),
            replicas,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(at: Instant, routed: u64, tokens: (u64, u64), reps: &[(&str, u64, u64)]) -> Sample {
        Sample {
            at,
            routed,
            prompt_tokens: tokens.0,
            predicted_cached_tokens: tokens.1,
            by_route: [routed, 0, 0, 0],
            replicas: reps
                .iter()
                .map(|&(name, events, hits)| ReplicaCounters {
                    name: name.into(),
                    events,
                    routed: routed / 2,
                    engine_cache: Some((hits, 2 * hits)),
                })
                .collect(),
        }
    }

    #[test]
    fn rates_over_the_window() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut w = Window::new(s(10));
        assert_eq!(w.rates(), Rates::default());
        w.push(sample(t0, 0, (0, 0), &[("a", 0, 0), ("b", 0, 0)]));
        let one = w.rates();
        assert_eq!((one.span_s, one.requests_per_s, one.predicted_hit_rate), (0.0, None, None));
        // 5 s later: 50 requests, 1000 prompt tokens of which 250 predicted
        // cached; replica a's engine saw 1000 queried tokens, 500 hit.
        w.push(sample(t0 + s(5), 50, (1000, 250), &[("a", 100, 500), ("b", 0, 0)]));
        let r = w.rates();
        assert_eq!(r.span_s, 5.0);
        assert_eq!(r.requests_per_s, Some(10.0));
        assert_eq!(r.by_route_per_s, [Some(10.0), Some(0.0), Some(0.0), Some(0.0)]);
        assert_eq!(r.predicted_hit_rate, Some(0.25));
        assert_eq!(r.replicas[0].events_per_s, Some(20.0));
        assert_eq!(r.replicas[0].engine_hit_rate, Some(0.5));
        // b's engine answered no queries: no hit rate, not 0 %.
        assert_eq!(r.replicas[1].engine_hit_rate, None);
        assert_eq!(r.engine_hit_rate, Some(0.5));
        // 12 s in: the first sample left the window, so rates start at t0+5.
        w.push(sample(t0 + s(12), 64, (1000, 250), &[("a", 100, 500), ("b", 7, 0)]));
        let r = w.rates();
        assert_eq!(r.span_s, 7.0);
        assert_eq!(r.requests_per_s, Some(2.0));
        assert_eq!(r.predicted_hit_rate, None, "no prompt tokens in the window");
        assert_eq!(r.replicas[1].events_per_s, Some(1.0));
    }

    #[test]
    fn restarts_and_new_replicas_never_go_negative() {
        let t0 = Instant::now();
        let mut w = Window::new(Duration::from_secs(10));
        w.push(sample(t0, 10, (100, 50), &[("a", 500, 900)]));
        w.push(sample(t0 + Duration::from_secs(2), 12, (200, 60), &[("a", 3, 1), ("c", 9, 9)]));
        let r = w.rates();
        assert_eq!(r.replicas[0].events_per_s, Some(0.0));
        assert_eq!(r.replicas[0].engine_hit_rate, None);
        assert_eq!(r.replicas[1], ReplicaRates::default(), "c has no earlier sample");
        assert_eq!(r.predicted_hit_rate, Some(0.1));
    }
}
