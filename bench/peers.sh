#!/usr/bin/env bash
# The live peer benchmark: kvgate against vllm-router, smg and NVIDIA Dynamo,
# each in front of a fresh `kvgate sim` fleet, driven by `vllm bench serve`.
#
#   bash bench/peers.sh            # the full comparison (3 repeats); the first run installs
#   bash bench/peers.sh --quick    # one repeat, one load level, fewer requests (< 10 min)
#   bash bench/peers.sh --help     # every option
#
# This wrapper only finds a Python 3.11, makes the bench's virtual environment
# (.cache/bench/venv, git-ignored) and runs bench/peers.py with it; the script
# installs and verifies the pinned peers itself. See docs/peers.md.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/.cache/bench/venv"

find_python311() {
    local c
    for c in "${KVGATE_BENCH_PYTHON:-}" python3.11 "$(pyenv root 2>/dev/null)/versions/3.11"*/bin/python3.11 \
        /root/.pyenv/versions/3.11*/bin/python3.11 /usr/bin/python3.11 /usr/local/bin/python3.11; do
        [ -n "$c" ] || continue
        if command -v "$c" >/dev/null 2>&1 && "$c" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null; then
            command -v "$c"
            return 0
        fi
    done
    return 1
}

if [ ! -x "$venv/bin/python" ]; then
    py="$(find_python311)" || {
        echo "peers.sh: no Python 3.11 found (vllm 0.33.0's client needs it); set KVGATE_BENCH_PYTHON=/path/to/python3.11" >&2
        exit 2
    }
    echo "peers.sh: creating $venv with $py" >&2
    mkdir -p "$(dirname "$venv")"
    "$py" -m venv "$venv"
fi

cd "$root"
exec "$venv/bin/python" "$root/bench/peers.py" "$@"
