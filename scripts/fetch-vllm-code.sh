#!/usr/bin/env bash
# Fetches the vLLM 0.33.0 release wheel from PyPI (no dependencies: the
# wheel alone, ~340 MB) with the test venv's pip, keeps the few Python files
# the interop tests load (tests/py/vllm033/), and deletes the wheel.
# The files live in .cache/vllm-0.33.0/ (git-ignored). Nothing of vLLM is
# copied into the repository: the tests read these files at run time.
#
# Usage: scripts/fetch-vllm-code.sh      (prints the directory on success)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VERSION="0.33.0"
DEST="$ROOT/.cache/vllm-$VERSION"
PY="${KVGATE_TEST_PYTHON:-$ROOT/.cache/venv/bin/python}"
FILES=(
  vllm/distributed/kv_events.py
  vllm/v1/core/kv_cache_utils.py
  vllm/v1/kv_offload/base.py
  vllm/distributed/kv_transfer/kv_connector/v1/offloading/events.py
  vllm/v1/metrics/loggers.py
)

have_all() {
  for f in "${FILES[@]}"; do [ -s "$DEST/$f" ] || return 1; done
}
if have_all; then
  echo "$DEST"
  exit 0
fi
[ -x "$PY" ] || { echo "fetch-vllm-code: no python at $PY (run scripts/setup-test-env.sh)" >&2; exit 1; }
TMP="$(mktemp -d "$ROOT/.cache/vllm-wheel.XXXXXX")"
trap 'rm -rf "$TMP"' EXIT
"$PY" -m pip download --disable-pip-version-check --no-input --quiet \
  --no-deps --only-binary :all: -d "$TMP" "vllm==$VERSION" >&2
WHEEL="$(ls "$TMP"/vllm-"$VERSION"-*.whl | head -n 1)"
"$PY" - "$WHEEL" "$DEST" "${FILES[@]}" <<'PYEOF'
import sys, zipfile, pathlib
wheel, dest, names = sys.argv[1], pathlib.Path(sys.argv[2]), sys.argv[3:]
with zipfile.ZipFile(wheel) as z:
    for name in names:
        out = dest / name
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(z.read(name))
PYEOF
have_all || { echo "fetch-vllm-code: the wheel lacked some of: ${FILES[*]}" >&2; exit 1; }
echo "$DEST"
