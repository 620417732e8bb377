//! `--plots DIR`: SVG charts drawn with `plotters`.
//!
//! - `ttft_cdf_x{scale}.svg`: TTFT CDF per policy, one chart per load level;
//! - `hit_rate_x{scale}.svg`: hit rate per policy against the oracle and the
//!   ceiling, one per level (bars: first admission; outlines: engine counters);
//! - `ttft_vs_load.svg`: mean TTFT per policy against the rate scale;
//! - `replica_load_{policy}.svg`: requests in each replica over time, at the
//!   middle load level.
//!
//! SVG only: plotters draws bitmap text through a font library or a bundled
//! font, and kvgate ships neither.

use std::path::Path;

use plotters::prelude::*;

use crate::error::ReplayError;
use crate::metrics::RunSummary;
use crate::report::Report;

type DrawResult<T> = Result<T, Box<dyn std::error::Error>>;

fn color(i: usize) -> RGBColor {
    // Colour-blind-safe (Okabe–Ito) first, then plotters' palette.
    const OKABE_ITO: [RGBColor; 8] = [
        RGBColor(0, 114, 178),
        RGBColor(230, 159, 0),
        RGBColor(0, 158, 115),
        RGBColor(204, 121, 167),
        RGBColor(86, 180, 233),
        RGBColor(213, 94, 0),
        RGBColor(0, 0, 0),
        RGBColor(240, 228, 66),
    ];
    OKABE_ITO.get(i).copied().unwrap_or_else(|| {
        let c = Palette99::pick(i).to_rgba();
        RGBColor(c.0, c.1, c.2)
    })
}

fn levels(report: &Report) -> Vec<f64> {
    let mut scales: Vec<f64> = report.runs.iter().map(|r| r.rate_scale).collect();
    scales.sort_by(f64::total_cmp);
    scales.dedup();
    scales
}

fn runs_at(report: &Report, scale: f64) -> Vec<&RunSummary> {
    report.runs.iter().filter(|r| r.rate_scale == scale).collect()
}

fn ttft_cdf(path: &Path, runs: &[&RunSummary], scale: f64) -> DrawResult<()> {
    let root = SVGBackend::new(path, (800, 500)).into_drawing_area();
    root.fill(&WHITE)?;
    let max = runs.iter().flat_map(|r| r.ttft_s.iter().copied()).fold(0.01, f64::max);
    let min = runs
        .iter()
        .flat_map(|r| r.ttft_s.iter().copied())
        .filter(|&x| x > 0.0)
        .fold(max, f64::min)
        .max(1e-3);
    let mut chart = ChartBuilder::on(&root)
        .caption(format!("TTFT CDF, rate x{scale:.3}"), ("sans-serif", 20))
        .margin(10)
        .x_label_area_size(40)
        .y_label_area_size(50)
        .build_cartesian_2d((min * 0.9..max * 1.1).log_scale(), 0f64..1f64)?;
    chart.configure_mesh().x_desc("TTFT (s, log)").y_desc("fraction of requests").draw()?;
    for (i, r) in runs.iter().enumerate() {
        let mut xs = r.ttft_s.clone();
        xs.sort_by(f64::total_cmp);
        let n = xs.len().max(1) as f64;
        // At most ~400 points per curve keeps the SVG small.
        let stride = (xs.len() / 400).max(1);
        let pts: Vec<(f64, f64)> = xs
            .iter()
            .enumerate()
            .filter(|(k, _)| k % stride == 0 || *k + 1 == xs.len())
            .map(|(k, &x)| (x.max(min), (k + 1) as f64 / n))
            .collect();
        let c = color(i);
        chart
            .draw_series(LineSeries::new(pts, c.stroke_width(2)))?
            .label(r.policy.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}

fn hit_rate(path: &Path, runs: &[&RunSummary], scale: f64) -> DrawResult<()> {
    let root = SVGBackend::new(path, (800, 500)).into_drawing_area();
    root.fill(&WHITE)?;
    let n = runs.len() as u32;
    let (oracle, ceiling) =
        runs.first().map_or((0.0, 0.0), |r| (r.oracle_hit_rate, r.ceiling_hit_rate));
    let top = runs.iter().map(|r| r.hit_rate).fold(ceiling, f64::max) * 1.15 + 0.01;
    let names: Vec<String> = runs.iter().map(|r| r.policy.clone()).collect();
    let mut chart = ChartBuilder::on(&root)
        .caption(format!("KV hit rate per policy, rate x{scale:.3}"), ("sans-serif", 20))
        .margin(10)
        .x_label_area_size(40)
        .y_label_area_size(50)
        .build_cartesian_2d((0u32..n.saturating_sub(1)).into_segmented(), 0f64..top.min(1.0))?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(n as usize)
        .x_label_formatter(&|v| match v {
            SegmentValue::CenterOf(i) => names.get(*i as usize).cloned().unwrap_or_default(),
            _ => String::new(),
        })
        .y_desc("hit tokens / prompt tokens (bar: first admission; outline: engine counters)")
        .draw()?;
    // Bars: hits at first admission (comparable with the bounds); outlines:
    // the engines' counters, which also count re-admissions after preemption.
    chart.draw_series(runs.iter().enumerate().map(|(i, r)| {
        let i = i as u32;
        let mut bar = Rectangle::new(
            [
                (SegmentValue::Exact(i), 0.0),
                (SegmentValue::Exact(i + 1), r.first_admission_hit_rate),
            ],
            color(i as usize).filled(),
        );
        bar.set_margin(0, 0, 12, 12);
        bar
    }))?;
    chart.draw_series(runs.iter().enumerate().map(|(i, r)| {
        let i = i as u32;
        let mut bar = Rectangle::new(
            [(SegmentValue::Exact(i), 0.0), (SegmentValue::Exact(i + 1), r.hit_rate)],
            BLACK.stroke_width(1),
        );
        bar.set_margin(0, 0, 12, 12);
        bar
    }))?;
    for (value, label, c) in
        [(oracle, "oracle (pooled LRU)", RGBColor(200, 0, 0)), (ceiling, "ceiling", BLACK)]
    {
        chart
            .draw_series(LineSeries::new(
                [(SegmentValue::Exact(0), value), (SegmentValue::Last, value)],
                c.stroke_width(2),
            ))?
            .label(format!("{label} {value:.3}"))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}

fn ttft_vs_load(path: &Path, report: &Report) -> DrawResult<()> {
    let root = SVGBackend::new(path, (800, 500)).into_drawing_area();
    root.fill(&WHITE)?;
    let scales = levels(report);
    let (smin, smax) =
        (scales.first().copied().unwrap_or(1.0), scales.last().copied().unwrap_or(1.0));
    let ymax = report.runs.iter().map(|r| r.ttft_ms.mean / 1000.0).fold(0.01, f64::max);
    let ymin = report
        .runs
        .iter()
        .map(|r| r.ttft_ms.mean / 1000.0)
        .filter(|&x| x > 0.0)
        .fold(ymax, f64::min)
        .max(1e-3);
    let mut chart = ChartBuilder::on(&root)
        .caption("Mean TTFT against load", ("sans-serif", 20))
        .margin(10)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(
            (smin - 0.05 * (smax - smin) - 0.01)..(smax + 0.05 * (smax - smin) + 0.01),
            (ymin * 0.8..ymax * 1.25).log_scale(),
        )?;
    chart
        .configure_mesh()
        .y_max_light_lines(1)
        .x_desc("rate scale (× the workload's own rate)")
        .y_desc("mean TTFT (s, log)")
        .draw()?;
    let mut policies: Vec<&str> = Vec::new();
    for r in &report.runs {
        if !policies.contains(&r.policy.as_str()) {
            policies.push(&r.policy);
        }
    }
    for (i, p) in policies.iter().enumerate() {
        let pts: Vec<(f64, f64)> = report
            .runs
            .iter()
            .filter(|r| r.policy == *p)
            .map(|r| (r.rate_scale, (r.ttft_ms.mean / 1000.0).max(ymin)))
            .collect();
        let c = color(i);
        chart
            .draw_series(LineSeries::new(pts.clone(), c.stroke_width(2)))?
            .label(p.to_string())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2)));
        chart.draw_series(pts.into_iter().map(|pt| Circle::new(pt, 3, c.filled())))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}

fn replica_load(path: &Path, run: &RunSummary) -> DrawResult<()> {
    let root = SVGBackend::new(path, (800, 400)).into_drawing_area();
    root.fill(&WHITE)?;
    let tmax = run.load.last().map_or(1.0, |s| s.at_s).max(1.0);
    let ymax = run.load.iter().flat_map(|s| s.requests.iter().copied()).max().unwrap_or(1).max(1);
    let n = run.load.first().map_or(0, |s| s.requests.len());
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("Requests per replica, {} at rate x{:.3}", run.policy, run.rate_scale),
            ("sans-serif", 18),
        )
        .margin(10)
        .x_label_area_size(40)
        .y_label_area_size(50)
        .build_cartesian_2d(0f64..tmax, 0f64..f64::from(ymax) * 1.1)?;
    chart.configure_mesh().x_desc("virtual time (s)").y_desc("running + waiting").draw()?;
    // At most ~600 points per replica.
    let stride = (run.load.len() / 600).max(1);
    for i in 0..n {
        let pts: Vec<(f64, f64)> = run
            .load
            .iter()
            .step_by(stride)
            .map(|s| (s.at_s, f64::from(s.requests.get(i).copied().unwrap_or(0))))
            .collect();
        let c = color(i);
        chart
            .draw_series(LineSeries::new(pts, c.stroke_width(1)))?
            .label(format!("replica {i}"))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2)));
    }
    chart.configure_series_labels().background_style(WHITE.mix(0.8)).border_style(BLACK).draw()?;
    root.present()?;
    Ok(())
}

fn slug(scale: f64) -> String {
    format!("{scale:.3}").replace('.', "_")
}

/// Writes every chart of `report` into `dir` (created if missing); returns
/// the files written.
pub fn write_plots(dir: &Path, report: &Report) -> Result<Vec<String>, ReplayError> {
    let err = |path: &Path, e: &dyn std::fmt::Display| ReplayError::Plot {
        path: path.display().to_string(),
        message: e.to_string(),
    };
    std::fs::create_dir_all(dir).map_err(|e| err(dir, &e))?;
    let mut written = Vec::new();
    let scales = levels(report);
    for &s in &scales {
        let runs = runs_at(report, s);
        let p = dir.join(format!("ttft_cdf_x{}.svg", slug(s)));
        ttft_cdf(&p, &runs, s).map_err(|e| err(&p, &e))?;
        written.push(p.display().to_string());
        let p = dir.join(format!("hit_rate_x{}.svg", slug(s)));
        hit_rate(&p, &runs, s).map_err(|e| err(&p, &e))?;
        written.push(p.display().to_string());
    }
    let p = dir.join("ttft_vs_load.svg");
    ttft_vs_load(&p, report).map_err(|e| err(&p, &e))?;
    written.push(p.display().to_string());
    if let Some(&mid) = scales.get(scales.len().saturating_sub(1) / 2) {
        for r in runs_at(report, mid) {
            let p = dir.join(format!("replica_load_{}.svg", r.policy));
            replica_load(&p, r).map_err(|e| err(&p, &e))?;
            written.push(p.display().to_string());
        }
    }
    Ok(written)
}

/// One named line of a [`line_chart`].
#[derive(Clone, Debug)]
pub struct Line {
    /// Legend text.
    pub label: String,
    /// Points, in x order.
    pub points: Vec<(f64, f64)>,
}

/// A plain SVG line chart (for measurements outside a replay report, such
/// as the soak's memory curve). The y axis starts at 0 so that a flat line
/// looks flat.
pub fn line_chart(
    path: &Path,
    title: &str,
    x_desc: &str,
    y_desc: &str,
    lines: &[Line],
) -> Result<(), ReplayError> {
    let draw = || -> DrawResult<()> {
        let root = SVGBackend::new(path, (800, 400)).into_drawing_area();
        root.fill(&WHITE)?;
        let pts = || lines.iter().flat_map(|l| l.points.iter());
        let xmax = pts().map(|p| p.0).fold(1e-9, f64::max);
        let xmin = pts().map(|p| p.0).fold(xmax, f64::min);
        let ymax = pts().map(|p| p.1).fold(1e-9, f64::max) * 1.15;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 18))
            .margin(10)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(xmin..xmax.max(xmin + 1e-9), 0f64..ymax)?;
        chart.configure_mesh().x_desc(x_desc).y_desc(y_desc).draw()?;
        for (i, l) in lines.iter().enumerate() {
            let c = color(i);
            chart
                .draw_series(LineSeries::new(l.points.clone(), c.stroke_width(2)))?
                .label(l.label.clone())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2))
                });
            chart.draw_series(l.points.iter().map(|&p| Circle::new(p, 3, c.filled())))?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerRight)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()?;
        root.present()?;
        Ok(())
    };
    draw()
        .map_err(|e| ReplayError::Plot { path: path.display().to_string(), message: e.to_string() })
}
