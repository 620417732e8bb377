//! Prometheus text pages: the engines' hit and preemption counters, and
//! kvgate's decision-time histogram, each read before and after a run.

use std::collections::HashMap;

use crate::client::with_key;
use crate::{LiveError, LiveOptions};

/// The value of every sample of `name` (any labels) in a Prometheus text page.
pub fn prometheus_samples<'a>(text: &'a str, name: &'a str) -> impl Iterator<Item = f64> + 'a {
    text.lines().filter_map(move |l| {
        let rest = l.strip_prefix(name)?;
        if !(rest.starts_with(' ') || rest.starts_with('{')) {
            return None;
        }
        l.rsplit(' ').next()?.parse::<f64>().ok()
    })
}

/// The engines' hit counters, summed over replicas.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Counters {
    pub(crate) queries: f64,
    pub(crate) hits: f64,
    pub(crate) external_hits: f64,
    pub(crate) preemptions: f64,
}

impl Counters {
    pub(crate) fn delta(&self, before: &Counters) -> Counters {
        Counters {
            queries: self.queries - before.queries,
            hits: self.hits - before.hits,
            external_hits: self.external_hits - before.external_hits,
            preemptions: self.preemptions - before.preemptions,
        }
    }

    /// Engine-side hit tokens ÷ queried tokens; `None` before any query.
    pub(crate) fn hit_rate(&self) -> Option<f64> {
        (self.queries > 0.0).then(|| (self.hits + self.external_hits) / self.queries)
    }
}

pub(crate) async fn engine_counters(
    client: &reqwest::Client,
    engines: &[String],
) -> Result<Counters, LiveError> {
    let mut c = Counters::default();
    for url in engines {
        let url = format!("{url}/metrics");
        let scrape = |source| LiveError::Scrape { url: url.clone(), source };
        let text = client
            .get(&url)
            .send()
            .await
            .and_then(|r| r.error_for_status())
            .map_err(scrape)?
            .text()
            .await
            .map_err(scrape)?;
        c.queries += prometheus_samples(&text, "vllm:prefix_cache_queries_total").sum::<f64>();
        c.hits += prometheus_samples(&text, "vllm:prefix_cache_hits_total").sum::<f64>();
        c.external_hits +=
            prometheus_samples(&text, "vllm:external_prefix_cache_hits_total").sum::<f64>();
        c.preemptions += prometheus_samples(&text, "vllm:num_preemptions_total").sum::<f64>();
    }
    Ok(c)
}

/// kvgate's decision-time histogram: cumulative bucket counts by upper
/// bound, sum and count.
#[derive(Debug, Default, Clone)]
pub(crate) struct Histogram {
    buckets: Vec<(f64, f64)>,
    pub(crate) sum: f64,
    pub(crate) count: f64,
}

impl Histogram {
    pub(crate) fn delta(&self, before: &Histogram) -> Histogram {
        let prior: HashMap<u64, f64> =
            before.buckets.iter().map(|(le, c)| (le.to_bits(), *c)).collect();
        Histogram {
            buckets: self
                .buckets
                .iter()
                .map(|(le, c)| (*le, c - prior.get(&le.to_bits()).copied().unwrap_or(0.0)))
                .collect(),
            sum: self.sum - before.sum,
            count: self.count - before.count,
        }
    }

    /// The upper bound of the bucket holding quantile `q`, µs.
    pub(crate) fn quantile_us(&self, q: f64) -> f64 {
        let want = q * self.count;
        self.buckets
            .iter()
            .find(|(_, c)| *c >= want && *c > 0.0)
            .map_or(f64::NAN, |(le, _)| le * 1e6)
    }
}

/// The decision-time histograms of every instance, added up. An instance
/// that cannot be read counts as empty (its decisions are then missing
/// from the decision-time figures, not from the run).
pub(crate) async fn decide_histograms(
    client: &reqwest::Client,
    bases: &[String],
    opts: &LiveOptions,
) -> Histogram {
    let mut total = Histogram::default();
    for base in bases {
        let h = decide_histogram(client, base, opts).await;
        if total.buckets.is_empty() {
            total.buckets = h.buckets;
        } else {
            for (t, b) in total.buckets.iter_mut().zip(&h.buckets) {
                t.1 += b.1;
            }
        }
        total.sum += h.sum;
        total.count += h.count;
    }
    total
}

async fn decide_histogram(client: &reqwest::Client, base: &str, opts: &LiveOptions) -> Histogram {
    let Ok(r) = with_key(client.get(format!("{base}/metrics")), opts).send().await else {
        return Histogram::default();
    };
    let Ok(text) = r.text().await else { return Histogram::default() };
    let mut h = Histogram::default();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("kvgate_decide_seconds_bucket{le=\"") {
            let Some((le, tail)) = rest.split_once('"') else { continue };
            let le = if le == "+Inf" { f64::INFINITY } else { le.parse().unwrap_or(f64::NAN) };
            if let Some(c) = tail.rsplit(' ').next().and_then(|v| v.parse().ok()) {
                h.buckets.push((le, c));
            }
        }
    }
    h.sum = prometheus_samples(&text, "kvgate_decide_seconds_sum").sum();
    h.count = prometheus_samples(&text, "kvgate_decide_seconds_count").sum();
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_match_the_whole_name_with_or_without_labels() {
        let page = "# HELP x\nvllm:prefix_cache_hits_total{engine=\"0\"} 12\n\
                    vllm:prefix_cache_hits_total 3\nvllm:prefix_cache_hits_total_extra 100\n";
        let got: Vec<f64> = prometheus_samples(page, "vllm:prefix_cache_hits_total").collect();
        assert_eq!(got, vec![12.0, 3.0]);
    }

    #[test]
    fn histogram_quantiles_come_from_the_delta() {
        let before = Histogram { buckets: vec![(1e-5, 10.0), (1e-4, 10.0)], sum: 0.0, count: 10.0 };
        let after = Histogram { buckets: vec![(1e-5, 10.0), (1e-4, 20.0)], sum: 0.0, count: 20.0 };
        let d = after.delta(&before);
        assert_eq!(d.count, 10.0);
        assert!((d.quantile_us(0.5) - 100.0).abs() < 1e-9);
    }
}
