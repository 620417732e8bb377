#!/usr/bin/env bash
# docs/quickstart.md's first two ways in, read from the page and run as
# they stand: "The embedded default" (its server, then its chat and its
# decision query), and "In front of real vLLM engines" on this CPU (its
# first shell block), with kvgate's server started in the background so
# that the page's own chat can be sent through it before the page's `stop`. `cargo run --release -p kvgate --` runs the
# kvgate binary under test instead (a release build would add minutes to
# CI and test the same code). Run by scripts/test-real-vllm.sh.
#
#   bash tests/real_vllm/quickstart.sh KVGATE_BIN
set -euo pipefail
cd "$(dirname "$0")/../.."
KVGATE_BIN="$(realpath "$1")"
DOC=docs/quickstart.md
fail() { echo "FAIL quickstart: $*" >&2; exit 1; }

# The n-th ```bash block after the heading that starts with $1.
block() {
  awk -v head="$1" -v want="$2" '
    index($0, head) == 1 { inside = 1; n = 0; next }
    inside && /^## / { inside = 0 }
    inside && /^```bash$/ { n++; grab = (n == want); next }
    inside && /^```$/ { grab = 0; next }
    grab { print }' "$DOC"
}
steps="$(block '## 2. In front of real vLLM engines' 1)"
chat="$(block '## 1. The embedded default' 2 | grep -m1 -A1 '^curl -s localhost:8000/v1/chat/completions')"
[ -n "$steps" ] || fail "no shell block under '## 2.' in $DOC"
[ -n "$chat" ] || fail "no chat curl under '## 1.' in $DOC"

cargo() {
  local all="$*"
  [[ "$all" == "run --release -p kvgate -- "* ]] || fail "unexpected cargo command: cargo $all"
  shift 5
  # exec: the background job is then kvgate itself, so stopping it stops kvgate.
  exec "$KVGATE_BIN" "$@"
}

# Starts a server line of the page in the background and waits until
# kvgate answers /ready on the page's port.
start_server() {
  eval "$1" > .cache/real-vllm/logs/quickstart-kvgate.log 2>&1 &
  server=$!
  for _ in $(seq 1 120); do
    curl -sf localhost:8000/ready >/dev/null 2>&1 && return 0
    kill -0 "$server" 2>/dev/null || fail "kvgate exited: $(tail -3 .cache/real-vllm/logs/quickstart-kvgate.log)"
    sleep 0.5
  done
  fail "kvgate not ready on localhost:8000 after 60 s"
}
stop_server() { kill "$server"; wait "$server" 2>/dev/null || true; server=""; }

server=""
cleanup() {
  [ -z "$server" ] || kill "$server" 2>/dev/null || true
  bash scripts/real-vllm.sh stop >/dev/null 2>&1 || true
}
trap cleanup EXIT
t0=$SECONDS
# 1. The embedded default: the page's server, then its chat and decision.
start_server "$(block '## 1. The embedded default' 1)"
answers="$(eval "$(block '## 1. The embedded default' 2)")" || fail "way 1's commands failed: $answers"
echo "$answers" | grep -q '"choices"' || fail "way 1's chat got no choices: $answers"
echo "$answers" | grep -q '"decisions"' || fail "way 1's decision query got none: $answers"
stop_server
echo "PASS quickstart: the embedded default ($((SECONDS - t0)) s)"
# 2. In front of real engines.
ran=0
while IFS= read -r line; do
  case "$line" in
    ''|'#'*) continue ;;
    *' serve '*)
      # The page's server, in the background until the chat is answered.
      start_server "$line"
      answer="$(eval "$chat")" || fail "the chat failed: $answer"
      echo "$answer" | grep -q '"choices"' || fail "the chat got no choices: $answer"
      decision="$(curl -s 'localhost:8001/admin/decisions?limit=1')"
      echo "$decision" | grep -q 'engine-\|replica' || fail "no decision recorded: $decision"
      stop_server
      ;;
    *) eval "$line" ;;
  esac
  ran=$((ran + 1))
done <<< "$steps"
[ "$ran" -ge 4 ] || fail "ran $ran of the page's commands; expected install, fleet, serve and stop"
echo "PASS quickstart: the real-engine block of $DOC ($ran commands) and its chat, $((SECONDS - t0)) s"
