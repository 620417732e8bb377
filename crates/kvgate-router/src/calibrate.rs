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
//!
//! TTFTs seen from outside mix queueing, batching and the network into the
//! prefill time, so the fit is only as good as the router's guess of the work
//! ahead. When the engine reports its own measurements (vLLM's request-level
//! histograms: prefill time, computed tokens, inter-token latency), those
//! replace the TTFT samples for the prefill line: each report interval gives
//! one sample, the mean prefill seconds against the mean computed tokens of
//! the requests that finished in it, and the mean inter-token latency gives
//! the decode step, because on four identical live replicas the TTFT fit
//! reported 5.9k–60k tokens/s for a true 63.6k.

use std::collections::VecDeque;

use crate::config::CalibrationConfig;
use crate::replica::EngineTiming;

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
    /// When the samples' work sizes are too alike to separate slope and
    /// intercept: keep the slope and refit the intercept (engine samples: the
    /// per-token rate is the hardware's, the fixed part moves with load), or
    /// keep the intercept and refit the slope (TTFT samples).
    keep_slope_when_alike: bool,
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
            keep_slope_when_alike: false,
        }
    }

    /// A line whose slope stays put when the samples cannot separate it.
    pub(crate) fn keeping_slope(prior_slope: f64, prior_intercept: f64) -> RobustLine {
        RobustLine { keep_slope_when_alike: true, ..RobustLine::new(prior_slope, prior_intercept) }
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
        } else if self.keep_slope_when_alike {
            // The fixed part is never negative, so no sample allows a rate
            // slower than its own seconds per token: a slope never
            // identified (a prior off by the gap between a model and the
            // hardware, and every prompt the same length) comes down to
            // what the samples show.
            let mut ratios: Vec<f64> = pts
                .iter()
                .filter(|p| p.0 >= cfg.min_sample_tokens as f64)
                .map(|p| p.1 / p.0)
                .collect();
            ratios.sort_by(f64::total_cmp);
            let slope = if ratios.is_empty() {
                self.slope
            } else {
                self.slope.min(median_sorted(&ratios)).clamp(slope_lo, slope_hi)
            };
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
    /// Prefill seconds fitted from the engine's own measurements, when it
    /// reports them; preferred to `prefill` once it has a sample.
    pub(crate) engine_prefill: RobustLine,
    /// Seconds of one decode step, from the engine's inter-token latency.
    pub(crate) decode_step: RobustRate,
    /// The engine's totals at the last report, to take differences.
    last_timing: Option<EngineTiming>,
    /// Mean modelled decode interference of recent bookings (EWMA), taken
    /// out of the engine's prefill times as it is out of TTFT samples.
    avg_other_s: f64,
}

/// Which measurements a replica's prefill line comes from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CalibrationSource {
    /// The configured priors (no samples yet).
    #[default]
    Prior,
    /// TTFTs measured by this router.
    Ttft,
    /// The engine metrics of the whole fleet, until this replica has
    /// `min_samples` of its own.
    Fleet,
    /// The engine's own request-level metrics.
    Engine,
}

impl CalibrationSource {
    /// Lower-case name for metrics and admin.
    pub fn name(self) -> &'static str {
        match self {
            CalibrationSource::Prior => "prior",
            CalibrationSource::Ttft => "ttft",
            CalibrationSource::Fleet => "fleet",
            CalibrationSource::Engine => "engine",
        }
    }
}

/// What one engine report contributed: a prefill sample (mean computed
/// tokens, mean seconds) and a decode-step sample.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct EngineSample {
    pub(crate) prefill: Option<(f64, f64)>,
    pub(crate) decode_step_s: Option<f64>,
}

/// The engine samples of every replica pooled: what a replica without
/// enough samples of its own is assumed to do. Replicas of one fleet are
/// usually the same hardware; a prior from the config can be off by the
/// whole gap between model and GPU (4× on a sped-up sim), and
/// replicas calibrated at different speeds route as if they differed.
#[derive(Clone, Debug)]
pub(crate) struct FleetCalibration {
    prefill: RobustLine,
    decode_step: RobustRate,
    /// Every replica's TTFT samples, for fleets whose engines report no
    /// timing yet (the first scrapes, or engines without vLLM's metrics).
    /// Without it, the replicas that served first were fitted from their
    /// TTFTs while the others kept the prior (4x slower on the live bench's
    /// sped-up sims), so the first ones looked twice as fast and took every
    /// request of a startup burst, queued behind each other (on the live
    /// bench's no-reuse cell, its p99 was those requests).
    ttft_prefill: RobustLine,
    /// Seconds a LoRA adapter load adds before the prefill, from the TTFTs
    /// of requests routed where the adapter had no slot (the residual once
    /// the prefill line and transfers are taken out), like a cold prefix.
    /// One estimate per router: a load's time is the engine's and the
    /// adapter's, not one replica's.
    adapter_load: RobustRate,
}

impl FleetCalibration {
    /// What every replica routes on when calibration is pooled and the fleet
    /// has engine samples of both kinds: then `ReplicaCalibration::calibrated`
    /// gives this same value for each of them, so a decision computes it once.
    pub(crate) fn pooled(&self, cfg: &CalibrationConfig) -> Option<Calibrated> {
        let pooled =
            !cfg.per_replica && self.prefill.samples() > 0 && !self.decode_step.window.is_empty();
        pooled.then(|| Calibrated {
            prefill_s_per_token: self.prefill.slope(),
            overhead_s: self.prefill.intercept(),
            decode_step_s: Some(self.decode_step.estimate()),
            source: CalibrationSource::Fleet,
        })
    }

    pub(crate) fn new(
        prefill_s_per_token: f64,
        overhead_s: f64,
        decode_step_s: f64,
        adapter_load_s: f64,
    ) -> Self {
        FleetCalibration {
            prefill: RobustLine::keeping_slope(prefill_s_per_token, overhead_s),
            decode_step: RobustRate::new(decode_step_s.max(1e-6)),
            ttft_prefill: RobustLine::new(prefill_s_per_token, overhead_s),
            adapter_load: RobustRate::new(adapter_load_s.max(1e-4)),
        }
    }

    /// Seconds an adapter load is expected to take.
    pub(crate) fn adapter_load_s(&self) -> f64 {
        self.adapter_load.estimate()
    }

    /// Adds one adapter-load sample (`TtftSamples::adapter_load_s`).
    pub(crate) fn observe_adapter_load(&mut self, s: f64, cfg: &CalibrationConfig) {
        self.adapter_load.observe(s, cfg);
    }

    /// Adds one replica's TTFT sample (`ReplicaCalibration::observe`).
    pub(crate) fn observe_ttft(&mut self, x: f64, y: f64, cfg: &CalibrationConfig) {
        self.ttft_prefill.observe(x, y, cfg);
    }

    pub(crate) fn observe(&mut self, s: &EngineSample, cfg: &CalibrationConfig) {
        if let Some((x, y)) = s.prefill {
            self.prefill.observe(x, y, cfg);
        }
        if let Some(step) = s.decode_step_s {
            self.decode_step.observe(step, cfg);
        }
    }
}

/// The calibration a decision uses for one replica.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Calibrated {
    pub(crate) prefill_s_per_token: f64,
    pub(crate) overhead_s: f64,
    pub(crate) decode_step_s: Option<f64>,
    pub(crate) source: CalibrationSource,
}

impl ReplicaCalibration {
    /// The line and decode step to route on: this replica's own engine
    /// samples once it has `min_samples` when `per_replica` is set, else the
    /// fleet's while the fleet has any; without engine samples anywhere, the
    /// same rule over TTFT samples; else the priors.
    pub(crate) fn calibrated(
        &self,
        fleet: &FleetCalibration,
        cfg: &CalibrationConfig,
    ) -> Calibrated {
        let min = cfg.min_samples.max(1);
        let own = self.engine_prefill.samples() as usize >= min
            && (cfg.per_replica || fleet.prefill.samples() == 0);
        let (line, source) = if own {
            (&self.engine_prefill, CalibrationSource::Engine)
        } else if fleet.prefill.samples() > 0 {
            // The fleet sees every replica's engine samples, this one's too.
            (&fleet.prefill, CalibrationSource::Fleet)
        } else {
            // No engine timing anywhere: TTFT samples, pooled by the same
            // rule (a replica's own line only with `per_replica` and enough
            // samples), so replicas that have not served yet route on what
            // the others measured instead of on the prior.
            let own_ttft = self.prefill.samples() as usize >= min
                && (cfg.per_replica || fleet.ttft_prefill.samples() == 0);
            let (slope, intercept, source) = if own_ttft || fleet.ttft_prefill.samples() == 0 {
                let (s, i) = self.prefill_line();
                (s, i, self.source())
            } else {
                let l = &fleet.ttft_prefill;
                (l.slope(), l.intercept(), CalibrationSource::Ttft)
            };
            return Calibrated {
                prefill_s_per_token: slope,
                overhead_s: intercept,
                decode_step_s: None,
                source,
            };
        };
        let decode_step_s = if self.decode_step.window.len() >= min
            && (cfg.per_replica || fleet.decode_step.window.is_empty())
        {
            Some(self.decode_step.estimate())
        } else {
            (!fleet.decode_step.window.is_empty()).then(|| fleet.decode_step.estimate())
        };
        Calibrated {
            prefill_s_per_token: line.slope(),
            overhead_s: line.intercept(),
            decode_step_s,
            source,
        }
    }
}

/// What the model assumed when a request was booked, kept until its first
/// token turns it into calibration samples.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct SampleBasis {
    /// Prefill tokens ahead in the queue plus the request's own.
    pub(crate) prefill_tokens: u64,
    /// Blocks to load from CPU and from storage.
    pub(crate) lower_blocks: [u32; 2],
    /// Predicted seconds of decode interference and of waiting for an
    /// adapter slot (not prefill, transfer, adapter load or fixed overhead).
    pub(crate) other_s: f64,
    /// The adapter had no slot there: the TTFT includes its load, so the
    /// sample measures the load and not the prefill line.
    pub(crate) adapter_load: bool,
}

/// What one observed TTFT gave (`ReplicaCalibration::observe`).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct TtftSamples {
    /// The prefill-line sample (work, seconds), for the fleet's pooled line.
    pub(crate) line: Option<(f64, f64)>,
    /// Seconds the adapter load took, for the fleet's load estimate.
    pub(crate) adapter_load_s: Option<f64>,
}

impl ReplicaCalibration {
    pub(crate) fn new(
        prefill_s_per_token: f64,
        overhead_s: f64,
        cpu_s: f64,
        storage_s: f64,
        decode_step_s: f64,
    ) -> Self {
        ReplicaCalibration {
            prefill: RobustLine::new(prefill_s_per_token, overhead_s),
            cpu: RobustRate::new(cpu_s.max(1e-9)),
            storage: RobustRate::new(storage_s.max(1e-9)),
            engine_prefill: RobustLine::keeping_slope(prefill_s_per_token, overhead_s),
            decode_step: RobustRate::new(decode_step_s.max(1e-6)),
            last_timing: None,
            avg_other_s: 0.0,
        }
    }

    /// Where the prefill line comes from.
    pub(crate) fn source(&self) -> CalibrationSource {
        if self.engine_prefill.samples() > 0 {
            CalibrationSource::Engine
        } else if self.prefill.samples() > 0 {
            CalibrationSource::Ttft
        } else {
            CalibrationSource::Prior
        }
    }

    /// The prefill line in use: (seconds per token, fixed seconds).
    pub(crate) fn prefill_line(&self) -> (f64, f64) {
        let line =
            if self.engine_prefill.samples() > 0 { &self.engine_prefill } else { &self.prefill };
        (line.slope(), line.intercept())
    }

    /// The samples behind the line in use.
    pub(crate) fn samples(&self) -> u64 {
        self.engine_prefill.samples().max(self.prefill.samples())
    }

    /// Notes the modelled interference of a request just booked here.
    pub(crate) fn note_booking(&mut self, other_s: f64) {
        if other_s.is_finite() {
            self.avg_other_s = 0.9 * self.avg_other_s + 0.1 * other_s.max(0.0);
        }
    }

    /// Takes the engine's cumulative totals; the change since the last
    /// report becomes one prefill sample and one decode-step sample. A
    /// total that went down is an engine restart: it only resets the base.
    pub(crate) fn observe_engine(
        &mut self,
        t: &EngineTiming,
        cfg: &CalibrationConfig,
    ) -> EngineSample {
        let mut out = EngineSample::default();
        let Some(last) = self.last_timing.replace(*t) else { return out };
        if !cfg.enabled {
            return out;
        }
        if t.requests < last.requests || t.computed_tokens < last.computed_tokens {
            return out;
        }
        let n = (t.requests - last.requests) as f64;
        let tokens = (t.computed_tokens - last.computed_tokens) as f64;
        let prefill_s = t.prefill_s - last.prefill_s;
        if n > 0.0 && tokens > 0.0 && prefill_s.is_finite() && prefill_s >= 0.0 {
            let (x, y) = (tokens / n, prefill_s / n - self.avg_other_s);
            self.engine_prefill.observe(x, y, cfg);
            out.prefill = Some((x, y));
        }
        if t.itl_count > last.itl_count {
            let itl = (t.itl_s - last.itl_s) / (t.itl_count - last.itl_count) as f64;
            if itl.is_finite() && itl > 0.0 {
                self.decode_step.observe(itl, cfg);
                out.decode_step_s = Some(itl);
            }
        }
        out
    }

    /// Turns an observed TTFT into samples; returns those the fleet pools.
    pub(crate) fn observe(
        &mut self,
        basis: &SampleBasis,
        ttft_s: f64,
        cfg: &CalibrationConfig,
    ) -> TtftSamples {
        let mut out = TtftSamples::default();
        if !cfg.enabled || !ttft_s.is_finite() {
            return out;
        }
        let [cpu_blocks, storage_blocks] = basis.lower_blocks.map(f64::from);
        let transfer = cpu_blocks * self.cpu.estimate() + storage_blocks * self.storage.estimate();
        let residual = ttft_s - basis.other_s;
        if basis.adapter_load {
            // A load hides in this TTFT: what the line and transfers do not
            // explain is the load's, and nothing else is learnt from it (a
            // load counted as prefill would make the replica look slow).
            let (slope, intercept) = self.prefill_line();
            let prefill_s = intercept + basis.prefill_tokens as f64 * slope;
            out.adapter_load_s = Some(residual - transfer - prefill_s);
            return out;
        }
        // The engine's own measurements, when it gives them, own the line.
        if self.engine_prefill.samples() == 0 {
            let (x, y) = (basis.prefill_tokens as f64, residual - transfer);
            self.prefill.observe(x, y, cfg);
            out.line = Some((x, y));
        }
        // Transfer samples only where transfers are a visible share.
        let (slope, intercept) = self.prefill_line();
        let prefill_s = intercept + basis.prefill_tokens as f64 * slope;
        if cpu_blocks > 0.0 && storage_blocks == 0.0 && transfer >= 0.1 * prefill_s {
            self.cpu.observe((residual - prefill_s) / cpu_blocks, cfg);
        } else if storage_blocks > 0.0 && cpu_blocks == 0.0 && transfer >= 0.1 * prefill_s {
            self.storage.observe((residual - prefill_s) / storage_blocks, cfg);
        }
        out
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
        let mut cal = ReplicaCalibration::new(1e-4, 0.02, 1e-4, 1e-3, 0.01);
        for tokens in [1000u64, 4000, 2500, 8000, 300, 6000, 5000, 512, 700] {
            let basis = SampleBasis {
                prefill_tokens: tokens,
                lower_blocks: [0, 0],
                other_s: 0.01,
                adapter_load: false,
            };
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

    /// Engine totals after `n` requests of `tokens` computed tokens each,
    /// prefilled at `sigma` s/token plus `fixed` s.
    fn grow(t: &mut EngineTiming, n: u64, tokens: u64, sigma: f64, fixed: f64) {
        t.requests += n;
        t.computed_tokens += n * tokens;
        t.prefill_s += n as f64 * (fixed + sigma * tokens as f64);
        t.itl_count += 50 * n;
        t.itl_s += 50.0 * n as f64 * 0.005;
    }

    /// Two identical replicas whose own fits differ (one was busier): by
    /// default both route on the pooled line, so the noise cannot skew load;
    /// `per_replica` gives each its own line (a fleet of different GPUs).
    #[test]
    fn replicas_route_on_the_pooled_line_unless_per_replica() {
        let mut c = cfg();
        let prior = 1.0 / 16_000.0;
        let mut fleet = FleetCalibration::new(prior, 0.02, 0.01, 0.05);
        let mut fast = ReplicaCalibration::new(prior, 0.02, 1e-4, 1e-3, 0.01);
        let mut slow = fast.clone();
        let (mut tf, mut ts) = (EngineTiming::default(), EngineTiming::default());
        fleet.observe(&fast.observe_engine(&tf, &c), &c);
        fleet.observe(&slow.observe_engine(&ts, &c), &c);
        for i in 0..40u64 {
            let tokens = 256 + (i * 977) % 4000;
            grow(&mut tf, 1, tokens, prior * 0.8, 0.006);
            grow(&mut ts, 1, tokens, prior * 1.25, 0.006);
            fleet.observe(&fast.observe_engine(&tf, &c), &c);
            fleet.observe(&slow.observe_engine(&ts, &c), &c);
        }
        let (a, b) = (fast.calibrated(&fleet, &c), slow.calibrated(&fleet, &c));
        assert_eq!(a.source, CalibrationSource::Fleet);
        assert_eq!(a.prefill_s_per_token, b.prefill_s_per_token);
        assert_eq!(a.decode_step_s, b.decode_step_s);
        let pooled = a.prefill_s_per_token;
        assert!(pooled > prior * 0.75 && pooled < prior * 1.3, "{pooled}");
        c.per_replica = true;
        let (a, b) = (fast.calibrated(&fleet, &c), slow.calibrated(&fleet, &c));
        assert_eq!(a.source, CalibrationSource::Engine);
        assert!((a.prefill_s_per_token / (prior * 0.8) - 1.0).abs() < 0.01);
        assert!((b.prefill_s_per_token / (prior * 1.25) - 1.0).abs() < 0.01);
    }

    #[test]
    fn before_engine_timing_replicas_that_have_not_served_route_on_the_fleets_ttfts() {
        let mut c = cfg();
        // Prior 16k tokens/s; the replicas are 4x faster (the live bench's
        // sims). Only `served` has seen first tokens yet.
        let prior = 1.0 / 16_000.0;
        let sigma = prior / 4.0;
        let mut fleet = FleetCalibration::new(prior, 0.02, 0.01, 0.05);
        let mut served = ReplicaCalibration::new(prior, 0.02, 1e-4, 1e-3, 0.01);
        let idle = served.clone();
        for i in 0..12u64 {
            let tokens = 512 + (i * 977) % 4000;
            let basis = SampleBasis {
                prefill_tokens: tokens,
                lower_blocks: [0, 0],
                other_s: 0.0,
                adapter_load: false,
            };
            let (x, y) = served.observe(&basis, 0.005 + sigma * tokens as f64, &c).line.unwrap();
            fleet.observe_ttft(x, y, &c);
        }
        let (a, b) = (served.calibrated(&fleet, &c), idle.calibrated(&fleet, &c));
        assert_eq!(b.source, CalibrationSource::Ttft);
        assert_eq!(a.prefill_s_per_token, b.prefill_s_per_token, "one speed for one fleet");
        assert!((b.prefill_s_per_token / sigma - 1.0).abs() < 0.05, "{}", b.prefill_s_per_token);
        // Per replica, a replica with enough samples routes on its own line;
        // one without still borrows the fleet's (as with engine samples).
        c.per_replica = true;
        let (a, b) = (served.calibrated(&fleet, &c), idle.calibrated(&fleet, &c));
        assert_eq!((a.source, b.source), (CalibrationSource::Ttft, CalibrationSource::Ttft));
        assert_eq!(a.prefill_s_per_token, served.prefill_line().0);
        assert_eq!(b.prefill_s_per_token, fleet.ttft_prefill.slope());
        // With no sample anywhere, the prior.
        let empty = FleetCalibration::new(prior, 0.02, 0.01, 0.05);
        let b = idle.calibrated(&empty, &c);
        assert_eq!((b.source, b.prefill_s_per_token), (CalibrationSource::Prior, prior));
        // Once engine samples own a replica's line it feeds no TTFT sample.
        let mut t = EngineTiming::default();
        served.observe_engine(&t, &c);
        grow(&mut t, 1, 2048, sigma, 0.006);
        served.observe_engine(&t, &c);
        let basis = SampleBasis {
            prefill_tokens: 2048,
            lower_blocks: [0, 0],
            other_s: 0.0,
            adapter_load: false,
        };
        assert_eq!(served.observe(&basis, 0.05, &c).line, None);
    }

    #[test]
    fn engine_reports_replace_ttft_samples() {
        let c = cfg();
        // Prior 16k tokens/s; the engine is 4x faster (a sped-up sim).
        let mut cal = ReplicaCalibration::new(1.0 / 16_000.0, 0.02, 1e-4, 1e-3, 0.01);
        assert_eq!(cal.source(), CalibrationSource::Prior);
        let sigma = 1.0 / 64_000.0;
        let mut t = EngineTiming::default();
        cal.observe_engine(&t, &c); // the base: no sample yet
        assert_eq!(cal.source(), CalibrationSource::Prior);
        for i in 0..40u64 {
            grow(&mut t, 1 + i % 3, 256 + (i * 977) % 4000, sigma, 0.006);
            cal.observe_engine(&t, &c);
        }
        assert_eq!(cal.source(), CalibrationSource::Engine);
        let (s, o) = cal.prefill_line();
        assert!((s / sigma - 1.0).abs() < 0.01, "{s}");
        assert!((o - 0.006).abs() < 1e-4, "{o}");
        assert!((cal.decode_step.estimate() - 0.005).abs() < 1e-9);
        // TTFT samples no longer move the line.
        let basis = SampleBasis {
            prefill_tokens: 1000,
            lower_blocks: [0, 0],
            other_s: 0.0,
            adapter_load: false,
        };
        for _ in 0..20 {
            cal.observe(&basis, 5.0, &c);
        }
        assert_eq!(cal.prefill_line(), (s, o));
        // Work sizes all alike (every prompt cached but its suffix) while the
        // fixed part grows with load: the rate stays within 15 % (pairs that
        // straddle the change pull it a little on the way), the fixed part
        // follows.
        for _ in 0..40 {
            grow(&mut t, 4, 300, sigma, 0.009);
            cal.observe_engine(&t, &c);
        }
        let (s2, o2) = cal.prefill_line();
        assert!((s2 / sigma - 1.0).abs() < 0.15, "{s2}");
        assert!((o2 - 0.009).abs() < 5e-4, "{o2}");
        // An engine restart (totals fall) only resets the base.
        cal.observe_engine(&EngineTiming::default(), &c);
        assert_eq!(cal.prefill_line(), (s2, o2));
    }

    #[test]
    fn equal_prompts_bring_a_too_slow_prior_down_to_the_samples() {
        let c = cfg();
        // Every prompt 1,024 computed tokens (a random-prompt benchmark): the
        // line cannot be identified, but a 16k tokens/s prior is slower than
        // any sample allows on a 64k engine with 6 ms of fixed time.
        let mut cal = ReplicaCalibration::new(1.0 / 16_000.0, 0.02, 1e-4, 1e-3, 0.01);
        let sigma = 1.0 / 64_000.0;
        let mut t = EngineTiming::default();
        cal.observe_engine(&t, &c);
        for _ in 0..20 {
            grow(&mut t, 3, 1024, sigma, 0.006);
            cal.observe_engine(&t, &c);
        }
        let (s, o) = cal.prefill_line();
        let per_token = (0.006 + sigma * 1024.0) / 1024.0;
        assert!(s <= per_token + 1e-12, "{s} vs {per_token}");
        assert!(s < 1.0 / 40_000.0, "{s}");
        // The prediction for the samples' size stays right.
        assert!((o + s * 1024.0 - (0.006 + sigma * 1024.0)).abs() < 1e-4, "{o}");
    }
}
