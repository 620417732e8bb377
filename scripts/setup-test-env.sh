#!/usr/bin/env bash
# Create the Python environment used by kvgate's wire tests: a stand-in vLLM
# KV-event publisher (tests/py/vllm_publisher.py) and the fixture generator
# (tests/py/gen_fixtures.py). Both need pyzmq and msgspec.
# The tokenizer parity generator (tests/py/parity/gen_expected.py) also needs
# transformers (with tokenizers and jinja2; torch is NOT installed, transformers
# only needs it for models). The transformers/tokenizers/jinja2 pins are the
# versions that `pip install vllm==0.33.0` resolves to (vllm 0.33.0 requires
# transformers>=5.16.1,<5.21.0 and tokenizers>=0.23.2), so the fixtures are
# rendered by the same library versions as the engine.
# scripts/check-manifests.sh also needs kubernetes-validate (schema checks of
# deploy/kubernetes against the Kubernetes JSON schemas it bundles; offline).
#
# Usage: scripts/setup-test-env.sh        (from anywhere)
#   PYTHON=/usr/bin/python3.11 scripts/setup-test-env.sh   to choose the interpreter
#
# The environment lives at .cache/venv (git-ignored). Re-running is cheap: when
# the pinned versions are already importable from it, nothing is installed.
# The last line printed is the path of the environment's python.
#
# Fallbacks, in order, for machines where `python3 -m venv` cannot bootstrap
# pip (Debian/Ubuntu without python3-venv, where ensurepip is missing):
#   1. python3 -m venv .cache/venv                       (pip inside the venv)
#   2. python3 -m virtualenv .cache/venv                 (if virtualenv is installed)
#   3. python3 -m venv --without-pip .cache/venv, then the system pip installs
#      into the venv's site-packages with --target (this also sidesteps the
#      PEP 668 "externally managed" refusal of Debian's system pip)
#   4. no venv module at all: a bare directory with a site-packages folder
#      filled by the system pip (--target) and a bin/python wrapper script
#      that runs the system python with that folder on PYTHONPATH.
set -euo pipefail

PYZMQ_VERSION="27.3.0"
MSGSPEC_VERSION="0.23.0"
TRANSFORMERS_VERSION="5.20.2"
TOKENIZERS_VERSION="0.23.3"
JINJA2_VERSION="3.1.6"
KUBERNETES_VALIDATE_VERSION="1.37.0"
# The official SDKs, driven through kvgate by tests/py/sdk/ (tests/sdk_clients.rs).
OPENAI_VERSION="3.63.0"
ANTHROPIC_VERSION="2.17.0"

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.cache/venv"
PY_BIN="$VENV/bin/python"
SYS_PY="${PYTHON:-python3}"

log() { printf 'setup-test-env: %s\n' "$*" >&2; }

# True when $PY_BIN imports pyzmq and msgspec at the pinned versions and has the
# pinned transformers/tokenizers/jinja2 installed (checked through package
# metadata: importing transformers takes seconds, and this is the fast path).
have_pins() {
  [ -x "$PY_BIN" ] || return 1
  "$PY_BIN" - "$PYZMQ_VERSION" "$MSGSPEC_VERSION" \
    "$TRANSFORMERS_VERSION" "$TOKENIZERS_VERSION" "$JINJA2_VERSION" \
    "$KUBERNETES_VALIDATE_VERSION" "$OPENAI_VERSION" "$ANTHROPIC_VERSION" <<'EOF' >/dev/null 2>&1
import sys
from importlib.metadata import version
import msgspec
import zmq
ok = zmq.__version__ == sys.argv[1] and msgspec.__version__ == sys.argv[2]
ok = ok and [version(p) for p in ("transformers", "tokenizers", "jinja2")] == sys.argv[3:6]
ok = ok and version("kubernetes-validate") == sys.argv[6]
ok = ok and [version(p) for p in ("openai", "anthropic")] == sys.argv[7:9]
sys.exit(0 if ok else 1)
EOF
}

PINS_DESC="pyzmq==$PYZMQ_VERSION msgspec==$MSGSPEC_VERSION transformers==$TRANSFORMERS_VERSION tokenizers==$TOKENIZERS_VERSION jinja2==$JINJA2_VERSION kubernetes-validate==$KUBERNETES_VALIDATE_VERSION openai==$OPENAI_VERSION anthropic==$ANTHROPIC_VERSION"

if have_pins; then
  log "$PINS_DESC already present in $VENV"
  echo "$PY_BIN"
  exit 0
fi

if ! command -v "$SYS_PY" >/dev/null 2>&1; then
  log "error: '$SYS_PY' not found; install python3 (3.10+) or set PYTHON=/path/to/python3"
  exit 1
fi
"$SYS_PY" - <<'EOF' || { log "error: python 3.10 or newer is needed"; exit 1; }
import sys
sys.exit(0 if sys.version_info >= (3, 10) else 1)
EOF

mkdir -p "$ROOT/.cache"
PKGS=("pyzmq==$PYZMQ_VERSION" "msgspec==$MSGSPEC_VERSION"
      "transformers==$TRANSFORMERS_VERSION" "tokenizers==$TOKENIZERS_VERSION" "jinja2==$JINJA2_VERSION"
      "kubernetes-validate==$KUBERNETES_VALIDATE_VERSION"
      "openai==$OPENAI_VERSION" "anthropic==$ANTHROPIC_VERSION")
PIP_FLAGS=(--disable-pip-version-check --no-input --quiet)

# site-packages directory of the python at $1 (a venv python).
site_dir() {
  "$1" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'
}

# Install the pins into directory $1 with the system pip (--target).
install_with_system_pip() {
  if ! "$SYS_PY" -m pip --version >/dev/null 2>&1; then
    log "error: neither the venv nor '$SYS_PY' has pip; install python3-pip or python3-venv"
    return 1
  fi
  mkdir -p "$1"
  "$SYS_PY" -m pip install "${PIP_FLAGS[@]}" --target "$1" "${PKGS[@]}"
}

# An existing venv with its own pip (e.g. one made before a pin was added): try
# installing the pins into it in place first, so that a new pin does not mean
# rebuilding the environment under the feet of running tests.
if [ -x "$PY_BIN" ] && "$PY_BIN" -m pip --version >/dev/null 2>&1; then
  log "updating $VENV in place"
  if "$PY_BIN" -m pip install "${PIP_FLAGS[@]}" "${PKGS[@]}" && have_pins; then
    log "ready: $PINS_DESC"
    echo "$PY_BIN"
    exit 0
  fi
  log "in-place update failed; rebuilding $VENV"
fi

# Anything already at $VENV lacks the pins (or is broken): start from scratch,
# which is simpler and more predictable than upgrading in place.
rm -rf "$VENV"
if "$SYS_PY" -m venv "$VENV" >/dev/null 2>&1 && "$PY_BIN" -m pip --version >/dev/null 2>&1; then
  log "created $VENV (venv with pip)"
  "$PY_BIN" -m pip install "${PIP_FLAGS[@]}" "${PKGS[@]}"
elif rm -rf "$VENV" && "$SYS_PY" -m virtualenv --version >/dev/null 2>&1 \
     && "$SYS_PY" -m virtualenv -q "$VENV" >/dev/null 2>&1 \
     && "$PY_BIN" -m pip --version >/dev/null 2>&1; then
  log "created $VENV (virtualenv)"
  "$PY_BIN" -m pip install "${PIP_FLAGS[@]}" "${PKGS[@]}"
elif rm -rf "$VENV" && "$SYS_PY" -m venv --without-pip "$VENV" >/dev/null 2>&1 \
     && [ -x "$PY_BIN" ]; then
  log "created $VENV without pip (ensurepip unavailable); using the system pip with --target"
  install_with_system_pip "$(site_dir "$PY_BIN")"
else
  rm -rf "$VENV"
  log "no usable venv module; building a plain --target environment with a wrapper"
  SITE="$VENV/site-packages"
  install_with_system_pip "$SITE"
  mkdir -p "$VENV/bin"
  SYS_PY_ABS="$("$SYS_PY" -c 'import sys; print(sys.executable)')"
  cat >"$PY_BIN" <<EOF
#!/bin/sh
# Generated by scripts/setup-test-env.sh: system python + pinned test packages.
PYTHONPATH="$SITE\${PYTHONPATH:+:\$PYTHONPATH}" exec "$SYS_PY_ABS" "\$@"
EOF
  chmod +x "$PY_BIN"
fi

if ! have_pins; then
  log "error: after installing, $PY_BIN still lacks some of: $PINS_DESC"
  exit 1
fi
log "ready: $PINS_DESC"
echo "$PY_BIN"
