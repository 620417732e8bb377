#!/usr/bin/env bash
# The dashboard's browser test: headless Chromium from Debian's
# packages, driven by playwright-core from the npm registry, against a real
# `kvgate serve` with its embedded simulated replicas. Installs Chromium when
# missing (as root, as CI runs), builds kvgate unless KVGATE_BIN names one,
# and leaves a screenshot in .cache/artifacts/dashboard.png.
#
#   bash scripts/browser-test.sh          # the test
#   bash scripts/browser-test.sh --docs   # also refresh docs/img/dashboard*.png
set -euo pipefail
cd "$(dirname "$0")/.."

if [ ! -x /usr/bin/chromium ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "browser-test: /usr/bin/chromium is missing; install it with: apt-get install chromium" >&2
    exit 1
  fi
  echo "browser-test: installing chromium (Debian package)"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core >/dev/null
fi

# playwright-core only (no browser download): the version is pinned in package-lock.json.
(cd tests/browser && npm ci --no-audit --no-fund --loglevel=error >/dev/null)

bin=${KVGATE_BIN:-}
if [ -z "$bin" ] || [ ! -x "$bin" ]; then
  cargo build -q -p kvgate --bin kvgate
  bin="${CARGO_TARGET_DIR:-$PWD/target}/debug/kvgate"
fi

docs=()
if [ "${1:-}" = "--docs" ]; then
  docs=(--docs docs/img)
fi
node tests/browser/dashboard.mjs --bin "$bin" --out .cache/artifacts "${docs[@]}"
