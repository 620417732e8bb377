//! Jinja2 compatibility: every snippet of `tests/jinja/cases.jsonl`
//! (rendered by transformers' own chat-template environment, see
//! `tests/jinja/gen_cases.py`) must render identically here, or fail where
//! Jinja2 fails. All mismatches are reported at once.
//!
//! `KVGATE_JINJA_CASES=/path/to/more.jsonl` adds cases of the same shape
//! (e.g. real model templates rendered by a local script) without committing
//! them.

use super::{json_to_value, ChatTemplate};

const CASES: &str = include_str!("../../tests/jinja/cases.jsonl");

#[test]
fn snippets_render_like_transformers() {
    let extra = std::env::var("KVGATE_JINJA_CASES")
        .map(|path| std::fs::read_to_string(path).unwrap())
        .unwrap_or_default();
    let mut failures = Vec::new();
    let mut total = 0;
    for line in CASES.lines().chain(extra.lines()).filter(|l| !l.trim().is_empty()) {
        total += 1;
        let case: serde_json::Value = serde_json::from_str(line).unwrap();
        let name = case["name"].as_str().unwrap();
        let template = case["template"].as_str().unwrap();
        let ours =
            ChatTemplate::compile(template).and_then(|t| t.render(json_to_value(&case["context"])));
        match (case.get("output").and_then(|o| o.as_str()), ours) {
            (Some(want), Ok(got)) if want == got => {}
            (Some(want), Ok(got)) => {
                failures.push(format!("{name}:\n  jinja2:  {want:?}\n  kvgate:  {got:?}"))
            }
            (Some(want), Err(e)) => {
                failures.push(format!("{name}: kvgate failed ({e}), jinja2 gave {want:?}"))
            }
            (None, Ok(got)) => failures
                .push(format!("{name}: jinja2 failed ({}), kvgate gave {got:?}", case["error"])),
            (None, Err(_)) => {}
        }
    }
    eprintln!("{total} snippets, {} differ", failures.len());
    assert!(
        failures.is_empty(),
        "{}/{total} snippets differ from Jinja2:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
