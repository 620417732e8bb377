//! Reading values back out of an exposition: for tests and scripts, and for
//! anything that wants the sim's numbers without a Prometheus parser.

/// One sample's value by its name, e.g. `vllm:num_requests_running` or
/// `vllm:request_prefill_time_seconds_sum`: the first sample of that name,
/// whatever its labels.
pub fn scrape(text: &str, name: &str) -> Option<f64> {
    scrape_labeled(text, name, "")
}

/// One sample's value by its name and a substring of its label set, e.g.
/// `scrape_labeled(text, "vllm:request_success_total",
/// "finished_reason=\"length\"")`.
pub fn scrape_labeled(text: &str, name: &str, labels: &str) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .find(|l| labels.is_empty() || sample_labels(l).contains(labels))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

fn sample_labels(line: &str) -> &str {
    match (line.find('{'), line.rfind('}')) {
        (Some(a), Some(b)) if a < b => &line[a + 1..b],
        _ => "",
    }
}

/// A histogram's `_sum` and `_count`.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct HistogramTotals {
    /// `NAME_sum`.
    pub sum: f64,
    /// `NAME_count`.
    pub count: f64,
}

impl HistogramTotals {
    /// `sum / count`, `None` without observations.
    pub fn mean(&self) -> Option<f64> {
        (self.count > 0.0).then(|| self.sum / self.count)
    }
}

/// The `_sum` and `_count` of histogram `name` (its base name, e.g.
/// `vllm:request_prefill_time_seconds`); `None` when either is missing.
pub fn scrape_histogram(text: &str, name: &str) -> Option<HistogramTotals> {
    Some(HistogramTotals {
        sum: scrape(text, &format!("{name}_sum"))?,
        count: scrape(text, &format!("{name}_count"))?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "# HELP x_total x\n\
        vllm:request_success_total{engine=\"0\",finished_reason=\"stop\"} 1.0\n\
        vllm:request_success_total{engine=\"0\",finished_reason=\"length\"} 3.0\n\
        vllm:e2e_request_latency_seconds_count{engine=\"0\"} 4.0\n\
        vllm:e2e_request_latency_seconds_sum{engine=\"0\"} 2.0\n\
        plain 7\n";

    #[test]
    fn scrapes_by_name_and_labels() {
        assert_eq!(scrape(TEXT, "vllm:request_success_total"), Some(1.0));
        assert_eq!(
            scrape_labeled(TEXT, "vllm:request_success_total", "finished_reason=\"length\""),
            Some(3.0)
        );
        assert_eq!(scrape_labeled(TEXT, "vllm:request_success_total", "abort"), None);
        assert_eq!(scrape(TEXT, "plain"), Some(7.0));
        assert_eq!(scrape(TEXT, "plai"), None);
        let h = scrape_histogram(TEXT, "vllm:e2e_request_latency_seconds").unwrap();
        assert_eq!(h, HistogramTotals { sum: 2.0, count: 4.0 });
        assert_eq!(h.mean(), Some(0.5));
        assert_eq!(scrape_histogram(TEXT, "vllm:missing"), None);
    }
}
