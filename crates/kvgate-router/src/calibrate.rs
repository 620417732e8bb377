//! Online, robust calibration of a replica's prefill speed and KV transfer
//! costs.
//!
//! Each first token yields one sample: the seconds per token (or per loaded
//! block) that would explain the observed TTFT given what the model knew at
//! booking. The estimate is the median of the last `window` samples, so a few
//! outliers (a preemption, a GC pause) cannot move it; samples are clamped to
//! a band around the prior, and until `min_samples` have arrived they are
//! blended with the prior, so a cold start (first compilation, empty caches)
//! cannot swing it either. After a real change of speed, the median follows
//! once half the window has seen the new regime.

use std::collections::VecDeque;

use crate::config::CalibrationConfig;

/// One robustly estimated positive quantity (seconds per unit).
#[derive(Clone, Debug)]
pub(crate) struct RobustRate {
    prior: f64,
    window: VecDeque<f64>,
    estimate: f64,
    samples: u64,
}

impl RobustRate {
    pub(crate) fn new(prior: f64) -> RobustRate {
        RobustRate { prior, window: VecDeque::new(), estimate: prior, samples: 0 }
    }

    pub(crate) fn estimate(&self) -> f64 {
        self.estimate
    }

    pub(crate) fn samples(&self) -> u64 {
        self.samples
    }

    /// Adds one sample and refreshes the estimate. Non-finite samples are
    /// ignored.
    pub(crate) fn observe(&mut self, x: f64, cfg: &CalibrationConfig) {
        if !x.is_finite() {
            return;
        }
        let (lo, hi) = (self.prior / cfg.max_ratio_to_prior, self.prior * cfg.max_ratio_to_prior);
        let x = x.clamp(lo, hi);
        if self.window.len() >= cfg.window {
            self.window.pop_front();
        }
        self.window.push_back(x);
        self.samples += 1;
        let median = median(&self.window);
        let n = self.window.len();
        self.estimate = if n >= cfg.min_samples {
            median
        } else {
            // Shrink toward the prior while evidence is thin.
            let m = cfg.min_samples as f64;
            (self.prior * (m - n as f64) + median * n as f64) / m
        };
    }
}

fn median(xs: &VecDeque<f64>) -> f64 {
    let mut v: Vec<f64> = xs.iter().copied().collect();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// A replica's calibrated model parameters.
#[derive(Clone, Debug)]
pub(crate) struct ReplicaCalibration {
    /// Seconds per prefill token.
    pub(crate) prefill: RobustRate,
    /// Seconds per block loaded from CPU.
    pub(crate) cpu: RobustRate,
    /// Seconds per block loaded from storage.
    pub(crate) storage: RobustRate,
}

/// What the model assumed when a request was booked, kept until its first
/// token turns it into calibration samples.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct SampleBasis {
    /// Prefill tokens ahead in the queue plus the request's own.
    pub(crate) prefill_tokens: u64,
    /// Blocks to load from CPU and from storage.
    pub(crate) lower_blocks: [u32; 2],
    /// Predicted seconds that are not prefill or transfer (overhead, decode
    /// interference, pressure).
    pub(crate) other_s: f64,
}

impl ReplicaCalibration {
    pub(crate) fn new(prefill_s_per_token: f64, cpu_s: f64, storage_s: f64) -> Self {
        ReplicaCalibration {
            prefill: RobustRate::new(prefill_s_per_token),
            cpu: RobustRate::new(cpu_s.max(1e-9)),
            storage: RobustRate::new(storage_s.max(1e-9)),
        }
    }

    /// Turns an observed TTFT into samples.
    pub(crate) fn observe(&mut self, basis: &SampleBasis, ttft_s: f64, cfg: &CalibrationConfig) {
        if !cfg.enabled || !ttft_s.is_finite() {
            return;
        }
        let [cpu_blocks, storage_blocks] = basis.lower_blocks.map(f64::from);
        let transfer =
            cpu_blocks * self.cpu.estimate() + storage_blocks * self.storage.estimate();
        let residual = ttft_s - basis.other_s;
        if basis.prefill_tokens >= cfg.min_sample_tokens {
            let s = (residual - transfer) / basis.prefill_tokens as f64;
            self.prefill.observe(s, cfg);
        }
        // Transfer samples only where transfers are a visible share.
        let prefill_s = basis.prefill_tokens as f64 * self.prefill.estimate();
        if cpu_blocks > 0.0 && storage_blocks == 0.0 && transfer >= 0.1 * prefill_s {
            self.cpu.observe((residual - prefill_s) / cpu_blocks, cfg);
        } else if storage_blocks > 0.0 && cpu_blocks == 0.0 && transfer >= 0.1 * prefill_s {
            self.storage.observe((residual - prefill_s) / storage_blocks, cfg);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> CalibrationConfig {
        CalibrationConfig::default()
    }

    #[test]
    fn median_resists_outliers_and_follows_a_real_change() {
        let c = cfg();
        let mut r = RobustRate::new(1.0);
        for _ in 0..40 {
            r.observe(2.0, &c);
        }
        assert!((r.estimate() - 2.0).abs() < 1e-12);
        // A handful of wild outliers do not move it.
        for _ in 0..5 {
            r.observe(1e9, &c);
        }
        assert!((r.estimate() - 2.0).abs() < 1e-12);
        // A sustained change takes over within half a window plus outliers.
        for _ in 0..16 {
            r.observe(4.0, &c);
        }
        assert!((r.estimate() - 4.0).abs() < 1e-12, "{}", r.estimate());
    }

    #[test]
    fn cold_start_is_shrunk_toward_the_prior() {
        let c = cfg();
        let mut r = RobustRate::new(1.0);
        r.observe(10.0, &c);
        // One sample of five: 1/5 of the way.
        assert!((r.estimate() - 2.8).abs() < 1e-9, "{}", r.estimate());
        r.observe(f64::NAN, &c);
        assert_eq!(r.samples(), 1);
    }

    #[test]
    fn samples_are_clamped_around_the_prior() {
        let c = cfg();
        let mut r = RobustRate::new(1.0);
        for _ in 0..10 {
            r.observe(-5.0, &c);
        }
        assert!((r.estimate() - 1.0 / c.max_ratio_to_prior).abs() < 1e-12);
    }

    #[test]
    fn prefill_rate_is_recovered_from_ttfts() {
        let c = cfg();
        let mut cal = ReplicaCalibration::new(1e-4, 1e-4, 1e-3);
        // True speed: 2e-4 s/token plus 0.02 s of other costs.
        for tokens in [1000u64, 4000, 2500, 8000, 300, 6000, 5000] {
            let basis = SampleBasis { prefill_tokens: tokens, lower_blocks: [0, 0], other_s: 0.02 };
            cal.observe(&basis, 0.02 + 2e-4 * tokens as f64, &c);
        }
        assert!((cal.prefill.estimate() - 2e-4).abs() < 1e-9, "{}", cal.prefill.estimate());
    }
}
