//! The last few thousand times to first token, for the dashboard's p50/p90
//! over a trailing window. The Prometheus histogram cannot give these: its
//! buckets are too coarse for a chart, and it never forgets.
//!
//! Recording is on the request path, so it is one atomic add and one atomic
//! store, no lock: each slot packs the arrival time (milliseconds since the
//! ring was made, wrapping after 49 days) with the value as an `f32`. A
//! reader may see a slot overwritten while it scans; that only swaps one
//! recent sample for a newer one.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Slots in the ring: at 400 requests/s this still covers a 10 s window.
const SLOTS: usize = 4096;

/// An empty slot. Its low half is a NaN, which is never stored.
const EMPTY: u64 = u64::MAX;

/// Recent TTFT samples with their arrival times.
#[derive(Debug)]
pub(crate) struct RecentTtft {
    epoch: Instant,
    next: AtomicUsize,
    slots: Box<[AtomicU64]>,
}

impl Default for RecentTtft {
    fn default() -> Self {
        RecentTtft {
            epoch: Instant::now(),
            next: AtomicUsize::new(0),
            slots: (0..SLOTS).map(|_| AtomicU64::new(EMPTY)).collect(),
        }
    }
}

/// Percentiles of the samples in a window.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct TtftSummary {
    /// Samples in the window.
    pub(crate) count: usize,
    /// Median, seconds.
    pub(crate) p50_s: Option<f64>,
    /// 90th percentile, seconds.
    pub(crate) p90_s: Option<f64>,
}

impl RecentTtft {
    fn millis(&self, at: Instant) -> u32 {
        // Wrapping on purpose: ages are taken with `wrapping_sub`.
        at.saturating_duration_since(self.epoch).as_millis() as u32
    }

    /// Records one finite, non-negative TTFT in seconds at `at`.
    pub(crate) fn record(&self, seconds: f64, at: Instant) {
        if !seconds.is_finite() || seconds < 0.0 {
            return;
        }
        let packed = (u64::from(self.millis(at)) << 32) | u64::from((seconds as f32).to_bits());
        let i = self.next.fetch_add(1, Ordering::Relaxed) % SLOTS;
        self.slots[i].store(packed, Ordering::Relaxed);
    }

    /// p50 and p90 (nearest rank) of the samples recorded in the `window`
    /// before `now`.
    pub(crate) fn summary(&self, window: Duration, now: Instant) -> TtftSummary {
        let now_ms = self.millis(now);
        let window_ms = window.as_millis().min(u128::from(u32::MAX / 2)) as u32;
        let mut values: Vec<f32> = self
            .slots
            .iter()
            .map(|s| s.load(Ordering::Relaxed))
            .filter(|&p| p != EMPTY)
            .filter(|&p| now_ms.wrapping_sub((p >> 32) as u32) <= window_ms)
            .map(|p| f32::from_bits(p as u32))
            .collect();
        values.sort_unstable_by(f32::total_cmp);
        let rank = |q: f64| {
            let n = values.len();
            // Nearest rank: the smallest value with at least q·n samples at or below it.
            let k = ((q * n as f64).ceil() as usize).clamp(1, n);
            f64::from(values[k - 1])
        };
        let some = !values.is_empty();
        TtftSummary {
            count: values.len(),
            p50_s: some.then(|| rank(0.5)),
            p90_s: some.then(|| rank(0.9)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_cover_only_the_window() {
        let ring = RecentTtft::default();
        let t0 = ring.epoch + Duration::from_secs(100);
        // Old, slow samples that must fall out of a 10 s window.
        for _ in 0..50 {
            ring.record(9.0, t0);
        }
        let now = t0 + Duration::from_secs(20);
        for i in 1..=10 {
            ring.record(f64::from(i) / 10.0, now - Duration::from_millis(100 * i as u64));
        }
        let s = ring.summary(Duration::from_secs(10), now);
        assert_eq!(s.count, 10);
        assert_eq!(s.p50_s.map(|v| (v * 10.0).round()), Some(5.0));
        assert_eq!(s.p90_s.map(|v| (v * 10.0).round()), Some(9.0));
        let all = ring.summary(Duration::from_secs(60), now);
        assert_eq!(all.count, 60);
        assert_eq!(all.p90_s, Some(9.0));
    }

    #[test]
    fn empty_and_bad_values() {
        let ring = RecentTtft::default();
        ring.record(f64::NAN, Instant::now());
        ring.record(-1.0, Instant::now());
        ring.record(f64::INFINITY, Instant::now());
        let s = ring.summary(Duration::from_secs(10), Instant::now());
        assert_eq!(s, TtftSummary::default());
    }

    #[test]
    fn the_ring_keeps_the_newest() {
        let ring = RecentTtft::default();
        let now = Instant::now();
        for _ in 0..SLOTS {
            ring.record(5.0, now);
        }
        for _ in 0..SLOTS / 2 + 1 {
            ring.record(1.0, now);
        }
        let s = ring.summary(Duration::from_secs(10), now);
        assert_eq!(s.count, SLOTS);
        assert_eq!(s.p50_s, Some(1.0));
    }
}
