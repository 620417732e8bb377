//! `kvgate tokenize` as a black box: every request of the parity corpus goes
//! through the binary (bundled Qwen3 and the fetched Llama 3 tokenizer) and
//! must print exactly the ids transformers + vLLM's rules give; bad input
//! fails with a clear message and a non-zero exit code.

// Test harness code: a failed unwrap is a failed test, with its message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

use serde_json::Value;

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn tokenize(body: &str, model_dir: Option<&PathBuf>) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_kvgate"));
    cmd.arg("tokenize").stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
    if let Some(dir) = model_dir {
        cmd.arg("--model-dir").arg(dir);
    }
    let mut child = cmd.spawn().unwrap();
    child.stdin.take().unwrap().write_all(body.as_bytes()).unwrap();
    child.wait_with_output().unwrap()
}

fn jsonl(path: PathBuf) -> Vec<Value> {
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn check_family(family: &str, model_dir: Option<PathBuf>) {
    let parity = repo_root().join("crates/kvgate-tokenize/tests/parity");
    let corpus = jsonl(parity.join("corpus.jsonl"));
    let expected = jsonl(parity.join(format!("expected-{family}.jsonl")));
    assert_eq!(corpus.len(), expected.len());
    // The binary is slow to start per case in debug builds; a spread sample
    // of the corpus (every case of the library is checked in
    // kvgate-tokenize's parity test) keeps this test quick.
    let mut checked = 0;
    for (case, want) in corpus.iter().zip(&expected).step_by(6) {
        assert_eq!(case["id"], want["id"]);
        let out = tokenize(&case["request"].to_string(), model_dir.as_ref());
        let id = &case["id"];
        if let Some(ids) = want.get("ids") {
            assert!(
                out.status.success(),
                "{family} {id}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let got: Value = serde_json::from_slice(&out.stdout).unwrap();
            assert_eq!(&got["tokens"], ids, "{family} {id}");
            assert_eq!(got["count"], ids.as_array().unwrap().len(), "{family} {id}");
        } else {
            assert!(!out.status.success(), "{family} {id}: expected an error");
            assert!(!out.stderr.is_empty());
        }
        checked += 1;
    }
    assert!(checked >= 13, "{family}: only {checked} cases checked");
}

#[test]
fn bundled_qwen3_matches_the_parity_fixtures() {
    check_family("qwen3", None);
}

#[test]
fn llama3_model_dir_matches_the_parity_fixtures() {
    let dir = repo_root().join(".cache/tokenizers/llama3_1");
    assert!(
        dir.exists(),
        "run `bash scripts/fetch-tokenizers.sh` (the README's test command does)"
    );
    check_family("llama3_1", Some(dir));
}

#[test]
fn bad_input_fails_clearly() {
    let cases = [
        ("not json", "not valid JSON"),
        ("[1, 2]", "must be a JSON object"),
        ("{}", "needs `messages`"),
        (r#"{"prompt": 5}"#, "`prompt` must be a string"),
        (r#"{"messages": []}"#, "empty conversation"),
        (r#"{"messages": "hi"}"#, "invalid chat request"),
    ];
    for (body, message) in cases {
        let out = tokenize(body, None);
        assert!(!out.status.success(), "{body}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(message), "{body}: {stderr}");
        assert!(!stderr.contains("panicked"), "{body}: {stderr}");
    }
    let missing = tokenize(r#"{"prompt": "x"}"#, Some(&repo_root().join("no/such/dir")));
    assert!(!missing.status.success());
    assert!(String::from_utf8_lossy(&missing.stderr).contains("no/such/dir"));
}
