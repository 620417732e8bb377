//! Against vLLM 0.33's own code: `tests/py/vllm033/interop.py` runs vLLM's
//! block hashing, event classes and offloading event tracker (from the
//! release wheel that `scripts/fetch-vllm-code.sh` fetches) and hands over
//! what they produce.
//!
//! - Extra keys: over random requests varying tokens, LoRA adapter and
//!   `cache_salt`, two requests share a prefix block in vLLM's hashes if and
//!   only if they share it in kvgate's query keys, and the GPU event vLLM
//!   publishes for a request keys exactly as kvgate's query for it.
//! - Offloading: after every batch of GPU stores and removals, CPU chunk
//!   stores that re-announce shared hashes, CPU evictions and placeholders
//!   that follow the GPU removal, the index holds exactly the engine's
//!   residency per tier, with no anomaly.
//!
//! Needs the test venv (`scripts/setup-test-env.sh`) and the vLLM files;
//! `scripts/test.sh` prepares both. Without them the test fails and says so.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

use kvgate_events::{decode_batch, BlockHash};
use kvgate_index::{request_block_keys, Index, ReplicaSpec, Tier};
use serde_json::Value;

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Runs the script once per seed and parses its JSON.
fn vllm_says(seed: u64) -> Value {
    let root = repo_root();
    let python = std::env::var_os("KVGATE_TEST_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join(".cache/venv/bin/python"));
    let code = std::env::var_os("KVGATE_VLLM_CODE")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join(".cache/vllm-0.33.0"));
    assert!(
        python.exists() && code.join("vllm/distributed/kv_events.py").exists(),
        "{} or {} missing: run `bash scripts/setup-test-env.sh` and `bash scripts/fetch-vllm-code.sh` \
         (scripts/test.sh does both)",
        python.display(),
        code.display()
    );
    let out = Command::new(&python)
        .arg(root.join("tests/py/vllm033/interop.py"))
        .arg(&code)
        .arg(seed.to_string())
        .output()
        .unwrap();
    assert!(out.status.success(), "interop.py failed: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn hex(s: &str) -> Vec<u8> {
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
}

/// An engine hash as the index reports it.
fn folded(hex_hash: &str) -> u64 {
    BlockHash::Bytes(hex(hex_hash)).fold_u64()
}

fn query_keys(case: &Value) -> Vec<kvgate_index::BlockKey> {
    let tokens: Vec<u32> =
        case["tokens"].as_array().unwrap().iter().map(|t| t.as_u64().unwrap() as u32).collect();
    let bs = case["block_size"].as_u64().unwrap_or(4) as usize;
    request_block_keys(&tokens, bs, case["lora"].as_str(), case["salt"].as_str())
}

#[test]
fn a_prefix_block_is_shared_in_kvgate_exactly_when_vllm_shares_it() {
    for seed in [1, 2, 3] {
        let doc = vllm_says(seed);
        let cases = doc["extra_keys"].as_array().unwrap();
        let ours: Vec<_> = cases.iter().map(query_keys).collect();
        let theirs: Vec<Vec<&str>> = cases
            .iter()
            .map(|c| {
                c["vllm_hashes"].as_array().unwrap().iter().map(|h| h.as_str().unwrap()).collect()
            })
            .collect();
        let (mut shared, mut apart) = (0, 0);
        for i in 0..cases.len() {
            assert_eq!(ours[i].len(), theirs[i].len(), "case {i}: block count");
            for j in i + 1..cases.len() {
                for b in 0..ours[i].len().min(ours[j].len()) {
                    let vllm = theirs[i][b] == theirs[j][b];
                    let kvgate = ours[i][b] == ours[j][b];
                    assert_eq!(
                        vllm, kvgate,
                        "seed {seed}, cases {i} and {j}, block {b}: vLLM shares {vllm}, kvgate {kvgate}\n{}\n{}",
                        cases[i], cases[j]
                    );
                    if vllm {
                        shared += 1;
                    } else {
                        apart += 1;
                    }
                }
            }
        }
        // Both outcomes occur often, so the equivalence says something.
        assert!(shared > 50 && apart > 50, "seed {seed}: {shared} shared, {apart} apart");
    }
}

#[test]
fn the_event_vllm_publishes_keys_as_kvgates_query() {
    let doc = vllm_says(4);
    let mut lora_or_salt = 0;
    for (i, case) in doc["extra_keys"].as_array().unwrap().iter().enumerate() {
        let mut index = Index::new();
        let id = index.add_replica(ReplicaSpec::new("r", 0, 4)).unwrap();
        let batch = decode_batch(&hex(case["gpu_batch"].as_str().unwrap())).unwrap();
        let out = index.apply_batch(id, &batch, Instant::now());
        assert!(out.anomalies.is_empty(), "case {i}: {:?}", out.anomalies);
        let keys = query_keys(case);
        let mut found = Vec::new();
        index.find_matches(&keys, &mut found);
        assert_eq!(found[0].gpu as usize, keys.len(), "case {i}: {case}");
        lora_or_salt += usize::from(!case["lora"].is_null() || !case["salt"].is_null());
    }
    assert!(lora_or_salt >= 20, "only {lora_or_salt} cases with an adapter or a salt");
}

#[test]
fn offloading_events_leave_the_engines_residency_per_tier() {
    let doc = vllm_says(5);
    for scenario in doc["offload"].as_array().unwrap() {
        let mode = if scenario["self_describing"].as_bool().unwrap() {
            "self-describing"
        } else {
            "placeholder"
        };
        let mut index = Index::new();
        let id = index.add_replica(ReplicaSpec::new("r", 0, 4)).unwrap();
        let now = Instant::now();
        let batches = scenario["batches"].as_array().unwrap();
        let expected = scenario["expected"].as_array().unwrap();
        for (step, (payload, want)) in batches.iter().zip(expected).enumerate() {
            let batch = decode_batch(&hex(payload.as_str().unwrap())).unwrap();
            assert_eq!(batch.skipped_events, 0, "{mode} step {step}");
            index.apply_batch(id, &batch, now);
            for (tier, label) in [(Tier::Gpu, "GPU"), (Tier::Cpu, "CPU")] {
                let mut want: Vec<u64> = want[label]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|h| folded(h.as_str().unwrap()))
                    .collect();
                want.sort_unstable();
                let mut held = index.engine_hashes(id, tier).unwrap();
                held.sort_unstable();
                assert_eq!(held, want, "{mode}, after batch {step}, tier {label}");
            }
        }
        assert!(index.anomalies().is_empty(), "{mode}: {:?}", index.anomalies());
        // Self-describing chunks are matched under the requests' own keys
        // (adapter and salt included, though the chunk events carry no extra
        // keys): the surviving request's whole prompt is on CPU.
        if mode == "self-describing" {
            let prompt = &scenario["prompts"][1];
            let mut case = prompt.clone();
            case["block_size"] = 4.into();
            let mut found = Vec::new();
            index.find_matches(&query_keys(&case), &mut found);
            assert_eq!((found[0].cpu, found[0].total), (8, 8), "{mode}: {:?}", found[0]);
        }
    }
}
