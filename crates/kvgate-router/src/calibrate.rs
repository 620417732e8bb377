//! Online, robust calibration of a replica's prefill speed and KV transfer
//! costs.
//!
//! Each first token yields one sample: the prefill work the request waited for
//! (queue ahead plus its own uncached tokens) and the TTFT left once modelled
//! decode interference and transfers are taken out. Prefill time is a line in
//! the work, `overhead + σ × tokens`; fitting only σ with a fixed overhead
//! prior biases σ by whatever the prior gets wrong, so both are fitted with
//! the Theil–Sen estimator over the last `window` samples: σ is the median of
//! the pairwise slopes (pairs far enough apart in work), the overhead the
//! median residual. Medians ignore a few outliers (a preemption, a pause);
//! samples are clamped around the priors, and until `min_samples` have
//! arrived the fit is blended with the priors, so a cold start cannot swing
//! it. After a real change of speed the medians follow once about half the
//! window has seen the new regime. Transfer costs per block use the median of
//! per-block residuals the same way.

use std::collections::VecDeque;

use crate::config::CalibrationConfig;

/// One robustly estimated positive quantity (seconds per unit).
#[derive(Clone, Debug)]
pub(crate) struct RobustRate {
    prior: f64,
    window: VecDeque<f64>,
    estimate: f64,
}

impl RobustRate {
    pub(crate) fn new(prior: f64) -> RobustRate {
        RobustRate { prior, window: VecDeque::new(), estimate: prior }
    }

    pub(crate) fn estimate(&self) -> f64 {
        self.estimate
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

/// A robust fit of `y = intercept + slope × x` (seconds for `x` tokens).
#[derive(Clone, Debug)]
pub(crate) struct RobustLine {
    prior_slope: f64,
    prior_intercept: f64,
    window: VecDeque<(f64, f64)>,
    slope: f64,
    intercept: f64,
    samples: u64,
}

impl RobustLine {
    pub(crate) fn new(prior_slope: f64, prior_intercept: f64) -> RobustLine {
        RobustLine {
            prior_slope,
            prior_intercept,
            window: VecDeque::new(),
            slope: prior_slope,
            intercept: prior_intercept,
            samples: 0,
        }
    }

    pub(crate) fn slope(&self) -> f64 {
        self.slope
    }

    pub(crate) fn intercept(&self) -> f64 {
        self.intercept
    }

    pub(crate) fn samples(&self) -> u64 {
        self.samples
    }

    /// Adds one sample (`x` tokens took `y` seconds) and refits.
    pub(crate) fn observe(&mut self, x: f64, y: f64, cfg: &CalibrationConfig) {
        if !(x.is_finite() && y.is_finite()) || x <= 0.0 {
            return;
        }
        if self.window.len() >= cfg.window {
            self.window.pop_front();
        }
        self.window.push_back((x, y));
        self.samples += 1;
        self.refit(cfg);
    }

    fn refit(&mut self, cfg: &CalibrationConfig) {
        let r = cfg.max_ratio_to_prior;
        let (slope_lo, slope_hi) = (self.prior_slope / r, self.prior_slope * r);
        let intercept_hi = (self.prior_intercept * r).max(1.0);
        let mut xs: Vec<f64> = self.window.iter().map(|p| p.0).collect();
        xs.sort_by(f64::total_cmp);
        let spread = (cfg.min_sample_tokens as f64).max(0.25 * median_sorted(&xs));
        let pts: Vec<(f64, f64)> = self.window.iter().copied().collect();
        let mut slopes = Vec::with_capacity(pts.len() * pts.len() / 2);
        for (i, a) in pts.iter().enumerate() {
            for b in &pts[i + 1..] {
                if (a.0 - b.0).abs() >= spread {
                    slopes.push((a.1 - b.1) / (a.0 - b.0));
                }
            }
        }
        let (slope, intercept) = if slopes.len() >= 3 {
            slopes.sort_by(f64::total_cmp);
            let slope = median_sorted(&slopes).clamp(slope_lo, slope_hi);
            let mut res: Vec<f64> = pts.iter().map(|p| p.1 - slope * p.0).collect();
            res.sort_by(f64::total_cmp);
            (slope, median_sorted(&res).clamp(0.0, intercept_hi))
        } else {
            // Work sizes too alike to separate the two: keep the overhead and
            // fit the rate from the samples large enough to be dominated by it.
            let mut per: Vec<f64> = pts
                .iter()
                .filter(|p| p.0 >= cfg.min_sample_tokens as f64)
                .map(|p| ((p.1 - self.intercept) / p.0).clamp(slope_lo, slope_hi))
                .collect();
            if per.is_empty() {
                return;
            }
            per.sort_by(f64::total_cmp);
            (median_sorted(&per), self.intercept)
        };
        let n = self.window.len();
        if n >= cfg.min_samples {
            self.slope = slope;
            self.intercept = intercept;
        } else {
            // Shrink toward the priors while evidence is thin.
            let m = cfg.min_samples as f64;
            let w = n as f64 / m;
            self.slope = self.prior_slope * (1.0 - w) + slope * w;
            self.intercept = self.prior_intercept * (1.0 - w) + intercept * w;
        }
    }
}

fn median_sorted(v: &[f64]) -> f64 {
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// A replica's calibrated model parameters.
#[derive(Clone, Debug)]
pub(crate) struct ReplicaCalibration {
    /// Prefill seconds: fixed overhead + seconds per token.
    pub(crate) prefill: RobustLine,
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
    /// Predicted seconds of decode interference (not prefill, transfer or
    /// fixed overhead).
    pub(crate) other_s: f64,
}

impl ReplicaCalibration {
    pub(crate) fn new(
        prefill_s_per_token: f64,
        overhead_s: f64,
        cpu_s: f64,
        storage_s: f64,
    ) -> Self {
        ReplicaCalibration {
            prefill: RobustLine::new(prefill_s_per_token, overhead_s),
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
        let transfer = cpu_blocks * self.cpu.estimate() + storage_blocks * self.storage.estimate();
        let residual = ttft_s - basis.other_s;
        self.prefill.observe(basis.prefill_tokens as f64, residual - transfer, cfg);
        // Transfer samples only where transfers are a visible share.
        let prefill_s =
            self.prefill.intercept() + basis.prefill_tokens as f64 * self.prefill.slope();
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
        assert_eq!(r.window.len(), 1);
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
        // Priors: 1e-4 s/token and 20 ms of overhead. Truth: 2e-4 s/token,
        // 3 ms of overhead, and 10 ms of modelled interference.
        let mut cal = ReplicaCalibration::new(1e-4, 0.02, 1e-4, 1e-3);
        for tokens in [1000u64, 4000, 2500, 8000, 300, 6000, 5000, 512, 700] {
            let basis = SampleBasis { prefill_tokens: tokens, lower_blocks: [0, 0], other_s: 0.01 };
            cal.observe(&basis, 0.01 + 0.003 + 2e-4 * tokens as f64, &c);
        }
        let (s, o) = (cal.prefill.slope(), cal.prefill.intercept());
        assert!((s - 2e-4).abs() < 1e-9 && (o - 0.003).abs() < 1e-9, "{s} {o}");
    }

    #[test]
    fn a_wrong_overhead_prior_does_not_bias_the_rate() {
        let c = cfg();
        let mut line = RobustLine::new(6.25e-5, 0.020);
        // The engine: 3 ms + 6.3e-5 s/token; an outlier every 7th sample.
        for i in 0..40u64 {
            let x = 500.0 + ((i * 7919) % 6000) as f64;
            let y = if i % 7 == 3 { 5.0 } else { 0.003 + 6.3e-5 * x };
            line.observe(x, y, &c);
        }
        assert!((line.slope() / 6.3e-5 - 1.0).abs() < 0.02, "{}", line.slope());
        assert!((line.intercept() - 0.003).abs() < 0.002, "{}", line.intercept());
    }

    #[test]
    fn equal_work_sizes_fall_back_to_the_overhead_prior() {
        let c = cfg();
        let mut line = RobustLine::new(1e-4, 0.01);
        for _ in 0..10 {
            line.observe(1000.0, 0.01 + 3e-4 * 1000.0, &c);
        }
        assert!((line.slope() - 3e-4).abs() < 1e-12);
        assert!((line.intercept() - 0.01).abs() < 1e-12);
    }
}
