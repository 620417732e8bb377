//! `kvgate replay --suite`: the fixed acceptance suite in fast mode.
//! Both Mooncake traces, synthetic chat, agentic and noreuse; each at
//! least_load's `--levels` (found by `--sweep-rate auto`) with every
//! `--policies` entry; then one scoreboard of every metric as a ratio to the
//! best policy at that level (`kvgate_replay::scoreboard`).

use anyhow::{bail, Context};
use kvgate_replay::{render_scoreboard, render_table, scoreboard, Report};
use serde::Serialize;

use crate::replay_cmd::{load_workload, parse_policies, replay_workload, Mode, ReplayArgs};

/// The suite's traces, in `--suite-traces`.
const TRACES: [&str; 2] = ["mooncake_conversation_trace.jsonl", "mooncake_synthetic_trace.jsonl"];
/// The suite's generated workloads, at their default parameters.
const SYNTHETIC: [&str; 3] = ["synthetic:chat", "synthetic:agentic", "synthetic:noreuse"];

/// The `--json` document of a suite run.
#[derive(Serialize)]
struct SuiteReport<'a> {
    /// One report per workload, as `kvgate replay --json` writes it.
    reports: &'a [Report],
    /// Per workload and level, each policy's metrics ÷ the best policy's.
    scoreboard: Vec<kvgate_replay::LevelScore>,
}

pub(crate) fn run_suite(args: &ReplayArgs) -> anyhow::Result<()> {
    if args.mode != Mode::Fast {
        bail!("--suite runs in fast mode only");
    }
    let policies = parse_policies(&args.policies)?;
    let mut workloads = Vec::new();
    for t in TRACES {
        let path = args.suite_traces.join(t);
        if !path.is_file() {
            bail!(
                "--suite needs {} (the Mooncake traces; point --suite-traces at their directory)",
                path.display()
            );
        }
        workloads.push((Some(path), None));
    }
    workloads.extend(SYNTHETIC.iter().map(|w| (None, Some((*w).to_owned()))));
    let mut reports = Vec::new();
    for (i, (trace, workload)) in workloads.into_iter().enumerate() {
        let mut a = args.clone();
        a.suite = false;
        a.trace = trace;
        a.workload = workload;
        a.sweep_rate = Some("auto".to_owned());
        let label = a
            .trace
            .as_ref()
            .map_or_else(|| a.workload.clone().unwrap_or_default(), |p| p.display().to_string());
        eprintln!("kvgate replay --suite: workload {} of 5: {label}", i + 1);
        let w = load_workload(&a).with_context(|| format!("loading {label}"))?;
        let report = replay_workload(&a, &w, &policies, &[(1, true)])?;
        eprint!("{}", render_table(&report));
        reports.push(report);
    }
    let board = scoreboard(&reports);
    let table = render_scoreboard(&board);
    match &args.json {
        Some(p) => {
            let doc = SuiteReport { reports: &reports, scoreboard: board };
            let text = serde_json::to_string_pretty(&doc).context("encoding the suite report")?;
            if p.as_os_str() == "-" {
                eprint!("{table}");
                println!("{text}");
            } else {
                print!("{table}");
                std::fs::write(p, text + "\n")
                    .with_context(|| format!("writing {}", p.display()))?;
            }
        }
        None => print!("{table}"),
    }
    Ok(())
}
