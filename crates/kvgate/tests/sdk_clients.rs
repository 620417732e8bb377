//! The official SDKs through kvgate: the `openai` SDK's Responses API and
//! the `anthropic` SDK's Messages API (tests/py/sdk/), each driving two
//! `kvgate serve` instances taken in turn, as a round-robin balancer would,
//! in front of two simulated engines. The instances share an affinity key;
//! the Responses chain must run on one engine by the engines' own counters,
//! and the Messages conversation (tools in its history, whole and streamed
//! turns, count_tokens) must be served from the engines' prefix caches after
//! its first turn. The same scripts run against real engines by hand
//! (docs/agents.md).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::process::Command;

use support::{spawn_serve, spawn_sim, wait_ready};

mod support;

fn python() -> PathBuf {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let python = std::env::var_os("KVGATE_TEST_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join(".cache/venv/bin/python"));
    assert!(
        python.exists(),
        "run `bash scripts/setup-test-env.sh` (the README's test command does)"
    );
    python
}

fn run_script(script: &str, bases: &[&str], engines: &[&str]) {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut cmd = Command::new(python());
    cmd.arg(root.join("tests/py/sdk").join(script));
    for b in bases {
        cmd.args(["--base", b]);
    }
    for e in engines {
        cmd.args(["--engine", e]);
    }
    let out = cmd.output().unwrap();
    let text =
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{script} failed:\n{text}");
    assert!(text.lines().any(|l| l == "ok"), "{script} did not finish:\n{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_sdks_run_their_conversations_through_two_instances() {
    let sims = [spawn_sim(None, false, &[]), spawn_sim(None, false, &[])];
    let key = ["--affinity-key", "a-key-the-instances-share-0123456789"];
    let serves =
        [spawn_serve(&[&sims[0], &sims[1]], &key), spawn_serve(&[&sims[0], &sims[1]], &key)];
    for s in &serves {
        wait_ready(&s.base).await;
    }
    let bases: Vec<String> = serves.iter().map(|s| s.base.clone()).collect();
    let engines: Vec<String> = sims.iter().map(|s| s.url.clone()).collect();
    tokio::task::spawn_blocking(move || {
        let bases: Vec<&str> = bases.iter().map(String::as_str).collect();
        let engines: Vec<&str> = engines.iter().map(String::as_str).collect();
        run_script("responses_sdk.py", &bases, &engines);
        run_script("messages_sdk.py", &bases, &engines);
    })
    .await
    .unwrap();
}
